"""Failure kinds are a closed set in live code (targets/failures.py).

Every string literal the code passes as a failure kind (error_kind=..., kind=... of a TargetError,
a WalkError's kind, the "kind" of a worker's protocol event) must be a FailureKind value: a typo
or an old synonym would otherwise reach reports as a kind nobody documents. The scan reads the
source (ast), so a new call site is checked without being listed here. Old synonyms are read
only from old report files (FailureKind.read).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bundlerun.targets.failures import FailureKind

ROOT = Path(__file__).resolve().parents[1]
KINDS = {k.value for k in FailureKind}
# keyword arguments that name a failure kind where they are given as a literal
KIND_KEYWORDS = {"error_kind", "kind"}
# calls whose `kind=` is something else (bundle values, perf figures, debug rows)
OTHER_KINDS = {"BundledValue", "Intermediate", "PerfFigure", "Value", "TensorSpec", "Check", "RegressionRule"}
# literal strings that are kinds in other vocabularies (perf figure kinds, value kinds)
NOT_FAILURES = {"tensor", "int", "bool", "double", "host-wall", "device-latency", "stable", "debug", "failed",
                "bad-request", "simulation-time", "kernel", "delegate", "delegate-op"}


def _literal_kinds(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in OTHER_KINDS:
                continue
            args = list(node.args[:1]) if name == "WalkError" else []
            args += [kw.value for kw in node.keywords if kw.arg in KIND_KEYWORDS]
            for value in args:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield node.lineno, value.value


def test_every_failure_kind_literal_in_live_code_is_in_the_closed_set():
    bad = []
    for folder in ("targets", "runner", "bundles"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, value in _literal_kinds(path):
                if value not in KINDS and value not in NOT_FAILURES:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert not bad, "failure kinds outside targets/failures.py:\n" + "\n".join(bad)


def test_live_code_refuses_a_kind_outside_the_set_and_reports_still_read_old_synonyms():
    from bundlerun.targets.base import CaseResult, CaseStatus

    with pytest.raises(ValueError, match="not a failure kind"):
        CaseResult("forward", 0, CaseStatus.ERROR, error="x", error_kind="hang")  # an old synonym, in new code
    with pytest.raises(ValueError, match="not a failure kind"):
        CaseResult("forward", 0, CaseStatus.ERROR, error="x", error_kind="host-timout")  # a typo
    assert CaseResult("forward", 0, CaseStatus.ERROR, error_kind="host-timeout").error_kind is FailureKind.HOST_TIMEOUT
    assert FailureKind.read("hang") is FailureKind.HOST_TIMEOUT  # a report written before the enum
    with pytest.raises(ValueError):
        FailureKind.read("no-such-kind")


def test_a_report_with_an_unknown_kind_is_a_one_line_report_error():
    from bundlerun.runner.report.model import CaseRecord, ReportError

    case = {"method": "forward", "case": 0, "status": "error", "verdict": "ERROR", "error_kind": "hnag"}
    with pytest.raises(ReportError, match="forward\\[0\\].*'hnag' is not a failure kind"):
        CaseRecord.from_json(case)
    assert CaseRecord.from_json({**case, "error_kind": "load-timeout"}).error_kind is FailureKind.HOST_TIMEOUT
