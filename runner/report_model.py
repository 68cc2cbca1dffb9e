"""The report as typed records: `Report` -> `CaseRecord` -> `OutputRecord`, plus `Summary`.

`to_json()` gives the JSON of record (docs/report-schema.md); `from_json()` reads
it back, checking it on the way, from this schema or the previous one (whose
free-text failure kinds map onto the closed set of targets.failures). Every
reader of a report.json goes through `read_report`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import BundlerunError
from bundlerun.targets.failures import FailureKind

SCHEMA = "bundlerun.report/2"
READABLE_SCHEMAS = ("bundlerun.report/1", SCHEMA)
REPORT_FILE = "report.json"
VERDICTS = ("PASS", "FAIL", "ERROR", "TIMEOUT", "SKIP")


class ReportError(BundlerunError):
    """A report file that cannot be read as a bundlerun report; one line."""


def _take(cls, data: dict[str, Any], what: str) -> dict[str, Any]:
    """The known fields of `cls` from `data`; unknown keys are kept by the caller as extras."""
    if not isinstance(data, dict):
        raise ReportError(f"{what} is a {type(data).__name__}, not an object")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class OutputRecord:
    """One output of one case: its verdict, criteria, failed criteria and ErrorStatistics."""

    index: int
    name: str
    verdict: str
    criteria: dict[str, Any] | None = None
    failed: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    expected: dict[str, Any] | None = None  # {"dtype", "shape"}
    actual: dict[str, Any] | None = None
    lossy: bool | None = None
    note: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "OutputRecord":
        kw = _take(cls, data, "an output record")
        if kw.get("verdict") not in VERDICTS:
            raise ReportError(f"output verdict {kw.get('verdict')!r} is not one of {', '.join(VERDICTS)}")
        kw["failed"] = list(kw.get("failed") or [])
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("expected", "actual", "lossy", "note"):
            if out[key] is None:
                del out[key]
        return out


@dataclass
class CaseRecord:
    """One test case of one method: how the target ended it and each output's verdict."""

    method: str
    case: int
    status: str  # ok | error | timeout | skip
    verdict: str
    outputs: list[OutputRecord] = field(default_factory=list)
    elapsed_s: float | None = None
    error: str | None = None
    error_kind: FailureKind | None = None
    log_excerpt: list[str] = field(default_factory=list)
    log_path: str | None = None
    device_verdict: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CaseRecord":
        kw = _take(cls, data, "a case record")
        for key in ("method", "case", "status", "verdict"):
            if key not in kw:
                raise ReportError(f"a case record has no {key!r}")
        if kw["verdict"] not in VERDICTS:
            raise ReportError(f"case verdict {kw['verdict']!r} is not one of {', '.join(VERDICTS)}")
        kw["case"] = int(kw["case"])
        kw["error_kind"] = FailureKind.parse(kw.get("error_kind"))
        kw["outputs"] = [OutputRecord.from_json(o) for o in kw.get("outputs") or []]
        kw["log_excerpt"] = list(kw.get("log_excerpt") or [])
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("outputs", "extra")}
        out["error_kind"] = self.error_kind.value if self.error_kind else None
        out["outputs"] = [o.to_json() for o in self.outputs]
        if self.extra:
            out["extra"] = self.extra
        return out


@dataclass
class Summary:
    verdict: str  # PASS | FAIL | ERROR
    exit_code: int  # 0 all passed, 1 numerical failure (or regression), 2 could not run
    counts: dict[str, int]
    cases: int
    outputs: int
    interrupted: bool = False

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
    extras: dict[str, Any] = field(default_factory=dict)  # regressions, baseline, files, outputs_file, judged, ...
    schema: str = SCHEMA

    @classmethod
    def from_json(cls, data: Any) -> "Report":
        if not isinstance(data, dict):
            raise ReportError("not a bundlerun report (the JSON is not an object)")
        schema = data.get("schema")
        if schema not in READABLE_SCHEMAS:
            raise ReportError(f"not a bundlerun report this version reads (schema {schema!r}; "
                              f"reads {', '.join(READABLE_SCHEMAS)})")
        known = {f.name for f in fields(cls)} - {"extras"}
        try:
            return cls(
                schema=SCHEMA,
                summary=Summary.from_json(data.get("summary")),
                cases=[CaseRecord.from_json(c) for c in data.get("cases") or []],
                tool=dict(data.get("tool") or {}), run=dict(data.get("run") or {}),
                bundle=dict(data.get("bundle") or {}), target=dict(data.get("target") or {}),
                overrides=list(data.get("overrides") or []), warnings=list(data.get("warnings") or []),
                dataset=data.get("dataset"),
                extras={k: v for k, v in data.items() if k not in known},
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise ReportError(f"malformed report: {type(exc).__name__}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": self.schema, "tool": self.tool, "run": self.run, "bundle": self.bundle, "target": self.target,
            "overrides": self.overrides, "warnings": self.warnings, "summary": self.summary.to_json(),
            "cases": [c.to_json() for c in self.cases], "dataset": self.dataset,
        }
        out.update(self.extras)
        return out


def read_report(path: str | Path) -> Report:
    """The one reader of report.json (a file, or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"no report at {path}") from None
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not a JSON report ({exc})") from None
    except RecursionError:
        raise ReportError(f"{path}: JSON nested too deeply") from None
    return Report.from_json(data)
