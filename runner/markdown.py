"""Markdown summary of a report: for PR comments and GitHub's job summary.

When `$GITHUB_STEP_SUMMARY` is set, `write_markdown` also appends the summary
there, so a GitHub Actions job page shows the verdict table without any
extra step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bundlerun.bundles.fileio import atomic_write_text

_ICON = {"PASS": "✅", "FAIL": "❌", "ERROR": "⚠️", "TIMEOUT": "⏱️", "SKIP": "⏭️"}


_CONTROL = {c: " " for c in [*range(0x00, 0x20), 0x7f]}
_MD_SPECIAL = str.maketrans({ch: "\\" + ch for ch in "\\`*_{}[]<>()#+!|~"})


def _md(text: Any) -> str:
    """Text from a bundle, a device or the user, inert in Markdown: controls (terminal escapes
    included) blanked, markup characters escaped."""
    return str(text).translate(_CONTROL).translate(_MD_SPECIAL)


def _cell(v: Any, fmt: str = "{:.4g}") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return fmt.format(v)
    return _md(v)


def _failed(f: dict[str, Any]) -> str:
    """`sqnr_min_db 45.35 < 48` for floors, `elementwise 0.2 > 0.002` for ceilings."""
    op = "<" if str(f.get("criterion", "")).endswith("_min") or str(f.get("criterion", "")).endswith("_min_db") else ">"
    return f"{_md(f.get('criterion'))} {_cell(f.get('measured'))} {op} {_cell(f.get('limit'))}"


def _pct(v: Any) -> str:
    return "–" if v is None else f"{v * 100:.2f}%"


def render_markdown(report: dict[str, Any], regressions: list[Any] | None = None, max_rows: int = 50) -> str:
    """The summary: headline, counts, dataset accuracy, regressions, worst outputs."""
    summary = report.get("summary") or {}
    bundle = report.get("bundle") or {}
    target = (report.get("target") or {}).get("url") or "?"
    verdict = summary.get("verdict", "?")
    model = bundle.get("model") or Path(str(bundle.get("path") or "bundle")).stem
    lines = [
        f"## {_ICON.get(verdict, '')} bundlerun: {_md(model)} on {_md(target)}: **{verdict}**",
        "",
        f"dtype {_md(bundle.get('dtype') or '?')}, backend {_md(bundle.get('backend') or '?')}, "
        f"bundle {_md(str(bundle.get('sha256') or '')[:12])}"
        + (f", label {_md((report.get('run') or {}).get('label'))}" if (report.get("run") or {}).get("label") else ""),
        "",
    ]
    counts = summary.get("counts") or {}
    lines += [
        "| PASS | FAIL | ERROR | TIMEOUT | SKIP | cases | exit |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        "| " + " | ".join(str(counts.get(k, 0)) for k in ("PASS", "FAIL", "ERROR", "TIMEOUT", "SKIP"))
        + f" | {summary.get('cases', '–')} | {summary.get('exit_code', '–')} |",
        "",
    ]
    ds = report.get("dataset")
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
    if regressions:
        lines += [f"### ❌ {len(regressions)} regression(s) against the baseline", ""]
        for r in regressions:
            rule = r.get("rule") if isinstance(r, dict) else getattr(r, "rule", "")
            msg = r.get("message") if isinstance(r, dict) else getattr(r, "message", r)
            lines.append(f"- **{rule}** {_cell(msg)}")
        lines.append("")
    elif regressions is not None:
        lines += ["No regressions against the baseline.", ""]
    rows = []
    for case in report.get("cases") or []:
        outs = case.get("outputs") or []
        if not outs:
            rows.append((case, None))
        rows.extend((case, o) for o in outs)
    bad = [r for r in rows if ((r[1] or {}).get("verdict") or r[0].get("verdict")) != "PASS"]
    shown = bad or rows
    title = "Failing outputs" if bad else "Outputs"
    if shown:
        lines += [f"### {title}", "", "| case | output | verdict | SQNR dB | MAE | max err | failed |", "|---|---|---|---:|---:|---:|---|"]
        for case, out in shown[:max_rows]:
            out = out or {}
            stats = out.get("stats") or {}
            v = out.get("verdict") or case.get("verdict")
            why = "; ".join(_failed(f) for f in out.get("failed") or [])
            if not why and case.get("error"):
                why = case["error"]
            lines.append(
                f"| {_md(case.get('method', 'forward'))}[{case.get('case')}] | {_md(out.get('name', '–'))} | {_ICON.get(v, '')} {v} "
                f"| {_cell(stats.get('sqnr'), '{:.1f}')} | {_cell(stats.get('error_mae'))} | {_cell(stats.get('error_max'))} | {why if out.get('failed') else _cell(why)} |"
            )
        if len(shown) > max_rows:
            lines.append(f"| … | {len(shown) - max_rows} more | | | | | |")
        lines.append("")
    for w in report.get("warnings") or []:
        lines.append(f"> ⚠️ {_cell(w)}")
    return "\n".join(lines).rstrip() + "\n"


def write_markdown(
    report: dict[str, Any], path: str | Path, regressions: list[Any] | None = None, step_summary: bool = True
) -> Path:
    """Write the summary; also append it to $GITHUB_STEP_SUMMARY when that is set."""
    text = render_markdown(report, regressions)
    out = atomic_write_text(path, text)
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and target:
        try:
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError:
            pass  # the summary is a convenience; the report files are what count
    return out
