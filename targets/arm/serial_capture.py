"""The UART capture: read an opened port until the runner is done (`Program complete, exiting.`
and its EOT, or its abort), the board reboots, the port dies, or the deadline.

Apart from the target because it is the one loop every byte passes through, and tests drive it
directly on real pyserial ports (loop://, a socket) with the stop rules below.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bundlerun.targets.arm.serial_settings import SerialSettings
from bundlerun.targets.et_runner.log import IncrementalLogParser

_BOOT_MARKERS = ("PTE @ ", "Running executor with parameter:", "Ethos-U rev ")
# ET_CHECK_MSG(model_ok == true, "Problem running model") follows a failed BundleIO
# check: the runner aborts by design, after printing outputs, verdict and ETDump.
_CHUNK = 16384
# After "Program complete, exiting." the runner sends EOT (0x04); older runners send nothing more.
# Wait this long for it so the raw capture is the whole session, without stalling those runners.
_EOT_GRACE_S = 0.5


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
