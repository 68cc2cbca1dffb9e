"""Push/pull throughput of bundlerun's two Android transports vs plain `adb push/pull`.

All three move the same 32 MB file to and from the same emulated device
(tests/doubles/adbd.py on 127.0.0.1, in its own process like a real device, so
the Python client does not share an interpreter lock with it), measured side by
side in one run:

  adb-cli     bundlerun's AdbCliTransport (the real adb client + a private adb server)
  adb-shell   bundlerun's AdbShellTransport (adb-shell, device protocol spoken directly)
  plain adb   `adb -s SERIAL push/pull` run directly
  stock       adb-shell's own AdbDeviceTcp.push/pull (what bundlerun used before: protocol
              0x01000000 with checksums, 64 KiB per round trip), for the before/after

Usage: .venv/bin/python bench/bench_adb_transfer.py [--mb 32] [--repeat 7] [--no-delayed-ack]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from doubles.android_env import PrivateAdbServer  # noqa: E402
from bundlerun.targets.android.adb_cli import AdbCliTransport  # noqa: E402
from bundlerun.targets.android.adb_direct import AdbShellTransport  # noqa: E402


class _DeviceProcess:
    """tests/doubles/adbd.py run as its own process (`python tests/doubles/adbd.py SANDBOX`)."""

    def __init__(self, root: Path, delayed_ack: bool = True):
        root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if not delayed_ack:
            env["BUNDLERUN_ADBD_NO_DELAYED_ACK"] = "1"
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "doubles" / "adbd.py"), str(root)],
                                     stdout=subprocess.PIPE, env=env, start_new_session=True)
        self.port = int(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-delayed-ack", action="store_true", help="emulate an adbd without the delayed_ack feature")
    args = parser.parse_args()
    size = args.mb * 1024 * 1024
    load_before = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="bench-adb-") as tmp:
        tmp = Path(tmp)
        os.environ["HOME"] = str(tmp / "home")
        os.environ.pop("ANDROID_USER_HOME", None)
        src = tmp / "payload.bin"
        src.write_bytes(os.urandom(size))
        device = _DeviceProcess(tmp / "device", delayed_ack=not args.no_delayed_ack)
        server = PrivateAdbServer(tmp / "adbhome").start()
        try:
            serial = server.connect(device.port)
            cli = AdbCliTransport(serial, server_port=server.port)
            cli.connect()
            direct = AdbShellTransport(host="127.0.0.1", port=device.port)
            direct.connect()
            negotiated = direct.negotiated
            from adb_shell.adb_device import AdbDeviceTcp
            from bundlerun.targets.android.adb_direct import load_signer

            stock = AdbDeviceTcp("127.0.0.1", device.port, default_transport_timeout_s=60)
            stock.connect(rsa_keys=[load_signer()], auth_timeout_s=30, read_timeout_s=60)

            def plain(*a: str) -> None:
                res = subprocess.run(["adb", "-P", str(server.port), "-s", serial, *a], env=server.env,
                                     capture_output=True, timeout=600)
                if res.returncode != 0:
                    raise RuntimeError(res.stderr.decode())

            remote = "/data/local/tmp/bench/payload.bin"
            lanes = {
                "adb-cli (bundlerun)": (lambda: cli.push(src, remote, 600), lambda: cli.pull(remote, tmp / "a.bin", 600)),
                "adb-shell (bundlerun)": (lambda: direct.push(src, remote, 600),
                                          lambda: direct.pull(remote, tmp / "b.bin", 600)),
                "plain adb push/pull": (lambda: plain("push", str(src), remote),
                                        lambda: plain("pull", remote, str(tmp / "c.bin"))),
                "adb-shell stock (before)": (lambda: stock.push(str(src), remote, read_timeout_s=600),
                                             lambda: stock.pull(remote, str(tmp / "d.bin"), read_timeout_s=600)),
            }
            # lanes interleaved and rotated every round, best time kept: a busy
            # machine slows every lane alike instead of whichever ran last
            times = {name: ([], []) for name in lanes}
            cpu = {name: ([], []) for name in lanes}  # this process's CPU: the in-process clients' own cost
            names = list(lanes)
            for round_no in range(args.repeat):
                order = names[round_no % len(names):] + names[: round_no % len(names)]
                for name in order:
                    push, pull = lanes[name]
                    for k, op in enumerate((push, pull)):
                        c0 = time.process_time()
                        times[name][k].append(_best(op, 1))
                        cpu[name][k].append(time.process_time() - c0)
            results = {name: (args.mb / min(tp), args.mb / min(tq)) for name, (tp, tq) in times.items()}
            medians = {name: (args.mb / statistics.median(tp), args.mb / statistics.median(tq))
                       for name, (tp, tq) in times.items()}
            for f in ("a.bin", "b.bin", "c.bin", "d.bin"):
                assert (tmp / f).read_bytes() == src.read_bytes(), f"{f} differs from the payload"
            direct.close()
            stock.close()
        finally:
            server.adb("disconnect", f"127.0.0.1:{device.port}")
            server.stop()
            device.stop()

    base_push, base_pull = results["plain adb push/pull"]
    print(f"{args.mb} MB, best of {args.repeat}, emulated device on 127.0.0.1, load average "
          f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in os.getloadavg())} after")
    print(f"adb-shell lane negotiated: version {negotiated.get('version', 0):#x}, max payload "
          f"{negotiated.get('max_payload')}, delayed_ack {negotiated.get('delayed_ack')}")
    print(f"{'lane':26} {'push MB/s':>10} {'pull MB/s':>10} {'push vs adb':>12} {'pull vs adb':>12}")
    for name, (p, q) in results.items():
        print(f"{name:26} {p:10.1f} {q:10.1f} {p / base_push:11.2f}x {q / base_pull:11.2f}x")
    med_push, med_pull = medians["plain adb push/pull"]
    print(f"medians of the {args.repeat} rounds:")
    for name, (p, q) in medians.items():
        print(f"{name:26} {p:10.1f} {q:10.1f} {p / med_push:11.2f}x {q / med_pull:11.2f}x")
    print("client CPU in this process (median per 32 MB op; the adb lanes' CPU is in adb's own processes):")
    for name in ("adb-shell (bundlerun)", "adb-shell stock (before)"):
        cp, cq = (statistics.median(v) for v in cpu[name])
        tp, tq = (statistics.median(v) for v in times[name])
        print(f"{name:26} push {cp * 1000:6.0f} ms CPU of {tp * 1000:6.0f} ms wall, "
              f"pull {cq * 1000:6.0f} ms CPU of {tq * 1000:6.0f} ms wall")
    p, q = results["adb-shell (bundlerun)"]
    print(f"RATIO adb-shell/adb best push {p / base_push:.2f} pull {q / base_pull:.2f} (goal >= 0.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
