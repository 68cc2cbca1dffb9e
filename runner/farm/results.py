"""The farm's results written as its jobs finish, beside the scheduling: reports and history.

A job's final report (and its attempts' reports, when they came back from Ray) goes to a queue the
moment its last attempt is in, pickled into a spool file beside the report (the thread can fall
hundreds of jobs behind the devices: they wait on disk, not in the coordinator's memory); a thread
writes them and records the jobs in the history through
its API (runner/history/store.py: record_reports, one transaction per batch, then each job's
attempts), setting each report's history id before it is written. A farm stopped halfway has its
finished jobs on disk and in the history already, and the coordinator's loop never waits for a
disk or a database. A history that cannot record says so in the job's report (a warning, as
before) and never changes a verdict; a report that cannot be written is raised by close(), in
the coordinator, as when it wrote the report itself.
"""

from __future__ import annotations

import os
import pickle
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
    reports: bytes | tuple[int, int]  # pickle of (final report, [(attempt report, folder)]), or where it is in the spool
    final_dir: Path
    attempts: list[dict[str, Any]]  # rows of the history's farm_attempts
    record: dict[str, Any]  # the job's record in the merged report (gets history_id)
    recorded: bool  # goes to the history


class _Spool:
    """The queued jobs' reports on disk: appended by the coordinator, read back by the results thread
    (pread: no shared file position). Removed by close()."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._end = 0

    def put(self, data: bytes) -> tuple[int, int]:
        at, view = self._end, memoryview(data)
        while view:
            view = view[os.pwrite(self._fd, view, self._end):]
            self._end = at + len(data) - len(view)
        return at, len(data)

    def get(self, at: int, size: int) -> bytes:
        chunks, done = [], 0
        while done < size:
            chunk = os.pread(self._fd, size - done, at + done)
            if not chunk:
                raise OSError(f"{self.path}: {size - done} bytes missing at {at + done}")
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        os.close(self._fd)
        self.path.unlink(missing_ok=True)


class ResultWriter:
    def __init__(self, db: Any, farm_id: str, fold: Callable[[str, Report, dict[str, Any]], None] | None = None,
                 spool: Path | None = None) -> None:
        """`spool`: a file for the queued jobs' reports (else they wait in memory, pickled)."""
        self.db = db
        self.fold = fold  # gets each job's final report and record once written (the merged report's fold)
        self.farm_id = farm_id
        self.batches = 0
        # the most jobs waiting to be written at once: their reports (every case) are held meanwhile,
        # so a writer slower than the devices grows the coordinator's memory with the plan
        self.peak_backlog = 0
        self._failed: BaseException | None = None
        self._spool: _Spool | None = None
        if spool is not None:
            try:
                self._spool = _Spool(spool)
            except OSError:
                pass  # the queue holds the pickles in memory
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="bundlerun-farm-results", daemon=True)
        self._thread.start()

    def add(self, job: str, final: Report, final_dir: Path, attempts: list[dict[str, Any]], record: dict[str, Any],
            writes: list[tuple[Report, Path]], record_history: bool = True) -> None:
        """Queue a job's results. Its reports wait as one pickle in the spool file (~9 KB for a 2-case
        job against ~70 KB of objects): on a loaded machine the thread falls hundreds of jobs behind
        50 devices (bench_farm_scale.py: 887 of 2,000), and that many reports held as objects grew the
        coordinator's RSS with the plan (114 MB at 200 jobs, 180 MB at 2,000). The caller lets its
        objects go."""
        data = pickle.dumps((final, writes), protocol=pickle.HIGHEST_PROTOCOL)
        blob: bytes | tuple[int, int] = data
        if self._spool is not None:
            try:
                blob = self._spool.put(data)
            except OSError:
                pass  # a full disk: this one waits in memory
        self._queue.put(_Done(job, blob, final_dir, attempts, record, record_history and self.db is not None))
        self.peak_backlog = max(self.peak_backlog, self._queue.qsize())

    def close(self) -> None:
        """Write what is queued and stop."""
        self._queue.put(None)
        self._thread.join()
        if self._spool is not None:
            try:
                self._spool.close()
            except OSError:
                pass
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

        finals: dict[int, Report] = {}  # this batch's reports only: let go when it is written
        for k, d in enumerate(batch):
            where, d.reports = d.reports, b""
            if isinstance(where, bytes):
                final, writes = pickle.loads(where)
            else:
                assert self._spool is not None  # a place in the spool only when there is one
                final, writes = pickle.loads(self._spool.get(*where))
            del where
            finals[k] = final
            for report, folder in writes:
                write_record(report, folder)
        recorded = [k for k, d in enumerate(batch) if d.recorded]
        if recorded:
            self.batches += 1
            try:
                ids = history.record_reports(self.db, [(finals[k], batch[k].final_dir / "report.json", None)
                                                       for k in recorded])
                for k, run_id in zip(recorded, ids):
                    history.record_farm_attempts(self.db, self.farm_id, batch[k].job, batch[k].attempts, run_id=run_id)
                    finals[k].run["history_id"] = run_id
                    batch[k].record["history_id"] = run_id
            except Exception as exc:  # noqa: BLE001 - history never changes a verdict
                for k in recorded:
                    if "history_id" not in batch[k].record:
                        finals[k].warnings.append(f"history not recorded in {self.db}: {exc}")
        for k, d in enumerate(batch):
            write_record(finals[k], d.final_dir)
            if self.fold is not None:
                self.fold(d.job, finals.pop(k), d.record)
