"""The accuracy HUD: grid, regressions and culprits from a real history database, the CLI, and
the page in real headless Chromium.

The history is written through runner.history.store.record_report with reports made by the real
judge (tests/report_samples.py): 7 rows x 11 labels, > 50 runs, with a planted SQNR
regression, a PASS -> FAIL flip, a top-1 drop, a transient blip, an infrastructure error, and
a hostile model id and label.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re

import pytest

from bundlerun.runner.history import store as history
from bundlerun.runner.pictures import hud
from bundlerun.runner.report.model import Report
from browser import check_page
from report_samples import make_bundle, make_report, target_run

LABELS = [f"c{i:02d}" for i in range(11)]
HOSTILE_LABEL = "c05<img src=x onerror=\"document.title='pwned'\">"
LABELS[5] = HOSTILE_LABEL
HOSTILE_MODEL = "<script>document.title='pwned';throw new Error('pwned')</script>\x1b[31m\"'&"


def _noise(model: str, target: str, dtype: str, i: int) -> tuple[float, dict | None]:
    """(noise amplitude, case errors) of label i for one row: the planted history."""
    if (model, target, dtype) == ("mlp", "host://xnnpack", "fp32"):
        if i == 3:
            return 3e-4, None  # a blip that recovers at c04: red, but not the culprit
        return (3e-4 if i >= 7 else 1e-6), None  # SQNR drops by ~50 dB from c07 on: culprit c07
    if model == "tiny-cnn":
        return (1e-1 if i >= 9 else 1e-5), None  # FAIL from c09 on (atol 1e-3): culprit c09
    if (model, target, dtype) == ("mlp", "tosa://int", "int8") and i == 10:
        return 1e-5, {0: "error"}  # an infrastructure error: never called a regression
    return 1e-5, None


def _dataset(i: int) -> dict:
    top1 = 0.92 if i < 8 else 0.84  # top-1 falls 8 points at c08
    return {"name": "digits", "samples": 500, "top1": top1, "top5": 0.99, "reference_top1": 0.93,
            "reference_top5": 0.99, "top1_diff": top1 - 0.93, "top1_diff_ci": [top1 - 0.95, top1 - 0.91],
            "agreement": 0.97}


ROWS = [("mlp", "host://xnnpack", "fp32"), ("mlp", "host://xnnpack", "int8"), ("mlp", "tosa://int", "fp32"),
        ("mlp", "tosa://int", "int8"), ("tiny-cnn", "host://xnnpack", "fp32"), ("digits", "host://xnnpack", "fp32"),
        (HOSTILE_MODEL, "host://xnnpack", "fp32")]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    root = tmp_path_factory.mktemp("hud")
    path = root / "history.sqlite"
    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    cells = 0
    for i, label in enumerate(LABELS):
        started = (t0 + dt.timedelta(days=i)).isoformat()
        for model, target, dtype in ROWS:
            if model == HOSTILE_MODEL and i % 4:
                continue  # present under c00, c04, c08 only
            bundle = make_bundle(cases=3, model=model, dtype=dtype, seed=ROWS.index((model, target, dtype)))
            noise, errors = _noise(model, target, dtype, i)
            run = target_run(bundle, noise=noise, seed=i, errors=errors)
            run.target = target
            dataset = _dataset(i) if model == "digits" else None
            report = make_report(bundle, run, label=label, dataset=dataset, started=started)
            report_dir = root / "reports" / f"{i}-{ROWS.index((model, target, dtype))}"
            report_dir.mkdir(parents=True)
            (report_dir / "report.json").write_text(json.dumps(report))
            if i == 0:
                (report_dir / "report.html").write_text("<html><body>original</body></html>")
            history.record_report(path, Report.from_json(report), report_dir / "report.json")
            cells += 1
        if i == 2:  # a second run under c02 for one row: the cell shows the latest of 2
            bundle = make_bundle(cases=3, model="mlp", dtype="int8", seed=1)
            run = target_run(bundle, noise=1e-5, seed=99)
            history.record_report(path, Report.from_json(make_report(bundle, run, label=label, started=started)))
    return {"path": path, "cells": cells, "runs": cells + 1, "root": root}


def _tags(page: str) -> list[tuple[str, list[str]]]:
    """Every element and its attribute names, as a browser's tokenizer sees them."""
    from html.parser import HTMLParser

    found = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, [a for a, _ in attrs]))

    P().feed(page)
    return found


def _row(grid, model, target="host://xnnpack", dtype="fp32"):
    return next(r for r in grid.rows if (r.model, r.target, r.dtype) == (model, target, dtype))


def test_history_is_big_enough(db):
    assert db["runs"] >= 50
    assert len(history.list_runs(db["path"], limit=None)) == db["runs"]


def test_grid_regressions_and_culprits(db):
    grid = hud.build_grid(db["path"])
    assert [c.key for c in grid.columns] == LABELS  # time order, one column per label
    assert len(grid.rows) == len(ROWS) and grid.runs == db["runs"]
    mlp = _row(grid, "mlp")
    assert mlp.baseline == "c00" and mlp.cells["c00"].baseline
    assert mlp.cells["c03"].regressed and not mlp.cells["c04"].regressed  # the blip recovered
    assert mlp.culprit == "c07" and mlp.cells["c07"].culprit and not mlp.cells["c08"].culprit
    assert all(mlp.cells[k].regressed for k in LABELS[7:])
    assert "worst SQNR" in mlp.cells["c07"].why
    drop = mlp.cells["c00"].value - mlp.cells["c07"].value
    assert drop > grid.rules.sqnr_drop_db
    cnn = _row(grid, "tiny-cnn")
    assert cnn.culprit == "c09" and cnn.cells["c09"].why == "PASS -> FAIL" and cnn.cells["c09"].run.verdict == "FAIL"
    digits = _row(grid, "digits")
    assert digits.cells["c00"].metric == "top1" and digits.cells["c00"].value == pytest.approx(0.92)
    assert digits.culprit == "c08" and "top-1 92.00% -> 84.00%" in digits.cells["c08"].why
    infra = _row(grid, "mlp", "tosa://int", "int8")
    assert infra.cells["c10"].run.verdict == "ERROR" and not infra.cells["c10"].regressed and infra.culprit is None
    steady = _row(grid, "mlp", "host://xnnpack", "int8")
    assert steady.culprit is None and steady.cells["c02"].runs == 2
    assert not any(c.regressed for c in steady.cells.values())
    hostile = _row(grid, HOSTILE_MODEL)
    assert sorted(hostile.cells) == ["c00", "c04", "c08"]
    assert grid.rows[0].culprit is not None  # regressed rows come first


def test_baseline_label_changes_the_judgement(db):
    grid = hud.build_grid(db["path"], baseline="c08")
    mlp = _row(grid, "mlp")
    assert mlp.baseline == "c08" and mlp.culprit is None  # already as bad at the baseline
    assert not any(c.regressed for c in mlp.cells.values())
    cnn = _row(grid, "tiny-cnn")
    assert cnn.culprit == "c09"
    with pytest.raises(history.HistoryError, match="baseline label 'nope'"):
        hud.write_site(db["path"], db["root"] / "nope-site", baseline="nope")


def test_cli_writes_an_escaped_self_contained_site(db, tmp_path, cli):
    out = tmp_path / "site"
    res = cli("hud", "--out", str(out), "--db", str(db["path"]))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(ROWS)} rows x {len(LABELS)} labels from {db['runs']} runs; 3 row(s) regressed" in res.stdout
    assert "mlp / host://xnnpack / fp32: regressed since c07" in res.stdout
    page = (out / "index.html").read_text()
    # Hostile text from the database is inert: escaped, control characters made visible.
    assert "<script>document" not in page and "<img src=x" not in page
    assert html.escape("<script>document.title='pwned'") in page
    assert "\x1b" not in page and "\\x1b[31m" in page
    assert page.count("<script>") == 1  # the page's own
    # Self-contained: nothing loaded from anywhere (no http(s) URL, no src= at all).
    assert not re.search(r"https?://", page)
    tags = _tags(page)
    assert {t for t, _ in tags} <= {"html", "head", "meta", "title", "style", "body", "h1", "p", "span", "b", "input",
                                    "div", "table", "thead", "tbody", "tr", "th", "td", "a", "svg", "polyline",
                                    "circle", "script", "button", "label", "select", "option"}
    assert not [a for _, attrs in tags for a in attrs if a == "src" or a.startswith("on")]
    # Every shown run has its report page, rendered from the stored JSON; links resolve.
    links = re.findall(r"href='(runs/\d+\.html)'", page)
    assert len(set(links)) == db["cells"]
    assert all((out / link).is_file() for link in links)
    first = (out / links[0]).read_text()
    assert "accuracy HUD" in first
    originals = [p for p in (out / "runs").glob("*.html") if "original report" in p.read_text()]
    assert len(originals) == len(ROWS)  # the c00 runs kept their report.html
    # The culprit cell is marked and the row status links to it.
    m = re.search(r"regressed since <a href='#(r\d+c7)'>c07</a>", page)
    assert m and f"id='{m.group(1)}' class='c PASS reg culprit'" in page


def test_hud_renders_in_chromium(db, tmp_path):
    out = tmp_path / "site"
    index, grid = hud.write_site(db["path"], out)
    regressed = sum(c.regressed for r in grid.rows for c in r.cells.values())
    shot = tmp_path / "hud.png"
    result = check_page(index.as_uri(), shot, width=1600)
    assert result.console_errors == []
    # The title is set by the page's script from the DOM the browser built.
    assert result.title == (f"bundlerun HUD: {len(ROWS)} rows, {len(LABELS)} labels, {db['cells']} runs, "
                            f"{regressed} regressed, {len(ROWS)} shown")
    assert regressed == 1 + 4 + 2 + 3  # c03 + c07..c10 (mlp), c09..c10 (cnn), c08..c10 (digits)
    assert shot.stat().st_size > 20_000
    run_page = out / "runs" / f"{_row(grid, 'tiny-cnn').cells['c09'].run.id}.html"
    page = check_page(run_page.as_uri(), tmp_path / "run.png")
    assert page.console_errors == [] and "FAIL" in page.title


def test_missing_or_off_history_is_a_clear_error(tmp_path, cli):
    res = cli("hud", "--out", str(tmp_path / "s"), "--db", str(tmp_path / "none.sqlite"))
    assert res.returncode == 2 and "no history database at" in res.stderr and "Traceback" not in res.stderr
    res = cli("hud", "--out", str(tmp_path / "s"), "--db", "off")
    assert res.returncode == 2 and "history is turned off" in res.stderr


def test_dataset_accuracy_cells_show_top1_and_the_paired_difference(tmp_path, cli):
    """A `bundlerun accuracy` run's cell: its top-1 and the paired difference against the float model,
    the interval in the tooltip and in `bundlerun history`; element-wise FAILs (int8 logits against
    the float model) neither hide the top-1 nor make a PASS -> FAIL regression."""
    from bundlerun.runner.pictures.hud_page import cell_text

    path = tmp_path / "h.sqlite"
    for i, (label, noise) in enumerate((("a1", 1e-5), ("a2", 1e-1))):
        bundle = make_bundle(cases=3, model="mnist-cnn", dtype="int8", seed=4)
        run = target_run(bundle, noise=noise, seed=i)
        run.target = "qemu://mps3-an547"
        dataset = {"name": "mnist", "samples": 1000, "top1": 0.943, "top5": 0.99, "reference_top1": 0.943,
                   "reference_top5": 0.99, "top1_diff": 0.0, "top1_diff_ci": [-0.0044, 0.0044], "agreement": 0.998}
        report = make_report(bundle, run, label=label, dataset=dataset,
                             started=f"2026-12-0{i + 1}T10:00:00+00:00")
        history.record_report(path, Report.from_json(report))
    (rec,) = history.list_runs(path, label="a2")
    assert (rec.samples, rec.top1_diff, rec.top1_diff_low, rec.top1_diff_high) == (1000, 0.0, -0.0044, 0.0044)
    grid = hud.build_grid(path)
    row = _row(grid, "mnist-cnn", "qemu://mps3-an547", "int8")
    a1, a2 = row.cells["a1"], row.cells["a2"]
    assert a2.run.verdict == "FAIL" and not a2.regressed and row.culprit is None
    assert cell_text(a1) == "94.3% +0.0" and cell_text(a2) == "94.3% +0.0"
    index, _ = hud.write_site(path, tmp_path / "site")
    page = index.read_text()
    assert "dataset top-1 94.30% of 1000 samples" in page
    assert "target - float +0.00 points, 95% CI [-0.44, +0.44] (paired)" in page
    assert "element-wise: 0 cases PASS, 3 FAIL" in page
    import os

    res = cli("history", "--history", str(path), env={**os.environ, "COLUMNS": "300"})
    assert res.returncode == 0 and "+0.00 [-0.44, +0.44]" in res.stdout, res.stdout
