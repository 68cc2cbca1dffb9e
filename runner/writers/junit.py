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
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterator

from bundlerun.bundles.fileio import atomic_write_bytes, atomic_write_chunks
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


_Suite = tuple[ET.Element, ET.Element, dict[str, Any], str]  # (testsuite, its properties, its counts, method)


def _zero() -> dict[str, Any]:
    return {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}


def _new_suite(parent: ET.Element | None, report: Report, model: str, target: str, raw_method: str) -> _Suite:
    """A method's <testsuite> with its properties (`parent`: made inside it, None: made alone)."""
    run, bundle = report.run, report.bundle
    method = _clean(raw_method)
    name = f"{model}/{target}/{method}"
    suite = ET.Element("testsuite", name=name) if parent is None else ET.SubElement(parent, "testsuite", name=name)
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
    return suite, props, _zero(), method


def _add_case(entry: _Suite, case: Any, model: str, target: str) -> None:
    """The case's testcases (one per output, one when it has none) into its method's suite."""
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


def _end_suite(entry: _Suite, report: Report, totals: dict[str, Any]) -> None:
    """A method's suite once its cases are in: its counts, time, timestamp, host and sequences."""
    suite, props, counts, method = entry
    run = report.run
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


def _after_methods(root: ET.Element, report: Report, model: str, target: str, totals: dict[str, Any]) -> None:
    """The suites after the methods': the regressions against a baseline, then the replay."""
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


def _warnings(suite: ET.Element, report: Report) -> None:
    """The run's warnings, on the last suite: they concern the whole run."""
    ET.SubElement(suite, "system-err").text = "\n".join(_clean(w) for w in report.warnings)


def _labels(report: Report) -> tuple[str, str]:
    model, target = _case_label(report)
    return _clean(model), _clean(target)


def build_junit(report: Report) -> ET.Element:
    """The <testsuites> element for one report (one <testsuite> per method)."""
    model, target = _labels(report)
    root = ET.Element("testsuites", name=f"bundlerun {model} on {target}")
    totals = _zero()
    # one suite per method, in the order the methods first come; each case's testcases are made as it
    # is read and the case let go
    by_method: dict[str, _Suite] = {}
    for case in report.cases:
        entry = by_method.get(case.method)
        if entry is None:
            entry = by_method[case.method] = _new_suite(root, report, model, target, case.method)
        _add_case(entry, case, model, target)
    for entry in by_method.values():
        _end_suite(entry, report, totals)
    _after_methods(root, report, model, target, totals)
    if report.warnings:
        suites = root.findall("testsuite")
        if suites:
            _warnings(suites[-1], report)
    _set_totals(root, totals)
    return root


def _set_totals(root: ET.Element, totals: dict[str, Any]) -> None:
    for key in ("tests", "failures", "errors"):
        root.set(key, str(totals[key]))
    root.set("time", f"{totals['time']:.6f}")


class _NotContiguous(Exception):
    """A method's cases are not all together: its suite cannot be written before the next one's."""


def _streamed_chunks(report: Report) -> Iterator[bytes]:
    """junit_bytes(report), byte for byte, made one method's suite at a time: each suite is indented
    as ET.indent indents it inside the whole tree and written to a scratch file once its cases are
    in, so a farm's merged report (an element per case, its cases read from disk) never holds the
    whole tree (~5 MB at 2,000 jobs, bench/bench_farm_scale.py). The root's totals come first in the
    file and are known last: the suites wait in the scratch file. Raises _NotContiguous (before
    anything is yielded) when a method's cases are apart: build_junit then groups them."""
    model, target = _labels(report)
    totals = _zero()
    tail = ET.Element("testsuites")  # the regressions' and the replay's suites
    _after_methods(tail, report, model, target, totals)
    tails = list(tail)
    with tempfile.TemporaryFile() as scratch:
        held: _Suite | None = None  # the last suite made: the warnings go on it when no other follows
        raw: str | None = None
        done: set[str] = set()
        suites = 0

        def put(entry: _Suite, last: bool) -> None:
            _end_suite(entry, report, totals)
            if last and report.warnings:
                _warnings(entry[0], report)
            ET.indent(entry[0], level=1)
            entry[0].tail = "\n" if last else "\n  "
            scratch.write(ET.tostring(entry[0], encoding="unicode").encode("utf-8", "xmlcharrefreplace"))

        for case in report.cases:
            if held is None or case.method != raw:
                if case.method in done:
                    raise _NotContiguous(case.method)
                if held is not None:
                    put(held, last=False)
                held, raw = _new_suite(None, report, model, target, case.method), case.method
                done.add(case.method)
                suites += 1
            _add_case(held, case, model, target)
        if held is not None:
            put(held, last=not tails)
        for n, suite in enumerate(tails):
            if n == len(tails) - 1 and report.warnings:
                _warnings(suite, report)
            ET.indent(suite, level=1)
            suite.tail = "\n" if n == len(tails) - 1 else "\n  "
            scratch.write(ET.tostring(suite, encoding="unicode").encode("utf-8", "xmlcharrefreplace"))
        if not suites and not tails:
            raise _NotContiguous("no suite")  # an empty <testsuites/>: build_junit's short form
        root = ET.Element("testsuites", name=f"bundlerun {model} on {target}")
        _set_totals(root, totals)
        root.text = "\n  "
        head = ET.tostring(root, encoding="unicode")
        head = head[: head.rindex("</testsuites>")]
        yield b"<?xml version='1.0' encoding='utf-8'?>\n" + head.encode("utf-8", "xmlcharrefreplace")
        scratch.seek(0)
        while chunk := scratch.read(1 << 16):
            yield chunk
        yield b"</testsuites>"


def junit_streamed_bytes(report: Report) -> bytes:
    """What write_junit_streamed writes, as bytes (tests compare it with junit_bytes)."""
    try:
        return b"".join(_streamed_chunks(report))
    except _NotContiguous:
        return junit_bytes(report)


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
    if hasattr(report.cases, "dicts"):  # a farm's merged report: its cases stream from disk (merge_jobs.py)
        try:
            return atomic_write_chunks(path, _streamed_chunks(report))
        except _NotContiguous:
            pass
    return atomic_write_bytes(path, junit_bytes(report))


@writer("junit", "junit.xml", "JUnit report")
def _write(report: Report, path: Path, inputs: Inputs) -> Path:
    return write_junit(report, path)
