"""A board (or a Corstone FVP's telnet UART) running `arm_executor_runner`, over a serial port.

    serial:///dev/ttyACM0?baud=115200     any pyserial port (path, or ?port=<pyserial URL>)
    serial+socket://HOST:PORT             pyserial socket://, e.g. an FVP telnetterminal
    rfc2217://HOST:PORT                   pyserial RFC 2217 (network serial server)

Per test case: write the one-case bundle (`Bundle.single_case`: the stock runner
checks case 0 only), open the port, run the configured flash command, reset the
board, capture the UART until the runner's end (`Program complete, exiting.`,
EOT, or its abort after a failed BundleIO check) or the deadline, save the raw
bytes, and parse them with `targets.et_runner.log`. Outputs come from the ETDump
block at full precision, else from the 6-decimal `Output[i][j]` lines (lossy).
Every read is bounded (`timeout=` on the port + an overall deadline) and the port
is always closed. This target never judges numerics; the firmware's own verdict
goes to `CaseResult.device_verdict` for information.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.targets.process import kill_process_group
from bundlerun.targets import Check, TargetSpec, TargetURL, lazy
from bundlerun.targets.et_runner.protocol import SessionEnd, case_from_session
from bundlerun.targets.base import (CaseResult, CaseStatus, RunOptions, TargetBase, TargetRun, expected_layout,
                                    safe_name as _safe, selected_cases)
from bundlerun.targets.failures import FailureKind

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

RESET_MODES = ("none", "dtr", "rts", "dtr+rts", "command", "exec")
_BOOT_MARKERS = ("PTE @ ", "Running executor with parameter:", "Ethos-U rev ")
# ET_CHECK_MSG(model_ok == true, "Problem running model") follows a failed BundleIO
# check: the runner aborts by design, after printing outputs, verdict and ETDump.
_CHUNK = 16384
# After "Program complete, exiting." the runner sends EOT (0x04); older runners send nothing more.
# Wait this long for it so the raw capture is the whole session, without stalling those runners.
_EOT_GRACE_S = 0.5
# Transport faults worth another attempt (RunOptions.retries); never numerics or reboots.
_TRANSIENT = ("port-lost", "port-busy", "port-missing", "flash-timeout")
# Capture.status -> how the stream ended, for the shared Arm runner protocol.
_ENDS = {"finished": "finished", "aborted": "finished", "timeout": "host-timeout", "no-output": "no-output",
         "reboot": "reboot", "port-lost": "transport-lost"}


@dataclass
class SerialSettings:
    """Everything the serial lane needs; from the target config and the URL query."""

    port_url: str  # what pyserial opens: /dev/ttyACM0, socket://h:p, rfc2217://h:p, loop://
    baudrate: int = 115200
    reset: str = "dtr"  # none | dtr | rts | dtr+rts | command | exec
    reset_command: str | None = None  # bytes written for reset=command (\n, \r, \xNN escapes)
    reset_exec: str | None = None  # external command for reset=exec, e.g. "pyocd reset -t {target}"
    reset_pulse_s: float = 0.1
    flash: str | None = None  # external command template; {case_bundle} makes it per case
    flash_timeout_s: float = 180.0
    target: str | None = None  # substituted as {target} (e.g. a pyOCD target name)
    elf: str | None = None  # substituted as {elf}
    debug_elf: str | None = None  # `bundlerun debug`: a runner built with --etdump, used as {elf} (targets/arm/intermediates.py)
    read_timeout_s: float = 0.1  # bound of every single read
    settle_s: float = 1.0  # quiet time after an abort/fatal line before the capture stops
    boot_timeout_s: float | None = None  # no byte at all after reset within this -> TIMEOUT
    exclusive: bool = True
    outputs: str = "auto"  # auto (ETDump, else printed) | etdump | printed
    # The board as a process bundlerun owns: an emulator exposing its UART (QEMU
    # `-serial tcp:...,server=on,wait=on`), a serial bridge, a probe server. Started in its own
    # process group before the port is opened, stopped (group SIGTERM, then SIGKILL) after:
    # per case when it mentions {case_bundle}, else once for the whole run.
    launch: str | None = None
    connect_timeout_s: float | None = None  # keep retrying the port open; default 10 s with launch, else one try


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def settings_from(url, config: dict[str, Any]) -> SerialSettings:
    """Merge config (the [targets.serial] section) with the URL query (wins)."""
    merged: dict[str, Any] = dict(config or {})
    merged.update(url.query)
    scheme = url.scheme
    if "port" in merged:
        port_url = str(merged.pop("port"))
    elif scheme == "serial":
        port_url = (url.netloc + url.path) if url.netloc else url.path
    elif scheme == "serial+socket":
        port_url = f"socket://{url.netloc}"
    elif scheme == "rfc2217":
        port_url = f"rfc2217://{url.netloc}"
    else:  # pragma: no cover - the scheme map only routes the three above here
        raise ConfigError(f"serial target cannot handle scheme {scheme!r}")
    if not port_url:
        raise ConfigError(f"{url.raw}: no serial port given (e.g. serial:///dev/ttyACM0)")
    default_reset = "none" if scheme == "serial+socket" else "dtr"
    known = {f for f in SerialSettings.__dataclass_fields__ if f != "port_url"}
    aliases = {"baud": "baudrate"}
    kwargs: dict[str, Any] = {}
    from bundlerun.targets.settings import check_keys

    check_keys("targets.serial", [aliases.get(k, k) for k in merged], [*known, *aliases])
    for key, value in merged.items():
        kwargs[aliases.get(key, key)] = value
    try:
        s = SerialSettings(port_url=port_url, **kwargs)
        s.baudrate = int(s.baudrate)
        for name in ("reset_pulse_s", "flash_timeout_s", "read_timeout_s", "settle_s"):
            setattr(s, name, float(getattr(s, name)))
        if s.boot_timeout_s is not None:
            s.boot_timeout_s = float(s.boot_timeout_s)
        s.connect_timeout_s = (10.0 if s.launch else 0.0) if s.connect_timeout_s is None else float(s.connect_timeout_s)
        s.exclusive = _truthy(s.exclusive)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{url.raw}: bad serial setting ({exc})") from None
    if "reset" not in kwargs:
        s.reset = default_reset
    s.reset = str(s.reset).lower()
    if s.reset not in RESET_MODES:
        raise ConfigError(f"{url.raw}: reset={s.reset!r}; expected one of {', '.join(RESET_MODES)}")
    if s.reset == "command" and not s.reset_command:
        raise ConfigError(f"{url.raw}: reset=command needs reset_command (the text the firmware resets on)")
    if s.reset == "exec" and not s.reset_exec:
        raise ConfigError(f"{url.raw}: reset=exec needs reset_exec (e.g. 'pyocd reset -t <target>')")
    if s.outputs not in ("auto", "etdump", "printed"):
        raise ConfigError(f"{url.raw}: outputs={s.outputs!r}; expected auto, etdump or printed")
    if not (0 < s.read_timeout_s <= 5):
        raise ConfigError(f"{url.raw}: read_timeout_s must be in (0, 5]")
    if not (0 <= s.connect_timeout_s <= 600):
        raise ConfigError(f"{url.raw}: connect_timeout_s must be in [0, 600]")
    if s.launch is not None and not str(s.launch).strip():
        raise ConfigError(f"{url.raw}: launch is empty")
    return s


def unescape(text: str) -> bytes:
    """'reset\\n' / '\\x12' as written in a TOML config -> bytes."""
    return text.encode("latin-1", errors="strict").decode("unicode_escape").encode("latin-1")


# ---------------------------------------------------------------- external commands


@dataclass
class CommandResult:
    ok: bool
    kind: str | None  # None | "not-found" | "timeout" | "failed"
    message: str
    log_path: Path


def render_command(template: str, values: dict[str, str]) -> list[str]:
    """Split like a shell, then substitute {names} inside each word (paths stay one word)."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"cannot parse command {template!r}: {exc}") from None
    out = []
    for word in words:
        try:
            out.append(word.format(**values))
        except KeyError as exc:
            raise ConfigError(
                f"command {template!r} uses {{{exc.args[0]}}}; known: {', '.join(sorted(values))}"
            ) from None
        except (IndexError, ValueError) as exc:
            raise ConfigError(f"command {template!r}: bad placeholder ({exc})") from None
    if not out:
        raise ConfigError("empty external command")
    return out


def run_command(argv: list[str], timeout_s: float, log_path: Path, what: str) -> CommandResult:
    """Run a flash/reset tool in its own process group; always reaped, output saved."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        log.write(("$ " + shlex.join(argv) + "\n").encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except FileNotFoundError:
            return CommandResult(False, "not-found", f"{what} tool {argv[0]!r} not found on PATH", log_path)
        except PermissionError:
            return CommandResult(False, "not-found", f"{what} tool {argv[0]!r} is not executable", log_path)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_process_group(proc)
            return CommandResult(False, "timeout", f"{what} command timed out after {timeout_s:g}s", log_path)
        except BaseException:
            kill_process_group(proc)
            raise
    if rc != 0:
        tail = _tail(log_path)
        return CommandResult(False, "failed", f"{what} command exited with {rc}{': ' + tail if tail else ''}", log_path)
    return CommandResult(True, None, "", log_path)


def _tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()[1:] if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


class LaunchFault(Exception):
    """The launched board process is missing, exited before the port opened, or died mid-case."""

    def __init__(self, kind: FailureKind, detail: str, message: str):
        super().__init__(message)
        self.kind, self.detail = kind, detail


class Board:
    """A `launch` command bundlerun owns: started in its own session (process group), output
    saved, stopped with the whole group (SIGTERM, then SIGKILL) on every exit path."""

    def __init__(self, argv: list[str], log_path: Path):
        self.argv, self.log_path = argv, log_path
        self.proc: subprocess.Popen | None = None
        self.stopped_by_us = False

    def start(self) -> "Board":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(("$ " + shlex.join(self.argv) + "\n").encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
            except (FileNotFoundError, PermissionError) as exc:
                why = "not found on PATH" if isinstance(exc, FileNotFoundError) else "not executable"
                raise LaunchFault(FailureKind.TOOL_MISSING, "launch",
                                  f"launch tool {self.argv[0]!r} {why}") from None
        return self

    def exited(self, wait_s: float = 0.0) -> int | None:
        """The exit status if the board process has ended by itself (waiting up to `wait_s`)."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=wait_s) if wait_s > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            return None

    def describe_exit(self, rc: int) -> str:
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        try:  # its last words (QEMU: the error, then a hint line)
            said = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines()[1:] if ln.strip()]
        except OSError:
            said = []
        tail = " / ".join(said[-2:])[:300]
        return f"the board process ({Path(self.argv[0]).name}, pid {self.proc.pid}) {how}" + (f": {tail}" if tail else "")

    def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.stopped_by_us = True
            kill_process_group(self.proc)
        if self.proc is not None:  # whatever it left behind in its group goes too
            try:
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass


def check_tcp_port_free(settings: SerialSettings) -> None:
    """Before launching a board that listens on a loopback TCP port: something else already
    listening there would take bundlerun's connection (a stale emulator, another run)."""
    import socket

    host, port = _host_port(settings.port_url)
    if not port or host not in ("127.0.0.1", "localhost", "::1"):
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError as exc:
            raise PortFault("port-busy", f"{host}:{port} is already in use ({exc.strerror}); the launched board "
                            "could not listen there (a stale emulator or another run?)") from None


def _host_port(port_url: str) -> tuple[str, str]:
    """('127.0.0.1', '5555') for socket:// and rfc2217:// URLs, ('', '') otherwise."""
    m = re.match(r"^(?:socket|rfc2217)://\[?([^\]/]*?)\]?:(\d+)", port_url)
    return (m.group(1), m.group(2)) if m else ("", "")


# ---------------------------------------------------------------- port handling


class PortFault(Exception):
    """A transport failure (error_kind `transport`); `detail` says which: port-busy,
    port-missing, port-open, port-lost, reset."""

    kind = FailureKind.TRANSPORT

    def __init__(self, detail: str, message: str):
        super().__init__(message)
        self.detail = detail


def port_holders(device: str) -> list[str]:
    """Processes that have `device` open: `fuser`, then `lsof`, then /proc (Linux)."""
    me = os.getpid()
    pids: set[int] = set()
    if "://" in device or not device:
        return []  # a socket:// or rfc2217:// port is no file to ask about
    from bundlerun.targets import argv as checked

    device = checked.local_path(device, "serial port")  # absolute: `fuser -k` must never come from a URL
    for argv in (["fuser", device], ["lsof", "-t", "--", device]):
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=5)
        except (FileNotFoundError, subprocess.TimeoutExpired, OSError):
            continue
        found = {int(tok) for tok in re.findall(r"\b(\d+)\b", res.stdout)}
        if found:
            pids |= found
            break
    if not pids:
        try:
            real = os.path.realpath(device)
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                fd_dir = f"/proc/{entry}/fd"
                try:
                    if any(os.path.realpath(os.path.join(fd_dir, fd)) == real for fd in os.listdir(fd_dir)):
                        pids.add(int(entry))
                except OSError:
                    continue
        except OSError:
            pass
    pids.discard(me)
    out = []
    for pid in sorted(pids):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = ""
        out.append(f"pid {pid} ({cmd[:80]})" if cmd else f"pid {pid}")
    return out


def open_port_waiting(settings: SerialSettings, board: Board | None = None, keep_input: bool = False):
    """`open_port`, retried while the port is not there yet (connection refused, no device
    node) for up to `connect_timeout_s`: a launched emulator or a board re-enumerating after a
    flash. A launched board that exits meanwhile ends the wait at once (LaunchFault)."""
    deadline = time.monotonic() + settings.connect_timeout_s
    while True:
        try:
            return open_port(settings, keep_input=keep_input)
        except PortFault as fault:
            rc = board.exited() if board is not None else None
            if rc is not None:
                raise LaunchFault(FailureKind.TOOL_FAILED, "launch-exited",
                                  f"{board.describe_exit(rc)} before {settings.port_url} could be opened") from None
            if fault.detail != "port-missing" or time.monotonic() >= deadline:
                if settings.connect_timeout_s > 0 and fault.detail == "port-missing":
                    fault.args = (f"{fault.args[0]} (retried for {settings.connect_timeout_s:g}s)",)
                raise
            time.sleep(0.05)


def open_port(settings: SerialSettings, keep_input: bool = False):
    """Open the port exclusively with a bounded read timeout; classify failures.
    `keep_input`: do not let pyserial's socket:// open discard what already arrived (a board
    launched for this case may speak the moment it is connected)."""
    import serial

    kwargs: dict[str, Any] = {"baudrate": settings.baudrate, "timeout": settings.read_timeout_s}
    if "://" not in settings.port_url:  # a device node: lock it, bound writes too
        kwargs.update(exclusive=settings.exclusive, write_timeout=max(1.0, settings.read_timeout_s))
    elif not settings.port_url.startswith("rfc2217://"):  # pyserial's RFC 2217 client has no write timeout
        kwargs.update(write_timeout=max(1.0, settings.read_timeout_s))
    try:
        if keep_input and settings.port_url.startswith("socket://"):
            port = serial.serial_for_url(settings.port_url, do_not_open=True, **kwargs)
            port.reset_input_buffer = lambda: None  # shadow for open() only: QEMU's first bytes are this case's
            try:
                port.open()
            finally:
                del port.reset_input_buffer
            return port
        return serial.serial_for_url(settings.port_url, **kwargs)
    except (serial.SerialException, OSError, ValueError, NotImplementedError) as exc:
        text = str(exc)
        if "exclusively lock" in text or "Device or resource busy" in text or getattr(exc, "errno", None) == 16:
            holders = port_holders(settings.port_url)
            who = f"; held by {', '.join(holders)}" if holders else ""
            raise PortFault("port-busy", f"serial port {settings.port_url} is in use by another process{who}") from None
        if "No such file" in text or "could not open port" in text and "Errno 2" in text:
            raise PortFault("port-missing", f"serial port {settings.port_url} does not exist (board unplugged?)") from None
        if "Connection refused" in text or "timed out" in text:
            raise PortFault("port-missing", f"cannot connect to {settings.port_url}: {text.splitlines()[0]}") from None
        hint = " (add your user to the 'dialout' group?)" if "Permission denied" in text else ""
        first = text.splitlines()[0] if text else repr(exc)
        raise PortFault("port-open", f"cannot open serial port {settings.port_url}: {first}{hint}") from None


def reset_board(port, settings: SerialSettings, values: dict[str, str], log_path: Path) -> None:
    """Pulse DTR/RTS, write the reset command, or run the reset tool."""
    import serial

    mode = settings.reset
    try:
        if mode == "none":
            return
        port.reset_input_buffer()  # drop whatever a previous boot or the flash tool left
        if mode in ("dtr", "rts", "dtr+rts"):
            lines = ["dtr", "rts"] if mode == "dtr+rts" else [mode]
            for name in lines:
                setattr(port, name, True)
            time.sleep(settings.reset_pulse_s)
            for name in lines:
                setattr(port, name, False)
        elif mode == "command":
            port.write(unescape(settings.reset_command or ""))
            port.flush()
        elif mode == "exec":
            res = run_command(render_command(settings.reset_exec or "", values), 60.0, log_path, "reset")
            if not res.ok:
                raise PortFault("reset", res.message)
    except (serial.SerialException, OSError) as exc:
        raise PortFault("port-lost", f"serial port {settings.port_url} failed during reset: {exc}") from None


# ---------------------------------------------------------------- capture


@dataclass
class Capture:
    data: bytes
    status: str  # "finished" | "timeout" | "no-output" | "aborted" | "reboot" | "port-lost"
    message: str | None
    elapsed_s: float


def capture_uart(port, settings: SerialSettings, deadline: float, sink=None, started: float | None = None) -> Capture:
    """Read until the runner is done, the board reboots, the port dies, or the deadline.

    Each read is bounded by the port timeout (`read_timeout_s`); `sink(chunk)`
    receives every chunk (the caller writes the raw capture as it arrives). `started`: the
    monotonic time the deadline counts from, so a timeout's elapsed time is never short of it.
    """
    import serial

    from bundlerun.targets.et_runner.log import IncrementalLogParser

    parser = IncrementalLogParser()
    data = bytearray()
    start = time.monotonic() if started is None else started
    last_data = start
    finished_at: float | None = None  # "Program complete" seen; the EOT byte may still be in flight
    while True:
        now = time.monotonic()
        if finished_at is not None and (parser.eot_seen or now - finished_at >= _EOT_GRACE_S or now >= deadline):
            return Capture(bytes(data), "finished", None, now - start)
        if now >= deadline:
            status = "timeout" if data else "no-output"
            return Capture(bytes(data), status, None, now - start)
        if (
            not data
            and settings.boot_timeout_s is not None
            and now - start >= settings.boot_timeout_s
        ):
            return Capture(bytes(data), "no-output", None, now - start)
        try:
            # pyserial's read(n) gathers until n bytes or `timeout` and *drops what it gathered* when
            # the port closes meanwhile ("socket disconnected": an FVP/QEMU UART socket closing right
            # after the runner's last line lost the whole tail). So: wait for one byte (bounded by
            # read_timeout_s), then take what is already there without waiting (timeout 0 for that
            # read; set on `_timeout` so rfc2217 does not renegotiate the port twice per chunk).
            limit = deadline if finished_at is None else min(deadline, finished_at + _EOT_GRACE_S)
            wanted = max(0.001, min(settings.read_timeout_s, limit - now))
            if port.timeout != wanted:
                port.timeout = wanted
            chunk = port.read(1)
            if chunk and hasattr(port, "_timeout"):
                port._timeout = 0
                try:
                    chunk += port.read(_CHUNK)
                except (serial.SerialException, OSError) as exc:  # the port died after these bytes
                    lost = exc
                else:
                    lost = None
                finally:
                    port._timeout = wanted
                if lost is not None:
                    data += chunk
                    if sink is not None:
                        sink(chunk)
                    parser.feed(chunk)
                    raise lost
        except (serial.SerialException, OSError) as exc:
            if finished_at is not None:  # the board closed the port after its last line: a clean end
                return Capture(bytes(data), "finished", None, time.monotonic() - start)
            if parser.crashed:  # the runner had aborted (e.g. QEMU exits on the abort): not a link fault
                return Capture(bytes(data), "aborted", f"port closed after the runner aborted ({exc})",
                               time.monotonic() - start)
            return Capture(bytes(data), "port-lost", f"{type(exc).__name__}: {exc}", time.monotonic() - start)
        now = time.monotonic()
        if chunk:
            data += chunk
            last_data = now
            if sink is not None:
                sink(chunk)
            lines = parser.feed(chunk)
            if any(marker in ln.raw for ln in lines for marker in _BOOT_MARKERS):
                # The parser pairs a semihosting "Running executor..." with its "PTE @".
                if parser.result().boots > 1:
                    return Capture(bytes(data), "reboot", None, now - start)
            if parser.finished and finished_at is None:
                finished_at = now  # keep reading briefly: the runner's EOT follows its last line
        elif parser.crashed and now - last_data >= settings.settle_s:
            return Capture(bytes(data), "aborted", None, now - start)


# ---------------------------------------------------------------- the target


class SerialTarget(TargetBase):
    """`Target` for a UART-attached runner (board or FVP telnet terminal)."""

    def __init__(self, url: str, settings: SerialSettings, config: dict[str, Any] | None = None):
        self.url = url
        self.settings = settings
        self._config = dict(config or {})  # kept to re-merge RunOptions.config at run time

    def _values(self, bundle_path: Path, case_bundle: Path | None, work: Path) -> dict[str, str]:
        from bundlerun.targets import argv

        s = self.settings
        where = self.url
        # each value is substituted into one word of a flash/reset/launch command: none may start
        # with '-' (an option of that tool) or hold a control character (targets/argv.py)
        values = {
            # absolute: a flash/launch tool may run from elsewhere (sh -c 'cd ...', a probe server)
            "bundle": argv.local_path(Path(bundle_path).resolve(), "bundle", where),
            "case_bundle": argv.local_path(Path(case_bundle or bundle_path).resolve(), "case bundle", where),
            "elf": argv.local_path(s.elf, "elf", where) if s.elf else "",
            "target": argv.word(str(s.target or ""), "target", where, empty=True),
            "port": argv.word(s.port_url, "port", where),
            "host": argv.word(_host_port(s.port_url)[0], "host", where, empty=True),  # socket:// and rfc2217://
            "tcp_port": argv.word(_host_port(s.port_url)[1], "tcp_port", where, empty=True),
            "work_dir": argv.local_path(Path(work).resolve(), "work_dir", where),
        }
        return values

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        s = self.settings
        merged = dict(options.config or {})
        if merged:
            # RunOptions.config may carry CLI flags for this target; URL query still wins.
            from bundlerun.targets import parse_target_url

            s = settings_from(parse_target_url(self.url), {**self._config, **merged})
        work = Path(options.work_dir) / "serial"
        work.mkdir(parents=True, exist_ok=True)
        per_case_flash = bool(s.flash and "{case_bundle}" in s.flash)
        per_case_launch = bool(s.launch and "{case_bundle}" in s.launch)
        cases: list[CaseResult] = []
        logs: dict[str, str] = {}
        setup_start = time.monotonic()
        pairs = selected_cases(bundle, options)
        first_method = bundle.method_test_suites[0].method_name if bundle.method_test_suites else None
        # "board": a launch without {case_bundle} runs once for the whole run, stopped here on every exit path
        state: dict[str, Any] = {"board": None, "setup_s": 0.0}
        try:
            self._run_cases(bundle, bundle_path, options, s, work, pairs, first_method, per_case_flash,
                            per_case_launch, cases, logs, setup_start, state)
        finally:
            if state["board"] is not None:
                state["board"].stop()
                logs["launch"] = str(state["board"].log_path)
        setup_s = state["setup_s"]
        info = {
            "port": s.port_url,
            "baudrate": s.baudrate,
            "reset": s.reset,
            "flash": s.flash,
            "per_case_flash": per_case_flash,
            "launch": s.launch,
            "per_case_launch": per_case_launch,
        }
        return TargetRun(target=self.url, cases=cases, info=info, logs=logs, setup_s=setup_s or None)

    def _run_cases(self, bundle, bundle_path, options, s, work, pairs, first_method, per_case_flash, per_case_launch,
                   cases, logs, setup_start, state) -> None:
        """The case loop of `run`; a run-wide launched board lands in state["board"] (run stops it)."""
        flashed_once = False
        for method, index in pairs:
            if not (per_case_flash or per_case_launch) and (method, index) != (first_method, 0):
                result = CaseResult(
                    method,
                    index,
                    CaseStatus.SKIP,
                    error=(
                        "the runner checks test case 0 of the bundle it holds; set a flash (or launch) command "
                        "with {case_bundle} to run other cases"
                    ),
                    error_kind=FailureKind.UNSUPPORTED,
                )
                cases.append(result)
                if options.progress:
                    options.progress(result)
                continue
            if s.flash and not per_case_flash and not flashed_once:
                res = run_command(
                    render_command(s.flash, self._values(bundle_path, None, work)),
                    s.flash_timeout_s,
                    work / "flash.log",
                    "flash",
                )
                logs["flash"] = str(res.log_path)
                flashed_once = True
                state["setup_s"] = time.monotonic() - setup_start
                if not res.ok:
                    from bundlerun.bundles.errors import TargetError

                    raise TargetError(res.message)
            if s.launch and not per_case_launch and state["board"] is None:
                from bundlerun.bundles.errors import TargetError

                argv = render_command(s.launch, self._values(bundle_path, None, work))
                try:
                    check_tcp_port_free(s)
                    state["board"] = Board(argv, work / "launch.log").start()
                except PortFault as fault:
                    raise TargetError(str(fault), kind=fault.kind.value) from None
                except LaunchFault as fault:
                    raise TargetError(str(fault), kind=fault.kind.value) from None
            result = self._run_case(bundle, bundle_path, method, index, options, s, work, per_case_flash,
                                    per_case_launch, state["board"])
            cases.append(result)
            if result.log_path:
                logs[f"{method}[{index}]"] = result.log_path
            if options.progress:
                options.progress(result)

    def _run_case(
        self,
        bundle: Bundle,
        bundle_path: Path,
        method: str,
        index: int,
        options: RunOptions,
        s: SerialSettings,
        work: Path,
        per_case_flash: bool,
        per_case_launch: bool = False,
        run_board: Board | None = None,
    ) -> CaseResult:
        from bundlerun.bundles.bpte import write_bundle

        stem = f"{_safe(method)}-case{index}"
        case_bundle = work / f"{stem}.bpte"
        write_bundle(bundle.single_case(method, index), case_bundle)
        layout = expected_layout(bundle, method, index)
        attempts = max(0, int(options.retries)) + 1
        result: CaseResult | None = None
        earlier: list[dict[str, Any]] = []
        for attempt in range(attempts):
            if result is not None:
                earlier.append({"error_kind": result.error_kind, "transport_fault": result.extra.get("transport_fault"),
                                "error": result.error, "log_path": result.log_path})
            suffix = "" if attempt == 0 else f".retry{attempt}"
            result = self._attempt(
                method, index, layout, options, s, work, f"{stem}{suffix}", bundle_path, case_bundle, per_case_flash,
                per_case_launch, run_board,
            )
            result.extra["attempts"] = attempt + 1
            if result.extra.get("transport_fault") not in _TRANSIENT:
                break
        assert result is not None
        if earlier:
            result.extra["earlier_attempts"] = earlier
            if result.log_path is None:
                result.log_path = next((e["log_path"] for e in earlier if e["log_path"]), None)
        return result

    def _attempt(
        self,
        method: str,
        index: int,
        layout,
        options: RunOptions,
        s: SerialSettings,
        work: Path,
        stem: str,
        bundle_path: Path,
        case_bundle: Path,
        per_case_flash: bool,
        per_case_launch: bool = False,
        run_board: Board | None = None,
    ) -> CaseResult:
        """One attempt; a per-case `launch` board is started first and stopped (its whole
        process group) on every way out, Ctrl-C and timeouts included."""
        if not per_case_launch:
            return self._attempt_on_board(method, index, layout, options, s, work, stem, bundle_path, case_bundle,
                                          per_case_flash, run_board, False)
        base = CaseResult(method, index, CaseStatus.ERROR, log_path=None)
        board: Board | None = None
        try:
            check_tcp_port_free(s)
            board = Board(render_command(s.launch or "", self._values(bundle_path, case_bundle, work)),
                          work / f"{stem}.launch.log").start()
            return self._attempt_on_board(method, index, layout, options, s, work, stem, bundle_path, case_bundle,
                                          per_case_flash, board, True)
        except (PortFault, LaunchFault) as fault:
            base.error, base.error_kind = fault.args[0], fault.kind
            base.extra["transport_fault"] = fault.detail
            return base
        finally:
            if board is not None:
                board.stop()

    def _attempt_on_board(
        self,
        method: str,
        index: int,
        layout,
        options: RunOptions,
        s: SerialSettings,
        work: Path,
        stem: str,
        bundle_path: Path,
        case_bundle: Path,
        per_case_flash: bool,
        board: Board | None,
        launched_for_case: bool,
    ) -> CaseResult:
        from bundlerun.targets.et_runner.log import parse_runner_log

        values = self._values(bundle_path, case_bundle, work)
        log_path = work / f"{stem}.uart.log"
        base = CaseResult(method, index, CaseStatus.ERROR, log_path=None)
        if board is not None:
            base.extra["launch_log"] = str(board.log_path)
        try:
            port = open_port_waiting(s, board, keep_input=launched_for_case)
        except (PortFault, LaunchFault) as fault:
            base.error, base.error_kind = fault.args[0], fault.kind
            base.extra["transport_fault"] = fault.detail
            return base
        capture: Capture | None = None
        board_rc: int | None = None
        t0 = time.monotonic()
        try:
            if per_case_flash:
                res = run_command(render_command(s.flash or "", values), s.flash_timeout_s, work / f"{stem}.flash.log", "flash")
                base.extra["flash_log"] = str(res.log_path)
                if not res.ok:
                    base.error = res.message
                    base.error_kind = FailureKind.TOOL_FAILED
                    if res.kind == "timeout":
                        base.extra["transport_fault"] = "flash-timeout"
                    return base
            with open(log_path, "wb") as sink_file:
                def sink(chunk: bytes) -> None:
                    sink_file.write(chunk)
                    sink_file.flush()

                reset_board(port, s, values, work / f"{stem}.reset.log")
                t0 = time.monotonic()
                capture = capture_uart(port, s, t0 + options.case_timeout_s, sink, started=t0)
                if board is not None and capture.status not in ("finished", "aborted"):
                    # The UART went quiet or closed: did the board process itself die (emulator
                    # crash, OOM kill)? Asked before the port closes (a bridge may end with it).
                    board_rc = board.exited(wait_s=1.0 if capture.status == "port-lost" else 0.0)
        except PortFault as fault:
            base.error, base.error_kind = fault.args[0], fault.kind
            base.extra["transport_fault"] = fault.detail
            if log_path.exists():
                base.log_path = str(log_path)
            return base
        finally:
            try:
                port.close()
            except Exception:  # closing a vanished device must not mask the result
                pass
        log = parse_runner_log(capture.data)
        detail = capture.message
        if capture.status == "timeout":
            detail = f"{options.case_timeout_s:g}s; no 'Program complete, exiting.' / EOT"
            if not any(ln.level for ln in log.lines):
                detail = f"received {len(capture.data)} bytes, none a runner line: wrong baud rate {s.baudrate}?"
        elif capture.status == "no-output":
            detail = "check wiring, baud rate and the reset method"
        end = SessionEnd(_ENDS[capture.status], f"serial port {s.port_url}", None, detail)
        extra = {**base.extra, "capture_status": capture.status, "bytes": len(capture.data)}
        result = case_from_session(log, end, method, index, layout, None, log_path, capture.elapsed_s, extra,
                                   prefer=s.outputs)
        if capture.status == "port-lost":
            result.extra["transport_fault"] = "port-lost"
        if result.status is not CaseStatus.OK and not result.log_excerpt:
            result.log_excerpt = [ln.raw for ln in log.lines[-30:]] + ([log.partial_last_line] if log.partial_last_line else [])
        if board is not None and board_rc is not None and result.status is not CaseStatus.OK:
            started = any(ln.level for ln in log.lines)
            result.status = CaseStatus.ERROR
            # before the runner's first line it is the tool failing (QEMU's -serial ...,wait=on
            # loads the kernel only once connected); after it, the board died under the runner
            result.error_kind = FailureKind.CRASH if started else FailureKind.TOOL_FAILED
            result.error = (f"{board.describe_exit(board_rc)} " + (f"mid-case, after {len(capture.data)} UART bytes"
                                                                   if started else "before the runner started"))
            result.extra["transport_fault"] = "board-exited"
            result.extra["board_returncode"] = board_rc
        return result


def _doctor(_section: dict) -> list[Check]:
    from bundlerun.targets.probes import dist_check

    import shutil

    rows = [dist_check("pyserial", "pyserial", "serial")]
    # The external commands a [targets.serial] section names must exist before a run needs them.
    for key in ("launch", "flash", "reset_exec"):
        template = _section.get(key) if isinstance(_section, dict) else None
        if not template:
            continue
        try:
            tool = shlex.split(str(template))[0]
        except (ValueError, IndexError):
            rows.append(Check(f"serial {key}", False, f"cannot parse {key} = {template!r}"))
            continue
        found = shutil.which(tool)
        rows.append(Check(f"serial {key}", bool(found), f"{tool} found" if found else
                          f"{tool} not on PATH (the {key} command of [targets.serial])", found or ""))
    return rows


SPEC = TargetSpec(
    name="serial",
    schemes=("serial", "serial+socket", "rfc2217"),
    summary="a board (or an emulator's UART) running arm_executor_runner, over a serial port",
    examples=("serial:///dev/ttyACM0?baud=115200", "serial+socket://HOST:PORT", "rfc2217://HOST:PORT"),
    default_backend="portable",
    doctor=_doctor,
    # external commands, and the values substituted into them ({elf}, {target})
    command_settings=("flash", "reset_exec", "launch", "elf", "debug_elf", "target"),
    capture=lazy("bundlerun.targets.arm.intermediates:capture"),
    device_key=lambda url: _device_key(url),
)


def _device_key(url: TargetURL) -> str | None:
    """One board runs one job at a time: board:/dev/ttyACM0, board:HOST:PORT."""
    where = (url.path or url.netloc) if url.scheme == "serial" else (url.netloc + url.path).strip("/")
    return f"board:{where}" if where else None


def create(url, config: dict) -> SerialTarget:
    """Entry point for targets.open_target (schemes serial, serial+socket, rfc2217)."""
    return SerialTarget(url.raw, settings_from(url, config), config)
