"""Push/pull throughput of bundlerun's two Android transports vs plain `adb push/pull`.

All three move the same 32 MB file to and from the same emulated device
(tests/doubles/adbd.py on 127.0.0.1), measured side by side in one run:

  adb-cli     bundlerun's AdbCliTransport (the real adb client + a private adb server)
  adb-shell   bundlerun's AdbShellTransport (adb-shell, device protocol spoken directly)
  plain adb   `adb -s SERIAL push/pull` run directly

Usage: .venv/bin/python bench/bench_adb_transfer.py [--mb 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from doubles.adbd import FakeAdbd  # noqa: E402
from doubles.android_env import PrivateAdbServer  # noqa: E402
from bundlerun.targets.android.adb_cli import AdbCliTransport  # noqa: E402
from bundlerun.targets.android.adb_direct import AdbShellTransport  # noqa: E402


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
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = args.mb * 1024 * 1024

    with tempfile.TemporaryDirectory(prefix="bench-adb-") as tmp:
        tmp = Path(tmp)
        os.environ["HOME"] = str(tmp / "home")
        os.environ.pop("ANDROID_USER_HOME", None)
        src = tmp / "payload.bin"
        src.write_bytes(os.urandom(size))
        device = FakeAdbd(tmp / "device")
        device.start()
        server = PrivateAdbServer(tmp / "adbhome").start()
        try:
            serial = server.connect(device.port)
            cli = AdbCliTransport(serial, server_port=server.port)
            cli.connect()
            direct = AdbShellTransport(host="127.0.0.1", port=device.port)
            direct.connect()

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
            }
            # lanes interleaved and rotated every round, best time kept: a busy
            # machine slows every lane alike instead of whichever ran last
            best = {name: [float("inf"), float("inf")] for name in lanes}
            names = list(lanes)
            for round_no in range(args.repeat):
                order = names[round_no % len(names):] + names[: round_no % len(names)]
                for name in order:
                    push, pull = lanes[name]
                    best[name][0] = min(best[name][0], _best(push, 1))
                    best[name][1] = min(best[name][1], _best(pull, 1))
            results = {name: (args.mb / tp, args.mb / tq) for name, (tp, tq) in best.items()}
            for f in ("a.bin", "b.bin", "c.bin"):
                assert (tmp / f).read_bytes() == src.read_bytes(), f"{f} differs from the payload"
            direct.close()
        finally:
            server.adb("disconnect", f"127.0.0.1:{device.port}")
            server.stop()
            device.stop()

    base_push, base_pull = results["plain adb push/pull"]
    print(f"{args.mb} MB, best of {args.repeat}, emulated device on 127.0.0.1")
    print(f"{'lane':26} {'push MB/s':>10} {'pull MB/s':>10} {'push vs adb':>12} {'pull vs adb':>12}")
    for name, (p, q) in results.items():
        print(f"{name:26} {p:10.1f} {q:10.1f} {p / base_push:11.2f}x {q / base_pull:11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
