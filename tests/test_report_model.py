"""The typed report: what is written is what every reader accepts; old reports still read;
anything else is a one-line error. Uses report_samples (a real judge over a real bundle)."""

from __future__ import annotations

import copy
import json

import pytest

from bundlerun.runner.judging.failed_criterion import FailedCriterion
from bundlerun.runner.report.model import SCHEMA, Report, ReportError, read_report
from bundlerun.targets.failures import FailureKind
from tests.report_samples import quick_report


def test_round_trip_keeps_every_field():
    data = quick_report(errors={1: "error"})
    data["regressions"] = []
    report = Report.from_json(data)
    assert report.cases[1].error_kind is FailureKind.CRASH and report.cases[1].verdict == "ERROR"
    back = report.to_json()
    assert back["schema"] == SCHEMA and back["regressions"] == []
    again = Report.from_json(json.loads(json.dumps(back))).to_json()
    assert again == back


def test_schema_1_reports_read_with_their_free_text_kinds_mapped(tmp_path):
    old = quick_report(errors={0: "error"})
    old["schema"] = "bundlerun.report/1"
    old["cases"][0]["error_kind"] = "wrong-size-output"
    old["cases"][1]["error_kind"] = "hang"
    (tmp_path / "report.json").write_text(json.dumps(old))
    report = read_report(tmp_path)
    assert report.schema == SCHEMA
    assert report.cases[0].error_kind is FailureKind.WRONG_OUTPUT_SIZE
    assert report.cases[1].error_kind is FailureKind.HOST_TIMEOUT


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r.clear(), "schema None"),
    (lambda r: r.update(schema="other/1"), "schema 'other/1'"),
    # the strict reader (runner/report/check.py) names the field's path
    (lambda r: r.update(summary=[]), "summary: expected an object, got a list"),
    (lambda r: r["summary"].pop("verdict"), "summary: no 'verdict'"),
    (lambda r: r["cases"][0].update(verdict="MAYBE"), r"cases\[0\]\.verdict: expected one of .* 'MAYBE'"),
    (lambda r: r["cases"][0]["outputs"][0].update(verdict="OK"), r"cases\[0\]\.outputs\[0\]\.verdict: .* 'OK'"),
    (lambda r: r["cases"][0].pop("method"), r"cases\[0\]: no 'method'"),
])
def test_malformed_reports_are_one_line_errors(mutate, needle, tmp_path):
    data = copy.deepcopy(quick_report())
    mutate(data)
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(ReportError, match=needle) as err:
        read_report(tmp_path / "report.json")
    assert str(err.value).startswith(str(tmp_path / "report.json")) and "\n" not in str(err.value)  # names the file


def test_unreadable_files_are_one_line_errors(tmp_path):
    with pytest.raises(ReportError, match="no report at"):
        read_report(tmp_path)
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(ReportError, match="not a JSON report"):
        read_report(tmp_path)
    (tmp_path / "report.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ReportError):
        read_report(tmp_path)


def test_text_from_a_bundle_is_inert_in_console_and_markdown():
    """A hostile model id / output name / error (rich markup, Markdown, a terminal escape)."""
    import io

    from rich.console import Console

    from bundlerun.runner.writers.markdown import render_markdown
    from bundlerun.runner.report.console import print_summary

    data = quick_report(errors={0: "error"})
    evil = "[/x] [bold]|x| <b>`\x1b[2J \x9b2J \ud800"  # a one-byte C1 CSI and a lone surrogate too
    data["bundle"]["model"] = evil
    data["cases"][0]["error"] = evil
    data["cases"][1]["outputs"][0]["name"] = evil
    data["warnings"] = [evil]
    buf = io.StringIO()
    print_summary(Report.from_json(data), Console(file=buf, width=300, color_system=None))
    text = buf.getvalue()
    assert "\x1b" not in text and "[/x] [bold]|x|" in text and "\\x1b[2J" in text
    assert "\x9b" not in text and "\ud800" not in text and "\\x9b2J" in text and "\\ud800" in text
    report = Report.from_json(data)
    md = render_markdown(report)
    assert "\x1b" not in md and "<b>" not in md and "\\[/x\\]" in md and "\\|x\\|" in md
    floor = FailedCriterion("sqnr_min_db", 45.35, 48.0)
    report.cases[2].outputs[0].verdict, report.cases[2].outputs[0].failed = "FAIL", [floor]
    assert "45.35 < 48" in render_markdown(report)


def test_the_checks_fast_path_passes_only_what_the_checks_pass():
    # runner/report/check.py fields(): a value _PASSES lets through skips its check; each such value must be one
    # the check itself passes (and a trail the fast loop of _criteria passes, one its full loop passes)
    import random

    from bundlerun.runner.report import check

    rng = random.Random(0)
    values = [None, "", "x", "x" * (check.MAX_TEXT + 1), 0.0, -1.5, float("nan"), float("inf"), 0, 7, -1, 2**63,
              2**63 - 1, 10**400, True, False, [], {}, "nan", "inf", b"x", 1j, [1.0], {"a": 1}]
    for fast_check, passes in check._PASSES.items():
        for value in values:
            if passes(value):
                fast_check(value, "p")  # raises if the fast path let through what the check refuses
    for _ in range(300):
        entries = [rng.choice([{"source": rng.choice(values), "file": rng.choice(values)}, None, "s", 3])
                   for _ in range(rng.randint(0, 3))]
        trail = {"atol": rng.choice([entries, None, "x", entries * 2])}
        crit = {"trail": trail, "atol": rng.choice(values)}
        try:
            check._criteria(crit, "c")
            fast = None
        except check.ReportCheckError as exc:
            fast = str(exc)
        slow = None  # the same criteria through the full loop only (the fast loop switched off)
        saved = check._text_passes
        check._text_passes = lambda v: False
        try:
            check._criteria(crit, "c")
        except check.ReportCheckError as exc:
            slow = str(exc)
        finally:
            check._text_passes = saved
        assert fast == slow, (crit, fast, slow)
