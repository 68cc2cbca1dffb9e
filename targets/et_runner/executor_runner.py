"""ExecuTorch's portable `executor_runner` (examples/portable/executor_runner), its contract once.

Used by every lane that runs that binary: Android over ADB and `qemu-user://aarch64`.
Read from the runner's source and checked on the real binary built from source
(firmware_scripts/android/README.md):

* flags: `--model_path`, `--method_name`, `--bundleio_rtol/atol` (0.01), `--num_executions`,
  `--cpu_threads`, `--output_file PREFIX` (raw `PREFIX-<i>.bin` per tensor output),
  `--print_output none|summary|all`, `--etdump_path` (only with the event tracer, which then
  always writes an ETDump);
* log on stderr, `I 00:00:00.364824 executorch:file.cpp:76] msg` (posix PAL), parsed by
  targets.et_runner.log like every ExecuTorch runner log;
* exit 0: ran and case 0 verified; exit 1: a failed BundleIO check (outputs were written:
  judged on the host like any other) or a refused flag / unreadable model; SIGABRT (134 through
  a shell, -6 without) for every `ET_CHECK_MSG`: missing kernel, missing delegate, load failure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable

from bundlerun.targets.base import DeviceVerdict, PerfFigure
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.base import (PerfKind, Verdict, CaseResult, CaseStatus, expected_layout, raw_outputs_from_bytes,
                                    raw_outputs_from_files)

if TYPE_CHECKING:
    from bundlerun.targets.et_runner.protocol import Failure

# The log parsers (targets/et_runner/log.py, protocol.py: ~5 ms of regular expressions compiled at import) are
# imported on use: a served case that ended cleanly never parses its log, and a lane imports this module before
# it starts its runner.

DEFAULT_RTOL = DEFAULT_ATOL = 0.01
_SIGNALS = {6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_LIBRARY_RE = re.compile(r'(dlopen failed: library "[^"]+" not found|CANNOT LINK EXECUTABLE[^\n]*|library "[^"]+" not found)')
_FLAG_RE = re.compile(r"ERROR: unknown command line flag '([^']+)'")
# Runtime error lines the generic parser (targets/et_runner/protocol.py) has no kind for, read from the pinned
# sources: XNNPACK's payload check (backends/xnnpack/runtime/XNNCompiler.cpp:2172), Method::set_input's
# dtype check (runtime/executor/method.cpp:1206) and the kernels' dtype switch
# (runtime/core/exec_aten/util/scalar_type_util.h:928).
_RUNTIME_CAUSES = (
    (re.compile(r"FlatBuffer verification failed; data may be truncated or corrupt"), FailureKind.BAD_BUNDLE,
     "the XNNPACK delegate payload is corrupt (XNNPACK's flatbuffer check failed)"),
    (re.compile(r"Input (?P<i>\d+) has unexpected scalar type: expected (?P<want>\w+) but was (?P<got>\w+)"),
     FailureKind.BAD_BUNDLE, "the bundle's input {i} is {got} but the program takes {want}: the runtime refuses it"),
    (re.compile(r"Unhandled dtype (?P<dtype>\S+) for (?P<op>\S+)"), FailureKind.UNSUPPORTED,
     "the runner's {op} kernel does not support dtype {dtype}"),
)


def _runtime_cause(log) -> Failure | None:
    from bundlerun.targets.et_runner.protocol import Failure  # on use (module comment)

    for line in log.lines:
        if line.level not in ("E", "F"):
            continue
        for pattern, kind, text in _RUNTIME_CAUSES:
            m = pattern.search(line.message)
            if m:
                return Failure(kind, f"{text.format(**m.groupdict())} ({line.raw.strip()})",
                               log.excerpt() or [ln.raw for ln in log.lines[-10:]])
    return None


def runner_args(model: str, method: str, output_prefix: str, *, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
                num_executions: int = 1, print_output: str | None = None, cpu_threads: int | None = None,
                etdump: str | None = None) -> list[str]:
    """The command-line flags of one run (one one-case bundle)."""
    args = ["--model_path", model, "--method_name", method, "--bundleio_rtol", repr(float(rtol)),
            "--bundleio_atol", repr(float(atol)), "--num_executions", str(int(num_executions)),
            "--output_file", output_prefix]
    if print_output:
        args += ["--print_output", print_output]
    if cpu_threads is not None:
        args += ["--cpu_threads", str(int(cpu_threads))]
    if etdump:
        args += ["--etdump_path", etdump]
    return args


def executions_for(repeat: int, configured: int = 1) -> int:
    """`--num_executions` for `--repeat N` (RunOptions.repeat): one warm-up execution plus N measured
    ones (perf_figures reports iteration 1 as `first` and the median of the N others as `warm`);
    without --repeat (N = 1) the lane's configured count stands."""
    repeat = int(repeat or 1)
    return repeat + 1 if repeat > 1 else max(1, int(configured or 1))


def signal_of(exit_status: int) -> int | None:
    """The signal that ended the runner: -N from subprocess, 128+N through a shell."""
    if exit_status < 0:
        return -exit_status
    if 128 < exit_status < 160:
        return exit_status - 128
    return None


def classify(output: str, exit_status: int | None) -> Failure | None:
    """Why a run did not produce judgeable outputs, or None when it did (a failed
    BundleIO check included: exit 1 with `Test_result: FAIL` is the device's verdict)."""
    if exit_status == 0:
        return None  # a clean exit wins over scary log lines (e.g. an optional library probe)
    from bundlerun.targets.et_runner.log import parse_runner_log  # on use (module comment)
    from bundlerun.targets.et_runner.protocol import Failure, cause_of  # the same

    log = parse_runner_log(output)
    evidence = log.excerpt() or [ln.raw for ln in log.lines[-10:]]
    m = _LIBRARY_RE.search(output)
    if m:
        return Failure(FailureKind.LOAD_FAILURE, f"the runner could not load a library: {m.group(1)}", evidence)
    m = _FLAG_RE.search(output)
    if m:
        return Failure(FailureKind.TOOL_FAILED, f"the runner does not know --{m.group(1)}: it was built without that "
                       "feature (rebuild with firmware_scripts/android/build_executor_runner.sh, or drop the option)",
                       evidence)
    if exit_status == 1 and log.bundle_verdict == Verdict.FAIL:
        return None
    specific = _runtime_cause(log)
    if specific is not None:
        return specific
    cause = cause_of(log)
    sig = signal_of(exit_status) if exit_status is not None else None
    if sig in (6,) and cause is not None:  # ET_CHECK_MSG aborts after logging its cause
        return Failure(cause[0], cause[1], evidence)
    if sig is not None:
        kind = FailureKind.RUNNER_ABORT if sig == 6 else FailureKind.CRASH
        return Failure(kind, f"the runner died on {_SIGNALS.get(sig, f'signal {sig}')} (exit {exit_status})", evidence)
    if exit_status in (126, 127):
        tail = output.strip().splitlines()[-1] if output.strip() else ""
        return Failure(FailureKind.TOOL_MISSING, f"the runner could not be started (exit {exit_status}): {tail}", evidence)
    if cause is not None:
        return Failure(cause[0], cause[1], evidence)
    last = next((ln.raw for ln in reversed(log.lines) if ln.raw.strip()), "")
    return Failure(FailureKind.RUNNER_ERROR, f"the runner exited with status {exit_status}" + (f": {last}" if last else ""),
                   evidence)


_LOADED_RE = re.compile(r"^Model loaded in (?P<ms>[0-9.eE+-]+) ms")
_ITERATION_RE = re.compile(r"^Iteration (?P<i>\d+) of (?P<n>\d+): (?P<ms>[0-9.eE+-]+) ms")
_EXECUTED_RE = re.compile(r"^Model executed successfully (?P<n>\d+) time\(s\) in (?P<ms>[0-9.eE+-]+) ms")


def perf_figures(output: str, simulated: bool = False) -> list[PerfFigure]:
    """The runner's own timing (`Model loaded in X ms.`, `Iteration i of N: X ms`, `Model executed
    successfully N time(s) in X ms.`, measured with pal_current_ticks around Method::execute) and
    planned buffer sizes. Iteration 1 is the first (cold) execution; the warm figure is the median
    of the later iterations (absent with --num_executions 1). `simulated`: the runner ran under
    an emulator (qemu-user), so its clock measures emulation, not device latency."""
    from statistics import median

    from bundlerun.targets.arm.perf import planned_buffer  # start-up: not loaded by `bundlerun --help`
    from bundlerun.targets.et_runner.log import parse_runner_log  # on use (module comment)

    kind = PerfKind.SIMULATION_TIME if simulated else PerfKind.DEVICE_LATENCY
    src = "executor_runner log (executor_runner.cpp)"
    figures: list[PerfFigure] = []
    iterations: dict[int, float] = {}
    for ln in parse_runner_log(output).lines:
        if ln.level is None:
            continue
        msg = ln.message.strip()
        if m := _LOADED_RE.match(msg):
            figures.append(PerfFigure("load_time", float(m.group("ms")), "ms", kind, src,
                                      note="Program::load to load_method, planned buffers allocated in between"))
        elif m := _ITERATION_RE.match(msg):
            iterations[int(m.group("i"))] = float(m.group("ms"))
        elif m := _EXECUTED_RE.match(msg):
            n, total = int(m.group("n")), float(m.group("ms"))
            figures.append(PerfFigure("execution_time_total", total, "ms", kind, src, total / n if n else None))
            figures.append(PerfFigure("executions", n, "count", PerfKind.COUNT, src))
        elif pb := planned_buffer(msg):
            figures.append(PerfFigure(f"planned_buffer{pb[0]}_size", pb[1], "bytes", PerfKind.MEMORY, src))
    if 1 in iterations:
        figures.append(PerfFigure("execution_time", iterations[1], "ms", kind, src, phase="first"))
    warm = [ms for i, ms in sorted(iterations.items()) if i > 1]
    if warm:
        figures.append(PerfFigure("execution_time", median(warm), "ms", kind, src, phase="warm", samples=warm,
                                  note=f"median of {len(warm)} warm executions (the first excluded)"))
    return figures


def device_verdict(output: str) -> dict | None:
    """The runner's own BundleIO verdict on case 0 (compiled-in defaults or --bundleio_*)."""
    from bundlerun.targets.et_runner.log import parse_runner_log  # on use (module comment)

    log = parse_runner_log(output)
    if log.bundle_verdict is None and not log.error_stats:
        return None
    return DeviceVerdict(log.bundle_verdict, "executor_runner BundleIO (test case 0)",
                         error_stats=dict(log.error_stats)).to_dict()


def case_result(bundle, method: str, index: int, folder, rc: int | None, output: str, timeout_s: float,
                classify_fn: Callable[[str, int], Failure | None], base: dict[str, Any], who: str = "the runner",
                etdump: str | None = None, read: list[tuple[str, bytes | str]] | None = None):
    """The CaseResult of one executor_runner process that ran a one-case bundle in `folder` with
    `runner_args(..., "out/output", etdump=...)`: a timeout (rc None: its process group was killed),
    the lane's classified failure, or the outputs it wrote (out/output-K.bin, checked against the
    bundle's layout). `base` holds the CaseResult fields the lane measured (log path, elapsed, ...).
    `read`: those files as a served runner left them, read before its next trigger (server.py)."""

    tail = output.splitlines()[-10:]
    if rc is None:
        return CaseResult(status=CaseStatus.TIMEOUT, error=f"{who} did not finish within {timeout_s:g} s; "
                          "process group killed", error_kind=FailureKind.HOST_TIMEOUT, log_excerpt=tail, **base)
    problem = classify_fn(output, rc)
    if problem:
        return CaseResult(status=problem.status, error=problem.message, error_kind=problem.kind,
                          log_excerpt=problem.evidence, **base)
    layout = expected_layout(bundle, method, index)
    if read is not None:
        outputs, err = raw_outputs_from_bytes(read[:len(layout)], layout, len(read))
    else:
        files = [folder / "out" / f"output-{k}.bin" for k in range(len(layout))]
        outputs, err = raw_outputs_from_files([f for f in files if f.is_file()], layout)
    if err:
        kind = FailureKind.WRONG_OUTPUT_SIZE if "bytes, expected" in err else FailureKind.MISSING_OUTPUT
        return CaseResult(status=CaseStatus.ERROR, error=err, error_kind=kind, log_excerpt=tail, **base)
    result = CaseResult(status=CaseStatus.OK, outputs=outputs, extra={"outputs_from": "files"}, **base)
    if etdump and (folder / etdump).is_file():
        result.extra["etdump"] = str(folder / etdump)
    return result
