"""The accuracy HUD: a static site of what ran (grouped by flow/backend and operator) against commits.

    bundlerun hud --out site/ [--history PATH] [--baseline LABEL]

The grid (runner/pictures/hud_grid.py): rows by flow/backend > operator > what ran x target x dtype,
columns by commit (a run recorded without --label carries its commit as label: runner/history/commits.py;
with neither, its day), each cell the latest run of the row there with the worst in its tooltip,
red where it regressed against the row's baseline (runner/history/regression.py's rules on the recorded
summary numbers), the culprit the first column of the row's current regression. The page
(runner/pictures/hud_page.py): collapsible groups, a filter, sticky headers, regressed rows first.

The site is paged and built incrementally (runner/pictures/hud_site.py): windows of commits x
slices of rows, only new runs read and only changed pages written. Each cell links to its run's report, rendered into the site from the JSON stored in the
history (`runs/<id>.html`, written once: a recorded run never changes), and to the original
report.html when it still exists. Self-contained (inline CSS/SVG, one script allowed by its
hash in the Content-Security-Policy); everything from the database is HTML-escaped with
control characters made visible.
"""

from __future__ import annotations

from pathlib import Path

from bundlerun.runner.history.regression import RegressionRules

# The grid (rows, columns, cells, regressions) and the page live in their own modules; the grid's
# names stay importable from here.
from bundlerun.runner.pictures.hud_grid import Cell, Column, Grid, Row, build_grid  # noqa: F401
from bundlerun.runner.pictures.hud_page import render
from bundlerun.runner.pictures.hud_site import ROWS, WINDOW, write_site as build

__all__ = ["Cell", "Column", "Grid", "Row", "build_grid", "render", "write_site"]


def write_site(db_path: str | Path, out: str | Path, baseline: str | None = None,
               rules: RegressionRules | None = None, limit: int | None = None,
               all_run_pages: bool = False, window: int | None = None, rows_per_page: int | None = None
               ) -> tuple[Path, Grid]:
    """Bring `out/` up to date (index.html, the other pages, runs/<id>.html): only new runs are read
    and only changed pages written (runner/pictures/hud_site.py); returns the index path and the grid."""

    built = build(db_path, out, baseline, rules, limit, all_run_pages, window or WINDOW, rows_per_page or ROWS)
    return built.index, built.grid
