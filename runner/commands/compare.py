"""`bundlerun compare RUN_A RUN_B`: regressions of B against baseline A."""

from __future__ import annotations

import click


@click.command(name="compare")
@click.argument("baseline")
@click.argument("current")
@click.option("--history", "history_db", default=None, help="History database (env BUNDLERUN_HISTORY).")
@click.option("--json", "as_json", is_flag=True, help="Print regressions and notes as JSON.")
@click.option("--sqnr-drop", type=float, default=None, help="Override [regression] sqnr_drop_db.")
@click.option("--error-growth", type=float, default=None, help="Override [regression] error_growth.")
@click.option("--top1-drop", type=float, default=None, help="Override [regression] top1_drop_points.")
def command(baseline, current, history_db, as_json, sqnr_drop, error_growth, top1_drop):
    """Compare run CURRENT against BASELINE (each a history id, run uuid, label or report.json).

    Exit code 1 when CURRENT regressed, 0 otherwise, 2 when a run cannot be found.
    """
    import json
    import sys
    from dataclasses import replace

    from bundlerun.runner import history
    from bundlerun.bundles.project_config import load_project_config
    from bundlerun.runner.regression import RegressionRules, comparison_notes, find_regressions, format_regressions

    config = load_project_config() or {}
    db = history.resolve_history_path(history_db, config)
    base = history.resolve_run(db, baseline)
    cur = history.resolve_run(db, current)
    rules = RegressionRules.from_config(config)
    for name, value in (("sqnr_drop_db", sqnr_drop), ("error_growth", error_growth), ("top1_drop_points", top1_drop)):
        if value is not None:
            rules = replace(rules, **{name: value})
    regs = find_regressions(base, cur, rules)
    notes = comparison_notes(base, cur)
    if as_json:
        click.echo(json.dumps({"regressions": [r.to_dict() for r in regs], "notes": notes}, indent=2, default=str))
    else:
        def who(r):
            run = r.get("run") or {}
            b = r.get("bundle") or {}
            ident = f"#{run['history_id']}" if run.get("history_id") else str(run.get("id", "?"))[:12]
            return f"{ident} ({b.get('model')} {b.get('dtype')} on {(r.get('target') or {}).get('url')}, label {run.get('label')})"

        click.echo(f"baseline {who(base)}\ncurrent  {who(cur)}")
        for note in notes:
            click.echo(f"note: {note}")
        click.echo(format_regressions(regs))
    sys.exit(1 if regs else 0)
