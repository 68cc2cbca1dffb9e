"""The coordinator: which attempt goes to which device, when, and whether to try again.

- A device (its resource key) runs one attempt at a time, whatever groups list it.
- A group runs at most `concurrency` attempts at once; the executor's capacity (local pool
  workers) bounds attempts in flight.
- Exit 1 (a numerical failure) is final: never retried. Exit 2 is retried up to `retries`
  times when a case failed with a kind that can pass on another try (a lost link, a crash, a
  timeout, a tool that failed to start...); kinds that would fail the same way again (a bad
  bundle, a missing tool or operator, a bad option) are final. A retry prefers another device
  of the pool, else the same one.
- Every attempt is kept; a job that passed after a failed attempt is flaky.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable

from bundlerun.runner.farm.plan import Device, Job
from bundlerun.runner.report.model import Report
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.base import Verdict
from bundlerun.runner.farm.job import _bad_report

# Failure kinds a second try cannot fix: never retried.
FINAL_KINDS = frozenset({
    "bad-bundle", "unsupported", "bad-config", "tool-missing", "auth-refused", "host-key", "version-mismatch",
    "missing-operator", "missing-backend", "device-bundleio-mismatch", "interrupted",
})
NEUTRAL_KINDS = frozenset({"not-run"})  # follows another case's failure: says nothing by itself


@dataclass
class Attempt:
    job: str
    attempt: int  # 1-based
    url: str
    device: str | None
    report: Report  # None once released
    elapsed_s: float
    retryable: bool = False
    submitted_unix: float = 0.0  # when the coordinator sent it (wall clock; the device's start is in its report)
    _kept: dict[str, Any] | None = None  # what the properties read, once the report is released

    def release(self) -> None:
        """Drop the report (its cases), keeping what the attempt's record needs: a 2,000-job farm
        holds every attempt, and the reports are on disk and folded into the merged one."""
        if self._kept is None:
            self._kept = {"exit_code": self.exit_code, "verdict": self.verdict, "kinds": self.kinds,
                          "node": self.node, "run_id": self.report.run.get("id")}
            self.report = None  # type: ignore[assignment]

    @property
    def exit_code(self) -> int:
        return self._kept["exit_code"] if self._kept else self.report.summary.exit_code

    @property
    def verdict(self) -> str:
        return self._kept["verdict"] if self._kept else self.report.summary.verdict

    @property
    def kinds(self) -> list[str]:
        if self._kept:
            return list(self._kept["kinds"])
        return sorted({c.error_kind.value for c in self.report.cases
                       if c.verdict in (Verdict.ERROR, Verdict.TIMEOUT) and c.error_kind})

    @property
    def node(self) -> dict[str, Any]:
        return self._kept["node"] if self._kept else (self.report.extras.get("farm") or {}).get("node") or {}

    def record(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "url": self.url, "device": self.device, "exit_code": self.exit_code,
                "verdict": self.verdict, "error_kinds": self.kinds, "retried": self.retryable,
                "elapsed_s": round(self.elapsed_s, 4), "submitted_unix": round(self.submitted_unix, 4), "node": self.node,
                "run_id": self._kept["run_id"] if self._kept else self.report.run.get("id")}


def retryable(exit_code: int, kinds: list[str]) -> bool:
    """Exit 2 with a kind another try can fix (or no kind at all: the attempt itself broke)."""
    if exit_code != 2:
        return False
    telling = [k for k in kinds if k not in NEUTRAL_KINDS]
    return not telling or any(k not in FINAL_KINDS for k in telling)


@dataclass
class _Pending:
    job: Job
    attempt: int
    tried: list[str] = field(default_factory=list)  # device URLs of earlier attempts


class Scheduler:
    def __init__(self, jobs: list[Job], executor: Any, retries: int,
                 payload: Callable[[Job, int, Device], dict[str, Any]],
                 on_attempt: Callable[[Attempt], None] | None = None) -> None:
        self.jobs = jobs
        self.executor = executor
        self.retries = max(0, int(retries))
        self.payload = payload
        self.on_attempt = on_attempt
        self.attempts: dict[str, list[Attempt]] = {j.id: [] for j in jobs}
        self.unplaceable: dict[str, str] = {}  # job -> why no device can ever take it
        self._usage: Counter = Counter()

    def _usable(self, device: Device, available: set[str] | None) -> bool:
        return device.resource is None or available is None or device.resource in available

    def _pick(self, item: _Pending, busy: set[str], available: set[str] | None) -> Device | None:
        usable = [d for d in item.job.group.devices if self._usable(d, available)]
        untried = [d for d in usable if d.url not in item.tried]
        # a retry goes to a device of the pool it has not failed on (waiting for one if need be);
        # only when it has tried them all does it go back to one it failed on
        candidates = untried or usable
        free = [d for d in candidates if d.resource is None or d.resource not in busy]
        if not free:
            return None
        free.sort(key=lambda d: self._usage[d.url])  # the least used device first
        return free[0]

    def run(self) -> dict[str, list[Attempt]]:
        available = self.executor.resources()
        pending: deque[_Pending] = deque()
        for job in self.jobs:
            if not any(self._usable(d, available) for d in job.group.devices):
                missing = sorted(d.resource for d in job.group.devices if d.resource)
                self.unplaceable[job.id] = (f"no device of {job.group.name} is offered by the executor "
                                            f"(missing resources: {', '.join(missing)})")
            else:
                pending.append(_Pending(job, 1))
        running: dict[Future, tuple[_Pending, Device, float, float]] = {}
        busy: set[str] = set()
        group_running: Counter = Counter()
        capacity = self.executor.capacity
        told: list[Attempt] = []  # finished attempts whose callback runs once their devices have new work
        # when every job needs a device and every device is busy, no pending job can start: the scan
        # stops there (2,000 pending jobs x 50 devices per finished attempt otherwise)
        resources = {d.resource for j in self.jobs for d in j.group.devices}
        devices_only = None not in resources
        try:
            while pending or running:
                for item in list(pending):
                    if capacity is not None and len(running) >= capacity:
                        break
                    if devices_only and len(busy) >= len(resources):
                        break
                    group = item.job.group
                    if group_running[group.name] >= group.concurrency:
                        continue
                    device = self._pick(item, busy, available)
                    if device is None:
                        continue
                    pending.remove(item)
                    if device.resource:
                        busy.add(device.resource)
                    group_running[group.name] += 1
                    self._usage[device.url] += 1
                    future = self.executor.submit(self.payload(item.job, item.attempt, device), device.resource)
                    running[future] = (item, device, time.perf_counter(), time.time())
                for attempt in told:  # after the submissions: a device never waits for a report to be written
                    if self.on_attempt:
                        self.on_attempt(attempt)
                told = []
                if not running:
                    if not pending:
                        break
                    raise RuntimeError("farm scheduler: jobs pending but none can be placed")  # guarded above
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    item, device, t0, sent = running.pop(future)
                    if device.resource:
                        busy.discard(device.resource)
                    group_running[item.job.group.name] -= 1
                    report = self._result(future, item, device)
                    attempt = Attempt(item.job.id, item.attempt, device.url, device.resource, report,
                                      time.perf_counter() - t0, submitted_unix=sent)
                    attempt.retryable = retryable(attempt.exit_code, attempt.kinds) and item.attempt <= self.retries
                    self.attempts[item.job.id].append(attempt)
                    told.append(attempt)
                    if attempt.retryable:
                        pending.appendleft(_Pending(item.job, item.attempt + 1, item.tried + [device.url]))
        except BaseException:
            for future in running:
                future.cancel()
            raise
        for attempt in told:
            if self.on_attempt:
                self.on_attempt(attempt)
        return self.attempts

    def _result(self, future: Future, item: _Pending, device: Device) -> Report:
        try:
            return future.result()
        except Exception as exc:  # noqa: BLE001 - the worker process or the Ray task died: infrastructure
            report = _bad_report({"url": device.url, "bundle_path": str(item.job.bundle)},
                                 f"the attempt's worker died: {type(exc).__name__}: {exc}", FailureKind.CRASH)
            report.extras["farm"] = {"job": item.job.id, "attempt": item.attempt, "device": device.resource, "node": {}}
            return report
