"""Judge each case while the target is still running the next ones.

A served lane (qemu-user's executor_runner in server mode, the host worker) hands its results one at
a time through the run's progress callback and then waits on the device for the next: judging a
case meanwhile, on a thread, takes the judging off the end of the run (issue 35's cost goal: 192 LLM
steps judged with their token figures took ~0.4 s after the last step, bench/bench_llm_sequence.py).

Each case is judged on a private view of the context (its own `step_metrics` and `warnings`), merged
into the run's context only when `judge_run` takes the record, in the run's case order: the report is
the one judging them all afterwards gives. Only the outputs are judged on the thread
(judge.judge_outputs); the fields a lane may still add after the hand-over (its attempt count, log,
figures, an error line) are settled into the record when it is taken (judge.settle), as the result has
them then. A result the run does not hand back as the same object (a retried case, a whole-run
replay's), or whose status or outputs changed after it was handed over, is judged again there, as
before. The thread is a daemon and judges nothing once `close()`d; a judging error is raised where the
case is taken, not on the thread.

`after` (runner/session.py CaseStream.release) runs on the thread once a case is judged, with the
identities of the outputs handed over: it saves what the report keeps of them and lets the bytes go
(issue 36) unless the lane replaced them meanwhile. A released result is never judged again from its
outputs: one whose status changed is judged again by its status (no outputs needed), one given new
outputs after the release is judged again with those.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable

from bundlerun.bundles.bpte import Bundle
from bundlerun.runner.judging.judge import JudgeContext, judge_outputs, settle
from bundlerun.targets.base import CaseResult, CaseStatus


class JudgeAhead:
    """Judges submitted results on one background thread; `take` returns a result's record."""

    def __init__(self, bundle: Bundle, ctx: JudgeContext,
                 after: Callable[[CaseResult, tuple[int, ...]], bool] | None = None) -> None:
        self._bundle, self._ctx = bundle, ctx
        self._after = after  # called with each result once judged; True: it let go of the result's outputs
        ctx.step_token("", -1)  # builds the step table once, shared by the private views
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge-ahead")
        self._jobs: dict[int, tuple[CaseResult, tuple, Future]] = {}
        self._lock = threading.Lock()

    def _judge(self, result: CaseResult, handed: tuple) -> tuple[Any, JudgeContext, bool]:
        private = replace(self._ctx, step_metrics={}, warnings=[])
        private._steps = self._ctx._steps
        record = judge_outputs(self._bundle, result, private)
        with self._lock:  # a submit a stop (Ctrl-C) cut short before its job was recorded: `take` will not find
            recorded = self._jobs.get(id(result), (None,))[0] is result  # it, so the outputs must stay to judge again
        released = bool(self._after(result, handed[-1])) if self._after is not None and recorded else False
        return record, private, released

    def submit(self, result: CaseResult) -> None:
        """Judge an OK result on the thread (a result of another status is judged when taken)."""
        if result.status != CaseStatus.OK:
            return
        with self._lock:
            if self._pool is None:
                return
            handed = _snapshot(result)
            try:
                self._jobs[id(result)] = (result, handed, self._pool.submit(self._judge, result, handed))
            except RuntimeError:  # the pool is shutting down (interpreter exit)
                pass

    def take(self, result: CaseResult) -> Any:
        """The record of `result` judged ahead, settled with its lane fields as they are now, its token
        figures and notes merged into the run's context; None when it was not submitted or must be
        judged again (the caller judges it)."""
        with self._lock:
            job = self._jobs.pop(id(result), None)
        if job is None or job[0] is not result:
            return None
        judged, private, released = job[2].result()  # re-raises what judging raised
        now = _snapshot(result)
        if released and not result.outputs:  # let go once judged: the judging stands unless the status changed
            if now[:-1] != job[1][:-1]:
                return None  # judged again by its status, which needs no outputs
        elif now != job[1]:
            return None  # new outputs (or status): judged again with them
        self._ctx.step_metrics.update(private.step_metrics)
        self._ctx.warnings.extend(w for w in private.warnings if w not in self._ctx.warnings)
        return settle(judged, result)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            self._jobs.clear()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _snapshot(r: CaseResult) -> tuple:
    """What the judging of the outputs reads: the case, its status, its outputs (by identity)."""
    return r.method, r.case_index, r.status, tuple(map(id, r.outputs or ()))
