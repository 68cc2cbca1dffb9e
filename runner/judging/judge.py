"""Judge a target's raw outputs against the bundle's expected outputs and the
criteria embedded in its manifest. Produces the case records of the report.

A bundle without a manifest (made by ExecuTorch's own BundledProgram API) is
judged with the foundation defaults for fp32, with a warning saying so.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import Bundle
from bundlerun.bundles.manifest import Criteria, Manifest
from bundlerun.runner.judging.failed_criterion import FailedCriterion
from bundlerun.runner.judging.outcome import EXIT_FAIL, EXIT_INFRA, EXIT_PASS, VERDICTS
from bundlerun.runner.report.model import CaseRecord, OutputRecord, Summary
from bundlerun.targets.base import CaseResult, CaseStatus, TargetRun
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.base import Verdict
from bundlerun.runner.judging.numerics import judge_output
from bundlerun.runner.judging.token_metrics import step_metrics
from bundlerun.runner.judging.vacuity import CRITERION, vacuous_reason
from bundlerun.runner.report.sequences import sequence_records

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
    # LLM sequences (bundles/sequence.py): each step case's token figures, filled by judge_case
    step_metrics: dict[tuple[str, int], Any] = field(default_factory=dict)
    _steps: dict[tuple[str, int], int] | None = field(default=None, init=False, repr=False)

    def step_token(self, method: str, case: int) -> int | None:
        """The teacher-forced reference token of the step at (method, case), or None: not a step."""
        if self.manifest is None or not self.manifest.sequences:
            return None
        if self._steps is None:
            self._steps = {(spec.method, st.case): st.reference_next
                           for spec in self.manifest.sequences for st in spec.steps}
        return self._steps.get((method, case))

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
    # A copy: --override changes the context's criteria in place, never the bundle's own manifest.
    return JudgeContext(copy.deepcopy(bundle.manifest), warnings)


def _error_verdict(result: CaseResult) -> Verdict:
    return Verdict.TIMEOUT if result.status == CaseStatus.TIMEOUT else (Verdict.SKIP if result.status == CaseStatus.SKIP else Verdict.ERROR)


def _failed(detail: str, criterion: str = "missing") -> list[FailedCriterion]:
    return [FailedCriterion(criterion, None, None, detail)]


def judge_case(bundle: Bundle, result: CaseResult, ctx: JudgeContext) -> CaseRecord:
    """One report case record (see docs/report-schema.md)."""

    if result.status != CaseStatus.OK:
        record = _record_of(result)
        record.verdict = _error_verdict(result)
        for j in range(len(bundle.suite(result.method).test_cases[result.case_index].expected_outputs)):
            name, criteria = ctx.criteria(result.method, j)
            record.outputs.append(OutputRecord(j, name, record.verdict, criteria=replace(criteria), stats=None))
        return record
    return settle(judge_outputs(bundle, result, ctx), result)


def _record_of(result: CaseResult) -> CaseRecord:
    record = CaseRecord(method=result.method, case=result.case_index, status=result.status, verdict=Verdict.PASS)
    return _lane_fields(record, result)


def _lane_fields(record: CaseRecord, result: CaseResult) -> CaseRecord:
    """The fields a case record takes from the lane's result as they are (no judging reads them)."""
    record.elapsed_s, record.error, record.error_kind = result.elapsed_s, result.error, result.error_kind
    record.log_excerpt, record.log_path = list(result.log_excerpt or []), result.log_path
    record.device_verdict = result.device_verdict
    record.extra = dict(result.extra or {})  # how the target got the outputs, attempts, transport detail
    record.perf = list(result.perf or [])  # what the target measured (docs/report-schema.md)
    return record


def settle(judged: CaseRecord, result: CaseResult) -> CaseRecord:
    """The record of an OK `result` from `judge_outputs`' judging of its outputs and the lane's fields
    as `result` has them now: its error first, unless the output count is wrong (that error is the
    judge's), and the case's verdict. runner/judging/ahead.py settles a record judged while the run
    went on with what the lane added after the hand-over, without the outputs it let go."""
    own, own_kind = judged.error, judged.error_kind
    record = _lane_fields(replace(judged, outputs=list(judged.outputs)), result)
    if own_kind == FailureKind.OUTPUT_COUNT:
        record.error, record.error_kind = own, own_kind
    else:
        record.error, record.error_kind = record.error or own, record.error_kind or own_kind
    verdicts = {o.verdict for o in record.outputs}
    record.verdict = Verdict.ERROR if Verdict.ERROR in verdicts or record.error_kind == FailureKind.OUTPUT_COUNT else (
        Verdict.FAIL if Verdict.FAIL in verdicts else Verdict.PASS)
    return record


def judge_outputs(bundle: Bundle, result: CaseResult, ctx: JudgeContext) -> CaseRecord:
    """The judging of an OK result's outputs alone: a record whose error is the judge's own (output
    count, malformed bytes, vacuous criteria), before `settle` adds the lane's fields."""

    test_case = bundle.suite(result.method).test_cases[result.case_index]
    expected_values = [v for v in test_case.expected_outputs]
    record = CaseRecord(method=result.method, case=result.case_index, status=result.status, verdict=Verdict.PASS)
    if len(result.outputs) != len(expected_values):
        record.error = f"target returned {len(result.outputs)} outputs, bundle expects {len(expected_values)}"
        record.error_kind = FailureKind.OUTPUT_COUNT
    for j, expected in enumerate(expected_values):
        name, criteria = ctx.criteria(result.method, j)
        entry = OutputRecord(j, name, Verdict.PASS, criteria=replace(criteria))
        record.outputs.append(entry)
        if expected.kind != "tensor":
            entry.verdict, entry.note = Verdict.SKIP, f"non-tensor output ({expected.kind})"
            continue
        entry.expected = {"dtype": st.name(expected.scalar_type), "shape": list(expected.sizes)}
        if j >= len(result.outputs):
            entry.verdict, entry.failed = Verdict.ERROR, _failed("target returned no data for this output")
            continue
        raw = result.outputs[j]
        try:  # raw outputs are device data: an unknown dtype or bytes that do not fit the shape is an ERROR
            actual_info = {"dtype": st.name(raw.scalar_type), "shape": [int(s) for s in raw.shape][:64]}
            raw_array = raw.to_array()
        except (ValueError, TypeError, OverflowError) as exc:
            entry.verdict, entry.failed = Verdict.ERROR, _failed(f"the target's output is malformed: {exc}"[:300])
            record.error = record.error or f"output {j}: the target's output is malformed: {exc}"[:300]
            record.error_kind = record.error_kind or FailureKind.WRONG_OUTPUT_SIZE
            continue
        entry.actual, entry.lossy = actual_info, raw.lossy
        actual = st.to_float_array(raw.scalar_type, raw_array) if raw.scalar_type == st.BFLOAT16 else raw_array
        reference = expected.to_array()
        if expected.scalar_type == st.BFLOAT16:
            reference = st.to_float_array(expected.scalar_type, reference)
        if criteria.scale is None and not st.is_floating(expected.scalar_type):
            actual, reference = actual.astype(np.int64), reference.astype(np.int64)
        verdict = judge_output(
            actual, reference, criteria,
            actual_dtype=st.name(raw.scalar_type), expected_dtype=st.name(expected.scalar_type), lossy=raw.lossy,
        )
        entry.verdict = verdict.verdict
        entry.failed = list(verdict.failed)
        entry.stats = verdict.stats.json_safe() if verdict.stats else None
        token = ctx.step_token(result.method, result.case_index) if j == 0 else None
        if token is not None:  # output 0 of an LLM step: the last token's logits (LLM_CONTRACT)
            m = verdict.step  # the token rules' figures, when they judged by this token (the usual case: the
            if m is None or m.reference_token != token:  # reference's argmax is reference_next): not computed twice
                m = step_metrics(actual, reference, token, stats=verdict.stats)
            ctx.step_metrics[(result.method, result.case_index)] = m
            if m.reference_argmax is not None and m.reference_argmax != token:
                note = (f"{result.method}[{result.case_index}]: the manifest's reference_next {token} is not the "
                        f"expected logits' argmax {m.reference_argmax}: the step is judged by reference_next")
                if note not in ctx.warnings:
                    ctx.warnings.append(note)
        if verdict.verdict == Verdict.PASS:  # criteria an all-zero output would also pass check nothing (runner/judging/vacuity.py)
            why = vacuous_reason(reference, criteria, st.name(expected.scalar_type), raw.lossy)
            if why:
                entry.verdict, entry.failed = Verdict.ERROR, _failed(why, CRITERION)
                record.error = record.error or f"{name}: vacuous criteria: {why}"
                record.error_kind = record.error_kind or FailureKind.BAD_BUNDLE
                note = (f"{result.method}.{name}: vacuous criteria ({why.split(' would ')[0]} would also pass an "
                        "all-zero output): judged ERROR, fix the bundle's criteria")
                if note not in ctx.warnings:
                    ctx.warnings.append(note)
    return record


def summarize(cases: list[CaseRecord]) -> Summary:
    """Counts per case-output, overall verdict and exit code (runner/judging/outcome.py)."""
    counts: dict[str, int] = {v: 0 for v in VERDICTS}
    outputs = 0
    for case in cases:
        for out in case.outputs:
            counts[out.verdict] += 1
            outputs += 1
        if not case.outputs:
            counts[case.verdict] += 1
    return summary_of(counts, len(cases), outputs)


def summary_of(counts: dict[str, int], cases: int, outputs: int) -> Summary:
    """The verdict and exit code of counts per case-output (summed over the jobs of a farm as they finish)."""
    # A numerical failure wins over infrastructure errors: a real regression seen on
    # the cases that did run must not be mistaken for a flaky board.
    if not cases:
        verdict, code = Verdict.ERROR, EXIT_INFRA
    elif counts[Verdict.FAIL]:
        verdict, code = Verdict.FAIL, EXIT_FAIL
    elif counts[Verdict.ERROR] or counts[Verdict.TIMEOUT]:
        verdict, code = Verdict.ERROR, EXIT_INFRA
    else:
        verdict, code = Verdict.PASS, EXIT_PASS
    return Summary(verdict, code, dict(counts), cases, outputs)


def judge_run(bundle: Bundle, run: TargetRun, ctx: JudgeContext | None = None,
              ahead: Any = None) -> tuple[list[CaseRecord], list[str]]:
    """Case records for every CaseResult, plus warnings. `ahead`: a runner/judging/ahead.py JudgeAhead
    that judged results while the run went on (those it holds are taken, the rest judged now)."""
    ctx = ctx or load_context(bundle)
    records = []
    for r in run.cases:
        record = ahead.take(r) if ahead is not None else None
        records.append(record if record is not None else judge_case(bundle, r, ctx))
    return records, list(ctx.warnings)


def judge_sequences(ctx: JudgeContext, cases: list[CaseRecord]) -> list[Any]:
    """The report's per-sequence records (runner/report/sequences.py) of a judged run: [] when the
    manifest has no sequences."""
    if ctx.manifest is None or not ctx.manifest.sequences:
        return []

    threaded = {(c.method, c.case): int(c.extra["kv_state_from_case"]) for c in cases
                if isinstance(c.extra.get("kv_state_from_case"), int)}
    return sequence_records(ctx.manifest.sequences, {(c.method, c.case): c.verdict for c in cases}, ctx.step_metrics,
                            threaded)
