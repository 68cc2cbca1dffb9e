"""`bundlerun history`: list recorded runs, newest first, filtered."""

from __future__ import annotations

import click


def _fmt(v, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


@click.command(name="history")
@click.option("--model", default=None, help="Only runs of this model.")
@click.option("--target", default=None, help="Only runs on this target URL.")
@click.option("--label", default=None, help="Only runs with this label.")
@click.option("--dtype", default=None, help="Only runs of this dtype.")
@click.option("--limit", type=int, default=20, show_default=True, help="At most N runs (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
@click.option("--history", "history_db", default=None, help="History database (env BUNDLERUN_HISTORY).")
def command(model, target, label, dtype, limit, as_json, history_db):
    """List recorded runs (database: --history, $BUNDLERUN_HISTORY, [history] path, or
    ~/.local/share/bundlerun/history.sqlite)."""
    import json

    from bundlerun.runner import history
    from bundlerun.bundles.project_config import load_project_config

    db = history.resolve_history_path(history_db, load_project_config() or {})
    if db is None:
        raise click.UsageError("history is turned off (path 'off')")
    runs = history.list_runs(db, model=model, target=target, label=label, dtype=dtype, limit=limit or None)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in runs], indent=2))
        return
    if not runs:
        click.echo(f"no runs recorded in {db}" + (" matching the filters" if any((model, target, label, dtype)) else ""))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"history: {db}", title_justify="left")
    for col in ("id", "started", "model", "target", "dtype", "label", "verdict", "pass/fail", "min SQNR", "max MAE", "top-1", "agree"):
        table.add_column(col, justify="right" if col in ("id", "min SQNR", "max MAE", "top-1", "agree") else "left")
    color = {"PASS": "green", "FAIL": "red"}
    for r in runs:
        table.add_row(
            str(r.id), (r.started or "")[:19].replace("T", " "), r.model or "-", r.target or "-", r.dtype or "-",
            r.label or "-", f"[{color.get(r.verdict or '', 'yellow')}]{r.verdict}[/]", f"{r.n_pass or 0}/{r.n_fail or 0}",
            _fmt(r.min_sqnr), _fmt(r.max_mae, ".3g"),
            "-" if r.top1 is None else f"{r.top1 * 100:.2f}%", "-" if r.agreement is None else f"{r.agreement * 100:.2f}%",
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))  # piped/CI logs: no squeezed columns
    console.print(table)
