"""Per-output statistics on two 16M-element float32 tensors: bundlerun's compare vs
ExecuTorch's ErrorStatistics.from_tensors, measured side by side in one run.
Checks every shared field agrees within 1e-6 relative. Goal: >= 5x faster."""

from __future__ import annotations

import argparse
import time

import numpy as np


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--numel", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import torch
    from executorch.backends.test.harness.error_statistics import ErrorStatistics

    from bundlerun.runner.judging.numerics import error_statistics

    rng = np.random.default_rng(0)
    expected = rng.standard_normal(args.numel, dtype=np.float32).reshape(16, -1)
    actual = (expected + rng.normal(0, 1e-2, expected.shape).astype(np.float32)).astype(np.float32)
    ta, tr = torch.from_numpy(actual), torch.from_numpy(expected)

    t_ref, ref = best_of(lambda: ErrorStatistics.from_tensors(ta, tr), args.repeat)
    t_ours, ours = best_of(lambda: error_statistics(actual, expected, atol=1e-3, rtol=1e-3), args.repeat)

    worst = 0.0
    pairs = [(f, getattr(ours, f), getattr(ref, f)) for f in ("error_l2_norm", "error_mae", "error_max", "error_msd")]
    # ExecuTorch computes sqnr with torch.ao's compute_sqnr on float32 copies (its own
    # comment: "requires float32"), which is only good to ~1e-5; bundlerun computes it in
    # float64. Compare against the same formula in float64 torch, and show ET's too.
    a64, r64 = ta.double(), tr.double()
    sqnr64 = (20 * torch.log10(torch.linalg.norm(a64) / torch.linalg.norm(a64 - r64))).item()
    pairs.append(("sqnr (float64 formula)", ours.sqnr, sqnr64))
    print(f"  sqnr as ExecuTorch computes it (float32): {ref.sqnr:+.9e}, rel to float64 "
          f"{abs(ref.sqnr - sqnr64) / abs(sqnr64):.1e} (not a bundlerun difference)")
    for side in ("reference_stats", "actual_stats"):
        for f in ("median", "mean", "max", "min"):
            pairs.append((f"{side}.{f}", getattr(getattr(ours, side), f), getattr(getattr(ref, side), f)))
    for name, a, b in pairs:
        rel = abs(a - b) / max(abs(b), 1e-30)
        worst = max(worst, rel)
        flag = "" if rel <= 1e-6 else "  <-- differs"
        print(f"  {name:28s} bundlerun {a:+.9e}  executorch {b:+.9e}  rel {rel:.1e}{flag}")
    print(f"numel {args.numel}: executorch ErrorStatistics {t_ref:.3f} s, bundlerun {t_ours:.3f} s "
          f"(bundlerun also computes cosine, Frobenius, PSNR, mismatches, worst index)")
    print(f"RATIO speedup = {t_ref / t_ours:.2f}x (goal >= 5x); max relative difference {worst:.1e} (goal <= 1e-6)")
    return 0 if worst <= 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
