"""PNG plots for the HTML report and `bundlerun trend` (matplotlib, Agg, no pyplot).

The Figure/FigureCanvasAgg API is used directly so no GUI backend or global
pyplot state is involved: safe in CI, threads and headless machines.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np

MAX_SCATTER_POINTS = 20_000


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), *range(0x7f, 0xa0)]}


def _text(value: Any) -> str:
    """Text from a bundle or the user as a plot label: literal, never mathtext (`$` escaped),
    controls and lone surrogates made visible."""
    from bundlerun.runner.safe_text import visible  # controls, bidi, invisible characters, surrogates

    return visible(value).replace("$", r"\$")


def _figure(width: float = 5.0, height: float = 3.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def error_histogram(actual: np.ndarray, expected: np.ndarray, title: str) -> bytes:
    """Histogram of signed errors (actual - expected) over every element given."""
    err = (np.asarray(actual, np.float64) - np.asarray(expected, np.float64)).ravel()
    err = err[np.isfinite(err)]
    fig = _figure()
    ax = fig.add_subplot()
    if err.size:
        bins = min(60, max(10, int(np.sqrt(err.size))))
        ax.hist(err, bins=bins, color="#3b6ea5", edgecolor="white", linewidth=0.3)
        ax.axvline(0, color="#444", linewidth=0.8)
    else:
        ax.text(0.5, 0.5, "no finite errors", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("actual − expected")
    ax.set_ylabel("elements")
    ax.set_title(_text(title), fontsize=10)
    ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))
    return _png(fig)


def scatter(actual: np.ndarray, expected: np.ndarray, title: str) -> bytes:
    """Actual vs expected, with the identity line; subsampled deterministically."""
    a = np.asarray(actual, np.float64).ravel()
    e = np.asarray(expected, np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(e)
    a, e = a[ok], e[ok]
    if a.size > MAX_SCATTER_POINTS:
        idx = np.linspace(0, a.size - 1, MAX_SCATTER_POINTS).astype(np.int64)
        a, e = a[idx], e[idx]
    fig = _figure(4.2, 3.6)
    ax = fig.add_subplot()
    if a.size:
        lo, hi = float(min(a.min(), e.min())), float(max(a.max(), e.max()))
        pad = (hi - lo) * 0.05 or 1.0
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="#999", linewidth=0.8, zorder=1, label="actual = expected")
        size = 14 if a.size < 2000 else 4
        ax.scatter(e, a, s=size, alpha=0.6, color="#c0504d", linewidths=0, zorder=2)
        ax.legend(fontsize=8, loc="upper left")
    ax.set_xlabel("expected")
    ax.set_ylabel("actual")
    ax.set_title(_text(title), fontsize=10)
    return _png(fig)


METRIC_LABELS = {
    "sqnr": "SQNR (dB, mean over outputs; worst dashed;\nexact matches not averaged, ▲ = all exact)",
    "mae": "mean absolute error (mean; worst dashed)",
    "max": "max absolute error (mean; worst dashed)",
    "top1": "top-1 accuracy (%)",
    "top5": "top-5 accuracy (%)",
    "agreement": "agreement with reference (%)",
}
_COLORS = ("#3b6ea5", "#c0504d", "#2e7d32", "#8e44ad", "#ef6c00", "#00838f", "#6d4c41", "#455a64")


def series_name(key: Any, among: Any = ()) -> str:
    """A line's name: target and dtype, and the series' hashes (runner/series.py) when another
    series `among` the plotted ones has the same target and dtype."""
    if not hasattr(key, "tag"):
        target, dtype = key
        return f"{target or '?'} {dtype or '?'}"
    from bundlerun.runner.series import tags

    tag = tags([key, *among]).get(key, "")
    return f"{key.target or '?'} {key.dtype or '?'}" + (f" {tag}" if tag else "")


def trend_plot(points: Sequence[Any], metric: str, title: str, unit: str | None = None) -> bytes:
    """`metric` over runs (x = run order, labelled by label or id), one line per target x dtype
    (`point.series`, when the points carry it) so runs of different dtypes or targets are never
    joined. SQNR points whose outputs all matched exactly have no finite mean: they are drawn as
    ▲ at the top of the plot, not as a number."""
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
