"""`--override`: parsing, application to embedded criteria (with trail), re-judging."""

from __future__ import annotations

import numpy as np
import pytest

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite
from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.manifest import Criteria, Manifest, MethodManifest, OutputSpec, TensorSpec
from bundlerun.bundles.registry import explicit_entry
from bundlerun.runner.judging.judge import judge_run, load_context, summarize
from bundlerun.runner.judging.overrides import apply_overrides, apply_to_manifest, as_build_overrides, parse_override, parse_overrides
from bundlerun.targets.base import CaseResult, CaseStatus, RawTensor, TargetRun


@pytest.mark.parametrize(
    "text, method, output, key, value",
    [
        ("out0.atol=0.05", "*", "out0", "atol", 0.05),
        ("forward.out1.qtol=2", "forward", "out1", "qtol", 2.0),
        ("*.sqnr_min_db=25", "*", "*", "sqnr_min_db", 25.0),
        ("rtol=1e-2", "*", "*", "rtol", 0.01),
        ("out0.rtol=none", "*", "out0", "rtol", None),
        ("1.exact=true", "*", "1", "exact", True),
    ],
)
def test_parse(text, method, output, key, value):
    ov = parse_override(text)
    assert (ov.method, ov.output, ov.key, ov.value) == (method, output, key, value)
    assert ov.to_dict()["text"] == text


@pytest.mark.parametrize(
    "text, match",
    [
        ("out0.atoll=1", r"unknown criterion 'atoll' \(did you mean 'atol'\?\)"),
        ("out0.atol=-1", "must not be negative"),
        ("out0.atol=lots", "must be a number"),
        ("out0.atol", "expected"),
        ("a.b.c.atol=1", "expected"),
        ("out0.exact=maybe", "true or false"),
        ("out0.cosine_min=1.2", "at most 1"),
    ],
)
def test_parse_errors_are_one_line(text, match):
    with pytest.raises(ConfigError, match=match) as info:
        parse_override(text)
    assert "\n" not in str(info.value)


def _bundle(expected: list[np.ndarray], criteria: list[Criteria], manifest: bool = True) -> Bundle:
    outs = [OutputSpec(f"out{j}", "float32", list(e.shape), c) for j, (e, c) in enumerate(zip(expected, criteria))]
    m = Manifest(model={"id": "synthetic"}, build={"backend": "xnnpack", "dtype": "fp32"}, versions={},
                 methods={"forward": MethodManifest("forward", [TensorSpec("in0", "float32", [1])], outs)})
    case = BundledTestCase([BundledValue.from_array(np.zeros(1, np.float32))], [BundledValue.from_array(e) for e in expected])
    return Bundle(b"", [MethodTestSuite("forward", [case])], m.to_dict() if manifest else None)


def _run(actual: list[np.ndarray]) -> TargetRun:
    raws = [RawTensor(st.FLOAT, list(a.shape), a.astype(np.float32).tobytes()) for a in actual]
    return TargetRun("host://xnnpack", [CaseResult("forward", 0, CaseStatus.OK, raws)])


def _crit(**kw) -> Criteria:
    c = Criteria(**kw)
    c.trail = {k: [{"value": v, "source": "backend default: test", "file": "t.toml"}] for k, v in kw.items()}
    return c


def test_override_changes_the_verdict_and_is_recorded_in_the_trail():
    expected = [np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, 0.5], np.float32)]
    actual = [expected[0] + np.float32(0.03), expected[1]]
    bundle = _bundle(expected, [_crit(atol=1e-3, rtol=0.0), _crit(atol=1e-3, rtol=0.0)])
    ctx = load_context(bundle)
    cases, _ = judge_run(bundle, _run(actual), ctx)
    assert summarize(cases).verdict == "FAIL"
    failed = cases[0].outputs[0].failed[0]
    assert failed.criterion == "elementwise" and failed.measured == pytest.approx(0.03, rel=1e-4)

    ctx = load_context(bundle)
    records = apply_overrides(ctx, bundle, ["out0.atol=0.05"])
    assert records == [{"text": "out0.atol=0.05", "method": "*", "output": "out0", "key": "atol", "value": 0.05}]
    cases, _ = judge_run(bundle, _run(actual), ctx)
    assert summarize(cases).verdict == "PASS"
    trail = cases[0].outputs[0].criteria.trail["atol"]
    assert trail[0]["source"] == "backend default: test"
    assert trail[-1] == {"value": 0.05, "source": "override (CLI)", "file": None}
    assert cases[0].outputs[1].criteria.atol == 1e-3  # out1 untouched


def test_override_can_add_a_signal_criterion_that_fails():
    expected = [np.linspace(-1, 1, 64, dtype=np.float32)]
    rng = np.random.default_rng(0)
    actual = [expected[0] + rng.normal(0, 0.05, 64).astype(np.float32)]
    bundle = _bundle(expected, [_crit(atol=1.0)])
    ctx = load_context(bundle)
    apply_overrides(ctx, bundle, ["*.sqnr_min_db=40", "forward.out0.cosine_min=0.99999"])
    out = judge_run(bundle, _run(actual), ctx)[0][0].outputs[0]
    assert out.verdict == "FAIL"
    names = {f.criterion: f for f in out.failed}
    assert set(names) == {"sqnr_min_db", "cosine_min"}
    assert names["sqnr_min_db"].limit == 40 and names["sqnr_min_db"].measured < 40


def test_unset_override_removes_a_criterion():
    bundle = _bundle([np.ones(3, np.float32)], [_crit(atol=0.1, rtol=0.1)])
    m = bundle.manifest
    apply_to_manifest(m, parse_overrides(["out0.rtol=none"]))
    c = m.output_spec("forward", 0).criteria
    assert c.rtol is None and c.trail["rtol"][-1]["value"] is None


def test_override_matching_no_output_is_an_error():
    bundle = _bundle([np.ones(3, np.float32)], [_crit(atol=0.1)])
    with pytest.raises(ConfigError, match="matches no output; outputs: forward.out0"):
        apply_overrides(load_context(bundle), bundle, ["out3.atol=1"])
    with pytest.raises(ConfigError, match="matches no output"):
        apply_overrides(load_context(bundle), bundle, ["decode.out0.atol=1"])


def test_override_on_a_bundle_without_manifest():
    expected = [np.array([1.0, 2.0], np.float32)]
    bundle = _bundle(expected, [_crit(atol=1e-3)], manifest=False)
    ctx = load_context(bundle)
    apply_overrides(ctx, bundle, ["out0.atol=0.5"])
    cases, warnings = judge_run(bundle, _run([expected[0] + 0.2]), ctx)
    assert cases[0].verdict == "PASS" and warnings
    assert cases[0].outputs[0].criteria.trail["atol"][-1]["source"] == "override (CLI)"


def test_build_override_dict_round_trips_through_the_registry_selectors():
    d = as_build_overrides(parse_overrides(["out0.atol=0.05", "forward.*.qtol=2", "rtol=0.01"]))
    assert d == {"out0.atol": 0.05, "forward.*.qtol": 2.0, "rtol": 0.01}
    assert explicit_entry(d, "forward", "out0", 0) == {"atol": 0.05, "qtol": 2.0, "rtol": 0.01}
    assert explicit_entry(d, "forward", "out1", 1) == {"qtol": 2.0, "rtol": 0.01}
