"""Self-contained HTML report: one file, inline CSS, plots as base64 PNG.

Why self-contained: CI systems archive a single artifact and often serve it
without its neighbours (or behind a CSP), so the page loads no script, font or
image from anywhere. Per output it shows an error histogram and an
actual-vs-expected scatter when the actual outputs (`outputs.npz`) and the
bundle's expected outputs are at hand, otherwise the statistics only; with a
history database it adds SQNR/MAE/top-1 trend lines for the same model and
target.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from bundlerun.bundles.fileio import atomic_write_text

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 4px} h2{font-size:1.15em;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:1em;margin:18px 0 6px}
.meta{color:#555;font-size:.9em} .badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.PASS{background:#2e7d32} .FAIL{background:#c62828} .ERROR{background:#ef6c00} .TIMEOUT{background:#6a1b9a} .SKIP{background:#757575}
table{border-collapse:collapse;margin:8px 0;font-size:.88em;background:#fff}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f0f0f0} td.l,th.l{text-align:left}
tr.bad td{background:#fdecea}
.plots{display:flex;flex-wrap:wrap;gap:12px} .plots figure{margin:0;background:#fff;border:1px solid #ddd;padding:6px}
figcaption{font-size:.8em;color:#555} img{max-width:100%;height:auto;display:block}
.note{color:#555;font-style:italic} .reg{color:#c62828}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _n(v: Any, fmt: str = "{:.4g}") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return fmt.format(v)
    return _e(v)


def _img(png: bytes, alt: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img class="plot" alt="{_e(alt)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _as_float(arr: np.ndarray, dtype_name: str | None) -> np.ndarray:
    """bfloat16 travels as uint16 words: widen to float32 for plotting."""
    arr = np.asarray(arr)
    if dtype_name == "bfloat16" and arr.dtype == np.uint16:
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float64)


def collect_arrays(
    report: dict[str, Any], bundle: Any, outputs: Mapping[str, np.ndarray] | None
) -> dict[tuple[str, int], tuple[list[np.ndarray], list[np.ndarray]]]:
    """(method, output index) -> (actual arrays, expected arrays) over the cases that have both."""
    pooled: dict[tuple[str, int], tuple[list[np.ndarray], list[np.ndarray]]] = {}
    if bundle is None or outputs is None:
        return pooled
    for case in report.get("cases") or []:
        method, ci = case.get("method", "forward"), int(case.get("case", 0))
        try:
            expected = bundle.suite(method).test_cases[ci].expected_outputs
        except (KeyError, IndexError):
            continue
        for out in case.get("outputs") or []:
            oi = int(out.get("index", 0))
            key = f"{method}/{ci}/{oi}"
            if key not in outputs or oi >= len(expected) or expected[oi].kind != "tensor":
                continue
            act = _as_float(outputs[key], (out.get("actual") or {}).get("dtype"))
            exp = _as_float(expected[oi].to_array(), (out.get("expected") or {}).get("dtype"))
            if act.shape != exp.shape:
                continue
            a, e = pooled.setdefault((method, oi), ([], []))
            a.append(act)
            e.append(exp)
    return pooled


def _summary_section(report: dict[str, Any]) -> str:
    s = report.get("summary") or {}
    counts = s.get("counts") or {}
    keys = ("PASS", "FAIL", "ERROR", "TIMEOUT", "SKIP")
    head = "".join(f"<th>{k}</th>" for k in keys)
    row = "".join(f"<td>{counts.get(k, 0)}</td>" for k in keys)
    return (
        f"<table><tr>{head}<th>cases</th><th>outputs</th><th>exit code</th></tr>"
        f"<tr>{row}<td>{_n(s.get('cases'))}</td><td>{_n(s.get('outputs'))}</td><td>{_n(s.get('exit_code'))}</td></tr></table>"
    )


def _pct(v: Any) -> str:
    return "–" if v is None else f"{v * 100:.2f}%"


def _dataset_section(ds: dict[str, Any]) -> str:
    ci = ds.get("top1_diff_ci") or [None, None]
    ci_text = f"[{ci[0] * 100:+.2f}, {ci[1] * 100:+.2f}] points" if ci[0] is not None else "–"
    conf = int((ds.get("confidence") or 0.95) * 100)
    disc = ds.get("discordant") or {}
    return (
        f"<h2>Dataset accuracy: {_e(ds.get('name'))}</h2>"
        f"<p class='meta'>{_n(ds.get('evaluated', ds.get('samples')))} samples evaluated"
        f"{', ' + str(ds.get('errored')) + ' errored' if ds.get('errored') else ''}; {_e(ds.get('num_classes'))} classes</p>"
        "<table><tr><th class='l'></th><th>top-1</th><th>top-5</th></tr>"
        f"<tr><td class='l'>target</td><td>{_pct(ds.get('top1'))}</td><td>{_pct(ds.get('top5'))}</td></tr>"
        f"<tr><td class='l'>float reference</td><td>{_pct(ds.get('reference_top1'))}</td><td>{_pct(ds.get('reference_top5'))}</td></tr>"
        "</table>"
        f"<p>top-1 difference (target − reference): <b>{(ds.get('top1_diff') or 0) * 100:+.2f} points</b>, "
        f"{conf}% CI {ci_text} ({_e(ds.get('ci_method'))}); agreement (same argmax as the reference) "
        f"<b>{_pct(ds.get('agreement'))}</b>; target alone right on {_e(disc.get('target_only_correct', '–'))}, "
        f"reference alone right on {_e(disc.get('reference_only_correct', '–'))} samples."
        + (f" int8 calibration: {_e(ds['calibration'])}." if ds.get("calibration") else "")
        + "</p>"
        + _confusion(ds)
    )


def _confusion(ds: dict[str, Any]) -> str:
    labels, preds, n = ds.get("labels"), ds.get("predictions"), ds.get("num_classes")
    if not labels or not preds or not n or len(labels) != len(preds) or n > 100:
        return ""
    from bundlerun.runner import plots

    png = plots.confusion(labels, preds, int(n), f"{ds.get('name')}: target predictions")
    return "<div class='plots'>" + _img(png, "confusion matrix", "confusion matrix of the target's top-1") + "</div>"


def _cases_table(report: dict[str, Any], max_pass_rows: int = 100) -> str:
    """Every non-PASS case-output, and the first `max_pass_rows` PASS ones (the JSON has all)."""
    rows = []
    hidden = 0
    shown_pass = 0
    for case in report.get("cases") or []:
        outs = case.get("outputs") or [None]
        for out in outs:
            out = out or {}
            st = out.get("stats") or {}
            v = out.get("verdict") or case.get("verdict")
            if v == "PASS":
                shown_pass += 1
                if shown_pass > max_pass_rows:
                    hidden += 1
                    continue
            why = "; ".join(
                f"{f.get('criterion')}: {_n(f.get('measured'))} (limit {_n(f.get('limit'))})" for f in out.get("failed") or []
            ) or (case.get("error") or "")
            cls = "" if v in ("PASS", None) else " class='bad'"
            rows.append(
                f"<tr{cls}><td class='l'>{_e(case.get('method'))}[{_e(case.get('case'))}]</td><td class='l'>{_e(out.get('name', '–'))}</td>"
                f"<td><span class='badge {_e(v)}'>{_e(v)}</span></td><td>{_n(st.get('sqnr'), '{:.2f}')}</td>"
                f"<td>{_n(st.get('error_mae'))}</td><td>{_n(st.get('error_max'))}</td><td>{_n(st.get('cosine_similarity'), '{:.6f}')}</td>"
                f"<td>{_n(st.get('mismatch_count'))}</td><td class='l'>{_e(why)}</td></tr>"
            )
    return (
        "<h2>Cases</h2><table><tr><th class='l'>case</th><th class='l'>output</th><th>verdict</th><th>SQNR dB</th>"
        "<th>MAE</th><th>max err</th><th>cosine</th><th>mismatches</th><th class='l'>failed / error</th></tr>"
        + "".join(rows)
        + "</table>"
        + (f"<p class='note'>{hidden} more passing case-output(s) not shown; report.json has them all.</p>" if hidden else "")
    )


def _output_sections(report: dict[str, Any], arrays: dict) -> str:
    """Per output: criteria, pooled stats, and histogram + scatter when arrays exist."""
    from bundlerun.runner import plots

    parts = ["<h2>Outputs</h2>"]
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for case in report.get("cases") or []:
        for out in case.get("outputs") or []:
            seen.setdefault((case.get("method", "forward"), int(out.get("index", 0))), out)
    if not seen:
        return "<h2>Outputs</h2><p class='note'>no outputs were collected</p>"
    for (method, oi), out in sorted(seen.items()):
        name = out.get("name") or f"out{oi}"
        crit = {k: v for k, v in (out.get("criteria") or {}).items() if k != "trail" and v not in (None, False)}
        parts.append(
            f"<h3>{_e(method)} / {_e(name)} <span class='meta'>{_e((out.get('expected') or {}).get('dtype'))} "
            f"{_e((out.get('expected') or {}).get('shape'))}; criteria: "
            + _e(", ".join(f"{k}={v}" for k, v in crit.items()) or "none")
            + "</span></h3>"
        )
        if (method, oi) in arrays:
            act, exp = arrays[(method, oi)]
            a, e = np.concatenate([x.ravel() for x in act]), np.concatenate([x.ravel() for x in exp])
            title = f"{method}/{name} over {len(act)} case(s)"
            parts.append(
                "<div class='plots'>"
                + _img(plots.error_histogram(a, e, title), f"error histogram {method}/{name}", "error histogram (actual − expected)")
                + _img(plots.scatter(a, e, title), f"scatter {method}/{name}", "actual vs expected")
                + "</div>"
            )
        else:
            parts.append("<p class='note'>actual outputs not saved (run with --save-outputs for plots); statistics only.</p>")
    return "".join(parts)


def _trend_section(report: dict[str, Any], history_db: str | Path | None) -> str:
    if not history_db or not Path(history_db).exists():
        return ""
    from bundlerun.runner import history, plots

    model = (report.get("bundle") or {}).get("model")
    target = (report.get("target") or {}).get("url")
    if not model:
        return ""
    figs = []
    metrics = ["sqnr", "mae"] + (["top1"] if report.get("dataset") else [])
    for metric in metrics:
        points = history.trend(history_db, model, target, metric, dtype=(report.get("bundle") or {}).get("dtype"))
        if points:
            figs.append(
                _img(
                    plots.trend_plot(points, metric, f"{model} on {target}: {metric}"),
                    f"trend {metric}",
                    f"{metric} over the last {len(points)} recorded run(s)",
                )
            )
    if not figs:
        return ""
    return "<h2>History</h2><div class='plots'>" + "".join(figs) + "</div>"


def _regression_section(regressions: list[Any] | None) -> str:
    if regressions is None:
        return ""
    if not regressions:
        return "<h2>Baseline</h2><p>No regressions against the baseline.</p>"
    items = "".join(
        f"<li><b>{_e(r.get('rule') if isinstance(r, dict) else r.rule)}</b> "
        f"{_e(r.get('message') if isinstance(r, dict) else r.message)}</li>"
        for r in regressions
    )
    return f"<h2 class='reg'>{len(regressions)} regression(s) against the baseline</h2><ul class='reg'>{items}</ul>"


def render_html(
    report: dict[str, Any],
    bundle: Any = None,
    outputs: Mapping[str, np.ndarray] | None = None,
    history_db: str | Path | None = None,
    regressions: list[Any] | None = None,
) -> str:
    bundle_info = report.get("bundle") or {}
    run = report.get("run") or {}
    summary = report.get("summary") or {}
    verdict = summary.get("verdict", "?")
    model = bundle_info.get("model") or Path(str(bundle_info.get("path") or "bundle")).stem
    target = (report.get("target") or {}).get("url") or "?"
    versions = bundle_info.get("versions") or {}
    arrays = collect_arrays(report, bundle, outputs)
    warnings = "".join(f"<li>{_e(w)}</li>" for w in report.get("warnings") or [])
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<link rel='icon' href='data:,'>"
        f"<title>bundlerun: {_e(model)} on {_e(target)}: {_e(verdict)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(model)} on <code>{_e(target)}</code> <span class='badge {_e(verdict)}'>{_e(verdict)}</span></h1>"
        f"<p class='meta'>dtype {_e(bundle_info.get('dtype'))} · backend {_e(bundle_info.get('backend'))} · "
        f"bundle {_e(str(bundle_info.get('sha256') or '')[:12])} · run {_e(str(run.get('id') or '')[:12])}"
        f"{' · label ' + _e(run.get('label')) if run.get('label') else ''} · {_e(run.get('started'))} · "
        f"torch {_e(versions.get('torch'))} · executorch {_e(versions.get('executorch'))}</p>"
        + _summary_section(report)
        + (f"<ul class='note'>{warnings}</ul>" if warnings else "")
        + _regression_section(regressions)
        + (_dataset_section(report["dataset"]) if report.get("dataset") else "")
        + _output_sections(report, arrays)
        + _trend_section(report, history_db)
        + _cases_table(report)
        + "</body></html>\n"
    )


def write_html(
    report: dict[str, Any],
    path: str | Path,
    bundle: Any = None,
    outputs: Mapping[str, np.ndarray] | None = None,
    history_db: str | Path | None = None,
    regressions: list[Any] | None = None,
) -> Path:
    return atomic_write_text(path, render_html(report, bundle, outputs, history_db, regressions))
