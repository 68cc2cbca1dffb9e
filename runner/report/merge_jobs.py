"""A farm's merged report built as its jobs finish: merge_reports' jobs mode, one report at a time.

`merge_reports` (merge.py) holds every report and every case at once; a 2,000-job farm's
coordinator grew from 130 to 351 MB of peak memory with it (bench/bench_farm_scale.py). Here
`JobsMerge.add` folds one job's final report in when it is known: its cases, named `JOB/METHOD`
as the jobs mode names them, go to a spool file (JSON lines), and its per-job sections (its entry in
`jobs`, its `merged.from` and `merged.groups` records, its farm record) to a `JobSpool` (an anonymous
temp file); memory keeps what the document's head needs, aggregated. `report()` gives the merged
Report whose `cases` is a `SpooledCases` and whose per-job lists (and `perf.summary`) are
`SpooledList`s / `PerfStats`: read-only lists read back from disk one job at a time, in plan order,
whatever order the jobs finished in. `write_report` (record.py) streams them into report.json,
junit.xml is written one suite at a time (writers/junit.py) and `farm --json` encodes them piece by
piece; the other writers iterate them. Held as objects they grew a 2,000-job farm's coordinator by
~20 MB (bench/bench_farm_scale.py).

The document is merge_reports(reports, MergeOptions(jobs=True, names=names)) of the same reports
(tests/test_farm.py and tests/test_farm_streamed_report.py compare the two), minus the run id.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import tempfile
import threading
import uuid
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from bundlerun.runner.report.merge import (
    MergeOptions, _merge_group, _summary_adjusted, _unique, _when, unique_names,
)
from bundlerun.runner.report.model import SCHEMA, CaseRecord, PerfFigure, Report, perf_summary


class _Chunks:
    """(offset, bytes, cases) of each job's cases in the spool, in plan order: three arrays, 24 bytes a
    job (a tuple each was ~100)."""

    def __init__(self, at: array, size: array, cases: array) -> None:
        self.at, self.size, self.cases = at, size, cases

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return zip(self.at, self.size, self.cases)

    def __len__(self) -> int:
        return len(self.at)


class SpooledCases(list):
    """A merged report's cases on disk, read back one at a time (never all at once); read-only.

    A list so that every reader of `Report.cases` takes it; the list itself stays empty."""

    def __init__(self, path: Path, chunks: "Sequence[tuple[int, int, int]] | _Chunks") -> None:
        super().__init__()
        self.path = Path(path)
        self.chunks = chunks if isinstance(chunks, _Chunks) else list(chunks)  # (offset, bytes, cases) per job, plan order
        self._count = sum(c for _, _, c in self.chunks)
        self.perf_count: int | None = None  # rows of the perf summary, once a pass counted them

    def lines(self) -> Iterator[bytes]:
        """Each case's JSON (one line, already sanitized for report.json), in order."""
        with open(self.path, "rb") as fh:
            for offset, size, _ in self.chunks:
                fh.seek(offset)
                yield from fh.read(size).splitlines()

    def dicts(self) -> Iterator[dict[str, Any]]:
        for line in self.lines():
            yield json.loads(line)

    def perf_rows(self) -> "PerfStats":
        """report.json's `perf.summary` of these cases, made one job's cases at a time."""
        return PerfStats(self, as_json=True)

    def perf_stats(self) -> "PerfStats":
        """Report.perf_summary() of these cases, made one job's cases at a time."""
        return PerfStats(self)

    def perf_by_job(self) -> Iterator[list["_PerfCase"]]:
        """Each job's cases as perf_summary reads them (method, perf figures), one job's at a time, in plan
        order: a CaseRecord each (its outputs read) made every pass over the perf rows cost seconds."""
        with open(self.path, "rb") as fh:
            for offset, size, _ in self.chunks:
                fh.seek(offset)
                yield [_PerfCase.from_json(json.loads(line)) for line in fh.read(size).splitlines()]

    def __iter__(self) -> Iterator[CaseRecord]:
        for data in self.dicts():
            yield CaseRecord.from_json(data)

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __getitem__(self, index: Any) -> Any:  # rare (tests, a writer's first case): a pass over the file
        return list(iter(self))[index]

    def __reversed__(self) -> Iterator[CaseRecord]:
        return reversed(list(iter(self)))

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a farm's merged cases are read back from disk and cannot be changed")

    append = extend = insert = remove = pop = clear = sort = reverse = __setitem__ = __delitem__ = _read_only  # type: ignore[assignment]
    __iadd__ = _read_only  # type: ignore[assignment]


class JobSpool:
    """Each job's sections of the merged report (its entry, its `merged.from` and `merged.groups`
    records, its farm record) as one JSON line in an anonymous temp file, read back by plan index.

    Held as objects they were ~7 KB a job in the coordinator until report.json was written (a
    2,000-job farm: ~14 MB, bench/bench_farm_scale.py); on disk they cost 16 bytes a job here. The
    file has no name (it goes with the last reference, whatever stops the command), so the lists
    read from it stay readable after the reports are written (the CLI's table and `--json`)."""

    def __init__(self, folder: Path, count: int) -> None:
        self._fh = tempfile.TemporaryFile(dir=folder)
        self.count = count
        self._at = array("q", [-1]) * count  # where each job's line starts, -1: not yet written
        self._size = array("q", [0]) * count
        self._end = 0
        self._lock = threading.Lock()  # written by the results thread, read by the coordinator

    def put(self, index: int, sections: dict[str, Any]) -> None:
        from bundlerun.runner.report.record import _json_default, _sanitize  # start-up: loads numpy on use

        data = json.dumps(_sanitize(sections), default=_json_default, allow_nan=False).encode("utf-8")
        with self._lock:
            os.pwrite(self._fh.fileno(), data, self._end)
            self._at[index], self._size[index] = self._end, len(data)
            self._end += len(data)

    def get(self, index: int) -> dict[str, Any]:
        at, size = self._at[index], self._size[index]
        if at < 0:
            raise ValueError(f"job {index + 1} of {self.count} never folded into the merged report")
        data = os.pread(self._fh.fileno(), size, at)
        if len(data) != size:
            raise OSError(f"merged report spool: {size - len(data)} bytes missing at {at}")
        return json.loads(data)

    def has(self, index: int) -> bool:
        return self._at[index] >= 0

    def close(self) -> None:
        self._fh.close()


class SpooledList(list):
    """One per-job list of the merged report (`jobs`, `merged.from`, `farm.jobs`, ...): each job's
    item read back from a JobSpool when iterated, in plan order, never all at once; read-only.

    A list so that every reader and check of a report takes it (json's indented encoder, the one
    report.json and `--json` use, iterates it item by item); the list itself stays empty."""

    sanitized = True  # its items were _sanitize'd as they were spooled: record.py's check for nan skips them

    def __init__(self, spool: JobSpool, key: str, field: str | None = None) -> None:
        super().__init__()
        self.spool, self.key, self.field = spool, key, field

    def _pick(self, sections: dict[str, Any]) -> Any:
        item = sections[self.key]
        return item.get(self.field) if self.field is not None else item

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.spool.count):
            yield self._pick(self.spool.get(i))

    def __len__(self) -> int:
        return self.spool.count

    def __bool__(self) -> bool:
        return self.spool.count > 0

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._pick(self.spool.get(i)) for i in range(self.spool.count)[index]]
        return self._pick(self.spool.get(range(self.spool.count)[index]))

    def __reversed__(self) -> Iterator[Any]:
        for i in reversed(range(self.spool.count)):
            yield self._pick(self.spool.get(i))

    def __contains__(self, item: object) -> bool:
        return any(x == item for x in self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, list) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SpooledList({self.key}{'.' + self.field if self.field else ''}, {len(self)} items)"

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return copy.deepcopy(list(self), memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (list, (list(self),))

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a farm's merged report lists its jobs from disk: they cannot be changed")

    append = extend = insert = remove = pop = clear = sort = reverse = __setitem__ = __delitem__ = _read_only  # type: ignore[assignment]
    __iadd__ = _read_only  # type: ignore[assignment]


@dataclass
class _PerfCase:
    """What perf_summary (model.py) reads of a case."""

    method: str
    perf: list[PerfFigure]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "_PerfCase":
        return cls(str(data["method"]), [PerfFigure.from_dict(f) for f in data.get("perf") or []])


class PerfStats(list):
    """The perf summary of a farm's merged report (model.py perf_summary: one row per job's method and
    figure, ~1.3 KB a job held as objects), made from one job's cases at a time when iterated;
    `as_json`: the rows as report.json's `perf.summary` writes them. The same rows in the same order:
    a job's methods are `JOB/METHOD`, in no other job's cases. Read-only; each pass reads the spool."""

    def __init__(self, cases: SpooledCases, as_json: bool = False) -> None:
        super().__init__()
        self.cases, self.as_json = cases, as_json

    def __iter__(self) -> Iterator[Any]:
        count = 0
        for cases in self.cases.perf_by_job():
            for row in perf_summary(cases):  # type: ignore[arg-type]  # reads .method and .perf only
                count += 1
                yield row.to_json() if self.as_json else row
        self.cases.perf_count = count

    def __len__(self) -> int:
        if self.cases.perf_count is None:
            self.cases.perf_count = sum(1 for _ in self)
        return self.cases.perf_count

    def __bool__(self) -> bool:
        return len(self) > 0 if self.cases.perf_count is not None else any(True for _ in self)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice) and (index.start or 0) >= 0 and index.stop is not None and index.stop >= 0 \
                and (index.step or 1) > 0:  # rows[:n], what the writers take: only those rows are made
            return list(itertools.islice(iter(self), index.start, index.stop, index.step))
        return list(iter(self))[index]

    def __reversed__(self) -> Iterator[Any]:
        return reversed(list(iter(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, list) and list(iter(self)) == list(iter(other))

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a farm's merged perf summary is made from disk and cannot be changed")

    append = extend = insert = remove = pop = clear = sort = reverse = __setitem__ = __delitem__ = _read_only  # type: ignore[assignment]
    __iadd__ = _read_only  # type: ignore[assignment]


class JobsMerge:
    """Fold the final report of each of `names` (one per job, plan order) as it comes; `report()` at the end.

    What stays in memory is what the merged document's head needs, aggregated (counts, the exit
    codes, the run's first start and last end, the distinct models and targets) plus what only some
    jobs have (warnings, notes, datasets, overrides, regressions, LLM sequences: held per job that has
    them); every per-job list goes to a JobSpool, and the cases to the spool file."""

    def __init__(self, names: Sequence[str], spool: Path) -> None:
        self.names = unique_names(list(names))
        self.index = {n: i for i, n in enumerate(names)}
        self.spool = Path(spool)
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.spool, "wb")
        self.jobs = JobSpool(self.spool.parent, len(self.names))
        n = len(self.names)
        self._chunk_at, self._chunk_size, self._chunk_cases = array("q", [0]) * n, array("q", [0]) * n, array("q", [0]) * n
        self._durations = array("d", [0.0]) * n  # summed in plan order, as merge_reports sums them
        self._folded = 0
        self._counts: dict[str, int] = {}
        self._outputs = 0
        self._codes: set[Any] = set()  # the jobs' own exit codes (a regression, a job that could not start)
        self._stopped: set[Any] = set()  # the exit codes of the jobs that were interrupted
        self._starts: list[tuple[Any, str]] = []  # the earliest start and latest end (at most one each)
        self._ends: list[tuple[Any, str]] = []
        self._labels: dict[str, int] = {}  # label -> the first job (plan order) that has it
        self._hosts: dict[str, Any] = {}  # the first host seen, and whether another differed
        self._tool: dict[str, Any] = {}
        self._models: set[str] = set()
        self._targets: dict[str, int] = {}  # target -> the first job (plan order) that ran on it
        self._sparse: dict[int, dict[str, Any]] = {}  # plan index -> what only some jobs have

    def add(self, name: str, report: Report, record: dict[str, Any] | None = None) -> None:
        """Fold the job `name`'s final report in (and its farm `record`, the merged report's
        `farm.jobs` item); its cases and sections go to the spools and are not kept."""
        from bundlerun.runner.report.merge_sequences import job_sequences, merge_shard_sequences  # start-up: numpy
        from bundlerun.runner.report.record import _json_default, _sanitize  # start-up: loads numpy on use

        i = self.index[name]
        if self.jobs.has(i):
            raise ValueError(f"{name}: folded twice into the merged report")
        doc = report.to_json()
        path = f"report {i + 1}"
        job = self.names[i]
        notes: list[str] = []
        cases, info = _merge_group([(doc, path)], MergeOptions(jobs=True), notes)
        info["label"] = job
        b, t = doc.get("bundle") or {}, doc.get("target") or {}
        for case in cases:
            case["extra"] = {**(case.get("extra") or {}), "job": job, "method": case["method"],
                             "bundle": b.get("path"), "target": t.get("url")}
            case["method"] = f"{job}/{case['method']}"
        from bundlerun.runner.judging.judge import summarize  # start-up: not loaded by `bundlerun --help`

        counted = summarize([CaseRecord.from_json(c) for c in cases])
        offset = self._fh.tell()
        for case in cases:
            self._fh.write(json.dumps(_sanitize(case), default=_json_default, allow_nan=False).encode("utf-8") + b"\n")
        self._chunk_at[i], self._chunk_size[i], self._chunk_cases[i] = offset, self._fh.tell() - offset, len(cases)
        del cases
        summary = doc.get("summary") or {}
        run = doc.get("run") or {}
        self.jobs.put(i, {
            "from": {"report": path, "run_id": run.get("id"), "shard": (doc.get("shard") or {}).get("spec"),
                     "cases": len(doc.get("cases") or [])},
            "info": info,
            "entry": {"name": job, "run_id": run.get("id"), "bundle": b.get("path"), "model": b.get("model"),
                      "dtype": b.get("dtype"), "backend": b.get("backend"), "sha256": b.get("sha256"),
                      "target": t.get("url"), "summary": _summary_adjusted(counted.to_json(), [summary])},
            "record": record,
        })
        self._folded += 1
        for k, v in counted.counts.items():
            self._counts[k] = self._counts.get(k, 0) + v
        self._outputs += counted.outputs
        self._codes.add(summary.get("exit_code"))
        if summary.get("interrupted"):
            self._stopped.add(summary.get("exit_code"))
        # merge.py's _run_section over every job, kept as the extremes it takes
        if (w := _when(run.get("started"))):
            self._starts[:] = [min(self._starts + [(w, run["started"])])]
        if (w := _when(run.get("finished"))):
            self._ends[:] = [max(self._ends + [(w, run["finished"])])]
        if run.get("label"):
            self._labels[run["label"]] = min(i, self._labels.get(run["label"], i))
        self._durations[i] = float(run.get("duration_s") or 0.0)
        if run.get("host"):
            if "first" not in self._hosts:
                self._hosts["first"] = run["host"]
            elif run["host"] != self._hosts["first"]:
                self._hosts["differ"] = True
        if i == 0:
            self._tool = doc.get("tool") or {}
        if b.get("model"):
            self._models.add(str(b["model"]))
        if t.get("url"):
            self._targets[str(t["url"])] = min(i, self._targets.get(str(t["url"]), i))
        sparse = {"overrides": list(doc.get("overrides") or []),
                  "warnings": [f"{job}: {w}" for w in doc.get("warnings") or []], "notes": notes,
                  "dataset": doc.get("dataset"), "regressions": list(doc.get("regressions") or []),
                  "sequences": job_sequences({"sequences": merge_shard_sequences([doc])}, job)}
        sparse = {k: v for k, v in sparse.items() if v}
        if sparse:
            self._sparse[i] = sparse

    def report(self) -> Report:
        """The merged report of every job folded in (each of `names` must have been)."""
        from bundlerun.runner.judging.judge import summary_of  # start-up: not loaded by `bundlerun --help`

        n = len(self.names)
        if self._folded != n:
            missing = [nm for nm, i in self.index.items() if not self.jobs.has(i)]
            raise ValueError(f"{len(missing)} jobs never folded into the merged report: {', '.join(missing[:5])}")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        sparse = [self._sparse[i] for i in sorted(self._sparse)]
        cases = sum(self._chunk_cases)
        summary = _summary_adjusted(summary_of(self._counts, cases, self._outputs).to_json(),
                                    [{"exit_code": c} for c in self._codes]
                                    + [{"exit_code": c, "interrupted": True} for c in self._stopped])
        warnings: list[str] = []
        for j in sparse:
            warnings += [w for w in j.get("warnings", []) if w not in warnings]
        warnings += [note for j in sparse for note in j.get("notes", [])]
        datasets = [j["dataset"] for j in sparse if j.get("dataset")]
        if datasets and n > 1:
            warnings.append("dataset accuracy is per report and is not merged; see each report")
        models = sorted(self._models)
        targets = sorted(self._targets, key=lambda url: self._targets[url])
        labels = sorted(self._labels, key=lambda label: self._labels[label])
        run: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "label": labels[0] if len(labels) == 1 else (", ".join(labels) if labels else None),
            "started": self._starts[0][1] if self._starts else None,
            "finished": self._ends[0][1] if self._ends else None,
            "duration_s": ((self._ends[0][0] - self._starts[0][0]).total_seconds() if self._starts and self._ends
                           else sum(self._durations)),
            "command": ["bundlerun", "merge"],
        }
        if "first" in self._hosts and "differ" not in self._hosts:
            run["host"] = self._hosts["first"]
        merged: dict[str, Any] = {
            "schema": SCHEMA, "tool": self._tool, "run": run,
            "bundle": {"model": models[0] if len(models) == 1 else f"{n} jobs", "path": None,
                       "sha256": None, "models": models},
            "target": {"url": targets[0] if len(targets) == 1 else f"{len(targets)} targets", "targets": targets},
            "overrides": _unique([o for j in sparse for o in j.get("overrides", [])]),
            "warnings": warnings, "summary": summary, "cases": [],
            "dataset": datasets[0] if n == 1 and datasets else None,
            "merged": {"mode": "jobs", "reports": n, "run_ids": SpooledList(self.jobs, "from", "run_id"),
                       "from": SpooledList(self.jobs, "from"), "groups": SpooledList(self.jobs, "info"),
                       "complete": True},
            "jobs": SpooledList(self.jobs, "entry"),
        }
        sequences = [q for j in sparse for q in j.get("sequences", [])]
        if sequences:
            merged["sequences"] = sequences
        regressions = [r for j in sparse for r in j.get("regressions", [])]
        if regressions:
            merged["regressions"] = regressions
        out = Report.from_json(merged)  # checked as every reader checks a report (the cases as they are written)
        out.cases = SpooledCases(self.spool, _Chunks(self._chunk_at, self._chunk_size, self._chunk_cases))
        self._sparse.clear()  # what the report needs is in it: the writers that follow run without the rest
        return out

    def records(self) -> SpooledList:
        """The farm records given to `add`, in plan order (the merged report's `farm.jobs`)."""
        return SpooledList(self.jobs, "record")

    def discard(self) -> None:
        """Close and remove the spool (after report.json and the other formats are written)."""
        if not self._fh.closed:
            self._fh.close()
        self.spool.unlink(missing_ok=True)
