"""Per-output verdicts (numpy only): an output's criteria applied to its statistics.

The statistics (ExecuTorch's ErrorStatistics names, the one SQNR every view shows) are computed
in error_stats.py and re-exported here for the modules that read both; `judge_output` decides
the verdict, each failed criterion named with its measured value and limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bundlerun.bundles.manifest import Criteria
from bundlerun.runner.judging.failed_criterion import FailedCriterion
# The backends' own rules (nan, SQNR as measured upstream, Arm's analysis, top-1); sqnr_db is read from here too
from bundlerun.runner.judging.rules import _argmax, _sqnr_check, arm_output_analysis, sqnr_db, top_k_check  # noqa: F401

# Slack for outputs decoded from 6-decimal `Output[i][j]` text, defined once where that text
# is decoded: 6-decimal rounding plus float32 re-rounding, at most 1e-6.
from bundlerun.targets.base import Verdict
from bundlerun.targets.et_runner.outputs import LOSSY_ROUNDING_ATOL as LOSSY_TEXT_ATOL

from bundlerun.runner.judging.error_stats import (CHUNK, OutputStats, TensorStats, _clean, _db,  # noqa: F401
                                                  error_statistics, tensor_stats)


@dataclass
class OutputVerdict:
    verdict: Verdict  # PASS | FAIL
    failed: list[FailedCriterion] = field(default_factory=list)
    stats: OutputStats | None = None
    # the token figures the token rules judged by (token_metrics.step_metrics of the output as given, its
    # reference token the reference's argmax); None: no token rule, or the output was cast to judge it
    step: Any = None


def _fmt(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def elementwise_bound(criteria: Criteria, expected_dtype: str | None, lossy: bool = False) -> tuple[float, float, bool]:
    """(atol, rtol, whether it is checked): an element passes when |actual - expected| <= atol +
    rtol*|expected|, atol = atol + qtol*scale (+ the text-rounding slack of a lossy output), both 0
    for an exact output. One definition for judge_output and the report's plots of the bound."""
    exact = criteria.exact or expected_dtype == "bool"
    atol = 0.0 if exact else criteria.effective_atol + (LOSSY_TEXT_ATOL if lossy else 0.0)
    rtol = 0.0 if exact else (criteria.rtol or 0.0)
    return atol, rtol, bool(exact or criteria.elementwise)


def judge_output(
    actual: np.ndarray,
    expected: np.ndarray,
    criteria: Criteria,
    actual_dtype: str,
    expected_dtype: str,
    lossy: bool = False,
) -> OutputVerdict:
    """Statistics + verdict of one output against its criteria (all set must hold).

    The rules some backends judge by (criteria.nan, cast_float, top1, mse_max, sqnr_reference,
    sqnr_strict, arm_analysis, reference_nonzero) and the token rules of LLM logits (argmax_match,
    kl_max, top_k_overlap_min: runner/judging/token_metrics.py) are applied here, each failing as its own
    named criterion with the measured value and the limit; at their defaults nothing changes."""
    exact = criteria.exact or expected_dtype == "bool"
    step = None
    atol, rtol, elementwise = elementwise_bound(criteria, expected_dtype, lossy)
    cast = criteria.cast_float and actual_dtype != expected_dtype
    if cast:  # MLX's compare_outputs: different dtypes are both compared as float32
        actual = np.asarray(actual).astype(np.float32)
        expected = np.asarray(expected).astype(np.float32)
    stats = error_statistics(actual, expected, atol, rtol, elementwise=True, nan_equal=criteria.nan != "fail")
    quantization_steps(stats, criteria.scale)
    failed: list[FailedCriterion] = []
    if list(np.shape(actual)) != list(np.shape(expected)):
        failed.append(FailedCriterion(
            "shape", list(np.shape(actual)), list(np.shape(expected)),
            f"actual shape {list(np.shape(actual))} != expected shape {list(np.shape(expected))}",
        ))
        return OutputVerdict(Verdict.FAIL, failed, stats)
    if actual_dtype != expected_dtype and not cast:
        failed.append(FailedCriterion("dtype", actual_dtype, expected_dtype,
                                      f"actual dtype {actual_dtype} != expected dtype {expected_dtype}"))
    if stats.nonfinite_mismatch:
        nan_rule = "; NaN never matches (nan=fail)" if criteria.nan == "fail" and (stats.nan_actual or stats.nan_expected) else ""
        failed.append(FailedCriterion(
            "nan" if nan_rule else "nonfinite", stats.nonfinite_mismatch, 0,
            f"{stats.nonfinite_mismatch} NaN/Inf values where the reference differs "
            f"(actual NaN {stats.nan_actual}, Inf {stats.inf_actual}; expected NaN {stats.nan_expected}, Inf {stats.inf_expected})"
            + nan_rule,
        ))
    if exact and stats.mismatch_count and _is_integer_valued(expected):
        failed.append(FailedCriterion("exact", stats.mismatch_count, 0, _integer_mismatch_text(actual, expected)))
    elif elementwise and stats.mismatch_count:
        name = "exact" if exact else "elementwise"
        worst_diff = abs(stats.worst_actual - stats.worst_expected)
        parts = [f"atol {_fmt(criteria.atol or 0.0)}"]
        if criteria.qtol:
            parts.append(f"qtol {_fmt(criteria.qtol)} x scale {_fmt(criteria.scale if criteria.scale is not None else 1.0)}")
        if lossy:
            parts.append(f"text rounding {_fmt(LOSSY_TEXT_ATOL)}")
        if rtol:
            parts.append(f"rtol {_fmt(rtol)} x |ref| {_fmt(abs(stats.worst_expected))}")
        failed.append(FailedCriterion(
            name, worst_diff, stats.worst_allowed,
            f"{stats.mismatch_count} of {stats.actual_stats.numel} elements out of bounds; worst at "
            f"{stats.worst_index}: actual {_fmt(stats.worst_actual)} expected {_fmt(stats.worst_expected)} "
            f"|diff| {_fmt(worst_diff)} > allowed {_fmt(stats.worst_allowed)}"
            + ("" if exact else f" = {' + '.join(parts)}"),
        ))
    if not elementwise:
        stats.mismatch_count = None
        stats.mismatch_fraction = None
    if criteria.reference_nonzero and not np.any(np.asarray(expected)):
        failed.append(FailedCriterion("reference_nonzero", 0, ">0",
                                      "the reference output is all zeros (reference_nonzero: NXP calls this suspicious)"))
    if criteria.sqnr_min_db is not None:
        failed.extend(_sqnr_check(actual, expected, stats, criteria))
    if criteria.arm_analysis and (criteria.cosine_min is not None or criteria.rel_frobenius_max is not None):
        failed.extend(arm_output_analysis(actual, expected, criteria))
    else:
        if criteria.cosine_min is not None and not (
            stats.cosine_similarity is not None and stats.cosine_similarity >= criteria.cosine_min
        ):
            failed.append(FailedCriterion("cosine_min", stats.cosine_similarity, criteria.cosine_min,
                                          f"cosine {_fmt(stats.cosine_similarity)} < floor {_fmt(criteria.cosine_min)}"))
        if criteria.rel_frobenius_max is not None and not (
            stats.relative_frobenius is not None and stats.relative_frobenius <= criteria.rel_frobenius_max
        ):
            failed.append(FailedCriterion(
                "rel_frobenius_max", stats.relative_frobenius, criteria.rel_frobenius_max,
                f"relative Frobenius error {_fmt(stats.relative_frobenius)} > ceiling {_fmt(criteria.rel_frobenius_max)}",
            ))
    if criteria.mse_max is not None:
        n = max(stats.actual_stats.numel or 0, 1)
        mse = (stats.error_l2_norm or 0.0) ** 2 / n if stats.error_l2_norm is not None else math.inf
        if not mse <= criteria.mse_max:
            failed.append(FailedCriterion("mse_max", mse, criteria.mse_max,
                                          f"mean squared error {_fmt(mse)} > ceiling {_fmt(criteria.mse_max)}"))
    if criteria.top_k is not None:
        failed.extend(top_k_check(actual, expected, criteria.top_k))
    if criteria.argmax_match or criteria.kl_max is not None or criteria.top_k_overlap_min is not None:
        from bundlerun.runner.judging.token_metrics import token_verdict  # LLM logits: docs/tolerances.md "Token rules"

        token_failed, step = token_verdict(actual, expected, criteria.argmax_match, criteria.kl_max,
                                           criteria.top_k_overlap_min, stats=stats)
        failed.extend(token_failed)
    if criteria.top1:
        a_arg, r_arg = _argmax(actual), _argmax(expected)
        if a_arg != r_arg:
            failed.append(FailedCriterion("top1", a_arg, r_arg,
                                          f"argmax of the output {a_arg} != argmax of the reference {r_arg} (top-1)"))
    return OutputVerdict(Verdict.FAIL if failed else Verdict.PASS, failed, stats, None if cast else step)


def _is_integer_valued(expected: np.ndarray) -> bool:
    """An integer or bool reference (class ids, indices, masks), or a float one holding whole numbers
    only (integers the lowered program returns as floats)."""
    arr = np.asarray(expected)
    if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer):
        return True
    return bool(arr.size) and bool(np.all(np.isfinite(arr))) and bool(np.all(arr == np.round(arr)))


MISMATCH_PAIRS_SHOWN = 5  # expected -> actual pairs a failure line names (bundlerun's: one line stays readable)


def _integer_mismatch_text(actual: np.ndarray, expected: np.ndarray) -> str:
    """`2 of 64 elements differ (expected -> actual): 761 -> 687 at [44], 927 -> 871 at [57]`."""
    a, r = np.asarray(actual), np.asarray(expected)
    where = np.argwhere(a != r)
    pairs = []
    for pos in where[:MISMATCH_PAIRS_SHOWN]:
        idx = tuple(int(i) for i in pos)
        pairs.append(f"{_fmt(r[idx].item())} -> {_fmt(a[idx].item())} at {list(idx)}")
    more = f", +{len(where) - len(pairs)} more" if len(where) > len(pairs) else ""
    return f"{len(where)} of {r.size} elements differ (expected -> actual): {', '.join(pairs)}{more}"


def quantization_steps(stats: OutputStats, scale: float | None) -> None:
    """A quantized output's worst error and MAE in units of its quantization step (`scale`, the output
    dequantize's scale the manifest records): how int8 results are read, "off by 2 LSB". Not set for
    outputs without a scale."""
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0 or not math.isfinite(scale):
        return
    if stats.error_max is not None:
        stats.error_max_steps = stats.error_max / scale
    if stats.error_mae is not None:
        stats.error_mae_steps = stats.error_mae / scale
