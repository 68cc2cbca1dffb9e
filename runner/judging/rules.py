"""The rules some backends' tests judge by, beyond atol/rtol/qtol and the signal floors
(docs/tolerances.md "Rules"): SQNR as the source measures it (whose norm is the signal, strict
or not), Arm's output analysis of the Frobenius / cosine checks, and the top-1 comparison.
numpy only, like runner/judging/numerics.py, which calls these from judge_output (the record of a
failed check is runner/judging/failed_criterion.py's, so neither module imports the other back).
"""

from __future__ import annotations

import math

import numpy as np

from bundlerun.bundles.manifest import Criteria
from bundlerun.runner.judging.failed_criterion import FailedCriterion


def _fmt(x) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.einsum("i,i->", x, y))


def _argmax(array: np.ndarray) -> int | None:
    """torch.argmax(t) without dim: the flat index of the first maximum (NaN counts as the maximum)."""
    flat = np.asarray(array).reshape(-1)
    if flat.size == 0:
        return None
    if np.issubdtype(flat.dtype, np.floating) and np.isnan(flat).any():
        return int(np.flatnonzero(np.isnan(flat))[0])
    return int(np.argmax(flat))


def _norm(x: np.ndarray) -> float:
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    return math.sqrt(_dot(flat, flat)) if flat.size else 0.0


def sqnr_db(actual: np.ndarray, expected: np.ndarray, signal: str = "actual") -> float:
    """20*log10(||signal|| / ||actual - expected||). signal "actual" is ErrorStatistics' sqnr
    (torch.ao compute_sqnr(actual, reference)); "reference" is torchao's compute_error(reference, actual)."""
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(expected, dtype=np.float64)
    finite = np.isfinite(a) & np.isfinite(r)
    noise = _norm((a - r)[finite])
    power = _norm((a if signal == "actual" else r)[finite])
    if noise == 0:
        return math.inf
    return 20 * math.log10(power / noise) if power > 0 else -math.inf


def _sqnr_check(actual, expected, stats, criteria: Criteria) -> list:

    floor = criteria.sqnr_min_db
    measured = stats.sqnr_actual if criteria.sqnr_reference == "actual" else stats.sqnr
    if measured is None:
        ok = False
    else:
        ok = measured > floor if criteria.sqnr_strict else measured >= floor
    if ok:
        return []
    op = "<=" if criteria.sqnr_strict else "<"
    return [FailedCriterion("sqnr_min_db", measured, floor,
                            f"{sqnr_label(criteria.sqnr_reference)} {_fmt(measured)} dB {op} floor {_fmt(floor)} dB"
                            + (" (must exceed it)" if criteria.sqnr_strict else ""))]


def top_k_check(actual: np.ndarray, expected: np.ndarray, k: int) -> list:
    """A classifier's logits: in every row of the last axis, the reference's argmax must be among
    the output's k largest values (bundlerun's rule, for outputs a user marks with top_k: a float
    output whose values only rank classes). Ties count against the class: its rank is how many
    values are >= its own, so an all-zero output never passes; a NaN ranks last."""

    a, r = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if a.size == 0 or a.shape != r.shape:
        return []  # the shape criterion already failed, or nothing to rank
    width = a.shape[-1] if a.ndim else 1
    a_rows, r_rows = a.reshape(-1, width), r.reshape(-1, width)
    worst: tuple[int, int, int, int] | None = None  # (rank, row, class, its value's row rank)
    misses = 0
    for row, (a_row, r_row) in enumerate(zip(a_rows, r_rows)):
        cls = _argmax(r_row)
        if cls is None:
            continue
        value = a_row[cls]
        rank = width if not np.isfinite(value) else int(np.count_nonzero(a_row >= value))
        if rank > k:
            misses += 1
            if worst is None or rank > worst[0]:
                worst = (rank, row, cls, rank)
    if worst is None:
        return []
    rank, row, cls, _ = worst
    where = f" of {misses} of {len(a_rows)} rows; worst row {row}" if len(a_rows) > 1 else ""
    return [FailedCriterion("top_k", rank, k, f"the reference's class {cls} ranks {rank} in the output, "
                                              f"outside its top {k}{where}")]


def sqnr_label(signal: str = "reference") -> str:
    """How a view names an SQNR: the report's own (signal = the reference) or, for the criteria
    that cite ExecuTorch's ErrorStatistics, its variant over the actual output's norm."""
    return "SQNR (signal = reference)" if signal == "reference" else "SQNR (ErrorStatistics: signal = actual)"


# Arm's output analysis (backends/arm/test/tester/analyze_output_utils.py:358-457 at the pinned
# commit): the reference is cleaned (|r| < one quantization step -> 0, NaN -> 0, Inf -> the
# quantized range), an all-zero reference passes, Frobenius is skipped while ||r|| is at noise
# scale (<= scale*sqrt(numel)), and 0.02 is taken off the Frobenius error when cosine >= max(0.98, floor).
ARM_FROBENIUS_DISCOUNT = 0.02
ARM_HIGH_COSINE = 0.98
ARM_LOW_NORM_FLOOR = 1e-8


def arm_output_analysis(actual: np.ndarray, expected: np.ndarray, criteria: Criteria,
                        qrange: tuple[int, int] = (-128, 127)) -> list:
    """Frobenius / cosine judged the way Arm's TosaPipelineINT judges them (float32, as Arm does).

    `qrange` bounds the Inf replacement; the manifest does not record the quantized dtype, so the
    int8 range of Arm's default quantization config is used (an Inf reference is rare)."""

    ref = np.asarray(expected, dtype=np.float32).reshape(-1)
    test = np.asarray(actual, dtype=np.float32).reshape(-1)
    scale = criteria.scale
    zp = criteria.zero_point or 0
    if scale is not None:
        ref = np.where(np.abs(ref) >= scale, ref, np.float32(0.0))
        posinf, neginf = (qrange[1] - zp) * scale, (qrange[0] - zp) * scale
    else:
        posinf = neginf = None
    ref = np.nan_to_num(ref, nan=0.0, posinf=posinf, neginf=neginf)
    if np.count_nonzero(ref) == 0:
        return []  # an all-zero reference passes without testing
    ref_norm = float(np.linalg.norm(ref))
    err_norm = float(np.linalg.norm(test - ref))
    rel = err_norm / (ref_norm + 1e-8)
    test_norm = float(np.linalg.norm(test))
    cosine = float(np.dot(test.astype(np.float64), ref.astype(np.float64)) / max(test_norm * ref_norm, 1e-8))
    failed = []
    low_floor = ARM_LOW_NORM_FLOOR
    if scale is not None:
        low_floor = max(low_floor, scale * math.sqrt(ref.size))
    fmax, cmin = criteria.rel_frobenius_max, criteria.cosine_min
    if fmax is not None and ref_norm > low_floor:
        high = max(ARM_HIGH_COSINE, cmin) if cmin is not None else ARM_HIGH_COSINE
        effective = max(0.0, rel - ARM_FROBENIUS_DISCOUNT) if cosine >= high else rel
        if effective > fmax:
            failed.append(FailedCriterion(
                "rel_frobenius_max", rel, fmax,
                f"relative Frobenius error {_fmt(rel)}" + (f" (effective {_fmt(effective)} after the 0.02 "
                                                            f"high-cosine discount)" if effective != rel else "")
                + f" > ceiling {_fmt(fmax)} (Arm analysis; cosine {_fmt(cosine)})"))
    if cmin is not None and cosine < cmin:
        failed.append(FailedCriterion("cosine_min", cosine, cmin,
                                      f"cosine {_fmt(cosine)} < floor {_fmt(cmin)} (Arm analysis, reference cleaned)"))
    return failed
