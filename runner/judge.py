"""Judge a target's raw outputs against the bundle's expected outputs and the
criteria embedded in its manifest. Produces the case records of the report.

A bundle without a manifest (made by ExecuTorch's own BundledProgram API) is
judged with the foundation defaults for fp32, with a warning saying so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import Bundle
from bundlerun.bundles.manifest import Criteria, Manifest
from bundlerun.runner.outcome import VERDICTS
from bundlerun.targets.base import CaseResult, CaseStatus, TargetRun

NO_MANIFEST_WARNING = (
    "bundle has no bundlerun manifest (made by ExecuTorch's BundledProgram API?): "
    "judging with default tolerances atol=1e-3 rtol=1e-3"
)


def default_criteria() -> Criteria:
    c = Criteria(atol=1e-3, rtol=1e-3)
    c.trail = {k: [{"value": 1e-3, "source": "no manifest in bundle: bundlerun fallback default", "file": None}]
               for k in ("atol", "rtol")}
    return c


@dataclass
class JudgeContext:
    manifest: Manifest | None
    warnings: list[str] = field(default_factory=list)
    criteria_override: dict[tuple[str, int], Criteria] = field(default_factory=dict)

    def criteria(self, method: str, index: int) -> tuple[str, Criteria]:
        if (method, index) in self.criteria_override:
            name = self.manifest.output_spec(method, index).name if self.manifest and self.manifest.output_spec(method, index) else f"out{index}"
            return name, self.criteria_override[(method, index)]
        spec = self.manifest.output_spec(method, index) if self.manifest else None
        if spec is None:
            return f"out{index}", default_criteria()
        return spec.name, spec.criteria


def load_context(bundle: Bundle) -> JudgeContext:
    """The criteria to judge with. The reader already refused an invalid manifest
    (bundles/manifest_schema.py): no fallback to defaults for a broken one."""
    warnings = list(getattr(bundle, "warnings", []) or [])
    if bundle.manifest is None:
        return JudgeContext(None, [NO_MANIFEST_WARNING, *warnings])
    return JudgeContext(Manifest.from_dict(bundle.manifest), warnings)


def _error_case(result: CaseResult, expected_count: int) -> dict[str, Any]:
    verdict = "TIMEOUT" if result.status == CaseStatus.TIMEOUT else ("SKIP" if result.status == CaseStatus.SKIP else "ERROR")
    return {
        "outputs": [
            {"index": j, "name": f"out{j}", "verdict": verdict, "failed": [], "stats": None}
            for j in range(expected_count)
        ],
        "verdict": verdict,
    }


def judge_case(bundle: Bundle, result: CaseResult, ctx: JudgeContext) -> dict[str, Any]:
    """One report case record (see docs/report-schema.md)."""
    from bundlerun.runner.compare import judge_output

    test_case = bundle.suite(result.method).test_cases[result.case_index]
    expected_values = [v for v in test_case.expected_outputs]
    record: dict[str, Any] = {
        "method": result.method,
        "case": result.case_index,
        "status": result.status.value,
        "elapsed_s": result.elapsed_s,
        "error": result.error,
        "error_kind": result.error_kind,
        "log_excerpt": result.log_excerpt,
        "log_path": result.log_path,
        "device_verdict": result.device_verdict,
    }
    if result.extra:
        record["extra"] = result.extra  # how the target got the outputs, attempts, transport detail
    if result.perf:
        record["perf"] = [f.to_dict() for f in result.perf]  # what the target measured (docs/report-schema.md)
    if result.status != CaseStatus.OK:
        record.update(_error_case(result, len(expected_values)))
        for j, out in enumerate(record["outputs"]):
            name, criteria = ctx.criteria(result.method, j)
            out["name"] = name
            out["criteria"] = criteria.to_dict()
        return record
    outputs = []
    if len(result.outputs) != len(expected_values):
        record["error"] = f"target returned {len(result.outputs)} outputs, bundle expects {len(expected_values)}"
        record["error_kind"] = "output-count"
    for j, expected in enumerate(expected_values):
        name, criteria = ctx.criteria(result.method, j)
        entry: dict[str, Any] = {"index": j, "name": name, "criteria": criteria.to_dict()}
        if expected.kind != "tensor":
            entry.update(verdict="SKIP", failed=[], stats=None, note=f"non-tensor output ({expected.kind})")
            outputs.append(entry)
            continue
        entry["expected"] = {"dtype": st.name(expected.scalar_type), "shape": list(expected.sizes)}
        if j >= len(result.outputs):
            entry.update(verdict="ERROR", failed=[{"criterion": "missing", "measured": None, "limit": None,
                                                   "detail": "target returned no data for this output"}], stats=None)
            outputs.append(entry)
            continue
        raw = result.outputs[j]
        entry["actual"] = {"dtype": st.name(raw.scalar_type), "shape": list(raw.shape)}
        entry["lossy"] = raw.lossy
        actual = st.to_float_array(raw.scalar_type, raw.to_array()) if raw.scalar_type == st.BFLOAT16 else raw.to_array()
        reference = expected.to_array()
        if expected.scalar_type == st.BFLOAT16:
            reference = st.to_float_array(expected.scalar_type, reference)
        if criteria.scale is None and not st.is_floating(expected.scalar_type):
            actual, reference = actual.astype(np.int64), reference.astype(np.int64)
        verdict = judge_output(
            actual, reference, criteria,
            actual_dtype=st.name(raw.scalar_type), expected_dtype=st.name(expected.scalar_type), lossy=raw.lossy,
        )
        entry["verdict"] = verdict.verdict
        entry["failed"] = [asdict(f) for f in verdict.failed]
        entry["stats"] = verdict.stats.to_dict() if verdict.stats else None
        outputs.append(entry)
    record["outputs"] = outputs
    verdicts = {o["verdict"] for o in outputs}
    record["verdict"] = "ERROR" if "ERROR" in verdicts or record.get("error_kind") == "output-count" else (
        "FAIL" if "FAIL" in verdicts else "PASS")
    return record


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per case-output, overall verdict and exit code (0 pass, 1 numerics, 2 infrastructure)."""
    counts = {v: 0 for v in VERDICTS}
    outputs = 0
    for case in cases:
        for out in case["outputs"]:
            counts[out["verdict"]] = counts.get(out["verdict"], 0) + 1
            outputs += 1
        if not case["outputs"]:
            counts[case["verdict"]] += 1
    infra = counts["ERROR"] + counts["TIMEOUT"] + sum(1 for c in cases if c["verdict"] in ("ERROR", "TIMEOUT") and not c["outputs"])
    # A numerical failure wins over infrastructure errors: a real regression seen on
    # the cases that did run must not be mistaken for a flaky board.
    if not cases:
        verdict, code = "ERROR", 2
    elif counts["FAIL"]:
        verdict, code = "FAIL", 1
    elif infra:
        verdict, code = "ERROR", 2
    else:
        verdict, code = "PASS", 0
    return {"verdict": verdict, "exit_code": code, "counts": counts, "cases": len(cases), "outputs": outputs}


def judge_run(bundle: Bundle, run: TargetRun, ctx: JudgeContext | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Case records for every CaseResult, plus warnings."""
    ctx = ctx or load_context(bundle)
    return [judge_case(bundle, r, ctx) for r in run.cases], list(ctx.warnings)
