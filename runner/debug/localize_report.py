"""Reports of `bundlerun debug`: the per-layer table as report.json ("debug" section,
docs/report-schema.md), summary.md, and a self-contained report.html with a plot of
SQNR and max error along the graph, the first bad layer marked; plus the rich table."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

from bundlerun.runner.debug.localize import DebugResult, LayerRow
from bundlerun._version import __version__
from bundlerun.bundles.fileio import atomic_write_bytes, atomic_write_text
from bundlerun.runner.debug.export_divergence import divergence_lines, divergence_tables, summary_line
from bundlerun.runner.debug.localize import _QDQ
from bundlerun.runner.pictures.plots import _figure, _png, _text
from bundlerun.runner.report.safe_text import visible


def _f(x: Any, fmt: str = ".3g") -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def short_op(name: str) -> str:
    """'quantized_decomposed::dequantize_per_tensor.out' -> 'dequantize_per_tensor'."""
    base = name.split("::")[-1]
    for suffix in (".out", ".default"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base


def merged_into(row: LayerRow, rows: list[LayerRow]) -> int | None:
    """The row an unmatched row's debug handles were merged into (compared there), if any."""
    if row.status != "unmatched" or not row.note or "overlap instruction" not in row.note:
        return None
    return next((r.index for r in rows if r.status == "matched" and r.instruction is not None
                 and f"overlap instruction {r.instruction} " in row.note), None)


def instr_text(row: LayerRow) -> str:
    """The instruction column: "4", or "1:19" for operator 19 inside the delegate call at instruction 1."""
    return f"{row.instruction}:{row.delegate_op}" if row.delegate_op is not None else str(row.instruction)


def where_text(row: LayerRow) -> str:
    """"instruction 4", or "instruction 1, TOSA operator 19" for an operator inside a delegate call."""
    if row.delegate_op is None:
        return f"instruction {row.instruction}"
    inside = "MLX instruction" if row.runtime_op.startswith("mlx.") else (
        "TOSA operator" if row.runtime_op.startswith("tosa.") else "delegate operator")
    return f"instruction {row.instruction}, {inside} {row.delegate_op}"


def status_text(row: LayerRow, result: DebugResult) -> str:
    if row.status == "unmatched" and row.compared_at is not None:
        return f"step→#{row.compared_at}"
    if row.status == "unmatched":
        target = merged_into(row, result.rows)
        return f"unmatched→#{target}" if target is not None else "unmatched"
    if row.index == result.first_bad:
        return "FIRST BAD"
    return "exceeds" if row.exceeds else "ok"


def ops_text(aot_ops: list[str], limit: int = 4) -> str:
    """The eager nodes of a row, compact: quantize/dequantize nodes left out when others exist, a long
    group (a whole delegate) shortened to its first and last nodes with the count (report.json has all)."""

    if not aot_ops:
        return "—"
    main = [n for n in aot_ops if not any(q in n for q in _QDQ)] or list(aot_ops[-1:])
    if len(main) <= limit:
        text = ", ".join(main)
    else:
        text = f"{main[0]}, {main[1]}, …, {main[-1]}"
    return text + (f" ({len(aot_ops)} nodes)" if len(main) != len(aot_ops) or len(main) > limit else "")


def verdict_line(result: DebugResult) -> str:
    row = result.first_bad_row
    where = f"{result.target}, case {result.case} ({result.case_source}), output {result.output}"
    if row is None and (result.export_divergence or {}).get("finding"):  # runner/debug/export_divergence.py
        return (f"divergence at export, not at run time: no runtime layer exceeds its budget against the exported "
                f"program, but the output fails against eager; {summary_line(result.export_divergence)} ({where})")
    if row is None:
        return f"no layer exceeds its share of the budget ({where})"
    col = row.judged(result.judged_column)
    attribution = f"; attributed to {row.attribution}" if row.attribution else ""
    module = f" in {row.module}" if row.module else ""
    return (f"first bad layer: {where_text(row)} {row.runtime_op} = {ops_text(row.aot_ops, 6)}{module}: "
            f"SQNR {_f(col.sqnr, '.1f')} dB < floor {_f(row.floor_db, '.1f')} dB, max error {_f(col.error_max)}"
            f"{attribution} ({where})")


def rich_table(result: DebugResult):
    from rich.table import Table

    quantized = any(r.quantized is not None for r in result.rows)
    from bundlerun.runner.report.console import plain  # names come from the bundle: inert, markup escaped

    table = Table(title=plain(f"{result.model or result.bundle} {result.dtype or ''} on {result.target}: case "
                              f"{result.case}, {result.output}"), title_justify="left")
    for col in ("#", "instr", "runtime op", "eager op(s)", "shape"):
        table.add_column(col, justify="right" if col in ("#", "instr") else "left", no_wrap=col != "eager op(s)",
                         max_width=28 if col == "eager op(s)" else None)
    num = {"justify": "right", "no_wrap": True, "min_width": 8}
    table.add_column("SQNR fp32", **num)
    table.add_column("max err fp32", **num)
    if not quantized:  # the console keeps to the columns that decide; report.json/summary.md have them all
        table.add_column("cos fp32", **num)
    else:
        table.add_column("SQNR quant", **num)
        table.add_column("quant vs fp32", **num)
    table.add_column("floor", justify="right", no_wrap=True, min_width=5)
    table.add_column("status", no_wrap=True)
    if quantized:
        table.add_column("cause", no_wrap=True)
    for r in result.rows:
        status = status_text(r, result)
        style = {"FIRST BAD": "bold red", "exceeds": "red"}.get(status, "dim" if r.status == "unmatched" else "")
        cells = [str(r.index), instr_text(r), short_op(r.runtime_op), ops_text(r.aot_ops),
                 "x".join(map(str, r.shape)) or "—",
                 _f(r.fp32.sqnr if r.fp32 else None, ".1f"), _f(r.fp32.error_max if r.fp32 else None)]
        if not quantized:
            cells.append(_f(r.fp32.cosine if r.fp32 else None, ".5f"))
        else:
            cells += [_f(r.quantized.sqnr if r.quantized else None, ".1f"),
                      _f(r.quant_vs_fp32.sqnr if r.quant_vs_fp32 else None, ".1f")]
        cells += [_f(r.floor_db, ".1f"), status]
        if quantized:
            cells.append(r.attribution or "")
        from rich.text import Text

        table.add_row(*[Text(visible(c)) for c in cells], style=style)
    return table


def plot_png(result: DebugResult) -> bytes:
    """SQNR (and max error) of every compared row along the graph; the first bad layer marked."""

    rows = [r for r in result.rows if r.status == "matched"]
    fig = _figure(9.0, 5.2)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    xs = list(range(len(rows)))

    def series(col: str, attr: str):
        out = []
        for r in rows:
            c = getattr(r, col)
            v = getattr(c, attr) if c is not None else None
            out.append(float("nan") if v is None or (isinstance(v, float) and math.isinf(v)) else min(float(v), 160.0)
                       if attr == "sqnr" else (float("nan") if v is None else float(v)))
        return out

    ax.plot(xs, series("fp32", "sqnr"), "o-", label="runtime vs fp32")
    if any(r.quantized for r in rows):
        ax.plot(xs, series("quantized", "sqnr"), "s-", label="runtime vs quantized reference")
    floors = [r.floor_db if r.floor_db is not None else float("nan") for r in rows]
    ax.plot(xs, floors, "--", color="gray", label="floor (share of the output budget)")
    ax.set_ylabel("SQNR dB")
    ax2.plot(xs, series("fp32", "error_max"), "o-", label="max |error| vs fp32")
    if any(r.quantized for r in rows):
        ax2.plot(xs, series("quantized", "error_max"), "s-", label="max |error| vs quantized")
    ax2.set_yscale("symlog", linthresh=1e-8)
    ax2.set_ylabel("max |error|")
    bad = result.first_bad_row
    if bad is not None and bad in rows:
        k = rows.index(bad)
        for a in (ax, ax2):
            a.axvline(k, color="red", linewidth=2, alpha=0.6)
        ax.annotate(_text(f"first bad: {ops_text(bad.aot_ops)}"), (k, floors[k] if not math.isnan(floors[k]) else 0),
                    color="red", xytext=(5, 5), textcoords="offset points")
    ax2.set_xticks(xs)
    ax2.set_xticklabels([_text(ops_text(r.aot_ops, 1)[:24]) for r in rows], rotation=60, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    ax2.legend(fontsize=7)
    ax.set_title(_text(f"{result.model or ''} {result.dtype or ''} on {result.target}, case {result.case}"))
    return _png(fig)


def summary_md(result: DebugResult) -> str:
    quantized = any(r.quantized is not None for r in result.rows)
    lines = [f"# bundlerun debug: {result.model or result.bundle} on {result.target}", "",
             f"**{verdict_line(result)}**", "",
             f"- bundle: `{result.bundle}`; case {result.case} ({result.case_source}); output `{result.output}`",
             f"- intermediates: {result.granularity}",
             f"- reference graph: {result.reference_graph}; judged column: {result.judged_column}",
             f"- budget: {_f(result.budget_db, '.1f')} dB ({result.budget_source})", ""]
    lines += [f"- note: {n}" for n in result.notes]
    head = ["#", "instr", "runtime op", "eager op(s)", "SQNR fp32", "max err fp32", "cos fp32"]
    if quantized:
        head += ["SQNR quant", "max err quant", "quant vs fp32"]
    head += ["floor", "status"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result.rows:
        status = status_text(r, result).replace("FIRST BAD", "**FIRST BAD**")
        if r.attribution and r.exceeds:
            status += f" ({r.attribution})"
        cells = [str(r.index), instr_text(r), f"`{r.runtime_op}`", ops_text(r.aot_ops),
                 _f(r.fp32.sqnr if r.fp32 else None, ".1f"), _f(r.fp32.error_max if r.fp32 else None),
                 _f(r.fp32.cosine if r.fp32 else None, ".5f")]
        if quantized:
            cells += [_f(r.quantized.sqnr if r.quantized else None, ".1f"),
                      _f(r.quantized.error_max if r.quantized else None),
                      _f(r.quant_vs_fp32.sqnr if r.quant_vs_fp32 else None, ".1f")]
        cells += [_f(r.floor_db, ".1f"), status + (f" — {r.note}" if r.note else "")]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    found = result.export_divergence or {}
    if found.get("finding"):  # runner/debug/export_divergence.py: where eager and the exported program part
        lines += ["", "## Divergence at export", "", found["finding"]]
        for title, head, rows in divergence_tables(found):
            lines += ["", f"{title}:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        lines += [""] + [f"- {line}" for line in divergence_lines(found)]
    from bundlerun.runner.report.safe_text import visible  # each line inert: a name cannot start a line of its own

    return "\n".join(visible(line) for line in lines) + "\n"


def html_page(result: DebugResult, png: bytes) -> str:
    from bundlerun.runner.writers.html import _e as e  # entities + controls/bidi made visible (runner/report/safe_text.py)
    md_rows = []
    for r in result.rows:
        cls = "bad" if r.index == result.first_bad else ("exceeds" if r.exceeds else r.status)
        status = status_text(r, result)
        cells = [r.index, instr_text(r), r.runtime_op, ops_text(r.aot_ops),
                 "x".join(map(str, r.shape)), _f(r.fp32.sqnr if r.fp32 else None, ".1f"),
                 _f(r.fp32.error_max if r.fp32 else None), _f(r.fp32.cosine if r.fp32 else None, ".5f"),
                 _f(r.quantized.sqnr if r.quantized else None, ".1f"),
                 _f(r.quant_vs_fp32.sqnr if r.quant_vs_fp32 else None, ".1f"), _f(r.floor_db, ".1f"),
                 status + (f" ({r.attribution})" if r.attribution and r.exceeds else ""), r.note or ""]
        md_rows.append(f'<tr class="{cls}">' + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
    head = ["#", "instr", "runtime op", "eager op(s)", "shape", "SQNR fp32 dB", "max err fp32", "cos fp32",
            "SQNR quant dB", "quant vs fp32 dB", "floor dB", "status", "note"]
    img = base64.b64encode(png).decode()
    title = f"bundlerun debug: {result.model or result.bundle} on {result.target}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:2px 6px}} tr.bad td{{background:#fbb;font-weight:bold}}
tr.exceeds td{{background:#fee}} tr.unmatched td{{color:#777;font-style:italic}}</style></head>
<body><h1>{e(title)}</h1>
<p class="verdict"><strong>{e(verdict_line(result))}</strong></p>
<ul><li>bundle: {e(result.bundle)}; case {result.case} ({e(result.case_source)}); output {e(result.output)}</li>
<li>intermediates: {e(result.granularity)}</li>
<li>reference graph: {e(result.reference_graph)}; judged column: {e(result.judged_column)}</li>
<li>budget: {e(_f(result.budget_db, '.1f'))} dB ({e(result.budget_source)})</li>
{''.join(f'<li>note: {e(n)}</li>' for n in result.notes)}</ul>
<img src="data:image/png;base64,{img}" alt="SQNR and max error along the graph">
<table><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr>
{chr(10).join(md_rows)}
</table>{_divergence_html(result, e)}</body></html>
"""


def _divergence_html(result: DebugResult, e) -> str:
    """The divergence-at-export tables and lines (runner/debug/export_divergence.py), when there is one."""
    found = result.export_divergence or {}
    if not found.get("finding"):
        return ""

    parts = [f"<h2>Divergence at export</h2><p>{e(found['finding'])}</p>"]
    for title, head, rows in divergence_tables(found):
        body = "".join(f'<tr class="{"bad" if row[-1] == "FIRST DIVERGENT" else ""}">'
                       + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
        parts.append(f"<h3>{e(title)}</h3><table><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr>{body}</table>")
    parts.append("<ul>" + "".join(f"<li>{e(line)}</li>" for line in divergence_lines(found)) + "</ul>")
    return "\n".join(parts)


def write_debug_reports(result: DebugResult, report_dir: Path) -> dict[str, Path]:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)

    body = {"schema": "bundlerun.debug/1", "kind": "debug", "tool": {"name": "bundlerun", "version": __version__},
            "debug": result.to_json()}
    files = {"json": report_dir / "report.json", "markdown": report_dir / "summary.md",
             "html": report_dir / "report.html"}
    atomic_write_text(files["json"], json.dumps(body, indent=2, allow_nan=False, default=str))
    atomic_write_text(files["markdown"], summary_md(result))
    png = plot_png(result)
    atomic_write_bytes(report_dir / "layers.png", png)
    atomic_write_text(files["html"], html_page(result, png))
    return files
