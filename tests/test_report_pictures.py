"""Pictures a person reads at a glance: the HTML report of a failing run and the HUD, in real
headless Chromium (tests/browser.py), plus the plots' colours and bounds checked on their pixels.

- the failing criterion and its threshold are within the first screen of the report; outputs
  come before performance; criteria print with 4 significant digits (the JSON keeps them whole);
- plot points are coloured by their own verdict, and the histogram's bound is judge_output's;
- a HUD cell names the failing output and criterion; a TIMEOUT / ERROR / stopped run shows its
  status in its own colour and no SQNR; the legend's boxes fit their text.

Screenshots go to tests/artifacts/ (git-ignored) for a person to look at.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import browser  # noqa: E402
import report_samples as rs  # noqa: E402

from bundlerun.runner.judging.failed_criterion import FailedCriterion
from bundlerun.bundles.manifest import Criteria  # noqa: E402
from bundlerun.runner.history import store as history  # noqa: E402
from bundlerun.runner.pictures import hud
from bundlerun.runner.pictures import plots
from bundlerun.runner.judging.numerics import elementwise_bound, judge_output  # noqa: E402
from bundlerun.runner.pictures.hud_page import cell_text, failure  # noqa: E402
from bundlerun.runner.judging.outcome import VERDICT_COLOURS  # noqa: E402
from bundlerun.runner.report.model import Report  # noqa: E402
from bundlerun.runner.writers import write_reports  # noqa: E402

ARTIFACTS = Path(__file__).parent / "artifacts"
SCALE = 0.001906464691273868  # an int8 output's quantization scale, as a lowered graph gives it
FLOOR_DB = 60.0


def _need_chromium() -> None:
    if browser.chromium_path() is None:
        pytest.fail("chromium is not installed (scripts/setup.sh installs it)")


def _rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return f"rgb({int(h[0:2], 16)}, {int(h[2:4], 16)}, {int(h[4:6], 16)})"


def _failing_report(tmp_path: Path):
    """A run whose output fails its SQNR floor (noise 3e-3: about 55 dB < 60 dB) on every case that
    ran, within its element-wise bound (qtol 2 x scale), with one case that timed out."""
    crit = Criteria(qtol=2, scale=SCALE, sqnr_min_db=FLOOR_DB)
    bundle = rs.make_bundle(cases=6, model="mlp-int8", dtype="int8", criteria=crit)
    bundle_path = rs.write_stub_bundle(bundle, tmp_path / "mlp.bpte")
    run = rs.target_run(bundle, noise=3e-3, seed=3, errors={5: "timeout"})
    return Report.from_json(rs.make_report(bundle, run, bundle_path)), bundle_path, rs.saved_outputs(run)


# ----------------------------------------------------------------------------- plots, on their pixels


def _pixels(png: bytes) -> np.ndarray:
    from matplotlib.image import imread

    return (imread(io.BytesIO(png))[..., :3] * 255).round().astype(np.int16)


def _has_colour(png: bytes, hex_colour: str, tol: int = 12) -> int:
    h = hex_colour.lstrip("#")
    want = np.array([int(h[i:i + 2], 16) for i in (0, 2, 4)])
    return int((np.abs(_pixels(png) - want).max(axis=-1) <= tol).sum())


PASS_C, FAIL_C, TIMEOUT_C = (VERDICT_COLOURS[v][0] for v in ("PASS", "FAIL", "TIMEOUT"))


def test_points_are_coloured_by_their_own_verdict():
    """A run whose points all pass has no FAIL colour in its scatter or SQNR strip (the old scatter
    drew every point red); failing points and the floor line bring it in."""
    rng = np.random.default_rng(0)
    e = rng.standard_normal(400)
    a = e + rng.uniform(-1e-3, 1e-3, e.shape)
    all_pass = plots.scatter(a, e, "t", np.ones(e.size, bool))
    assert _has_colour(all_pass, PASS_C) > 50 and _has_colour(all_pass, FAIL_C) == 0
    some_fail = plots.scatter(a, e, "t", np.arange(e.size) % 4 != 0)
    assert _has_colour(some_fail, FAIL_C) > 50 and _has_colour(some_fail, PASS_C) > 50
    strip = plots.case_strip([70.0, 71.0, 72.0], ["PASS"] * 3, "t", plots.SQNR_LABEL)
    assert _has_colour(strip, PASS_C) > 20 and _has_colour(strip, FAIL_C) == 0
    failing = plots.case_strip([70.0, 41.0, None], ["PASS", "FAIL", "TIMEOUT"], "t", plots.SQNR_LABEL, floor=60.0)
    assert _has_colour(failing, FAIL_C) > 100  # the failing point and the dashed floor across the plot
    assert _has_colour(failing, TIMEOUT_C) > 5  # the case that timed out: an x in its own colour


def test_histogram_bound_is_judge_outputs_bound():
    """The plot's bound and its within/over split are the judge's: the elements counted over the
    bound are exactly judge_output's mismatches, for atol, rtol, qtol x scale and text-rounding slack."""
    rng = np.random.default_rng(1)
    expected = rng.standard_normal(5000).astype(np.float32)
    actual = (expected + rng.normal(0, 4e-3, expected.shape)).astype(np.float32)
    for crit, lossy in ((Criteria(atol=5e-3), False), (Criteria(atol=1e-3, rtol=2e-3), False),
                        (Criteria(qtol=2, scale=SCALE), False), (Criteria(qtol=1, scale=SCALE, rtol=1e-3), True)):
        atol, rtol, checked = elementwise_bound(crit, "float32", lossy)
        verdict = judge_output(actual, expected, crit, "float32", "float32", lossy=lossy)
        over = int((~plots.within_bound(actual, expected, atol, rtol)).sum())
        assert checked and over == verdict.stats.mismatch_count and 0 < over < expected.size, (crit, over)
    png = plots.error_histogram(actual, expected, "t", (5e-3, 0.0))
    assert _has_colour(png, PASS_C) > 200 and _has_colour(png, FAIL_C) > 50  # within, over, and the bound lines
    assert _has_colour(plots.error_histogram(actual, expected, "t", (1.0, 0.0)), PASS_C) > 200
    assert not elementwise_bound(Criteria(sqnr_min_db=30.0), "float32")[2]  # no element-wise check: no bound


@pytest.mark.parametrize("value", [1e308, -1e308, float("nan"), "inf", "nan", None, True, "x" * 300, [1, 2], {"a": 1}])
def test_case_strip_takes_any_value_a_report_holds(value):
    """A hand-edited report's stats are drawn or left out, never a crash."""
    png = plots.case_strip([value, 50.0, value], ["PASS", "FAIL", "ERROR"], "t$x$", plots.SQNR_LABEL,
                           floor=value if isinstance(value, float) else 40.0)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- criteria in every view


def test_criteria_print_4_significant_digits_and_json_keeps_them_whole(tmp_path):
    from rich.console import Console

    from bundlerun.runner.report.console import print_summary

    report, bundle_path, outputs = _failing_report(tmp_path)
    files = write_reports(report, tmp_path / "out", bundle=bundle_path, outputs=outputs,
                          formats=("html", "junit", "markdown", "json"))
    console = Console(record=True, width=200)
    print_summary(report, console)
    views = {"html": files["html"].read_text(), "junit": files["junit"].read_text(),
             "markdown": files["markdown"].read_text(), "console": console.export_text()}
    for name, text in views.items():
        assert "0.0019064" not in text, name  # never 17 digits for people
    for name in ("html", "junit", "console"):
        assert "scale=0.001906" in views[name], name
    assert re.search(r"sqnr\\_min\\_db \d\d\.\d\d < 60 ", views["markdown"])  # failed: 4 digits measured, the floor
    stored = json.loads(files["json"].read_text())
    assert stored["cases"][0]["outputs"][0]["criteria"]["scale"] == SCALE  # full precision in the JSON


# ----------------------------------------------------------------------------- the report in Chromium

_REPORT_JS = """(() => {
  const box = el => { if (!el) return null; const r = el.getBoundingClientRect();
    return {text: el.textContent, top: r.top, bottom: r.bottom}; };
  const h2 = id => box(document.getElementById(id));
  return {
    viewport: innerHeight,
    criterion: box(document.querySelector('table.failed-criteria td.crit')),
    threshold: box(document.querySelector('table.failed-criteria td.threshold')),
    notRun: [...document.querySelectorAll('p.not-run .badge')].map(b => ({text: b.textContent,
      background: getComputedStyle(b).backgroundColor})),
    outputs: h2('outputs'), perf: h2('perf'),
    strip: box(document.querySelector('img[alt^="sqnr per case"]')),
    criteria: [...document.querySelectorAll('.criteria')].map(e => e.textContent),
    sqnrHeader: [...document.querySelectorAll('th')].map(t => t.textContent).filter(t => t.includes('SQNR')),
  };
})()"""


def test_failing_report_shows_its_criterion_and_threshold_above_the_fold(tmp_path):
    _need_chromium()
    report, bundle_path, outputs = _failing_report(tmp_path)
    assert report.summary.verdict == "FAIL"
    files = write_reports(report, tmp_path / "out", bundle=bundle_path, outputs=outputs, formats=("html",))
    ARTIFACTS.mkdir(exist_ok=True)
    check = browser.check_page(files["html"].resolve().as_uri(), ARTIFACTS / "failing_run_report.png",
                               evaluate=_REPORT_JS, viewport=ARTIFACTS / "failing_run_first_screen.png")
    assert check.console_errors == []
    dom = check.evaluated
    # The failing criterion and its threshold, on the first screen.
    assert dom["criterion"]["text"] == "sqnr_min_db"
    assert dom["threshold"]["text"] == f"≥ {FLOOR_DB:g} dB"
    assert dom["criterion"]["bottom"] <= dom["viewport"] and dom["threshold"]["bottom"] <= dom["viewport"]
    # The case that timed out is named, in the TIMEOUT colour.
    assert dom["notRun"] == [{"text": "TIMEOUT", "background": _rgb(VERDICT_COLOURS["TIMEOUT"][0])}]
    # What was judged comes before performance; the SQNR strip (with the floor) is among the outputs.
    assert dom["perf"] is not None and dom["outputs"]["top"] < dom["strip"]["top"] < dom["perf"]["top"]
    # Criteria printed with 4 significant digits; SQNR says whose norm is the signal.
    assert dom["criteria"] and all("scale=0.001906," in c and "0.0019064" not in c for c in dom["criteria"])
    assert dom["sqnrHeader"] == ["SQNR (dB, signal = reference)"]
    assert all(i["complete"] and i["naturalWidth"] > 100 for i in check.images)
    assert {"sqnr per case forward/out0", "error histogram forward/out0", "scatter forward/out0"} <= \
        {i["alt"] for i in check.images}
    # every element is within its bound, but the cases failed their SQNR floor: the scatter shows cases
    page = files["html"].read_text()
    assert "actual vs expected, each point in its case&#x27;s verdict&#x27;s colour" in page


# ----------------------------------------------------------------------------- the HUD in Chromium

_HUD_JS = """(() => {
  const cells = {};
  for (const tr of document.querySelectorAll('tr.row')) {
    const name = tr.querySelector('th.nm, td.nm').firstChild.textContent;
    cells[name] = [...tr.querySelectorAll('td.c')].map(td => ({text: td.textContent, cls: td.className,
      background: getComputedStyle(td).backgroundColor}));
    cells[name + ':spark'] = tr.querySelector('svg.spark').getAttribute('aria-label');
  }
  const fits = [...document.querySelectorAll('.legend span')].map(s => {
    const r = s.getBoundingClientRect(), cs = getComputedStyle(s);
    const inset = cs.outlineStyle !== 'none' ? Math.max(0, -parseFloat(cs.outlineOffset)) : 0;
    const range = document.createRange(); range.selectNodeContents(s); const t = range.getBoundingClientRect();
    return {text: s.textContent, inside: t.left >= r.left + inset && t.right <= r.right - inset &&
      t.top >= r.top + inset && t.bottom <= r.bottom - inset};
  });
  const legend = {};
  for (const s of document.querySelectorAll('.legend span')) legend[s.textContent] = getComputedStyle(s).backgroundColor;
  return {cells, fits, legend};
})()"""


@pytest.fixture(scope="module")
def hud_db(tmp_path_factory):
    """Four rows over four commits: an SQNR floor that fails at c3, a run that timed out on two of
    its three cases at c2, a crash at c3, and a run stopped by Ctrl-C at c3."""
    root = tmp_path_factory.mktemp("hud-pictures")
    db = root / "history.sqlite"
    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    crit = Criteria(sqnr_min_db=FLOOR_DB, qtol=2, scale=SCALE)
    plans = {"sqnr-net": {3: ("fail", None)}, "slow-net": {2: ("ok", {1: "timeout", 2: "timeout"})},
             "crash-net": {3: ("ok", {0: "error"})}, "stop-net": {3: ("stop", None)}}
    for i, label in enumerate(["c0", "c1", "c2", "c3"]):
        for model, plan in plans.items():
            kind, errors = plan.get(i, ("ok", None))
            bundle = rs.make_bundle(cases=3, model=model, criteria=crit, seed=1)
            run = rs.target_run(bundle, noise=3e-3 if kind == "fail" else 1e-5, seed=i, errors=errors)
            report = rs.make_report(bundle, run, label=label, started=(t0 + dt.timedelta(days=i)).isoformat())
            if kind == "stop":  # what session.py records for a run stopped by Ctrl-C
                report["summary"].update(exit_code=130, interrupted=True)
            history.record_report(db, Report.from_json(report))
    return root, db


def test_hud_cells_name_the_failure_and_show_no_partial_numbers(hud_db):
    _need_chromium()
    root, db = hud_db
    index, grid = hud.write_site(db, root / "site")
    ARTIFACTS.mkdir(exist_ok=True)
    check = browser.check_page(index.as_uri(), ARTIFACTS / "hud_cells.png", evaluate=_HUD_JS,
                               viewport=ARTIFACTS / "hud_first_screen.png")
    assert check.console_errors == []
    cells = check.evaluated["cells"]
    light = {v: _rgb(c[1]) for v, c in VERDICT_COLOURS.items()}
    fail = cells["sqnr-net"][3]
    assert fail["text"].startswith("FAIL out0 sqnr") and "FAIL" in fail["cls"].split()
    slow = cells["slow-net"][2]  # timed out on 2 of 3 cases: its status, its colour, no SQNR
    assert slow["text"] == "TIMEOUT" and slow["background"] == light["TIMEOUT"]
    assert slow["background"] != light["ERROR"]
    crash = cells["crash-net"][3]
    assert crash["text"] == "ERROR" and crash["background"] == light["ERROR"]
    # a run stopped by Ctrl-C is no data point (runner/pictures/hud_grid.py): no cell, no number, counted in the header
    stopped = cells["stop-net"][3]
    assert stopped["text"] == "" and grid.interrupted == 1
    assert "1 interrupted run(s) left out" in index.read_text()
    for cell in (slow, crash, stopped):
        assert not re.search(r"\d", cell["text"]), cell
    for name in ("sqnr-net", "slow-net", "crash-net", "stop-net"):
        assert all(re.fullmatch(r"\d+\.\d", c["text"]) for c in cells[name][:2]), cells[name]  # PASS: the SQNR
    # the sparkline draws only the runs that completed (slow-net: 3 of its 4 columns)
    assert cells["slow-net:spark"].endswith("over 3 column(s)") and cells["sqnr-net:spark"].endswith("over 4 column(s)")
    assert "SQNR (dB, signal = reference)" in cells["sqnr-net:spark"]
    # every verdict has its own legend colour, the one the cells use; every legend box fits its text
    legend = check.evaluated["legend"]
    assert legend["TIMEOUT"] == light["TIMEOUT"] and len({legend[k] for k in ("PASS", "ERROR", "TIMEOUT", "SKIP")}) == 4
    assert [f["text"] for f in check.evaluated["fits"] if not f["inside"]] == []
    assert any(f["text"].startswith("flaky numerics") for f in check.evaluated["fits"])
    # a failing run's page (a click on its cell) has the SQNR per case with the floor; a passing one none
    rows = {r.model: r for r in grid.rows}
    failing_page = (root / "site" / "runs" / f"{rows['sqnr-net'].cells['c3'].run.id}.html").read_text()
    passing_page = (root / "site" / "runs" / f"{rows['sqnr-net'].cells['c0'].run.id}.html").read_text()
    assert 'alt="sqnr per case forward/out0"' in failing_page and "<td class='l crit'>sqnr_min_db</td>" in failing_page
    assert 'alt="sqnr per case' not in passing_page


@pytest.mark.parametrize("criteria", ["", "not json", "[1, 2]", '{"a": 1}', '[{"criterion": null}]',
                                      json.dumps([{"criterion": "<script>x</script>\x1b[2J" * 20}]), "\ud800"])
def test_hud_failure_text_takes_any_stored_value(criteria):
    """The failed criteria come from the history database: anything there gives text, never a crash
    (the page escapes it as every database value)."""
    from bundlerun.runner.history.store import RunRecord
    from bundlerun.runner.pictures.hud_grid import Cell

    from dataclasses import fields

    run = RunRecord(**{**{f.name: None for f in fields(RunRecord)}, "id": 1, "run_uuid": "u", "verdict": "FAIL",
                       "exit_code": 1})
    cell = Cell(run, 1, "sqnr", 12.0, extra={"fail_output": "out0", "fail_criteria": criteria, "failing_outputs": "x"})
    assert isinstance(failure(cell), str) and cell_text(cell).startswith("FAIL out0")


def test_a_run_that_timed_out_is_shown_as_timeout_not_error(tmp_path):
    """The run's verdict is ERROR (exit 2: could not run); the page's badge says what happened,
    TIMEOUT in TIMEOUT's colour, and names the verdict beside it."""
    from bundlerun.runner.judging.outcome import run_status

    report = Report.from_json(rs.quick_report(noise=1e-5, errors={1: "timeout", 2: "timeout"}))
    assert report.summary.verdict == "ERROR"
    page = write_reports(report, tmp_path, formats=("html",))["html"].read_text()
    h1 = re.search(r"<h1>.*?</h1>", page).group()
    assert "<span class='badge TIMEOUT'>TIMEOUT</span>" in h1 and "(verdict ERROR, exit code 2)" in h1
    assert f".TIMEOUT{{background:{VERDICT_COLOURS['TIMEOUT'][0]}}}" in page
    mixed = Report.from_json(rs.quick_report(noise=1e-5, errors={1: "timeout", 2: "error"}))
    assert "<span class='badge ERROR'>ERROR</span>" in write_reports(mixed, tmp_path / "m", formats=("html",))["html"].read_text()
    assert run_status("ERROR", 2, "3", None) == "ERROR" and run_status("ERROR", 2, True, 0) == "ERROR"
    assert run_status("PASS", 130) == run_status("FAIL", 143) == "STOPPED" and run_status("bogus", 0) == "ERROR"


def test_hostile_reports_render_in_every_view(tmp_path):
    """Seeded mutations of a failing run's report.json (tests/security_fuzz.py: values of the wrong
    type, deleted keys, cut lists) that the report reader accepts render in the HTML report (with
    its arrays: bound, strips, histogram, scatter), summary.md, junit.xml and the console: never an
    exception. A mutation the reader refuses is its own one-line error (tests/test_security_readers.py)."""
    import random

    from rich.console import Console

    from security_fuzz import mutate_json

    from bundlerun.runner.report.console import print_summary
    from bundlerun.runner.report.model import ReportError
    from bundlerun.runner.writers.html import render_html
    from bundlerun.runner.writers.junit import write_junit
    from bundlerun.runner.writers.markdown import render_markdown

    report, bundle_path, outputs = _failing_report(tmp_path)
    from bundlerun.bundles.bpte import read_bundle

    bundle = read_bundle(bundle_path)
    doc = report.to_json()
    rng = random.Random(32)
    rendered = 0
    for i in range(40):
        cases, done = mutate_json(doc["cases"], rng, edits=1)  # the cases: what the pictures are drawn from
        mutated = {**doc, "cases": cases}
        try:
            hostile = Report.from_json(mutated)
        except ReportError:
            continue
        try:
            render_html(hostile, bundle, outputs)
            render_markdown(hostile)
            write_junit(hostile, tmp_path / f"j{i}.xml")
            print_summary(hostile, Console(file=io.StringIO(), width=200))
        except Exception as exc:  # noqa: BLE001 - the test reports which mutation broke which view
            raise AssertionError(f"mutation {done}: {type(exc).__name__}: {exc}") from exc
        rendered += 1
    assert rendered >= 15  # enough of them got past the reader to exercise the views


def test_four_digits_never_mislead_and_cosine_floor_is_drawn(tmp_path):
    """4 significant digits, more only where 4 would mislead (a cosine floor of 0.99999 is not `1`;
    a measured value is never printed equal to the limit it missed); a cosine criterion gets its
    own per-case strip with its floor."""
    from bundlerun.runner.report.criteria_text import criteria_items, failed_text, number

    assert number(SCALE) == "0.001906" and number(0.99999) == "0.99999" and number(60.0) == "60"
    assert failed_text(FailedCriterion("sqnr_min_db", 59.99995, 60.0)) == "sqnr_min_db 59.9999 < 60"
    assert failed_text(FailedCriterion("cosine_min", 0.999981, 0.99999)) == \
        "cosine_min 0.99998 < 0.99999"
    assert criteria_items({"atol": 1e-3, "scale": SCALE, "exact": False, "trail": {"a": []}}) == \
        ["atol=0.001", "scale=0.001906"]
    bundle = rs.make_bundle(cases=3, criteria=Criteria(cosine_min=0.9999999))
    report = Report.from_json(rs.make_report(bundle, rs.target_run(bundle, noise=1e-2)))
    page = write_reports(report, tmp_path, formats=("html",))["html"].read_text()
    assert 'alt="cosine per case forward/out0"' in page
    assert "<td class='l crit'>cosine_min</td>" in page and "≥ 0.9999999</td>" in page
