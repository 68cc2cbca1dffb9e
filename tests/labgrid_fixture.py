"""A real labgrid lab on loopback: `labgrid-coordinator`, `labgrid-exporter` (with its ser2net)
and `labgrid-client`, all the real programs of labgrid installed in the repository's
`.venv-labgrid` (scripts/setup.sh): labgrid is never installed in bundlerun's own venv, whose
pyserial it would overwrite with its fork.

The exporter exports RawSerialPorts on ptys (the pty of the emulated board of
tests/doubles/board.py, and spare ptys this fixture holds) and a NetworkService named `adb`;
places are created, matched and tagged with `labgrid-client`, exactly as a lab admin does.
Every process runs in its own process group and is killed with it on close.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LABGRID_VENV = Path(__file__).resolve().parents[1] / ".venv-labgrid"
LABGRID_PYTHON = LABGRID_VENV / "bin" / "python"


def labgrid_tool(name: str) -> str:
    path = LABGRID_VENV / "bin" / name
    if not path.exists():
        raise RuntimeError(f"{path} not found: labgrid lives in its own venv, run scripts/setup.sh "
                           "(python3 -m venv .venv-labgrid; .venv-labgrid/bin/pip install labgrid==26.0.1)")
    return str(path)


def ser2net_path() -> str:
    found = shutil.which("ser2net") or ("/usr/sbin/ser2net" if Path("/usr/sbin/ser2net").exists() else None)
    if not found:
        raise RuntimeError("ser2net not found: the labgrid exporter serves serial ports through it "
                           "(apt-get install ser2net; scripts/setup.sh installs it)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """Coordinator + one exporter (`exp1`) on 127.0.0.1."""

    def __init__(self, root: Path, serial_ports: dict[str, str], adb_port: int):
        ser2net_path()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.serial_ports = serial_ports  # group -> /dev/pts/N
        self.adb_port = adb_port
        self.procs: list[subprocess.Popen] = []
        self.address = ""

    # ---- processes ----------------------------------------------------------------------------
    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        out = open(self.root / log, "wb")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=self.root)
        out.close()
        self.procs.append(proc)
        return proc

    def start(self) -> "Lab":
        for _ in range(5):
            port = free_port()
            self.address = f"127.0.0.1:{port}"
            coord = self._spawn([labgrid_tool("labgrid-coordinator"), "--listen", self.address], "coordinator.log")
            if self._wait(lambda: self.client("places").returncode == 0, 30, coord):
                break
            self._stop(coord)
        else:
            raise RuntimeError(f"labgrid-coordinator did not start: {self.log('coordinator.log')[-2000:]}")
        lines = []
        for group, pty in self.serial_ports.items():
            lines += [f"{group}:", "  RawSerialPort:", f"    port: {pty}", "    speed: 115200"]
        lines += ["phone:", "  adb:", "    cls: NetworkService", "    address: 127.0.0.1", "    username: shell",
                  f"    port: {self.adb_port}"]
        (self.root / "exporter.yaml").write_text("\n".join(lines) + "\n")
        exp = self._spawn([labgrid_tool("labgrid-exporter"), "-c", self.address, "--name", "exp1",
                           "--hostname", "127.0.0.1", str(self.root / "exporter.yaml")], "exporter.log")
        want = len(self.serial_ports) + 1
        if not self._wait(lambda: self.client("resources").stdout.count("exp1/") >= want, 30, exp):
            raise RuntimeError(f"labgrid-exporter did not register: {self.log('exporter.log')[-2000:]}")
        return self

    def _wait(self, ready, timeout: float, proc: subprocess.Popen) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            if ready():
                return True
            time.sleep(0.2)
        return False

    def log(self, name: str) -> str:
        try:
            return (self.root / name).read_text(errors="replace")
        except OSError:
            return ""

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        try:  # ser2net children of the exporter share its group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        for proc in reversed(self.procs):
            self._stop(proc)
        self.procs.clear()

    # ---- labgrid-client -------------------------------------------------------------------------
    def client(self, *args: str, user: str | None = None, check: bool = False) -> subprocess.CompletedProcess:
        env = {**os.environ}
        env.pop("LG_COORDINATOR", None)
        if user:
            env["LG_USERNAME"] = user
        res = subprocess.run([labgrid_tool("labgrid-client"), "-x", self.address, *args], capture_output=True,
                             text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise RuntimeError(f"labgrid-client {' '.join(args)} failed: {res.stdout}{res.stderr}")
        return res

    def add_place(self, name: str, group: str, tags: str = "") -> None:
        self.client("-p", name, "create", check=True)
        self.client("-p", name, "add-match", f"exp1/{group}/*", check=True)
        if tags:
            self.client("-p", name, "set-tags", *tags.split(","), check=True)

    def holder(self, place: str) -> str | None:
        """Who has `place` acquired, as `labgrid-client show` says (None: free)."""
        res = self.client("-p", place, "show", check=True)
        m = re.search(r"^\s*acquired: (.*)$", res.stdout, re.M)
        assert m, res.stdout
        return None if m.group(1).strip() == "None" else m.group(1).strip()

    def holders(self) -> dict[str, str | None]:
        """Every place and who has it acquired (`labgrid-client -v places`; None: free)."""
        res = self.client("-v", "places", check=True)
        out: dict[str, str | None] = {}
        name = None
        for line in res.stdout.splitlines():
            m = re.match(r"^Place '(.*)':$", line)
            if m:
                name = m.group(1)
                continue
            m = re.match(r"^\s*acquired: (.*)$", line)
            if m and name is not None:
                out[name] = None if m.group(1).strip() == "None" else m.group(1).strip()
        return out

    def ser2net_running(self) -> list[str]:
        """Command lines of the ser2net processes the exporter runs now (one per acquired port)."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "ser2net" in cmd.split(" ", 1)[0] and any(p in cmd for p in self.serial_ports.values()):
                out.append(cmd)
        return out

    def __enter__(self) -> "Lab":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()


class SparePty:
    """A pty nobody drives (a place's serial port, for acquisition tests); closed on exit."""

    def __init__(self):
        import tty

        self.master, slave = os.openpty()
        tty.setraw(slave)
        self.name = os.ttyname(slave)
        os.close(slave)

    def close(self) -> None:
        os.close(self.master)


# ---- a board whose firmware is real: QEMU's Corstone SSE-300 behind a pty ------------------------
QEMU_MODEL_ADDR = "0x7C000000"


def serve_qemu_board(state: Path, elf: Path) -> int:
    """A pty that behaves like a board's UART, with ExecuTorch's arm_executor_runner (UART build)
    on qemu-system-arm as its firmware. The host side is what the labgrid exporter exports.

    flash: `python tests/doubles/board.py flash --state DIR BUNDLE` puts the bundle in
    DIR/flash.bpte (like a probe programming flash). reset: the line `reset\\n` on the UART
    starts QEMU holding that bundle at 0x7C000000 with UART0 as a TCP server (wait=on: the CPU
    starts once connected, no byte lost); its UART bytes go to the pty until the runner's EOT or
    QEMU's exit, then QEMU (its whole process group) is stopped."""
    import errno
    import json
    import select
    import tty

    master, slave = os.openpty()
    tty.setraw(slave)
    name = os.ttyname(slave)
    os.close(slave)
    os.set_blocking(master, False)
    print(json.dumps({"port": name, "pid": os.getpid()}), flush=True)

    def interrupted(*_):  # SIGTERM from the test: QEMU (its own session) is stopped on the way out
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    qemu: subprocess.Popen | None = None
    up: socket.socket | None = None
    inbuf = b""

    def stop() -> None:
        nonlocal qemu, up
        if up is not None:
            up.close()
            up = None
        if qemu is not None:
            Lab._stop(qemu)
            qemu = None

    def boot() -> None:
        nonlocal qemu, up
        stop()
        port = free_port()
        log = open(state / "qemu.log", "ab")
        qemu = subprocess.Popen(
            ["qemu-system-arm", "-M", "mps3-an547", "-nographic", "-monitor", "none",
             "-serial", f"tcp:127.0.0.1:{port},server=on,wait=on",
             "-device", f"loader,file={state / 'flash.bpte'},addr={QEMU_MODEL_ADDR}", "-kernel", str(elf)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and qemu.poll() is None:
            try:
                up = socket.create_connection(("127.0.0.1", port), timeout=1)
                return
            except OSError:
                time.sleep(0.05)
        stop()

    try:
        while True:
            fds = [master] + ([up] if up is not None else [])
            ready, _, _ = select.select(fds, [], [], 0.2)
            if master in ready:
                try:
                    data = os.read(master, 4096)
                except BlockingIOError:
                    data = b""
                except OSError as exc:
                    if exc.errno != errno.EIO:  # EIO: nobody holds the other end right now
                        raise
                    data = b""
                    time.sleep(0.02)
                inbuf = (inbuf + data)[-64:]
                if b"reset\n" in inbuf:
                    inbuf = b""
                    boot()
            if up is not None and up in ready:
                data = up.recv(65536)
                if not data:
                    stop()
                    continue
                try:
                    os.write(master, data)  # like a UART without flow control: dropped if nobody reads
                except OSError:
                    pass
                if b"\x04" in data:  # the runner's end of transmission: the board is done
                    stop()
    except KeyboardInterrupt:
        return 0
    finally:
        stop()


class QemuBoard:
    """`python tests/labgrid_fixture.py qemu-board --state DIR --elf ELF` as a context manager."""

    def __init__(self, state: Path, elf: Path):
        self.state, self.elf = Path(state), Path(elf)
        self.proc: subprocess.Popen | None = None
        self.port = ""

    def __enter__(self) -> "QemuBoard":
        import json
        import select

        self.state.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "qemu-board", "--state",
                                      str(self.state), "--elf", str(self.elf)], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.__exit__()
            raise RuntimeError("the QEMU board did not start")
        self.port = json.loads(line)["port"]
        return self

    def flash_command(self) -> str:
        board = Path(__file__).resolve().parent / "doubles" / "board.py"
        return f"{sys.executable} {board} flash --state {self.state} {{case_bundle}}"

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            Lab._stop(self.proc)
            self.proc.stdout.close()
            self.proc = None


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["qemu-board"])
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--elf", type=Path, required=True)
    args = ap.parse_args()
    sys.exit(serve_qemu_board(args.state, args.elf))
