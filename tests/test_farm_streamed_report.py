"""A farm's merged report streamed to disk job by job (runner/report/merge_jobs.py, record.py, writers/junit.py).

The coordinator of `bundlerun farm` folds each job's final report in as it finishes: the cases go to
one spool file, each job's sections (its entry, its `merged.from`/`groups` records, its farm record)
to another, and report.json, junit.xml and `--json` are written from them one job at a time. These
tests check (a) that what is written is what the in-memory merge (merge_reports) gives, byte for
byte; (b) that the memory the merge and the writers take does not grow with the jobs (tracemalloc,
100 vs 1,000 jobs: the code before this change held ~6 KB a job); (c) that an interrupt while a
report streams leaves the old file or none, never a partial one. The reports are real judge output
(tests/report_samples.py); no device is involved.
"""

from __future__ import annotations

import gc
import json
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from bundlerun.runner.report.merge import MergeOptions, merge_reports
from bundlerun.runner.report.merge_jobs import JobsMerge, JobSpool, SpooledCases
from bundlerun.runner.report.model import Report
from bundlerun.runner.report.record import write_record
from bundlerun.runner.writers import write_reports
from bundlerun.runner.writers.html import render_html
from bundlerun.runner.writers.junit import junit_bytes, junit_streamed_bytes, write_junit
from bundlerun.runner.writers.markdown import write_markdown
from report_samples import quick_report


@pytest.fixture(scope="module")
def docs() -> tuple[dict[str, Any], dict[str, Any]]:
    """One passing and one failing report (2 cases each), as read from report.json."""
    good = quick_report(noise=1e-6, cases=2)
    bad = quick_report(noise=0.5, cases=2, seed=3, errors={1: "timeout"})
    bad["warnings"] = bad["warnings"] + ["device log had \x07 in it"]
    return good, bad


def _record(i: int, name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """A job's farm record as runner/farm/run.py makes it (one attempt)."""
    code = doc["summary"]["exit_code"]
    return {"job": name, "group": "pool:phones", "bundle": f"/b/{name}.bpte", "verdict": doc["summary"]["verdict"],
            "exit_code": code, "flaky": False,
            "attempts": [{"attempt": 1, "url": f"sim://emu-{i % 50}", "device": f"adb:emu-{i % 50}", "exit_code": code,
                          "verdict": doc["summary"]["verdict"], "error_kinds": [], "retried": False, "elapsed_s": 0.5123,
                          "submitted_unix": 1796465008.5117 + i, "node": {"host": "h"}, "run_id": f"{i:032x}"}],
            "report": f"/r/jobs/{name}/attempt-1/report.json", "history_id": i}


def _farm(jobs: Any) -> dict[str, Any]:
    return {"id": "f", "plan": "plan.toml", "executor": {"name": "ray"}, "retries": 2, "makespan_s": 1.5,
            "started_unix": 1.0, "jobs": jobs, "devices": [], "flaky_jobs": [], "flaky_devices": [],
            "results": {"history_batches": 1, "peak_backlog": 3}}


def _folded(tmp: Path, names: list[str], docs: list[dict[str, Any]], order: list[int]) -> tuple[Report, JobsMerge]:
    merge = JobsMerge(names, tmp / ".merged-cases.jsonl")
    for i in order:
        merge.add(names[i], Report.from_json(docs[i]), _record(i, names[i], docs[i]))
    merged = merge.report()
    merged.extras["farm"] = _farm(merge.records())
    return merged, merge


def test_streamed_outputs_equal_the_in_memory_merge(docs, tmp_path):
    """report.json (bytes), junit.xml (bytes), summary.md, the HTML and the `--json` document of the
    streamed merge are those of merge_reports over the same reports, folded in any order."""
    good, bad = docs
    names = ["j1", "j2", "j3", "j4", "j5"]
    order = [good, bad, good, good, bad]
    streamed, merge = _folded(tmp_path / "s", names, order, [3, 0, 4, 1, 2])
    whole = merge_reports([Report.from_json(d) for d in order], MergeOptions(jobs=True, names=names))
    whole.extras["farm"] = _farm([_record(i, n, d) for i, (n, d) in enumerate(zip(names, order))])
    streamed.run["id"] = whole.run["id"]  # a new id each merge
    assert isinstance(streamed.cases, SpooledCases) and len(streamed.extras["jobs"]) == 5
    assert streamed.to_json() == whole.to_json()
    assert [j["name"] for j in streamed.extras["jobs"]] == names and streamed.extras["jobs"][-1]["name"] == "j5"

    write_reports(whole, tmp_path / "whole", formats=("junit", "markdown", "json"))
    write_reports(streamed, tmp_path / "s", formats=("junit", "markdown", "json"))
    for name in ("report.json", "junit.xml", "summary.md"):  # report.json's `files` name each folder
        mine = (tmp_path / "s" / name).read_bytes().replace(str(tmp_path / "s").encode(), b"DIR")
        assert mine == (tmp_path / "whole" / name).read_bytes().replace(str(tmp_path / "whole").encode(), b"DIR"), name
    xml = (tmp_path / "s" / "junit.xml").read_text()
    assert xml.count("<testcase ") == 10 and xml.count("<testsuite ") == 5 and "<system-err>" in xml
    assert render_html(streamed, case_plots=False) == render_html(whole, case_plots=False)
    # `bundlerun farm --json`: encoded piece by piece from the spooled records (runner/commands/farm.py)
    doc = {"summary": streamed.summary.to_json(), "jobs": streamed.extras["farm"]["jobs"], "devices": []}
    pieces = "".join(json.JSONEncoder(indent=2, default=str).iterencode(doc))
    assert pieces == json.dumps({**doc, "jobs": whole.extras["farm"]["jobs"]}, indent=2, default=str)
    assert json.loads(pieces)["jobs"][1]["verdict"] == "FAIL"
    with pytest.raises(TypeError, match="cannot be changed"):
        streamed.extras["jobs"].append({})
    merge.discard()


def test_junit_streamed_equals_the_tree(docs):
    """junit.xml made one suite at a time is junit_bytes' file, with the regressions suite, the
    warnings on the last suite, and a method whose cases are apart (then built as a tree)."""
    good, bad = docs
    report = Report.from_json(bad)
    assert junit_streamed_bytes(report) == junit_bytes(report)
    report.regressions = [{"rule": "sqnr_drop", "where": "forward/out0", "message": "SQNR fell", "baseline": 40.0,
                           "current": 20.0, "limit": 3.0}]
    report.baseline = {"ref": "main", "run_id": "abc"}
    assert junit_streamed_bytes(report) == junit_bytes(report) and b"/regressions" in junit_bytes(report)
    merged = merge_reports([Report.from_json(d) for d in (good, bad, good)], MergeOptions(jobs=True, names=["a", "b", "c"]))
    merged.cases = [merged.cases[0], merged.cases[2], merged.cases[1]] + merged.cases[3:]  # a/forward apart
    assert junit_streamed_bytes(merged) == junit_bytes(merged)


def _peak_bytes(tmp: Path, n: int, doc: dict[str, Any]) -> int:
    """The peak traced memory of folding `n` jobs' reports and writing report.json, junit.xml and
    summary.md from them (the farm coordinator's path, runner/farm/run.py), over what it starts with."""
    names = [f"job{i:05d}@pool:phones" for i in range(n)]
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        merged, merge = _folded(tmp, names, [doc] * n, list(range(n)))
        write_reports(merged, tmp, formats=("junit", "markdown", "json"))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    merge.discard()
    assert json.loads((tmp / "report.json").read_text())["merged"]["reports"] == n
    return peak


def test_merge_and_writers_memory_does_not_grow_with_the_jobs(docs, tmp_path):
    """100 vs 1,000 jobs: the fold and the writers' peak grows by less than 1 KB a job (measured
    2026-12-05: ~230 B, the job names' index and the spools' offsets, and this test's own names).
    The code before the per-job sections were spooled held each job's entry, records, farm record and
    perf rows, JUnit's tree and summary.md's table of jobs until the files were written: 6.4 KB a job
    (200 -> 2,000 jobs: peak 2.2 -> 13.7 MB)."""
    good, _ = docs
    _peak_bytes(tmp_path / "warm", 10, good)  # lazy imports and caches, not counted
    small = _peak_bytes(tmp_path / "small", 100, good)
    large = _peak_bytes(tmp_path / "large", 1000, good)
    per_job = (large - small) / 900
    assert per_job < 1000, f"peak {small / 1e6:.2f} MB at 100 jobs, {large / 1e6:.2f} MB at 1,000: {per_job:.0f} B a job"


class _Stop(KeyboardInterrupt):
    """The Ctrl-C, raised by the spool's reader after some jobs were read."""


def test_interrupt_mid_stream_leaves_no_partial_report(docs, tmp_path, monkeypatch):
    """A Ctrl-C while report.json, junit.xml or summary.md streams from the spools: the file written before stays
    as it was (or there is none) and no temp file is left beside it."""
    good, bad = docs
    names = [f"j{i}" for i in range(8)]
    merged, merge = _folded(tmp_path, names, [good, bad] * 4, list(range(8)))
    real_get, real_dicts = JobSpool.get, SpooledCases.dicts
    calls = {"n": 0}

    def get(self: JobSpool, index: int) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] > 5:
            raise _Stop()
        return real_get(self, index)

    def dicts(self: SpooledCases):
        for n, case in enumerate(real_dicts(self)):
            if n == 7:
                raise _Stop()
            yield case

    monkeypatch.setattr(JobSpool, "get", get)
    with pytest.raises(_Stop):
        write_record(merged, tmp_path / "none")
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())
    monkeypatch.setattr(JobSpool, "get", real_get)
    (tmp_path / "out").mkdir()
    write_record(merged, tmp_path / "out")
    write_junit(merged, tmp_path / "out" / "junit.xml")
    write_markdown(merged, tmp_path / "out" / "summary.md")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    calls["n"] = 0
    monkeypatch.setattr(JobSpool, "get", get)
    with pytest.raises(_Stop):
        write_record(merged, tmp_path / "out")
    calls["n"] = 0
    with pytest.raises(_Stop):
        write_markdown(merged, tmp_path / "out" / "summary.md")  # its table of jobs, read from the spool
    monkeypatch.setattr(JobSpool, "get", real_get)
    monkeypatch.setattr(SpooledCases, "dicts", dicts)
    with pytest.raises(_Stop):
        write_junit(merged, tmp_path / "out" / "junit.xml")
    after = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert after == before, sorted(after)  # the same three files, nothing beside them
    assert json.loads(after["report.json"])["merged"]["reports"] == 8
    assert re.search(rb"</testsuites>$", after["junit.xml"])
    merge.discard()
