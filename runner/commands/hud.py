"""`bundlerun hud --out site/`: the accuracy HUD, a static site written from the history."""

from __future__ import annotations

from pathlib import Path

import click
from bundlerun.bundles.errors import BundlerunError


@click.command(name="hud")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder to write the site into (index.html + runs/<id>.html).")
@click.option("--db", "--history", "history_db", default=None,
              help="History database (default: $BUNDLERUN_HISTORY, [history] path, then the user's).")
@click.option("--baseline", default=None, metavar="LABEL",
              help="Judge every row against its run under this label (default: each row's first run).")
@click.option("--limit", type=click.IntRange(min=0), default=0, show_default=True,
              help="Only the newest N runs (0: all; a limit rebuilds the site every time).")
@click.option("--all-run-pages", is_flag=True,
              help="Render every shown run's report page now (a first build otherwise renders those of the newest "
                   "commits and of every cell that is not a PASS; later builds every new run's).")
@click.option("--window", type=click.IntRange(min=1), default=12, show_default=True,
              help="Commits (columns) per page; index.html shows the newest window.")
@click.option("--page-rows", type=click.IntRange(min=1), default=200, show_default=True, help="Rows per page.")
def command(out_dir, history_db, baseline, limit, all_run_pages, window, page_rows):
    """Write the accuracy HUD: model x target x dtype against labels over time, each cell the
    verdict with top-1 (dataset runs) or the worst SQNR, red where it regressed against the
    baseline, the label where each regression began, sparklines, links to every run's report.
    The site is self-contained (no network) and can be published as it is."""
    from bundlerun.bundles.project_config import load_project_config  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.history import store as history  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.pictures import hud_site  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.history.regression import RegressionRules  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.safe_text import visible  # start-up: not loaded by `bundlerun --help`

    try:
        config = load_project_config() or {}
        db = history.resolve_history_path(history_db, config)
        if db is None:
            raise click.ClickException("history is turned off (--db off / $BUNDLERUN_HISTORY); nothing to show")
        built = hud_site.write_site(db, out_dir, baseline, RegressionRules.from_config(config), limit or None,
                                    all_run_pages, window, page_rows)
    except BundlerunError as exc:
        raise click.ClickException(visible(exc)) from None
    grid = built.grid
    regressed = [r for r in grid.rows if r.culprit]
    click.echo(f"wrote {visible(built.index)}: {len(grid.rows)} rows x {len(grid.columns)} labels from {grid.runs} runs; "
               f"{len(regressed)} row(s) regressed")
    click.echo(f"  {built.new_runs} new run(s) read ({'incremental' if built.incremental else 'full build'}); "
               f"{built.pages_written} page(s) written, {built.pages_kept} unchanged; "
               f"{built.run_pages_written} run page(s)")
    for row in regressed[:20]:
        name = " / ".join(str(x or "") for x in (row.model, row.target, row.dtype))
        name += f" ({row.tag})" if row.tag else ""
        click.echo("  " + visible(name) + f": regressed since {visible(row.culprit)}")
