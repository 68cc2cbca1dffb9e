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
flow, operator, commit, the suite's Result) go to run_tags (runner/history/tags.py). When a
subtest names bundlerun's report of the device run and that file still exists, that report
is recorded instead (every output, bundlerun's verdict with the registry's numbers).

The commit: `--commit`, else a CI commit variable in the report's environment, else this
machine's (runner/history/commits.py). Re-importing a file records nothing twice (run ids are derived
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
from bundlerun.bundles.limits import MAX_CASES, MAX_FILE_BYTES, MAX_TIMEOUT_S
from bundlerun.targets.base import CaseStatus, Verdict
from bundlerun.runner.history import commits
from bundlerun.runner.judging.outcome import EXIT_PASS
from bundlerun.runner.report.model import ReportError, read_report
from bundlerun.runner.suite.flows import numbers_from_name
from bundlerun.targets.failures import FailureKind

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

SUITE_TARGET = "host (suite)"
RESULTS = {"pass": Verdict.PASS, "fail": Verdict.FAIL, "skip": Verdict.SKIP}
_OUTPUT = re.compile(r"^Output (\d+) (Error Max|Error MAE|SNR)$")
VERDICTS = tuple(Verdict)
# bundlerun's own bounds on what one suite report may hold (no ExecuTorch source sets them; each is
# far above what the suite writes and low enough that every later `hud`/`history` reads it back):
MAX_NAME_CHARS = 4096  # a test id, node id, flow, target, column name, report path (PATH_MAX is 4096)
MAX_TEXT_CHARS = 64 << 10  # a free-text column (Error, Result Detail, ...): the suite writes an exception's text
MAX_JSON_DEPTH = 32  # nesting of the report (the suite's own is 5 deep; `environment` holds plugin tables)
MAX_OUTPUTS = 10_000  # `Output N ...` columns: N below this
MAX_SECONDS = MAX_TIMEOUT_S  # a test's setup/call/teardown duration: one week, as any timeout
MAX_CREATED = 253402300799.0  # the report's `created`: 9999-12-31T23:59:59Z, the last time datetime can show
_NAME_COLUMNS = ("Test ID", "Test Case", "Flow", "Result", "bundlerun Target", "bundlerun Verdict",
                 "bundlerun Failure Kind", "bundlerun Report", "Test Node", "Params")


class SuiteReportError(BundlerunError):
    """The file is not a report of the backend test suite; one line."""

    kind = "bad-suite-report"


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


def _where(test: int | None, sub: int | None) -> str:
    if test is None:
        return ""
    return f"tests[{test}]" + (f".metadata.subtests[{sub}]" if sub is not None else "") + ": "


def _text(value: Any, what: str, limit: int = MAX_NAME_CHARS) -> str:
    """A string the history keeps: valid Unicode (no lone surrogate, which SQLite and every writer
    refuse), at most `limit` characters; else SuiteReportError naming `what`."""
    if not isinstance(value, str):
        raise SuiteReportError(f"{what}: expected text, got {type(value).__name__}")
    if len(value) > limit:
        raise SuiteReportError(f"{what}: {len(value)} characters (at most {limit}, bundlerun's limit)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SuiteReportError(f"{what}: not valid Unicode (a lone surrogate)") from None
    return value


def _finite(value: Any, what: str, lo: float, hi: float) -> float:
    """A finite number in [lo, hi] (not a bool), else SuiteReportError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SuiteReportError(f"{what}: expected a number, got {type(value).__name__}")
    number = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
    if not math.isfinite(number) or not lo <= number <= hi:
        raise SuiteReportError(f"{what}: {str(value)[:40]} is not a finite number in [{lo:g}, {hi:g}]")
    return number


def check_columns(columns: Any, where: str) -> dict[str, Any]:
    """One subtest's columns, checked so that nothing in them can break a later `hud`, `history`,
    `trend` or `compare`: scalar values only, bounded text, statistics that are numbers, a
    verdict bundlerun knows. Returns the columns as they are."""
    if not isinstance(columns, dict):
        raise SuiteReportError(f"{where}expected an object of the suite's columns, got {type(columns).__name__}")
    for key, value in columns.items():
        name = _text(key, f"{where}a column name")
        what = f"{where}column {name[:80]!r}"
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            if isinstance(value, int) and not -2**63 <= value < 2**63:  # SQLite's INTEGER
                raise SuiteReportError(f"{what}: {str(value)[:40]}... is out of range")
            continue
        if not isinstance(value, str):
            raise SuiteReportError(f"{what}: expected text or a number, got {type(value).__name__}")
        _text(value, what, MAX_NAME_CHARS if name in _NAME_COLUMNS else MAX_TEXT_CHARS)
    for key, value in columns.items():  # the statistics: numbers ("inf", "nan" as the suite writes them)
        m = _OUTPUT.match(key)
        if not m or value in (None, ""):
            continue
        what = f"{where}column {key[:80]!r}"
        if int(m.group(1)) >= MAX_OUTPUTS:
            raise SuiteReportError(f"{what}: output index {m.group(1)} (at most {MAX_OUTPUTS - 1})")
        try:
            number = float(value)
        except ValueError:
            raise SuiteReportError(f"{what}: {str(value)[:40]!r} is not a number") from None
        if m.group(2) != "SNR" and number < 0:
            raise SuiteReportError(f"{what}: {str(value)[:40]!r} is negative (an error magnitude)")
    subtest = columns.get("Subtest")
    if subtest not in (None, ""):
        try:
            index = int(subtest) if isinstance(subtest, (int, str)) else (
                int(subtest) if isinstance(subtest, float) and subtest.is_integer() else None)
        except ValueError:
            index = None
        if index is None or not 0 <= index <= MAX_CASES:
            raise SuiteReportError(f"{where}column 'Subtest': {str(subtest)[:40]!r} is not a whole number in "
                                   f"[0, {MAX_CASES}]")
    verdict = columns.get("bundlerun Verdict")
    if verdict not in (None, "") and str(verdict) not in VERDICTS:
        raise SuiteReportError(f"{where}column 'bundlerun Verdict': {str(verdict)[:40]!r} is not one of "
                               f"{', '.join(VERDICTS)}")
    return columns


def _depth_ok(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when `value` nests at most `limit` containers deep (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return True


def _duration(test: dict[str, Any], where: str) -> float:
    total = 0.0
    for phase in ("setup", "call", "teardown"):
        record = test.get(phase)
        if record is None:
            continue
        if not isinstance(record, dict):
            raise SuiteReportError(f"{where}{phase}: expected an object, got {type(record).__name__}")
        value = record.get("duration")
        if value is not None:
            total += _finite(value, f"{where}{phase}.duration", 0.0, MAX_SECONDS)
    return total


def read_suite_file(path: str | Path) -> SuiteFile:
    """The suite's report, every field checked (docs/security.md, "history import"): a file that
    is not one, or holds a value a later command could not read back, is one SuiteReportError."""
    path = Path(path)
    try:
        info = path.stat()
        if not path.is_file():
            raise SuiteReportError(f"{path}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise SuiteReportError(f"{path}: {info.st_size} bytes (at most {MAX_FILE_BYTES}, bundlerun's limit)")
        data = path.read_bytes()
    except FileNotFoundError:
        raise SuiteReportError(f"{path}: no such file") from None
    except OSError as exc:
        raise SuiteReportError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_FILE_BYTES:  # it grew after the stat
        raise SuiteReportError(f"{path}: more than {MAX_FILE_BYTES} bytes (bundlerun's limit)")
    digest = hashlib.sha256(data).hexdigest()
    mtime = _dt.datetime.fromtimestamp(info.st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")
    text = data.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        return _read_json(path, text, digest, mtime)
    return _read_csv(path, text, digest, mtime)


def _read_json(path: Path, text: str, digest: str, mtime: str) -> SuiteFile:
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SuiteReportError(f"{path}: not valid JSON ({exc.msg} at character {exc.pos})") from None
    except RecursionError:
        raise SuiteReportError(f"{path}: JSON nested too deep (at most {MAX_JSON_DEPTH} levels)") from None
    if not isinstance(report, dict) or not isinstance(report.get("tests"), list):
        raise SuiteReportError(f"{path}: not a pytest-json-report file (no 'tests' list); run the suite with "
                               "--json-report")
    if not _depth_ok(report):
        raise SuiteReportError(f"{path}: JSON nested too deep (at most {MAX_JSON_DEPTH} levels)")
    rows = []
    try:
        for i, test in enumerate(report["tests"]):
            if not isinstance(test, dict):
                raise SuiteReportError(f"{_where(i, None)}expected an object, got {type(test).__name__}")
            where = _where(i, None)
            metadata = test.get("metadata")
            if metadata is None:
                continue
            if not isinstance(metadata, dict):
                raise SuiteReportError(f"{where}metadata: expected an object, got {type(metadata).__name__}")
            subtests = metadata.get("subtests")
            if subtests is None:
                continue
            if not isinstance(subtests, list):
                raise SuiteReportError(f"{where}metadata.subtests: expected a list, got {type(subtests).__name__}")
            node = _text(test.get("nodeid") or "", f"{where}nodeid")
            duration = _duration(test, where)
            for k, sub in enumerate(subtests):
                columns = check_columns(sub, _where(i, k))
                if columns.get("Result"):
                    rows.append(SuiteRow(columns, node, duration))
        environment = report.get("environment")
        if environment is None:
            environment = {}
        if not isinstance(environment, dict):
            raise SuiteReportError(f"environment: expected an object, got {type(environment).__name__}")
        created = report.get("created")
        when = mtime
        if created is not None:
            seconds = _finite(created, "created", 0.0, MAX_CREATED)
            when = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).isoformat(timespec="seconds")
    except SuiteReportError as exc:
        raise SuiteReportError(f"{path}: {exc}") from None
    if not rows and report["tests"]:
        raise SuiteReportError(f"{path}: the tests carry no suite metadata (metadata.subtests); is this a run of "
                               "executorch.backends.test.suite with --json-report?")
    return SuiteFile(rows, when, environment, digest, "json")


def _read_csv(path: Path, text: str, digest: str, mtime: str) -> SuiteFile:
    reader = csv.DictReader(io.StringIO(text))
    rows = []
    try:
        fields = reader.fieldnames or []
        if not {"Test ID", "Flow", "Result"} <= set(fields):
            raise SuiteReportError(f"{path}: neither a pytest-json-report file nor the suite's CSV (needs the "
                                   "columns Test ID, Flow, Result)")
        for record in reader:
            extra = record.pop(None, None)  # more fields than the header names
            if extra:
                raise SuiteReportError(f"{path}: line {reader.line_num}: {len(extra)} field(s) more than the header")
            columns = check_columns({k: v for k, v in record.items() if v is not None}, f"{path}: line {reader.line_num}: ")
            if columns.get("Result"):
                rows.append(SuiteRow(columns, columns.get("Test Node") or None))
    except csv.Error as exc:  # a field over csv's limit (128 KiB), a NUL byte, ...
        raise SuiteReportError(f"{path}: not a readable CSV (line {reader.line_num}: {exc})") from None
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
    numbers = numbers_from_name(flow)
    text = f"{row.test_id} {row.columns.get('Params') or ''}"
    if numbers.reference == "quantized":
        return numbers.backend, numbers.dtype
    return numbers.backend, "fp16" if "float16" in text else "bf16" if "bfloat16" in text else "fp32"


def _commit_of(given: str | None, environment: dict[str, Any]) -> tuple[str | None, str | None]:
    if given:
        return given, "--commit"
    for var in commits.CI_VARS:
        value = environment.get(var)
        if value:
            if not isinstance(value, str) or len(value) > 256 or not value.isprintable():
                raise SuiteReportError(f"environment.{var}: expected a commit (text of at most 256 printable "
                                       f"characters), got {type(value).__name__} {str(value)[:40]!r}")
            return value, f"report environment {var}"
    found = commits.detect()
    return (found.sha, found.source) if found else (None, None)


def synthesized_report(row: SuiteRow, flow: str, target: str, started: str | None, run_id: str,
                       source_file: str) -> "Report":
    """A bundlerun report for one suite subtest, from the suite's own columns."""
    from bundlerun.runner.judging.judge import summarize  # start-up: loads flatbuffers, numpy on use
    from bundlerun.runner.report.model import CaseRecord, OutputRecord, Report, partial_stats  # late: its name is bound otherwise in this module
    from bundlerun.runner.report.record import tool_version  # start-up: loads numpy on use

    result = RESULTS.get(str(row.columns.get("Result") or "").strip().lower(), Verdict.FAIL)
    bundlerun_verdict = str(row.columns.get("bundlerun Verdict") or "")
    if result == Verdict.FAIL and bundlerun_verdict in (Verdict.ERROR, Verdict.TIMEOUT):
        result = Verdict(bundlerun_verdict)  # the device run did not happen: infrastructure, not numerics
    elif result == Verdict.PASS and bundlerun_verdict in (Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT):
        result = Verdict(bundlerun_verdict)  # PASS only when every verdict the row carries says PASS
    detail = str(row.columns.get("Result Detail") or "")
    error = str(row.columns.get("Error") or "") or None
    outputs = [OutputRecord(j, f"out{j}", result, criteria=None, **partial_stats(
                                {"error_max": stats.get("Error Max"), "error_mae": stats.get("Error MAE"),
                                 "sqnr": stats.get("SNR")}),
                            note="the suite's statistics (3 decimals); the suite judges the test, not each output")
               for j, stats in enumerate(row.outputs())]
    kind = row.columns.get("bundlerun Failure Kind") or None
    try:  # a column of the suite's file: an unknown kind is the file's problem, said as a warning
        error_kind = FailureKind.read(kind) if result in (Verdict.ERROR, Verdict.TIMEOUT) else None
        kind_warning = None
    except ValueError as exc:
        error_kind, kind_warning = FailureKind.RUNNER_ERROR, f"suite column 'bundlerun Failure Kind': {exc}"
    case = CaseRecord(method="forward", case=0, status={Verdict.PASS: CaseStatus.OK, Verdict.FAIL: CaseStatus.OK, Verdict.SKIP: CaseStatus.SKIP,
                                                        Verdict.TIMEOUT: CaseStatus.TIMEOUT}.get(result, CaseStatus.ERROR),
                      verdict=result, outputs=outputs, elapsed_s=row.duration_s,
                      error=error if result != Verdict.PASS else None, error_kind=error_kind)
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
    if result == Verdict.SKIP:  # the suite skipped it (not a backend failure): no verdict of bundlerun's to give
        report.summary.verdict, report.summary.exit_code = Verdict.SKIP, EXIT_PASS
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


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def import_suite_report(db_path: str | Path, path: str | Path, commit: str | None = None,
                        time: str | None = None) -> ImportSummary:
    from bundlerun.runner.history import store as history  # start-up: loads numpy on use

    suite = read_suite_file(path)
    if commit is not None:
        _text(commit, "--commit", 256)
    if time is not None:
        try:
            _dt.datetime.fromisoformat(_text(time, "--time", 64).replace("Z", "+00:00"))
        except ValueError:
            raise SuiteReportError(f"--time: {time[:64]!r} is not an ISO-8601 time") from None
    try:
        sha, commit_source = _commit_of(commit, suite.environment)
    except SuiteReportError as exc:
        raise SuiteReportError(f"{path}: {exc}") from None
    started = history.utc_iso(time) if time else suite.created
    known = _operator_names()
    out = ImportSummary(commit=sha)
    items: list = []
    run_ids: list[str] = []
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
        if device_report and _is_file(str(device_report)):
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
            if device_report:
                report.warnings.append(f"bundlerun's report {str(device_report)[:300]} is missing or unreadable: "
                                       "the verdict comes from the suite's columns")
        run_ids.append(run_id)
        items.append((report, report_path, tags))
        out.flows[flow] = out.flows.get(flow, 0) + 1
    before = history.recorded_run_uuids(db_path, run_ids)
    out.already = sum(1 for run_id in run_ids if run_id in before)
    out.recorded = len(run_ids) - out.already
    out.ids = history.record_reports(db_path, items) if items else []
    return out
