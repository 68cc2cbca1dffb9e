"""Run test cases in a child Python process so a crash or hang of a runtime
cannot take bundlerun down.

The child (e.g. `python -m targets.workers.host`) loads the program once and
speaks the JSON-lines protocol of targets/workers/protocol.py on stdout (ready, start,
done | error per case, fatal, finished), which also drives ssh:// workers.

The parent enforces a setup timeout (until "ready") and a per-case timeout
(from "start"). A case during which the child dies or hangs becomes ERROR or
TIMEOUT; the process group is killed and a new child continues with the
remaining cases. Everything is reaped.

Warm workers. Started with `--serve`, the same child imports its runtime once and
then reads one JSON command per line on stdin:

    {"cmd": "load", "bundle": "/abs/x.bpte", "out_dir": "/abs/dir", "log": "/abs/w-1.log",
     "cases": [["forward", 0], ...]}

and answers each with the event stream above (ready ... finished, or fatal), then
waits for the next bundle; EOF on stdin (the parent closed it or died) ends it.
A `WorkerPool` keeps one such worker per runtime (argv + environment) for the
lifetime of a command (runner.session.Session opens and closes it); while a pool
is active, `run_in_worker(..., warm=True)` reuses its worker across bundles.
Isolation stays per bundle: each load starts from a fresh program, and a crash or
hang still costs only the case it happened in (the worker is killed and replaced,
the remaining cases run on the new one). `BUNDLERUN_WARM_WORKER=0` forces one
child per bundle (the design before warm workers, kept for the benchmark).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bundlerun.targets.base import CaseResult, CaseStatus, RunOptions
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.workers.protocol import Buffer, Ending, EventDriver, Limits
from bundlerun.targets.process import kill_process_group
from bundlerun.bundles.sequence import from_manifest
from bundlerun.targets.base import TargetRun, selected_cases

MAX_RESTARTS = 3

CommandFn = Callable[[Path], list[str]]  # cases-file -> argv


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


# --------------------------------------------------------------------------- warm workers (parent side)


@dataclass(frozen=True)
class WarmSpec:
    """How to reach a warm worker for one bundle: `argv` starts a worker in serve mode (it reads
    load commands on stdin); `request` holds the per-bundle fields of the load command
    (bundle, out_dir, ...). Workers with the same argv (and environment) are shared."""

    argv: tuple[str, ...]
    request: dict = field(default_factory=dict)


class WarmWorker:
    """One live serve-mode child: its process, its stdout buffer, how many bundles it served."""

    def __init__(self, argv: tuple[str, ...], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.buffer = Buffer()  # events read ahead of the one being handled
        self.bundles = 0  # bundles loaded by this process

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, log_path: Path) -> None:
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(list(self.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True, env=self.env)
        self.buffer = Buffer()
        self.bundles = 0

    def send(self, message: dict) -> bool:
        """False when the worker is gone (broken pipe)."""
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        kill_process_group(proc, 10.0, term_first=False)
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass


_LIVE_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()
_ACTIVE_POOL: contextvars.ContextVar["WorkerPool | None"] = contextvars.ContextVar("bundlerun_worker_pool",
                                                                                     default=None)


class WorkerPool:
    """Warm runtime workers shared by the bundles of one command; `close()` kills and reaps them
    all (also run at interpreter exit for a pool nobody closed)."""

    def __init__(self) -> None:
        self._workers: list[WarmWorker] = []
        self._busy: set[int] = set()  # id() of workers serving a bundle right now
        self._lock = threading.Lock()
        self.started = 0  # processes started, for tests and the benchmark
        _LIVE_POOLS.add(self)

    def acquire(self, argv: tuple[str, ...]) -> WarmWorker:
        """An idle worker for `argv` in this environment (a live one first), else a new, not yet
        started one. Workers of the same argv but another environment are retired. Each worker
        serves one bundle at a time: `release()` it after."""
        env = _child_env()
        with self._lock:
            for w in [w for w in self._workers if w.argv == argv and w.env != env and id(w) not in self._busy]:
                w.kill()
                self._workers.remove(w)
            idle = [w for w in self._workers if w.argv == argv and w.env == env and id(w) not in self._busy]
            worker = next((w for w in idle if w.alive()), idle[0] if idle else None)
            if worker is None:
                worker = WarmWorker(argv, env)
                self._workers.append(worker)
            self._busy.add(id(worker))
            return worker

    def release(self, worker: WarmWorker) -> None:
        with self._lock:
            self._busy.discard(id(worker))

    def pids(self) -> list[int]:
        return [w.proc.pid for w in list(self._workers) if w.alive()]

    def close(self) -> None:
        with self._lock:
            workers, self._workers = list(self._workers), []
            self._busy.clear()
        for w in workers:
            w.kill()

    @contextlib.contextmanager
    def activate(self):
        """Make this the pool `run_in_worker` uses in this context."""
        token = _ACTIVE_POOL.set(self)
        try:
            yield self
        finally:
            _ACTIVE_POOL.reset(token)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def active_pool() -> WorkerPool | None:
    """The pool of the running command, unless BUNDLERUN_WARM_WORKER=0 asks for one child per bundle."""
    if os.environ.get("BUNDLERUN_WARM_WORKER", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    return _ACTIVE_POOL.get()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


# Variables that change while one command runs but mean nothing to a runtime: pytest sets
# PYTEST_CURRENT_TEST to each test's id, and a warm worker is kept only while its environment is
# unchanged (WorkerPool.acquire), so a pytest session would otherwise start one worker per test.
_VOLATILE = ("PYTEST_CURRENT_TEST",)


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _VOLATILE}
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


# --------------------------------------------------------------------------- supervisor


class WorkerSupervisor:
    """Drive `command` over `pairs`, restarting after crashes/hangs. With `warm` and `pool`, the
    cases run on the pool's warm worker (started on first use) instead of a child of their own."""

    def __init__(self, command: CommandFn, options: RunOptions, log_name: str = "worker", *,
                 warm: WarmSpec | None = None, pool: WorkerPool | None = None) -> None:
        self.command = command
        self.options = options
        self.log_name = log_name
        self.info: dict = {}
        self.setup_s: float | None = None
        self.warm = warm if pool is not None else None
        self.pool = pool
        self.reused = False  # the first process of this run was already warm
        self._warm_attempts = 0
        self.chains: list[list[tuple[str, int]]] = []  # stateful sequences' cases (bundles/sequence.py)

    def run(self, pairs: list[tuple[str, int]]) -> list[CaseResult]:
        results: dict[tuple[str, int], CaseResult] = {}
        remaining = list(pairs)
        attempt = 0
        while remaining:
            attempt += 1
            log_path = self.options.work_dir / f"{self.log_name}-{attempt}.log"
            outcome = self._one_process(remaining, log_path, results)
            self._lost_state(remaining, results)
            remaining = [p for p in pairs if p not in results]
            if outcome == "fatal" or not remaining:
                break
            if attempt > MAX_RESTARTS:
                for method, case in remaining:
                    results[(method, case)] = CaseResult(
                        method, case, CaseStatus.ERROR,
                        error=f"not run: the runtime process failed {attempt} times",
                        error_kind=FailureKind.NOT_RUN,
                    )
                break
        for method, case in pairs:
            results.setdefault(
                (method, case),
                CaseResult(method, case, CaseStatus.ERROR, error="not run: runtime failed to start", error_kind=FailureKind.LOAD_FAILURE),
            )
        return [results[p] for p in pairs]

    def _lost_state(self, pairs: list[tuple[str, int]], results: dict) -> None:
        """After a child died mid-sequence, the rest of that sequence cannot run on a new child: its KV
        cache died with the old one. Those steps are NOT_RUN, never judged on a fresh cache; the next
        sequences (each starts with its prompt) run on the new child."""
        for chain in self.chains:
            started = [p for p in chain if p in results]
            if not started:
                continue
            first = next((p for p in chain if p in results and results[p].status != CaseStatus.OK), None)
            for p in chain:
                if p in pairs and p not in results:
                    why = (f"case {first[1]}" if first else "an earlier step")
                    results[p] = CaseResult(p[0], p[1], CaseStatus.ERROR, error_kind=FailureKind.NOT_RUN,
                                            error=f"not run: the runtime failed at {why} of this stateful sequence, "
                                                  "and its KV cache went with the process")

    def _one_process(self, pairs: list[tuple[str, int]], log_path: Path, results: dict) -> str:
        if self.warm is not None:
            return self._one_warm(pairs, log_path, results)
        opts = self.options
        opts.work_dir.mkdir(parents=True, exist_ok=True)
        cases_file = log_path.with_suffix(".cases.json")
        cases_file.write_text(json.dumps([[m, c] for m, c in pairs]))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                self.command(cases_file),
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=_child_env(),
            )
        try:
            if self.options.meanwhile is not None:  # the command's own set-up while the child imports torch
                self.options.meanwhile()
            return self._drive(proc, pairs, log_path, results, Buffer())[0]
        finally:
            kill_process_group(proc, 10.0, term_first=False)
            if proc.stdout:
                proc.stdout.close()

    def _one_warm(self, pairs: list[tuple[str, int]], log_path: Path, results: dict) -> str:
        """One attempt on the pool's warm worker: reuse it when alive and idle, else start one."""
        opts = self.options
        opts.work_dir.mkdir(parents=True, exist_ok=True)
        message = {"cmd": "load", **self.warm.request, "log": str(log_path.resolve()), "cases": [[m, c] for m, c in pairs]}
        worker = self.pool.acquire(self.warm.argv)
        idle = False
        try:
            reused = worker.alive()
            if not reused:
                worker.start(log_path)
                self.pool.started += 1
            log_path.touch(exist_ok=True)
            if not worker.send(message):  # died while idle: a fresh one takes this bundle
                worker.kill()
                worker.start(log_path)
                self.pool.started += 1
                reused = False
                if not worker.send(message):
                    return "crash"
            if opts.meanwhile is not None:  # the command's own set-up while the worker starts or loads
                opts.meanwhile()
            if self._warm_attempts == 0:
                self.reused = reused
            self._warm_attempts += 1
            worker.bundles += 1
            outcome, driver = self._drive(worker.proc, pairs, log_path, results, worker.buffer)
            idle = driver.idle and worker.alive()  # a worker that could not load this bundle waits for the next
            return outcome
        finally:
            if not idle:  # crashed, hung, interrupted or confused: never reused
                worker.kill()
            self.pool.release(worker)

    def _drive(self, proc: subprocess.Popen, pairs, log_path: Path, results: dict,
               buffer: Buffer) -> tuple[str, EventDriver]:
        """One child's event stream (targets/workers/protocol.py) -> results; "fatal" ends the
        attempts, anything else lets the remaining cases run on a new child."""
        opts = self.options

        def gone(ready: bool) -> tuple[FailureKind, str, dict]:
            proc.wait()
            if ready:
                return FailureKind.CRASH, f"runtime crashed ({_signal_name(proc.returncode)}) while running this case", {}
            return (FailureKind.LOAD_FAILURE,
                    f"runtime exited before loading the program ({_signal_name(proc.returncode)})", {})

        driver = EventDriver(
            list(pairs), results, log_path,
            Limits(setup_s=opts.setup_timeout_s, case_s=opts.case_timeout_s, after_ready_s=opts.setup_timeout_s),
            Ending(not_ready=lambda s: f"runtime did not load the program within {s:g} s",
                   case_silent=lambda s: f"case did not finish within {s:g} s (process killed)", gone=gone),
            progress=opts.progress)
        outcome = driver.run(proc.stdout.fileno(), buffer)
        self.info.update(driver.info)
        if driver.ready_after_s is not None:
            self.setup_s = (self.setup_s or 0.0) + driver.load_s
        return outcome, driver


def python_module_command(module: str, *args: str) -> CommandFn:
    """argv builder for `python -m module args... --cases FILE`."""

    def build(cases_file: Path) -> list[str]:
        return [sys.executable, "-m", module, *args, "--cases", str(cases_file)]

    return build


def run_in_worker(url: str, module: str, args: list[str], bundle, options: RunOptions, name: str,
                  info: dict | None = None, warnings: list[str] | None = None, *, warm: bool = False):
    """Run the bundle's selected cases in a supervised child (`python -m module args --cases F`):
    the one way host://, tosa:// and mlx:// drive their runtimes. Returns the TargetRun.

    `warm=True` says `module` also serves (`--serve`, see the module docstring) and `args` are
    `[bundle, out_dir, *worker flags]`: while a WorkerPool is active (a command's Session), the
    cases then run on the pool's warm worker for `module + worker flags`, shared across bundles."""

    pool = active_pool() if warm else None
    spec = None
    if pool is not None:
        spec = WarmSpec(argv=(sys.executable, "-m", module, "--serve", *args[2:]),
                        request={"bundle": str(args[0]), "out_dir": str(args[1])})
    supervisor = WorkerSupervisor(python_module_command(module, *args), options, name, warm=spec, pool=pool)

    supervisor.chains = [[(s.method, c) for c in s.cases] for s in from_manifest(bundle.manifest) if s.stateful]
    start = time.perf_counter()
    cases = supervisor.run(selected_cases(bundle, options))
    logs = {p.stem: str(p) for p in sorted(Path(options.work_dir).glob(f"{name}-*.log"))}
    extra = {"worker": "warm, reused" if supervisor.reused else "warm, started"} if spec is not None else {}
    run = TargetRun(url, cases, info={**(info or {}), **supervisor.info, **extra}, logs=logs,
                    setup_s=supervisor.setup_s, warnings=list(warnings or []))
    run.info["wall_s"] = time.perf_counter() - start
    return run


# --------------------------------------------------------------------------- warm workers (child side)


def serve(handle: Callable[[dict], None]) -> int:
    """Child side of a warm worker: one JSON command per line on stdin; `handle(load command)`
    emits that bundle's events (ready ... finished, or fatal). Returns at EOF or {"cmd": "exit"}.
    The worker also ends when its parent is gone (it is in a session of its own)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        try:
            cmd = json.loads(line)
        except ValueError:
            continue
        if not isinstance(cmd, dict):
            continue
        if cmd.get("cmd") == "exit":
            return 0
        if cmd.get("cmd") == "load":
            _redirect_stderr(cmd.get("log"))
            try:
                handle(cmd)
            except Exception as exc:  # noqa: BLE001 - one bundle's failure ends that bundle, not the worker
                import errno
                import traceback

                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                    kind, error = "host-io", f"the host could not write {exc.filename or 'a file'}: {exc.strerror}"
                else:  # a bug or the runtime's own failure: its traceback goes to the bundle's log
                    traceback.print_exc()
                    kind, error = "runner-error", f"runtime worker failed: {type(exc).__name__}: {exc}"
                sys.stdout.write(json.dumps({"event": "fatal", "kind": kind, "error": error}) + "\n")
                sys.stdout.flush()


def _redirect_stderr(path: str | None) -> None:
    """This bundle's log gets the worker's stderr (the runtime's own messages included)."""
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError:
        return
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
