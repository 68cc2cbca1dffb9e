"""`bundlerun compare RUN_A RUN_B`: regressions of B against baseline A, and every output's
metrics side by side.

Only related runs are compared (same target, dtype, methods and cases, same test inputs or
model): anything else is refused in one line unless `--force`. One exception: the SAME bundle
(same program and test inputs) run on two targets, e.g. host://xnnpack and qemu-user://aarch64
(x86 vs aarch64 kernels), is what cross-target validation is for - compared without --force, the
columns named by the two targets, each output's errors side by side with their difference.

LLM runs of one bundle-set on several lanes (`compare RUN RUN [RUN...]`: the same model, weights and
prompts, each lane's program lowered by its own backend) are shown as one per-step table: a row per
(sequence, position), a column per lane with its SQNR, argmax and verdict (runner/report/sequence_lanes.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from bundlerun.bundles.errors import ConfigError

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report


def _fmt(value, key: str) -> str:
    if value is None:
        return "-"
    if value == "inf":
        return "exact"
    if value == "-inf":
        return "-inf"
    if key == "mismatch_count":
        return str(int(value))
    if key == "sqnr":
        return f"{value:.2f}"
    if key == "cosine_similarity":
        return f"{value:.6f}"
    return f"{value:.3g}"


def _delta(pair: dict, key: str) -> str:
    d = pair.get("delta")
    if d is None:
        return ""
    if key == "mismatch_count":
        return f"{int(d):+d}"
    if key == "sqnr":
        return f"{d:+.2f}"
    if key == "cosine_similarity":
        return f"{d:+.2g}"
    return f"{d:+.3g}"


def _cell(pair: dict, key: str, worse: bool) -> str:
    """`baseline → current (Δ)`, the delta red when it is worse."""
    text = f"{_fmt(pair.get('baseline'), key)} → {_fmt(pair.get('current'), key)}"
    d = _delta(pair, key)
    if d:
        text += f" ([red]{d}[/])" if worse else f" ({d})"
    return text


def _worse(pair: dict, key: str) -> bool:
    d = pair.get("delta")
    if d is None or d == 0:
        return False
    return d < 0 if key in ("sqnr", "cosine_similarity") else d > 0


def _counts(counts: dict) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))


def _cross_target(base: "Report", cur: "Report", reasons: list[str]) -> bool:
    """The same bundle on two targets: the only reason the runs differ is the target, and both ran
    the same program (program digest, else the same bundle file)."""
    bb, cb = base.bundle, cur.bundle
    same = (bb.get("program_sha256") and bb.get("program_sha256") == cb.get("program_sha256")) or (
        bb.get("sha256") and bb.get("sha256") == cb.get("sha256"))
    return bool(same and reasons and all(r.startswith("target differs") for r in reasons))


def _overridden(rules, flags: dict[str, tuple[str, float | None]]):
    """`rules` with each given --flag's value (finite, >= 0) in place of the config's."""
    for flag, (name, value) in flags.items():
        if value is not None:
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{flag} must be a non-negative number, got {value}")
            rules = replace(rules, **{name: value})
    return rules


def _lanes_mode(base: "Report", cur: "Report", others: list["Report"]) -> bool:
    """Runs of LLM sequences on different programs (each lane's own lowering), or more than two runs."""
    runs = [base, cur, *others]
    if not all(r.sequences for r in runs):
        if others:
            raise ConfigError(f"compare takes more than two runs only for one LLM bundle-set across lanes; run "
                              f"{next(i + 1 for i, r in enumerate(runs) if not r.sequences)} has no sequences")
        return False
    programs = {r.bundle.get("program_sha256") for r in runs}
    return bool(others) or len(programs) > 1 or None in programs


def _compare_lanes(runs: list["Report"], force: bool, as_json: bool) -> None:
    import json
    import sys

    from rich.table import Table

    from bundlerun.runner.report.console import plain, wide_console  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.sequence_lanes import lane_heading, lane_table, reference_cell, step_cell  # start-up: as above

    table = lane_table(runs, force)
    if as_json:
        click.echo(json.dumps(table.to_json(), indent=2, default=str))
        sys.exit(0 if table.all_passed() else 1)
    console = wide_console()
    console.print(f"one bundle-set ({runs[0].bundle.get('model')}, sequence set {table.sequence_set[:12]}) on "
                  f"{len(runs)} lanes; each lane against its own bundle's reference", highlight=False)
    for lane in table.lanes:
        console.print(f"  {plain(lane_heading(lane))}: {lane.steps_passed}/{lane.steps} steps PASS ({lane.verdict})",
                      highlight=False)
    grid = Table(title="per step: SQNR, argmax reference->target, verdict", title_justify="left")
    for col in ("seq", "pos", "kind", "ref"):
        grid.add_column(col, justify="right" if col != "kind" else "left")
    for lane in table.lanes:
        grid.add_column(plain(lane.target), justify="right")
    for row in table.rows:
        grid.add_row(str(row.sequence), str(row.position), row.kind, reference_cell(row),
                     *(plain(step_cell(s)) for s in row.steps))
    console.print(grid)
    sys.exit(0 if table.all_passed() else 1)


@click.command(name="compare")
@click.argument("baseline")
@click.argument("current")
@click.argument("more", nargs=-1)
@click.option("--history", "history_db", default=None, help="History database (env BUNDLERUN_HISTORY).")
@click.option("--json", "as_json", is_flag=True, help="Print regressions, notes and per-output deltas as JSON.")
@click.option("--force", is_flag=True,
              help="Compare runs that are not of the same bundle/target/dtype/cases (refused otherwise).")
@click.option("--cases", "per_case", is_flag=True, help="Console: one row per case-output, not per output.")
@click.option("--sqnr-drop", type=float, default=None, help="Override [regression] sqnr_drop_db.")
@click.option("--error-growth", type=float, default=None, help="Override [regression] error_growth.")
@click.option("--top1-drop", type=float, default=None, help="Override [regression] top1_drop_points.")
@click.option("--cycles-regression", type=float, default=None, help="Override [perf] cycles_regression (0.05 = 5%).")
@click.option("--memory-regression", type=float, default=None, help="Override [perf] memory_regression.")
@click.option("--latency-regression", type=float, default=None, help="Override [perf] latency_regression.")
@click.option("--gate-host-latency", is_flag=True, default=None,
              help="Gate host wall time too (same as [perf] gate_host_latency = true).")
def command(baseline, current, more, history_db, as_json, force, per_case, sqnr_drop, error_growth, top1_drop,
            cycles_regression, memory_regression, latency_regression, gate_host_latency):
    """Compare run CURRENT against BASELINE (each a history id, run uuid, label or report.json).

    LLM runs of one bundle-set on different lanes (the same model, weights and prompts, each lowered by
    the lane's own backend), two or more (MORE...): one per-step table, a column per lane (SQNR,
    argmax, verdict); exit 1 when a lane has a step that did not pass.

    Shows every output's max abs error, SQNR, cosine and mismatches side by side
    (baseline → current, delta) and the regressions. The same bundle on two targets is compared;
    runs of different targets otherwise, dtypes, models, test inputs or case sets are refused
    unless --force.

    Performance figures are compared too (cycles, memory in use, warm latency past its noise
    band; thresholds from [perf], docs/performance.md); a figure on one side only is a note.

    Exit code 1 when CURRENT regressed, 0 otherwise, 2 when a run cannot be found or the
    runs are unrelated.
    """
    import json
    import sys

    from bundlerun.bundles.project_config import load_project_config  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.history import store as history  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.history.regression import (
        DELTA_LABELS, DELTA_METRICS, PerfRules, RegressionRules, UnrelatedRuns, check_related, comparison_notes,
        find_regressions, format_perf_deltas, format_regressions, metric_deltas, perf_deltas, unrelated_reasons,
    )  # start-up: not loaded by `bundlerun --help`

    config = load_project_config() or {}
    rules = _overridden(RegressionRules.from_config(config), {
        "--sqnr-drop": ("sqnr_drop_db", sqnr_drop), "--error-growth": ("error_growth", error_growth),
        "--top1-drop": ("top1_drop_points", top1_drop)})
    if force:
        rules = replace(rules, allow_unrelated=True)
    perf_rules = _overridden(PerfRules.from_config(config), {
        "--cycles-regression": ("cycles_regression", cycles_regression),
        "--memory-regression": ("memory_regression", memory_regression),
        "--latency-regression": ("latency_regression", latency_regression)})
    if gate_host_latency:
        perf_rules = replace(perf_rules, gate_host_latency=True)
    db = history.resolve_history_path(history_db, config)
    base = history.resolve_run(db, baseline)
    cur = history.resolve_run(db, current)
    others = [history.resolve_run(db, ref) for ref in more]
    if _lanes_mode(base, cur, others):
        _compare_lanes([base, cur, *others], force, as_json)
        return
    cross = _cross_target(base, cur, unrelated_reasons(base, cur))
    try:
        if not cross:
            check_related(base, cur, rules)
    except UnrelatedRuns as exc:
        raise ConfigError(f"refusing to compare unrelated runs: {exc} (--force compares anyway)") from None
    regs = find_regressions(base, cur, rules, perf_rules)
    notes = comparison_notes(base, cur, perf_rules)
    deltas = metric_deltas(base, cur)
    perf_rows = perf_deltas(base, cur, perf_rules)[0]

    def ident(r: "Report") -> dict:
        run, b = r.run, r.bundle
        return {"history_id": run.get("history_id"), "run_id": run.get("id"), "label": run.get("label"),
                "model": b.get("model"), "dtype": b.get("dtype"), "target": r.target.get("url"),
                "program_sha256": b.get("program_sha256"), "verdict": r.summary.verdict}

    if as_json:
        click.echo(json.dumps({"baseline": ident(base), "current": ident(cur), "forced": bool(force),
                               "cross_target": cross,
                               "unrelated": unrelated_reasons(base, cur) if force else [],
                               "regressions": [r.to_dict() for r in regs], "notes": notes, **deltas,
                               "perf": perf_rows},
                              indent=2, default=str))
        sys.exit(1 if regs else 0)

    from rich.table import Table

    from bundlerun.runner.report.console import plain, wide_console  # start-up: not loaded by `bundlerun --help`

    def who(r):
        i = ident(r)
        tag = f"#{i['history_id']}" if i["history_id"] else str(i["run_id"] or "?")[:12]
        return plain(f"{tag} ({i['model']} {i['dtype']} on {i['target']}, label {i['label']}, {i['verdict']})")

    console = wide_console()
    console.print(f"baseline {who(base)}\ncurrent  {who(cur)}", highlight=False)
    if force:
        for reason in unrelated_reasons(base, cur):
            console.print(f"[yellow]forced:[/] {plain(reason)}", highlight=False)
    for note in notes:
        console.print(f"note: {plain(note)}", highlight=False)
    rows = deltas["case_outputs"] if per_case else deltas["outputs"]
    if rows:
        what = "per case-output" if per_case else "per output, worst over the common cases (mismatches: total)"
        sides = "baseline → current (delta)"
        if cross:  # the same bundle on two targets: each target's error vs the bundle's expected outputs
            sides = plain(f"{ident(base)['target']} → {ident(cur)['target']} (delta), same bundle")
        table = Table(title=f"{sides}, {what}", title_justify="left")
        for col in ("output", "cases" if not per_case else "verdict", *(DELTA_LABELS[m] for m in DELTA_METRICS)):
            table.add_column(col, justify="left" if col == "output" else "right")
        for row in rows:
            if per_case:
                where = f"{row['method']}[{row['case']}].{row['name']}"
                v = row["verdict"]
                second = f"{v['baseline']} → {v['current']}"
            else:
                where = f"{row['method']}.{row['name']}"
                v = row["verdicts"]
                second = f"{row['cases']}: {_counts(v['baseline'])} → {_counts(v['current'])}"
            table.add_row(plain(where), second, *(_cell(row[m], m, _worse(row[m], m)) for m in DELTA_METRICS))
        console.print(table)
    perf_lines = format_perf_deltas(perf_rows)
    if perf_lines:
        console.print("perf, baseline → current (median over the common cases):", highlight=False)
        for line in perf_lines:
            console.print(f"  {plain(line)}", highlight=False)
    for line in format_regressions(regs).splitlines():  # each line already inert (visible); markup escaped here
        console.print(plain(line), highlight=False)
    sys.exit(1 if regs else 0)
