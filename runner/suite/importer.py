"""The backend test suite's reports -> the history database (`bundlerun history import FILE`).

Reads the suite's two formats:

- its CI format, pytest-json-report (`--json-report`): each test's `metadata.subtests[]`
  holds one entry per `lower_and_run_model` call with the suite's columns (suite/conftest.py
  `pytest_json_runtest_metadata`: Test ID, Test Case, Subtest, Flow, Result, Result Detail,
  Error, Delegated, ..., `Output N Error Max / MAE / SNR` for every output);
- its CSV (reporting.py CSV_FIELD_NAMES, the same columns; the first two outputs only), and the
  CSV bundlerun's plugin writes (suite.csv: every output, plus bundlerun's columns).

Each subtest becomes one run: model = the Test ID (`#k` for subtest k > 0), target = the
bundlerun target its compare step ran on (`bundlerun Target`) or `host (suite)` for the
suite's own in-process run, backend/dtype from the flow; its outputs' error max / MAE / SNR
go to case_outputs, so `hud`, `trend` and `compare` read them like any run; tags (source,
flow, operator, commit, the suite's Result) go to run_tags (runner/history_tags.py). When a
subtest names bundlerun's report of the device run and that file still exists, that report
is recorded instead (every output, bundlerun's verdict with the registry's numbers).

The commit: `--commit`, else a CI commit variable in the report's environment, else this
machine's (runner/commits.py). Re-importing a file records nothing twice (run ids are derived
from the file's content, the test node and the subtest).
"""

from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bundlerun.bundles.errors import BundlerunError

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

SUITE_TARGET = "host (suite)"
RESULTS = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}
_OUTPUT = re.compile(r"^Output (\d+) (Error Max|Error MAE|SNR)$")


class SuiteReportError(BundlerunError):
    """The file is not a report of the backend test suite; one line."""


@dataclass
class SuiteRow:
    """One subtest of the suite, from either format."""

    columns: dict[str, Any]
    node: str | None = None  # the pytest node id (JSON, bundlerun's CSV)
    duration_s: float | None = None

    @property
    def test_id(self) -> str:
        return str(self.columns.get("Test ID") or self.node or "?")

    @property
    def subtest(self) -> int:
        try:
            return int(self.columns.get("Subtest") or 0)
        except (TypeError, ValueError):
            return 0

    @property
    def name(self) -> str:
        return self.test_id if self.subtest == 0 else f"{self.test_id}#{self.subtest}"

    def outputs(self) -> list[dict[str, float | None]]:
        found: dict[int, dict[str, float | None]] = {}
        for key, value in self.columns.items():
            m = _OUTPUT.match(str(key))
            if m and value not in (None, ""):
                found.setdefault(int(m.group(1)), {})[m.group(2)] = _number(value)
        return [found[i] for i in sorted(found)]


@dataclass
class SuiteFile:
    rows: list[SuiteRow]
    created: str | None  # when the suite ran (the report's `created`, else the file's mtime)
    environment: dict[str, Any] = field(default_factory=dict)
    digest: str = ""
    kind: str = "json"


def _number(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def read_suite_file(path: str | Path) -> SuiteFile:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SuiteReportError(f"{path}: no such file") from None
    except OSError as exc:
        raise SuiteReportError(f"{path}: cannot read ({exc.strerror})") from None
    digest = hashlib.sha256(data).hexdigest()
    mtime = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")
    text = data.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        try:
            report = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SuiteReportError(f"{path}: not valid JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(report, dict) or not isinstance(report.get("tests"), list):
            raise SuiteReportError(f"{path}: not a pytest-json-report file (no 'tests' list); run the suite with "
                               "--json-report")
        rows = []
        for test in report["tests"]:
            if not isinstance(test, dict):
                continue
            subtests = ((test.get("metadata") or {}).get("subtests")) or []
            duration = sum(float((test.get(p) or {}).get("duration") or 0) for p in ("setup", "call", "teardown"))
            for sub in subtests:
                if isinstance(sub, dict) and sub.get("Result"):
                    rows.append(SuiteRow(sub, str(test.get("nodeid") or ""), duration))
        created = report.get("created")
        when = (_dt.datetime.fromtimestamp(float(created), _dt.timezone.utc).isoformat(timespec="seconds")
                if isinstance(created, (int, float)) else mtime)
        if not rows and report["tests"]:
            raise SuiteReportError(f"{path}: the tests carry no suite metadata (metadata.subtests); is this a run of "
                               "executorch.backends.test.suite with --json-report?")
        return SuiteFile(rows, when, dict(report.get("environment") or {}), digest, "json")
    reader = csv.DictReader(io.StringIO(text))
    fields = reader.fieldnames or []
    if not {"Test ID", "Flow", "Result"} <= set(fields):
        raise SuiteReportError(f"{path}: neither a pytest-json-report file nor the suite's CSV (needs the columns "
                           "Test ID, Flow, Result)")
    rows = [SuiteRow(dict(r), r.get("Test Node") or None) for r in reader if r.get("Result")]
    return SuiteFile(rows, mtime, {}, digest, "csv")


def _operator_names() -> list[str]:
    """The operator test modules of the installed suite (operators/test_<op>.py), longest first."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0]) / "backends" / "test" / "suite" / "operators"
    return sorted((p.stem[5:] for p in folder.glob("test_*.py")), key=len, reverse=True)


def operator_of(row: SuiteRow, known: list[str]) -> str:
    """The operator a test covers: its test file's name (operators/test_add.py -> add), else the
    longest operator module name its Test Case starts with."""
    if row.node:
        m = re.search(r"(?:^|/)test_([A-Za-z0-9_]+)\.py::", row.node)
        if m:
            return m.group(1)
    case = str(row.columns.get("Test Case") or row.test_id).removeprefix("test_")
    for name in known:
        if case == name or case.startswith(name + "_"):
            return name
    return case.split("[")[0]


def _dtype(row: SuiteRow, flow: str) -> tuple[str | None, str]:
    from bundlerun.runner.suite.flows import numbers_from_name

    numbers = numbers_from_name(flow)
    text = f"{row.test_id} {row.columns.get('Params') or ''}"
    if numbers.reference == "quantized":
        return numbers.backend, numbers.dtype
    return numbers.backend, "fp16" if "float16" in text else "bf16" if "bfloat16" in text else "fp32"


def _commit_of(given: str | None, environment: dict[str, Any]) -> tuple[str | None, str | None]:
    from bundlerun.runner import commits

    if given:
        return given, "--commit"
    for var in commits.CI_VARS:
        if environment.get(var):
            return str(environment[var]), f"report environment {var}"
    found = commits.detect()
    return (found.sha, found.source) if found else (None, None)


def synthesized_report(row: SuiteRow, flow: str, target: str, started: str | None, run_id: str,
                       source_file: str) -> "Report":
    """A bundlerun report for one suite subtest, from the suite's own columns."""
    from bundlerun.runner.judge import summarize
    from bundlerun.runner.outcome import EXIT_PASS
    from bundlerun.runner.report.model import CaseRecord, OutputRecord, Report
    from bundlerun.runner.report.record import tool_version
    from bundlerun.targets.failures import FailureKind

    result = RESULTS.get(str(row.columns.get("Result") or "").strip().lower(), "FAIL")
    bundlerun_verdict = str(row.columns.get("bundlerun Verdict") or "")
    if result == "FAIL" and bundlerun_verdict in ("ERROR", "TIMEOUT"):
        result = bundlerun_verdict  # the device run did not happen: infrastructure, not numerics
    detail = str(row.columns.get("Result Detail") or "")
    error = str(row.columns.get("Error") or "") or None
    outputs = [OutputRecord(j, f"out{j}", result, criteria=None,
                            stats={"error_max": stats.get("Error Max"), "error_mae": stats.get("Error MAE"),
                                   "sqnr": stats.get("SNR")},
                            note="the suite's statistics (3 decimals); the suite judges the test, not each output")
               for j, stats in enumerate(row.outputs())]
    kind = row.columns.get("bundlerun Failure Kind") or None
    try:  # a column of the suite's file: an unknown kind is the file's problem, said as a warning
        error_kind = FailureKind.read(kind) if result in ("ERROR", "TIMEOUT") else None
        kind_warning = None
    except ValueError as exc:
        error_kind, kind_warning = FailureKind.RUNNER_ERROR, f"suite column 'bundlerun Failure Kind': {exc}"
    case = CaseRecord(method="forward", case=0, status={"PASS": "ok", "FAIL": "ok", "SKIP": "skip",
                                                        "TIMEOUT": "timeout"}.get(result, "error"),
                      verdict=result, outputs=outputs, elapsed_s=row.duration_s,
                      error=error if result != "PASS" else None, error_kind=error_kind)
    backend, dtype = _dtype(row, flow)
    report = Report(
        summary=summarize([case]), cases=[case],
        tool={"name": "bundlerun", "version": tool_version()},
        run={"id": run_id, "label": None, "started": started, "finished": started, "duration_s": row.duration_s,
             "command": ["bundlerun", "history", "import", source_file], "host": {}},
        bundle={"path": None, "model": row.name, "backend": backend or row.columns.get("Flow"), "dtype": dtype,
                "built_for": target, "has_manifest": False},
        target={"url": target, "info": {"source": "ExecuTorch backend test suite", "flow": flow}},
        extras={"suite": {k: v for k, v in row.columns.items() if v not in (None, "")}},
    )
    if result == "SKIP":  # the suite skipped it (not a backend failure): no verdict of bundlerun's to give
        report.summary.verdict, report.summary.exit_code = "SKIP", EXIT_PASS
    if detail:
        report.warnings.append(f"suite result: {row.columns.get('Result')} ({detail})")
    if kind_warning:
        report.warnings.append(kind_warning)
    return report


@dataclass
class ImportSummary:
    recorded: int = 0
    already: int = 0
    from_bundlerun: int = 0
    commit: str | None = None
    flows: dict[str, int] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)


def import_suite_report(db_path: str | Path, path: str | Path, commit: str | None = None,
                        time: str | None = None) -> ImportSummary:
    from bundlerun.runner import history
    from bundlerun.runner.report.model import ReportError, read_report

    suite = read_suite_file(path)
    sha, commit_source = _commit_of(commit, suite.environment)
    started = history.utc_iso(time) if time else suite.created
    known = _operator_names()
    out = ImportSummary(commit=sha)
    items: list = []
    before = {r.run_uuid for r in history.list_runs(db_path, limit=None)} if Path(db_path).exists() else set()
    for row in suite.rows:
        flow = str(row.columns.get("Flow") or "")
        target = str(row.columns.get("bundlerun Target") or "") or SUITE_TARGET
        run_id = hashlib.sha256(f"{suite.digest}\0{row.node}\0{row.test_id}\0{row.subtest}".encode()).hexdigest()[:32]
        tags = {"source": "suite", "flow": flow, "operator": operator_of(row, known), "test": row.test_id,
                "subtest": row.subtest, "commit_sha": sha, "commit_source": commit_source,
                "suite_result": row.columns.get("Result"), "suite_detail": row.columns.get("Result Detail") or None,
                "suite_error": (str(row.columns.get("Error") or "")[:400]) or None}
        report, report_path = None, None
        device_report = row.columns.get("bundlerun Report")
        if device_report and Path(str(device_report)).is_file():
            try:
                report = read_report(Path(str(device_report)))
                report_path = str(device_report)
                run_id = str(report.run.get("id") or run_id)  # one device run: one history run, from either file
                report.run["started"] = report.run.get("started") or started
                report.extras["suite"] = {k: v for k, v in row.columns.items() if v not in (None, "")}
                tags["source"] = "suite+bundlerun"
                out.from_bundlerun += 1
            except ReportError:
                report = None
        if report is None:
            report = synthesized_report(row, flow, target, started, run_id, str(path))
            if row.columns.get("bundlerun Verdict"):
                tags["source"] = "suite+bundlerun"
        if run_id in before:
            out.already += 1
        else:
            out.recorded += 1
        items.append((report, report_path, tags))
        out.flows[flow] = out.flows.get(flow, 0) + 1
    out.ids = history.record_reports(db_path, items) if items else []
    return out
