"""`bundlerun trend MODEL --metric sqnr|mae|top1 -o trend.png`: plot a metric over recorded runs."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(name="trend")
@click.argument("model")
@click.option("--target", default=None, help="Only runs on this target URL (default: all targets).")
@click.option("--metric", type=click.Choice(["sqnr", "mae", "max", "top1", "top5", "agreement"]), default="sqnr",
              show_default=True)
@click.option("--dtype", default=None, help="Only runs of this dtype.")
@click.option("--limit", type=int, default=200, show_default=True, help="Last N runs.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("trend.png"), show_default=True)
@click.option("--history", "history_db", default=None, help="History database (env BUNDLERUN_HISTORY).")
def command(model, target, metric, dtype, limit, output, history_db):
    """Plot METRIC of MODEL across the recorded history to a PNG."""
    from bundlerun.bundles.fileio import atomic_write_bytes
    from bundlerun.runner import history, plots
    from bundlerun.bundles.project_config import load_project_config

    db = history.resolve_history_path(history_db, load_project_config() or {})
    points = history.trend(db, model, target, metric, dtype=dtype, limit=limit) if db else []
    if not points:
        raise click.ClickException(f"no recorded runs of {model}" + (f" on {target}" if target else "") + f" with {metric} in {db}")
    title = f"{model}" + (f" on {target}" if target else "") + (f" ({dtype})" if dtype else "") + f": {metric}"
    atomic_write_bytes(output, plots.trend_plot(points, metric, title))
    last = points[-1].value
    shown = "-" if last is None else (f"{last * 100:.2f}%" if metric in ("top1", "top5", "agreement") else f"{last:.4g}")
    click.echo(f"wrote {output}: {len(points)} run(s), latest {metric} {shown}")
