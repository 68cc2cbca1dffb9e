"""Determinism replay (`run/validate --replay N`): is each output the same run after run?

Each case runs N times on the target. Where the target declares `replay=True` in its TargetSpec
(host://, tosa://: the host worker or program walker loops inside one loaded program), its own loop
does it and the later runs' outputs come back in `CaseResult.replays`. Elsewhere the runner repeats
the whole target run N-1 times (each a full deploy/boot/run of the selected cases), which every
target can do.

Per output: how many distinct results came back (bytes compared), the spread (the largest
difference between runs at any element: max over elements of max - min across runs, in the
output's values) and the verdict of every run, judged like the first with the bundle's criteria.
An output whose results differ is non-deterministic: the finding `nondeterministic-output`, and
`flaky-numerics` when its verdict flips between runs - a failure that a rerun may hide, told
apart from a stable wrong result ("wrong numerics"). A flip makes the exit code 1 (some run
failed) even when the first run passed, as a regression does. Findings go into report.json
(top-level `replay`, each output's `replay`), JUnit (a `replay` suite), Markdown, HTML, the
console and the history (table `replay_outputs`).

A bundle with a stateful sequence (an LLM's steps, their KV cache in the method or threaded by the lane)
is never replayed step by step: a step run again alone would run on the cache its own first run left,
not on the one its prefix leaves. Every replay re-runs the whole selection (every sequence from its first
step, in order) as a fresh target run, and each step's record in the report's sequences says whether
its logits changed between those executions (`step.replay`), the lane and its driver named in the
sequence's headline: the #22327 class (a driver whose linear layers compute differently on some runs).
"""

from __future__ import annotations

from copy import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bundlerun.bundles.errors import BundlerunError
from bundlerun.runner.judging.outcome import EXIT_FAIL, EXIT_PASS
from bundlerun.runner.report.safe_text import markdown_text as _md, visible  # the writers' own escapes
from bundlerun.targets.base import CaseStatus, Verdict
from bundlerun.bundles import scalar_types as st
from bundlerun.targets.base import CaseResult

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

FLAKY = "flaky-numerics"
NONDETERMINISTIC = "nondeterministic-output"


def _declared(url: Any) -> bool:
    try:
        from bundlerun.targets import spec_for  # optional: its failure to load is handled here

        return bool(getattr(spec_for(url), "replay", False))
    except Exception:  # noqa: BLE001 - an unknown URL was reported by the run itself
        return False


def stateful(bundle: Any) -> bool:
    """Whether `bundle` holds a stateful sequence (its steps share state: replayed only as a whole)."""
    from bundlerun.bundles.sequence import from_manifest, stateful_methods  # start-up: not loaded by `bundlerun --help`

    return bool(stateful_methods(from_manifest(getattr(bundle, "manifest", None))))


def in_process_replays(bundle: Any, n: int) -> int:
    """The replay count a target's own loop is given: 1 (none) for a stateful bundle, whose replays are
    whole runs of every sequence in order (module docstring)."""
    return 1 if stateful(bundle) else n


def complete(target: Any, url: Any, bundle: Any, bundle_path: Path, options: Any, run: Any, n: int) -> dict[str, Any]:
    """Make every finished case of `run` carry n-1 replays: the target's own loop when it declares
    replay (never for a stateful sequence), else n-1 more whole runs. Returns how it was done (the
    report's replay.mode/how)."""
    if n <= 1:
        return {}
    ok = [c for c in run.cases if c.status == CaseStatus.OK]
    sequence = stateful(bundle)
    if not sequence and _declared(url) and all(len(c.replays) >= n - 1 for c in ok):
        return {"mode": "in-process", "how": f"{url}: the target ran each case {n} times in one loaded program "
                                              "(one process)"}
    by_key = {(c.method, c.case_index): c for c in ok}
    for c in ok:
        c.replays = []
    for k in range(1, n):
        again = copy(options)
        again.work_dir = Path(options.work_dir) / f"replay-{k}"
        again.work_dir.mkdir(parents=True, exist_ok=True)
        again.progress, again.replay = None, 1
        try:
            repeat = target.run(bundle, Path(bundle_path), again)
        except BundlerunError as exc:  # a later run that cannot start: every case says so
            for case in by_key.values():
                case.extra.setdefault("replay_errors", []).append(f"run {k + 1}: {exc}")
            continue
        got = {(c.method, c.case_index): c for c in repeat.cases}
        for key, case in by_key.items():
            other = got.get(key)
            if other is not None and other.status == CaseStatus.OK:
                case.replays.append(list(other.outputs))
            else:
                case.extra.setdefault("replay_errors", []).append(
                    f"run {k + 1}: {(other.error if other is not None else None) or 'no result'}")
    if sequence:
        return {"mode": "whole-sequence", "how": f"{url}: the whole run repeated {n - 1} more time(s), every sequence from "
                                                 "its first step in order on a freshly loaded method (a step is never "
                                                 "replayed alone: its KV cache is the steps before it)"}
    return {"mode": "whole-run", "how": f"{url} declares no replay loop: the runner repeated the whole run {n - 1} "
                                        "more time(s) (deploy, start and run each time)"}


def _values(raw: Any) -> np.ndarray:
    arr = raw.to_array()
    return st.to_float_array(raw.scalar_type, arr) if raw.scalar_type == st.BFLOAT16 else arr


def _spread(arrays: list[np.ndarray]) -> float | None:
    if len(arrays) < 2 or any(a.shape != arrays[0].shape for a in arrays):
        return None
    stack = np.stack([a.astype(np.float64) for a in arrays])
    if stack.size == 0:
        return 0.0
    nan = np.isnan(stack)
    if nan.any() and not (nan.all(axis=0) | ~nan.any(axis=0)).all():
        return float("inf")  # NaN in some runs only
    with np.errstate(invalid="ignore"):
        spread = np.nanmax(stack, axis=0) - np.nanmin(stack, axis=0)
    spread = spread[np.isfinite(spread)] if not np.isfinite(spread).all() else spread
    return float(spread.max()) if spread.size else 0.0


def add_to_report(report: "Report", bundle: Any, run: Any, ctx: Any, n: int, how: dict[str, Any]) -> None:
    """Judge every replay, put each output's `replay` record and the report's `replay` section in."""
    if n <= 1:
        return
    from bundlerun.runner.judging.judge import judge_case  # start-up: loads flatbuffers on use

    records = {(c.method, c.case): c for c in report.cases}
    findings: list[dict[str, Any]] = []
    checked = 0
    for result in run.cases:
        record = records.get((result.method, result.case_index))
        if record is None or result.status != CaseStatus.OK or not result.replays:
            continue
        replay_records = [judge_case(bundle, CaseResult(result.method, result.case_index, CaseStatus.OK, outputs=outs),
                                     ctx) for outs in result.replays]
        for j, out in enumerate(record.outputs):
            if out.verdict not in (Verdict.PASS, Verdict.FAIL) or j >= len(result.outputs):
                continue
            runs = [result.outputs[j]] + [outs[j] for outs in result.replays if j < len(outs)]
            verdicts = [out.verdict] + [r.outputs[j].verdict if j < len(r.outputs) else Verdict.ERROR for r in replay_records]
            distinct = len({(raw.scalar_type, tuple(raw.shape), bytes(raw.data)) for raw in runs})
            counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
            entry: dict[str, Any] = {"runs": len(runs), "distinct": distinct, "spread": _spread([_values(r) for r in runs]),
                     "verdicts": counts, "flips": len(counts) > 1, "deterministic": distinct == 1}
            if entry["flips"]:
                entry["finding"] = FLAKY
            elif distinct > 1:
                entry["finding"] = NONDETERMINISTIC
            out.replay = entry
            checked += 1
            if distinct > 1 or entry["flips"]:
                findings.append({"finding": entry["finding"], "method": result.method, "case": result.case_index,
                                 "output": out.name, **{k: entry[k] for k in ("runs", "distinct", "spread",
                                                                                    "verdicts", "flips")}})
        errors = (result.extra or {}).get("replay_errors")
        if errors:
            record.extra["replay_errors"] = errors
    flaky = sum(1 for f in findings if f["flips"])
    if report.sequences:
        step_replay(report, how, lane_name(report.target.get("url"), getattr(run, "info", None) or {}))
    report.replay = {
        "runs": n, **how, "outputs": checked, "nondeterministic": len(findings), "flaky": flaky,
        "verdict": "nondeterministic" if findings else ("deterministic" if checked else "not checked"),
        "findings": findings,
    }
    if flaky and report.summary.exit_code == EXIT_PASS:
        report.summary.exit_code = EXIT_FAIL  # a run failed: a rerun may hide it (as a regression does)


def lane_name(url: Any, info: dict[str, Any]) -> str:
    """The lane and what computed on it, for a replay finding: the URL and the driver the target reported
    (vulkan://: the device and driver the Vulkan loader gave; else the runtime or backends it names)."""
    driver = info.get("driver")
    if isinstance(driver, dict):
        devices = driver.get("devices") or []
        if devices and isinstance(devices[0], dict):
            d = devices[0]
            what = " ".join(str(d[k]) for k in ("name", "driver_name", "driver_info") if d.get(k))
            return f"{url} (driver: {what})"
        if driver.get("error"):
            return f"{url} (driver unknown: {driver['error']})"
    for key in ("runtime", "backends", "delegates"):
        value = info.get(key)
        if value:
            return f"{url} ({key}: {', '.join(map(str, value)) if isinstance(value, list) else value})"
    return str(url)


def step_replay(report: "Report", how: dict[str, Any], lane: str) -> None:
    """Each sequence step's `replay`: did its logits (the case's output 0, what the step is judged by) change
    between executions; and the sequence's headline note naming the lane."""
    by_case = {(c.method, c.case): c for c in report.cases}
    for seq in report.sequences:
        changed = replayed = 0
        runs = None
        for step in seq.steps:
            case = by_case.get((seq.method, step.case))
            entry = case.outputs[0].replay if case is not None and case.outputs else None
            if not isinstance(entry, dict):
                continue
            differs = entry.get("distinct", 1) > 1
            step.replay = {"runs": entry.get("runs"), "distinct": entry.get("distinct"), "spread": entry.get("spread"),
                           "changed": differs}
            replayed += 1
            changed += differs
            runs = entry.get("runs")
        if replayed:
            whole = " of the whole sequence in order" if how.get("mode") == "whole-sequence" else ""
            seq.replay = (f"replay on {lane}: {runs} executions{whole}; {changed}/{replayed} steps' logits changed"
                          + (f" (first at step {next(s.step for s in seq.steps if s.replay and s.replay['changed'])})"
                             if changed else ""))


# ------------------------------------------------------------------ the report formats


def finding_text(f: dict[str, Any]) -> str:
    spread = f.get("spread")
    spread_text = f"{spread:.3g}" if isinstance(spread, (int, float)) else str(spread)
    verdicts = ", ".join(f"{k} {v}" for k, v in (f.get("verdicts") or {}).items())
    label = "flaky numerics (verdict flips between runs)" if f.get("flips") else "non-deterministic output"
    return (f"{f.get('method')}[{f.get('case')}].{f.get('output')}: {label}: {f.get('distinct')} distinct results in "
            f"{f.get('runs')} runs, spread {spread_text}, verdicts {verdicts}")


def console_lines(report: "Report") -> list[str]:
    section = report.replay
    if not section:
        return []
    head = (f"replay: {section.get('runs')} runs per case ({section.get('mode')}): {section.get('outputs')} output(s) "
            f"checked, {section.get('nondeterministic')} non-deterministic, {section.get('flaky')} flaky")
    return [head] + [f"  {finding_text(f)}" for f in section.get("findings") or []]


def markdown_lines(report: "Report") -> list[str]:
    """summary.md's determinism section (runner/writers/markdown.py)."""
    section = report.replay
    if not section:
        return []
    icon = "⚠️" if section.get("findings") else "✅"
    lines = [f"### {icon} Determinism replay: {section.get('runs')} runs per case ({_md(section.get('mode'))})", "",
             _md(section.get("how") or ""), ""]
    if not section.get("findings"):
        return lines + [f"All {section.get('outputs')} output(s) gave the same bytes in every run.", ""]
    lines += ["| case | output | finding | distinct | spread | verdicts |", "|---|---|---|---:|---:|---|"]
    for f in section["findings"]:
        spread = f.get("spread")
        lines.append(f"| {_md(f.get('method'))}[{f.get('case')}] | {_md(f.get('output'))} | {_md(f.get('finding'))} | "
                     f"{f.get('distinct')}/{f.get('runs')} | "
                     f"{format(spread, '.3g') if isinstance(spread, (int, float)) else _md(spread)} | "
                     f"{_md(', '.join(f'{k} {v}' for k, v in (f.get('verdicts') or {}).items()))} |")
    return lines + [""]


def html_section(report: Report) -> str:
    """The HTML report's replay section: every finding, or that all outputs were the same."""
    section = report.replay
    if not section:
        return ""
    from html import escape

    rows = "".join(
        f"<tr class='{'bad' if f.get('flips') else 'warn'}'><td>{escape(str(f.get('method')))}[{f.get('case')}]</td>"
        f"<td>{escape(str(f.get('output')))}</td><td>{escape(str(f.get('finding')))}</td>"
        f"<td>{f.get('distinct')}/{f.get('runs')}</td><td>{escape(format(f['spread'], '.3g') if isinstance(f.get('spread'), (int, float)) else str(f.get('spread')))}</td>"
        f"<td>{escape(', '.join(f'{k} {v}' for k, v in (f.get('verdicts') or {}).items()))}</td></tr>"
        for f in section.get("findings") or [])
    body = (f"<table><tr><th>case</th><th>output</th><th>finding</th><th>distinct/runs</th><th>spread</th>"
            f"<th>verdicts</th></tr>{rows}</table>" if rows else
            f"<p>All {section.get('outputs')} output(s) gave the same bytes in every run.</p>")
    return (f"<section id='replay'><h2>Determinism replay: {section.get('runs')} runs per case "
            f"({escape(str(section.get('mode')))})</h2><p class='meta'>{escape(str(section.get('how') or ''))}</p>"
            f"{body}</section>")


def junit_suite(root: Any, report: "Report", model: str, target: str) -> tuple[int, int]:
    """A `replay` testsuite: one testcase per replayed output, failing (type flaky-numerics /
    nondeterministic-output) when its results differ. Returns (tests, failures) for the totals."""
    import xml.etree.ElementTree as ET

    section = report.replay
    if not section:
        return 0, 0
    suite = ET.SubElement(root, "testsuite", name=f"{model}/{target}/replay", time="0.000000", errors="0", skipped="0")
    tests = failures = 0
    found = {(f["method"], f["case"], f["output"]): f for f in section.get("findings") or []}
    for case in report.cases:
        for out in case.outputs:
            entry = out.replay
            if not entry:
                continue
            tests += 1
            tc = ET.SubElement(suite, "testcase", name=visible(f"case[{case.case}].{out.name} x{entry['runs']}"),
                               classname=f"{model}/{target}/replay", time="0.000000")
            f = found.get((case.method, case.case, out.name))
            if f is not None:
                failures += 1
                ET.SubElement(tc, "failure", message=visible(finding_text(f)), type=f["finding"]).text = \
                    visible(finding_text(f))
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    return tests, failures


# ------------------------------------------------------------------ history

def history_rows(run_id: int, report: Report) -> list[tuple]:
    """One row per replayed output for the history's `replay_outputs` table (runner/history/store.py schema;
    finding NULL when deterministic)."""
    import json

    rows = []
    for case in report.cases:
        for out in case.outputs:
            entry = out.replay
            if not isinstance(entry, dict):
                continue
            spread = entry.get("spread")
            rows.append((run_id, case.method, case.case, out.index, out.name, entry.get("runs"), entry.get("distinct"),
                         float(spread) if isinstance(spread, (int, float)) else None, int(bool(entry.get("flips"))),
                         entry.get("finding"), json.dumps(entry.get("verdicts") or {})))
    return rows
