"""One `bundlerun run`: read the bundle, drive the target, judge, write the report.

Whatever happens after the bundle is read (target missing, every case crashing,
Ctrl-C), a report is written before returning, and every case has a verdict.
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bundles.bpte import Bundle, read_bundle
from bundles.errors import BundlerunError
from runner.judge import JudgeContext, judge_run, load_context, summarize
from runner.report import bundle_section, host_section, save_outputs, target_section, tool_version, write_report
from targets import open_target
from targets.base import CaseResult, CaseStatus, RunOptions, TargetRun, selected_cases


@dataclass
class RunRequest:
    bundle_path: Path
    target: str
    report_dir: Path
    case_timeout_s: float = 120.0
    setup_timeout_s: float = 300.0
    methods: list[str] | None = None
    cases: list[int] | None = None
    save_outputs: bool = False
    overrides: list[str] = field(default_factory=list)
    label: str | None = None
    target_config: dict[str, Any] = field(default_factory=dict)
    retries: int = 1
    confidence: float = 0.95  # of the dataset accuracy intervals, for bundles with labels
    progress: Callable[[CaseResult], None] | None = None
    on_start: Callable[[int], None] | None = None  # number of cases about to run


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def apply_overrides(ctx: JudgeContext, bundle: Bundle, overrides: list[str]) -> list[dict[str, Any]]:
    """`--override` strings -> per-output criteria in ctx; returns the records for the report."""
    if not overrides:
        return []
    from runner.overrides import apply_overrides as apply  # the registry's parser

    return apply(ctx, bundle, overrides)


def execute_run(req: RunRequest, bundle: Bundle | None = None) -> dict[str, Any]:
    """Run and judge; returns the report dict (already written to req.report_dir)."""
    started, t0 = _now(), time.perf_counter()
    bundle = bundle or read_bundle(req.bundle_path)
    ctx = load_context(bundle)
    override_records = apply_overrides(ctx, bundle, req.overrides)
    work_dir = Path(req.report_dir) / "work"
    work_dir.mkdir(parents=True, exist_ok=True)
    options = RunOptions(
        work_dir=work_dir,
        case_timeout_s=req.case_timeout_s,
        setup_timeout_s=req.setup_timeout_s,
        methods=req.methods,
        cases=req.cases,
        retries=req.retries,
        config=dict(req.target_config),
        progress=req.progress,
    )
    pairs = selected_cases(bundle, options)
    if req.on_start:
        req.on_start(len(pairs))
    run: TargetRun | None = None
    warnings = list(ctx.warnings)
    try:
        target = open_target(req.target, req.target_config)
        run = target.run(bundle, Path(req.bundle_path), options)
    except BundlerunError as exc:
        run = TargetRun(req.target, [
            CaseResult(m, c, CaseStatus.ERROR, error=str(exc), error_kind="target") for m, c in pairs
        ])
        warnings.append(f"target failed: {exc}")
    except KeyboardInterrupt:
        run = TargetRun(req.target, [
            CaseResult(m, c, CaseStatus.ERROR, error="interrupted", error_kind="interrupted") for m, c in pairs
        ])
        warnings.append("run interrupted by the user")
    cases, judge_warnings = judge_run(bundle, run, ctx)
    warnings += [w for w in judge_warnings if w not in warnings]
    report: dict[str, Any] = {
        "schema": "bundlerun.report/1",
        "tool": {"name": "bundlerun", "version": tool_version()},
        "run": {
            "id": uuid.uuid4().hex,
            "label": req.label,
            "started": started,
            "finished": _now(),
            "duration_s": time.perf_counter() - t0,
            "command": sys.argv,
            "host": host_section(),
        },
        "bundle": bundle_section(Path(req.bundle_path), bundle.manifest),
        "target": target_section(run, req.target),
        "overrides": override_records,
        "warnings": warnings,
        "summary": summarize(cases),
        "cases": cases,
        "dataset": None,
    }
    if bundle.manifest and bundle.manifest.get("dataset"):
        from runner.accuracy import dataset_from_outputs

        report["dataset"] = dataset_from_outputs(bundle, {
            f"{c.method}/{c.case_index}/{j}": r.to_array() for c in run.cases for j, r in enumerate(c.outputs)
        }, req.confidence)
    if req.save_outputs:
        report["outputs_file"] = str(save_outputs(run, req.report_dir))
    write_report(report, req.report_dir)
    return report


def finish_run(
    report: dict[str, Any],
    report_dir: Path,
    bundle: Any,
    project: dict[str, Any],
    baseline: str | None = None,
    history_db: Path | str | None = None,
    no_history: bool = False,
) -> dict[str, Any]:
    """After a run (plain or accuracy): record it in the history, check it against a
    baseline (a regression makes the exit code 1), write JUnit/Markdown/HTML, and
    rewrite report.json with all of that in it."""
    from runner import history
    from runner.regression import check_baseline
    from runner.reports import write_reports

    db = None if no_history else history.resolve_db_path(history_db, project)
    if db is not None:
        report["run"]["history_id"] = history.record_report(db, report, report_path=Path(report_dir) / "report.json")
    if baseline:
        report["regressions"] = check_baseline(baseline, report, db, project)
        if report["regressions"] and report["summary"]["exit_code"] == 0:
            report["summary"]["exit_code"] = 1
    files = write_reports(report, Path(report_dir), bundle=bundle, history_db=db)
    report["files"] = {k: str(v) for k, v in files.items()}
    write_report(report, report_dir)
    return report
