"""An emulated Cortex-M/Ethos-U board running `arm_executor_runner`, on a pty or TCP.

Test double only: bundlerun's serial target talks to it exactly as to a board's
UART. The "firmware" is ExecuTorch's own host runtime (pybindings): on every
reset the board loads the bundle last "flashed" into its state directory, runs
test case 0 (`verify_result_with_bundled_expected_output` for the BundleIO
verdict with the compiled ET_ATOL/ET_RTOL, and an ETDump-enabled module for the
output dump), and prints the log the real runner prints for a non-semihosting
build with ET_BUNDLE_IO + ET_LOG_DUMP_OUTPUT + ETDump/ET_DUMP_OUTPUTS.

Conventions (a pty cannot carry DTR/RTS, so):
  reset   the host writes `RESET_COMMAND` (b"reset\\n"); target config
          `reset = "command"`, `reset_command = "reset\\n"`. Or, like a probe's
          reset line, `python board.py reset --state DIR` (`reset = "exec"`).
  flash   `python -m tests.doubles.board flash --state DIR BUNDLE` copies BUNDLE
          to DIR/flash.bpte (programs only; the board runs after the next reset,
          like `pyocd load` without a reset).
  config  DIR/board.json, re-read at every reset: {"fault": ..., "etdump": bool,
          "printed": bool, "atol": float, "rtol": float, "eot": bool}.

Faults: none | garbage (noise + non-UTF-8 + NULs around lines) | crlf (mixed
line endings) | split (tiny chunks with pauses) | hang (stops before the ETDump
block, never finishes) | reboot (restarts mid-run and prints the boot again) |
unplug (closes the port mid-run and exits: the device node vanishes).

Run: `python -m tests.doubles.board serve --state DIR [--tcp]`; the first stdout
line is JSON {"port": "/dev/pts/N" | "socket://127.0.0.1:P", "pid": N}.
"""

from __future__ import annotations

import argparse
import base64
import errno
import json
import os
import random
import select
import socket
import sys
import tempfile
import time
import tty
from pathlib import Path

RESET_COMMAND = b"reset\n"
SRC = "arm_executor_runner.cpp"


def _log(level: str, line: int, func: str, msg: str) -> str:
    return f"{level} [executorch:{SRC}:{line} {func}()] {msg}"


def etdump_block(e64: str, d64: str) -> list[str]:
    """The ETDump block exactly as arm_executor_runner's write_etdump() prints it."""
    return [
        _log("I", 1102, "write_etdump", f"[base64] buffer size: {max(len(e64), len(d64))}"),
        "#[RUN THIS]",
        "# Writing debug_buffer.bin [base64]",
        f'echo "{d64}" | base64 -d >debug_buffer.bin',
        "# Writing etdump.bin [base64]",
        f'echo "{e64}" | base64 -d >etdump.bin',
        "# Generate cpu cycle table with:",
        "python3 -m devtools.inspector.inspector_cli --etdump_path etdump.bin --debug_buffer_path "
        "debug_buffer.bin --source_time_scale cycles --target_time_scale cycles",
        "#[END]",
    ]


def load_config(state: Path) -> dict:
    try:
        cfg = json.loads((state / "board.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    return {
        "fault": cfg.get("fault", "none"),
        "etdump": cfg.get("etdump", True),
        "printed": cfg.get("printed", True),
        "atol": float(cfg.get("atol", 0.01)),
        "rtol": float(cfg.get("rtol", 0.01)),
        "eot": cfg.get("eot", True),
        "seed": int(cfg.get("seed", 0)),
    }


def _fmt_output(i: int, j: int, value, code: int) -> str | None:
    """printf formats of print_outputs(); other dtypes print nothing."""
    if code == 6:  # Float
        return f"Output[{i}][{j}]: (float) {float(value):f}"
    if code == 3:  # Int
        return f"Output[{i}][{j}]: (int) {int(value)}"
    if code == 1:  # Char
        return f"Output[{i}][{j}]: (char) {int(value)}"
    if code == 11:  # Bool
        b = bool(value)
        return f"Output[{i}][{j}]: (bool) {'true ' if b else 'false'} (0x{int(b):x})"
    return None


def run_firmware(bundle_bytes: bytes, cfg: dict) -> list[str]:
    """The runner's log lines for test case 0 of `bundle_bytes`."""
    import numpy as np
    import torch
    from executorch.extension.pybindings._C import (
        _load_bundled_program_from_buffer,
        _load_for_executorch_from_bundled_program,
    )

    from bundlerun.bundles.bpte import parse_bundle

    bundle = parse_bundle(bundle_bytes, "flash.bpte")
    suite = bundle.method_test_suites[0]
    method = suite.method_name
    case = suite.test_cases[0]
    lines = [
        _log("I", 1010, "main", f"PTE @ 0x70000000 [----{bundle_bytes[4:8].decode('latin-1')}]"),
        _log("I", 380, "runner_init", f"PTE Model data loaded. Size: {len(bundle_bytes)} bytes."),
        _log("I", 395, "runner_init", "Model buffer loaded, has 1 methods"),
        _log("I", 403, "runner_init", f"Running method {method}"),
    ]
    bp = _load_bundled_program_from_buffer(bundle_bytes)
    verdict_status = 0
    try:
        bp.verify_result_with_bundled_expected_output(method, 0, cfg["rtol"], cfg["atol"])
    except RuntimeError as exc:
        digits = [int(t) for t in str(exc).split() if t.isdigit()]
        verdict_status = digits[-1] if digits else 1
    debug_size = 1 << 16
    module = _load_for_executorch_from_bundled_program(bp, enable_etdump=True, debug_buffer_size=debug_size)
    lines += [
        _log("I", 470, "runner_init", "Setting up ETDump"),
        _log("I", 498, "runner_init", f"ETDump: Allocated output buffer size: {debug_size} at 0x60000000"),
        _log("I", 563, "runner_init", "Input testset[0] from bundled bpte"),
        _log("I", 800, "run_model", "Starting running 1 inferences..."),
    ]
    inputs = [torch.from_numpy(v.to_array().copy()) if v.kind == "tensor" else v.scalar for v in case.inputs]
    outs = module.run_method(method, inputs)
    lines.append(_log("I", 822, "run_model", "1 inferences finished"))
    lines.append(_log("I", 640, "print_outputs", f"{len(outs)} outputs: "))
    arrays = [o.detach().numpy() if hasattr(o, "detach") else np.asarray(o) for o in outs]
    codes = [v.scalar_type for v in case.expected_outputs]
    if cfg["printed"]:
        for i, (arr, code) in enumerate(zip(arrays, codes)):
            for j, value in enumerate(arr.reshape(-1)):
                text = _fmt_output(i, j, value, code)
                if text:
                    lines.append(text)
    # compute_method_output_error_stats over all float outputs.
    abs_err, rel_err = [], []
    for arr, exp in zip(arrays, case.expected_outputs):
        if exp.kind == "tensor" and exp.scalar_type in (5, 6, 7):
            a = arr.astype(np.float64).reshape(-1)
            e = exp.to_array().astype(np.float64).reshape(-1)
            d = np.abs(a - e)
            abs_err.append(d)
            rel_err.append(d / np.maximum(np.abs(e), 1e-12))
    if abs_err:
        d = np.concatenate(abs_err)
        r = np.concatenate(rel_err)
        lines += [
            _log("I", 700, "verify_result", "=== Error stats for testset 0 ==="),
            _log("I", 701, "verify_result", f" mean_absolute_error: {d.mean():f}"),
            _log("I", 702, "verify_result", f" max_absolute_error:  {d.max():f}"),
            _log("I", 703, "verify_result", f" mean_relative_error: {r.mean():f}"),
            _log("I", 704, "verify_result", f" max_relative_error:  {r.max():f}"),
        ]
    if verdict_status == 0:
        lines += [
            _log("I", 712, "verify_result", "Model output match expected BundleIO bpte ref data."),
            _log("I", 713, "verify_result", "TEST: BundleIO index[0] Test_result: PASS"),
        ]
    else:
        lines += [
            _log(
                "E", 717, "verify_result",
                f"Model output don't match expected BundleIO bpte ref data. rtol={cfg['rtol']:f} atol={cfg['atol']:f}",
            ),
            _log("E", 722, "verify_result", "TEST: BundleIO index[0] Test_result: FAIL"),
            _log("E", 723, "verify_result", f"Bundle verification failed with status 0x{verdict_status:x}"),
        ]
    ok = int(verdict_status == 0)
    lines += [_log("I", 850, "run_model", f"Model run: {ok}"), _log("I", 1040, "main", f"Model run: {ok}")]
    lines.append(_log("I", 590, "log_mem_status", "method_allocator_used:     8192 / 62914560  free: 62906368 ( used: 0 % ) "))
    lines.append("__HANG_POINT__")
    if cfg["etdump"]:
        with tempfile.TemporaryDirectory() as tmp:
            etdump_path, debug_path = os.path.join(tmp, "etdump.bin"), os.path.join(tmp, "debug.bin")
            module.write_etdump_result_to_file(etdump_path, debug_path)
            etdump = Path(etdump_path).read_bytes()
            debug = Path(debug_path).read_bytes()
        e64 = base64.b64encode(etdump).decode()
        d64 = base64.b64encode(debug).decode()
        lines += etdump_block(e64, d64)
    if not ok:
        lines.append(_log("F", 1046, "main", "In function main(), assert failed (model_ok == true): Problem running model"))
        return lines  # et_pal_abort(): __builtin_trap, nothing more on the UART
    lines.append(_log("I", 1048, "main", "Program complete, exiting."))
    if cfg["eot"]:
        lines.append(_log("I", 1052, "main", "\x04"))
    return lines


def firmware_outputs(bundle_bytes: bytes) -> list:
    """What the board computes for case 0 of `bundle_bytes` (numpy arrays), for test oracles."""
    import torch
    from executorch.extension.pybindings._C import (
        _load_bundled_program_from_buffer,
        _load_for_executorch_from_bundled_program,
    )

    from bundlerun.bundles.bpte import parse_bundle

    bundle = parse_bundle(bundle_bytes, "bundle")
    suite = bundle.method_test_suites[0]
    module = _load_for_executorch_from_bundled_program(_load_bundled_program_from_buffer(bundle_bytes))
    inputs = [torch.from_numpy(v.to_array().copy()) if v.kind == "tensor" else v.scalar for v in suite.test_cases[0].inputs]
    return [o.numpy().copy() for o in module.run_method(suite.method_name, inputs)]


class Board:
    """The serving loop: wait for reset, boot, print; honour faults."""

    def __init__(self, state: Path, tcp: bool):
        self.state = state
        self.tcp = tcp
        self.master: int | None = None
        self.listener: socket.socket | None = None
        self.conn: socket.socket | None = None
        self.inbuf = b""
        self.reset_flag = False
        self.dropping = False

    # -- transport
    def open(self) -> str:
        if self.tcp:
            self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(("127.0.0.1", 0))
            self.listener.listen(1)
            return f"socket://127.0.0.1:{self.listener.getsockname()[1]}"
        master, slave = os.openpty()
        tty.setraw(slave)  # no echo / line discipline before the host configures it
        name = os.ttyname(slave)
        os.close(slave)
        os.set_blocking(master, False)  # a UART never blocks the firmware; see _write
        self.master = master
        return name

    def _read(self, timeout: float) -> bytes | None:
        """Bytes from the host, b"" when nothing arrived; None when the host is away."""
        if self.tcp:
            if self.conn is None:
                r, _, _ = select.select([self.listener], [], [], timeout)
                if r:
                    self.conn, _ = self.listener.accept()
                return b""
            r, _, _ = select.select([self.conn], [], [], timeout)
            if not r:
                return b""
            try:
                data = self.conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                self.conn.close()
                self.conn = None
                return None
            return data
        r, _, _ = select.select([self.master], [], [], timeout)
        if not r:
            return b""
        try:
            return os.read(self.master, 4096)
        except BlockingIOError:
            return b""
        except OSError as exc:
            if exc.errno == errno.EIO:  # no process has the slave open right now
                time.sleep(0.02)
                return None
            raise

    def _write(self, data: bytes) -> None:
        if self.reset_flag or self.dropping:  # reset pending / line dead: nothing more from this boot
            return
        if self.tcp:
            if self.conn is not None:
                try:
                    self.conn.sendall(data)
                except OSError:
                    pass
            return
        # Like a UART without flow control: if nobody drains the line for a while
        # (host closed the port), the rest is lost; a reset request aborts the write.
        view = memoryview(data)
        stalled_since = None
        while view:
            try:
                n = os.write(self.master, view)
            except BlockingIOError:
                n = 0
            except OSError:
                return
            if n:
                view = view[n:]
                stalled_since = None
                continue
            if self.reset_requested():
                self.reset_flag = True
                return
            now = time.monotonic()
            stalled_since = stalled_since or now
            if now - stalled_since > 1.0:
                self.dropping = True  # nobody is listening: the rest of this boot is lost
                return
            time.sleep(0.002)

    def reset_requested(self) -> bool:
        if self.reset_flag:
            return True
        data = self._read(0)
        if data:
            self.inbuf += data
        if RESET_COMMAND in self.inbuf:
            self.inbuf = self.inbuf.split(RESET_COMMAND)[-1]
            return True
        return False

    def unplug(self) -> None:
        if self.master is not None:
            os.close(self.master)
            self.master = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    # -- boot
    def emit(self, lines: list[str], cfg: dict) -> str:
        """Write the log with the configured fault; returns 'done', 'reset' or 'unplugged'."""
        rng = random.Random(cfg["seed"])
        fault = cfg["fault"]
        hang_at = lines.index("__HANG_POINT__") if "__HANG_POINT__" in lines else len(lines)
        lines = [ln for ln in lines if ln != "__HANG_POINT__"]
        if fault == "hang":
            lines = lines[:hang_at]
        cut = len(lines) // 2
        if fault == "garbage":
            self._write(bytes([0x00, 0xFF, 0xFE, 0x80, 0x1B]) + b"\xc3\x28 noise \xa0\xa1\r\n")
        for k, line in enumerate(lines):
            if fault in ("reboot", "unplug") and k == cut:
                if fault == "unplug":
                    self._write(line[: len(line) // 2].encode())
                    time.sleep(0.3)  # let the host drain what was sent, then the cable goes
                    self.unplug()
                    return "unplugged"
                return "reboot"
            end = b"\n"
            if fault == "crlf":
                end = rng.choice([b"\r\n", b"\n", b"\r\n", b"\r"])
            data = line.encode("utf-8") + end
            if fault == "garbage" and k % 7 == 3:
                data = b"\xff\xfe\x00garbage\x80" + end + data
            if fault == "split":
                pos = 0
                while pos < len(data):
                    step = rng.randint(1, 48)
                    self._write(data[pos : pos + step])
                    pos += step
                    if rng.random() < 0.05:
                        time.sleep(0.001)  # the host sees lines cut across reads
            else:
                self._write(data)
            if self.reset_requested():
                return "reset"
        return "done"

    def serve(self) -> None:
        pending = False
        while True:
            if not pending:
                data = self._read(0.05)
                if data:
                    self.inbuf += data
                request = self.state / "reset-request"
                if request.exists():  # the probe's reset line (`board.py reset`)
                    request.unlink()
                elif RESET_COMMAND not in self.inbuf:
                    continue
                else:
                    self.inbuf = self.inbuf.split(RESET_COMMAND)[-1]
            pending = False
            self.reset_flag = False
            self.dropping = False
            cfg = load_config(self.state)
            flash = self.state / "flash.bpte"
            if not flash.exists():
                self._write(b"E [executorch:arm_executor_runner.cpp:1 main()] no program flashed\n")
                continue
            try:
                lines = run_firmware(flash.read_bytes(), cfg)
            except Exception as exc:  # a broken flash image: the firmware faults
                self._write(f"F [executorch:{SRC}:1 main()] Hard fault: {type(exc).__name__}\n".encode())
                continue
            outcome = self.emit(lines, cfg)
            if outcome == "reboot":
                # Watchdog reset: the whole boot prints again, this time to the end.
                outcome = self.emit(lines, {**cfg, "fault": "none"})
            if outcome == "unplugged":
                return
            pending = outcome == "reset"


def flash(state: Path, bundle: Path) -> int:
    """The double's 'flash tool': program the bundle into the board's flash."""
    data = bundle.read_bytes()
    if data[4:8] != b"BP08":
        print(f"flash: {bundle} is not a BundleIO program", file=sys.stderr)
        return 1
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / ".flash.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, state / "flash.bpte")
    print(f"flash: programmed {len(data)} bytes")
    return 0


def probe_reset(state: Path) -> int:
    """The double's 'debug probe reset' (reset = "exec"): pulls the reset line."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "reset-request").touch()
    print("reset: done")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="board")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("serve")
    sp.add_argument("--state", type=Path, required=True)
    sp.add_argument("--tcp", action="store_true")
    fp = sub.add_parser("flash")
    fp.add_argument("--state", type=Path, required=True)
    fp.add_argument("bundle", type=Path)
    rp = sub.add_parser("reset")
    rp.add_argument("--state", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "flash":
        return flash(args.state, args.bundle)
    if args.cmd == "reset":
        return probe_reset(args.state)
    # Warm the runtime before announcing the port, so resets answer at board speed.
    import torch  # noqa: F401
    import executorch.extension.pybindings._C  # noqa: F401  (the runtime portable_lib re-exports, without exir)

    board = Board(args.state, args.tcp)
    port = board.open()
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
    try:
        board.serve()
    except KeyboardInterrupt:
        pass
    finally:
        board.unplug()
    return 0


if __name__ == "__main__":
    sys.exit(main())


class BoardProcess:
    """Start/stop the board double from a test: `with BoardProcess(state) as b: b.url`.

    The process runs in its own session and is always terminated and reaped.
    """

    def __init__(self, state: Path, tcp: bool = False, startup_timeout_s: float = 60.0):
        self.state = Path(state)
        self.tcp = tcp
        self.startup_timeout_s = startup_timeout_s
        self.proc = None
        self.port: str | None = None

    def __enter__(self) -> "BoardProcess":
        self.start()
        return self.wait_ready()

    def start(self) -> "BoardProcess":
        """Spawn without waiting (start several boards, then `wait_ready` each)."""
        import subprocess

        self.state.mkdir(parents=True, exist_ok=True)
        repo = Path(__file__).resolve().parents[2]
        args = [sys.executable, "-m", "tests.doubles.board", "serve", "--state", str(self.state)]
        if self.tcp:
            args.append("--tcp")
        self.proc = subprocess.Popen(
            args, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
        )
        return self

    def wait_ready(self) -> "BoardProcess":
        ready, _, _ = select.select([self.proc.stdout], [], [], self.startup_timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.close()
            raise RuntimeError("board double did not start")
        self.port = json.loads(line)["port"]
        return self

    @property
    def url(self) -> str:
        assert self.port is not None
        if self.port.startswith("socket://"):
            return "serial+socket://" + self.port[len("socket://") :]
        return "serial://" + self.port

    def configure(self, **cfg) -> None:
        (self.state / "board.json").write_text(json.dumps(cfg))

    def reset_command(self) -> str:
        return f"{sys.executable} {Path(__file__).resolve()} reset --state {self.state}"

    def flash_command(self) -> str:
        return f"{sys.executable} {Path(__file__).resolve()} flash --state {self.state} {{case_bundle}}"

    def target_config(self, **extra) -> dict:
        cfg = {"reset": "command", "reset_command": "reset\\n", "flash": self.flash_command()}
        cfg.update(extra)
        return cfg

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        import signal
        import subprocess

        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def __exit__(self, *exc) -> None:
        self.close()
