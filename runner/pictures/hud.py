"""The accuracy HUD: a static site of what ran (grouped by flow/backend and operator) against commits.

    bundlerun hud --out site/ [--history PATH] [--baseline LABEL]

The grid (runner/pictures/hud_grid.py): rows by flow/backend > operator > what ran x target x dtype,
columns by commit (a run recorded without --label carries its commit as label: runner/history/commits.py;
with neither, its day), each cell the latest run of the row there with the worst in its tooltip,
red where it regressed against the row's baseline (runner/history/regression.py's rules on the recorded
summary numbers), the culprit the first column of the row's current regression. The page
(runner/pictures/hud_page.py): collapsible groups, a filter, sticky headers, regressed rows first.

Each cell links to its run's report, rendered into the site from the JSON stored in the
history (`runs/<id>.html`, written once: a recorded run never changes), and to the original
report.html when it still exists. Self-contained (inline CSS/SVG, one script allowed by its
hash in the Content-Security-Policy); everything from the database is HTML-escaped with
control characters made visible.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from bundlerun.bundles.fileio import atomic_write_text
from bundlerun.runner.history import store as history
from bundlerun.runner.report.safe_text import one_line
from bundlerun.runner.writers.html import _e
from bundlerun.runner.history.regression import RegressionRules

# The grid (rows, columns, cells, regressions) and the page live in their own modules; the grid's
# names stay importable from here.
from bundlerun.runner.pictures.hud_grid import Cell, Column, Grid, Row, build_grid  # noqa: F401
from bundlerun.runner.pictures.hud_page import href as _href, render, status
from bundlerun.targets.base import Verdict

__all__ = ["Cell", "Column", "Grid", "Row", "build_grid", "render", "write_site"]


def write_site(db_path: str | Path, out: str | Path, baseline: str | None = None,
               rules: RegressionRules | None = None, limit: int | None = None) -> tuple[Path, Grid]:
    """Write `out/index.html` and `out/runs/<id>.html`; returns the index path and the grid."""
    from bundlerun.runner.writers.html import render_html

    out = Path(out)
    if not Path(db_path).exists():
        raise history.HistoryError(f"no history database at {db_path}")
    grid = build_grid(db_path, baseline, rules, limit)
    if baseline is not None and not any(c.key == baseline for c in grid.columns):
        raise history.HistoryError(f"baseline label {baseline!r} is not in history {db_path}")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    run_pages: dict[int, str] = {}
    originals: dict[int, str] = {}
    todo: dict[int, tuple[Cell, Path, str]] = {}
    for row in grid.rows:
        for cell in row.cells.values():
            rid = cell.run.id
            if rid in run_pages or rid in todo:
                continue
            if cell.run.report_path:
                html_path = Path(cell.run.report_path).with_name("report.html")
                if html_path.is_file():
                    originals[rid] = str(html_path)
            page_path = out / "runs" / f"{rid}.html"
            marker = f"<!-- bundlerun run {hashlib.sha256(str(cell.run.run_uuid).encode()).hexdigest()} -->"
            if _starts_with(page_path, marker):
                run_pages[rid] = f"runs/{rid}.html"  # a recorded run never changes: its page is kept
            else:
                todo[rid] = (cell, page_path, marker)
    from bundlerun.runner.history.tags import load_reports

    unreadable: dict[int, str] = {}  # one damaged run is said on its own page, never stops the site
    reports = load_reports(db_path, list(todo), errors=unreadable)
    for rid, (cell, page_path, marker) in todo.items():
        nav = "<p class='meta'><a href='../index.html'>&larr; accuracy HUD</a>"
        if rid in originals:
            nav += f" &middot; <a href='{_e(_href(Path(originals[rid]), out / 'runs'))}'>original report</a>"
        if rid in reports:
            # the per-case plots for the runs people open to see what went wrong; not for every passing run
            page = render_html(reports[rid], case_plots=status(cell) != Verdict.PASS).replace("<body>", "<body>" + nav + "</p>", 1)
        else:
            page = (f"<!doctype html><html><head><meta charset='utf-8'><title>run {rid}</title></head><body>{nav}</p>"
                    f"<p>The stored report of this run cannot be read: {_e(one_line(unreadable.get(rid), 2000))}</p>"
                    "</body></html>")
            marker = ""  # not kept: rewritten once the row is repaired
        _write_page(page_path, marker + page)
        run_pages[rid] = f"runs/{rid}.html"
    index = out / "index.html"
    atomic_write_text(index, render(grid, out, db_path, run_pages, originals))
    return index, grid



def _starts_with(path: Path, marker: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(marker.encode())) == marker.encode()
    except OSError:
        return False


def _write_page(path: Path, text: str) -> None:
    """A run page: derived from the history, rewritten whenever it is missing or stale, so it is
    replaced atomically (a reader never sees half a page) but not fsynced (15,000 fsyncs cost
    minutes at suite scale; the index page is written with atomic_write_text, synced)."""
    import os

    from bundlerun.bundles.fileio import named

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise named(exc, path) from None
