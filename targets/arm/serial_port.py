"""The serial port: opening it (exclusive, every read bounded, failures classified as
`PortFault`), waiting for a port that is not there yet, naming who holds a busy one, resetting
the board through it, and checking a launched board's loopback TCP port is free.

Apart from the target so that every way the link can fail has one home and one exception
(`PortFault`, error_kind `transport`; `detail` is what `RunOptions.retries` looks at).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from bundlerun.targets.arm.serial_commands import Board, LaunchFault, render_command, run_command
from bundlerun.targets.arm.serial_settings import SerialSettings, unescape
from bundlerun.targets.failures import FailureKind


def check_tcp_port_free(settings: SerialSettings) -> None:
    """Before launching a board that listens on a loopback TCP port: something else already
    listening there would take bundlerun's connection (a stale emulator, another run)."""
    import socket

    host, port = host_port(settings.port_url)
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


def host_port(port_url: str) -> tuple[str, str]:
    """('127.0.0.1', '5555') for socket:// and rfc2217:// URLs, ('', '') otherwise."""
    m = re.match(r"^(?:socket|rfc2217)://\[?([^\]/]*?)\]?:(\d+)", port_url)
    return (m.group(1), m.group(2)) if m else ("", "")


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
    from bundlerun.targets import argv as checked  # start-up: not loaded by `bundlerun --help`

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
