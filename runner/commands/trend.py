"""`bundlerun trend MODEL --metric sqnr|mae|top1|cycles|latency|memory|FIGURE -o trend.png`: plot a metric
over recorded runs. A per-sequence figure of an LLM run (sequence_*: runner/report/sequences.py
TREND_FIGURES) is drawn as the median over each run's sequences with the min..max band. A performance figure (any name of a report's `perf` section, or an alias:
cycles, npu-cycles, latency, memory, program-size) is drawn as the median over each run's cases
with the min..max band.

Runs of different series (runner/history/series.py: target, dtype, test inputs, criteria) are drawn as
different lines, never one line through both; `--target`/`--dtype` narrow the plot. An interrupted
run is no point (the history records no figures for it).
"""

from __future__ import annotations

from pathlib import Path

import click


def _shown(value, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.2f}%" if metric in ("top1", "top5", "agreement") else f"{value:.4g}"


@click.command(name="trend")
@click.argument("model")
@click.option("--target", default=None, help="Only runs on this target URL (default: one line per target).")
@click.option("--metric", default="sqnr", show_default=True, metavar="METRIC",
              help="sqnr, mae, max, top1, top5, agreement; or a perf figure: cycles (inference_cpu_cycles), "
                   "npu-cycles, latency (execution_time), memory (method_allocator_used), program-size, or any "
                   "figure name of the report's perf section; for an LLM (llm:ARCH) a per-sequence figure: "
                   "sequence_first_divergence, sequence_greedy_agreement, sequence_perplexity_ratio, "
                   "sequence_perplexity_target, sequence_perplexity_reference, sequence_sqnr_worst, "
                   "sequence_sqnr_median, sequence_steps.")
@click.option("--phase", type=click.Choice(["first", "warm"]), default=None,
              help="Perf figures measured per phase: first (cold) or warm executions (default: warm when recorded).")
@click.option("--dtype", default=None, help="Only runs of this dtype (default: one line per dtype).")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True, help="Last N runs.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("trend.png"), show_default=True)
@click.option("--history", "history_db", default=None, help="History database (env BUNDLERUN_HISTORY).")
def command(model, target, metric, phase, dtype, limit, output, history_db):
    """Plot METRIC of MODEL across the recorded history to a PNG: one line per series (target x dtype x
    test inputs x criteria: another bundle of the model is another line; interrupted runs are left out).

    SQNR is the mean over the case-outputs that did not match exactly; exact matches
    (SQNR infinite) are counted apart, never averaged in as a capped number.
    """
    from bundlerun.bundles.fileio import atomic_write_bytes  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.project_config import load_project_config  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.history import store as history  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.pictures import plots  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.safe_text import visible as plain  # click.echo prints no markup: only visible()

    db = history.resolve_history_path(history_db, load_project_config() or {})
    if metric not in history.METRICS:
        return _perf_command(db, model, target, metric, phase, dtype, limit, output, plain)
    points = history.trend(db, model, target, metric, dtype=dtype, limit=limit) if db else []
    if not points:
        raise click.ClickException(f"no recorded runs of {model}" + (f" on {target}" if target else "")
                                   + (f" in {dtype}" if dtype else "") + f" with {metric} in {db}")
    groups = history.series_of(points)
    what = "series"
    title = (f"{model}" + (f" on {target}" if target else "") + (f" ({dtype})" if dtype else "") + f": {metric}"
             + (f", one line per {what}" if len(groups) > 1 else ""))
    atomic_write_bytes(output, plots.trend_plot(points, metric, title))
    click.echo(f"wrote {output}: {len(points)} run(s) of {plain(model)} in {len(groups)} series "
               f"(one per target x dtype x test inputs x criteria; runs of different series are never joined)")
    for key, pts in groups.items():
        last = pts[-1]
        name = plain(plots.series_name(key, groups))
        line = f"  {name}: {len(pts)} run(s), latest {metric} {_shown(last.value, metric)}"
        if metric == "sqnr":
            exact = sum(p.exact for p in pts)
            if last.value is None and last.exact:
                line = f"  {name}: {len(pts)} run(s), latest: every output matched exactly"
            if exact:
                line += (f"; {exact} exact match(es) (SQNR infinite) over these runs, "
                         "left out of the mean and drawn apart")
        click.echo(line)


def _perf_command(db, model, target, metric, phase, dtype, limit, output, plain) -> None:
    import re

    from bundlerun.bundles.fileio import atomic_write_bytes  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.history import store as history  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.pictures import plots  # start-up: not loaded by `bundlerun --help`

    if not re.fullmatch(r"[A-Za-z0-9_.-]+", metric):
        raise click.BadParameter(f"{metric!r} is neither a metric ({', '.join(history.METRICS)}) nor a perf figure name",
                                 param_hint="--metric")
    if metric in history.SEQUENCE_FIGURES:  # an LLM run's per-sequence figures (table sequence_figures)
        points, info = history.sequence_trend(db, model, metric, target, dtype=dtype, limit=limit) if db else ([], {})
    else:
        points, info = history.perf_trend(db, model, metric, target, dtype=dtype, phase=phase, limit=limit) \
            if db else ([], {})
    name = info.get("name", metric)
    if not points:
        raise click.ClickException(
            f"no recorded runs of {model}" + (f" on {target}" if target else "") + (f" in {dtype}" if dtype else "")
            + f" with perf figure {name!r} in {db} (runs recorded before perf figures were stored have none; "
            f"aliases: {', '.join(f'{k}={v}' for k, v in history.PERF_ALIASES.items())})")
    groups = history.series_of(points)
    label = name + (f" ({info['phase']})" if info.get("phase") else "")
    title = (f"{model}" + (f" on {target}" if target else "") + (f" ({dtype})" if dtype else "") + f": {label}"
             + (f" [{info.get('kind')}]" if info.get("kind") else ""))
    atomic_write_bytes(output, plots.trend_plot(points, f"perf:{name}", title, unit=info.get("unit")))
    over = "sequences" if metric in history.SEQUENCE_FIGURES else "cases"
    click.echo(f"wrote {output}: {len(points)} run(s) of {plain(model)} in {len(groups)} series, {plain(label)} "
               f"in {info.get('unit')} [{info.get('kind')}]: median over each run's {over}, min..max band")
    for key, pts in groups.items():
        last = pts[-1]
        click.echo(f"  {plain(plots.series_name(key, groups))}: {len(pts)} run(s), latest median {last.value:.6g} "
                   f"{info.get('unit')} (min {last.low:.6g}, max {last.high:.6g}, {last.counted} {over[:-1]}(s))")
