"""Per-output statistics and verdicts (numpy only; no torch on the judging path).

`error_statistics` keeps ExecuTorch's ErrorStatistics field names and formulas
(backends/test/harness/error_statistics.py: float64 errors, sqnr =
20*log10(||actual|| / ||actual - reference||), torch.median = lower middle
element) and adds cosine similarity, relative Frobenius error, PSNR, the
element-wise mismatch count under the output's criteria and the worst element.

Work is done in float64 over cache-sized chunks, and medians by selection on
the original dtype, which is what makes it several times faster than the
reference implementation on large tensors (bench/bench_compare.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bundles.manifest import Criteria

CHUNK = 1 << 18  # elements per float64 chunk (2 MiB): stays in cache
LOSSY_TEXT_ATOL = 5e-7  # `Output[i][j]: %f` prints 6 decimals: rounding is at most half a unit


@dataclass
class TensorStats:
    shape: list[int]
    numel: int
    median: float | None
    mean: float | None
    max: float | None
    min: float | None


@dataclass
class OutputStats:
    reference_stats: TensorStats
    actual_stats: TensorStats
    error_l2_norm: float | None = None
    error_mae: float | None = None
    error_max: float | None = None
    error_msd: float | None = None
    sqnr: float | None = None
    cosine_similarity: float | None = None
    relative_frobenius: float | None = None
    psnr: float | None = None
    mismatch_count: int | None = None
    mismatch_fraction: float | None = None
    worst_index: list[int] | None = None
    worst_actual: float | None = None
    worst_expected: float | None = None
    worst_allowed: float | None = None
    nan_actual: int = 0
    inf_actual: int = 0
    nan_expected: int = 0
    inf_expected: int = 0
    nonfinite_mismatch: int = 0  # positions where NaN/Inf of actual and expected disagree

    def to_dict(self) -> dict[str, Any]:
        return _clean(asdict(self))


def _clean(obj: Any) -> Any:
    """JSON-safe: inf/nan floats become strings 'inf'/'-inf'/'nan'."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """Dot product without BLAS: OpenBLAS threads contend badly on a busy 2-core
    CI box (60x slower measured), and einsum is as fast single-threaded."""
    return float(np.einsum("i,i->", x, y))


def _lower_median(flat: np.ndarray) -> float:
    """torch.median semantics: the lower of the two middle values; NaN if any NaN."""
    if flat.size == 0:
        return float("nan")
    k = (flat.size - 1) // 2
    return float(np.partition(flat, k)[k])


def tensor_stats(array: np.ndarray, has_nan: bool) -> TensorStats:
    flat = array.reshape(-1)
    if flat.size == 0:
        return TensorStats(list(array.shape), 0, None, None, None, None)
    if flat.dtype == np.bool_:
        flat = flat.astype(np.uint8)
    if has_nan:
        nan = float("nan")
        return TensorStats(list(array.shape), int(flat.size), nan, nan, nan, nan)
    return TensorStats(
        shape=list(array.shape),
        numel=int(flat.size),
        median=_lower_median(flat),
        mean=float(flat.mean(dtype=np.float64)),
        max=float(flat.max()),
        min=float(flat.min()),
    )


def _as_numeric(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.bool_:
        return array.astype(np.uint8)
    return array


def error_statistics(
    actual: np.ndarray,
    expected: np.ndarray,
    atol: float = 0.0,
    rtol: float = 0.0,
    elementwise: bool = True,
) -> OutputStats:
    """All statistics for one output. Shape mismatch: every error field is None."""
    actual = _as_numeric(np.asarray(actual))
    expected = _as_numeric(np.asarray(expected))
    a_flat, r_flat = actual.reshape(-1), expected.reshape(-1)
    a_float = np.issubdtype(a_flat.dtype, np.floating)
    r_float = np.issubdtype(r_flat.dtype, np.floating)
    nan_a = int(np.isnan(a_flat).sum()) if a_float else 0
    nan_r = int(np.isnan(r_flat).sum()) if r_float else 0
    inf_a = int(np.isinf(a_flat).sum()) if a_float else 0
    inf_r = int(np.isinf(r_flat).sum()) if r_float else 0
    stats = OutputStats(
        reference_stats=tensor_stats(expected, nan_r > 0),
        actual_stats=tensor_stats(actual, nan_a > 0),
        nan_actual=nan_a, inf_actual=inf_a, nan_expected=nan_r, inf_expected=inf_r,
    )
    if actual.shape != expected.shape:
        return stats
    n = a_flat.size
    if n == 0:
        stats.mismatch_count, stats.mismatch_fraction = 0, 0.0
        return stats
    if nan_a or nan_r or inf_a or inf_r:
        return _nonfinite_statistics(stats, a_flat, r_flat, actual.shape, atol, rtol, elementwise)

    sum_e = sum_ae = sum_ee = sum_aa = sum_rr = sum_ar = 0.0
    max_ae = max_r = 0.0
    mismatches = 0
    worst_excess, worst_pos = -math.inf, 0
    for start in range(0, n, CHUNK):
        a = a_flat[start : start + CHUNK].astype(np.float64)
        r = r_flat[start : start + CHUNK].astype(np.float64)
        e = a - r
        ae = np.abs(e)
        sum_e += float(e.sum())
        sum_ae += float(ae.sum())
        sum_ee += _dot(e, e)
        sum_aa += _dot(a, a)
        sum_rr += _dot(r, r)
        sum_ar += _dot(a, r)
        chunk_max = float(ae.max())
        max_ae = max(max_ae, chunk_max)
        ar = np.abs(r)
        max_r = max(max_r, float(ar.max()))
        if elementwise:
            # excess > 0 <=> |a - r| > atol + rtol*|r|
            excess = ae - rtol * ar if rtol else ae
            bad = int(np.count_nonzero(excess > atol))
            mismatches += bad
            i = int(np.argmax(excess))
            if float(excess[i]) > worst_excess:
                worst_excess, worst_pos = float(excess[i]), start + i
        else:
            i = int(np.argmax(ae))
            if chunk_max > worst_excess:
                worst_excess, worst_pos = chunk_max, start + i
    _fill_errors(stats, n, sum_e, sum_ae, sum_ee, sum_aa, sum_rr, sum_ar, max_ae, max_r)
    _fill_worst(stats, a_flat, r_flat, actual.shape, worst_pos, atol, rtol)
    if elementwise:
        stats.mismatch_count = mismatches
        stats.mismatch_fraction = mismatches / n
    return stats


def _fill_errors(stats: OutputStats, n: int, sum_e, sum_ae, sum_ee, sum_aa, sum_rr, sum_ar, max_ae, max_r) -> None:
    norm_e, norm_a, norm_r = math.sqrt(sum_ee), math.sqrt(sum_aa), math.sqrt(sum_rr)
    stats.error_l2_norm = norm_e
    stats.error_mae = sum_ae / n
    stats.error_max = max_ae
    stats.error_msd = sum_e / n
    stats.sqnr = math.inf if norm_e == 0 else (20 * math.log10(norm_a / norm_e) if norm_a > 0 else -math.inf)
    if norm_a > 0 and norm_r > 0:
        stats.cosine_similarity = max(-1.0, min(1.0, sum_ar / (norm_a * norm_r)))
    else:
        stats.cosine_similarity = 1.0 if norm_a == norm_r else 0.0
    stats.relative_frobenius = norm_e / (norm_r + 1e-8)
    rmse = math.sqrt(sum_ee / n)
    stats.psnr = math.inf if rmse == 0 else (20 * math.log10(max_r / rmse) if max_r > 0 else -math.inf)


def _fill_worst(stats, a_flat, r_flat, shape, pos: int, atol: float, rtol: float) -> None:
    stats.worst_index = [int(i) for i in np.unravel_index(pos, shape)] if shape else []
    stats.worst_actual = float(a_flat[pos])
    stats.worst_expected = float(r_flat[pos])
    stats.worst_allowed = atol + rtol * abs(float(r_flat[pos]))


def _nonfinite_statistics(stats, a_flat, r_flat, shape, atol, rtol, elementwise) -> OutputStats:
    """Slow path when NaN/Inf are present: NaN matches NaN, equal infinities match;
    error statistics are over the positions where both are finite."""
    a = a_flat.astype(np.float64)
    r = r_flat.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(r)
    same_special = (np.isnan(a) & np.isnan(r)) | (np.isinf(a) & (a == r))
    disagree = ~finite & ~same_special
    stats.nonfinite_mismatch = int(disagree.sum())
    af, rf = a[finite], r[finite]
    n = max(int(af.size), 1)
    e = af - rf
    ae = np.abs(e)
    _fill_errors(
        stats, n, float(e.sum()), float(ae.sum()), _dot(e, e), _dot(af, af),
        _dot(rf, rf), _dot(af, rf), float(ae.max()) if ae.size else 0.0,
        float(np.abs(rf).max()) if rf.size else 0.0,
    )
    excess = np.full(a.shape, -np.inf)
    excess[finite] = ae - rtol * np.abs(rf) - atol
    excess[disagree] = np.inf
    pos = int(np.argmax(excess))
    _fill_worst(stats, a_flat, r_flat, shape, pos, atol, rtol)
    if elementwise:
        stats.mismatch_count = int((excess > 0).sum())
        stats.mismatch_fraction = stats.mismatch_count / a.size
    return stats


# ---------------------------------------------------------------------------- verdicts


@dataclass
class FailedCriterion:
    criterion: str
    measured: Any
    limit: Any
    detail: str = ""


@dataclass
class OutputVerdict:
    verdict: str  # PASS | FAIL
    failed: list[FailedCriterion] = field(default_factory=list)
    stats: OutputStats | None = None


def _fmt(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def judge_output(
    actual: np.ndarray,
    expected: np.ndarray,
    criteria: Criteria,
    actual_dtype: str,
    expected_dtype: str,
    lossy: bool = False,
) -> OutputVerdict:
    """Statistics + verdict of one output against its criteria (all set must hold)."""
    exact = criteria.exact or expected_dtype == "bool"
    atol = 0.0 if exact else criteria.effective_atol + (LOSSY_TEXT_ATOL if lossy else 0.0)
    rtol = 0.0 if exact else (criteria.rtol or 0.0)
    elementwise = exact or criteria.elementwise
    stats = error_statistics(actual, expected, atol, rtol, elementwise=True)
    failed: list[FailedCriterion] = []
    if list(np.shape(actual)) != list(np.shape(expected)):
        failed.append(FailedCriterion(
            "shape", list(np.shape(actual)), list(np.shape(expected)),
            f"actual shape {list(np.shape(actual))} != expected shape {list(np.shape(expected))}",
        ))
        return OutputVerdict("FAIL", failed, stats)
    if actual_dtype != expected_dtype:
        failed.append(FailedCriterion("dtype", actual_dtype, expected_dtype,
                                      f"actual dtype {actual_dtype} != expected dtype {expected_dtype}"))
    if stats.nonfinite_mismatch:
        failed.append(FailedCriterion(
            "nonfinite", stats.nonfinite_mismatch, 0,
            f"{stats.nonfinite_mismatch} NaN/Inf values where the reference differs "
            f"(actual NaN {stats.nan_actual}, Inf {stats.inf_actual}; expected NaN {stats.nan_expected}, Inf {stats.inf_expected})",
        ))
    if elementwise and stats.mismatch_count:
        name = "exact" if exact else "elementwise"
        failed.append(FailedCriterion(
            name, stats.error_max, atol if not rtol else f"{_fmt(atol)} + {_fmt(rtol)}*|ref|",
            f"{stats.mismatch_count} of {stats.actual_stats.numel} elements out of bounds; worst at "
            f"{stats.worst_index}: actual {_fmt(stats.worst_actual)} expected {_fmt(stats.worst_expected)} "
            f"allowed |diff| <= {_fmt(stats.worst_allowed)}",
        ))
    if not elementwise:
        stats.mismatch_count = None
        stats.mismatch_fraction = None
    if criteria.sqnr_min_db is not None and not (stats.sqnr is not None and stats.sqnr >= criteria.sqnr_min_db):
        failed.append(FailedCriterion("sqnr_min_db", stats.sqnr, criteria.sqnr_min_db,
                                      f"SQNR {_fmt(stats.sqnr)} dB < floor {_fmt(criteria.sqnr_min_db)} dB"))
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
    return OutputVerdict("FAIL" if failed else "PASS", failed, stats)
