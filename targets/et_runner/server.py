"""ExecuTorch's portable `executor_runner` in `--server_mode`: one process, one inference per stdin line.

The contract, read from examples/portable/executor_runner/executor_runner.cpp at the pinned commit:

* `--server_mode` requires `--output_file PREFIX`. After Program::load and load_method (and the
  `Model loaded in X ms.` line) it logs `Running in server mode; waiting for stdin triggers.`;
  then for every line read on stdin it re-reads the `--inputs` files, executes the method once,
  writes `PREFIX-<i>.bin` for each tensor output (overwriting the last trigger's) and logs
  `SERVER MODE DONE`. EOF on stdin ends the loop with exit status 0.
* The `--inputs` files are raw bytes, one per method input, each exactly the nbytes of the input's
  declared tensor meta (extension/runner_util/inputs.cpp prepare_input_tensors copies them into
  tensors of that meta; int/double/bool inputs are 8/8/1 bytes). A BundleIO program would run test
  set 0 on every trigger (`testset_idx` is a constant 0 there), so a served bundle runs its plain
  program and each case's inputs come from those files.
* Every failure inside the loop is an ET_CHECK, i.e. an abort: the process ends without `SERVER MODE
  DONE`, and the case it was running is told apart by running that case alone (the lane's one-case
  path, whose classification reads the whole log of one process).

Bundled serving (a runner built with bundlerun's patch, firmware_scripts/android/patches/
executor_runner-server-testset.patch; its runner.json says `"server_testset": true`): the runner
is given the whole `.bpte` and each trigger line names the test case to run
(`load_bundled_input(method, bundle, index)`, which sets each input from the case, resizing it
within the method's dynamic bounds). Any input shape is served that way (an LLM's prompt and its
decode steps), and the method stays loaded from case to case, so its mutable buffers (an LLM's KV
cache) carry state through a sequence exactly as on one loaded pybindings module.

A method that holds a stateful sequence (the manifest's `sequences`, LLM contract) runs only that
way: in suite order, every case, on one loaded method. A lane that would run its cases one process
each (server=false, --repeat, an ETDump, inputs the files cannot carry), or a --select that drops
part of the sequence, is refused with one line (bad-config) before anything runs; a server that dies
mid-sequence leaves the rest of it not run, never run on a fresh cache.

What this buys: the program load, the delegate's init and the runtime's start-up are paid once per
bundle instead of once per case (on `mlx://cpu` about 12 ms a case; see bench/bench_mlx.py).
"""

from __future__ import annotations

import os
import selectors
import shutil
import struct
import subprocess
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable

from bundlerun.bundles import sequence
from bundlerun.targets.process import kill_process_group, start_program, wait_exit
from bundlerun.bundles.errors import BundleError, TargetError
from bundlerun.bundles.program_meta import method_inputs
from bundlerun.targets.base import safe_name, selected_cases
from bundlerun.targets.et_runner.executor_runner import case_result
from bundlerun.targets.failures import FailureKind

if TYPE_CHECKING:
    from bundlerun.bundles.bpte import Bundle, BundledValue
    from bundlerun.targets.base import CaseResult, RunOptions, TargetRun
    from bundlerun.targets.et_runner.protocol import Failure

READY = "Running in server mode; waiting for stdin triggers."  # executor_runner.cpp, before the loop
DONE = "SERVER MODE DONE"  # executor_runner.cpp, after each trigger's outputs are written
# out/output-K.bin files read back per trigger at most: a method's outputs (bundlerun's own bound, far past any
# program's output count; a runner writing more is judged on these, and the count check says so)
_MAX_SERVED_OUTPUTS = 4096


@dataclass
class Served:
    """What one wait on the server gave: `done` (the marker came), `exited` (the process ended
    first: `exit_status` says how) or `timeout` (its process group was killed)."""

    status: str
    log: str  # what the runner wrote since the previous marker
    elapsed_s: float
    exit_status: int | None = None


class RunnerServer:
    """One executor_runner process in --server_mode, in its own process group, always reaped
    (use it as a context manager). Its whole log is also kept in `log_path`."""

    def __init__(self, argv: list[str], cwd: Path, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv, self.cwd, self.log_path = argv, cwd, log_path
        self.env = dict(os.environ) if env is None else env
        self.proc: subprocess.Popen | None = None
        self._pending = b""
        self._log: IO[bytes] | None = None
        self._selector = selectors.DefaultSelector()
        self._spawned = 0.0

    def __enter__(self) -> "RunnerServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def spawn(self) -> None:
        """Start the runner (`start` waits for it to load the program; it calls this unless it was done)."""
        self._log = open(self.log_path, "wb")
        self._spawned = time.monotonic()
        self.proc = start_program([*self.argv, "--server_mode"], "the runner binary", cwd=self.cwd,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True, env=self.env)
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)

    def start(self, timeout_s: float, meanwhile: Callable[[], None] | None = None) -> Served:
        """Start the runner (unless `spawn` did) and wait, `timeout_s` from its spawn, for it to load the
        program and enter its loop; `meanwhile` (RunOptions) is called between the two."""
        if self.proc is None:
            self.spawn()
        if meanwhile is not None:
            meanwhile()
        return self._until(READY, self._spawned, timeout_s)

    def trigger(self, timeout_s: float, case: int | None = None) -> Served:
        """One inference: on the inputs now in the --inputs files, or (bundled serving) on bundled
        test case `case`."""
        return self.wait(self.send(case), timeout_s)

    def send(self, case: int | None = None) -> float:
        """`trigger`'s first half: the trigger line written; returns when (time.monotonic) for `wait`."""
        t0 = time.monotonic()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"\n" if case is None else f"{int(case)}\n".encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it has ended: _until reads what it said and its exit status
        return t0

    def wait(self, t0: float, timeout_s: float) -> Served:
        """`trigger`'s second half: the inference sent at `t0` waited for, bounded by `timeout_s` from then."""
        return self._until(DONE, t0, timeout_s)

    def _until(self, marker: str, t0: float, timeout_s: float) -> Served:
        assert self.proc is not None and self.proc.stdout is not None
        want = marker.encode()
        seen = bytearray()
        deadline = t0 + timeout_s
        while True:
            cut = self._pending.find(want)
            if cut >= 0:
                end = self._pending.find(b"\n", cut)
                end = len(self._pending) if end < 0 else end + 1
                seen += self._pending[:end]
                self._pending = self._pending[end:]
                return Served("done", seen.decode(errors="replace"), time.monotonic() - t0)
            left = deadline - time.monotonic()
            if left <= 0:
                kill_process_group(self.proc, term_first=False)
                seen += self._pending
                self._pending = b""
                return Served("timeout", seen.decode(errors="replace"), time.monotonic() - t0)
            if not self._selector.select(min(left, 1.0)):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:  # EOF: the runner ended without the marker
                seen += self._pending
                self._pending = b""
                status = self._reap()
                return Served("exited", seen.decode(errors="replace"), time.monotonic() - t0, status)
            if self._log is not None:
                self._log.write(chunk)
            self._pending += chunk

    def _reap(self) -> int | None:
        assert self.proc is not None
        status = wait_exit(self.proc, 10)
        if status is None:  # closed its output but still running
            kill_process_group(self.proc, term_first=False)
        return status

    def kill(self) -> None:
        """Its group killed at once, reaped and closed (a server nothing will use)."""
        if self.proc is not None:
            kill_process_group(self.proc, term_first=False)
        self.close()

    def close(self) -> None:
        """EOF on stdin (the runner's loop ends with 0), a short bounded wait, then its group is killed
        and reaped whatever state it is in."""
        if self.proc is not None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            except OSError:
                pass
            wait_exit(self.proc, 5)
            kill_process_group(self.proc, term_first=False)
            if self.proc.stdout is not None:
                try:
                    self._selector.unregister(self.proc.stdout)
                except (KeyError, ValueError):
                    pass
                self.proc.stdout.close()
        self._selector.close()
        if self._log is not None:
            self._log.close()
            self._log = None


# prepare_input_tensors' raw sizes for the scalar inputs (inputs.cpp: sizeof(int64_t), double, bool)
_SCALAR_FORMATS = {"int": "<q", "double": "<d", "bool": "<?"}


def unservable(bundle: Bundle, method: str) -> str | None:
    """Why the cases of `method` cannot be fed as --inputs files (None: they can). BundleIO's
    load_bundled_input sets each input from the case (its dtype checked, its shape resized);
    the files are copied raw into tensors of the declared meta. So each case's input must be what
    the program declares, byte for byte the same layout: the dtype, the sizes, the dim order."""

    try:
        declared = method_inputs(bundle.program, "bundle")
    except BundleError as exc:
        return f"the program's inputs cannot be read ({exc})"
    if declared is None or method not in declared:
        return "the program declares no inputs for this method"
    wants = declared[method]
    for index, case in enumerate(bundle.suite(method).test_cases):
        if len(case.inputs) != len(wants):
            return f"case {index} has {len(case.inputs)} inputs, the method takes {len(wants)}"
        for j, (value, want) in enumerate(zip(case.inputs, wants)):
            if want.kind == "tensor":
                identity = list(range(len(want.sizes or [])))
                same = (value.kind == "tensor" and value.scalar_type == want.scalar_type
                        and list(value.sizes) == list(want.sizes or [])
                        and list(value.dim_order or identity) == list(want.dim_order or identity))
                if not same:
                    return f"case {index} input {j} is not the {want.sizes} tensor the program declares, in its layout"
            elif want.kind not in _SCALAR_FORMATS or value.kind != want.kind:
                return f"input {j} is a {want.kind}, which --inputs files do not carry"
    return None


def out_of_bounds(bundle: Bundle, method: str) -> str | None:
    """Why a case of `method` cannot be given to the runtime (None: every one can): a tensor input
    larger than the program declares (past a static size, or past a dynamic input's upper bound).
    Checked before bundled serving, where BundleIO would try to resize the input past what the method
    planned. A dtype or rank the program does not take is left to the runtime, which names it."""

    try:
        declared = method_inputs(bundle.program, "bundle")
    except BundleError:
        return None  # unreadable metadata: the runner's own load says why
    wants = (declared or {}).get(method)
    if wants is None:
        return None
    for index, case in enumerate(bundle.suite(method).test_cases):
        for j, (value, want) in enumerate(zip(case.inputs, wants)):
            bound = list(want.sizes or [])
            sizes = list(value.sizes)
            if want.kind != "tensor" or value.kind != "tensor" or len(sizes) != len(bound):
                continue
            if any(a > b for a, b in zip(sizes, bound)):
                kind = "the static size" if want.static else "the dynamic upper bound"
                return f"case {index} input {j} has sizes {sizes}, past {kind} {bound} the program's {method} declares"
    return None


def input_bytes(value: BundledValue) -> bytes:
    """The --inputs file of one input: a tensor's bytes, or a scalar as prepare_input_tensors reads it."""
    if value.kind == "tensor":
        return value.data
    return struct.pack(_SCALAR_FORMATS[value.kind], value.scalar)


def served_folder(work: Path, method: str) -> Path:
    """Where a method's server runs: its model, its outputs, its logs."""
    return work / f"{safe_name(method)}-served"


def served_args(command: list[str], model: str, method: str, extra_args: list[str] | None, names: list[str]) -> list[str]:
    """A server's argv (`command`: the runner, or an emulator and the runner; `names`: its --inputs files)."""
    return [*command, "--model_path", model, "--method_name", method, "--output_file", "out/output",
            "--print_output", "none", *(extra_args or [])] + (["--inputs", ",".join(names)] if names else [])


@dataclass
class Prestarted:
    """A bundled server spawned on a bundle's bytes before the host had read and verified them
    (`bundlerun run`'s early start, runner/session.py; a target that declares `prestart`): the runner
    loads the program while the host reads the bundle. `serve` adopts it only when the bundle it serves
    is `vouched` (read and verified from those very bytes, and unchanged in memory since) and it would
    have started this same process; anything else kills and reaps it and removes its folder
    (`discard`), and the server `serve` would start anyway runs instead."""

    args: list[str]
    folder: Path
    server: RunnerServer
    vouched: object | None = None  # the bundle read and verified from the bytes the runner was given
    adopted: bool = False

    def vouch(self, bundle: object) -> None:
        """`bundle` was read and verified from the bytes this server was given."""
        self.vouched = bundle

    def discard(self) -> None:
        if not self.adopted:
            self.adopted = True  # once
            self.server.kill()
            shutil.rmtree(self.folder, ignore_errors=True)


def prestart(data: bytes, method: str, command: list[str], work: Path, extra_args: list[str] | None = None) -> Prestarted:
    """A bundled server of `method` (the runner's `command`) spawned on the bundle's bytes `data`, as
    `serve(..., bundled=True)` would start it (see Prestarted). OSError: its folder could not be written."""
    folder = served_folder(work, method)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "out").mkdir(parents=True, exist_ok=True)
    (folder / "model.bpte").write_bytes(data)
    args = served_args(command, "model.bpte", method, extra_args, [])
    server = RunnerServer(args, folder, folder / "server-1.log")
    try:
        server.spawn()
    except BaseException:
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Prestarted(args, folder, server)


def serve(bundle: Bundle, method: str, indices: list[int], command: list[str], work: Path, timeout_s: float,
          classify_fn: Callable[[str, int], Failure | None], who: str, record: Callable[[CaseResult], None], *,
          env: dict[str, str] | None = None, extra_args: list[str] | None = None, bundled: bool = False,
          meanwhile: Callable[[], None] | None = None, prestarted: Prestarted | None = None) -> list[int]:
    """Run cases `indices` of `method` (unservable() said None) on one executor_runner --server_mode
    process (`command`: the runner, or an emulator and the runner; `extra_args`: the lane's own flags),
    `record`ing each result as it finishes. A case that runs past `timeout_s` is a timeout
    (its process group killed) and a new server takes the rest. Returns the cases left for the
    lane's one-case path: all of them when the server does not reach its loop (the program does not
    load: that path says why), else from the case it died on. `bundled`: the runner takes the whole
    bundle and a case index per trigger (module docstring), not --inputs files. `meanwhile`: RunOptions.meanwhile,
    called while each server loads the program. `prestarted`: the server spawned before the bundle was
    verified (Prestarted), adopted as the first server or discarded."""

    folder = served_folder(work, method)
    cases = bundle.suite(method).test_cases
    names = [] if bundled or not indices else [f"input-{j}.bin" for j in range(len(cases[indices[0]].inputs))]
    args = served_args(command, "model.bpte" if bundled else "model.pte", method, extra_args, names)
    first: RunnerServer | None = None
    if prestarted is not None:
        if _adoptable(prestarted, bundle, args, folder, env, bundled):
            prestarted.adopted, first = True, prestarted.server
        else:
            prestarted.discard()
    if first is None:
        # a fresh folder: a re-run into the same report folder left the last run's files here, and rewriting a
        # file in place (truncate, then write) made ext4 flush it on close (auto_da_alloc): 2.4 ms per case log,
        # 0.43-0.47 s of a 192-step run, on the path between a step's end and the next trigger (bundlerun's own
        # measurement, load 4); nor can a stale case log be taken for this run's
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "out").mkdir(parents=True, exist_ok=True)
        if bundled:
            from bundlerun.bundles.on_file import whole_bundle_bytes  # start-up: not loaded by `bundlerun --help`

            (folder / "model.bpte").write_bytes(whole_bundle_bytes(bundle))
        else:
            (folder / "model.pte").write_bytes(bundle.program)
    stateful = method in stateful_methods(bundle)

    left: list[Path] | None = None  # the output files the last trigger left (None: not known, look)

    def feed(index: int) -> None:
        nonlocal left
        for name, value in zip(names, cases[index].inputs):
            (folder / name).write_bytes(input_bytes(value))
        for old in (folder / "out").glob("output-*.bin") if left is None else left:
            old.unlink(missing_ok=True)  # a case that writes fewer must not read the last one's
        left = None

    def outputs_now() -> list[tuple[str, bytes | str]]:
        """The output files this trigger wrote, read before the next one overwrites them."""
        nonlocal left
        left = []
        read: list[tuple[str, bytes | str]] = []
        for k in range(_MAX_SERVED_OUTPUTS):
            path = folder / "out" / f"output-{k}.bin"
            try:
                read.append((path.name, path.read_bytes()))
            except FileNotFoundError:
                break
            except OSError as exc:  # said as the case's error (raw_outputs_from_bytes)
                read.append((path.name, f"cannot read output file {path.name}: {exc.strerror}"))
            left.append(path)
        return read

    # A finished case's log file and record (its judging starts there: runner/judging/ahead.py) are made
    # once the next trigger is sent, while the runner computes: off the path from one step's end to the
    # next step's start (its outputs are read before: the next trigger overwrites them). Done in order,
    # before anything else is recorded, and whatever ends the loop (a stop included).
    done_later: list[tuple[Path, str, Callable[[], CaseResult]]] = []

    def settle() -> None:
        while done_later:
            path, text, make = done_later.pop(0)
            path.write_text(text)
            record(make())

    try:
        return _serve_loop(args, folder, env, indices, timeout_s, bundled, stateful, bundle, method, classify_fn,
                           who, record, feed, outputs_now, done_later, settle, meanwhile, first)
    finally:
        settle()


def _adoptable(prestarted: Prestarted, bundle: Bundle, args: list[str], folder: Path, env: dict[str, str] | None,
               bundled: bool) -> bool:
    """Whether `prestarted` is the server serve() would start now, on the bytes this bundle was verified from."""
    from bundlerun.bundles.on_file import FileBundle  # start-up: not loaded by `bundlerun --help`

    return (bundled and env is None and prestarted.vouched is bundle and isinstance(bundle, FileBundle)
            and bundle.unchanged() and prestarted.args == args and prestarted.folder == folder)


def _serve_loop(args: list[str], folder: Path, env: dict[str, str] | None, indices: list[int], timeout_s: float,
                bundled: bool, stateful: bool, bundle: Bundle, method: str,
                classify_fn: Callable[[str, int], Failure | None], who: str, record: Callable[[CaseResult], None],
                feed: Callable[[int], None], outputs_now: Callable[[], list[tuple[str, bytes | str]]],
                done_later: list[tuple[Path, str, Callable[[], CaseResult]]], settle: Callable[[], None],
                meanwhile: Callable[[], None] | None = None, first: RunnerServer | None = None) -> list[int]:
    """serve()'s loop: the servers, their triggers and what each answer makes of its case (`first`: the
    first server, spawned already; `outputs_now`: a trigger's output files, read)."""
    pending = list(indices)
    servers = 0
    while pending:
        servers += 1
        spawned = first if servers == 1 and first is not None else None
        with spawned or RunnerServer(args, folder, folder / f"server-{servers}.log", env) as server:
            feed(pending[0])
            if server.start(timeout_s, meanwhile).status != "done":
                return pending
            while pending:
                index = pending[0]
                feed(index)
                t0 = server.send(index if bundled else None)
                settle()  # the previous case's log and record while the runner computes this one
                served = server.wait(t0, timeout_s)
                log_path = folder / f"case-{index}.log"
                if served.status == "exited":
                    log_path.write_text(served.log)
                    if stateful and index != indices[0]:  # mid-sequence: classified from the served log
                        base = dict(method=method, case_index=index, log_path=str(log_path), elapsed_s=served.elapsed_s)
                        status = served.exit_status if served.exit_status is not None else 1
                        record(case_result(bundle, method, index, folder, status, served.log, timeout_s, classify_fn,
                                           base, who))
                        for result in not_run(method, pending[1:], who):
                            record(result)
                        return []
                    return pending
                rc = 0 if served.status == "done" else None
                done_later.append((log_path, served.log, partial(
                    _served_result, bundle, method, index, folder, log_path, rc, served, timeout_s, classify_fn, who,
                    servers, outputs_now() if rc == 0 else None)))
                pending.pop(0)
                if rc is None:
                    settle()
                    if stateful:
                        for result in not_run(method, pending, who):
                            record(result)
                        return []
                    break  # the killed server's successor takes the rest
    return []


def _served_result(bundle: Bundle, method: str, index: int, folder: Path, log_path: Path, rc: int | None,
                   served: Served, timeout_s: float, classify_fn: Callable[[str, int], Failure | None], who: str,
                   server: int, read: list[tuple[str, bytes | str]] | None) -> CaseResult:
    """The CaseResult of one served trigger (`read`: the output files it wrote, as they were read)."""
    base = dict(method=method, case_index=index, log_path=str(log_path), elapsed_s=served.elapsed_s)
    result = case_result(bundle, method, index, folder, rc, served.log, timeout_s, classify_fn, base, who, read=read)
    result.extra["served"] = f"executor_runner --server_mode, process {server}"
    return result


def not_run(method: str, indices: list[int], who: str) -> list[CaseResult]:
    """The cases of a stateful sequence left after its server stopped: not run, since running one on a
    fresh method would judge it on an empty KV cache."""
    from bundlerun.targets.base import CaseResult, CaseStatus  # late: its name is bound otherwise in this module

    return [CaseResult(method=method, case_index=index, status=CaseStatus.ERROR, error_kind=FailureKind.NOT_RUN,
                       error=f"not run: {who} stopped before this step of a stateful sequence, and a step is never "
                             "run on a fresh method (its KV cache would be empty)")
            for index in indices]


def stateful_methods(bundle: Bundle) -> set[str]:
    """The methods that hold a stateful sequence: the manifest's `sequences` with `stateful` true
    (the LLM contract: their cases run in suite order on one loaded method)."""
    return sequence.stateful_methods(sequence.from_manifest(bundle.manifest))


def stateful_refusal(bundle: Bundle, method: str, indices: list[int], why_alone: str | None) -> str | None:
    """Why this lane cannot run the stateful sequence of `method` (None: it can, or there is none):
    it would run the cases one process each (`why_alone`), or the selection holds a step of a sequence
    without the steps before it, or out of order (bundles/sequence.py `stateful_prefix_problem`, the
    rule runner/stateful.py applies to every lane: whole sequences or a prefix of one, as
    `bundlerun bisect` selects a step and its prefix)."""
    sequences = sequence.from_manifest(bundle.manifest)
    if method not in sequence.stateful_methods(sequences):
        return None
    if why_alone is not None:
        return (f"method {method!r} holds a stateful sequence (its KV cache carries from case to case) and this "
                f"lane would run its cases one process each ({why_alone}): refused, a step is never run on a fresh "
                "method")
    problem = sequence.stateful_prefix_problem([s for s in sequences if s.method == method],
                                               [(method, i) for i in indices])
    if problem:
        return f"{problem} (a selection of {len(indices)} case(s) of method {method!r})"
    return None


def own_process_reason(served: bool, executions: int, etdump: bool, print_output: str) -> str | None:
    """What makes every case of a run need a process of its own: the lane's `server=false` setting (a
    process per case is also where the runner checks the case itself: its BundleIO verdict), or what the
    server loop does not do: it executes once per trigger and keeps no per-case ETDump, timing lines or
    printed outputs."""
    if not served:
        return "server=false"
    if executions > 1:
        return "--repeat: the runner's per-execution timing"
    if etdump:
        return "etdump: one ETDump per process"
    if print_output != "none":
        return "print_output"
    return None


def run_cases(bundle: Bundle, options: RunOptions, run: TargetRun, one_case: str | None,
              serve_fn: Callable[[str, list[int]], list[int]], alone_fn: Callable[[str, int], CaseResult], *,
              bundled: bool = False) -> None:
    """Every selected case, recorded into `run` as it finishes: a method's cases on one server
    (`serve_fn(method, indices)` -> the indices it left), unless `one_case` names why every case needs
    a process of its own (an ETDump, printed outputs, --repeat's per-execution timing) or unservable()
    says why this method's cannot be served; what is left runs one process a case (`alone_fn`).
    `bundled`: the server takes the bundle and a case index per trigger (any input shape is servable).
    A stateful sequence the lane cannot run on one loaded method is refused (TargetError, bad-config)
    before any case runs. `run.info["runner_mode"]` says which, per method."""

    by_method: dict[str, list[int]] = {}
    for method, index in selected_cases(bundle, options):
        by_method.setdefault(method, []).append(index)
    whys = {method: one_case or (None if bundled else unservable(bundle, method)) for method in by_method}
    for method, indices in by_method.items():
        refusal = stateful_refusal(bundle, method, indices, whys[method])
        if refusal:
            raise TargetError(refusal, kind="bad-config")
        bad = out_of_bounds(bundle, method) if bundled and whys[method] is None else None
        if bad:
            raise TargetError(f"{bad}: refused before it reaches the runtime", kind="bad-bundle")
    modes: dict[str, str] = {}
    run.info["runner_mode"] = modes
    for method, indices in by_method.items():
        why = whys[method]
        left = serve_fn(method, indices) if why is None else indices
        if why is not None:
            modes[method] = f"one executor_runner process per case ({why})"
        else:
            modes[method] = f"executor_runner --server_mode: one process for {len(indices)} case(s)"
            if left:
                modes[method] += f"; {len(left)} case(s) from case {left[0]} on, one process each (the server stopped)"
        if left and method in stateful_methods(bundle):
            # only the sequence's first step may run alone (a fresh method is its right start) to say why
            first = [left[0]] if left[0] == indices[0] else []
            for index in first:
                run.record(alone_fn(method, index), options)
            for result in not_run(method, left[len(first):], "the server"):
                run.record(result, options)
            continue
        for index in left:
            run.record(alone_fn(method, index), options)
