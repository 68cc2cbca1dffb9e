"""The report as typed records: `Report` -> `CaseRecord` -> `OutputRecord`, plus `Summary`.

`to_json()` gives the JSON of record (docs/report-schema.md); `from_json()` reads
it back, checking it on the way, from this schema or the previous one (whose
free-text failure kinds map onto the closed set of targets.failures). Every
reader of a report.json goes through `read_report`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.limits import MAX_REPORT_BYTES
from bundlerun.bundles.manifest import Criteria
from bundlerun.runner.judging.stats_records import OutputStats, TensorStats, field_names
from bundlerun.runner.judging.failed_criterion import FailedCriterion
from bundlerun.runner.judging.outcome import VERDICTS
from bundlerun.bundles.kept_shape import read_shaped, write_shaped
from bundlerun.targets import SESSION_CLOCK, TargetURL, elapsed_clock, families
from bundlerun.targets.base import PerfFigure, CaseStatus, Verdict
from bundlerun.targets.failures import FailureKind

SCHEMA = "bundlerun.report/2"
READABLE_SCHEMAS = ("bundlerun.report/1", SCHEMA)
REPORT_FILE = "report.json"


class ReportError(BundlerunError):
    """A report file that cannot be read as a bundlerun report; one line."""

    kind = "bad-report"


def _take(cls, data: dict[str, Any], what: str) -> dict[str, Any]:
    """The known fields of `cls` from `data`; unknown keys are kept by the caller as extras."""
    if not isinstance(data, dict):
        raise ReportError(f"{what} is a {type(data).__name__}, not an object")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class OutputRecord:
    """One output of one case: its verdict, criteria, failed criteria and ErrorStatistics.

    `criteria`, `failed` and `stats` are typed; read from a report they keep the shape they were
    read in (runner/report/kept_shape.py: absent fields, key order, unknown keys), so a report
    written by another version or imported from a suite writes back byte-identical. Non-finite
    statistics are held as the report's strings "inf"/"-inf"/"nan" (OutputStats.json_safe)."""

    index: int
    name: str
    verdict: Verdict
    criteria: Criteria | None = None
    failed: list[FailedCriterion] = field(default_factory=list)
    stats: OutputStats | None = None
    expected: dict[str, Any] | None = None  # {"dtype", "shape"}
    actual: dict[str, Any] | None = None
    lossy: bool | None = None
    note: str | None = None
    replay: dict[str, Any] | None = None  # --replay N: runs, distinct, spread, verdicts, flips (runner/judging/replay.py)
    # How criteria / stats / each failed entry were written in the report read (None: made here).
    shapes: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.verdict = Verdict(self.verdict)  # given as its report string, it becomes the member

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "OutputRecord":
        kw = _take(cls, data, "an output record")
        kw.pop("shapes", None)
        if kw.get("verdict") not in VERDICTS:
            raise ReportError(f"output verdict {kw.get('verdict')!r} is not one of {', '.join(VERDICTS)}")
        shapes: dict[str, Any] = {}
        try:
            if isinstance(kw.get("criteria"), dict):
                kw["criteria"], shapes["criteria"] = read_shaped(Criteria, kw["criteria"])
            if isinstance(kw.get("stats"), dict):
                kw["stats"], shapes["stats"] = read_shaped(OutputStats, kw["stats"], _STATS_NESTED)
            failed = [read_shaped(FailedCriterion, f) for f in kw.get("failed") or []]
        except (TypeError, ValueError) as exc:
            raise ReportError(f"an output record is malformed: {exc}") from None
        kw["failed"] = [f for f, _ in failed]
        shapes["failed"] = [s for _, s in failed]
        return cls(**kw, shapes=shapes)

    def criteria_json(self, copy_trail: bool = True) -> dict[str, Any] | None:
        """`criteria` as the report writes it (the history's criteria digest hashes this, without the
        trail: `copy_trail=False` gives the record's own trail, not a copy, for such a reader)."""
        own = Criteria.to_dict if copy_trail else partial(Criteria.to_dict, copy_trail=False)
        return None if self.criteria is None else write_shaped(self.criteria, self.shapes.get("criteria"), own)

    def failed_json(self) -> list[dict[str, Any]]:
        """`failed` as the report writes it (the history stores this)."""
        shapes = self.shapes.get("failed") or []
        return [write_shaped(f, shapes[i] if i < len(shapes) else None, asdict) for i, f in enumerate(self.failed)]

    def stats_json(self) -> dict[str, Any] | None:
        return None if self.stats is None else write_shaped(self.stats, self.shapes.get("stats"), OutputStats.to_dict)

    def to_json(self, copy_trail: bool = True) -> dict[str, Any]:
        """`copy_trail=False`: the criteria's own trail, not a copy (Report.to_json's `for_writing`)."""
        out: dict[str, Any] = {"index": self.index, "name": self.name, "verdict": self.verdict,
                               "criteria": self.criteria_json(copy_trail), "failed": self.failed_json(),
                               "stats": self.stats_json()}
        for key in ("expected", "actual", "lossy", "note", "replay"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


_STATS_NESTED = {"reference_stats": TensorStats, "actual_stats": TensorStats}


def partial_stats(data: dict[str, Any]) -> dict[str, Any]:
    """`stats=` and `shapes=` of an OutputRecord holding only the statistics in `data` (a suite's
    few columns): the report writes exactly those keys, in that order."""
    stats, shape = read_shaped(OutputStats, data, _STATS_NESTED)
    return {"stats": stats, "shapes": {"stats": shape}}


@dataclass
class CaseRecord:
    """One test case of one method: how the target ended it and each output's verdict."""

    method: str
    case: int
    status: CaseStatus
    verdict: Verdict
    outputs: list[OutputRecord] = field(default_factory=list)
    elapsed_s: float | None = None
    error: str | None = None
    error_kind: FailureKind | None = None
    log_excerpt: list[str] = field(default_factory=list)
    log_path: str | None = None
    device_verdict: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    perf: list[PerfFigure] = field(default_factory=list)  # docs/report-schema.md "perf"; absent = not given

    def __post_init__(self) -> None:  # given as their report strings, they become the members
        self.status, self.verdict = CaseStatus(self.status), Verdict(self.verdict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CaseRecord":
        kw = _take(cls, data, "a case record")
        try:
            kw["perf"] = [f if isinstance(f, PerfFigure) else PerfFigure.from_dict(f) for f in data.get("perf") or []]
        except (TypeError, ValueError) as exc:
            raise ReportError(f"a case's perf section is malformed: {exc}") from None
        for key in ("method", "case", "status", "verdict"):
            if key not in kw:
                raise ReportError(f"a case record has no {key!r}")
        if kw["verdict"] not in VERDICTS:
            raise ReportError(f"case verdict {kw['verdict']!r} is not one of {', '.join(VERDICTS)}")
        kw["case"] = int(kw["case"])
        try:
            kw["error_kind"] = FailureKind.read(kw.get("error_kind"))
        except ValueError as exc:
            raise ReportError(f"a case of {kw['method']}[{kw['case']}]: {exc}") from None
        kw["outputs"] = [OutputRecord.from_json(o) for o in kw.get("outputs") or []]
        kw["log_excerpt"] = list(kw.get("log_excerpt") or [])
        return cls(**kw)

    def to_json(self, copy_trail: bool = True) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in field_names(type(self)) if name not in ("outputs", "extra", "perf")}
        out["error_kind"] = self.error_kind.value if self.error_kind else None
        out["outputs"] = [o.to_json(copy_trail) for o in self.outputs]
        out["perf"] = [f.to_dict() for f in self.perf]
        if self.extra:
            out["extra"] = self.extra
        return out


@dataclass
class Summary:
    verdict: Verdict  # PASS | FAIL | ERROR (SKIP: a shard or suite entry with nothing to run)
    exit_code: int  # 0 all passed, 1 numerical failure (or regression), 2 could not run
    counts: dict[str, int]
    cases: int
    outputs: int
    interrupted: bool = False

    def __post_init__(self) -> None:
        self.verdict = Verdict(self.verdict)  # given as its report string, it becomes the member

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Summary":
        kw = _take(cls, data, "the summary")
        missing = [k for k in ("verdict", "exit_code", "counts") if k not in kw]
        if missing:
            raise ReportError(f"the summary has no {', '.join(missing)}")
        kw.setdefault("cases", 0)
        kw.setdefault("outputs", 0)
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.interrupted:
            del out["interrupted"]
        return out


def format_amount(value: Any, unit: Any, exact: bool = False) -> str:
    """A perf figure for people: bytes scaled (exact adds the byte count: gate messages), cycles and
    counts whole, sub-second times in ms; "–" for a missing value. Callers escape for their format."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "–"
    if unit == "bytes":
        scaled = next((f"{value / div:.1f} {suffix}" for div, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"),
                                                                          (1 << 10, "KiB")) if abs(value) >= div), None)
        if scaled is None:
            return f"{value:.0f} B"
        return f"{value:.0f} B ({scaled})" if exact else scaled
    if unit in ("cycles", "instructions", "count"):
        return f"{value:.0f}" + ("" if unit == "count" else f" {unit}")
    if unit == "s" and abs(value) < 1:
        return f"{value * 1000:.4g} ms"
    return f"{value:.4g} {unit}"


def elapsed_figures(cases: list["CaseRecord"], target_url: "str | TargetURL") -> None:
    """Add each finished case's elapsed_s as a labelled figure (in place, cases without one only),
    on the clock the target declares (`SPEC.elapsed`: e.g. host wall time of one execution on
    host://, interpreter time on tosa:// and mlx://; elsewhere the whole session's host wall clock,
    simulator or device start-up and transfers included: never device latency). Where one warm
    process runs every case (`phased`) the first case of a method is its first execution
    ("first"), the later ones "warm". A case that did not finish gives no figure."""
    elapsed_names: set[str] | None = None  # every family's clock name: read only if a case has perf figures
    clock = elapsed_clock(target_url) if "://" in str(target_url or "") else SESSION_CLOCK
    scheme = str(target_url or "").partition("://")[0].lower()
    seen: set[str] = set()
    for case in cases:
        first = case.method not in seen
        seen.add(case.method)
        if case.status != CaseStatus.OK or not isinstance(case.elapsed_s, (int, float)) or isinstance(case.elapsed_s, bool):
            continue
        if case.perf and elapsed_names is None:  # loads every target's declaration: only when it can matter
            elapsed_names = {spec.elapsed.name for spec in families()} | {SESSION_CLOCK.name}
        if any(f.name in (elapsed_names or ()) for f in case.perf):
            continue  # already read (a merged report mixes targets)
        note = None if clock.phased else f"{scheme or 'target'} session: tool start-up and I/O included, not device latency"
        case.perf.append(PerfFigure(clock.name, float(case.elapsed_s), "s", clock.kind, clock.source,
                                    phase=("first" if first else "warm") if clock.phased else None, note=note))


@dataclass
class PerfStat:
    """One figure over the cases of a method: median, spread and count (the report's `perf.summary`)."""

    method: str
    name: str
    unit: str
    kind: str
    source: str
    cases: int
    median: float
    min: float
    max: float
    phase: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.phase is None:
            del out["phase"]
        return out


def perf_summary(cases: list["CaseRecord"]) -> list[PerfStat]:
    """Each (method, figure, phase) over the cases that gave it, in first-seen order."""
    from statistics import median

    groups: dict[tuple, list[float]] = {}
    first: dict[tuple, PerfFigure] = {}
    for case in cases:
        for fig in case.perf:
            key = (case.method, fig.name, fig.phase, fig.unit, fig.kind)
            groups.setdefault(key, []).append(float(fig.value))
            first.setdefault(key, fig)
    return [PerfStat(key[0], key[1], key[3], key[4], first[key].source, len(values), median(values), min(values),
                     max(values), key[2]) for key, values in groups.items()]


@dataclass
class Report:
    """A whole run. Sections without their own record type stay plain JSON objects."""

    summary: Summary
    cases: list[CaseRecord]
    tool: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    bundle: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dataset: dict[str, Any] | None = None
    regressions: list[dict[str, Any]] | None = None  # --baseline: runner/history/regression.py, None = not compared
    baseline: dict[str, Any] | None = None  # what the baseline was and how it relates (runner/history/regression.py)
    files: dict[str, str] = field(default_factory=dict)  # derived formats written: {writer name: path}
    outputs_file: str | None = None  # outputs.npz (--save-outputs), with its digest (`judge` checks it)
    outputs_sha256: str | None = None
    judged: dict[str, Any] | None = None  # `bundlerun judge`: from which report, with which overrides
    replay: dict[str, Any] | None = None  # --replay N: findings over the runs (runner/judging/replay.py)
    unwritten: list[dict[str, Any]] = field(default_factory=list)  # files the host refused: {file, error}
    extras: dict[str, Any] = field(default_factory=dict)  # sections of merged/farm/shard reports, kept as read
    schema: str = SCHEMA
    perf_info: dict[str, Any] = field(default_factory=dict)  # `perf` beside its derived summary: repeat, warmup, load, ...
    sequences: list[Any] = field(default_factory=list)  # LLM sequences: SequenceRecord (runner/report/sequences.py)

    # The top-level sections written only when they hold something (older readers saw them absent).
    _OPTIONAL = ("regressions", "baseline", "files", "outputs_file", "outputs_sha256", "judged", "replay", "unwritten")

    @classmethod
    def from_json(cls, data: Any) -> "Report":
        if not isinstance(data, dict):
            raise ReportError("not a bundlerun report (the JSON is not an object)")
        schema = data.get("schema")
        if schema not in READABLE_SCHEMAS:
            raise ReportError(f"not a bundlerun report this version reads (schema {repr(schema)[:80]}; "
                              f"reads {', '.join(READABLE_SCHEMAS)})")
        from bundlerun.runner.report.check import ReportCheckError, check_report  # start-up: not loaded by `bundlerun --help`

        try:  # every field a reader relies on has its type checked, with its path (runner/report/check.py)
            check_report(data)
        except ReportCheckError as exc:
            raise ReportError(f"malformed report: {exc}") from None
        known = ({f.name for f in fields(cls)} - {"extras", "perf_info"}) | {"perf"}  # perf: derived from the cases
        try:
            report = cls(
                schema=SCHEMA,
                summary=Summary.from_json(data.get("summary")),
                cases=[CaseRecord.from_json(c) for c in data.get("cases") or []],
                tool=dict(data.get("tool") or {}), run=dict(data.get("run") or {}),
                bundle=dict(data.get("bundle") or {}), target=dict(data.get("target") or {}),
                overrides=list(data.get("overrides") or []), warnings=list(data.get("warnings") or []),
                dataset=data.get("dataset"),
                **{k: data[k] for k in cls._OPTIONAL if data.get(k) is not None},
                extras={k: v for k, v in data.items() if k not in known},
                perf_info={k: v for k, v in data["perf"].items() if k != "summary"}
                if isinstance(data.get("perf"), dict) else {},
                sequences=_sequences(data.get("sequences")),
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise ReportError(f"malformed report: {type(exc).__name__}: {exc}") from None
        # Every finished case carries its elapsed_s as a labelled figure (added once: by name).
        elapsed_figures(report.cases, report.target.get("url", ""))
        return report

    def perf_summary(self) -> list[PerfStat]:
        if hasattr(self.cases, "perf_stats"):  # a farm's merged report: made from disk one job at a time (merge_jobs.py)
            return self.cases.perf_stats()
        return perf_summary(self.cases)

    def failures(self) -> list[str]:
        """One line per output that did not pass, as `method[case].output: VERDICT (why)`: what a
        test's assertion message should show."""
        lines = []
        for case in self.cases:
            for out in case.outputs:
                if out.verdict == Verdict.PASS:
                    continue
                why = "; ".join(f"{f.criterion} {f.measured} vs {f.limit}" for f in out.failed)
                lines.append(f"{case.method}[{case.case}].{out.name}: {out.verdict}"
                             + (f" ({why or case.error or case.error_kind and case.error_kind.value})"
                                if why or case.error or case.error_kind else ""))
            if not case.outputs and case.verdict != Verdict.PASS:
                lines.append(f"{case.method}[{case.case}]: {case.verdict} ({case.error})")
        return lines

    def to_json(self, cases: bool = True, for_writing: bool = False) -> dict[str, Any]:
        """The report.json document; `cases=False`: with `cases` [] (a farm's merged report streams them, record.py).
        `for_writing`: a document that is only encoded, never changed (record.py): each output's criteria
        trail is the record's own, not a deep copy (most of an LLM report: 3-5 ms of 192 steps' copies)."""
        out: dict[str, Any] = {
            "schema": self.schema, "tool": self.tool, "run": self.run, "bundle": self.bundle, "target": self.target,
            "overrides": self.overrides, "warnings": self.warnings, "summary": self.summary.to_json(),
            "cases": [c.to_json(not for_writing) for c in self.cases] if cases else [], "dataset": self.dataset,
            "perf": {**self.perf_info, "summary": self.cases.perf_rows() if hasattr(self.cases, "perf_rows")  # a farm's: from disk
                     else [p.to_json() for p in self.perf_summary()]},
        }
        for key in self._OPTIONAL:
            value = getattr(self, key)
            if value is not None and (value or key not in ("files", "unwritten")):  # regressions [] = none found
                out[key] = value
        if self.sequences:  # LLM bundles only: every other report stays byte-identical
            out["sequences"] = [s.to_json() for s in self.sequences]
        out.update(self.extras)
        return out


def _sequences(data: Any) -> list[Any]:
    if not data:
        return []
    from bundlerun.runner.report.sequences import SequenceRecord  # start-up: not loaded by `bundlerun --help`

    return [SequenceRecord.from_json(s) for s in data]


def read_report(path: str | Path) -> Report:
    """The one reader of report.json (a file, or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_FILE
    try:
        if path.stat().st_size > MAX_REPORT_BYTES:
            raise ReportError(f"{path}: {path.stat().st_size} bytes; bundlerun reads reports of at most "
                              f"{MAX_REPORT_BYTES} bytes")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ReportError(f"no report at {path}") from None
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, or an integer of 5,000 digits
        raise ReportError(f"{path}: not a JSON report ({str(exc)[:200]})") from None
    except (RecursionError, MemoryError):
        raise ReportError(f"{path}: JSON nested too deeply or too large") from None
    try:
        return Report.from_json(data)
    except ReportError as exc:  # one line naming the file and the field
        raise ReportError(f"{path}: {exc}") from None


