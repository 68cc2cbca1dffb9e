"""The token-level criteria (argmax_match, kl_max, top_k_overlap_min): manifest schema, registry
rules for `llm:*`, and judge_output's verdicts and messages. Pure Python + numpy."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from bundlerun.runner.judging.failed_criterion import FailedCriterion
from bundlerun.bundles.errors import ConfigError, ManifestError
from bundlerun.bundles.manifest import Criteria, validate_manifest
from bundlerun.bundles.registry import Registry
from bundlerun.bundles.tolerances import ToleranceContext, resolve_criteria
from bundlerun.runner.judging.numerics import judge_output
from bundlerun.runner.report.criteria_text import failed_text

MANIFEST = {"schema": "bundlerun.manifest/1", "model": {"id": "llm:llama3"},
            "methods": {"forward": {"name": "forward", "inputs": [], "outputs": [
                {"name": "out0", "dtype": "float32", "shape": [1, 8], "criteria": {"argmax_match": True}}]}}}


def _with(**crit) -> dict:
    data = copy.deepcopy(MANIFEST)
    data["methods"]["forward"]["outputs"][0]["criteria"] = crit
    return data


def test_schema_accepts_token_rules_alone():
    validate_manifest(_with(argmax_match=True))
    validate_manifest(_with(kl_max=0.0))
    validate_manifest(_with(top_k_overlap_min=1.0))


@pytest.mark.parametrize("crit, problem", [
    ({"argmax_match": "yes"}, "expected a boolean"),
    ({"argmax_match": False}, "no criterion is set"),
    ({"kl_max": -1e-3}, "must be >= 0"),
    ({"kl_max": float("nan")}, "not a finite number"),
    ({"kl_max": "0.1"}, "expected a finite number"),
    ({"top_k_overlap_min": 1.5}, "1.5"),
    ({"top_k_overlap_min": True}, "expected a finite number"),
])
def test_schema_refuses_bad_token_rules(crit, problem):
    with pytest.raises(ManifestError, match=problem):
        validate_manifest(_with(**crit))


def test_criteria_defaults_stay_out_of_the_manifest():
    assert "argmax_match" not in Criteria(atol=1e-3).to_dict()
    assert "kl_max" not in Criteria(atol=1e-3).to_dict()
    c = Criteria(kl_max=0.1)
    assert c.has_any and c.to_dict()["kl_max"] == 0.1
    assert Criteria(argmax_match=True).has_any and Criteria.from_dict({"argmax_match": True}).argmax_match


def test_registry_llm_rules_with_their_origin():
    fp32 = resolve_criteria(ToleranceContext("xnnpack", "host://xnnpack", "fp32", model="llm:llama3"))
    assert fp32.argmax_match and fp32.kl_max == 1e-3 and fp32.top_k_overlap_min == 0.8
    assert "test_static_attention.py:366-394" in fp32.trail["argmax_match"][-1]["origin"]
    assert fp32.trail["kl_max"][-1]["origin"].startswith("bundlerun: ")
    q = resolve_criteria(ToleranceContext("xnnpack", "host://xnnpack", "int8", model="llm:qwen3"))
    assert not q.argmax_match and q.kl_max == 5e-2  # argmax is required of float builds only (reported for quantized ones)
    other = resolve_criteria(ToleranceContext("xnnpack", "host://xnnpack", "fp32", model="mlp"))
    assert not other.argmax_match and other.kl_max is None and other.top_k_overlap_min is None
    second = resolve_criteria(ToleranceContext("xnnpack", "host://xnnpack", "fp32", model="llm:llama3",
                                               output_index=1, output_name="out1"))
    assert not second.argmax_match and second.kl_max is None  # the logits are output 0 (LLM_CONTRACT)
    near = resolve_criteria(ToleranceContext("xnnpack", "host://xnnpack", "fp32", model="llmx"))
    assert not near.argmax_match  # `llm:*` is a pattern on the id, not a prefix of any name


def test_registry_refuses_bad_token_numbers():
    reg = Registry.builtin()
    bad = {"schema": "bundlerun.tolerances/1", "model_overrides": [
        {"models": ["llm:*"], "top_k_overlap_min": 2.0, "origin": "bundlerun", "reason": "test"}]}
    with pytest.raises(ConfigError, match="top_k_overlap_min must be at most 1"):
        reg.validate_overlay(bad, "bundlerun.toml")


def test_judge_output_fails_a_flipped_step_with_its_token_message():
    ref = np.array([[0.1, 2.0, 1.2, -1.0]], np.float32)
    tgt = np.array([[0.1, 1.2, 2.0, -1.0]], np.float32)
    crit = Criteria(atol=10.0, argmax_match=True, kl_max=1e-3, top_k_overlap_min=0.8)
    v = judge_output(tgt, ref, crit, "float32", "float32")
    assert v.verdict == "FAIL"
    by = {f.criterion: f for f in v.failed}
    assert set(by) == {"argmax_match", "kl_max"}  # the same top-4 set: overlap 1.0
    assert by["argmax_match"].detail == "argmax: expected token 1 -> got token 2, margin -0.8"
    assert failed_text(by["kl_max"]).endswith("> 0.001")
    assert failed_text(FailedCriterion("top_k_overlap_min", 0.6, 0.8)) == "top_k_overlap_min 0.6 < 0.8"
    assert judge_output(ref, ref, crit, "float32", "float32").verdict == "PASS"


def test_vacuity_still_applies_to_token_rules():
    from bundlerun.runner.judging.vacuity import vacuous_reason

    ref = np.array([[3.0, 0.0, 0.0, 0.0]], np.float32)  # argmax 0: an all-zero output's argmax is 0 too
    assert vacuous_reason(ref, Criteria(argmax_match=True), "float32") is not None
    assert vacuous_reason(ref, Criteria(argmax_match=True, kl_max=1e-3), "float32") is None
