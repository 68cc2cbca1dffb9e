"""`mlx://cpu` on ExecuTorch's own MLX delegate: its `executor_runner` with `backends/mlx/runtime`
(MLXBackend.cpp, MLXInterpreter.h, ...) linked against the `mlx` wheel's libmlx.so, built from the
pinned sources by firmware_scripts/mlx/build_mlx_runner.sh into the runner cache (kind
`mlx_executor_runner`). The same C++ interpreter a Mac runs, on MLX's CPU kernels.

The cases of a method run on one executor_runner in `--server_mode` (targets/et_runner/server.py):
the program is loaded and the delegate initialised once, each case's inputs go in as `--inputs`
files and its outputs come back bit exact from `--output_file`. Where a case needs a process of its
own (`--repeat`, an ETDump, printed outputs, inputs the files cannot carry, or the case a server
died on), it runs as its own one-case bundle (the runner loads and checks case 0 only) in its own
folder, under the executor_runner contract of targets/et_runner/executor_runner.py. Every process
runs in its own process group under the case timeout and is always reaped. What only this lane
can say is read from the delegate's own log lines first (MLXBackend.cpp, MLXLoader.cpp.tmpl): an
MLX op the runtime's schema lacks, a payload it cannot load, an execute error, a dtype it does not
support, a libmlx.so the runner cannot find.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bundlerun.bundles.errors import TargetError
from bundlerun.targets.gil_handoff import responsive_waits
from bundlerun.targets.et_runner import executor_runner, server
from bundlerun.targets.et_runner.log import parse_runner_log
from bundlerun.targets.et_runner.protocol import Failure
from bundlerun.targets.base import (
    CaseResult,
    RunOptions,
    TargetRun,
    safe_name,
)
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.process import kill_process_group, start_program
from bundlerun.targets.runner_cache import find_runner, read_record, runner_binary, cached_runners

if TYPE_CHECKING:
    from bundlerun.bundles.bpte import Bundle

RUNNER_KIND = "mlx_executor_runner"
BUILD_COMMAND = "bash firmware_scripts/mlx/build_mlx_runner.sh --jobs 2"
BUILD_HINT = f"build it with `{BUILD_COMMAND}` (scripts/setup.sh does), or set runner=PATH"
RUNTIME = "ExecuTorch MLX delegate (backends/mlx/runtime, C++) in executor_runner"

_LD_MISSING_RE = re.compile(r"error while loading shared libraries: (?P<lib>[^:]+): (?P<why>[^\n]*)")
_UNKNOWN_OP_RE = re.compile(r"Unknown op_type in load_instruction: (?P<n>\d+)")  # MLXLoader.cpp.tmpl:80
_LOAD_RE = re.compile(r"Failed to load MLX program: (?P<why>.*)")  # MLXBackend.cpp init()
_EXEC_RE = re.compile(r"MLX execute failed: (?P<why>.*)")  # MLXBackend.cpp execute()
_DTYPE_RE = re.compile(r"Unsupported ScalarType: -?\d+|dtype mismatch")  # MLXExecutor.h:611, MLXBackend.cpp:72
_NOT_AVAILABLE = "Backend MLXBackend is not available"  # runtime/executor/method.cpp: is_available() false


def default_runner() -> Path | None:
    """The newest cached MLX executor_runner, or None."""
    return find_runner(RUNNER_KIND, "binary", arch="x86_64")


def cached_mlx_runners() -> list[dict[str, Any]]:
    """Every cached MLX runner (newest first) with `ready` (binary and its libmlx.so present) and a
    one-line `detail`, for `bundlerun doctor`."""

    rows = []
    for r in cached_runners(RUNNER_KIND):
        binary = Path(str(r.get("binary", "")))
        lib = binary.parent / "mlx" / "lib" / "libmlx.so"
        missing = [str(p) for p in (binary, lib) if not p.is_file()]
        mlx = r.get("mlx") or {}
        detail = (f"mlx {mlx.get('version', '?')}, ExecuTorch sources {(r.get('sources') or {}).get('fingerprint', '?')}, "
                  f"patches {len(r.get('patches') or [])}, built in {r.get('build_seconds', '?')} s at {r.get('built_at', '?')}")
        rows.append({"dir": r["dir"], "ready": not missing,
                     "detail": detail if not missing else f"missing {', '.join(missing)}"})
    return rows


def runner_record(binary: Path) -> dict[str, Any]:
    """The runner.json beside `binary` (how it was built), or {} for a runner from elsewhere."""
    record = read_record(Path(binary).parent)
    return record if record is not None and record.get("kind") == RUNNER_KIND else {}


@lru_cache(maxsize=1)
def _wheel_op_names() -> tuple[str, ...]:
    """The OpNode union of the installed executorch wheel's MLX schema, index 1 first (what the
    bundle's payload was serialized with). Read as text: no executorch import in the parent."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        return ()
    fbs = Path(list(spec.submodule_search_locations)[0]) / "backends" / "mlx" / "serialization" / "schema.fbs"
    try:
        m = re.search(r"union\s+OpNode\s*\{(?P<body>[^}]*)\}", fbs.read_text())
    except OSError:
        return ()
    if not m:
        return ()
    body = re.sub(r"//[^\n]*", "", m.group("body"))
    return tuple(n.strip() for n in body.split(",") if n.strip())


def op_name(index: int) -> str | None:
    names = _wheel_op_names()
    return names[index - 1] if 0 < index <= len(names) else None


def classify(output: str, exit_status: int | None, runner: Path) -> Failure | None:
    """executor_runner.classify, after what only the MLX delegate says (its own error lines)."""
    if exit_status == 0:
        return None
    m = _LD_MISSING_RE.search(output)
    if m:
        return Failure(FailureKind.TOOL_MISSING,
                       f"the MLX runner cannot start: {m.group('lib')}: {m.group('why').strip()} (it looks in "
                       f"{Path(runner).parent / 'mlx' / 'lib'}); rebuild it with `{BUILD_COMMAND} --rebuild`",
                       [m.group(0)])
    log = parse_runner_log(output)
    evidence = log.excerpt() or [ln.raw for ln in log.lines[-10:]]
    for line in log.lines:
        if line.level not in ("E", "F"):
            continue
        if m := _UNKNOWN_OP_RE.search(line.message):
            n = int(m.group("n"))
            name = op_name(n)
            return Failure(FailureKind.MISSING_OPERATOR,
                           f"ExecuTorch's MLX runtime in this runner has no MLX op #{n}"
                           + (f" ({name})" if name else "")
                           + ": the bundle was lowered with a newer MLX schema (the executorch wheel's) than the "
                           "runner's sources know", evidence)
        if m := _LOAD_RE.search(line.message):
            why = m.group("why").strip()
            if _DTYPE_RE.search(why):
                return Failure(FailureKind.UNSUPPORTED, f"the MLX delegate does not run this dtype: {why}", evidence)
            return Failure(FailureKind.BAD_BUNDLE, f"the MLX delegate could not load its payload: {why}", evidence)
        if m := _EXEC_RE.search(line.message):
            why = m.group("why").strip()
            if _DTYPE_RE.search(why):
                return Failure(FailureKind.UNSUPPORTED, f"the MLX delegate does not run this dtype: {why}", evidence)
            return Failure(FailureKind.RUNNER_ERROR, f"the MLX delegate failed: {why}", evidence)
    if _NOT_AVAILABLE in output:
        return Failure(FailureKind.MISSING_BACKEND, "the runner's MLXBackend is not available: MLX has no usable "
                       "default device here", evidence)
    return executor_runner.classify(output, exit_status)


def run_process(runner: Path, args: list[str], cwd: Path, log_path: Path, timeout_s: float) -> tuple[int | None, float, str]:
    """The runner in `cwd`, stdout + stderr into `log_path`, in its own process group bounded by
    `timeout_s` and always reaped: (exit status or None on timeout, seconds, log text).

    The bound is a timer that kills the group, and the wait is a blocking waitpid: Popen.wait(timeout)
    polls with sleeps of up to 50 ms, which on a ~25 ms runner process doubled the cost of a case."""
    start = time.monotonic()
    expired = threading.Event()
    with open(log_path, "wb") as log:
        proc = start_program([str(runner), *args], "the MLX runner binary", cwd=cwd, stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                             env={**os.environ})

        def expire() -> None:
            expired.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        timer = threading.Timer(timeout_s, expire)
        timer.daemon = True
        timer.start()
        try:
            rc: int | None = proc.wait()
        finally:
            timer.cancel()
            kill_process_group(proc, term_first=False)  # anything it left in its group; reaps
    return (None if expired.is_set() else rc), time.monotonic() - start, log_path.read_text(errors="replace")


def resolve_runner(configured: Path | None) -> Path:
    runner = configured or default_runner()
    if runner is None:
        raise TargetError(f"no MLX executor_runner (ExecuTorch's C++ MLX delegate) in the build cache; {BUILD_HINT}")
    return runner_binary(runner, "the MLX", BUILD_HINT)


def run_bundle(url: str, bundle: Bundle, options: RunOptions, runner: Path, *, etdump: bool = False,
               print_output: str = "none", served: bool = True) -> TargetRun:
    """Every selected case on the runner. A runner that cannot start at all (a missing library)
    stops the run with that one line (TargetError) instead of failing each case the same way."""
    record = runner_record(runner)
    mlx = record.get("mlx", {})
    info = {"runtime": RUNTIME, "runner": str(runner), "delegates": ["MLXBackend"],
            "mlx": mlx.get("version"), "mlx_library": mlx.get("library"), "patches": record.get("patches"),
            "sources": (record.get("sources") or {}).get("fingerprint"),
            "timing": "host wall time of a case: one --server_mode trigger (read the input files, execute, write the "
                      "outputs), or with a process per case that process (libmlx load, program load, MLX init, execute)"}
    run = TargetRun(url, [], info={k: v for k, v in info.items() if v is not None})
    executions = executor_runner.executions_for(getattr(options, "repeat", 1))
    if executions > 1:
        run.info.update(repeat=executions - 1, warmup=1, num_executions=executions)
    work = Path(options.work_dir) / "mlx-runner"
    # a runner built with the server-testset patch (build_mlx_runner.sh) takes the whole bundle and a case index
    # per trigger: any input shape (an LLM's prompt and decode steps) on one loaded method, state kept. Only a
    # bundle with stateful sequences is served that way; every other one as before, its inputs as --inputs files
    bundled = record.get("server_testset") is True and bool(server.stateful_methods(bundle))

    def alone(method: str, index: int) -> CaseResult:
        result = run_case(bundle, method, index, runner, work, options.case_timeout_s, executions,
                          etdump=etdump, print_output=print_output)
        if result.error_kind is FailureKind.TOOL_MISSING and not run.cases:
            raise TargetError(result.error or "the MLX runner cannot start")
        return result

    with responsive_waits():  # the judge-ahead thread must not delay each step (targets/gil_handoff.py)
        server.run_cases(bundle, options, run, server.own_process_reason(served, executions, etdump, print_output),
                         lambda method, indices: server.serve(bundle, method, indices, [str(runner)], work, options.case_timeout_s,
                                                              lambda out, code: classify(out, code, runner),
                                                              "the MLX runner", lambda r: run.record(r, options),
                                                              bundled=bundled, meanwhile=options.meanwhile),
                         alone, bundled=bundled)
    if bundled:
        run.info["served_inputs"] = "bundled test case per trigger (one loaded method: mutable buffers kept)"
    return run


def run_case(bundle: Bundle, method: str, index: int, runner: Path, work: Path, timeout_s: float,
             executions: int = 1, *, etdump: bool = False, print_output: str = "none") -> CaseResult:
    from bundlerun.bundles.bpte import serialize_bundle  # start-up: loads flatbuffers, numpy on use

    folder = work / f"{safe_name(method)}-{index}"
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    (folder / "out").mkdir(parents=True)
    # scratch input of one process: a plain write (write_bundle's fsync'd atomic write cost 12 ms a case)
    (folder / "model.bpte").write_bytes(serialize_bundle(bundle.single_case(method, index)))
    args = executor_runner.runner_args("model.bpte", method, "out/output", print_output=print_output,
                                       etdump="out/model.etdump" if etdump else None, num_executions=executions)
    log_path = folder / "runner.log"
    rc, elapsed, output = run_process(runner, args, folder, log_path, timeout_s)
    base = dict(method=method, case_index=index, log_path=str(log_path), elapsed_s=elapsed,
                device_verdict=executor_runner.device_verdict(output), perf=executor_runner.perf_figures(output))
    return executor_runner.case_result(bundle, method, index, folder, rc, output, timeout_s,
                                       lambda out, code: classify(out, code, runner), base, "the MLX runner",
                                       "out/model.etdump" if etdump else None)
