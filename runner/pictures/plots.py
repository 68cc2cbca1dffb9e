"""PNG plots for the HTML report and `bundlerun trend` (matplotlib, Agg, no pyplot).

The Figure/FigureCanvasAgg API is used directly so no GUI backend or global
pyplot state is involved: safe in CI, threads and headless machines.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np
from bundlerun.targets.base import Verdict
from bundlerun.runner.history.series import tags
from bundlerun.runner.report.criteria_text import number
from bundlerun.runner.pictures import warm

MAX_SCATTER_POINTS = 20_000


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), *range(0x7f, 0xa0)]}


def _text(value: Any) -> str:
    """Text from a bundle or the user as a plot label: literal, never mathtext (`$` escaped),
    controls and lone surrogates made visible."""
    from bundlerun.runner.report.safe_text import visible  # controls, bidi, invisible characters, surrogates

    return visible(value).replace("$", r"\$")


def _matplotlib_ready() -> None:
    """matplotlib's import started on a thread while the target ran (runner/pictures/warm.py) is done."""
    warm.wait()


def _figure(width: float = 5.0, height: float = 3.4):
    _matplotlib_ready()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _verdict_colour(verdict: str) -> str:
    from bundlerun.runner.judging.outcome import VERDICT_COLOURS  # the one palette of verdicts

    return VERDICT_COLOURS.get(verdict, VERDICT_COLOURS[Verdict.ERROR])[0]


def within_bound(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Per element: |actual - expected| <= atol + rtol*|expected| (runner/judging/numerics.py elementwise_bound);
    NaN matches NaN and equal infinities match, as judge_output counts them."""
    a = np.asarray(actual, np.float64).ravel()
    e = np.asarray(expected, np.float64).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.abs(a - e) <= atol + rtol * np.abs(e)
    return ok | (np.isnan(a) & np.isnan(e)) | (np.isinf(a) & (a == e))


def bound_text(atol: float, rtol: float) -> str:
    """The element-wise bound as a plot's legend says it."""

    if rtol:  # the lines are at ±atol; each element's own bound is wider by rtol·|expected|
        return f"bound ±{number(atol)} + {number(rtol)}·|expected| per element (lines: ±{number(atol)})"
    return f"bound ±{number(atol)} (atol + qtol × scale)"


def error_histogram(actual: np.ndarray, expected: np.ndarray, title: str,
                    bound: tuple[float, float] | None = None) -> bytes:
    """Histogram of signed errors (actual - expected) over every element given. With the output's
    element-wise `bound` (atol, rtol): elements within it and over it are stacked in the PASS and
    FAIL colours, and ±atol is drawn (with rtol, each element's own bound is wider by rtol·|expected|,
    so the colour, not the line, tells whether it passed)."""
    a = np.asarray(actual, np.float64).ravel()
    e = np.asarray(expected, np.float64).ravel()
    err = a - e
    finite = np.isfinite(err)
    ok = within_bound(a, e, *bound)[finite] if bound is not None else None
    err = err[finite]
    fig = _figure(5.0, 3.4 if bound is None else 3.9)
    ax = fig.add_subplot()
    if err.size:
        bins = min(60, max(10, int(np.sqrt(err.size))))
        if ok is None:
            ax.hist(err, bins=bins, color="#3b6ea5", edgecolor="white", linewidth=0.3)
        else:
            lo, hi = float(err.min()), float(err.max())
            if bound[1] == 0 and bound[0] > 0:  # the bound lines in view
                lo, hi = min(lo, -bound[0] * 1.1), max(hi, bound[0] * 1.1)
            edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
            ax.hist([err[ok], err[~ok]], bins=edges, stacked=True, edgecolor="white", linewidth=0.3,
                    color=[_verdict_colour(Verdict.PASS), _verdict_colour(Verdict.FAIL)],
                    label=[f"within bound: {int(ok.sum())}", f"over bound: {int((~ok).sum())}"])
            for sign in (-1, 1):
                ax.axvline(sign * bound[0], color=_verdict_colour(Verdict.FAIL), linestyle="--", linewidth=1.2,
                           label=bound_text(*bound) if sign > 0 else None)
            fig.legend(fontsize=7, loc="outside lower center", ncols=2)  # below the plot: never over a bar
        ax.axvline(0, color="#444", linewidth=0.8)
    else:
        ax.text(0.5, 0.5, "no finite errors", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("actual − expected")
    ax.set_ylabel("elements")
    ax.set_title(_text(title), fontsize=10)
    ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))
    return _png(fig)


def scatter(actual: np.ndarray, expected: np.ndarray, title: str, passed: np.ndarray | None = None,
            passed_label: tuple[str, str] = (Verdict.PASS, Verdict.FAIL)) -> bytes:
    """Actual vs expected, with the identity line; subsampled deterministically. Each point is
    coloured by its own verdict, `passed` (per element), when given."""
    a = np.asarray(actual, np.float64).ravel()
    e = np.asarray(expected, np.float64).ravel()
    p = np.ones(a.shape, bool) if passed is None else np.asarray(passed, bool).ravel()
    ok = np.isfinite(a) & np.isfinite(e)
    a, e, p = a[ok], e[ok], p[ok]
    if a.size > MAX_SCATTER_POINTS:
        idx = np.linspace(0, a.size - 1, MAX_SCATTER_POINTS).astype(np.int64)
        idx = np.union1d(idx, np.flatnonzero(~p)[:MAX_SCATTER_POINTS])  # every failing point stays
        a, e, p = a[idx], e[idx], p[idx]
    fig = _figure(4.2, 3.6 if passed is None else 3.9)
    ax = fig.add_subplot()
    if a.size:
        lo, hi = float(min(a.min(), e.min())), float(max(a.max(), e.max()))
        pad = (hi - lo) * 0.05 or 1.0
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="#999", linewidth=0.8, zorder=1, label="actual = expected")
        size = 14 if a.size < 2000 else 4
        if passed is None:
            ax.scatter(e, a, s=size, alpha=0.6, color="#3b6ea5", linewidths=0, zorder=2)
        else:
            for mask, verdict, name, z in ((p, Verdict.PASS, passed_label[0], 2), (~p, Verdict.FAIL, passed_label[1], 3)):
                if mask.any():
                    ax.scatter(e[mask], a[mask], s=size, alpha=0.7, color=_verdict_colour(verdict), linewidths=0,
                               zorder=z, label=f"{name}: {int(mask.sum())}")
        fig.legend(fontsize=7, loc="outside lower center", ncols=3)
    ax.set_xlabel("expected")
    ax.set_ylabel("actual")
    ax.set_title(_text(title), fontsize=10)
    return _png(fig)


SQNR_LABEL = "SQNR (dB, signal = reference)"  # the report's one SQNR: 20*log10(||reference|| / ||actual - reference||)


def case_strip(values: Sequence[Any], verdicts: Sequence[str], title: str, ylabel: str,
               floor: float | None = None, floor_label: str = "floor {}", top_label: str = "exact match") -> bytes:
    """One point per case (x = case), coloured by the case's own verdict for this output, with the
    failing criterion's floor drawn across (`floor_label` formats it: `"floor {} dB"`). A value "inf" (an exact match) is a ▲ at the top; a
    case with no value (it did not run, or was not measured) is an × at the bottom in its verdict's
    colour."""
    _matplotlib_ready()
    from matplotlib.transforms import blended_transform_factory

    fig = _figure(5.0, 3.9)
    ax = fig.add_subplot()
    top = blended_transform_factory(ax.transData, ax.transAxes)
    finite: list[float] = []
    groups: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    for i, (v, verdict) in enumerate(zip(values, verdicts)):
        if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v):
            kind = "value"
            finite.append(float(v))
        elif v == "inf" or (isinstance(v, float) and v == float("inf")):
            kind = "exact"
        else:
            kind = "none"
        xs, ys = groups.setdefault((kind, verdict), ([], []))
        xs.append(i)
        ys.append(float(v) if kind == "value" else (0.96 if kind == "exact" else 0.04))
    for (kind, verdict), (xs, ys) in sorted(groups.items()):
        colour = _verdict_colour(verdict)
        if kind == "value":
            ax.scatter(xs, ys, s=36, color=colour, zorder=3, label=_text(f"{verdict}: {len(xs)} case(s)"))
        elif kind == "exact":
            ax.scatter(xs, ys, marker="^", s=60, color=colour, transform=top, zorder=3,
                       label=_text(f"{verdict}, {top_label}: {len(xs)}"))
        else:
            ax.scatter(xs, ys, marker="x", s=50, color=colour, transform=top, zorder=3,
                       label=_text(f"{verdict}, no value: {len(xs)}"))
    drawn_floor = isinstance(floor, (int, float)) and not isinstance(floor, bool) and np.isfinite(floor)
    if drawn_floor:
        ax.axhline(float(floor), color=_verdict_colour(Verdict.FAIL), linestyle="--", linewidth=1.4, zorder=2,
                   label=_text(floor_label.format(number(float(floor)))))
        finite.append(float(floor))
    if finite:
        lo, hi = min(finite), max(finite)
        pad = (hi - lo) * 0.15 or max(abs(hi) * 0.1, 1.0)
        if np.isfinite(lo - pad) and np.isfinite(hi + pad):  # values near the float range: matplotlib's own limits
            ax.set_ylim(lo - pad, hi + pad)
    if not groups:
        ax.text(0.5, 0.5, "no cases", ha="center", va="center", transform=ax.transAxes)
    n = len(values)
    ax.set_xlim(-0.6, max(n, 1) - 0.4)
    if n <= 30:
        ax.set_xticks(range(n))
    ax.set_xlabel("case")
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(_text(title), fontsize=10)
    ax.grid(alpha=0.3)
    if groups or drawn_floor:
        fig.legend(fontsize=7, loc="outside lower center", ncols=2)  # below the plot: never over a point
    return _png(fig)


METRIC_LABELS = {
    "sqnr": "SQNR (dB, signal = reference; mean over outputs;\nworst dashed; exact not averaged, ▲ = all exact)",
    "mae": "mean absolute error (mean; worst dashed)",
    "max": "max absolute error (mean; worst dashed)",
    "top1": "top-1 accuracy (%)",
    "top5": "top-5 accuracy (%)",
    "agreement": "agreement with reference (%)",
}
_COLORS = ("#3b6ea5", "#c0504d", "#2e7d32", "#8e44ad", "#ef6c00", "#00838f", "#6d4c41", "#455a64")


def series_name(key: Any, among: Any = ()) -> str:
    """A line's name: target and dtype, and the series' hashes (runner/history/series.py) when another
    series `among` the plotted ones has the same target and dtype."""
    if not hasattr(key, "tag"):
        target, dtype = key
        return f"{target or '?'} {dtype or '?'}"

    tag = tags([key, *among]).get(key, "")
    return f"{key.target or '?'} {key.dtype or '?'}" + (f" {tag}" if tag else "")


def trend_plot(points: Sequence[Any], metric: str, title: str, unit: str | None = None) -> bytes:
    """`metric` over runs (x = run order, labelled by label or id), one line per target x dtype
    (`point.series`, when the points carry it) so runs of different dtypes or targets are never
    joined. SQNR points whose outputs all matched exactly have no finite mean: they are drawn as
    ▲ at the top of the plot, not as a number."""
    _matplotlib_ready()
    from matplotlib.transforms import blended_transform_factory

    fig = _figure(6.4, 3.6)
    ax = fig.add_subplot()
    pct = metric in ("top1", "top5", "agreement")
    scale = 100.0 if pct else 1.0
    xs_all = {id(p): i for i, p in enumerate(points)}

    def series(pts: Sequence[Any], attr: str) -> list[float]:
        return [np.nan if getattr(p, attr) is None else float(getattr(p, attr)) * scale for p in pts]

    groups: dict[Any, list[Any]] = {}
    for p in points:
        groups.setdefault(getattr(p, "series", None), []).append(p)
    several = len(groups) > 1
    values_all: list[float] = []
    if points:
        top = blended_transform_factory(ax.transData, ax.transAxes)
        for k, (key, pts) in enumerate(groups.items()):
            color = _COLORS[k % len(_COLORS)]
            name = _text(series_name(key, groups)) if several and key is not None else metric.removeprefix("perf:")
            if metric == "sqnr":  # runs whose outputs all matched exactly have no mean: drawn as ▲ below
                shown = [p for p in pts if not (p.value is None and getattr(p, "exact", 0))]
                exact_x = [xs_all[id(p)] for p in pts if p.value is None and getattr(p, "exact", 0)]
                pts = shown
            xs = [xs_all[id(p)] for p in pts]
            values = series(pts, "value")
            values_all += values
            ax.plot(xs, values, marker="o", color=color, label=name)
            worst_style = {"linestyle": "--", "color": color if several else "#c0504d"}
            if metric == "sqnr" and any(p.low is not None for p in pts):
                ax.plot(xs, series(pts, "low"), label=None if several else "worst output", **worst_style)
            if metric in ("mae", "max") and any(p.high is not None for p in pts):
                ax.plot(xs, series(pts, "high"), label=None if several else "worst output", **worst_style)
            if pct and any(p.reference is not None for p in pts):
                ax.plot(xs, series(pts, "reference"), linestyle=":", color="#555" if not several else color,
                        label="float reference" if not several else None)
            if metric.startswith("perf:") and any(p.low is not None for p in pts):  # a perf figure: min..max over cases
                ax.fill_between(xs, series(pts, "low"), series(pts, "high"), color=color, alpha=0.15,
                                label="min..max over the cases" if not several else None)
            if metric == "top1" and any(p.low is not None for p in pts):
                ax.fill_between(xs, series(pts, "low"), series(pts, "high"), color=color, alpha=0.15,
                                label="95% CI" if not several else None)
            if metric == "sqnr":
                if exact_x:
                    ax.scatter(exact_x, [0.96] * len(exact_x), marker="^", s=60, color=color, transform=top,
                               label="every output exact" if not several else None, zorder=3)
        finite = [v for v in values_all if v == v]
        if metric in ("mae", "max") and finite and all(v > 0 for v in finite):
            ax.set_yscale("log")
        labels = [_text(str(p.label)[:10]) if p.label else f"#{p.run_id}" for p in points]
        xs = list(range(len(points)))
        step = max(1, len(xs) // 12)
        ax.set_xticks(xs[::step], labels[::step], rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no runs recorded", ha="center", va="center", transform=ax.transAxes)
    ylabel = METRIC_LABELS.get(metric, metric)
    if metric.startswith("perf:"):
        ylabel = _text(metric[5:] + (f" ({unit}), median over cases" if unit else ", median over cases"))
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(_text(title), fontsize=10)
    ax.grid(alpha=0.3)
    return _png(fig)


def confusion(labels: Sequence[int], predictions: Sequence[int], num_classes: int, title: str) -> bytes:
    """Confusion matrix (rows: label, columns: prediction); samples that errored (-1) are left out."""
    lab = np.asarray(labels, dtype=np.int64)
    pred = np.asarray(predictions, dtype=np.int64)
    keep = (pred >= 0) & (pred < num_classes) & (lab >= 0) & (lab < num_classes)
    mat = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(mat, (lab[keep], pred[keep]), 1)
    size = min(5.0, 2.5 + 0.25 * num_classes)
    fig = _figure(size + 0.8, size)
    ax = fig.add_subplot()
    im = ax.imshow(mat, cmap="Blues")
    fig.colorbar(im, ax=ax, shrink=0.8)
    if num_classes <= 20:
        peak = mat.max() or 1
        for i in range(num_classes):
            for j in range(num_classes):
                if mat[i, j]:
                    ax.text(j, i, str(mat[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if mat[i, j] > peak / 2 else "#222")
        ax.set_xticks(range(num_classes))
        ax.set_yticks(range(num_classes))
    ax.set_xlabel("predicted on target")
    ax.set_ylabel("label")
    ax.set_title(_text(title), fontsize=10)
    return _png(fig)


def sequence_plot(positions: Sequence[int], sqnrs: Sequence[Any], margins: Sequence[Any], verdicts: Sequence[str],
                  title: str, divergence: int | None = None) -> bytes:
    """An LLM sequence against position: SQNR of each step's logits (top; an exact match, inf, is a ▲
    at the top) and the reference token's margin under the target (bottom; below 0 the greedy token
    flipped). Points in their step's verdict colour; the first diverging step is a dashed line."""
    fig = _figure(6.0, 4.6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    x = np.asarray(positions, np.float64)
    colours = [_verdict_colour(v) for v in verdicts]

    def values(raw: Sequence[Any]) -> np.ndarray:
        return np.array([np.nan if v is None or isinstance(v, str) else float(v) for v in raw], np.float64)

    s, m = values(sqnrs), values(margins)
    finite = np.isfinite(s)
    if finite.any():
        top.scatter(x[finite], s[finite], c=[c for c, f in zip(colours, finite) if f], s=18, zorder=2)
        top.plot(x[finite], s[finite], color="#999", linewidth=0.7, zorder=1)
    exact = np.isposinf(s)
    if exact.any():
        _matplotlib_ready()
        from matplotlib.transforms import blended_transform_factory

        top.scatter(x[exact], np.full(exact.sum(), 0.97), marker="^", s=30, zorder=3,
                    c=[c for c, f in zip(colours, exact) if f], transform=blended_transform_factory(top.transData,
                                                                                                 top.transAxes),
                    label="exact match (inf dB)")
        top.legend(fontsize=7, loc="lower left")
    top.set_ylabel(_text(SQNR_LABEL), fontsize=8)
    known = np.isfinite(m)
    if known.any():
        bottom.scatter(x[known], m[known], c=[c for c, f in zip(colours, known) if f], s=18, zorder=2)
        bottom.plot(x[known], m[known], color="#999", linewidth=0.7, zorder=1)
    bottom.axhline(0, color=_verdict_colour(Verdict.FAIL), linestyle="--", linewidth=1.0)
    bottom.set_ylabel("margin (log-prob)", fontsize=8)
    bottom.set_xlabel("position (input_pos of the step)")
    _matplotlib_ready()
    from matplotlib.ticker import MaxNLocator

    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    if divergence is not None and 0 <= divergence < len(x):
        for ax in (top, bottom):
            ax.axvline(x[divergence], color=_verdict_colour(Verdict.FAIL), linestyle=":", linewidth=1.2)
    top.set_title(_text(title), fontsize=10)
    return _png(fig)
