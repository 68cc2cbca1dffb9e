"""The tolerance registry: every level of the chain, the trail, the data's integrity.
(The numbers themselves are checked against ExecuTorch's source in test_registry_provenance.py
and test_registry_source_table.py.)"""

from __future__ import annotations

import math

import tomllib

import numpy as np
import pytest

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.registry import (BUILTIN_DIR, BUILTIN_PATH, LEVELS, TIERS, Layer, Registry, data_files,
                                        explicit_entry, normalize_op, tier_for)
from bundlerun.bundles.tolerances import ToleranceContext, explain, resolve_criteria

FILES = {p.name: tomllib.loads(p.read_text()) for p in data_files(BUILTIN_DIR)}
EPS16 = 9.77e-4


@pytest.fixture
def builtin() -> Registry:
    return Registry.builtin(BUILTIN_DIR)


def ctx(**kw) -> ToleranceContext:
    kw.setdefault("backend", "xnnpack")
    kw.setdefault("target", "host://xnnpack")
    kw.setdefault("dtype", "fp32")
    kw.setdefault("host_arch", "x86_64")
    return ToleranceContext(**kw)


# ------------------------------------------------------------------ the data's integrity

UPSTREAM_BACKENDS = {"xnnpack", "portable", "arm", "cortex-m", "qnn", "vulkan", "mlx", "metal", "coreml", "mps", "nxp",
                     "samsung", "mediatek", "openvino", "cadence", "webgpu", "cuda"}


def test_data_covers_every_backend_with_tests_upstream(builtin):
    assert set(builtin.backends()) == UPSTREAM_BACKENDS
    assert set(builtin.variants("arm")) >= {"tosa-int", "tosa-fp", "ethos-u55", "ethos-u65", "ethos-u85", "vgf", "suite"}
    assert set(builtin.variants("qnn")) >= {"htp", "gpu", "lpai", "suite"}
    assert "suite" not in builtin.variants("metal")  # the suite has no Metal flow
    assert builtin.commit == "cff6f4dd32e630945b7188512c1f2b4f102b05ad"


def test_every_value_has_an_origin_and_a_missing_one_is_refused(tmp_path):
    for name, data in FILES.items():
        from bundlerun.bundles.registry import iter_entries
        from bundlerun.bundles.registry_schema import entry_values, origins_of

        for where, entry in iter_entries(data):
            values = entry_values(entry)
            assert not values or set(values) <= set(origins_of(entry)), (name, where)
    (tmp_path / "tolerances.toml").write_text('[backends.bk.default]\natol = 0.5\n')
    with pytest.raises(ConfigError, match="no origin"):
        Registry.builtin(tmp_path)
    (tmp_path / "tolerances.toml").write_text('[backends.bk.default]\natol = 0.5\norigin = "bundlerun"\n')
    with pytest.raises(ConfigError, match="needs reason"):
        Registry.builtin(tmp_path)
    (tmp_path / "tolerances.toml").write_text('[backends.bk.default]\natol = 0.5\norigin = "tests/x.py:3"\n')
    with pytest.raises(ConfigError, match="is not 'backends/...py:LINE"):
        Registry.builtin(tmp_path)


def test_bundlerun_numbers_are_shown_as_bundleruns_own(builtin):
    c = resolve_criteria(ctx(backend="portable", target="x://y", dtype="fp16"), registry=builtin)
    last = c.trail["atol"][-1]
    assert last["origin"].startswith("bundlerun: ")
    c = resolve_criteria(ctx(dtype="int8", reference="quantized", scale=0.1, ops=["conv1d"]), registry=builtin)
    assert c.trail["atol"][-1]["origin"] == ("executorch@cff6f4dd:backends/xnnpack/test/ops/test_conv1d.py:146; "
                                             "executorch@cff6f4dd:backends/xnnpack/test/ops/test_conv1d.py:213")


def test_bundlerun_value_never_replaces_an_executorch_one_for_the_same_scope(builtin):
    # xnnpack fp16 gelu alone: ExecuTorch's data-dependent rule stands; bundlerun's range rule is skipped
    expected = np.array([300.0, 1.0], dtype=np.float16)
    res = explain(ctx(dtype="fp16", ops=["gelu"], expected=expected), None, builtin)
    assert res.criteria.atol == pytest.approx(300.0 * 6 * EPS16)
    skipped = [s for s in res.steps if "fp16-output-range" in s.source]
    assert skipped and "stands" in skipped[0].skipped.get("rtol", "") + skipped[0].skipped.get("atol", "")
    # qnn fp16 (a backend tier ExecuTorch states): the range rule may not loosen its 1e-1
    big = np.array([5000.0], dtype=np.float16)
    q = explain(ctx(backend="qnn", target="htp", dtype="fp16", expected=big), None, builtin)
    assert q.criteria.atol == 1e-1 and q.criteria.trail["atol"][-1]["origin"].startswith("executorch@")
    # a model with several ops is no single-op test: the bundlerun range rule may loosen it
    many = explain(ctx(dtype="fp16", ops=["gelu", "add"], expected=expected), None, builtin)
    assert many.criteria.rtol == pytest.approx(6 * EPS16)


def test_builtin_data_validates_and_every_backend_tier_variant_resolves(builtin):
    count = 0
    for backend in builtin.backends():
        for variant in [None, *builtin.variants(backend)]:
            for dtype in ("fp32", "fp16", "bf16", "int8", "int16"):
                for reference in ("eager-fp32", "quantized"):
                    c = resolve_criteria(ctx(backend=backend, target=variant or "x://y", dtype=dtype, reference=reference,
                                             scale=0.01), registry=builtin)
                    values = [getattr(c, k) for k in ("atol", "rtol", "qtol", "sqnr_min_db", "cosine_min", "rel_frobenius_max")]
                    assert any(v is not None for v in values), (backend, variant, dtype, reference)
                    assert all(v is None or (math.isfinite(v) and v >= 0) for v in values)
                    count += 1
    assert count == sum(1 + len(builtin.variants(b)) for b in builtin.backends()) * 5 * 2


# ------------------------------------------------------------------ foundation semantics kept


def test_int8_against_float_reference_uses_signal_quality_not_elementwise(builtin):
    c = resolve_criteria(ctx(dtype="int8", reference="eager-fp32", scale=0.02, ops=["aten.convolution.default"]), registry=builtin)
    assert (c.atol, c.rtol, c.qtol) == (None, None, None)
    assert (c.sqnr_min_db, c.cosine_min) == (20.0, 0.98)
    assert c.trail["atol"][-1]["value"] is None and "unset" in c.trail["atol"][-1]["source"]


def test_int8_against_quantized_reference_counts_steps_and_conv_gets_two(builtin):
    plain = resolve_criteria(ctx(dtype="int8", reference="quantized", scale=0.02, ops=["aten.linear.default"]), registry=builtin)
    assert (plain.atol, plain.rtol, plain.qtol, plain.scale) == (1e-3, 1e-3, 1, 0.02)
    assert plain.effective_atol == pytest.approx(1e-3 + 0.02)
    conv = resolve_criteria(ctx(dtype="int8", reference="quantized", scale=0.02, ops=["aten.conv2d.default"]), registry=builtin)
    assert conv.qtol == 2 and "xnnpack-conv2d" in conv.trail["qtol"][-1]["source"]
    # conv1d is its own test upstream: atol 0.04 / rtol 0.02, no qtol (not conv2d's qtol 2)
    c1 = resolve_criteria(ctx(dtype="int8", reference="quantized", scale=0.02, ops=["conv1d"]), registry=builtin)
    assert (c1.atol, c1.rtol, c1.qtol) == (0.04, 0.02, 0)


def test_qnn_quantized_tier_keeps_qnns_numbers_and_adds_a_floor_that_refuses_zeros(builtin):
    """QNN's own int8 bound (atol 0.1, rtol 1) passes an all-zero output; bundlerun adds its 20 dB floor
    (origin bundlerun), so an all-zero output FAILs instead of the output being vacuous (ERROR)."""
    from bundlerun.runner.judging.numerics import judge_output
    from bundlerun.runner.judging.vacuity import vacuous_reason

    c = resolve_criteria(ctx(backend="qnn", target="qnn://htp-sim", dtype="int8", reference="quantized", scale=0.02),
                         registry=builtin)
    assert (c.atol, c.rtol, c.sqnr_min_db) == (0.1, 1, 20.0)
    assert "test_qnn_delegate.py:3030" in c.trail["atol"][-1]["origin"]
    assert c.trail["sqnr_min_db"][-1]["origin"].startswith("bundlerun: ")
    ref = np.linspace(-1, 1, 64, dtype=np.float32)
    assert vacuous_reason(ref, c, "float32") is None
    assert judge_output(np.zeros_like(ref), ref, c, actual_dtype="float32", expected_dtype="float32").verdict == "FAIL"
    near = ref + np.float32(0.01)  # a few quantization steps off: well above 20 dB
    assert judge_output(near, ref, c, actual_dtype="float32", expected_dtype="float32").verdict == "PASS"


def test_tiers_keep_reference_kind():
    assert tier_for("int8", "eager-fp32") == "int8.vs-float"
    assert tier_for("int8", "quantized") == "int8"
    assert tier_for("fp16", "quantized") == "fp16"
    assert set(TIERS) >= {"int8.vs-float", "int16.vs-float", "int16"}


# ------------------------------------------------------------------ every level of the chain

SYNTH = {
    "global": {"default": {"atol": 1.0, "rtol": 0.5}, "tiers": {"fp16": {"atol": 2.5}}},
    "backends": {
        "bk": {
            "default": {"atol": 2.0},
            "tiers": {"fp32": {"atol": 3.0}},
            "variants": {"va": {"targets": ["zz://va*"], "tiers": {"fp32": {"atol": 4.0}}}},
        },
        "other": {},
    },
    "op_rules": [{"name": "r", "backends": ["bk"], "dtypes": ["fp32"], "ops": ["gelu"], "atol": 5.0}],
    "model_overrides": [{"models": ["m-x"], "backend": "bk", "dtypes": ["fp32"], "atol": 6.0}],
}


def _synth(**drop) -> Registry:
    import copy

    data = copy.deepcopy(SYNTH)
    b = data["backends"]["bk"]
    if drop.get("model"):
        data["model_overrides"] = []
    if drop.get("op"):
        data["op_rules"] = []
    if drop.get("variant"):
        b["variants"]["va"].pop("tiers")
    if drop.get("tier"):
        b.pop("tiers")
    if drop.get("backend_default"):
        b.pop("default")
    return Registry([Layer("synth.toml", data, "built-in")])


FULL = dict(backend="bk", target="zz://va1", dtype="fp32", model="M_X", ops=["aten.gelu.default"])


@pytest.mark.parametrize(
    "drop, overrides, atol, level",
    [
        ({}, {"atol": 7.0}, 7.0, "explicit override"),
        ({}, None, 6.0, "model + target override"),
        ({"model": 1}, None, 5.0, "op rule"),
        ({"model": 1, "op": 1}, None, 4.0, "backend + variant + dtype tier"),
        ({"model": 1, "op": 1, "variant": 1}, None, 3.0, "backend + dtype tier"),
        ({"model": 1, "op": 1, "variant": 1, "tier": 1}, None, 2.0, "backend default"),
        ({"model": 1, "op": 1, "variant": 1, "tier": 1, "backend_default": 1}, None, 1.0, "global default"),
    ],
)
def test_each_level_of_the_chain_wins_over_the_less_specific_ones(drop, overrides, atol, level):
    res = explain(ctx(**FULL), overrides, _synth(**drop))
    assert res.criteria.atol == atol
    trail = res.criteria.trail["atol"]
    assert trail[-1]["source"].startswith(level) and trail[-1]["value"] == atol
    # winning entry last; every less specific entry that set atol is there before it, in chain order
    assert [t["value"] for t in trail] == sorted(t["value"] for t in trail)
    assert trail[0]["file"] == "synth.toml" and trail[0]["source"].startswith("global default")
    assert res.criteria.rtol == 0.5 and res.criteria.trail["rtol"][-1]["source"].startswith("global default")
    assert res.variant == "va"


def test_levels_list_is_the_documented_chain():
    assert LEVELS[0] == "global default" and LEVELS[-1] == "explicit override"
    assert LEVELS.index("op rule") < LEVELS.index("model + target override")


def test_global_tier_is_the_fallback_when_backend_has_no_entry_for_the_tier():
    res = explain(ctx(backend="other", target="x://", dtype="fp16"), None, _synth())
    assert res.criteria.atol == 2.5
    assert "global.tiers.fp16 (other has no fp16 entry)" in res.criteria.trail["atol"][-1]["source"]


def test_model_override_respects_backend_and_dtype(builtin):
    base = dict(target="fvp://corstone-300/ethos-u55-128", reference="quantized", scale=0.1)
    mv2 = resolve_criteria(ctx(backend="arm", dtype="int8", model="mobilenet_v2", **base), registry=builtin)
    assert mv2.atol == 0.25 and "mobilenet_v2" in mv2.trail["atol"][-1]["source"]
    other = resolve_criteria(ctx(backend="arm", dtype="int8", model="resnet50", **base), registry=builtin)
    assert other.atol == 1e-3
    cm = resolve_criteria(ctx(backend="cortex-m", target="fvp://corstone-300/cortex-m55", dtype="int8",
                              model="mv3", reference="quantized", scale=0.1), registry=builtin)
    assert cm.qtol == 20
    fp = resolve_criteria(ctx(backend="arm", target="tosa://fp", dtype="fp16", model="deit_tiny"), registry=builtin)
    assert fp.atol == 8e-2


def test_variant_from_target_url(builtin):
    assert builtin.variant_for("arm", "tosa://int") == "tosa-int"
    assert builtin.variant_for("arm", "tosa://fp") == "tosa-fp"
    assert builtin.variant_for("arm", "fvp://corstone-300/ethos-u55-128") == "ethos-u55"
    assert builtin.variant_for("arm", "fvp://corstone-300/ethos-u65-256") == "ethos-u65"
    assert builtin.variant_for("arm", "fvp://corstone-320/ethos-u85-256") == "ethos-u85"
    assert builtin.variant_for("arm", "vgf") == "vgf"
    assert builtin.variant_for("qnn", "adb://SERIAL") == "htp"  # default variant
    assert builtin.variant_for("qnn", "adb://SERIAL?backend=gpu") == "gpu"
    assert builtin.variant_for("xnnpack", "host://xnnpack") is None


# ------------------------------------------------------------------ op rules, adjustments, special outputs


def test_fp16_exp_gelu_rule_is_data_dependent(builtin):
    expected = np.array([[3.0, -0.5], [0.25, 1.0]], dtype=np.float16)
    c = resolve_criteria(ctx(dtype="fp16", ops=["aten.gelu.default"], expected=expected), registry=builtin)
    assert c.atol == pytest.approx(max(2 * EPS16, 3.0 * 6 * EPS16))
    assert "fp16-exp-gelu" in c.trail["atol"][-1]["source"]
    # ExecuTorch's rule sets rtol 6*eps (not loosen-only: it is the test's own number)
    assert c.rtol == pytest.approx(6 * EPS16)
    bigger = resolve_criteria(ctx(dtype="fp16", ops=["exp"], expected=expected * 4), registry=builtin)
    assert bigger.atol == pytest.approx(12.0 * 6 * EPS16)
    small = resolve_criteria(ctx(dtype="fp16", ops=["exp"], expected=expected / 100), registry=builtin)
    assert small.atol == pytest.approx(2 * EPS16)  # the 2*eps floor of the test
    # without exp/gelu the same formula still applies to the whole output's range (bundlerun's own rule)
    other = resolve_criteria(ctx(dtype="fp16", ops=["aten.add.Tensor"], expected=expected), registry=builtin)
    assert other.atol == pytest.approx(3.0 * 6 * EPS16)
    assert "fp16-output-range" in other.trail["atol"][-1]["source"]
    assert resolve_criteria(ctx(dtype="fp16", ops=["aten.add.Tensor"], expected=expected / 100), registry=builtin).atol == 1e-2


def test_fp16_rule_alone_gives_the_published_formula():
    data = {"backends": {"bk": {}}, "op_rules": [
        {"name": "f", "ops": ["gelu"], "dtypes": ["fp16"], "rule": "fp16-eps", "eps": EPS16}]}
    reg = Registry([Layer("f.toml", data, "built-in")])
    ref = np.array([0.1, -2.0, 0.5])
    c = resolve_criteria(ctx(backend="bk", dtype="fp16", ops=["gelu"], expected=ref), registry=reg)
    allowed = np.maximum(2 * EPS16, np.abs(ref) * 6 * EPS16)
    assert c.atol == pytest.approx(allowed.max()) and c.rtol == pytest.approx(6 * EPS16)


def test_aarch64_host_scales_tosa_atol_only(builtin):
    base = dict(backend="arm", dtype="int8", reference="quantized", scale=0.1, model="lstm")
    x86 = resolve_criteria(ctx(target="tosa://int", **base), registry=builtin)
    arm64 = resolve_criteria(ctx(target="tosa://int", **{**base, "host_arch": "aarch64"}), registry=builtin)
    assert x86.atol == 0.3 and arm64.atol == pytest.approx(0.33)
    assert "aarch64-host-tosa" in arm64.trail["atol"][-1]["source"]
    fvp = resolve_criteria(ctx(target="fvp://corstone-300/ethos-u55-128", **{**base, "host_arch": "aarch64"}), registry=builtin)
    assert fvp.atol == 0.3


def test_distribution_adjustment_from_data():
    data = {"global": {"default": {"atol": 0.01, "rtol": 0.01}}, "backends": {"bk": {}},
            "adjustments": [{"name": "randn-outliers", "distributions": ["randn"], "atol_scale": 2.0}]}
    reg = Registry([Layer("a.toml", data, "built-in")])
    assert resolve_criteria(ctx(backend="bk", input_distribution="randn"), registry=reg).atol == pytest.approx(0.02)
    assert resolve_criteria(ctx(backend="bk", input_distribution="rand"), registry=reg).atol == pytest.approx(0.01)
    # explicit overrides are never adjusted
    assert resolve_criteria(ctx(backend="bk", input_distribution="randn"), {"atol": 0.5}, registry=reg).atol == 0.5


def test_bool_outputs_are_exact(builtin):
    c = resolve_criteria(ctx(dtype="int8", output_dtype="bool"), registry=builtin)
    assert c.exact and c.atol is None and c.sqnr_min_db is None
    assert c.trail["exact"][0]["source"] == "bool outputs are exact"


def test_integer_outputs_count_integer_steps(builtin):
    c = resolve_criteria(ctx(backend="arm", target="tosa://int", dtype="int8", reference="quantized", output_dtype="int8",
                             scale=0.05, zero_point=3), registry=builtin)
    assert c.scale == 1.0 and c.qtol == 1 and c.effective_atol == pytest.approx(1.001)
    assert "integer steps" in c.trail["scale"][-1]["source"]
    mlx = resolve_criteria(ctx(backend="mlx", target="apple://mlx", output_dtype="int64"), registry=builtin)
    assert mlx.exact


def test_float_output_without_scale_drops_qtol(builtin):
    c = resolve_criteria(ctx(backend="arm", target="tosa://int", dtype="int8", reference="quantized"), registry=builtin)
    assert c.qtol is None and "not applicable" in c.trail["qtol"][-1]["source"]


def test_groupwise_quantization_rule_matches_scheme(builtin):
    c = resolve_criteria(ctx(dtype="bf16", ops=["aten.linear.default"], quantization="8da4w-groupwise-32"), registry=builtin)
    assert c.atol == 8e-2
    plain = resolve_criteria(ctx(dtype="bf16", ops=["aten.linear.default"]), registry=builtin)
    assert plain.atol == 1e-1


# ------------------------------------------------------------------ explicit overrides, layers, env


def test_explicit_override_selectors():
    assert explicit_entry({"out0.atol": 0.5, "out1.atol": 9.0}, "forward", "out0", 0) == {"atol": 0.5}
    assert explicit_entry({"forward.*.qtol": 3}, "forward", "out4", 4) == {"qtol": 3}
    assert explicit_entry({"other.out0.qtol": 3}, "forward", "out0", 0) == {}
    assert explicit_entry({"rtol": None}, "forward", "out0", 0) == {"unset": ["rtol"]}
    with pytest.raises(ConfigError, match="did you mean 'rtol'"):
        explicit_entry({"rtoll": 1}, "forward", "out0", 0)
    with pytest.raises(ConfigError, match="negative"):
        explicit_entry({"atol": -1}, "forward", "out0", 0)


def test_project_layer_wins_and_is_named_in_the_trail(builtin, tmp_path):
    project = {"backends": {"xnnpack": {"tiers": {"int8": {"qtol": 3}}}}, "override": {"outputs": ["out1"], "atol": 0.2}}
    reg = builtin.with_overlay(project, str(tmp_path / "bundlerun.toml"))
    c0 = resolve_criteria(ctx(dtype="int8", reference="quantized", scale=0.1), registry=reg)
    assert c0.qtol == 3 and c0.trail["qtol"][-1]["file"].endswith("bundlerun.toml")
    # a shipped file by its place in the package: the same trail (and build-cache key) in every checkout
    assert c0.trail["qtol"][-2]["file"] == "bundlerun/bundles/data/tolerances.xnnpack.toml"
    assert c0.atol == 1e-3
    c1 = resolve_criteria(ctx(dtype="int8", reference="quantized", scale=0.1, output_index=1, output_name="out1"), registry=reg)
    assert c1.atol == 0.2 and c1.trail["atol"][-1]["source"] == "explicit override: override (project config)"


def test_env_var_replaces_builtin_data(tmp_path, monkeypatch):
    from bundlerun.bundles.project_config import default_registry

    import shutil

    alt = tmp_path / "data"
    shutil.copytree(BUILTIN_DIR, alt, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    xnn = alt / "tolerances.xnnpack.toml"
    text = xnn.read_text().replace("[backends.xnnpack.default]\natol = 1e-3", "[backends.xnnpack.default]\natol = 0.125")
    assert "atol = 0.125" in text
    xnn.write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BUNDLERUN_TOLERANCES", str(alt))
    c = resolve_criteria(ctx())
    assert c.atol == 0.125 and c.trail["atol"][-1]["file"] == str(xnn)
    monkeypatch.delenv("BUNDLERUN_TOLERANCES")
    assert resolve_criteria(ctx()).atol == 1e-3
    assert default_registry().layers[0].file == f"bundlerun/bundles/data/{BUILTIN_PATH.name}"


def test_unknown_context_values_are_clear_errors(builtin):
    with pytest.raises(ConfigError, match="did you mean 'xnnpack'"):
        resolve_criteria(ctx(backend="xnnpak"), registry=builtin)
    with pytest.raises(ConfigError, match="unknown dtype"):
        resolve_criteria(ctx(dtype="fp8"), registry=builtin)
    with pytest.raises(ConfigError, match="did you mean 'tosa-int'"):
        resolve_criteria(ctx(backend="arm", dtype="fp32", variant="tosa-itn"), registry=builtin)


def test_normalize_op_names():
    assert normalize_op("aten.convolution.default") == "convolution"
    assert normalize_op("aten::gelu") == "gelu"
    assert normalize_op("torch.ops.aten._softmax.default") == "_softmax"
    assert normalize_op("executorch_exir_dialects_edge__ops_aten_gelu_default") == "gelu"


def test_backend_tier_replaces_the_global_tier_and_explain_says_so(builtin, tmp_path):
    reg = builtin.with_overlay({"backends": {"xnnpack": {"tiers": {"fp16": {"atol": 0.02}}}}}, str(tmp_path / "p.toml"))
    res = explain(ctx(dtype="fp16"), None, reg)
    assert res.criteria.atol == 0.02
    # global fp16 rtol 1e-2 is not merged in: rtol comes from the default, loosened by the fp16 range rule
    assert res.criteria.rtol == pytest.approx(6 * EPS16) and "fp16-output-range" in res.criteria.trail["rtol"][-1]["source"]
    replaced = [s for s in res.steps if s.source == "global.tiers.fp16"]
    assert replaced and replaced[0].applied == {} and "replaced by backends.xnnpack.tiers.fp16" in replaced[0].skipped["atol"]
