"""A farm's merged report built as its jobs finish: merge_reports' jobs mode, one report at a time.

`merge_reports` (merge.py) holds every report and every case at once; a 2,000-job farm's
coordinator grew from 130 to 351 MB of peak memory with it (bench/bench_farm_scale.py). Here
`JobsMerge.add` folds one job's final report in when it is known: its cases, named `JOB/METHOD`
as the jobs mode names them, go to a spool file (JSON lines) and only small records stay in
memory (the job's entry, its warnings, the counts for the summary). `report()` gives the merged
Report whose `cases` is a `SpooledCases`: a read-only list that reads the cases back from the
spool one at a time, in plan order, whatever order the jobs finished in. `write_report`
(record.py) streams them into report.json; the other writers iterate them.

The document is merge_reports(reports, MergeOptions(jobs=True, names=names)) of the same reports
(tests/test_merge_jobs.py compares the two), minus the run id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from bundlerun.runner.report.merge import (
    MergeOptions, _merge_group, _run_section, _summary_adjusted, _unique, unique_names,
)
from bundlerun.runner.report.model import SCHEMA, CaseRecord, Report


class SpooledCases(list):
    """A merged report's cases on disk, read back one at a time (never all at once); read-only.

    A list so that every reader of `Report.cases` takes it; the list itself stays empty."""

    def __init__(self, path: Path, chunks: Sequence[tuple[int, int, int]]) -> None:
        super().__init__()
        self.path = Path(path)
        self.chunks = list(chunks)  # (offset, bytes, cases) per job, in plan order
        self._count = sum(c for _, _, c in self.chunks)

    def lines(self) -> Iterator[bytes]:
        """Each case's JSON (one line, already sanitized for report.json), in order."""
        with open(self.path, "rb") as fh:
            for offset, size, _ in self.chunks:
                fh.seek(offset)
                yield from fh.read(size).splitlines()

    def dicts(self) -> Iterator[dict[str, Any]]:
        for line in self.lines():
            yield json.loads(line)

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


class JobsMerge:
    """Fold the final report of each of `names` (one per job, plan order) as it comes; `report()` at the end."""

    def __init__(self, names: Sequence[str], spool: Path) -> None:
        self.names = unique_names(list(names))
        self.index = {n: i for i, n in enumerate(names)}
        self.spool = Path(spool)
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.spool, "wb")
        self._jobs: dict[int, dict[str, Any]] = {}  # index -> the job's small record

    def add(self, name: str, report: Report) -> None:
        """Fold the job `name`'s final report in; its cases go to the spool and are not kept."""
        from bundlerun.runner.report.merge_sequences import job_sequences, merge_shard_sequences  # start-up: numpy
        from bundlerun.runner.report.record import _json_default, _sanitize  # start-up: loads numpy on use

        i = self.index[name]
        if i in self._jobs:
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
        size = self._fh.tell() - offset
        summary = doc.get("summary") or {}
        run = doc.get("run") or {}
        self._jobs[i] = {
            "chunk": (offset, size, len(cases)), "counts": counted.counts, "outputs": counted.outputs,
            "summary": {k: summary.get(k) for k in ("exit_code", "interrupted") if k in summary},
            "run": {k: run.get(k) for k in ("started", "finished", "label", "host", "duration_s")},
            "tool": doc.get("tool") or {}, "overrides": list(doc.get("overrides") or []),
            "warnings": [f"{job}: {w}" for w in doc.get("warnings") or []], "notes": notes, "info": info,
            "dataset": doc.get("dataset"), "regressions": list(doc.get("regressions") or []),
            "sequences": job_sequences({"sequences": merge_shard_sequences([doc])}, job),
            "from": {"report": path, "run_id": run.get("id"), "shard": (doc.get("shard") or {}).get("spec"),
                     "cases": len(doc.get("cases") or [])},
            "entry": {"name": job, "run_id": run.get("id"), "bundle": b.get("path"), "model": b.get("model"),
                      "dtype": b.get("dtype"), "backend": b.get("backend"), "sha256": b.get("sha256"),
                      "target": t.get("url"), "summary": _summary_adjusted(counted.to_json(), [summary])},
        }

    def report(self) -> Report:
        """The merged report of every job folded in (each of `names` must have been)."""
        from bundlerun.runner.judging.judge import summary_of  # start-up: not loaded by `bundlerun --help`

        missing = [n for n, i in self.index.items() if i not in self._jobs]
        if missing:
            raise ValueError(f"{len(missing)} jobs never folded into the merged report: {', '.join(missing[:5])}")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        jobs = [self._jobs[i] for i in range(len(self.names))]
        counts: dict[str, int] = {}
        for j in jobs:
            for k, v in j["counts"].items():
                counts[k] = counts.get(k, 0) + v
        cases = sum(j["chunk"][2] for j in jobs)
        summary = _summary_adjusted(summary_of(counts, cases, sum(j["outputs"] for j in jobs)).to_json(),
                                    [j["summary"] for j in jobs])
        warnings: list[str] = []
        for j in jobs:
            warnings += [w for w in j["warnings"] if w not in warnings]
        warnings += [n for j in jobs for n in j["notes"]]
        datasets = [j["dataset"] for j in jobs if j["dataset"]]
        if datasets and len(jobs) > 1:
            warnings.append("dataset accuracy is per report and is not merged; see each report")
        entries = [j["entry"] for j in jobs]
        models = sorted({str(e["model"]) for e in entries if e.get("model")})
        targets = list(dict.fromkeys(str(e["target"]) for e in entries if e.get("target")))
        merged: dict[str, Any] = {
            "schema": SCHEMA, "tool": jobs[0]["tool"] if jobs else {}, "run": _run_section([{"run": j["run"]} for j in jobs]),
            "bundle": {"model": models[0] if len(models) == 1 else f"{len(entries)} jobs", "path": None,
                       "sha256": None, "models": models},
            "target": {"url": targets[0] if len(targets) == 1 else f"{len(targets)} targets", "targets": targets},
            "overrides": _unique([o for j in jobs for o in j["overrides"]]),
            "warnings": warnings, "summary": summary, "cases": [],
            "dataset": datasets[0] if len(jobs) == 1 and datasets else None,
            "merged": {"mode": "jobs", "reports": len(jobs), "run_ids": [j["from"]["run_id"] for j in jobs],
                       "from": [j["from"] for j in jobs], "groups": [j["info"] for j in jobs], "complete": True},
            "jobs": entries,
        }
        sequences = [q for j in jobs for q in j["sequences"]]
        if sequences:
            merged["sequences"] = sequences
        regressions = [r for j in jobs for r in j["regressions"]]
        if regressions:
            merged["regressions"] = regressions
        out = Report.from_json(merged)  # checked as every reader checks a report (the cases as they are written)
        out.cases = SpooledCases(self.spool, [j["chunk"] for j in jobs])
        self._jobs.clear()  # what the report needs is in it: the writers that follow run without the rest
        return out

    def discard(self) -> None:
        """Close and remove the spool (after report.json and the other formats are written)."""
        if not self._fh.closed:
            self._fh.close()
        self.spool.unlink(missing_ok=True)
