"""The rules some backends' tests judge by, each with a tensor pair on either side of its boundary
(runner/judging/numerics.py), and the manifest side of them: strict validation, old bundles unchanged."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from bundlerun.bundles.errors import ConfigError, ManifestError
from bundlerun.bundles.manifest import RULE_DEFAULTS, Criteria
from bundlerun.bundles.manifest_schema import validate_manifest
from bundlerun.runner.judging.numerics import judge_output, sqnr_db

F32 = np.float32


def _judge(actual, expected, criteria, adt="float32", edt="float32"):
    return judge_output(np.asarray(actual), np.asarray(expected), criteria, adt, edt)


def _failed(v) -> set[str]:
    return {f.criterion for f in v.failed}


# ------------------------------------------------------------------ NaN


def test_nan_matches_nan_by_default_and_fails_where_the_backend_says_so():
    ref = np.array([np.nan, 1.0], F32)
    same = np.array([np.nan, 1.0], F32)
    assert _judge(same, ref, Criteria(atol=1e-3, rtol=1e-3)).verdict == "PASS"  # shared Tester: equal_nan=True
    strict = _judge(same, ref, Criteria(atol=1e-3, rtol=1e-3, nan="fail"))  # MLX / Metal / QNN: allclose, no equal_nan
    assert strict.verdict == "FAIL" and "nan" in _failed(strict)
    nan_fail = next(f for f in strict.failed if f.criterion == "nan")
    assert nan_fail.measured == 1 and "nan=fail" in nan_fail.detail
    finite = np.array([0.5, 1.0], F32)
    assert _judge(finite, np.array([0.5, 1.0], F32), Criteria(atol=1e-3, nan="fail")).verdict == "PASS"
    inf = np.array([np.inf, 1.0], F32)  # equal infinities still match (allclose treats them as close)
    assert _judge(inf, inf.copy(), Criteria(atol=1e-3, nan="fail")).verdict == "PASS"


# ------------------------------------------------------------------ dtype cast (MLX)


def test_cast_float_compares_different_dtypes_as_float32():
    ref = np.array([1.0, 2.5], F32)
    half = np.array([1.0, 2.5], np.float16)
    plain = _judge(half, ref, Criteria(atol=1e-5, rtol=1e-5), "float16", "float32")
    assert _failed(plain) == {"dtype"}
    cast = _judge(half, ref, Criteria(atol=1e-5, rtol=1e-5, cast_float=True), "float16", "float32")
    assert cast.verdict == "PASS"
    off = _judge(np.array([1.0, 2.51], np.float16), ref, Criteria(atol=1e-5, rtol=1e-5, cast_float=True), "float16", "float32")
    assert _failed(off) == {"elementwise"}  # the values are still judged


# ------------------------------------------------------------------ top-1 (Cortex-M mobilenet tests)


def test_top1_requires_the_same_argmax():
    ref = np.array([[0.1, 0.9, 0.2]], F32)
    c = Criteria(qtol=20, scale=0.1, top1=True)
    assert _judge(np.array([[0.2, 0.85, 0.1]], F32), ref, c).verdict == "PASS"
    v = _judge(np.array([[0.9, 0.85, 0.1]], F32), ref, c)
    assert _failed(v) == {"top1"} and (v.failed[0].measured, v.failed[0].limit) == (0, 1)


# ------------------------------------------------------------------ MSE ceiling (NXP)


def test_mse_ceiling_is_inclusive():
    ref = np.zeros(4, F32)
    actual = np.full(4, 0.01, np.float64)
    mse = float(np.mean(actual ** 2))
    assert _judge(actual, ref.astype(np.float64), Criteria(mse_max=mse)).verdict == "PASS"  # mse > max fails, = passes
    v = _judge(actual, ref.astype(np.float64), Criteria(mse_max=mse * 0.99))
    assert _failed(v) == {"mse_max"} and v.failed[0].measured == pytest.approx(mse)


# ------------------------------------------------------------------ SQNR as the source measures it


def test_sqnr_signal_is_the_actual_or_the_reference():
    ref = np.ones(4)
    actual = np.full(4, 2.0)  # noise ||1|| = 2: actual/noise = 6.02 dB, reference/noise = 0 dB
    assert sqnr_db(actual, ref, "actual") == pytest.approx(20 * math.log10(2))
    assert sqnr_db(actual, ref, "reference") == pytest.approx(0.0)
    assert _judge(actual, ref, Criteria(sqnr_min_db=3.0)).verdict == "PASS"  # ErrorStatistics' sqnr
    v = _judge(actual, ref, Criteria(sqnr_min_db=3.0, sqnr_reference="reference"))  # torchao compute_error(ref, out)
    assert _failed(v) == {"sqnr_min_db"} and v.failed[0].measured == pytest.approx(0.0)


def test_sqnr_strict_floor_must_be_exceeded():
    ref = np.array([10.0, 0.0])
    actual = np.array([10.0, 1.0])  # ||ref|| / ||noise|| = 10 -> exactly 20 dB
    assert sqnr_db(actual, ref, "reference") == 20.0
    assert _judge(actual, ref, Criteria(sqnr_min_db=20.0, sqnr_reference="reference")).verdict == "PASS"  # >=
    v = _judge(actual, ref, Criteria(sqnr_min_db=20.0, sqnr_reference="reference", sqnr_strict=True))  # `error > 20`
    assert _failed(v) == {"sqnr_min_db"} and "must exceed" in v.failed[0].detail
    assert _judge(actual, ref, Criteria(sqnr_min_db=19.99, sqnr_reference="reference", sqnr_strict=True)).verdict == "PASS"


# ------------------------------------------------------------------ Arm's output analysis


ARM = dict(rel_frobenius_max=0.15, cosine_min=0.9, arm_analysis=True)


def test_arm_zeroes_reference_values_below_one_quantization_step():
    ref = np.concatenate([np.ones(4), np.full(100, 0.05)]).astype(F32)  # 0.05 < scale 0.1
    actual = np.concatenate([np.ones(4), np.zeros(100)]).astype(F32)
    plain = _judge(actual, ref, Criteria(rel_frobenius_max=0.15, cosine_min=0.9, scale=0.1))
    assert "rel_frobenius_max" in _failed(plain)
    assert _judge(actual, ref, Criteria(scale=0.1, **ARM)).verdict == "PASS"
    above = ref.copy()
    above[4:] = 0.1  # one step: kept (|r| >= scale), and now the error counts
    assert "rel_frobenius_max" in _failed(_judge(actual, above, Criteria(scale=0.1, **ARM)))


def test_arm_skips_frobenius_while_the_reference_norm_is_at_noise_scale():
    scale = 0.2
    low = np.full(100, 0.2, F32)  # ||r|| = 2.0 = scale * sqrt(100): skipped (needs >)
    assert _judge(low * 1.5, low, Criteria(scale=scale, **ARM)).verdict == "PASS"
    high = np.full(100, 0.21, F32)  # ||r|| = 2.1 > 2.0: checked, relative error 0.5
    v = _judge(high * 1.5, high, Criteria(scale=scale, **ARM))
    assert _failed(v) == {"rel_frobenius_max"} and v.failed[0].measured == pytest.approx(0.5, rel=1e-5)


def test_arm_takes_002_off_frobenius_when_cosine_is_at_least_098():
    ref = np.linspace(1.0, 2.0, 64).astype(F32)
    assert _judge(ref * 1.16, ref, Criteria(**ARM)).verdict == "PASS"  # 0.16 - 0.02 <= 0.15 (cosine 1)
    assert "rel_frobenius_max" in _failed(_judge(ref * 1.16, ref, Criteria(rel_frobenius_max=0.15, cosine_min=0.9)))
    v = _judge(ref * 1.18, ref, Criteria(**ARM))  # 0.18 - 0.02 > 0.15
    assert _failed(v) == {"rel_frobenius_max"} and "effective" in v.failed[0].detail
    # cosine below 0.98: no discount. Noise orthogonal to the reference (cosine 1/sqrt(1 + 0.25^2) = 0.970)
    # against the same relative error along it (cosine 1): only the latter gets the 0.02.
    sign = np.where(np.arange(64) % 2 == 0, 1.0, -1.0)
    e = sign - ref * (sign @ ref) / (ref @ ref)  # orthogonal to ref
    ortho = (ref + e * (0.25 * np.linalg.norm(ref) / np.linalg.norm(e))).astype(F32)
    loose = dict(rel_frobenius_max=0.24, cosine_min=0.9, arm_analysis=True)
    v = _judge(ortho, ref, Criteria(**loose))
    assert _failed(v) == {"rel_frobenius_max"} and v.failed[0].measured == pytest.approx(0.25, rel=1e-4)
    assert _judge(ref * 1.25, ref, Criteria(**loose)).verdict == "PASS"


def test_arm_all_zero_reference_passes_and_none_turns_a_check_off():
    zeros = np.zeros(8, F32)
    ones = np.ones(8, F32)
    assert _judge(ones, zeros, Criteria(**ARM)).verdict == "PASS"
    assert _failed(_judge(ones, zeros, Criteria(rel_frobenius_max=0.15, cosine_min=0.9))) == {"rel_frobenius_max", "cosine_min"}
    one_hot = zeros.copy()
    one_hot[0] = 1.0
    assert _judge(ones, one_hot, Criteria(**ARM)).verdict == "FAIL"
    # frobenius_threshold=None: only the cosine floor is judged
    ref = np.linspace(1.0, 2.0, 64).astype(F32)
    off = Criteria(cosine_min=0.9, arm_analysis=True)
    assert _judge(ref * 3.0, ref, off).verdict == "PASS"
    assert _failed(_judge(-ref, ref, off)) == {"cosine_min"}


def test_arm_none_none_leaves_no_criterion_and_build_refuses_it():
    from bundlerun.bundles.registry import BUILTIN_DIR, Registry
    from bundlerun.bundles.tolerances import ToleranceContext, explain, resolve_criteria

    reg = Registry.builtin(BUILTIN_DIR)
    ctx = ToleranceContext(backend="arm", target="tosa://int", dtype="int8", model="mobilenet_v2", host_arch="x86_64")
    c = explain(ctx, None, reg).criteria
    assert (c.rel_frobenius_max, c.cosine_min) == (None, None) and not c.has_any
    with pytest.raises(ConfigError, match="no criterion left"):
        resolve_criteria(ctx, registry=reg)


# ------------------------------------------------------------------ all-zero reference (NXP)


def test_reference_nonzero_rejects_an_all_zero_reference():
    c = Criteria(atol=1, reference_nonzero=True)
    assert _failed(_judge(np.zeros(3), np.zeros(3), c)) == {"reference_nonzero"}
    assert _judge(np.array([0.0, 1.0, 0.0]), np.array([0.0, 1.0, 0.0]), c).verdict == "PASS"
    assert _judge(np.zeros(3), np.zeros(3), Criteria(atol=1)).verdict == "PASS"


# ------------------------------------------------------------------ the manifest side


def _manifest(criteria: dict) -> dict:
    return {"schema": "bundlerun.manifest/1", "model": {"id": "m"},
            "methods": {"forward": {"name": "forward", "outputs": [
                {"name": "out0", "dtype": "float32", "shape": [2], "criteria": criteria}]}}}


def test_old_bundles_without_the_rules_read_and_judge_as_before():
    old = {"atol": 1e-3, "rtol": 1e-3, "qtol": None, "scale": None, "zero_point": None, "sqnr_min_db": None,
           "cosine_min": None, "rel_frobenius_max": None, "exact": False,
           "trail": {"atol": [{"value": 1e-3, "source": "global default: global.default", "file": "x.toml"}]}}
    validate_manifest(_manifest(old))
    c = Criteria.from_dict(old)
    assert all(getattr(c, k) == v for k, v in RULE_DEFAULTS.items())
    assert c.to_dict() == old  # re-serialised byte for byte: the defaults are left out
    ref = np.array([np.nan, 1.0], F32)
    assert _judge(ref.copy(), ref, c).verdict == "PASS"  # NaN still matches NaN


def test_rule_fields_are_validated_strictly():
    base = {"atol": 1e-3}
    validate_manifest(_manifest({**base, "nan": "fail", "top1": True, "mse_max": 0.1, "sqnr_reference": "reference",
                                 "trail": {"nan": [{"value": "fail", "source": "s", "origin": "executorch@x:y.py:1"}]}}))
    for bad, message in (({"nan": "maybe"}, "expected one of match, fail"), ({"top1": 1}, "expected a boolean"),
                         ({"mse_max": -1.0}, ">= 0"), ({"sqnr_strict": "yes"}, "expected a boolean"),
                         ({"nan_": "fail"}, "unknown key")):
        with pytest.raises(ManifestError, match=message):
            validate_manifest(_manifest({**base, **bad}))
    # a rule-only output (top-1, or an MSE ceiling) is a judged output, not an unchecked one
    validate_manifest(_manifest({"top1": True}))
    validate_manifest(_manifest({"mse_max": 1e-3}))
    with pytest.raises(ManifestError, match="no criterion is set"):
        validate_manifest(_manifest({"nan": "fail"}))
    c = Criteria(atol=1e-3, nan="fail", top1=True)
    assert Criteria.from_dict(copy.deepcopy(c.to_dict())) == c
