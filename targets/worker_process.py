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

The parent enforces a setup timeout (until "ready") and a per-case timeout
(from "start"). A case during which the child dies or hangs becomes ERROR or
TIMEOUT; the process group is killed and a new child continues with the
remaining cases. Everything is reaped.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

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


def _tail(path: Path, lines: int = 12) -> list[str]:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in text if line.strip()][-lines:]


class WorkerSupervisor:
    """Drive `command` over `pairs`, restarting after crashes/hangs."""

    def __init__(self, command: CommandFn, options: RunOptions, log_name: str = "worker") -> None:
        self.command = command
        self.options = options
        self.log_name = log_name
        self.info: dict = {}
        self.setup_s: float | None = None

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
        opts = self.options
        opts.work_dir.mkdir(parents=True, exist_ok=True)
        cases_file = log_path.with_suffix(".cases.json")
        cases_file.write_text(json.dumps([[m, c] for m, c in pairs]))
        env = dict(os.environ)
        env.setdefault("PYTHONWARNINGS", "ignore")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                self.command(cases_file),
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        try:
            return self._drive(proc, pairs, log_path, results)
        finally:
            kill_process_group(proc, 10.0, term_first=False)
            if proc.stdout:
                proc.stdout.close()

    def _drive(self, proc: subprocess.Popen, pairs, log_path: Path, results: dict) -> str:
        opts = self.options
        buf = b""
        current: tuple[str, int] | None = None
        started = time.monotonic()
        deadline = started + opts.setup_timeout_s
        ready = False
        fd = proc.stdout.fileno()
        while True:
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
                            error_kind="load-timeout", log_excerpt=_tail(log_path), log_path=str(log_path),
                        )
                    return "fatal"
                m, c = current or pairs[0]
                results[(m, c)] = CaseResult(
                    m, c, CaseStatus.TIMEOUT,
                    error=f"case did not finish within {opts.case_timeout_s:g} s (process killed)",
                    error_kind="hang", log_excerpt=_tail(log_path), log_path=str(log_path),
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
                        error_kind="crash", log_excerpt=_tail(log_path), log_path=str(log_path),
                    )
                    self._notify(results[(m, c)])
                    return "crash"
                if not ready:
                    for m, c in pairs:
                        results[(m, c)] = CaseResult(
                            m, c, CaseStatus.ERROR,
                            error=f"runtime exited before loading the program ({_signal_name(proc.returncode)})",
                            error_kind="load", log_excerpt=_tail(log_path), log_path=str(log_path),
                        )
                    return "fatal"
                return "eof"
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # stray print from a library; the protocol lines are JSON
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
                                error_kind=msg.get("kind", "load"), log_excerpt=_tail(log_path), log_path=str(log_path),
                            ),
                        )
                    return "fatal"
                elif event == "finished":
                    return "eof"

    def _result(self, msg: dict, log_path: Path) -> CaseResult:
        method, case = msg["method"], int(msg["case"])
        if msg["event"] == "error":
            return CaseResult(
                method, case, CaseStatus.ERROR, error=msg.get("error"), error_kind=msg.get("kind", "runtime"),
                log_excerpt=_tail(log_path), log_path=str(log_path), elapsed_s=msg.get("elapsed_s"),
            )
        outputs = []
        for out in msg.get("outputs", []):
            path = Path(out["file"])
            data = path.read_bytes()
            path.unlink(missing_ok=True)
            outputs.append(RawTensor(int(out["scalar_type"]), list(out["shape"]), data))
        return CaseResult(method, case, CaseStatus.OK, outputs=outputs, elapsed_s=msg.get("elapsed_s"))

    def _notify(self, result: CaseResult) -> None:
        if self.options.progress:
            self.options.progress(result)


def python_module_command(module: str, *args: str) -> CommandFn:
    """argv builder for `python -m module args... --cases FILE`."""

    def build(cases_file: Path) -> list[str]:
        return [sys.executable, "-m", module, *args, "--cases", str(cases_file)]

    return build


def run_in_worker(url: str, module: str, args: list[str], bundle, options: RunOptions, name: str,
                  info: dict | None = None, warnings: list[str] | None = None):
    """Run the bundle's selected cases in a supervised child (`python -m module args --cases F`):
    the one way host://, tosa:// and mlx:// drive their runtimes. Returns the TargetRun."""
    from bundlerun.targets.base import TargetRun, selected_cases

    supervisor = WorkerSupervisor(python_module_command(module, *args), options, name)
    start = time.perf_counter()
    cases = supervisor.run(selected_cases(bundle, options))
    logs = {p.stem: str(p) for p in sorted(Path(options.work_dir).glob(f"{name}-*.log"))}
    run = TargetRun(url, cases, info={**(info or {}), **supervisor.info}, logs=logs, setup_s=supervisor.setup_s,
                    warnings=list(warnings or []))
    run.info["wall_s"] = time.perf_counter() - start
    return run
