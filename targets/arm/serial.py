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

This module is the target (SPEC, create, the case loop and its retries); its parts:
    serial_settings.py   SerialSettings from [targets.serial] and the URL query
    serial_commands.py   flash / reset tools run to completion, a `launch`ed board process
    serial_port.py       opening the port, who holds it, resetting the board through it
    serial_capture.py    reading the UART until the runner's end, a reboot, a lost port, the deadline
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import shlex
import time
from pathlib import Path
from typing import Any

from bundlerun.targets import Check, TargetSpec, TargetURL, lazy
from bundlerun.targets.arm.serial_capture import Capture, capture_uart
from bundlerun.targets.arm.serial_commands import Board, LaunchFault, render_command, run_command
from bundlerun.targets.arm.serial_port import PortFault, host_port, check_tcp_port_free, open_port_waiting, reset_board
from bundlerun.targets.arm.serial_settings import SerialSettings, settings_from
from bundlerun.targets.et_runner.protocol import SessionEnd, case_from_session
from bundlerun.targets.base import (CaseResult, CaseStatus, RunOptions, TargetBase, TargetRun, expected_layout,
                                    safe_name as _safe, selected_cases)
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.et_runner.log import parse_runner_log

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

# Transport faults worth another attempt (RunOptions.retries); never numerics or reboots.
_TRANSIENT = ("port-lost", "port-busy", "port-missing", "flash-timeout")
# Capture.status -> how the stream ended, for the shared Arm runner protocol.
_ENDS = {"finished": "finished", "aborted": "finished", "timeout": "host-timeout", "no-output": "no-output",
         "reboot": "reboot", "port-lost": "transport-lost"}


class SerialTarget(TargetBase):
    """`Target` for a UART-attached runner (board or FVP telnet terminal)."""

    def __init__(self, url: str, settings: SerialSettings, config: dict[str, Any] | None = None):
        self.url = url
        self.settings = settings
        self._config = dict(config or {})  # kept to re-merge RunOptions.config at run time

    def _values(self, bundle_path: Path, case_bundle: Path | None, work: Path) -> dict[str, str]:
        from bundlerun.targets import argv  # start-up: not loaded by `bundlerun --help`

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
            "host": argv.word(host_port(s.port_url)[0], "host", where, empty=True),  # socket:// and rfc2217://
            "tcp_port": argv.word(host_port(s.port_url)[1], "tcp_port", where, empty=True),
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
                    from bundlerun.bundles.errors import TargetError  # late: its name is bound otherwise in this module

                    raise TargetError(res.message)
            if s.launch and not per_case_launch and state["board"] is None:
                from bundlerun.bundles.errors import TargetError  # late: its name is bound otherwise in this module

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
        from bundlerun.bundles.bpte import write_bundle  # start-up: not loaded by `bundlerun --help`

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
    from bundlerun.targets.probes import dist_check  # start-up: not loaded by `bundlerun --help`

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
