"""Statistics and verdicts, checked against ExecuTorch's own ErrorStatistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bundlerun.bundles.manifest import Criteria
from bundlerun.runner.judging.numerics import error_statistics, judge_output


def _reference(actual, expected):
    import torch
    from executorch.backends.test.harness.error_statistics import ErrorStatistics

    return ErrorStatistics.from_tensors(torch.from_numpy(actual), torch.from_numpy(expected))


def _inspector_snr(reference, actual) -> float:
    """ExecuTorch's Inspector SNR (devtools/inspector/numerical_comparator/snr_numerical_comparator.py):
    the reference (its first argument, 'original') is the signal."""
    import torch
    from executorch.devtools.inspector.numerical_comparator.snr_numerical_comparator import SNRComparator

    return SNRComparator().element_compare(torch.from_numpy(reference), torch.from_numpy(actual))


@pytest.mark.parametrize("shape", [(1, 10), (3, 17, 5), (1001,), (2, 2), (2, 600_001)])  # last: threaded large path
def test_shared_fields_match_executorch(shape):
    rng = np.random.default_rng(sum(shape))
    expected = rng.standard_normal(shape).astype(np.float32)
    actual = (expected + rng.normal(0, 0.01, shape)).astype(np.float32)
    ours = error_statistics(actual, expected)
    ref = _reference(actual, expected)
    for field in ("error_l2_norm", "error_mae", "error_max", "error_msd"):
        assert getattr(ours, field) == pytest.approx(getattr(ref, field), rel=1e-9, abs=1e-12)
    assert ours.sqnr_actual == pytest.approx(ref.sqnr, rel=1e-5)  # ErrorStatistics' compute_sqnr(actual, ref)
    assert ours.sqnr == pytest.approx(_inspector_snr(expected, actual), rel=1e-5)  # the one the views show
    assert ours.sqnr != pytest.approx(ours.sqnr_actual, rel=1e-9)  # two definitions, told apart
    for side in ("reference_stats", "actual_stats"):
        a, b = getattr(ours, side), getattr(ref, side)
        assert a.shape == list(b.shape) and a.numel == b.numel
        for f in ("median", "mean", "max", "min"):
            assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-9, abs=1e-12), (side, f)


def test_extra_metrics_and_worst_element():
    expected = np.array([[1.0, 2.0, -3.0, 4.0]], dtype=np.float32)
    actual = expected.copy()
    actual[0, 2] = -2.5
    s = error_statistics(actual, expected, atol=0.1, rtol=0.0)
    assert s.mismatch_count == 1 and s.worst_index == [0, 2]
    assert s.worst_actual == -2.5 and s.worst_expected == -3.0 and s.worst_allowed == pytest.approx(0.1)
    a64, r64 = actual.astype(float), expected.astype(float)
    cos = float(a64 @ r64.T) / (np.linalg.norm(a64) * np.linalg.norm(r64))
    assert s.cosine_similarity == pytest.approx(cos)
    assert s.relative_frobenius == pytest.approx(0.5 / (np.linalg.norm(r64) + 1e-8))
    assert s.psnr == pytest.approx(20 * math.log10(4.0 / math.sqrt(0.25 / 4)))


def test_rtol_scales_reference_like_allclose():
    expected = np.array([100.0, 1.0], dtype=np.float32)
    actual = np.array([100.9, 1.009], dtype=np.float32)
    verdict = judge_output(actual, expected, Criteria(atol=0.0, rtol=0.01), "float32", "float32")
    assert verdict.verdict == "PASS"
    verdict = judge_output(actual, expected, Criteria(atol=0.0, rtol=0.005), "float32", "float32")
    assert verdict.verdict == "FAIL"
    assert np.allclose(actual, expected, rtol=0.01, atol=0) and not np.allclose(actual, expected, rtol=0.005, atol=0)


def test_qtol_counts_quantization_steps():
    expected = np.zeros(4, dtype=np.float32)
    actual = np.array([0.0, 0.019, 0.0, 0.0], dtype=np.float32)
    c = Criteria(atol=0.0, rtol=0.0, qtol=1, scale=0.02)
    assert judge_output(actual, expected, c, "float32", "float32").verdict == "PASS"
    c.scale = 0.01
    v = judge_output(actual, expected, c, "float32", "float32")
    assert v.verdict == "FAIL" and v.failed[0].criterion == "elementwise" and "[1]" in v.failed[0].detail


def test_integer_outputs_qtol_is_integer_steps():
    expected = np.array([10, -5, 7], dtype=np.int8)
    actual = np.array([11, -5, 5], dtype=np.int8)
    c = Criteria(qtol=1)
    v = judge_output(actual.astype(np.int64), expected.astype(np.int64), c, "int8", "int8")
    assert v.verdict == "FAIL" and v.stats.mismatch_count == 1 and v.stats.worst_index == [2]
    c.qtol = 2
    assert judge_output(actual.astype(np.int64), expected.astype(np.int64), c, "int8", "int8").verdict == "PASS"


def test_nan_matches_nan_and_mismatching_nan_fails():
    expected = np.array([np.nan, 1.0, np.inf], dtype=np.float32)
    same = np.array([np.nan, 1.0, np.inf], dtype=np.float32)
    assert judge_output(same, expected, Criteria(atol=1e-3, rtol=1e-3), "float32", "float32").verdict == "PASS"
    bad = np.array([0.0, 1.0, np.nan], dtype=np.float32)
    v = judge_output(bad, expected, Criteria(atol=1e-3, rtol=1e-3), "float32", "float32")
    assert v.verdict == "FAIL"
    assert {f.criterion for f in v.failed} >= {"nonfinite", "elementwise"}
    assert v.stats.nan_actual == 1 and v.stats.nan_expected == 1 and v.stats.nonfinite_mismatch == 2


def test_nan_in_actual_fails_sqnr_only_criteria():
    expected = np.ones(8, dtype=np.float32)
    actual = expected.copy()
    actual[3] = np.nan
    v = judge_output(actual, expected, Criteria(sqnr_min_db=20), "float32", "float32")
    assert v.verdict == "FAIL" and "nonfinite" in {f.criterion for f in v.failed}


def test_shape_mismatch_is_a_failure_with_both_shapes():
    v = judge_output(np.zeros((1, 5), np.float32), np.zeros((1, 10), np.float32), Criteria(atol=1), "float32", "float32")
    assert v.verdict == "FAIL" and v.failed[0].criterion == "shape"
    assert "[1, 5]" in v.failed[0].detail and "[1, 10]" in v.failed[0].detail
    assert v.stats.error_max is None and v.stats.sqnr is None


def test_dtype_mismatch_is_a_failure():
    v = judge_output(np.zeros(3, np.float16), np.zeros(3, np.float32), Criteria(atol=1), "float16", "float32")
    assert v.verdict == "FAIL" and v.failed[0].criterion == "dtype"


def test_sqnr_cosine_frobenius_criteria():
    rng = np.random.default_rng(0)
    expected = rng.standard_normal(1000).astype(np.float32)
    actual = (expected + rng.normal(0, 0.05, 1000)).astype(np.float32)  # ~26 dB
    assert judge_output(actual, expected, Criteria(sqnr_min_db=20), "float32", "float32").verdict == "PASS"
    v = judge_output(actual, expected, Criteria(sqnr_min_db=30, cosine_min=0.9999, rel_frobenius_max=0.01), "float32", "float32")
    assert {f.criterion for f in v.failed} == {"sqnr_min_db", "cosine_min", "rel_frobenius_max"}
    for f in v.failed:
        assert f.measured is not None and f.limit is not None


def test_bool_outputs_are_exact():
    expected = np.array([True, False, True])
    assert judge_output(expected.copy(), expected, Criteria(atol=10), "bool", "bool").verdict == "PASS"
    v = judge_output(np.array([True, True, True]), expected, Criteria(atol=10), "bool", "bool")
    assert v.verdict == "FAIL" and v.failed[0].criterion == "exact"


def test_lossy_text_outputs_tolerate_six_decimal_rounding():
    expected = np.array([0.12345678, -1.0000004], dtype=np.float32)
    printed = np.array([float(f"{x:f}") for x in expected], dtype=np.float32)
    c = Criteria(atol=0.0, rtol=0.0)
    assert judge_output(printed, expected, c, "float32", "float32", lossy=False).verdict == "FAIL"
    assert judge_output(printed, expected, c, "float32", "float32", lossy=True).verdict == "PASS"


def test_large_tensor_with_nan_takes_the_exact_path():
    rng = np.random.default_rng(5)
    expected = rng.standard_normal(1_500_000).astype(np.float32)
    actual = expected.copy()
    actual[123_456] = np.nan
    actual[7] += 1.0
    s = error_statistics(actual, expected, atol=1e-3, rtol=0.0)
    assert s.nan_actual == 1 and s.nonfinite_mismatch == 1
    assert s.mismatch_count == 2 and s.error_max == pytest.approx(1.0, rel=1e-6)


# ------------------------------------------------------------------ compare / run --baseline on real runs


def test_compare_and_run_baseline_on_real_runs(bundle_cache, cli, tmp_path):
    """Real bundles run on host://xnnpack: the same bundle twice is related and compared side
    by side; a bundle built with other inputs is refused by `compare` and by `run --baseline`."""
    import json

    same = bundle_cache("mlp", cases=3, seed=0)
    other_inputs = bundle_cache("mlp", cases=3, seed=1)
    env = {"BUNDLERUN_HISTORY": str(tmp_path / "h.sqlite"), "COLUMNS": "250"}

    def run(bundle, name, *extra):
        proc = cli("run", str(bundle), "--report", str(tmp_path / name), "--label", name, "--quiet", *extra, env=env)
        return proc, json.loads((tmp_path / name / "report.json").read_text())

    proc, first = run(same, "a1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(first["bundle"]["program_sha256"]) == 64 and len(first["bundle"]["inputs_sha256"]) == 64
    proc, second = run(same, "a2", "--baseline", "a1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert second["regressions"] == [] and "refused" not in second["baseline"]
    [out] = second["baseline"]["outputs"]
    assert out["cases"] == 3 and out["verdicts"] == {"baseline": {"PASS": 3}, "current": {"PASS": 3}}
    assert out["error_max"]["baseline"] == max(c["outputs"][0]["stats"]["error_max"] for c in first["cases"])
    assert "Against baseline a1" in (tmp_path / "a2" / "summary.md").read_text()

    proc, third = run(other_inputs, "b1", "--baseline", "a1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert third["summary"]["verdict"] == "PASS" and third["summary"]["exit_code"] == 2
    assert third["baseline"]["refused"].startswith("different test inputs")
    assert "not compared" in (tmp_path / "b1" / "summary.md").read_text()
    assert (tmp_path / "b1" / "junit.xml").is_file() and (tmp_path / "b1" / "report.html").is_file()

    proc = cli("compare", "a1", "a2", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["outputs"][0]["mismatch_count"] == {"baseline": 0, "current": 0, "delta": 0}
    proc = cli("compare", "a1", "b1", env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("bundlerun: error: refusing to compare unrelated runs: different test inputs")
    proc = cli("compare", "a1", "b1", "--force", env=env)
    assert proc.returncode in (0, 1) and "forced: different test inputs" in proc.stdout, proc.stderr
