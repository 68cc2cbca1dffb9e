"""report.json read into the typed records and written back is the same bytes: the typed verdicts,
case statuses, failure and perf kinds (str-valued enums) change nothing a user or a reader sees.

tests/data/reports/ holds real report.json files written by `bundlerun run` on host://xnnpack
(mlp int8, 4 cases; one judged with tightened criteria: FAIL with failed criteria and statistics;
one run on tosa://int, which cannot run it: ERROR with a failure kind and no statistics)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundlerun.runner.report.model import Report, read_report
from bundlerun.runner.report.record import write_report
from bundlerun.targets.base import CaseStatus, PerfKind, Verdict
from bundlerun.targets.failures import FailureKind
from tests.report_samples import quick_report

REPORTS = sorted((Path(__file__).parent / "data" / "reports").glob("*.json"))


@pytest.mark.parametrize("path", REPORTS, ids=[p.stem for p in REPORTS])
def test_a_real_report_round_trips_byte_identically(path, tmp_path):
    written = write_report(read_report(path), tmp_path)
    assert written.read_bytes() == path.read_bytes()


def test_the_sample_reports_are_what_they_claim():
    assert len(REPORTS) == 2  # a FAIL and an ERROR: both round-trip tests above ran on something
    fail, error = (read_report(p) for p in (REPORTS[1], REPORTS[0]))
    assert fail.summary.verdict is Verdict.FAIL and {c.verdict for c in fail.cases} == {Verdict.FAIL}
    assert all(o.failed and o.stats for c in fail.cases for o in c.outputs)
    assert error.summary.verdict is Verdict.ERROR and {c.status for c in error.cases} == {CaseStatus.ERROR}
    assert {c.error_kind for c in error.cases} == {FailureKind.MISSING_BACKEND}


def test_records_hold_members_and_serialise_as_the_strings(tmp_path):
    report = Report.from_json(quick_report(errors={1: "timeout", 2: "skip"}))
    case = report.cases[0]
    assert type(case.verdict) is Verdict and type(case.status) is CaseStatus
    assert type(case.outputs[0].verdict) is Verdict and type(report.summary.verdict) is Verdict
    assert [c.status for c in report.cases[1:3]] == [CaseStatus.TIMEOUT, CaseStatus.SKIP]
    assert all(type(f.kind) is PerfKind for c in report.cases for f in c.perf)
    text = write_report(report, tmp_path).read_text()
    assert '"verdict": "PASS"' in text and '"status": "timeout"' in text and "Verdict." not in text
    again = write_report(read_report(tmp_path), tmp_path / "again").read_text()
    assert again == text


@pytest.mark.parametrize("enum_type", [Verdict, CaseStatus, PerfKind, FailureKind])
def test_members_equal_hash_and_format_as_their_values(enum_type):
    for member in enum_type:
        assert member == member.value and hash(member) == hash(member.value)
        assert f"{member}" == str(member) == member.value
        assert json.dumps({member: [member]}) == json.dumps({member.value: [member.value]})
