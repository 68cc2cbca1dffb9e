"""summary.md from the typed Report, the writer "markdown": for people reading a PR comment or a
GitHub Actions job page (verdict, counts, dataset accuracy, regressions, perf, replay, failing outputs).

When `$GITHUB_STEP_SUMMARY` is set, `write_markdown` also appends the summary
there (runner/writers/github.py), so a GitHub Actions job page shows the verdict
table without any extra step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from bundlerun.bundles.fileio import atomic_write_chunks
from bundlerun.runner.judging.outcome import VERDICTS
from bundlerun.runner.judging.replay import markdown_lines  # --replay findings (flaky vs wrong numerics)
from bundlerun.runner.judging.failed_criterion import FailedCriterion
from bundlerun.runner.report.model import CaseRecord, OutputRecord, Report, format_amount
from bundlerun.runner.report.safe_text import markdown_text as _md
from bundlerun.runner.writers import Inputs, writer
from bundlerun.targets.base import Verdict
from bundlerun.runner.report.criteria_text import failed_text
from bundlerun.runner.report.sequences import MAX_STEPS_SHOWN, STEP_COLUMNS, columns, headline, step_cells

_ICON = {Verdict.PASS: "✅", Verdict.FAIL: "❌", Verdict.ERROR: "⚠️", Verdict.TIMEOUT: "⏱️", Verdict.SKIP: "⏭️"}


# C0, DEL, C1 (0x9b is a terminal CSI) and lone surrogates (valid in JSON, not writable as UTF-8)
_CONTROL = {c: " " for c in [*range(0x00, 0x20), *range(0x7f, 0xa0), *range(0xD800, 0xE000)]}


def _cell(v: Any, fmt: str = "{:.4g}") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return fmt.format(v)
    return _md(v)


def _failed(f: FailedCriterion) -> str:
    """`sqnr_min_db 45.35 < 48` for floors, `elementwise 0.2 > 0.002` for ceilings (runner/report/criteria_text.py)."""

    return failed_text(f, _md)


def _pct(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):  # null, or "nan" as the writer stores it
        return "–"
    return f"{v * 100:.2f}%"


def _delta_cell(pair: dict[str, Any], fmt: str) -> str:
    def one(v: Any) -> str:
        return "exact" if v == "inf" else _cell(v, fmt)

    d = pair.get("delta")
    return f"{one(pair.get('baseline'))} → {one(pair.get('current'))}" + ("" if d is None else f" ({d:+.3g})")


SQNR_NOTE = "SQNR = 20·log10(‖ref‖ / ‖actual − ref‖), the signal being the reference"


def _delta_table(outputs: list[dict[str, Any]], against: Any) -> list[str]:
    """Per output, baseline → current (delta): worst over the common cases, mismatches in total."""
    lines = [f"Against baseline {_md(against)} (worst over the common cases; mismatches: total; {SQNR_NOTE}):", "",
             "| output | cases | max abs error | SQNR dB | cosine | mismatches |", "|---|---:|---:|---:|---:|---:|"]
    for o in outputs:
        lines.append(
            f"| {_md(o.get('method'))}.{_md(o.get('name'))} | {o.get('cases')} "
            f"| {_delta_cell(o.get('error_max') or {}, '{:.3g}')} | {_delta_cell(o.get('sqnr') or {}, '{:.2f}')} "
            f"| {_delta_cell(o.get('cosine_similarity') or {}, '{:.6f}')} | {_delta_cell(o.get('mismatch_count') or {}, '{:.0f}')} |")
    return lines + [""]


def perf_conditions(perf: dict[str, Any]) -> str:
    """One sentence: repeated executions, warm-up excluded, machine load (the report's `perf` section
    beside its summary: `Report.perf_info`)."""
    parts = []
    if perf.get("repeat"):
        parts.append(f"{perf['repeat']} measured execution(s) per case"
                     + (f" after {perf.get('warmup', 0)} warm-up execution(s), excluded from the warm figures"
                        if perf.get("warmup") else ""))
    load = perf.get("load") or {}
    if load.get("before"):
        parts.append(f"load average {', '.join(f'{v:.2f}' for v in load['before'])} before, "
                     + (f"{', '.join(f'{v:.2f}' for v in load.get('after') or [])} after" if load.get("after") else "")
                     + f" (1/5/15 min) on {load.get('cpus', '?')} CPU(s)")
    for note in perf.get("notes") or []:
        parts.append(_md(note))
    return "; ".join(parts)


def _perf_section(report: Report, max_rows: int = 20) -> list[str]:
    """The run's perf summary (median, min..max over cases), its conditions, and the perf figures
    against the baseline when one was checked."""
    perf = report.perf_info
    rows = report.perf_summary()
    lines: list[str] = []
    if rows:
        lines += ["### Performance", "", "median over the cases; the kind says which clock or counter it is "
                  "(simulation figures are not device latency)", "",
                  "| figure | kind | median | min..max | cases |", "|---|---|---:|---:|---:|"]
        for r in rows[:max_rows]:
            name = f"{_md(r.method)}.{_md(r.name)}" + (f" ({_md(r.phase)})" if r.phase else "")
            spread = "" if r.min == r.max else f"{_md(format_amount(r.min, r.unit))}..{_md(format_amount(r.max, r.unit))}"
            lines.append(f"| {name} | {_md(r.kind)} | {_md(format_amount(r.median, r.unit))} | {spread or '–'} "
                         f"| {r.cases} |")
        if len(rows) > max_rows:
            lines.append(f"| … {len(rows) - max_rows} more in report.json | | | | |")
        lines.append("")
    cond = perf_conditions(perf)
    if cond:
        lines += [f"Conditions: {cond}.", ""]
    for prof in perf.get("profile") or []:
        ops = [o for o in prof.get("operators") or [] if isinstance(o.get("time"), (int, float))]
        total = sum(o["time"] for o in ops)
        if not ops or total <= 0:
            continue
        lines += [f"Top operators of {_md(prof.get('method'))} (ETDump, {_md(prof.get('kind'))}, {_md(prof.get('note'))}):",
                  "", "| operator | calls | time | share |", "|---|---:|---:|---:|"]
        lines += [f"| {_md(o.get('name'))} | {o.get('calls', 1)} | {o['time']:.4g} {_md(prof.get('unit'))} "
                  f"| {o['time'] / total * 100:.1f}% |" for o in ops[:5]]
        lines.append("")
    base = report.baseline or {}
    deltas = [d for d in base.get("perf") or [] if d.get("delta")]
    unchanged = [d for d in base.get("perf") or [] if d.get("gate") and not d.get("delta")]
    if (deltas or unchanged) and not base.get("refused"):
        lines += [f"Performance against baseline {_md(base.get('label') or base.get('ref'))} (median over the common cases):",
                  "", "| figure | kind | baseline | current | change | gate |", "|---|---|---:|---:|---:|---|"]
        for d in deltas[:max_rows]:
            change = d.get("change")
            ch = "from 0" if change == "inf" else (f"{change * 100:+.2f}%" if isinstance(change, (int, float)) else "–")
            gate = f"{_md(d['gate'])} {d['limit'] * 100:g}%" if d.get("gate") else f"not gated: {_md(d.get('not_gated'))}"
            name = f"{_md(d.get('method'))}.{_md(d.get('name'))}" + (f" ({_md(d['phase'])})" if d.get("phase") else "")
            lines.append(f"| {name} | {_md(d.get('kind'))} | {_md(format_amount(d.get('baseline'), d.get('unit')))} "
                         f"| {_md(format_amount(d.get('current'), d.get('unit')))} | {ch} | {gate} |")
        if unchanged:
            lines.append(f"| {len(unchanged)} gated figure(s) unchanged | | | | | |")
        lines.append("")
    return lines


def render_markdown(report: Report, regressions: list[dict[str, Any]] | None = None, max_rows: int = 50) -> str:
    """The summary: headline, counts, dataset accuracy, regressions (perf figures included), perf
    figures, worst outputs; a farm's table of jobs first. `regressions` None: no baseline was checked
    (nothing said about one)."""
    text = _summary_text(report, regressions, max_rows)
    farm = report.extras.get("farm") or {}
    return _farm_section(farm) + "\n\n" + text if _has_jobs(farm) else text


def _has_jobs(farm: dict[str, Any]) -> bool:
    return bool(farm.get("jobs")) and "makespan_s" in farm


def markdown_chunks(report: Report, regressions: list[dict[str, Any]] | None = None) -> Iterator[bytes]:
    """render_markdown's text as bytes, the farm's table of jobs made a row at a time (its jobs are
    read from disk: the table as one string, and its lines, grew with the jobs)."""
    text = _summary_text(report, regressions, 50)
    farm = report.extras.get("farm") or {}
    if _has_jobs(farm):
        buf: list[str] = []
        size = 0
        for n, line in enumerate(_farm_lines(farm)):
            piece = line if n == 0 else "\n" + line
            buf.append(piece)
            size += len(piece)
            if size >= 1 << 16:
                yield "".join(buf).encode("utf-8")
                buf, size = [], 0
        yield ("".join(buf) + "\n\n").encode("utf-8")
    yield text.encode("utf-8")


def _summary_text(report: Report, regressions: list[dict[str, Any]] | None, max_rows: int) -> str:
    """The summary without the farm's table."""
    summary = report.summary
    bundle = report.bundle
    target = report.target.get("url") or "?"
    verdict = summary.verdict
    model = bundle.get("model") or Path(str(bundle.get("path") or "bundle")).stem
    label = report.run.get("label")
    lines = [
        f"## {_ICON.get(verdict, '')} bundlerun: {_md(model)} on {_md(target)}: **{verdict}**",
        "",
        f"dtype {_md(bundle.get('dtype') or '?')}, backend {_md(bundle.get('backend') or '?')}, "
        f"bundle {_md(str(bundle.get('sha256') or '')[:12])}" + (f", label {_md(label)}" if label else ""),
        "",
        *[f"- {_md(str(line))}" for line in bundle.get("inputs_used") or []],
        *([""] if bundle.get("inputs_used") else []),
    ]
    counts = summary.counts
    lines += [
        "| PASS | FAIL | ERROR | TIMEOUT | SKIP | cases | exit |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        "| " + " | ".join(str(counts.get(k, 0)) for k in VERDICTS)
        + f" | {summary.cases} | {summary.exit_code} |",
        "",
    ]
    ds = report.dataset
    if ds:
        ci = ds.get("top1_diff_ci") or [None, None]
        ci_text = f"[{ci[0] * 100:+.2f}, {ci[1] * 100:+.2f}]" if ci[0] is not None else "–"
        lines += [
            f"### Dataset accuracy: {_md(ds.get('name'))} ({ds.get('evaluated', ds.get('samples'))} samples)",
            "",
            "| | top-1 | top-5 |",
            "|---|---:|---:|",
            f"| target | {_pct(ds.get('top1'))} | {_pct(ds.get('top5'))} |",
            f"| float reference | {_pct(ds.get('reference_top1'))} | {_pct(ds.get('reference_top5'))} |",
            "",
            f"top-1 difference {(ds.get('top1_diff') or 0) * 100:+.2f} points, "
            f"{int((ds.get('confidence') or 0.95) * 100)}% CI {ci_text} ({ds.get('ci_method')}); "
            f"agreement with the reference {_pct(ds.get('agreement'))}.",
            "",
        ]
    base = report.baseline or {}
    if base.get("refused"):
        lines += [f"### ⚠️ Baseline {_md(base.get('ref'))} not compared", "",
                  f"Unrelated runs: {_md(base['refused'])}.", ""]
        regressions = None
    if regressions:
        lines += [f"### ❌ {len(regressions)} regression(s) against the baseline", ""]
        for r in regressions:
            lines.append(f"- **{r.get('rule')}** {_cell(r.get('message'))}")
        lines.append("")
    elif regressions is not None:
        lines += ["No regressions against the baseline.", ""]
    if base.get("outputs") and not base.get("refused"):
        lines += _delta_table(base["outputs"], base.get("label") or base.get("ref"))
    lines += _perf_section(report)
    from bundlerun.runner.judging.quant_steps import suffix  # quantized outputs: errors also in quantization steps

    lines += markdown_lines(report)
    lines += _sequence_lines(report)
    # only the rows the table shows are kept (a farm's merged report reads its cases back from disk
    # one at a time: holding every case would grow with the jobs), and how many there were
    rows: list[tuple[CaseRecord, OutputRecord | None]] = []
    bad: list[tuple[CaseRecord, OutputRecord | None]] = []
    n_rows = n_bad = 0
    for case in report.cases:
        outs: list[OutputRecord | None] = list(case.outputs) or [None]
        for row in outs:
            n_rows += 1
            if len(rows) < max_rows:
                rows.append((case, row))
            if (row.verdict if row is not None else case.verdict) != Verdict.PASS:
                n_bad += 1
                if len(bad) < max_rows:
                    bad.append((case, row))
    shown, n_shown = (bad, n_bad) if bad else (rows, n_rows)
    title = "Failing outputs" if bad else "Outputs"
    if shown:
        lines += [f"### {title}", "", SQNR_NOTE, "", "| case | output | verdict | SQNR dB | MAE | max err | failed |",
                  "|---|---|---|---:|---:|---:|---|"]
        for case, out in shown[:max_rows]:
            stats = out.stats if out is not None else None
            v = out.verdict if out is not None else case.verdict
            failed = out.failed if out is not None else []
            why = "; ".join(_failed(f) for f in failed)
            if not why and case.error:
                why = case.error
            lines.append(
                f"| {_md(case.method)}[{case.case}] | {_md(out.name if out is not None else '–')} | {_ICON.get(v, '')} {v} "
                f"| {_cell((stats.sqnr if stats else None), '{:.1f}')} | {_cell((stats.error_mae if stats else None))}{suffix(stats, 'error_mae')} "
                f"| {_cell((stats.error_max if stats else None))}{suffix(stats, 'error_max')} | {why if failed else _cell(why)} |"
            )
        if n_shown > max_rows:
            lines.append(f"| … | {n_shown - max_rows} more | | | | | |")
        lines.append("")
    for w in report.warnings:
        lines.append(f"> ⚠️ {_cell(w)}")
    return "\n".join(lines).rstrip() + "\n"


def _sequence_lines(report: Report) -> list[str]:
    """LLM bundles: each sequence's headline and per-step table (runner/report/sequences.py)."""

    lines: list[str] = []
    for seq in report.sequences:
        lines += [f"### {_ICON.get(seq.verdict, '')} Sequence {_md(headline(seq))}", ""]
        if seq.prompt_text:
            lines += [f"Prompt: {_cell(seq.prompt_text)}", ""]
        cols = columns(seq)
        replayed = len(cols) > len(STEP_COLUMNS)
        lines += ["| " + " | ".join(cols) + " |", "|" + "---:|" * 3 + "---:|" * 6 + ("---|" if replayed else "") + "---|"]
        lines += ["| " + " | ".join(_md(c) for c in step_cells(step, replayed)) + " |" for step in seq.steps[:MAX_STEPS_SHOWN]]
        if len(seq.steps) > MAX_STEPS_SHOWN:
            lines.append(f"| … | {len(seq.steps) - MAX_STEPS_SHOWN} more steps |" + " |" * (len(cols) - 2))
        lines.append("")
    return lines


def _farm_section(farm: dict[str, Any]) -> str:
    """A farm's merged report, first: the jobs (verdict, attempts, devices, flaky) and the devices that
    failed (the `farm` section of runner/farm/run.py; an attempt's own `farm` record has no jobs)."""
    return "\n".join(_farm_lines(farm))


def _farm_lines(farm: dict[str, Any]) -> Iterator[str]:
    yield from [f"## bundlerun farm: {len(farm['jobs'])} jobs, {farm['makespan_s']:.1f} s "
                f"({_md(farm['executor'].get('name'))} executor)", "",
                "| job | verdict | attempts | devices | flaky |", "|---|---|---:|---|---|"]
    for job in farm["jobs"]:
        devices = ", ".join(dict.fromkeys(str(a.get("device") or a["url"]) for a in job["attempts"])) or "–"
        yield (f"| {_md(job['job'])} | {job['verdict']} | {len(job['attempts'])} | {_md(devices)} "
               f"| {'flaky' if job['flaky'] else ''} |")
    bad = [d for d in farm["devices"] if d["infra_failures"]]
    if bad:
        yield from ["", "Devices with infrastructure failures:", ""]
        yield from [f"- {_md(d.get('resource') or d['url'])}: {d['infra_failures']} of {d['attempts']} attempts "
                    f"({d['infra_rate'] * 100:.0f}%)" for d in bad]


def write_markdown(report: Report, path: str | Path, regressions: list[dict[str, Any]] | None = None) -> Path:
    """Write the summary (GitHub's step summary gets the same text: runner/writers/github.py); atomic, the
    farm's table of jobs a row at a time."""
    return atomic_write_chunks(path, markdown_chunks(report, regressions))


@writer("markdown", "summary.md", "Markdown summary")
def _write(report: Report, path: Path, inputs: Inputs) -> Path:
    return write_markdown(report, path, inputs.regressions)
