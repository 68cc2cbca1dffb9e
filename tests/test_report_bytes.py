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


def _with_output(path: Path, **changes) -> dict:
    data = json.loads(path.read_text())
    out = data["cases"][0]["outputs"][0]
    out.update(changes)
    return data


@pytest.mark.parametrize("changes", [
    {"criteria": {"atol": 0.001}},  # partial: the other rules absent, not written at their defaults
    {"criteria": {"rtol": 0.01, "atol": 0.5, "top1": False, "vendor_rule": "x"}},  # order, a default, an unknown key
    {"stats": {"error_max": "inf", "SNR": 12.5, "sqnr": None}},  # a suite import: partial stats, a foreign key
    {"stats": {"reference_stats": {"numel": 4}, "actual_stats": None, "error_mae": 0, "extra_metric": [1, 2]}},
    {"failed": [{"criterion": "sqnr_min_db", "detail": "too noisy"}, {"detail": "only a detail", "x": 1}]},
])
def test_partial_and_foreign_sub_records_round_trip_byte_identically(changes, tmp_path):
    data = _with_output(REPORTS[1], **changes)
    source = tmp_path / "in" / "report.json"
    source.parent.mkdir()
    text = write_report(Report.from_json(data), source.parent).read_text()
    assert json.loads(text)["cases"][0]["outputs"][0] == {**data["cases"][0]["outputs"][0]}
    assert list(json.loads(text)["cases"][0]["outputs"][0]) == list(data["cases"][0]["outputs"][0])
    again = write_report(read_report(source), tmp_path / "again").read_text()
    assert again == text


def test_the_sub_records_are_typed_and_a_change_is_written(tmp_path):
    from bundlerun.bundles.manifest import Criteria
    from bundlerun.runner.judging.error_stats import OutputStats
    from bundlerun.runner.judging.failed_criterion import FailedCriterion

    data = _with_output(REPORTS[1], criteria={"atol": 0.001}, failed=[{"criterion": "atol", "detail": "d"}])
    out = Report.from_json(data).cases[0].outputs[0]
    assert isinstance(out.criteria, Criteria) and out.criteria.atol == 0.001 and out.criteria.rtol is None
    assert isinstance(out.stats, OutputStats) and isinstance(out.failed[0], FailedCriterion)
    assert out.failed[0].measured is None and out.failed[0].detail == "d"
    out.criteria.rtol = 0.5  # set after reading: written after the keys read
    assert list(out.to_json()["criteria"].items()) == [("atol", 0.001), ("rtol", 0.5)]


_VALUES = [None, 0, -1, 2.5, True, "inf", "nan", "x\x1b[2J", [], [1, 2], {}, {"a": 1}, {"numel": "7"}]
_KEYS = ["atol", "rtol", "exact", "trail", "sqnr", "error_max", "reference_stats", "actual_stats", "worst_index",
         "criterion", "measured", "limit", "detail", "numel", "unknown", "SNR"]


def test_hostile_sub_records_are_refused_in_one_line_or_round_trip(tmp_path):
    """Generated criteria/stats/failed objects: a ReportError, or a report that reads, renders in every
    view and writes back byte-identical (never an uncaught exception)."""
    import io
    import random

    from rich.console import Console

    from bundlerun.runner.report.console import print_summary
    from bundlerun.runner.report.model import ReportError
    from bundlerun.runner.writers.junit import failure_text
    from bundlerun.runner.writers.markdown import render_markdown

    rng = random.Random(34)
    base = json.loads(REPORTS[1].read_text())
    outcomes = {"refused": 0, "kept": 0}
    for i in range(150):
        data = json.loads(json.dumps(base))
        out = data["cases"][0]["outputs"][0]
        for field_name in rng.sample(["criteria", "stats", "failed"], rng.randint(1, 3)):
            obj = {k: rng.choice(_VALUES) for k in rng.sample(_KEYS, rng.randint(0, 6))}
            out[field_name] = [obj] if field_name == "failed" else obj
        try:
            report = Report.from_json(data)
        except ReportError as exc:
            assert "\n" not in str(exc)
            outcomes["refused"] += 1
            continue
        outcomes["kept"] += 1
        print_summary(report, Console(file=io.StringIO(), width=200, color_system=None))
        render_markdown(report)
        failure_text(report.cases[0].outputs[0])
        written = write_report(report, tmp_path / str(i)).read_text()
        assert json.loads(written)["cases"][0]["outputs"][0] == out
        assert write_report(read_report(tmp_path / str(i)), tmp_path / f"{i}b").read_text() == written
    assert outcomes["refused"] and outcomes["kept"]  # both paths ran


def test_report_text_is_indented_with_each_case_on_one_line():
    # record._report_text: the document as json.dumps(indent=2) lays it out, except each case record, which
    # is on one line (json's C encoder); it must read back as the sanitised document, whatever the strings hold
    import copy

    from bundlerun.runner.report.record import _CASES_HERE, _json_default, _report_text, _sanitize

    base = json.loads(REPORTS[1].read_text())  # FAIL: 4 cases whose outputs carry real trails

    def check(data):
        before = copy.deepcopy(data)
        text = _report_text(data)
        assert json.loads(text) == json.loads(json.dumps(_sanitize(data), default=_json_default))
        assert json.dumps(data, default=str) == json.dumps(before, default=str)  # not changed in place
        return text

    data = copy.deepcopy(base)
    data["cases"] = [copy.deepcopy(c) for c in base["cases"] * 10]
    data["cases"][5]["outputs"][0]["stats"] = {"max_abs_err": float("nan"), "ulp": float("inf")}  # sanitised
    data["cases"][6]["error"] = "two\nlines and a \"quote\""
    text = check(data)
    lines = text.splitlines()
    start = lines.index('  "cases": [')
    assert len(lines[start + 1:start + 41]) == 40 and lines[start + 41] in ("  ]", "  ],")
    assert all(line.startswith("    {") and json.loads(line.rstrip(",")) for line in lines[start + 1:start + 41])
    indented = json.dumps(_sanitize(data), indent=2, default=_json_default)
    assert text.split('"cases": [')[0] == indented.split('"cases": [')[0]  # the rest as indent=2 lays it out
    assert text.split("\n  ]")[-1] == indented.split("\n  ]")[-1]
    assert '"max_abs_err": "nan"' in text and '"ulp": "inf"' in text
    shared = data["cases"][0]["outputs"][0]["criteria"]["trail"]
    for case in data["cases"][:20]:  # one trail object in many outputs (as judged in-process): encoded once
        case["outputs"][0]["criteria"]["trail"] = shared
    data["cases"][9]["outputs"][0]["criteria"]["trail"] = {"atol": [{"source": "\x00bundlerun: a criteria trail\x00"}]}
    check(data)
    data["cases"][7]["error"] = _CASES_HERE  # the marker inside a case's string: still a line each
    assert check(data).count('\n    {"method": ') == 40
    data["warnings"] = [_CASES_HERE + "0"]  # the cases' own marker around them: the whole document indented
    assert check(data) == json.dumps(_sanitize(data), indent=2, default=_json_default)
    assert check({**data, "cases": []}) == json.dumps({**data, "cases": []}, indent=2, default=_json_default)
    # an LLM report's sequences: each step on one line too, at its own depth; the rest indented
    steps = [{"step": i, "kind": "decode", "sqnr": 40.0 + i, "verdict": "PASS", "note": "a \"quoted\"\nline"}
             for i in range(5)]
    data = {**copy.deepcopy(base), "sequences": [{"name": "s0", "steps": steps, "verdict": "PASS"},
                                                 {"name": "s1", "steps": [], "verdict": "PASS"}]}
    text = check(data)
    lines = text.splitlines()
    start = lines.index('      "steps": [')
    assert [json.loads(line.rstrip(",")) for line in lines[start + 1:start + 6]] == steps
    assert all(line.startswith('        {"step": ') for line in lines[start + 1:start + 6])
    assert lines[start + 6] == "      ],"
    assert '"steps": [],' in text  # an empty list stays as indent=2 writes it


def test_output_stats_to_dict_is_what_asdict_gave():
    # stats_records.OutputStats.to_dict copies its fields directly: the dict must be _clean(asdict(stats))
    # for every kind of value a field can hold (non-finite floats as strings, numpy scalars, lists, tuples)
    import random
    from dataclasses import asdict

    import numpy as np

    from bundlerun.runner.judging.stats_records import OutputStats, TensorStats, _clean

    rng = random.Random(0)
    values = [None, 0, -3, 1.5, float("nan"), float("inf"), float("-inf"), np.float64(2.5), np.float32(1.25),
              np.int64(7), [1, 2], (3, 4), {"a": [float("nan")]}, "x", True]
    for _ in range(500):
        tensors = [TensorStats([rng.randint(1, 9)] * rng.randint(0, 3), *(rng.choice(values) for _ in range(5)))
                   for _ in range(2)]
        stats = OutputStats(*tensors, **{k: rng.choice(values) for k in ("error_l2_norm", "sqnr", "worst_index",
                                                                         "worst_actual", "error_max_steps")})
        got, want = stats.to_dict(), _clean(asdict(stats))
        assert repr(got) == repr(want) and got is not stats.to_dict()
        assert got["reference_stats"]["shape"] is not stats.reference_stats.shape  # a copy, as asdict's
