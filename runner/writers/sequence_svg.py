"""An LLM sequence's SQNR and margin against position as an SVG image, drawn without matplotlib.

The HTML report draws one per sequence (runner/writers/html.py). Written by hand because
matplotlib's constrained layout and PNG encoding cost ~1 s per sequence on a loaded 2-core machine:
most of `bundlerun run`'s fixed cost on a 64-step LLM bundle (bench/bench_llm_sequence.py). The same
content as the plot it replaces: SQNR of each step's logits (top; an exact match, +inf, is a ▲ at the
top), the reference token's log-prob margin under the target (bottom; below 0 the greedy token
flipped, the dashed line), each point in its step's verdict colour, the first diverging step dotted.
Every text is escaped; the image is a data: URI the report's CSP already allows.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from bundlerun.runner.judging.outcome import VERDICT_COLOURS
from bundlerun.runner.report.safe_text import visible
from bundlerun.targets.base import Verdict

WIDTH, HEIGHT = 600, 460
LEFT, RIGHT, TOP, GAP, BOTTOM = 64, 14, 30, 34, 40  # margins in px


def escape(text: str) -> str:
    """xml.sax.saxutils.escape without its entities argument (the same three replacements, in its order):
    importing xml.sax.saxutils loads urllib.request, http.client and email, ~15 ms of every run's report."""
    return text.replace("&", "&amp;").replace(">", "&gt;").replace("<", "&lt;")


def _colour(verdict: str) -> str:
    return VERDICT_COLOURS.get(verdict, VERDICT_COLOURS[Verdict.ERROR])[0]


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, str):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _range(values: list[float], zero: bool = False) -> tuple[float, float]:
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 1.0, hi + 1.0
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad


def _text(x: float, y: float, body: str, size: int = 11, anchor: str = "middle", extra: str = "") -> str:
    return (f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' "
            f"font-family='sans-serif' fill='#333'{extra}>{escape(visible(body))}</text>")


def sequence_svg(positions: Sequence[int], sqnrs: Sequence[Any], margins: Sequence[Any], verdicts: Sequence[str],
                 title: str, sqnr_label: str, divergence: int | None = None) -> bytes:
    """The SVG document (bytes) of one sequence: SQNR over margin, sharing the position axis."""
    xs = [float(p) for p in positions]
    s = [_number(v) for v in sqnrs]
    m = [_number(v) for v in margins]
    colours = [_colour(v) for v in verdicts]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_hi - x_lo < 1e-12:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    plot_w = WIDTH - LEFT - RIGHT
    panel_h = (HEIGHT - TOP - GAP - BOTTOM) / 2

    def px(x: float) -> float:
        return LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}'>",
           f"<rect width='{WIDTH}' height='{HEIGHT}' fill='#fff'/>", _text(WIDTH / 2, 18, title, 13)]

    def panel(top: float, values: list[float | None], label: str, zero_line: bool, exact_marks: bool) -> None:
        finite = [(x, v, c) for x, v, c in zip(xs, values, colours) if v is not None and math.isfinite(v)]
        lo, hi = _range([v for _, v, _ in finite], zero=zero_line)

        def py(v: float) -> float:
            return top + panel_h - (v - lo) / (hi - lo) * panel_h

        out.append(f"<rect x='{LEFT}' y='{top:.1f}' width='{plot_w}' height='{panel_h:.1f}' fill='none' stroke='#888'/>")
        for v in (lo, (lo + hi) / 2, hi):
            y = py(v)
            out.append(f"<line x1='{LEFT - 4}' y1='{y:.1f}' x2='{LEFT}' y2='{y:.1f}' stroke='#888'/>")
            out.append(_text(LEFT - 6, y + 4, _fmt(v), 9, "end"))
        out.append(_text(14, top + panel_h / 2, label, 10, "middle",
                         f" transform='rotate(-90 14 {top + panel_h / 2:.1f})'"))
        if zero_line and lo < 0 < hi:
            y = py(0.0)
            out.append(f"<line x1='{LEFT}' y1='{y:.1f}' x2='{LEFT + plot_w}' y2='{y:.1f}' stroke='{_colour(Verdict.FAIL)}' "
                       "stroke-dasharray='6 4'/>")
        if len(finite) > 1:
            points = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v, _ in finite)
            out.append(f"<polyline points='{points}' fill='none' stroke='#999' stroke-width='0.8'/>")
        for x, v, c in finite:
            out.append(f"<circle cx='{px(x):.1f}' cy='{py(v):.1f}' r='3' fill='{c}'/>")
        if exact_marks:
            for x, raw, c in zip(xs, values, colours):
                if raw is not None and raw == math.inf:
                    cx, cy = px(x), top + 8
                    out.append(f"<path d='M{cx:.1f},{cy - 5:.1f} L{cx + 5:.1f},{cy + 4:.1f} L{cx - 5:.1f},{cy + 4:.1f} Z' "
                               f"fill='{c}'><title>exact match (inf dB)</title></path>")
        if divergence is not None and 0 <= divergence < len(xs):
            x = px(xs[divergence])
            out.append(f"<line x1='{x:.1f}' y1='{top:.1f}' x2='{x:.1f}' y2='{top + panel_h:.1f}' "
                       f"stroke='{_colour(Verdict.FAIL)}' stroke-dasharray='2 3' stroke-width='1.2'/>")

    panel(TOP, s, sqnr_label, False, True)
    bottom_top = TOP + panel_h + GAP
    panel(bottom_top, m, "margin (log-prob)", True, False)
    axis_y = bottom_top + panel_h
    ticks = sorted({int(x) for x in xs}) if xs else []
    step = max(1, math.ceil(len(ticks) / 10))
    for t in ticks[::step]:
        out.append(f"<line x1='{px(t):.1f}' y1='{axis_y:.1f}' x2='{px(t):.1f}' y2='{axis_y + 4:.1f}' stroke='#888'/>")
        out.append(_text(px(t), axis_y + 15, str(t), 9))
    out.append(_text(LEFT + plot_w / 2, HEIGHT - 8, "position (input_pos of the step)", 10))
    out.append("</svg>")
    return "".join(out).encode("utf-8")
