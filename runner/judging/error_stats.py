"""Per-output error statistics (numpy only; no torch on the judging path). Verdicts are in numerics.py.

`error_statistics` keeps ExecuTorch's ErrorStatistics field names and formulas
(backends/test/harness/error_statistics.py: float64 errors, torch.median = lower
middle element) but for one: `sqnr` is the one SQNR every bundlerun view shows,
20*log10(||reference|| / ||actual - reference||), the signal being the reference
as ExecuTorch's Inspector measures it (devtools/inspector/_inspector_utils.py:459-478,
devtools/inspector/numerical_comparator/snr_numerical_comparator.py:46) and torchao's
compute_error; ErrorStatistics' own sqnr, compute_sqnr(actual, reference) with the
actual output as the signal (error_statistics.py:95-96), is `sqnr_actual`, which only
the criteria that cite it judge by. It adds cosine similarity, relative Frobenius
error, PSNR, the element-wise mismatch count under the output's criteria and the
worst element.

Work is done in float64 over cache-sized chunks, and medians by selection on
the original dtype, which is what makes it several times faster than the
reference implementation on large tensors (bench/bench_compare.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bundlerun.runner.judging.rules import sqnr_db  # noqa: F401


CHUNK = 1 << 16  # elements per float64 chunk (512 KiB): the work buffers stay in L2
# bundlerun's own: from this size a sampled bracket beats one np.partition of the whole tensor (an LLM
# step's 32,000 logits: 0.22 -> 0.15 ms a median, measured with numpy 2.1 on this machine's AVX-512 CPU)
BRACKET_MIN = 1 << 13


from bundlerun.runner.judging.stats_records import OutputStats, TensorStats, _clean  # noqa: F401


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """Dot product without BLAS: OpenBLAS threads contend badly on a busy 2-core
    CI box (60x slower measured), and einsum is as fast single-threaded."""
    return float(np.einsum("i,i->", x, y))


class _MedianBracket:
    """Selection of the lower median (torch.median semantics) fused into a chunked pass.

    A sorted random sample (a 16th of the tensor, at most 32,768 values) brackets rank k; each
    chunk adds how many values lie below the bracket and keeps the few inside it; the end selects
    within them.
    Falls back to np.partition when the bracket misses (adversarial data)."""

    def __init__(self, flat: np.ndarray) -> None:
        self.flat, self.n = flat, flat.size
        self.k = (self.n - 1) // 2
        self.below, self.inside = 0, []
        self.active = self.n > BRACKET_MIN
        if self.active:
            rng = np.random.default_rng(self.n)
            sample = np.sort(flat[rng.integers(0, self.n, min(1 << 15, self.n >> 4))])
            spread = int(4 * math.sqrt(sample.size)) + 16
            pos = int(self.k / self.n * sample.size)
            self.lo = sample[max(pos - spread, 0)]
            self.hi = sample[min(pos + spread, sample.size - 1)]

    def add(self, chunk: np.ndarray) -> None:
        if self.active:
            self.below += int(np.count_nonzero(chunk < self.lo))
            self.inside.append(chunk[(chunk >= self.lo) & (chunk <= self.hi)])

    def result(self) -> float:
        if self.n == 0:
            return float("nan")
        if self.active:
            inside = np.concatenate(self.inside) if self.inside else np.empty(0, self.flat.dtype)
            if self.below <= self.k < self.below + inside.size:
                j = self.k - self.below
                return float(np.partition(inside, j)[j])
        return float(np.partition(self.flat, self.k)[self.k])


_POOL = None


def _median_pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bundlerun-median")
    return _POOL


def _lower_median(flat: np.ndarray) -> float:
    """torch.median semantics: the lower of the two middle values (NaN-free input)."""
    bracket = _MedianBracket(flat)
    for start in range(0, flat.size, CHUNK):
        bracket.add(flat[start : start + CHUNK])
    return bracket.result()


def _range_and_specials(flat: np.ndarray) -> tuple[float | None, float | None, int, int]:
    """min, max, NaN count, Inf count. NaN propagates through min/max and Inf shows
    in them, so finite data (the common case) costs no extra isnan/isinf pass."""
    if flat.size == 0:
        return None, None, 0, 0
    lo, hi = float(flat.min()), float(flat.max())
    if not np.issubdtype(flat.dtype, np.floating) or (math.isfinite(lo) and math.isfinite(hi)):
        return lo, hi, 0, 0
    nan, inf = int(np.isnan(flat).sum()), int(np.isinf(flat).sum())
    if nan:
        finite = flat[~np.isnan(flat)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (None, None)
    return lo, hi, nan, inf


def tensor_stats(array: np.ndarray, lo=None, hi=None, has_nan: bool = False, mean: float | None = None,
                 median: float | None = None) -> TensorStats:
    flat = array.reshape(-1)
    if flat.size == 0:
        return TensorStats(list(array.shape), 0, None, None, None, None)
    if flat.dtype == np.bool_:
        flat = flat.astype(np.uint8)
    if has_nan:
        nan = float("nan")
        return TensorStats(list(array.shape), int(flat.size), nan, nan, nan, nan)
    if lo is None:
        lo, hi = float(flat.min()), float(flat.max())
    return TensorStats(
        shape=list(array.shape),
        numel=int(flat.size),
        median=_lower_median(flat) if median is None else median,
        mean=float(flat.mean(dtype=np.float64)) if mean is None else mean,
        max=hi,
        min=lo,
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
    nan_equal: bool = True,
) -> OutputStats:
    """All statistics for one output. Shape mismatch: every error field is None.
    `nan_equal=False`: a NaN never matches (torch.allclose without equal_nan: MLX, Metal, QNN tests)."""
    actual = _as_numeric(np.asarray(actual))
    expected = _as_numeric(np.asarray(expected))
    a_flat, r_flat = actual.reshape(-1), expected.reshape(-1)
    if actual.shape == expected.shape and a_flat.size > (1 << 20):
        large = _large_finite_statistics(actual, expected, atol, rtol, elementwise)
        if large is not None:
            return large
    a_lo, a_hi, nan_a, inf_a = _range_and_specials(a_flat)
    r_lo, r_hi, nan_r, inf_r = _range_and_specials(r_flat)
    specials = nan_a or nan_r or inf_a or inf_r
    stats = OutputStats(
        reference_stats=tensor_stats(expected, r_lo, r_hi, nan_r > 0, mean=0.0, median=0.0),
        actual_stats=tensor_stats(actual, a_lo, a_hi, nan_a > 0, mean=0.0, median=0.0),
        nan_actual=nan_a, inf_actual=inf_a, nan_expected=nan_r, inf_expected=inf_r,
    )
    n = a_flat.size
    if actual.shape != expected.shape or specials or n == 0:
        # means and medians are not computed by the streaming pass
        for side, arr, has_nan in (("reference_stats", expected, nan_r), ("actual_stats", actual, nan_a)):
            if arr.size and not has_nan:
                flat = arr.reshape(-1)
                getattr(stats, side).mean = float(flat.mean(dtype=np.float64))
                getattr(stats, side).median = _lower_median(flat)
    if actual.shape != expected.shape:
        return stats
    if n == 0:
        stats.mismatch_count, stats.mismatch_fraction = 0, 0.0
        return stats
    if specials:
        return _nonfinite_statistics(stats, a_flat, r_flat, actual.shape, atol, rtol, elementwise, nan_equal)
    med_a, med_r = _MedianBracket(a_flat), _MedianBracket(r_flat)
    sums = _stream(a_flat, r_flat, atol, rtol, elementwise, (med_a, med_r))
    stats.actual_stats.median, stats.reference_stats.median = med_a.result(), med_r.result()
    _finish(stats, a_flat, r_flat, actual.shape, sums, max(abs(r_lo), abs(r_hi)), atol, rtol, elementwise)
    return stats


def _large_finite_statistics(actual, expected, atol, rtol, elementwise) -> OutputStats | None:
    """Large same-shape tensors: ranges and medians (selection) run on a second thread
    while this one streams the error sums — numpy releases the GIL in both, so a
    2-core box does them side by side. NaN/Inf show up as non-finite sums; then
    None is returned and the caller takes the exact slow path."""
    a_flat, r_flat = actual.reshape(-1), expected.reshape(-1)

    def side_work():
        return [(float(f.min()), float(f.max()), _lower_median(f)) for f in (a_flat, r_flat)]

    future = _median_pool().submit(side_work)
    sums = _stream(a_flat, r_flat, atol, rtol, elementwise, None)
    (a_lo, a_hi, a_med), (r_lo, r_hi, r_med) = future.result()
    if not all(math.isfinite(v) for v in (sums["sum_a"], sums["sum_r"], sums["sum_ee"], sums["sum_aa"], sums["sum_rr"],
                                            a_lo, a_hi, r_lo, r_hi)):
        return None
    n = a_flat.size
    stats = OutputStats(
        reference_stats=TensorStats(list(expected.shape), n, r_med, sums["sum_r"] / n, r_hi, r_lo),
        actual_stats=TensorStats(list(actual.shape), n, a_med, sums["sum_a"] / n, a_hi, a_lo),
    )
    _finish(stats, a_flat, r_flat, actual.shape, sums, max(abs(r_lo), abs(r_hi)), atol, rtol, elementwise)
    return stats


def _stream(a_flat, r_flat, atol: float, rtol: float, elementwise: bool, brackets) -> dict[str, Any]:
    """One pass over float64 chunks held in preallocated buffers (fresh 512 KiB
    temporaries per chunk would be mmap'd and page-faulted every time)."""
    n = a_flat.size
    sum_a = sum_r = sum_ae = sum_ee = sum_aa = sum_rr = 0.0
    max_ae = 0.0
    mismatches = 0
    worst_excess, worst_pos = -math.inf, 0
    size = min(CHUNK, n)
    a_buf, r_buf, e_buf, ae_buf, x_buf = (np.empty(size) for _ in range(5))
    m_buf = np.empty(size, dtype=bool)
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        k = stop - start
        a, r, e, ae, x, m = a_buf[:k], r_buf[:k], e_buf[:k], ae_buf[:k], x_buf[:k], m_buf[:k]
        if brackets is not None:
            brackets[0].add(a_flat[start:stop])
            brackets[1].add(r_flat[start:stop])
        np.copyto(a, a_flat[start:stop], casting="unsafe")
        np.copyto(r, r_flat[start:stop], casting="unsafe")
        np.subtract(a, r, out=e)
        np.abs(e, out=ae)
        sum_a += float(np.add.reduce(a))
        sum_r += float(np.add.reduce(r))
        sum_ae += float(np.add.reduce(ae))
        sum_ee += _dot(e, e)
        sum_aa += _dot(a, a)
        sum_rr += _dot(r, r)
        chunk_max = float(np.maximum.reduce(ae))
        max_ae = max(max_ae, chunk_max)
        if elementwise:
            # excess > 0 <=> |a - r| > atol + rtol*|r|
            if rtol:
                np.abs(r, out=x)
                np.multiply(x, -rtol, out=x)
                np.add(x, ae, out=x)
                excess = x
            else:
                excess = ae
            np.greater(excess, atol, out=m)
            mismatches += int(np.count_nonzero(m))
            i = int(np.argmax(excess))
            if float(excess[i]) > worst_excess:
                worst_excess, worst_pos = float(excess[i]), start + i
        else:
            i = int(np.argmax(ae))
            if chunk_max > worst_excess:
                worst_excess, worst_pos = chunk_max, start + i
    return {"sum_a": sum_a, "sum_r": sum_r, "sum_ae": sum_ae, "sum_ee": sum_ee, "sum_aa": sum_aa,
            "sum_rr": sum_rr, "max_ae": max_ae, "mismatches": mismatches, "worst_pos": worst_pos}


def _finish(stats, a_flat, r_flat, shape, sums: dict[str, Any], max_r: float, atol, rtol, elementwise) -> None:
    n = a_flat.size
    # Derived instead of two more passes; neither is near cancellation in float64.
    sum_e = sums["sum_a"] - sums["sum_r"]
    sum_ar = (sums["sum_aa"] + sums["sum_rr"] - sums["sum_ee"]) / 2
    stats.actual_stats.mean = sums["sum_a"] / n
    stats.reference_stats.mean = sums["sum_r"] / n
    _fill_errors(stats, n, sum_e, sums["sum_ae"], sums["sum_ee"], sums["sum_aa"], sums["sum_rr"], sum_ar,
                 sums["max_ae"], max_r)
    _fill_worst(stats, a_flat, r_flat, shape, sums["worst_pos"], atol, rtol)
    if elementwise:
        stats.mismatch_count = sums["mismatches"]
        stats.mismatch_fraction = sums["mismatches"] / n


def _db(signal: float, noise: float) -> float:
    """20*log10(signal / noise): inf for no noise, -inf for no signal."""
    if noise == 0:
        return math.inf
    return 20 * math.log10(signal / noise) if signal > 0 else -math.inf


def _fill_errors(stats: OutputStats, n: int, sum_e, sum_ae, sum_ee, sum_aa, sum_rr, sum_ar, max_ae, max_r) -> None:
    norm_e, norm_a, norm_r = math.sqrt(sum_ee), math.sqrt(sum_aa), math.sqrt(sum_rr)
    stats.error_l2_norm = norm_e
    stats.error_mae = sum_ae / n
    stats.error_max = max_ae
    stats.error_msd = sum_e / n
    stats.sqnr = _db(norm_r, norm_e)
    stats.sqnr_actual = _db(norm_a, norm_e)
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


def _nonfinite_statistics(stats, a_flat, r_flat, shape, atol, rtol, elementwise, nan_equal: bool = True) -> OutputStats:
    """Slow path when NaN/Inf are present: NaN matches NaN (unless `nan_equal` is False),
    equal infinities match; error statistics are over the positions where both are finite."""
    a = a_flat.astype(np.float64)
    r = r_flat.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(r)
    same_special = np.isinf(a) & (a == r)
    if nan_equal:
        same_special |= np.isnan(a) & np.isnan(r)
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
