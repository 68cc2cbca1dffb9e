"""ExecuTorch's Arm runner protocol, once: how a session ended, what failed, what the
device said, and where the outputs are.

Every Arm-runner lane (an FVP, QEMU's mps3-an547, a board on a serial port) only
moves bytes: it hands this module the parsed log (`targets.et_runner.log.RunnerLog`),
how the byte stream ended (`SessionEnd`), and, in semihosting mode, the folder
the runner wrote its files into. Semantics checked against
`examples/arm/executor_runner/arm_executor_runner.cpp` and ExecuTorch's runtime:

* `Missing operator: [i] name` (method.cpp) -> missing-operator, naming it;
  `Memory allocation failed: NB requested ...` (memory_allocator.h) -> allocation
  failure with the bytes; `Backend X is not registered.` -> missing-backend;
  `Program loading failed` -> bad bundle.
* A failed BundleIO check prints `... don't match expected BundleIO bpte ref data`,
  `Test_result: FAIL`, `Bundle verification failed with status 0x..` and then
  aborts on `ET_CHECK_MSG(model_ok == true, "Problem running model")`: that is the
  device's verdict, not an infrastructure error; outputs are still collected.
* A run that printed its success marker and then hit a simulator limit succeeded.
* E lines with no F line followed by silence are a runner error naming the first
  E line, even when the host's wall-clock bound ends the run.
* On a build without semihosting, `et_pal_abort()` ends in a trap (`udf`), which a
  fault handler reports as a hard fault (UNDEFINSTR) right after the F line: that
  fault is the abort itself, judged by its F line (a failed BundleIO check then
  still gives the device's verdict and the outputs), not a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundlerun.targets.et_runner.log import FAULT_RE, LogLine, RunnerLog
from bundlerun.targets.base import CaseResult, CaseStatus, DeviceVerdict, RawTensor, raw_outputs_from_files
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.base import Verdict

# What a failed BundleIO check of case 0 prints on its own (the device's verdict).
VERIFY_FAIL_MARKERS = (
    "output data mismatched the expected one",  # devtools/bundled_program/bundled_program.cpp
    "don't match expected BundleIO bpte ref data",
    "Test_result: FAIL",
    "Bundle verification failed with status",
    "Problem running model",
)
_MISSING_OP_RE = re.compile(r"Missing operator: \[\d+\] (?P<op>\S+)|kernel '(?P<kernel>[^']+)' not found")
_ALLOC_RE = re.compile(r"Memory allocation failed: (?P<bytes>\d+)B requested(?:.*?(?P<avail>\d+)B available)?")
_BACKEND_RE = re.compile(r"Backend (?P<backend>\S+) is not (?:registered|available)")
_BAD_PROGRAM_RE = re.compile(r"Program loading failed|Invalid (?:program|flatbuffer)|Extended header may be corrupt|"
                             r"Program identifier .* does not match|bundled program .* (?:invalid|not)|"
                             r"Root table offset .* is invalid|Failed parsing tensor|segment offset .* invalid|"
                             r"Failed to parse model file", re.I)
_SHORT_WRITE_RE = re.compile(r"Failed to write whole output file (?P<file>\S+), wrote (?P<got>\d+) of (?P<want>\d+) bytes")
_OUT_FILE_RE = re.compile(r"^(?P<base>.+)-(?P<i>\d+)\.bin$")


@dataclass
class SessionEnd:
    """How the byte stream of one runner session ended, as the driver saw it."""

    how: str  # "exited" | "finished" | "host-timeout" | "no-output" | "transport-lost" | "reboot"
    tool: str = "runner"  # who produced the stream, for messages: "FVP", "QEMU", a port name
    returncode: int | None = None
    detail: str | None = None  # e.g. the transport's own error text


@dataclass
class Failure:
    """One classified failure: its kind, a one-line cause and the evidence lines."""

    kind: FailureKind
    message: str
    evidence: list[str] = field(default_factory=list)

    @property
    def status(self) -> CaseStatus:
        return CaseStatus.TIMEOUT if self.kind.is_timeout else CaseStatus.ERROR


def device_verdict(log: RunnerLog) -> dict[str, Any] | None:
    """The runner's own BundleIO verdict as a report record, or None if it printed none."""
    if log.bundle_verdict is None and not log.error_stats:
        return None
    return DeviceVerdict(log.bundle_verdict, "arm_executor_runner BundleIO (test case 0)", tolerances=dict(log.verdict_tolerances), status=log.verification_status,
                         error_stats=dict(log.error_stats)).to_dict()


def _is_verify_line(text: str) -> bool:
    return any(marker in text for marker in VERIFY_FAIL_MARKERS)


def _cause_kind(causes: list[LogLine]) -> tuple[FailureKind, str]:
    """Kind and one-line cause from the runner's error lines: a specific cause anywhere among
    them (missing operator, pool too small, ...) wins over the generic abort that follows it."""
    for line in causes:
        kind, message = _specific_cause(line)
        if kind is not None:
            return kind, message
    first = causes[0]
    if first.level == "F":
        return FailureKind.RUNNER_ABORT, f"the runner aborted: {first.raw.strip()}"
    return FailureKind.RUNNER_ERROR, f"runner error: {first.raw.strip()}"


def _specific_cause(line: LogLine) -> tuple[FailureKind | None, str]:
    msg = line.message
    m = _MISSING_OP_RE.search(msg)
    if m:
        op = m.group("op") or m.group("kernel")
        return FailureKind.MISSING_OPERATOR, f"the runner has no kernel for {op} ({line.raw.strip()})"
    m = _ALLOC_RE.search(msg)
    if m:
        avail = f", {m.group('avail')} B available" if m.group("avail") else ""
        return FailureKind.ALLOCATION_FAILURE, (
            f"a memory pool is too small: {m.group('bytes')} B requested{avail} ({line.raw.strip()})")
    m = _BACKEND_RE.search(msg)
    if m:
        return FailureKind.MISSING_BACKEND, f"the runner has no {m.group('backend')} delegate ({line.raw.strip()})"
    if _BAD_PROGRAM_RE.search(msg):
        return FailureKind.BAD_BUNDLE, f"the runner could not load the program: {line.raw.strip()}"
    m = _SHORT_WRITE_RE.search(msg)
    if m:
        return FailureKind.WRONG_OUTPUT_SIZE, (f"output file {m.group('file')} has {m.group('got')} bytes, expected "
                                               f"{m.group('want')} (the runner's write was cut short)")
    return None, ""


def cause_of(log: RunnerLog) -> tuple[FailureKind, str] | None:
    """Kind and one-line cause from the runner's own error lines (a failed BundleIO check and
    benign lines are not causes), or None when it logged none."""
    causes = [e for e in log.causes if not _is_verify_line(e.message)]
    return _cause_kind(causes) if causes else None


def _tail(log: RunnerLog, n: int = 10) -> list[str]:
    lines = [ln.raw for ln in log.lines[-n:]]
    if log.partial_last_line:
        lines.append(log.partial_last_line)
    return lines


def classify(log: RunnerLog, end: SessionEnd) -> Failure | None:
    """The failure one session shows, or None when outputs can be collected
    (a failed BundleIO check on the device included: that is judged on the host)."""
    evidence = log.excerpt() or _tail(log)
    if end.how == "transport-lost":
        return Failure(FailureKind.TRANSPORT, f"{end.tool} lost mid-run ({end.detail or 'connection closed'})", evidence)
    if end.how == "reboot" or log.boots > 1:
        return Failure(FailureKind.REBOOT, f"the target rebooted during the run ({max(log.boots, 2)} starts)", evidence)
    faults = [f for f in log.fatal if FAULT_RE.search(f)]
    fatal = log.fatal
    if faults and _fault_is_abort_trap(log):
        faults, fatal = [], [f for f in log.fatal if not FAULT_RE.search(f)]
    if faults:
        return Failure(FailureKind.HARD_FAULT, f"target crashed: {_from_marker(faults[0])}", evidence)
    causes = [e for e in log.causes if not _is_verify_line(e.message)]
    asserts = [f for f in fatal if "CPU time has been exceeded" not in f and not _is_verify_line(f)]
    if causes:
        kind, message = _cause_kind(causes)
        if kind in (FailureKind.RUNNER_ERROR, FailureKind.RUNNER_ABORT) and asserts and not any(
                e.level == "F" for e in causes):
            kind = FailureKind.RUNNER_ABORT
        return Failure(kind, message, evidence)
    if asserts:
        return Failure(FailureKind.RUNNER_ABORT, f"the runner aborted: {_from_marker(asserts[0])}", evidence)
    complete = log.program_complete or log.eot_seen
    if end.how == "host-timeout" and not complete:
        if not any(ln.level for ln in log.lines):
            if log.lines:
                return Failure(FailureKind.HOST_TIMEOUT,
                               f"{end.tool}: output but no runner log line before the wall-clock bound "
                               f"({end.detail or 'wrong baud rate or firmware?'})", _tail(log, 15))
            return Failure(FailureKind.HOST_TIMEOUT, f"{end.tool}: no output at all within the wall-clock bound"
                           + (f" ({end.detail})" if end.detail else ""), [])
        return Failure(FailureKind.HOST_TIMEOUT, f"{end.tool} still running at the wall-clock bound"
                       + (f" ({end.detail})" if end.detail else "") + "; process group killed", evidence)
    if end.how == "no-output":
        return Failure(FailureKind.HOST_TIMEOUT, f"no bytes from {end.tool}" + (f" ({end.detail})" if end.detail else ""), [])
    if log.cpu_time_exceeded and not complete and log.bundle_verdict is None:
        return Failure(FailureKind.CPU_TIME_LIMIT, f"{end.tool} CPU time limit reached: CPU time has been exceeded"
                       + (f" ({end.detail})" if end.detail else ""), evidence)
    if not any(ln.level for ln in log.lines):
        tail = _tail(log, 15)
        if end.returncode not in (0, None):
            said = next((ln.raw.strip() for ln in log.lines if ln.raw.strip().lower().startswith(("error", "fatal"))), None)
            said = said or next((t.strip() for t in reversed(tail) if t.strip()), "no output")
            return Failure(FailureKind.TOOL_FAILED,
                           f"{end.tool} failed (exit {end.returncode}) before the runner started: {said}", tail)
        return Failure(FailureKind.NO_RUNNER_OUTPUT,
                       f"no arm_executor_runner log lines in {end.tool} output ({len(log.lines)} other lines; "
                       f"exit code {end.returncode})", tail)
    if not complete and log.bundle_verdict != Verdict.FAIL:
        return Failure(FailureKind.INCOMPLETE, "runner stopped before 'Program complete, exiting.'"
                       + (f" ({end.tool}: {log.simulation_stopped})" if log.simulation_stopped else ""), evidence)
    return None


_CFSR_RE = re.compile(r"cfsr=(0x[0-9a-fA-F]+)")
_UNDEFINSTR = 1 << 16  # CFSR.UFSR.UNDEFINSTR: what `udf` (__builtin_trap) raises


def _fault_is_abort_trap(log: RunnerLog) -> bool:
    """The first fault line follows an F (abort) line and is an undefined-instruction trap (or
    says nothing about its cause): et_pal_abort()'s trap on a UART build, not a crash."""
    abort_at = fault_at = None
    for i, ln in enumerate(log.lines):
        is_fault = bool(FAULT_RE.search(ln.raw))
        if is_fault:
            fault_at = i
            break
        if ln.level == "F" and abort_at is None:
            abort_at = i
    if abort_at is None or fault_at is None:
        return False
    m = _CFSR_RE.search(log.lines[fault_at].raw)
    return m is None or bool(int(m.group(1), 16) & _UNDEFINSTR)


def _from_marker(raw: str) -> str:
    """A fatal line without the UART noise that may precede it on the same line."""
    m = re.search(r"[DIEF] \[executorch:|(?<![A-Za-z_])hard ?fault|assert|Exception caught", raw, re.I)
    return (raw[m.start():] if m else raw).strip()[:300]


# ------------------------------------------------------------------------- outputs


def output_files(folder: Path, basename: str = "out") -> list[Path]:
    """`<basename>-<i>.bin` sorted numerically (out-10 after out-9)."""
    found = []
    for p in Path(folder).iterdir():
        m = _OUT_FILE_RE.match(p.name)
        if m and m.group("base") == basename:
            found.append((int(m.group("i")), p))
    return [p for _, p in sorted(found)]


def clear_outputs(folder: Path, basename: str = "out") -> None:
    """The runner never removes old output files: do it before each session."""
    for stale in output_files(folder, basename):
        stale.unlink()
    for name in ("etdump.bin", "debug_buffer.bin"):
        (Path(folder) / name).unlink(missing_ok=True)


@dataclass
class Collected:
    outputs: list[RawTensor]
    source: str  # "files" | "etdump" | "printed"
    notes: list[str] = field(default_factory=list)


def collect_outputs(
    log: RunnerLog,
    layout: list[tuple[int, list[int]]],
    files_dir: Path | None = None,
    prefer: str = "auto",
    basename: str = "out",
) -> Collected | Failure:
    """Outputs of one session from the best channel there is:
    semihosting files (`out-<i>.bin`, bit exact), else the ETDump block or
    semihosting `etdump.bin`+`debug_buffer.bin` (bit exact), else the printed
    `Output[i][j]` lines (6 decimals, lossy). `prefer`: auto | files | etdump | printed."""
    from bundlerun.targets.et_runner.outputs import OutputDecodeError, outputs_from_etdump, outputs_from_etdump_b64, outputs_from_printed  # start-up: not loaded by `bundlerun --help`

    problems: list[str] = []
    if files_dir is not None and prefer in ("auto", "files"):
        files = output_files(files_dir, basename)
        if files or prefer == "files":
            outs, err = raw_outputs_from_files(files, layout)
            if err is None:
                return Collected(outs, "files")
            kind = FailureKind.WRONG_OUTPUT_SIZE if "bytes, expected" in err else FailureKind.MISSING_OUTPUT
            about = [ln.raw for ln in log.lines if ln.level and "output" in ln.message.lower()]
            return Failure(kind, err, (about or _tail(log))[-15:])
        problems.append(f"no {basename}-<i>.bin files")
    if prefer in ("auto", "etdump", "files"):
        try:
            if files_dir is not None and (Path(files_dir) / "etdump.bin").is_file():
                debug = Path(files_dir) / "debug_buffer.bin"
                outs = outputs_from_etdump((Path(files_dir) / "etdump.bin").read_bytes(),
                                           debug.read_bytes() if debug.is_file() else None, layout)
                return Collected(outs, "etdump", problems)
            if log.etdump_b64 and log.etdump_complete:
                return Collected(outputs_from_etdump_b64(log.etdump_b64, layout, log.debug_buffer_b64), "etdump", problems)
            if log.etdump_b64 is not None:
                problems.append("ETDump block incomplete (no #[END])")
            elif prefer == "etdump":
                problems.append("no ETDump block (runner built without ETDump output dumping)")
        except OutputDecodeError as exc:
            problems.append(f"ETDump: {exc}")
    if prefer in ("auto", "printed"):
        try:
            if log.printed_outputs or prefer == "printed":
                return Collected(outputs_from_printed(log.printed_outputs, layout, log.printed_elided), "printed", problems)
        except OutputDecodeError as exc:
            kind = FailureKind.WRONG_OUTPUT_SIZE if "printed values" in str(exc) else FailureKind.MISSING_OUTPUT
            return Failure(kind, "; ".join(problems + [f"printed: {exc}"]), _tail(log))
        problems.append("no Output[i][j] lines (build with ET_LOG_DUMP_OUTPUT or ETDump)")
    if log.bundle_verdict == Verdict.FAIL:
        return Failure(FailureKind.DEVICE_MISMATCH, "the runner's BundleIO check failed and no outputs came back: "
                       + "; ".join(problems), log.excerpt() or _tail(log))
    return Failure(FailureKind.MISSING_OUTPUT, "; ".join(problems) or "no outputs in the log", _tail(log))


def case_from_session(log: RunnerLog, end, method: str, index: int, layout, files_dir: Path | None,
                      log_path: Path, elapsed_s: float | None, extra: dict[str, Any] | None = None,
                      prefer: str = "auto") -> CaseResult:
    """One CaseResult from one runner session: classified through the shared protocol,
    outputs collected from the best channel. Used by every Arm-runner lane."""
    result = CaseResult(method, index, CaseStatus.OK, log_path=str(log_path), elapsed_s=elapsed_s,
                        device_verdict=device_verdict(log), extra=dict(extra or {}))
    if log.partial_last_line:
        result.extra["partial_last_line"] = log.partial_last_line
    from bundlerun.targets.arm.perf import SIMULATORS, arm_runner_figures  # start-up: not loaded by `bundlerun --help`

    result.add_perf(arm_runner_figures(log, simulated=getattr(end, "tool", None) in SIMULATORS))
    got: Collected | Failure | None = classify(log, end)
    if got is None:
        got = collect_outputs(log, layout, files_dir, prefer=prefer)
    if isinstance(got, Failure):
        result.status, result.error, result.error_kind, result.log_excerpt = got.status, got.message, got.kind, got.evidence
        return result
    result.outputs = got.outputs
    result.extra["outputs_from"] = got.source
    if got.notes:
        result.extra["output_notes"] = got.notes
    result.log_excerpt = log.excerpt(limit=20)
    return result
