"""`bundlerun hud --out site/`: the accuracy HUD, a static site written from the history."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(name="hud")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder to write the site into (index.html + runs/<id>.html).")
@click.option("--db", "--history", "history_db", default=None,
              help="History database (default: $BUNDLERUN_HISTORY, [history] path, then the user's).")
@click.option("--baseline", default=None, metavar="LABEL",
              help="Judge every row against its run under this label (default: each row's first run).")
@click.option("--limit", type=click.IntRange(min=0), default=0, show_default=True,
              help="Only the newest N runs (0: all).")
def command(out_dir, history_db, baseline, limit):
    """Write the accuracy HUD: model x target x dtype against labels over time, each cell the
    verdict with top-1 (dataset runs) or the worst SQNR, red where it regressed against the
    baseline, the label where each regression began, sparklines, links to every run's report.
    The site is self-contained (no network) and can be published as it is."""
    from bundlerun.bundles.errors import BundlerunError
    from bundlerun.bundles.project_config import load_project_config
    from bundlerun.runner.history import store as history
    from bundlerun.runner.pictures import hud
    from bundlerun.runner.history.regression import RegressionRules
    from bundlerun.runner.report.safe_text import visible

    try:
        config = load_project_config() or {}
        db = history.resolve_history_path(history_db, config)
        if db is None:
            raise click.ClickException("history is turned off (--db off / $BUNDLERUN_HISTORY); nothing to show")
        index, grid = hud.write_site(db, out_dir, baseline, RegressionRules.from_config(config), limit or None)
    except BundlerunError as exc:
        raise click.ClickException(visible(exc)) from None
    regressed = [r for r in grid.rows if r.culprit]
    click.echo(f"wrote {visible(index)}: {len(grid.rows)} rows x {len(grid.columns)} labels from {grid.runs} runs; "
               f"{len(regressed)} row(s) regressed")
    for row in regressed[:20]:
        name = " / ".join(str(x or "") for x in (row.model, row.target, row.dtype))
        name += f" ({row.tag})" if row.tag else ""
        click.echo("  " + visible(name) + f": regressed since {visible(row.culprit)}")
