"""`bundlerun history`: list recorded runs, newest first, filtered."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from bundlerun.targets.base import Verdict
from bundlerun.bundles.errors import BundlerunError

if TYPE_CHECKING:
    from bundlerun.runner.history.store import RunRecord


def _fmt(v, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def _print_flaky(stats: dict, db, as_json: bool) -> None:
    """`history --flaky`: devices by infrastructure-failure rate, jobs by flake rate, worst first."""
    if as_json:
        import json

        click.echo(json.dumps(stats, indent=2))
        return
    if not stats["devices"] and not stats["jobs"]:
        click.echo(f"no flaky devices or jobs recorded in {db} (farm runs only)")
        return
    from rich.console import Console
    from rich.table import Table

    from bundlerun.runner.report.console import plain  # start-up: not loaded by `bundlerun --help`

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    devices = Table(title="devices by infrastructure-failure rate (farm attempts that exited 2)", title_justify="left")
    for col in ("device", "attempts", "infra failures", "rate", "numerical failures", "jobs", "last"):
        devices.add_column(col, justify="left" if col in ("device", "last") else "right")
    for d in stats["devices"]:
        devices.add_row(plain(d["device"]), str(d["attempts"]), str(d["infra_failures"]), f"{d['rate'] * 100:.0f}%",
                        str(d["numerical_failures"]), str(d["jobs"]), plain(d["last"] or "-"))
    jobs = Table(title="jobs by flake rate (farm runs that passed only after a retry)", title_justify="left")
    for col in ("job", "farm runs", "flaky", "rate", "retries", "still failing", "failing devices"):
        jobs.add_column(col, justify="left" if col in ("job", "failing devices") else "right")
    for j in stats["jobs"]:
        jobs.add_row(plain(j["job"]), str(j["runs"]), str(j["flaky"]), f"{j['rate'] * 100:.0f}%", str(j["retries"] or 0),
                     str(j["failed"]), plain(j["failing_devices"] or "-"))
    console.print(devices)
    console.print(jobs)


@click.group(name="history", invoke_without_command=True)
@click.option("--model", default=None, help="Only runs of this model.")
@click.option("--target", default=None, help="Only runs on this target URL.")
@click.option("--label", default=None, help="Only runs with this label.")
@click.option("--dtype", default=None, help="Only runs of this dtype.")
@click.option("--limit", type=int, default=20, show_default=True, help="At most N runs (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON (times in UTC, ISO-8601 with offset).")
@click.option("--utc", is_flag=True, help="Show times in UTC (default: local time), with their offset.")
@click.option("--history", "history_db", default=None, help="History database (env BUNDLERUN_HISTORY).")
@click.option("--sequences", is_flag=True,
              help="LLM runs: one line per sequence (first diverging step, greedy agreement, perplexity target vs "
                   "eager, worst/median step SQNR) of the listed runs.")
@click.option("--flaky", is_flag=True,
              help="Farm runs: devices by infrastructure-failure rate and jobs by flake rate (passed after a retry).")
@click.pass_context
def command(ctx, model, target, label, dtype, limit, as_json, utc, history_db, sequences, flaky):
    """List recorded runs (database: --history, $BUNDLERUN_HISTORY, [history] path, or
    ~/.local/share/bundlerun/history.sqlite). Times show their UTC offset; runs recorded
    before times carried one are read as UTC. `history import FILE` adds the backend test
    suite's reports."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"history_db": history_db}
        return
    import json

    from bundlerun.runner.history import store as history  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.project_config import load_project_config  # start-up: not loaded by `bundlerun --help`

    db = history.resolve_history_path(history_db, load_project_config() or {})
    if db is None:
        raise click.UsageError("history is turned off (path 'off')")
    if flaky:
        _print_flaky(history.flaky_stats(db, limit=limit or None), db, as_json)
        return
    runs = history.list_runs(db, model=model, target=target, label=label, dtype=dtype, limit=limit or None)
    if sequences:
        _print_sequences(runs, history.sequence_figures(db, [r.id for r in runs]), db, as_json, utc)
        return
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in runs], indent=2))
        return
    if not runs:
        click.echo(f"no runs recorded in {db}" + (" matching the filters" if any((model, target, label, dtype)) else ""))
        return
    from rich.console import Console
    from rich.table import Table

    from bundlerun.runner.report.console import plain  # start-up: not loaded by `bundlerun --help`

    table = Table(title=f"history: {db}", title_justify="left")
    for col in ("id", "started", "model", "target", "dtype", "series", "label", "verdict", "pass/fail", "min SQNR",
                "max MAE", "top-1", "vs float (CI)", "agree"):
        table.add_column(col, justify="right" if col in ("id", "min SQNR", "max MAE", "top-1", "agree") else "left")
    color = {Verdict.PASS: "green", Verdict.FAIL: "red"}
    for r in runs:
        # an interrupted run has no verdict or figures over the cases that happened to finish
        verdict = ("[yellow]interrupted[/]" if r.interrupted
                   else f"[{color.get(r.verdict or '', 'yellow')}]{r.verdict}[/]")
        table.add_row(
            str(r.id), history.display_time(r.started, utc), plain(r.model or "-"), plain(r.target or "-"),
            plain(r.dtype or "-"), plain(r.series.tag), plain(r.label or "-"), verdict,
            "-" if r.interrupted else f"{r.n_pass or 0}/{r.n_fail or 0}",
            _fmt(r.min_sqnr), _fmt(r.max_mae, ".3g"),
            "-" if r.top1 is None else f"{r.top1 * 100:.2f}%", _paired(r),
            "-" if r.agreement is None else f"{r.agreement * 100:.2f}%",
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))  # piped/CI logs: no squeezed columns
    console.print(table)


def _print_sequences(runs: list[RunRecord], figures: dict[int, list[dict]], db, as_json: bool, utc: bool) -> None:
    """`history --sequences`: the listed runs' per-sequence figures (table sequence_figures), newest run first."""
    from bundlerun.runner.history import store as history  # start-up: not loaded by `bundlerun --help`

    lines = [({"run": r.id, "started": history.utc_iso(r.started) if as_json else history.display_time(r.started, utc),
               "model": r.model, "target": r.target, "dtype": r.dtype, "label": r.label}, f)
             for r in runs for f in figures.get(r.id, [])]
    if as_json:
        import json
        import math

        def clean(v):
            return ("inf" if v > 0 else "-inf") if isinstance(v, float) and math.isinf(v) else v

        click.echo(json.dumps([{**run, **{k: clean(v) for k, v in f.items() if k != "run_id"}} for run, f in lines],
                              indent=2))
        return
    if not lines:
        click.echo(f"no per-sequence figures recorded in {db}" + (" for the listed runs" if runs else "")
                   + " (LLM bundles, llm:ARCH, record them)")
        return
    from rich.console import Console
    from rich.table import Table

    from bundlerun.runner.report.console import plain  # start-up: not loaded by `bundlerun --help`

    table = Table(title=f"per-sequence figures: {db}", title_justify="left")
    cols = ("run", "started", "model", "target", "dtype", "label", "sequence", "verdict", "steps", "first diverging",
            "greedy agree", "ppl target", "ppl eager", "ratio", "worst SQNR", "median SQNR")
    for col in cols:
        table.add_column(col, justify="right" if cols.index(col) >= 8 or col == "run" else "left")
    for run, f in lines:
        first = "none" if f["first_divergence"] is None else str(f["first_divergence"])
        table.add_row(str(run["run"]), str(run["started"] or "-"), plain(run["model"] or "-"), plain(run["target"] or "-"),
                      plain(run["dtype"] or "-"), plain(run["label"] or "-"),
                      plain(f["name"] if f["method"] == "forward" else f"{f['method']}:{f['name']}"),
                      plain(f["verdict"] or "-"), _fmt(f["steps"], "d"), first,
                      f"{_fmt(f['greedy_agreement'], 'd')}/{_fmt(f['steps'], 'd')}", _fmt(f["perplexity_target"], ".4g"),
                      _fmt(f["perplexity_reference"], ".4g"), _fmt(f["perplexity_ratio"], ".4f"),
                      _fmt(f["sqnr_worst"]), _fmt(f["sqnr_median"]))
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 200))
    console.print(table)


def _paired(r: RunRecord) -> str:
    """A dataset run's top-1 minus the float reference's, with its paired interval, in points."""
    if r.top1_diff is None:
        return "-"
    if r.top1_diff_low is None or r.top1_diff_high is None:
        return f"{r.top1_diff * 100:+.2f}"
    return f"{r.top1_diff * 100:+.2f} [{r.top1_diff_low * 100:+.2f}, {r.top1_diff_high * 100:+.2f}]"


@command.command(name="import")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--commit", default=None, metavar="SHA",
              help="The commit the suite ran at (default: a CI commit variable in the report, else this machine's).")
@click.option("--time", "when", default=None, metavar="ISO-8601", help="When it ran (default: the report's own time).")
@click.option("--history", "history_db", default=None, help="History database (env BUNDLERUN_HISTORY).")
@click.pass_context
def import_command(ctx, files, commit, when, history_db):
    """Record ExecuTorch's backend test suite results: its pytest-json-report output
    (--json-report, with the suite's per-test metadata) or its CSV (also the suite.csv the
    bundlerun plugin writes). One run per subtest, with its error max / MAE / SNR per output,
    its flow, operator and commit, shown by `bundlerun hud` beside bundlerun's own runs."""
    from bundlerun.bundles.project_config import load_project_config  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.history import store as history  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.safe_text import visible  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.suite.importer import import_suite_report  # start-up: not loaded by `bundlerun --help`

    db = history.resolve_history_path(history_db or (ctx.obj or {}).get("history_db"), load_project_config() or {})
    if db is None:
        raise click.UsageError("history is turned off (path 'off')")
    for path in files:
        try:
            summary = import_suite_report(db, path, commit=commit, time=when)
        except BundlerunError as exc:
            raise click.ClickException(visible(exc)) from None
        flows = ", ".join(f"{visible(k)} {v}" for k, v in sorted(summary.flows.items()))
        click.echo(f"{visible(path)}: {summary.recorded} run(s) recorded, {summary.already} already there "
                   f"({flows or 'no subtests'}; {summary.from_bundlerun} with bundlerun's device report); "
                   f"commit {visible(summary.commit or 'unknown')}; history {visible(db)}")
