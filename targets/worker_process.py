"""Run test cases in a child Python process so a crash or hang of a runtime
cannot take bundlerun down.

The child (e.g. `python -m targets.host_worker`) loads the program once and
speaks JSON lines on stdout:

    {"event": "ready", "load_s": 0.4, "info": {...}}
    {"event": "start", "method": "forward", "case": 3}
    {"event": "done", "method": "forward", "case": 3, "elapsed_s": 0.01,
     "outputs": [{"scalar_type": 6, "shape": [1, 10], "file": "/abs/path.bin"}]}
    {"event": "error", "method": "forward", "case": 3, "error": "...", "kind": "runtime"}
    {"event": "fatal", "error": "...", "kind": "load"}
    {"event": "finished"}

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
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bundlerun.targets.base import CaseResult, CaseStatus, RawTensor, RunOptions
from bundlerun.targets.process import kill_process_group

MAX_RESTARTS = 3

CommandFn = Callable[[Path], list[str]]  # cases-file -> argv


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _take_file(path: str) -> bytes:
    """A child's output file, read and removed."""
    data = Path(path).read_bytes()
    Path(path).unlink(missing_ok=True)
    return data


def tail_lines(path: Path, lines: int = 12) -> list[str]:
    """The last non-empty lines of a log (a case's excerpt after a crash or hang)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in text if line.strip()][-lines:]


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
        self.buf = b""
        self.bundles = 0  # bundles loaded by this process

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, log_path: Path) -> None:
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(list(self.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True, env=self.env)
        self.buf = b""
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


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
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

    def run(self, pairs: list[tuple[str, int]]) -> list[CaseResult]:
        results: dict[tuple[str, int], CaseResult] = {}
        remaining = list(pairs)
        attempt = 0
        while remaining:
            attempt += 1
            log_path = self.options.work_dir / f"{self.log_name}-{attempt}.log"
            outcome = self._one_process(remaining, log_path, results)
            remaining = [p for p in pairs if p not in results]
            if outcome == "fatal" or not remaining:
                break
            if attempt > MAX_RESTARTS:
                for method, case in remaining:
                    results[(method, case)] = CaseResult(
                        method, case, CaseStatus.ERROR,
                        error=f"not run: the runtime process failed {attempt} times",
                        error_kind="gave-up",
                    )
                break
        for method, case in pairs:
            results.setdefault(
                (method, case),
                CaseResult(method, case, CaseStatus.ERROR, error="not run: runtime failed to start", error_kind="load"),
            )
        return [results[p] for p in pairs]

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
        channel = _Channel()
        try:
            return self._drive(proc, pairs, log_path, results, channel)
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
        channel = _Channel(worker)
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
            if self._warm_attempts == 0:
                self.reused = reused
            self._warm_attempts += 1
            worker.bundles += 1
            outcome = self._drive(worker.proc, pairs, log_path, results, channel)
            idle = channel.idle and worker.alive()
            return outcome
        finally:
            if not idle:  # crashed, hung, interrupted or confused: never reused
                worker.kill()
            self.pool.release(worker)

    def _drive(self, proc: subprocess.Popen, pairs, log_path: Path, results: dict, channel: "_Channel") -> str:
        opts = self.options
        current: tuple[str, int] | None = None
        started = time.monotonic()
        deadline = started + opts.setup_timeout_s
        ready = False
        fd = proc.stdout.fileno()
        while True:
            # events already buffered (a warm worker's previous read) are handled before waiting
            if b"\n" not in channel.buf:
                timeout = max(0.0, deadline - time.monotonic())
                readable, _, _ = select.select([fd], [], [], min(timeout, 1.0))
                if not readable:
                    if time.monotonic() < deadline:
                        continue
                    if current is None and not ready:
                        for m, c in pairs:
                            results[(m, c)] = CaseResult(
                                m, c, CaseStatus.TIMEOUT,
                                error=f"runtime did not load the program within {opts.setup_timeout_s:g} s",
                                error_kind="load-timeout", log_excerpt=tail_lines(log_path), log_path=str(log_path),
                            )
                        return "fatal"
                    m, c = current or pairs[0]
                    results[(m, c)] = CaseResult(
                        m, c, CaseStatus.TIMEOUT,
                        error=f"case did not finish within {opts.case_timeout_s:g} s (process killed)",
                        error_kind="hang", log_excerpt=tail_lines(log_path), log_path=str(log_path),
                        elapsed_s=opts.case_timeout_s,
                    )
                    self._notify(results[(m, c)])
                    return "timeout"
                chunk = os.read(fd, 65536)
                if not chunk:
                    proc.wait()
                    if current is not None:
                        m, c = current
                        results[(m, c)] = CaseResult(
                            m, c, CaseStatus.ERROR,
                            error=f"runtime crashed ({_signal_name(proc.returncode)}) while running this case",
                            error_kind="crash", log_excerpt=tail_lines(log_path), log_path=str(log_path),
                        )
                        self._notify(results[(m, c)])
                        return "crash"
                    if not ready:
                        for m, c in pairs:
                            results[(m, c)] = CaseResult(
                                m, c, CaseStatus.ERROR,
                                error=f"runtime exited before loading the program ({_signal_name(proc.returncode)})",
                                error_kind="load", log_excerpt=tail_lines(log_path), log_path=str(log_path),
                            )
                        return "fatal"
                    return "eof"
                channel.buf += chunk
            while b"\n" in channel.buf:
                line, channel.buf = channel.buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # stray print from a library; the protocol lines are JSON
                if not isinstance(msg, dict):
                    continue
                event = msg.get("event")
                if event == "ready":
                    ready = True
                    self.info.update(msg.get("info", {}))
                    self.setup_s = (self.setup_s or 0.0) + float(msg.get("load_s", 0.0))
                    deadline = time.monotonic() + opts.setup_timeout_s
                elif event == "start":
                    current = (msg["method"], int(msg["case"]))
                    deadline = time.monotonic() + opts.case_timeout_s
                elif event in ("done", "error"):
                    key = (msg["method"], int(msg["case"]))
                    results[key] = self._result(msg, log_path)
                    self._notify(results[key])
                    current = None
                    deadline = time.monotonic() + opts.case_timeout_s
                elif event == "fatal":
                    for m, c in pairs:
                        results.setdefault(
                            (m, c),
                            CaseResult(
                                m, c, CaseStatus.ERROR, error=msg.get("error", "runtime failed"),
                                error_kind=msg.get("kind", "load"), log_excerpt=tail_lines(log_path), log_path=str(log_path),
                            ),
                        )
                    channel.idle = True  # a warm worker that could not load this bundle waits for the next
                    return "fatal"
                elif event == "finished":
                    channel.idle = True
                    return "eof"

    def _result(self, msg: dict, log_path: Path) -> CaseResult:
        method, case = msg["method"], int(msg["case"])
        if msg["event"] == "error":
            return CaseResult(
                method, case, CaseStatus.ERROR, error=msg.get("error"), error_kind=msg.get("kind", "runtime"),
                log_excerpt=tail_lines(log_path), log_path=str(log_path), elapsed_s=msg.get("elapsed_s"),
            )
        outputs = []
        for out in msg.get("outputs", []):
            path = Path(out["file"])
            data = path.read_bytes()
            path.unlink(missing_ok=True)
            outputs.append(RawTensor(int(out["scalar_type"]), list(out["shape"]), data))
        result = CaseResult(method, case, CaseStatus.OK, outputs=outputs, elapsed_s=msg.get("elapsed_s"))
        for run in msg.get("replays") or []:  # --replay N: the later runs' outputs (host_worker, program worker)
            result.replays.append([RawTensor(int(o["scalar_type"]), list(o["shape"]), _take_file(o["file"])) for o in run])
        if msg.get("perf"):  # figures the worker measured (host_worker --repeat): PerfFigure dicts
            from bundlerun.targets.base import PerfFigure

            result.add_perf([PerfFigure.from_dict(f) for f in msg["perf"]])
        return result

    def _notify(self, result: CaseResult) -> None:
        if self.options.progress:
            self.options.progress(result)


class _Channel:
    """The child's stdout as JSON lines: the bytes read but not yet handled, and whether the
    child ended its last request idle (finished or fatal), ready for another bundle."""

    def __init__(self, worker: WarmWorker | None = None) -> None:
        self._worker = worker
        self._buf = b""
        self.idle = False

    @property
    def buf(self) -> bytes:
        return self._worker.buf if self._worker is not None else self._buf

    @buf.setter
    def buf(self, value: bytes) -> None:
        if self._worker is not None:
            self._worker.buf = value
        else:
            self._buf = value


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
    from bundlerun.targets.base import TargetRun, selected_cases

    pool = active_pool() if warm else None
    spec = None
    if pool is not None:
        spec = WarmSpec(argv=(sys.executable, "-m", module, "--serve", *args[2:]),
                        request={"bundle": str(args[0]), "out_dir": str(args[1])})
    supervisor = WorkerSupervisor(python_module_command(module, *args), options, name, warm=spec, pool=pool)
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
                import traceback

                traceback.print_exc()
                sys.stdout.write(json.dumps({"event": "fatal", "kind": "runtime",
                                             "error": f"runtime worker failed: {type(exc).__name__}: {exc}"}) + "\n")
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
