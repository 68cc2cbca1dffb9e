"""The farm's results written as its jobs finish, beside the scheduling: reports and history.

A job's final report (and its attempts' reports, when they came back from Ray) goes to a queue the
moment its last attempt is in; a thread writes them and records the jobs in the history through
its API (runner/history/store.py: record_reports, one transaction per batch, then each job's
attempts), setting each report's history id before it is written. A farm stopped halfway has its
finished jobs on disk and in the history already, and the coordinator's loop never waits for a
disk or a database. A history that cannot record says so in the job's report (a warning, as
before) and never changes a verdict; a report that cannot be written is raised by close(), in
the coordinator, as when it wrote the report itself.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bundlerun.runner.report.model import Report

BATCH = 64  # jobs per history transaction at most (bundlerun's own choice)
LINGER_S = 0.5  # a batch is written when it is full or this long after its first job came in


@dataclass
class _Done:
    job: str
    final: Report
    final_dir: Path
    attempts: list[dict[str, Any]]  # rows of the history's farm_attempts
    record: dict[str, Any]  # the job's record in the merged report (gets history_id)
    writes: list[tuple[Report, Path]]  # attempt reports to write
    recorded: bool  # goes to the history


class ResultWriter:
    def __init__(self, db: Any, farm_id: str, fold: Callable[[str, Report], None] | None = None) -> None:
        self.db = db
        self.fold = fold  # gets each job's final report once it is written (the merged report's fold)
        self.farm_id = farm_id
        self.batches = 0
        # the most jobs waiting to be written at once: their reports (every case) are held meanwhile,
        # so a writer slower than the devices grows the coordinator's memory with the plan
        self.peak_backlog = 0
        self._failed: BaseException | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="bundlerun-farm-results", daemon=True)
        self._thread.start()

    def add(self, job: str, final: Report, final_dir: Path, attempts: list[dict[str, Any]], record: dict[str, Any],
            writes: list[tuple[Report, Path]], record_history: bool = True) -> None:
        self._queue.put(_Done(job, final, final_dir, attempts, record, writes, record_history and self.db is not None))
        self.peak_backlog = max(self.peak_backlog, self._queue.qsize())

    def close(self) -> None:
        """Write what is queued and stop."""
        self._queue.put(None)
        self._thread.join()
        if self._failed is not None:
            raise self._failed

    def _loop(self) -> None:
        done = False
        while not done:
            item = self._queue.get()
            if item is None:
                break
            batch = [item]
            deadline = time.monotonic() + LINGER_S
            while len(batch) < BATCH:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    done = True
                    break
                batch.append(item)
            try:
                self._write(batch)
            except BaseException as exc:  # noqa: BLE001 - raised by close(), in the coordinator
                self._failed = self._failed or exc

    def _write(self, batch: list[_Done]) -> None:
        from bundlerun.runner.history import store as history  # start-up: loads numpy, sqlalchemy on use
        from bundlerun.runner.report.record import write_record  # start-up: loads numpy on use

        for d in batch:
            for report, folder in d.writes:
                write_record(report, folder)
        recorded = [d for d in batch if d.recorded]
        if recorded:
            self.batches += 1
            try:
                ids = history.record_reports(self.db, [(d.final, d.final_dir / "report.json", None) for d in recorded])
                for d, run_id in zip(recorded, ids):
                    history.record_farm_attempts(self.db, self.farm_id, d.job, d.attempts, run_id=run_id)
                    d.final.run["history_id"] = run_id
                    d.record["history_id"] = run_id
            except Exception as exc:  # noqa: BLE001 - history never changes a verdict
                for d in recorded:
                    if "history_id" not in d.record:
                        d.final.warnings.append(f"history not recorded in {self.db}: {exc}")
        for d in batch:
            write_record(d.final, d.final_dir)
            if self.fold is not None:
                self.fold(d.job, d.final)
