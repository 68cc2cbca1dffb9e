"""The HUD as a paged, incremental site (runner/pictures/hud_site.py), on a real history database
written through runner.history.store.record_report with reports made by the real judge
(tests/report_samples.py), and the pages in real headless Chromium (tests/browser.py).

6 rows x 9 commits, 4 commits and 4 rows per page: 3 windows x 2 slices of rows. One row regresses
at commit 2 (its culprit is in the first window; the newest page links to it).
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from bundlerun.runner.history import store as history
from bundlerun.runner.pictures import hud_site
from bundlerun.runner.report.model import Report
from browser import check_page
from report_samples import make_bundle, make_report, target_run

ROWS = [(m, t, d) for m in ("mlp", "cnn", "lstm") for t, d in (("host://xnnpack", "fp32"), ("tosa://int", "int8"))]
T0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)


def _record(db, commits: range) -> int:
    n = 0
    for i in commits:
        for ri, (model, target, dtype) in enumerate(ROWS):
            bundle = make_bundle(cases=2, model=model, dtype=dtype, seed=ri)
            noise = 3e-3 if (model == "cnn" and target == "tosa://int" and i >= 2) else 1e-6  # regressed from c02 on
            run = target_run(bundle, noise=noise, seed=i)
            run.target = target
            report = make_report(bundle, run, label=f"c{i:02d}", started=(T0 + dt.timedelta(days=i)).isoformat())
            history.record_report(db, Report.from_json(report))
            n += 1
    return n


def _build(db, out):
    return hud_site.write_site(db, out, window=4, rows_per_page=4)


@pytest.fixture()
def site(tmp_path):
    db = tmp_path / "history.sqlite"
    _record(db, range(9))
    out = tmp_path / "site"
    return db, out, _build(db, out)


def _pages(out):
    return sorted(p.name for p in out.glob("*.html"))


def test_first_build_pages_windows_and_links(site):
    db, out, built = site
    assert not built.incremental and built.new_runs == 9 * len(ROWS) and built.grid.runs == 9 * len(ROWS)
    # 9 commits in windows of 4 (c00-c03, c04-c07, c08) x 6 rows in slices of 4: index.html is the newest
    # window's first slice
    assert _pages(out) == ["index.html", "pages.html", "w0000-r000.html", "w0000-r001.html", "w0001-r000.html",
                           "w0001-r001.html", "w0002-r001.html"]
    assert built.pages_written == 6 and built.pages_kept == 0
    index = (out / "index.html").read_text()
    assert re.findall(r"data-c='(c\d\d)'", index) == ["c08"]
    # the regressed row comes first; its culprit (c02) is in the first window: the index links there
    m = re.search(r"regressed since <a href='(w0000-r000\.html)#(r0c2)'>c02</a>", index)
    assert m, index[:3000]
    first = (out / m.group(1)).read_text()
    assert f"id='{m.group(2)}' class='c PASS reg culprit'" in first or f"id='{m.group(2)}' class='c FAIL reg culprit'" in first
    # every link between pages resolves; every cell of the site links to its run's page (a small first build)
    for page in out.glob("*.html"):
        for link in re.findall(r"href='([^'#]+)(?:#[^']*)?'", page.read_text()):
            assert (out / link).is_file(), (page.name, link)
    cells = sum(len(re.findall(r"<td id='r\d+c\d+' class='c ", p.read_text())) for p in out.glob("w*.html")) + \
        len(re.findall(r"<td id='r\d+c\d+' class='c ", index))
    assert cells == 9 * len(ROWS)
    assert len(list((out / "runs").glob("*.html"))) == 9 * len(ROWS)
    # the filters: model, target, backend, dtype, label
    for f in ("f-m", "f-t", "f-b", "f-d", "f-l"):
        assert f"id='{f}'" in index


def test_a_build_with_nothing_new_writes_nothing(site):
    db, out, _ = site
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.html")}
    built = _build(db, out)
    assert built.incremental and built.new_runs == 0 and built.pages_written == 0 and built.run_pages_written == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.html")} == before


def test_new_runs_rewrite_only_the_pages_that_show_them_and_match_a_full_build(site, tmp_path):
    db, out, _ = site
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("w0000-*.html")}
    _record(db, range(9, 10))  # c09: into the newest window
    built = _build(db, out)
    assert built.incremental and built.new_runs == len(ROWS) and built.run_pages_written == len(ROWS)
    assert built.pages_written == 2  # the newest window's two slices; the older windows are untouched
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("w0000-*.html")} == before
    assert re.findall(r"data-c='(c\d\d)'", (out / "index.html").read_text()) == ["c08", "c09"]
    full = _build(db, tmp_path / "full")
    assert not full.incremental
    assert [(r.key, r.culprit, r.baseline) for r in built.grid.rows] == [(r.key, r.culprit, r.baseline) for r in full.grid.rows]
    assert [[(k, c.run.id, c.regressed) for k, c in sorted(r.cells.items())] for r in built.grid.rows] == \
        [[(k, c.run.id, c.regressed) for k, c in sorted(r.cells.items())] for r in full.grid.rows]
    for name in _pages(full.index.parent):  # the same pages, the same cells (only the build time differs)
        strip = lambda text: re.sub(r"generated [^;]+;", "", text)  # noqa: E731
        assert strip((out / name).read_text()) == strip((full.index.parent / name).read_text()), name


def test_a_state_from_another_history_or_options_is_a_full_build(site, tmp_path):
    db, out, _ = site
    other = tmp_path / "other.sqlite"
    _record(other, range(3))
    built = _build(other, out)
    assert not built.incremental and built.grid.runs == 3 * len(ROWS)
    assert _pages(out) == ["index.html", "pages.html", "w0000-r001.html"]  # the first history's pages are gone
    again = hud_site.write_site(other, out, window=2, rows_per_page=4)  # other options: other pages
    assert not again.incremental
    state = json.loads((out / hud_site.STATE_NAME).read_text())
    assert state["data"]["last_id"] == 3 * len(ROWS)


def test_filters_in_chromium(site, tmp_path):
    db, out, _ = site
    js = ("(function () { var s = document.getElementById('f-t'); s.value = 'tosa://int';"
          " s.dispatchEvent(new Event('change'));"
          " var t = document.title; var l = document.getElementById('f-l'); l.value = l.options[1].value;"
          " l.dispatchEvent(new Event('change'));"
          " var shown = 0, cells = document.querySelectorAll('tr.row')[0].children;"
          " for (var i = 3; i < cells.length; i++) if (cells[i].style.display !== 'none') shown++;"
          " return {title: t, columns: shown}; })()")
    page = check_page((out / "w0001-r000.html").as_uri(), tmp_path / "page.png", width=1400, evaluate=js)
    assert page.console_errors == []
    # rows 1-4 of the grid on this slice, 2 of them on tosa://int; one label column left
    assert page.evaluated["title"].endswith(", 2 shown") and page.evaluated["columns"] == 1
