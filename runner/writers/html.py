"""Self-contained HTML report of a typed `Report`: one file, inline CSS, plots as base64 PNG.

Why self-contained: CI systems archive a single artifact and often serve it
without its neighbours (or behind a CSP), so the page loads no script, font or
image from anywhere. Per output it shows an error histogram and an
actual-vs-expected scatter when the actual outputs (`outputs.npz`) and the
bundle's expected outputs are at hand, otherwise the statistics only; with a
history database it adds SQNR/MAE/top-1 trend lines for the runs of the same
series (runner/history/series.py: model, target, dtype, test inputs and criteria).
Everything is read from the typed records (runner/report/model.py); only
the sections the model keeps as plain JSON (stats, criteria, dataset, baseline,
the replay findings, the ETDump profile) are read by key.
"""

from __future__ import annotations

import base64
import html
import math
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from bundlerun.bundles.fileio import atomic_write_text
from bundlerun.bundles.manifest import Criteria
from bundlerun.runner.judging.stats_records import OutputStats
from bundlerun.runner.judging.failed_criterion import FailedCriterion
from bundlerun.runner.judging.outcome import VERDICT_COLOURS, VERDICTS, run_status
from bundlerun.runner.judging.quant_steps import suffix
from bundlerun.runner.report.criteria_text import criteria_items, failed_text, is_floor, number
from bundlerun.runner.writers import Inputs, writer
from bundlerun.runner.report.model import CaseRecord, OutputRecord, Report, Summary, format_amount
from bundlerun.targets.base import Verdict
from bundlerun.runner.history.series import of_report
from bundlerun.runner.judging.numerics import elementwise_bound
from bundlerun.runner.pictures import plots
from bundlerun.runner.report.safe_text import visible
from bundlerun.runner.report.sequences import MAX_STEPS_SHOWN, STEP_COLUMNS, columns, headline, step_cells
from bundlerun.runner.writers.markdown import perf_conditions
from bundlerun.runner.writers.sequence_svg import sequence_svg

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 4px} h2{font-size:1.15em;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:1em;margin:18px 0 6px}
.meta{color:#555;font-size:.9em} .badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
""" + "".join(f".{v}{{background:{c[0]}}} " for v, c in VERDICT_COLOURS.items()) + """
.failed-criteria td{vertical-align:top} .failed-criteria .crit{font-weight:600;color:#b71c1c}
table{border-collapse:collapse;margin:8px 0;font-size:.88em;background:#fff}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f0f0f0} td.l,th.l{text-align:left}
tr.bad td{background:#fdecea}
.plots{display:flex;flex-wrap:wrap;gap:12px} .plots figure{margin:0;background:#fff;border:1px solid #ddd;padding:6px}
figcaption{font-size:.8em;color:#555} img{max-width:100%;height:auto;display:block}
.note{color:#555;font-style:italic} .reg{color:#c62828}
.flame{display:flex;width:100%;max-width:900px;height:22px;border:1px solid #ccc;background:#fff;overflow:hidden}
.flame .seg{height:100%;color:#fff;font-size:.72em;line-height:22px;overflow:hidden;white-space:nowrap;text-align:center;
border-right:1px solid #fff}
"""


def _e(v: Any) -> str:
    """Text from a bundle, a device or the user: HTML-escaped (quotes too), controls made visible
    (controls, bidi (U+202E), invisible characters: runner/report/safe_text.py)."""
    return html.escape(visible(v))


def _n(v: Any, fmt: str = "{:.4g}") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return fmt.format(v)
    return _e(v)


def _sqnr(v: Any) -> str:
    """SQNR in dB; an exact match (infinite SQNR) says so instead of a number."""
    if v == "inf" or (isinstance(v, float) and v == float("inf")):
        return "exact"
    return _n(v, "{:.2f}")


def _img(png: bytes, alt: str, caption: str, mime: str = "image/png") -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img class="plot" alt="{_e(alt)}" src="data:{mime};base64,{data}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _as_float(arr: np.ndarray, dtype_name: str | None) -> np.ndarray:
    """bfloat16 travels as uint16 words: widen to float32 for plotting."""
    arr = np.asarray(arr)
    if dtype_name == "bfloat16" and arr.dtype == np.uint16:
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float64)


class PooledArrays:
    """(method, output index) -> the actual and expected values of that output over the cases that
    have both, read from `outputs` and the bundle one output at a time when `get` asks and let go by
    the caller after its figures (issue 36: dl3's 16 cases are 135 MB of float32 outputs, 540 MB as
    the plots' float64; holding every output's at once took `run --save-outputs` to 2 GiB).
    Which outputs have arrays is decided from shapes alone (an outputs.npz member's header)."""

    def __init__(self, report: Report, bundle: Any, outputs: Mapping[str, np.ndarray] | None) -> None:
        # (method, oi) -> each case's (npz key, expected value, actual dtype, expected dtype, size, verdict)
        self._members: dict[tuple[str, int], list[tuple[str, Any, Any, Any, int, str]]] = {}
        self._outputs = outputs
        if bundle is None or outputs is None:
            return
        shape_of = getattr(outputs, "shape_of", None)
        for case in report.cases:
            method, ci = case.method, case.case
            try:
                expected = bundle.suite(method).test_cases[ci].expected_outputs
            except (KeyError, IndexError):
                continue
            for out in case.outputs:
                oi = out.index
                key = f"{method}/{ci}/{oi}"
                if key not in outputs or oi >= len(expected) or expected[oi].kind != "tensor":
                    continue
                act_shape = shape_of(key) if shape_of is not None else np.shape(outputs[key])
                exp_shape = tuple(int(s) for s in expected[oi].sizes)
                if act_shape is None or tuple(act_shape) != exp_shape:
                    continue
                self._members.setdefault((method, oi), []).append(
                    (key, expected[oi], (out.actual or {}).get("dtype"), (out.expected or {}).get("dtype"),
                     math.prod(exp_shape), out.verdict))

    def __contains__(self, key: object) -> bool:
        return key in self._members

    def get(self, key: tuple[str, int]) -> tuple[np.ndarray, np.ndarray, list[int], list[str]] | None:
        """Every case's actual and expected values of output `key`, each flattened into one float64
        array in case order (the plots' input), each case's element count and its verdict; None when
        a member can no longer be read."""
        members = self._members[key]
        total = sum(m[4] for m in members)
        a, e = np.empty(total, np.float64), np.empty(total, np.float64)
        pos = 0
        for npz_key, value, act_dtype, exp_dtype, size, _ in members:
            try:
                act = self._outputs[npz_key] if self._outputs is not None else None
            except (KeyError, OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, MemoryError):
                return None
            if act is None or np.shape(act) != tuple(value.sizes):
                return None
            a[pos:pos + size] = _as_float(act, act_dtype).ravel()
            del act
            e[pos:pos + size] = _as_float(value.to_array(), exp_dtype).ravel()
            pos += size
        return a, e, [m[4] for m in members], [m[5] for m in members]


def collect_arrays(report: Report, bundle: Any, outputs: Mapping[str, np.ndarray] | None) -> PooledArrays:
    """The outputs that have arrays to plot, each read when its figures are drawn (PooledArrays)."""
    return PooledArrays(report, bundle, outputs)


def _summary_section(s: Summary) -> str:
    counts = s.counts
    keys = VERDICTS
    head = "".join(f"<th>{k}</th>" for k in keys)
    row = "".join(f"<td>{counts.get(k, 0)}</td>" for k in keys)
    return (
        f"<table><tr>{head}<th>cases</th><th>outputs</th><th>exit code</th></tr>"
        f"<tr>{row}<td>{_n(s.cases)}</td><td>{_n(s.outputs)}</td><td>{_n(s.exit_code)}</td></tr></table>"
    )


def _pct(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):  # null, or "nan" as the writer stores it
        return "–"
    return f"{v * 100:.2f}%"


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

    png = plots.confusion(labels, preds, int(n), f"{ds.get('name')}: target predictions")
    return "<div class='plots'>" + _img(png, "confusion matrix", "confusion matrix of the target's top-1") + "</div>"


def _case_row(case: CaseRecord, out: OutputRecord | None) -> str:
    """One case-output row; a case without outputs (it did not run) is one row with its verdict."""
    st = out.stats if out else None
    v = out.verdict if out else case.verdict
    why = "; ".join(
        f"{f.criterion}: {number(f.measured, f.limit)} (limit {number(f.limit, f.measured)})"
        for f in (out.failed if out else [])
    ) or (case.error or "")
    cls = "" if v == Verdict.PASS else " class='bad'"
    return (
        f"<tr{cls}><td class='l'>{_e(case.method)}[{_e(case.case)}]</td><td class='l'>{_e(out.name if out else '–')}</td>"
        f"<td><span class='badge {_e(v)}'>{_e(v)}</span></td><td>{_sqnr((st.sqnr if st else None))}</td>"
        f"<td>{_n((st.error_mae if st else None))}{_e(_steps(st, 'error_mae'))}</td>"
        f"<td>{_n((st.error_max if st else None))}{_e(_steps(st, 'error_max'))}</td><td>{_n((st.cosine_similarity if st else None), '{:.6f}')}</td>"
        f"<td>{_n((st.mismatch_count if st else None))}</td><td class='l'>{_e(why)}</td></tr>"
    )


def _cases_table(cases: list[CaseRecord], max_pass_rows: int = 100) -> str:
    """Every non-PASS case-output, and the first `max_pass_rows` PASS ones (the JSON has all)."""
    rows = []
    hidden = 0
    shown_pass = 0
    for case in cases:
        outs: list[OutputRecord | None] = list(case.outputs) or [None]
        for out in outs:
            if (out.verdict if out else case.verdict) == Verdict.PASS:
                shown_pass += 1
                if shown_pass > max_pass_rows:
                    hidden += 1
                    continue
            rows.append(_case_row(case, out))
    return (
        "<h2>Cases</h2><table><tr><th class='l'>case</th><th class='l'>output</th><th>verdict</th><th>SQNR (dB, signal = reference)</th>"
        "<th>MAE</th><th>max err</th><th>cosine</th><th>mismatches</th><th class='l'>failed / error</th></tr>"
        + "".join(rows)
        + "</table>"
        + (f"<p class='note'>{hidden} more passing case-output(s) not shown; report.json has them all.</p>" if hidden else "")
    )


def _bound(out: OutputRecord) -> tuple[float, float] | None:
    """The output's element-wise bound (atol, rtol) as judge_output formed it, None when it has none."""

    try:
        crit = out.criteria or Criteria()
        atol, rtol, checked = elementwise_bound(crit, (out.expected or {}).get("dtype"), bool(out.lossy))
    except (TypeError, ValueError, AttributeError):  # a hand-edited report: no bound drawn, never a crash
        return None
    if not checked or not all(isinstance(x, float) and np.isfinite(x) for x in (float(atol), float(rtol))):
        return None
    return float(atol), float(rtol)


def _limit(f: FailedCriterion) -> str:
    """A failed criterion's threshold as people read it: `≥ 20 dB` for a floor, `≤ 0.001` for a ceiling."""
    unit = " dB" if str(f.criterion or "").endswith("_db") else ""
    return f"{'≥' if is_floor(f.criterion) else '≤'} {number(f.limit)}{unit}"


def _failed_section(report: Report, max_rows: int = 12) -> str:
    """What failed, first on the page: per output and criterion, how many cases failed it, the worst
    measured value and the threshold; then the cases that did not run to a verdict, with why."""
    groups: dict[tuple[str, str, str], list[tuple[int, FailedCriterion]]] = {}
    for case in report.cases:
        for out in case.outputs:
            for f in out.failed if out.verdict == Verdict.FAIL else []:
                key = (case.method, out.name or f"out{out.index}", str(f.criterion))
                groups.setdefault(key, []).append((case.case, f))
    rows = []
    for (method, name, criterion), fails in list(groups.items())[:max_rows]:
        numeric = [(c, f) for c, f in fails
                   if isinstance(f.measured, (int, float)) and not isinstance(f.measured, bool)]
        pick = min if is_floor(criterion) else max
        ci, worst = pick(numeric, key=lambda cf: cf[1].measured) if numeric else fails[0]
        unit = " dB" if criterion.endswith("_db") else ""
        rows.append(f"<tr><td class='l'>{_e(method)} / {_e(name)}</td><td class='l crit'>{_e(criterion)}</td>"
                    f"<td>{len(fails)}</td><td>{_e(number(worst.measured, worst.limit))}{unit}</td>"
                    f"<td class='l threshold'>{_e(_limit(worst))}</td>"
                    f"<td class='l'>{_e(f'{method}[{ci}]')}: {_e(failed_text(worst))}</td></tr>")
    parts = []
    if rows:
        parts.append("<table class='failed-criteria'><tr><th class='l'>output</th><th class='l'>criterion</th>"
                     "<th>cases failing</th><th>worst measured</th><th class='l'>threshold</th><th class='l'>worst case</th>"
                     "</tr>" + "".join(rows) + "</table>")
        if len(groups) > max_rows:
            parts.append(f"<p class='note'>{len(groups) - max_rows} more failing output criteria below</p>")
    not_run: dict[str, list[CaseRecord]] = {}
    for case in report.cases:
        if case.verdict not in (Verdict.PASS, Verdict.FAIL):  # ERROR, TIMEOUT, SKIP: no numbers from this case
            not_run.setdefault(case.verdict, []).append(case)
    for verdict, cases in not_run.items():
        first = cases[0]
        parts.append(f"<p class='not-run'><span class='badge {_e(verdict)}'>{_e(verdict)}</span> {len(cases)} case(s) "
                     f"did not run to a verdict ({', '.join(_e(f'{c.method}[{c.case}]') for c in cases[:5])}"
                     f"{', …' if len(cases) > 5 else ''}): {_e(first.error or '')}</p>")
    if report.summary.interrupted:
        parts.append("<p class='not-run'>The run was stopped before it finished: its numbers cover only the cases "
                     "that ran.</p>")
    if not parts:
        return ""
    return "<h2 id='failed'>What failed</h2>" + "".join(parts)


def _per_case(cases: list[CaseRecord], outputs: set[tuple[str, int]]
              ) -> dict[tuple[str, int], tuple[list[Any], list[Any], list[str]]]:
    """For each (method, output index) of `outputs`: the SQNR and cosine of each case of the method
    and the case's verdict for it (a case that produced no output: no value, the case's verdict).
    One pass over the cases for all of them: a farm's merged report reads its cases from disk."""
    per: dict[tuple[str, int], tuple[list[Any], list[Any], list[str]]] = {k: ([], [], []) for k in outputs}
    by_method: dict[str, list[int]] = {}
    for method, oi in sorted(outputs):
        by_method.setdefault(method, []).append(oi)
    if not per:
        return per
    for case in cases:
        for oi in by_method.get(case.method, ()):
            out = next((o for o in case.outputs if o.index == oi), None)
            sqnrs, cosines, verdicts = per[(case.method, oi)]
            sqnrs.append(getattr(out.stats, "sqnr", None) if out is not None else None)
            cosines.append(getattr(out.stats, "cosine_similarity", None) if out is not None else None)
            verdicts.append(out.verdict if out is not None else case.verdict)
    return per


# Per-case strips one page draws at most: a matplotlib figure costs 0.3-2.4 s on a loaded machine, and
# a 2,000-job farm's merged report has 2,000 outputs (bundlerun's own budget; bench/bench_farm_scale.py)
PLOT_BUDGET = 24


def _output_sections(cases: list[CaseRecord], arrays: PooledArrays, case_plots: bool = True,
                     sequence_methods: frozenset[str] = frozenset()) -> str:
    """Per output (its first record over the cases): criteria; SQNR per case (and cosine when it is a
    criterion) with the floor drawn; histogram + scatter with the element-wise bound when arrays exist.
    A method whose cases are an LLM's sequence steps (`sequence_methods`) has its SQNR against position
    in the Sequences section instead (one image per sequence, drawn without matplotlib): a per-case strip
    would repeat it, at the cost of importing matplotlib (bench/bench_llm_sequence.py)."""

    parts = ["<h2 id='outputs'>Outputs</h2>"]
    seen: dict[tuple[str, int], OutputRecord] = {}
    kept: list[Criteria] = []  # the distinct criteria of the last outputs kept: equal ones held once
    for case in cases:
        for out in case.outputs:
            if (case.method, out.index) not in seen:
                # what this section reads of it (name, criteria, expected, lossy): a farm's merged report
                # has an output per job, and 2,000 whole records grew the coordinator's peak memory
                crit = next((c for c in kept[-8:] if c == out.criteria), out.criteria)
                if crit is not None and crit is out.criteria:
                    kept.append(crit)
                seen[(case.method, out.index)] = replace(out, criteria=crit, failed=[], stats=None, actual=None,
                                                         replay=None, note=None, shapes={})
    if not seen:
        return "<h2 id='outputs'>Outputs</h2><p class='note'>no outputs were collected</p>"
    if case_plots and len(seen) > PLOT_BUDGET:
        # a farm's merged report has an output per job: its strips are those of the outputs with a
        # case that did not pass first, then in order, up to the budget
        bad = {(c.method, o.index) for c in cases for o in c.outputs if c.verdict != Verdict.PASS}
        drawn = set(sorted(seen, key=lambda k: (k not in bad, k))[:PLOT_BUDGET])
        parts.append(f"<p class='note'>{len(seen)} outputs: per-case plots for {PLOT_BUDGET} of them "
                     "(those with a case that did not pass first); the others' figures are in the tables</p>")
    else:
        drawn = set(seen) if case_plots else set()
    per_case = _per_case(cases, drawn)
    for (method, oi), out in sorted(seen.items()):
        case_plots = (method, oi) in drawn
        name = out.name or f"out{oi}"
        crit = out.criteria or Criteria()
        expected = out.expected or {}
        parts.append(
            f"<h3>{_e(method)} / {_e(name)} <span class='meta criteria'>{_e(expected.get('dtype'))} "
            f"{_e(expected.get('shape'))}; criteria: " + _e(", ".join(criteria_items(crit)) or "none") + "</span></h3>"
        )
        figs = []
        sqnrs, cosines, verdicts = per_case.get((method, oi), ([], [], []))
        stepped = method in sequence_methods
        if stepped:
            parts.append("<p class='note'>each case of this method is a step of an LLM sequence: SQNR and margin per "
                         "step are drawn against position under <a href='#sequences'>Sequences</a></p>")
        if case_plots and not stepped and any(v is not None for v in sqnrs):
            floor = crit.sqnr_min_db if isinstance(crit.sqnr_min_db, (int, float)) else None
            figs.append(_img(plots.case_strip(sqnrs, verdicts, f"{method}/{name}: SQNR per case", plots.SQNR_LABEL,
                                              floor, "floor sqnr_min_db {} dB"),
                             f"sqnr per case {method}/{name}",
                             "SQNR per case (dB, signal = reference), each case in its own verdict's colour"
                             + ("; dashed: the floor" if floor is not None else "")))
        if case_plots and not stepped and isinstance(crit.cosine_min, (int, float)):
            figs.append(_img(plots.case_strip(cosines, verdicts, f"{method}/{name}: cosine per case",
                                              "cosine similarity", crit.cosine_min, "floor cosine_min {}"),
                             f"cosine per case {method}/{name}", "cosine similarity per case; dashed: the floor"))
        pooled = arrays.get((method, oi)) if (method, oi) in arrays else None
        plotted = pooled is not None
        if pooled is not None:
            a, e, sizes, case_verdicts = pooled
            del pooled
            title = f"{method}/{name} over {len(sizes)} case(s)"
            bound = _bound(out)
            failed_by = {str(f.criterion) for c in cases if c.method == method
                         for o in c.outputs if o.index == oi for f in o.failed}
            if bound is not None and (not failed_by or failed_by & {"elementwise", "exact"}):
                passed, labels = plots.within_bound(a, e, *bound), ("within bound", "over bound")
                how = f"each element in its own verdict's colour ({plots.bound_text(*bound)})"
            else:  # it failed by another criterion (SQNR, cosine, ...): each point is its case's verdict
                passed = np.concatenate([np.full(n, v == Verdict.PASS) for n, v in zip(sizes, case_verdicts)])
                labels, how = ("cases that passed", "cases that failed"), "each point in its case's verdict's colour"
            figs.append(_img(plots.error_histogram(a, e, title, bound), f"error histogram {method}/{name}",
                             "error histogram (actual − expected)" + ("; dashed: the bound" if bound else "")))
            figs.append(_img(plots.scatter(a, e, title, passed, labels), f"scatter {method}/{name}",
                             f"actual vs expected, {how}"))
            del a, e, passed  # this output's values go before the next one's are read
        if figs:
            parts.append("<div class='plots'>" + "".join(figs) + "</div>")
        if not plotted:
            parts.append("<p class='note'>actual outputs not saved (run with --save-outputs for the error histogram "
                         "and scatter); statistics only.</p>")
    return "".join(parts)


def _trend_section(report: Report, history_db: Any) -> str:
    if not history_db:
        return ""
    from bundlerun.runner.history import store as history  # start-up: loads SQLAlchemy, for a run with a history only

    if not history.exists(history_db):
        return ""

    series = of_report(report)  # only runs of this run's series: this bundle's inputs and criteria (runner/history/series.py)
    model = report.bundle.get("model")
    target = report.target.get("url")
    if not model:
        return ""
    figs = []
    notes = []
    dtype = report.bundle.get("dtype")
    metrics = ["sqnr", "mae"] + (["top1"] if report.dataset else [])
    for metric in metrics:
        try:
            points = history.trend(history_db, model, target, metric, dtype=dtype, series=series)
        except history.HistoryError:
            continue
        if points:
            caption = f"{metric} over the last {len(points)} recorded run(s)"
            if metric == "sqnr":
                exact = sum(p.exact for p in points)
                counted = sum(p.counted for p in points)
                caption = (f"mean SQNR over the case-outputs that did not match exactly, last {len(points)} "
                           f"recorded run(s)")
                if exact:
                    notes.append(f"SQNR history: {exact} of {exact + counted} case-outputs matched exactly "
                                 "(SQNR infinite); they are counted apart and not averaged in. "
                                 + (f"{sum(1 for p in points if p.value is None)} run(s) with every output exact "
                                    "are drawn as ▲." if any(p.value is None for p in points) else ""))
            figs.append(_img(plots.trend_plot(points, metric, f"{model} on {target} ({dtype}): {metric}"),
                             f"trend {metric}", caption))
    summary = {(r.name, r.phase) for r in report.perf_summary()}
    for name, phase in (("inference_cpu_cycles", None), ("npu_active_cycles", None), ("execution_time", "warm"),
                        ("method_allocator_used", None)):
        if (name, phase) not in summary:
            continue
        try:
            points, info = history.perf_trend(history_db, model, name, target, dtype=dtype, phase=phase or "",
                                              series=series)
        except history.HistoryError:
            continue
        if len(points) > 1:
            label = name + (f" ({phase})" if phase else "")
            figs.append(_img(plots.trend_plot(points, f"perf:{name}", f"{model} on {target} ({dtype}): {label}",
                                              unit=info.get("unit")),
                             f"trend {name}", f"{label} [{info.get('kind')}]: median over each run's cases, "
                                              f"min..max band, last {len(points)} recorded run(s)"))
    if not figs:
        return ""
    return (f"<h2>History</h2><p class='meta'>runs of this series only: this model on this target in this dtype, "
            f"with these test inputs and criteria ({_e(series.tag)})</p>"
            "<div class='plots'>" + "".join(figs) + "</div>"
            + "".join(f"<p class='note sqnr-exact'>{_e(n.strip())}</p>" for n in notes))


def _perf_section(report: Report, max_rows: int = 40) -> str:
    """The run's perf figures (median, min..max over the cases, with the kind of clock), the
    conditions they were measured in, the figures against the baseline, and the operator profile
    from ETDump when one was read."""

    rows = report.perf_summary()
    base = report.baseline or {}
    deltas = [] if base.get("refused") else [d for d in base.get("perf") or [] if d.get("gate") or d.get("delta")]
    profile = report.perf_info.get("profile") or []
    if not rows and not deltas and not profile:
        return ""
    parts = ["<h2 id='perf'>Performance</h2>",
             "<p class='meta'>median over the cases; <i>kind</i> says which clock or counter it is: simulation "
             "figures are never device latency</p>"]
    cond = perf_conditions(report.perf_info)
    if cond:
        parts.append(f"<p class='meta perf-conditions'>Conditions: {_e(cond)}.</p>")
    if rows:
        body = "".join(
            f"<tr><td class='l'>{_e(r.method)}.{_e(r.name)}</td><td class='l'>{_e(r.phase or '')}</td>"
            f"<td class='l'>{_e(r.kind)}</td><td>{_e(format_amount(r.median, r.unit))}</td>"
            f"<td>{'' if r.min == r.max else _e(format_amount(r.min, r.unit)) + '..' + _e(format_amount(r.max, r.unit))}</td>"
            f"<td>{_e(r.cases)}</td><td class='l'>{_e(r.source)}</td></tr>"
            for r in rows[:max_rows])
        parts.append("<table class='perf'><tr><th class='l'>figure</th><th class='l'>phase</th><th class='l'>kind</th>"
                     "<th>median</th><th>min..max</th><th>cases</th><th class='l'>source</th></tr>" + body + "</table>")
        if len(rows) > max_rows:
            parts.append(f"<p class='note'>{len(rows) - max_rows} more figures in report.json</p>")
    if deltas:
        body = []
        for d in deltas:
            change = d.get("change")
            ch = "from 0" if change == "inf" else (f"{change * 100:+.2f}%" if isinstance(change, (int, float)) else "–")
            gate = f"{_e(d['gate'])} {d['limit'] * 100:g}%" if d.get("gate") else f"not gated: {_e(d.get('not_gated'))}"
            over = change == "inf" or (isinstance(change, (int, float)) and change > d.get("limit", 0))
            cls = " class='bad'" if d.get("gate") and over else ""
            body.append(f"<tr{cls}><td class='l'>{_e(d.get('method'))}."
                        f"{_e(d.get('name'))}{' (' + _e(d['phase']) + ')' if d.get('phase') else ''}</td>"
                        f"<td class='l'>{_e(d.get('kind'))}</td><td>{_e(format_amount(d.get('baseline'), d.get('unit')))}</td>"
                        f"<td>{_e(format_amount(d.get('current'), d.get('unit')))}</td><td>{ch}</td><td class='l'>{gate}</td></tr>")
        parts.append(f"<h3>Against baseline {_e(base.get('label') or base.get('ref'))}</h3>"
                     "<table class='perf-deltas'><tr><th class='l'>figure</th><th class='l'>kind</th><th>baseline</th>"
                     "<th>current</th><th>change</th><th class='l'>gate</th></tr>" + "".join(body) + "</table>")
    if profile:
        parts.append(_profile_bars(profile))
    return "".join(parts)


def _profile_bars(profile: list[dict[str, Any]], top: int = 12) -> str:
    """A flame-style bar of operator time from ETDump: one row per method, each operator a segment
    as wide as its share of the method's time, then the top operators as a table."""
    palette = ("#3b6ea5", "#c0504d", "#9bbb59", "#8064a2", "#4bacc6", "#f79646", "#7f7f7f", "#2c4d75")
    parts = ["<h3>Operator profile (ETDump)</h3>"]
    for entry in profile:
        ops = [o for o in entry.get("operators") or [] if isinstance(o.get("time"), (int, float)) and o["time"] > 0]
        total = sum(o["time"] for o in ops)
        if not ops or total <= 0:
            continue
        ops.sort(key=lambda o: -o["time"])
        segs = "".join(
            f"<div class='seg' title='{_e(o.get('name'))}: {o['time']:.4g} {_e(entry.get('unit', ''))} "
            f"({o['time'] / total * 100:.1f}%)' style='width:{o['time'] / total * 100:.3f}%;"
            f"background:{palette[i % len(palette)]}'>{_e(o.get('name')) if o['time'] / total > 0.08 else ''}</div>"
            for i, o in enumerate(ops))
        execute = entry.get("total")
        parts.append(f"<p class='meta'>{_e(entry.get('method'))}: {total:.4g} {_e(entry.get('unit', ''))} in "
                     f"{len(ops)} operator(s)"
                     + (f" of {execute:.4g} {_e(entry.get('unit', ''))} in Method::execute"
                        if isinstance(execute, (int, float)) else "")
                     + f" [{_e(entry.get('kind', ''))}], {_e(entry.get('cases'))} case(s), {_e(entry.get('note', ''))}; "
                     f"{_e(entry.get('source', 'ETDump'))}</p><div class='flame'>{segs}</div>")
        rows = "".join(f"<tr><td class='l'>{_e(o.get('name'))}</td><td>{_e(o.get('calls', 1))}</td>"
                       f"<td>{o['time']:.4g}</td><td>{o['time'] / total * 100:.1f}%</td></tr>" for o in ops[:top])
        parts.append(f"<table class='profile'><tr><th class='l'>operator</th><th>calls</th>"
                     f"<th>time ({_e(entry.get('unit', ''))})</th><th>share</th></tr>{rows}</table>")
    return "".join(parts) if len(parts) > 1 else ""


def _regression_section(regressions: list[Any] | None, baseline: dict[str, Any] | None = None) -> str:
    """The baseline's verdict: refused, none found, or each regression (the report's JSON records,
    or runner/history/regression.py's Regression objects as find_regressions returns them)."""
    baseline = baseline or {}
    if baseline.get("refused"):
        return (f"<h2>Baseline</h2><p class='reg'>Baseline {_e(baseline.get('ref'))} not compared: unrelated runs: "
                f"{_e(baseline['refused'])}.</p>")
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


def _steps(stats: OutputStats | None, key: str) -> str:
    return suffix(stats, key)  # quantized outputs: errors also in quantization steps


def _replay_section(report: Report) -> str:
    from bundlerun.runner.judging.replay import html_section  # --replay findings (flaky vs wrong numerics)

    return html_section(report)


def _sequence_section(report: Report) -> str:
    """LLM bundles: per sequence its headline, SQNR and margin against position, and the per-step
    table (runner/report/sequences.py)."""
    if not report.sequences:
        return ""

    parts = ["<h2 id='sequences'>Sequences</h2>"]
    for seq in report.sequences:
        parts.append(f"<h3>{_e(headline(seq))}</h3>")
        if seq.prompt_text:
            parts.append(f"<p class='meta'>prompt: {_e(seq.prompt_text)}</p>")
        if seq.steps:
            svg = sequence_svg([st.start_pos for st in seq.steps], [st.sqnr for st in seq.steps],
                               [st.margin for st in seq.steps], [st.verdict for st in seq.steps],
                               f"{seq.name}: SQNR and margin per step", plots.SQNR_LABEL, seq.first_divergence)
            parts.append("<div class='plots'>" + _img(svg, f"sequence {seq.name}", "SQNR of the step's logits and the "
                         "reference token's log-prob margin under the target (below 0: the greedy token flipped), "
                         "against position; dotted: the first diverging step", "image/svg+xml") + "</div>")
        cols = columns(seq)
        head = "".join(f"<th{' class=l' if c in ('kind', 'verdict', 'replay') else ''}>{_e(c)}</th>" for c in cols)
        rows = []
        for step in seq.steps[:MAX_STEPS_SHOWN]:
            cells = step_cells(step, len(cols) > len(STEP_COLUMNS))
            rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells[:-1])
                        + f"<td class='l'><span class='badge {_e(step.verdict)}'>{_e(step.verdict)}</span></td></tr>")
        more = (f"<p class='note'>{len(seq.steps) - MAX_STEPS_SHOWN} more steps in report.json</p>"
                if len(seq.steps) > MAX_STEPS_SHOWN else "")
        parts.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>{more}")
    return "".join(parts)


def render_html(
    report: Report,
    bundle: Any = None,
    outputs: Mapping[str, np.ndarray] | None = None,
    history_db: Any = None,
    regressions: list[Any] | None = None,
    case_plots: bool = True,
) -> str:
    """The page: header, summary, what failed (criterion and threshold), warnings, baseline, replay,
    outputs (what was judged, with the thresholds drawn), dataset, perf, history, cases: what failed
    is above the fold, performance after the outputs. `case_plots=False` leaves out the per-case
    strips (the HUD's pages of passing runs: a matplotlib figure each would cost minutes over
    thousands of runs)."""
    bundle_info, run = report.bundle, report.run
    verdict = report.summary.verdict
    counts = report.summary.counts
    shown = run_status(verdict, report.summary.exit_code, counts.get(Verdict.TIMEOUT), counts.get(Verdict.ERROR))  # as the HUD
    model = bundle_info.get("model") or Path(str(bundle_info.get("path") or "bundle")).stem
    target = report.target.get("url") or "?"
    versions = bundle_info.get("versions") or {}
    arrays = collect_arrays(report, bundle, outputs)
    warnings = "".join(f"<li>{_e(w)}</li>" for w in report.warnings)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<link rel='icon' href='data:,'>"
        f"<title>bundlerun: {_e(model)} on {_e(target)}: {_e(verdict)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(model)} on <code>{_e(target)}</code> <span class='badge {_e(shown)}'>{_e(shown)}</span>"
        + (f" <span class='meta'>(verdict {_e(verdict)}, exit code {_e(report.summary.exit_code)})</span>"
           if shown != verdict else "") + "</h1>"
        f"<p class='meta'>dtype {_e(bundle_info.get('dtype'))} · backend {_e(bundle_info.get('backend'))} · "
        f"bundle {_e(str(bundle_info.get('sha256') or '')[:12])} · run {_e(str(run.get('id') or '')[:12])}"
        f"{' · label ' + _e(run.get('label')) if run.get('label') else ''} · {_e(run.get('started'))} · "
        f"torch {_e(versions.get('torch'))} · executorch {_e(versions.get('executorch'))}</p>"
        + "".join(f"<p class='meta'>{_e(line)}</p>" for line in bundle_info.get("inputs_used") or [])
        + _summary_section(report.summary)
        + _failed_section(report)
        + (f"<ul class='note'>{warnings}</ul>" if warnings else "")
        + _regression_section(regressions, report.baseline)
        + _replay_section(report)
        + _sequence_section(report)
        + _output_sections(report.cases, arrays, case_plots, frozenset(s.method for s in report.sequences))
        + (_dataset_section(report.dataset) if report.dataset else "")
        + _perf_section(report)
        + _trend_section(report, history_db)
        + _cases_table(report.cases)
        + "</body></html>\n"
    )


def write_html(
    report: Report,
    path: str | Path,
    bundle: Any = None,
    outputs: Mapping[str, np.ndarray] | None = None,
    history_db: Any = None,
    regressions: list[Any] | None = None,
) -> Path:
    """report.html at `path` (written atomically); `regressions` shown when given (write_reports
    passes the report's own when it has them)."""
    return atomic_write_text(path, render_html(report, bundle, outputs, history_db, regressions))


@writer("html", "report.html", "HTML report", errors=(OSError, ValueError))
def _write(report: Report, path: Path, inputs: Inputs) -> Path:
    return write_html(report, path, bundle=inputs.load_bundle(report), outputs=inputs.load_outputs(),
                      history_db=inputs.history_db, regressions=inputs.regressions)
