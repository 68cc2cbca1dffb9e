"""junit.xml from the typed Report, for CI test parsers (Jenkins, GitLab, GitHub): the writer "junit".

One <testcase> per case-output (classname = model/target/method, name =
case[i].output), so a CI page shows exactly which output of which case broke.
FAIL -> <failure> naming the failing criterion with measured value and limit;
ERROR -> <error>; TIMEOUT -> <error type="timeout">; SKIP -> <skipped>. A case
that produced no outputs (it errored before any) still gets one testcase. Regressions against a
baseline (`--baseline`: numerics, accuracy, performance figures) are one failing testcase each in a
`<model>/<target>/regressions` suite.
The layout follows the Jenkins JUnit schema (tests/data/junit.xsd), whose
<skipped> takes text only, and which every common parser also accepts.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bundlerun.bundles.fileio import atomic_write_bytes
from bundlerun.runner.judging.replay import junit_suite  # --replay: a non-deterministic output fails as its own type
from bundlerun.runner.report.criteria_text import criteria_items
from bundlerun.runner.report.model import OutputRecord, Report
from bundlerun.runner.writers import Inputs, writer
from bundlerun.targets.base import Verdict
from bundlerun.runner.report.safe_text import visible
from bundlerun.runner.report.sequences import figures, text_lines

# XML 1.0 forbids most control characters; device logs are full of them (EOT, ANSI).
# Also made visible: DEL and the C1 controls (0x9b is a terminal CSI), and lone surrogates (valid
# in JSON, not encodable as UTF-8). Everything from a bundle, a device or the user goes through it.
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _clean(text: Any) -> str:
    """Untrusted text for an attribute or element: everything XML forbids, plus newlines, bidi
    and invisible characters, made visible (runner/report/safe_text.py)."""

    return visible(text)


def _clean_lines(text: Any) -> str:
    """Multi-line text bundlerun composed (a failure body): each line made inert, joined by newlines."""
    return "\n".join(_clean(line) for line in str("" if text is None else text).split("\n"))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def failure_text(out: OutputRecord | None) -> tuple[str, str]:
    """(message, body) for a failed output (None: a failed case without outputs): each failing
    criterion with its numbers."""
    failed = out.failed if out is not None else []
    parts = []
    for f in failed:
        parts.append(f"{f.criterion}: measured {_fmt(f.measured)} limit {_fmt(f.limit)}")
    message = "; ".join(parts) or "output did not meet its criteria"
    lines = [message]
    for f in failed:
        if f.detail:
            lines.append(f"  {f.criterion}: {f.detail}")
    stats = out.stats if out is not None else None
    keys = ("sqnr", "error_mae", "error_max", "cosine_similarity", "relative_frobenius", "mismatch_count")
    shown = [f"{k}={_fmt(getattr(stats, k))}" for k in keys if getattr(stats, k, None) is not None]
    if shown:
        lines.append("stats: " + " ".join(shown))
    crit = out.criteria if out is not None else None
    set_crit = criteria_items(crit)  # 4 significant digits (runner/report/criteria_text.py)
    if set_crit:
        lines.append("criteria: " + " ".join(set_crit))
    return message, "\n".join(_clean(line) for line in lines)  # each line inert: newlines only between them


def _case_label(report: Report) -> tuple[str, str]:
    bundle = report.bundle
    model = bundle.get("model") or Path(str(bundle.get("path") or "bundle")).stem
    target = report.target.get("url") or bundle.get("built_for") or "target"
    return str(model), str(target)


def build_junit(report: Report) -> ET.Element:
    """The <testsuites> element for one report (one <testsuite> per method)."""
    model, target = _case_label(report)
    run = report.run
    bundle = report.bundle
    model, target = _clean(model), _clean(target)
    root = ET.Element("testsuites", name=f"bundlerun {model} on {target}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
    # one suite per method, in the order the methods first come; each case's testcases are made as it
    # is read and the case let go (a farm's merged report streams its cases from disk: holding every
    # case grew the coordinator's memory with the jobs, bench/bench_farm_scale.py)
    by_method: dict[str, tuple[ET.Element, ET.Element, dict[str, Any], str]] = {}
    for case in report.cases:
        entry = by_method.get(case.method)
        if entry is None:
            method = _clean(case.method)
            suite = ET.SubElement(root, "testsuite", name=f"{model}/{target}/{method}")
            props = ET.SubElement(suite, "properties")
            for key, value in (
                ("model", model),
                ("target", target),
                ("backend", bundle.get("backend")),
                ("dtype", bundle.get("dtype")),
                ("bundle_sha256", bundle.get("sha256")),
                ("label", run.get("label")),
                ("run_id", run.get("id")),
                ("torch", (bundle.get("versions") or {}).get("torch")),
                ("executorch", (bundle.get("versions") or {}).get("executorch")),
            ):
                if value is not None:
                    ET.SubElement(props, "property", name=key, value=_clean(value))
            counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
            entry = by_method[case.method] = (suite, props, counts, method)
        suite, props, counts, method = entry
        classname = f"{model}/{target}/{method}"
        outputs: list[OutputRecord | None] = list(case.outputs) or [None]
        elapsed = float(case.elapsed_s or 0.0)
        for out in outputs:
            counts["tests"] += 1
            name = f"case[{case.case}]" + (f".{out.name or 'out' + str(out.index)}" if out is not None else "")
            tc = ET.SubElement(
                suite, "testcase", name=_clean(name), classname=classname, time=f"{elapsed / len(outputs):.6f}"
            )
            verdict = out.verdict if out is not None else case.verdict
            log = "\n".join(_clean(line) for line in case.log_excerpt)
            if verdict == Verdict.FAIL:
                counts["failures"] += 1
                message, body = failure_text(out)
                el = ET.SubElement(tc, "failure", message=_clean(message), type="numerics")
                el.text = body  # made of lines each passed through _clean
            elif verdict in (Verdict.ERROR, Verdict.TIMEOUT):
                counts["errors"] += 1
                kind = "timeout" if verdict == Verdict.TIMEOUT else (case.error_kind.value if case.error_kind else "error")
                msg = case.error or ("case timed out" if verdict == Verdict.TIMEOUT else "case could not run")
                el = ET.SubElement(tc, "error", message=_clean(msg), type=_clean(kind))
                el.text = _clean(msg) + (f"\nlog: {_clean(case.log_path)}" if case.log_path else "")
            elif verdict == Verdict.SKIP:
                counts["skipped"] += 1
                el = ET.SubElement(tc, "skipped")
                el.text = _clean(case.error or "skipped")
            if log and verdict != Verdict.PASS:
                ET.SubElement(tc, "system-out").text = log
        counts["time"] += float(case.elapsed_s or 0.0)
    for suite, props, counts, method in by_method.values():
        for key in ("tests", "failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
            totals[key] += counts[key]
        suite.set("time", f"{counts['time']:.6f}")
        totals["time"] += counts["time"]
        if run.get("started"):
            suite.set("timestamp", _clean(run["started"]))
        host = (run.get("host") or {}).get("machine")
        if host:
            suite.set("hostname", _clean(host))
        _sequences(report, method, suite, props)
        if not len(props):
            suite.remove(props)
    regressions = report.regressions or []
    base = report.baseline or {}
    if regressions and not base.get("refused"):
        # One failing testcase per regression against the baseline (numerics, accuracy, perf), so a
        # CI page names a cycle or memory regression as plainly as a failed output.
        suite = ET.SubElement(root, "testsuite", name=f"{model}/{target}/regressions", tests=str(len(regressions)),
                              failures=str(len(regressions)), errors="0", skipped="0", time="0.000000")
        props = ET.SubElement(suite, "properties")
        for key in ("ref", "run_id", "label"):
            if base.get(key) is not None:
                ET.SubElement(props, "property", name=f"baseline_{key}", value=_clean(base[key]))
        if not len(props):
            suite.remove(props)
        for r in regressions:
            tc = ET.SubElement(suite, "testcase", name=_clean(f"{r.get('rule')}: {r.get('where')}"),
                               classname=f"{model}/{target}/regressions", time="0.000000")
            el = ET.SubElement(tc, "failure", message=_clean(r.get("message")), type=_clean(r.get("rule") or "regression"))
            el.text = _clean(r.get("message")) + _clean_lines(f"\nbaseline {_fmt(r.get('baseline'))} current "
                                                              f"{_fmt(r.get('current'))} limit {_fmt(r.get('limit'))}")
        totals["tests"] += len(regressions)
        totals["failures"] += len(regressions)

    replayed, flaky = junit_suite(root, report, model, target)
    totals["tests"] += replayed
    totals["failures"] += flaky
    if report.warnings:
        # Put warnings on the last suite: they concern the whole run.
        suites = root.findall("testsuite")
        if suites:
            ET.SubElement(suites[-1], "system-err").text = "\n".join(_clean(w) for w in report.warnings)
    for key in ("tests", "failures", "errors"):
        root.set(key, str(totals[key]))
    root.set("time", f"{totals['time']:.6f}")
    return root


def _sequences(report: Report, method: str, suite: ET.Element, props: ET.Element) -> None:
    """LLM bundles: each sequence of this method as properties (its figures) and the per-step
    table as the suite's system-out (runner/report/sequences.py)."""

    seqs = [s for s in report.sequences if _clean(s.method) == method]
    for seq in seqs:
        for key, value in figures(seq).items():
            ET.SubElement(props, "property", name=_clean(f"sequence.{seq.name}.{key}"),
                          value="" if value is None else _clean(_fmt(value)))
    if seqs:
        ET.SubElement(suite, "system-out").text = "\n\n".join(
            "\n".join(_clean(line) for line in text_lines(seq)) for seq in seqs)


def junit_bytes(report: Report) -> bytes:
    root = build_junit(report)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(report: Report, path: str | Path) -> Path:
    return atomic_write_bytes(path, junit_bytes(report))


@writer("junit", "junit.xml", "JUnit report")
def _write(report: Report, path: Path, inputs: Inputs) -> Path:
    return write_junit(report, path)
