"""Judge each case while the target is still running the next ones.

A served lane (qemu-user's executor_runner in server mode, the host worker) hands its results one at
a time through the run's progress callback and then waits on the device for the next: judging a
case meanwhile, on a thread, takes the judging off the end of the run (issue 35's cost goal: 192 LLM
steps judged with their token figures took ~0.4 s after the last step, bench/bench_llm_sequence.py).

Each case is judged on a private view of the context (its own `step_metrics` and `warnings`), merged
into the run's context only when `judge_run` takes the record, in the run's case order: the report is
the one judging them all afterwards gives. A result the run does not hand back as the same object
(a retried case, a whole-run replay's), or whose fields changed after it was handed over (a lane that
adds its attempt count or log afterwards), is judged again there, as before. The thread is a daemon and
judges nothing once `close()`d; a judging error is raised where the case is taken, not on the thread.
`after` (runner/session.py CaseStream.release) runs on the thread once a case is judged: it saves what
the report keeps of the outputs and lets the bytes go (issue 36); such a result whose other fields
changed after the hand-over gets them copied into its record (a status change is judged again, which
needs no outputs), and one whose outputs were replaced is judged again with them.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable

from bundlerun.bundles.bpte import Bundle
from bundlerun.runner.judging.judge import JudgeContext, judge_case
from bundlerun.targets.base import CaseResult


class JudgeAhead:
    """Judges submitted results on one background thread; `take` returns a result's record."""

    def __init__(self, bundle: Bundle, ctx: JudgeContext, after: Callable[[CaseResult], bool] | None = None) -> None:
        self._bundle, self._ctx = bundle, ctx
        self._after = after  # called with each result once judged; True: it let go of the result's outputs
        ctx.step_token("", -1)  # builds the step table once, shared by the private views
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge-ahead")
        self._jobs: dict[int, tuple[CaseResult, tuple, Future]] = {}
        self._lock = threading.Lock()

    def _judge(self, result: CaseResult) -> tuple[Any, JudgeContext, bool]:
        private = replace(self._ctx, step_metrics={}, warnings=[])
        private._steps = self._ctx._steps
        record = judge_case(self._bundle, result, private)
        released = bool(self._after(result)) if self._after is not None else False
        return record, private, released

    def submit(self, result: CaseResult) -> None:
        with self._lock:
            if self._pool is None:
                return
            try:
                self._jobs[id(result)] = (result, _snapshot(result), self._pool.submit(self._judge, result))
            except RuntimeError:  # the pool is shutting down (interpreter exit)
                pass

    def take(self, result: CaseResult) -> Any:
        """The record of `result` judged ahead, its token figures and notes merged into the run's
        context; None when it was not submitted (the caller judges it)."""
        with self._lock:
            job = self._jobs.pop(id(result), None)
        if job is None or job[0] is not result:
            return None
        record, private, released = job[2].result()  # re-raises what judging raised
        now = _snapshot(result)
        if released and not result.outputs:  # its outputs were let go once judged: compare the rest
            if not _same(job[1][:-1], now[:-1]):
                if result.status != job[1][2]:
                    return None  # judged again: a case no longer OK is judged without its outputs
                _refresh(record, result)  # the lane added its log, attempts or figures after the hand-over
        elif not _same(job[1], now):
            return None
        self._ctx.step_metrics.update(private.step_metrics)
        self._ctx.warnings.extend(w for w in private.warnings if w not in self._ctx.warnings)
        return record

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            self._jobs.clear()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _snapshot(r: CaseResult) -> tuple:
    """Every field judge_case reads, as it was (outputs by identity)."""
    return (r.method, r.case_index, r.status, r.elapsed_s, r.error, r.error_kind, tuple(r.log_excerpt or ()),
            r.log_path, dict(r.device_verdict or {}), dict(r.extra or {}), list(r.perf or []), tuple(map(id, r.outputs or ())))


def _refresh(record: Any, r: CaseResult) -> None:
    """The fields of `record` judge_case copies from the result, as the result has them now."""
    record.elapsed_s, record.log_excerpt, record.log_path = r.elapsed_s, list(r.log_excerpt or []), r.log_path
    record.device_verdict, record.extra, record.perf = r.device_verdict, dict(r.extra or {}), list(r.perf or [])
    if r.error is not None:
        record.error, record.error_kind = r.error, r.error_kind


def _same(a: tuple, b: tuple) -> bool:
    try:
        return bool(a == b)
    except (ValueError, TypeError):  # a value whose == is not a bool (an array in `extra`): judge again
        return False
