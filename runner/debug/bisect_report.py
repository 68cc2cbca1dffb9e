"""What `bundlerun bisect` writes and prints: report.json (schema bundlerun.bisect/1, see
docs/report-schema.md), summary.md and the console view. Every text quoted from a model or a
runtime goes through the same escaping as the run reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bundlerun.runner.debug.bisect import BisectResult, unit_label
from bundlerun.bundles.fileio import atomic_write_text
from bundlerun.runner.report.console import plain
from bundlerun.runner.report.safe_text import markdown_text as _md


def _num(v: Any, fmt: str = ".3g") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else ("—" if v is None else str(v))


def _stats(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for out in outputs or []:
        s = out.get("stats") or {}
        text = f"{out.get('name')} {out.get('verdict')}: SQNR {_num(s.get('sqnr'), '.1f')} dB, max |err| " \
               f"{_num(s.get('error_max'))}, MAE {_num(s.get('error_mae'))}"
        if s.get("error_max_steps") is not None:
            text += f" ({_num(s.get('error_max_steps'), '.2f')} / {_num(s.get('error_mae_steps'), '.2f')} quant steps)"
        parts.append(text)
    return "; ".join(parts) or "—"


def _where(result: BisectResult) -> str:
    where = f"{result.model} on {result.target}, {result.method}[{result.case}]"
    seq = result.sequence
    if seq:
        where += (f" = step {seq.get('step')} of sequence {seq.get('name')} ({seq.get('kind')} at position "
                  f"{seq.get('start_pos')}" + (f", {len(seq.get('prefix') or [])} earlier step(s) replayed" if seq.get("prefix")
                                               else "") + ")")
    return where


def verdict_line(result: BisectResult) -> str:
    where = _where(result)
    if result.interrupted:
        found = f"; found so far: {culprit_text(result)}" if result.culprits else ""
        return f"bisect {result.interrupted} after {result.lowerings} lowering(s) ({where}){found}"
    if result.outcome == "nothing-fails":
        return f"nothing fails: {where} passes with the full delegation (1 lowering)"
    if result.outcome == "nothing-delegated":
        return f"{where} fails, but the delegate takes no node: the portable kernels or the model"
    if result.outcome == "fails-undelegated":
        return (f"{where} fails even with nothing delegated ({result.lowerings} lowerings): the cause is in the "
                "portable kernels or the model itself, not in the delegate")
    if result.outcome == "culprit":
        return (f"culprit: {culprit_text(result)} ({where}; {result.lowerings} lowerings, bound "
                f"{result.bound} for one culprit among {len(result.units)} delegated units)")
    return f"bisect stopped after {result.lowerings} lowering(s) ({where}): {result.notes[-1] if result.notes else ''}"


def culprit_text(result: BisectResult) -> str:
    sets = []
    for cs in result.culprits:
        labels = [unit_label(u) for u in cs["units"]]
        sets.append((" + ".join(labels)) + (" (together)" if cs.get("interacting") else ""))
    return "; ".join(sets)


def print_result(result: BisectResult, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"bisect {plain(_where(result))}",
                  title_justify="left")
    for col in ("#", "candidate", "delegated", "calls", "verdict", "error", "build", "run"):
        table.add_column(col, justify="right" if col in ("#", "delegated", "calls", "build", "run") else "left")
    n = len(result.units)
    for step in result.steps:
        table.add_row(str(step.index), step.role, f"{len(step.delegated)}/{n}", _num(step.delegate_calls),
                      plain(step.verdict or "—"), plain(_stats(step.outputs) if step.outputs else (step.error or "—")),
                      f"{_num(step.build_s, '.1f')} s" + (" (cached)" if step.cache == "hit" else ""),
                      f"{_num(step.run_s, '.1f')} s")
    console.print(table)
    for k, cs in enumerate(result.culprits, start=1):
        console.print(f"culprit set {k}{' (interacting: they fail only together)' if cs.get('interacting') else ''}:",
                      markup=False, style="bold red")
        for unit in cs["units"]:
            console.print(f"  {unit_label(unit)}", markup=False)
            console.print(f"    nodes: {', '.join(unit.get('nodes') or [])}; delegate {unit.get('backend')}", markup=False)
            if unit.get("place"):
                console.print(f"    place: {unit['place']}", markup=False)
            if unit.get("source"):
                console.print(f"    source: {unit['source']}", markup=False)
        console.print(f"  with only them delegated: {_stats(cs['with']['outputs'])}", markup=False)
        console.print(f"  with everything else delegated: {_stats(cs['without']['outputs'])}", markup=False)
    if result.export_divergence:
        from bundlerun.runner.debug.export_divergence import summary_line  # start-up: loads numpy on use

        console.print(f"export divergence: {summary_line(result.export_divergence)}", markup=False)
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    console.print(verdict_line(result), markup=False, style="bold red" if result.exit_code == 1 else "")


def render_markdown(result: BisectResult) -> str:
    lines = [f"# bisect: {_md(result.model)} on {_md(result.target)}", "",
             f"Case {_md(_where(result))}, {result.backend or ''} {result.dtype or ''}; "
             f"{len(result.units)} delegated unit(s); mechanism: {_md(result.mechanism)}.", "",
             f"**{_md(verdict_line(result))}**", ""]
    for k, cs in enumerate(result.culprits, start=1):
        lines += [f"## Culprit set {k}" + (" (interacting)" if cs.get("interacting") else ""), "",
                  "| unit | op | eager module | place | source | nodes |", "|---|---|---|---|---|---|"]
        for u in cs["units"]:
            lines.append(f"| {_md(u.get('key'))} | {_md(u.get('op'))} | {_md(u.get('module') or '—')} | "
                         f"{_md(u.get('place') or '—')} | {_md(u.get('source') or '—')} | "
                         f"{_md(', '.join(u.get('nodes') or []))} |")
        lines += ["", f"- only these delegated: {_md(_stats(cs['with']['outputs']))}",
                  f"- everything else delegated: {_md(_stats(cs['without']['outputs']))}", ""]
    lines += ["## Lowerings", "", "| # | candidate | delegated | delegate calls | verdict | error | build cache |",
              "|---|---|---|---|---|---|---|"]
    for s in result.steps:
        lines.append(f"| {s.index} | {s.role} | {len(s.delegated)}/{len(result.units)} | {_num(s.delegate_calls)} | "
                     f"{_md(s.verdict or '—')} | {_md(_stats(s.outputs) if s.outputs else (s.error or '—'))} | "
                     f"{_md(s.cache or '—')} |")
    if result.export_divergence:
        from bundlerun.runner.debug.export_divergence import summary_line  # start-up: loads numpy on use

        lines += ["", f"Export divergence: {_md(summary_line(result.export_divergence))}"]
    if result.notes:
        lines += ["", *[f"- {_md(n)}" for n in result.notes]]
    return "\n".join(lines) + "\n"


def write_reports(result: BisectResult, report_dir: Path) -> dict[str, Path]:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": report_dir / "report.json", "markdown": report_dir / "summary.md"}
    atomic_write_text(files["json"], json.dumps(result.to_json(), indent=2, default=str, allow_nan=False))
    atomic_write_text(files["markdown"], render_markdown(result))
    return files
