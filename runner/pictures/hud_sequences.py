"""The HUD's per-sequence pages: an LLM row's sequence figures over commits (`seq/<row>.html`).

An LLM run (model id `llm:ARCH`) is judged per sequence (runner/report/sequences.py); the history
keeps each sequence's figures in table sequence_figures (runner/history/schema.py). For each such
row of the grid this page shows, per sequence, one line per commit the row has a run at: first
diverging step, greedy agreement length, perplexity under the target and the eager reference and
their ratio, worst and median step SQNR and the verdict, plus a sparkline of the worst SQNR and of
the greedy agreement. The row's name and each of its cells link here (runner/pictures/hud_page.py).
Self-contained like every HUD page: inline CSS and SVG, no script, everything escaped.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from bundlerun.runner.history.commits import looks_like_sha
from bundlerun.runner.pictures.hud_grid import Column, Row
from bundlerun.runner.writers.html import _e

PREFIX = "llm:"  # the model ids judged per sequence (runner/judging/judge.py)


def has_sequences(row: Row) -> bool:
    return bool(row.model) and str(row.model).startswith(PREFIX)


def page_name(row: Row) -> str:
    """`seq/<16 hex>.html`: a name from the row's series key, stable across builds."""
    return f"seq/{hashlib.sha256(repr(row.key).encode()).hexdigest()[:16]}.html"


def digest(row: Row, cols: list[Column], run_pages: set[int]) -> str:
    """What the page shows, as a hash: a recorded run never changes, so its id stands for its figures."""
    parts = [repr(row.key)] + [f"{c.key},{row.cells[c.key].run.id},{row.cells[c.key].run.id in run_pages:d}"
                               for c in cols if c.key in row.cells]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _n(value: Any, spec: str) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float) and math.isinf(value):
        return "exact" if value > 0 else "-inf"
    return format(value, spec)


def _spark(values: list[float | None], width: int = 220, height: int = 28) -> str:
    """An inline SVG line of the finite values (None and inf are gaps: no number to draw)."""
    pts = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if len(pts) < 2:
        return ""
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    span, step = (hi - lo) or 1.0, (width - 4) / max(1, len(values) - 1)
    path = " ".join(f"{2 + i * step:.1f},{height - 3 - (v - lo) / span * (height - 6):.1f}" for i, v in pts)
    return (f"<svg class='spark' width='{width}' height='{height}' role='img'><polyline fill='none' stroke='#1565c0' "
            f"stroke-width='1.5' points='{path}'/></svg>")


COLUMNS = ("commit", "run", "verdict", "first diverging step", "greedy agreement", "perplexity target",
           "perplexity eager", "ratio", "worst step SQNR dB", "median step SQNR dB")


def render(row: Row, cols: list[Column], figures: dict[int, list[dict[str, Any]]], run_pages: dict[int, str]) -> str:
    """The page of one row: one table per sequence (method, name), a line per commit the row ran at."""
    by_seq: dict[tuple[str, int, str], list[tuple[Column, Any, dict[str, Any]]]] = {}
    for col in cols:
        cell = row.cells.get(col.key)
        if cell is None:
            continue
        for f in figures.get(cell.run.id, []):
            by_seq.setdefault((f["method"], int(f["sequence_index"]), f["name"] or ""), []).append((col, cell.run, f))
    sections: list[str] = []
    anchored: set[int] = set()  # `#run<id>` (a cell's link) lands on the run's first line
    for (method, index, name), lines in sorted(by_seq.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        body = []
        for col, run, f in lines:
            shown = col.key[:12] if looks_like_sha(col.key) else col.key
            link = run_pages.get(run.id)
            run_html = f"<a href='../{_e(link)}'>#{run.id}</a>" if link else f"#{run.id}"
            first = "none" if f["first_divergence"] is None else str(f["first_divergence"])
            cls = "ok" if f["verdict"] == "PASS" else "bad"
            anchor = f"run{run.id}" if run.id not in anchored else f"run{run.id}-{index}"
            anchored.add(run.id)
            body.append(
                f"<tr id='{_e(anchor)}'><td class='k' title='{_e(col.key)}'>{_e(shown)}</td>"
                f"<td>{run_html}</td><td class='{cls}'>{_e(f['verdict'])}</td><td>{first}</td>"
                f"<td>{_n(f['greedy_agreement'], 'd')}/{_n(f['steps'], 'd')}</td><td>{_n(f['perplexity_target'], '.5g')}</td>"
                f"<td>{_n(f['perplexity_reference'], '.5g')}</td><td>{_n(f['perplexity_ratio'], '.4f')}</td>"
                f"<td>{_n(f['sqnr_worst'], '.1f')}</td><td>{_n(f['sqnr_median'], '.1f')}</td></tr>")
        worst = _spark([f["sqnr_worst"] for _, _, f in lines])
        agree = _spark([None if f["greedy_agreement"] is None else float(f["greedy_agreement"]) for _, _, f in lines])
        title = name if method == "forward" else f"{method}: {name}"
        sparks = ((f"<p class='meta'>worst step SQNR over commits {worst}</p>" if worst else "")
                  + (f"<p class='meta'>greedy agreement over commits {agree}</p>" if agree else ""))
        sections.append(f"<h2>{_e(title)}</h2>{sparks}<table><thead><tr>"
                        + "".join(f"<th>{c}</th>" for c in COLUMNS) + f"</tr></thead><tbody>{''.join(body)}</tbody></table>")
    if not sections:
        sections.append("<p>No per-sequence figures recorded for these runs (runs recorded before the history kept "
                        "them, or runs that did not complete).</p>")
    what = f"{row.model} · {row.target} · {row.dtype}" + (f" · {row.tag}" if row.tag else "")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>bundlerun HUD: sequences of {_e(row.model)}</title><style>{_CSS}</style></head><body>"
            "<p class='meta'><a href='../index.html'>&larr; accuracy HUD</a></p>"
            f"<h1>per-sequence figures: {_e(what)}</h1>"
            "<p class='meta'>one line per commit (oldest first; the row's latest run there). first diverging step: the "
            "first step whose verdict or argmax parts from the eager reference (none: every step agreed); greedy "
            "agreement: leading steps whose target token is the reference token; perplexity of the teacher-forced "
            "tokens under the target and the eager model, and their ratio; worst / median step SQNR of the logits "
            "(exact: every step matched bit for bit). docs/llm.md.</p>"
            + "".join(sections) + "</body></html>")


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:1.2em} h2{font-size:1.05em;margin:18px 0 4px} .meta{color:#555;font-size:.86em;margin:2px 0}
table{border-collapse:collapse;font-size:.84em;background:#fff} th,td{border:1px solid #e0e0e0;padding:2px 6px;
text-align:right;white-space:nowrap} th{background:#f0f0f0} td.k{font-family:ui-monospace,Menlo,monospace;text-align:left}
.bad{color:#c62828;font-weight:600} .ok{color:#2e7d32} svg.spark{vertical-align:middle;margin-left:6px}
"""
