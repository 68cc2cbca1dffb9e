"""What `tolerance explain` answers for (backend, variant, dtype, op / model) queries that ExecuTorch's
own tests cover, against the numbers of those tests.

Each row names the test line every expected number comes from; the test re-reads that line in the
pinned source (tests/et_src_fixture.py) before comparing, so a row can only pass while the source
still says what the row expects. Rows were written from the source, not from the registry data.
"""

from __future__ import annotations

import pytest

from bundlerun.bundles.registry import BUILTIN_DIR, Registry
from bundlerun.bundles.tolerance_audit import CitedValue, check_value
from bundlerun.bundles.tolerances import ToleranceContext, explain
from tests.et_src_fixture import executorch_src  # noqa: F401  (fixture)

H = "backends/test/harness/tester.py"
XT = "backends/xnnpack/test/ops"
AP = "backends/arm/test/tester/test_pipeline.py"
AM = "backends/arm/test/models"
CM = "backends/cortex_m/test"
QN = "backends/qualcomm/tests/test_qnn_delegate.py"
VK = "backends/vulkan/test/test_vulkan_delegate.py"
ML = "backends/mlx/test"
MT = "backends/apple/metal/tests/test_modules.py"
RC = "backends/xnnpack/test/recipes/test_xnnpack_recipes.py"

# (id, context, {criterion: (expected value, "path:lines" it comes from)})
ROWS = [
    ("xnnpack-fp32-conv1d", dict(backend="xnnpack", dtype="fp32", ops=["conv1d"]),
     {"atol": (1e-3, f"{XT}/test_conv1d.py:146"), "rtol": (1e-3, f"{XT}/test_conv1d.py:147"), "qtol": (0, f"{H}:323")}),
    ("xnnpack-int8-conv1d", dict(backend="xnnpack", dtype="int8", reference="quantized", ops=["conv1d"], scale=0.05),
     {"atol": (0.04, f"{XT}/test_conv1d.py:146"), "rtol": (0.02, f"{XT}/test_conv1d.py:147"), "qtol": (0, f"{H}:323")}),
    ("xnnpack-int8-conv2d", dict(backend="xnnpack", dtype="int8", reference="quantized", ops=["conv2d"], scale=0.05),
     {"atol": (1e-3, f"{H}:321"), "rtol": (1e-3, f"{H}:322"), "qtol": (2, f"{XT}/test_conv2d.py:260")}),
    ("xnnpack-fp16-conv2d", dict(backend="xnnpack", dtype="fp16", ops=["conv2d"]),
     {"atol": (1e-3, f"{H}:321"), "rtol": (1e-3, f"{H}:322")}),
    ("xnnpack-fp32-cos", dict(backend="xnnpack", dtype="fp32", ops=["cos"]),
     {"atol": (1e-4, f"{XT}/test_cos.py:25"), "rtol": (1e-3, f"{H}:322")}),
    ("xnnpack-fp16-cos", dict(backend="xnnpack", dtype="fp16", ops=["cos"]),
     {"atol": (2e-3, f"{XT}/test_cos.py:54"), "rtol": (1e-3, f"{H}:322")}),
    ("xnnpack-fp32-linear", dict(backend="xnnpack", dtype="fp32", ops=["linear"]),
     {"atol": (1e-3, f"{XT}/test_linear.py:254"), "rtol": (1e-3, f"{H}:322")}),
    ("xnnpack-fp16-linear", dict(backend="xnnpack", dtype="fp16", ops=["linear"]),
     {"atol": (5e-3, f"{XT}/test_linear.py:749"), "rtol": (1e-3, f"{H}:322")}),
    ("xnnpack-int8-linear", dict(backend="xnnpack", dtype="int8", reference="quantized", ops=["linear"], scale=0.1),
     {"atol": (1e-3, f"{XT}/test_linear.py:254"), "qtol": (1, f"{XT}/test_linear.py:335 (bool)")}),
    ("xnnpack-bf16-groupwise-linear", dict(backend="xnnpack", dtype="bf16", ops=["linear"], quantization="8da4w-groupwise"),
     {"atol": (8e-2, f"{XT}/test_linear.py:725"), "rtol": (5e-3, f"{XT}/test_linear.py:400")}),
    ("xnnpack-fp16-groupwise-linear", dict(backend="xnnpack", dtype="fp16", ops=["linear"], quantization="groupwise"),
     {"atol": (1e-2, f"{XT}/test_linear.py:727"), "rtol": (5e-3, f"{XT}/test_linear.py:400")}),
    ("xnnpack-int8-mean", dict(backend="xnnpack", dtype="int8", reference="quantized", ops=["mean"], scale=0.1),
     {"qtol": (1, f"{XT}/test_mean_dim.py:127")}),
    ("xnnpack-int8-add", dict(backend="xnnpack", dtype="int8", reference="quantized", ops=["add"], scale=0.1),
     {"atol": (0.02, f"{XT}/test_add.py:161"), "rtol": (0.02, f"{XT}/test_add.py:161")}),
    ("xnnpack-int8-vs-float", dict(backend="xnnpack", dtype="int8", ops=["linear"]),
     {"sqnr_min_db": (20, f"{RC}:73"), "sqnr_reference": ("reference", f"{RC}:78"), "sqnr_strict": (True, f"{RC}:80"),
      "atol": (None, None)}),
    ("xnnpack-vit-vs-float", dict(backend="xnnpack", dtype="int8", model="vit"),
     {"sqnr_min_db": (10, f"{RC}:276")}),
    ("xnnpack-suite", dict(backend="xnnpack", target="suite", dtype="fp32"),
     {"atol": (1e-1, "backends/test/suite/runner.py:219"), "rtol": (4e-2, "backends/test/suite/runner.py:220")}),
    ("arm-tosa-int-default", dict(backend="arm", target="tosa://int", dtype="int8", reference="quantized", ops=["abs"], scale=0.1),
     {"atol": (1e-3, f"{AP}:467"), "rtol": (1e-3, f"{AP}:468"), "qtol": (1, f"{AP}:469")}),
    ("arm-tosa-int-vs-float", dict(backend="arm", target="tosa://int", dtype="int8", ops=["abs"]),
     {"rel_frobenius_max": (0.15, f"{AP}:471"), "cosine_min": (0.9, f"{AP}:472"), "arm_analysis": (True, f"{AP}:373"),
      "atol": (None, None)}),
    ("arm-tosa-int-mv2-vs-float-off", dict(backend="arm", target="tosa://int", dtype="int8", model="mobilenet_v2"),
     {"rel_frobenius_max": (None, f"{AM}/test_mobilenet_v2_arm.py:98"), "cosine_min": (None, f"{AM}/test_mobilenet_v2_arm.py:99")}),
    ("arm-tosa-int-mv2", dict(backend="arm", target="tosa://int", dtype="int8", reference="quantized", model="mv2", scale=0.1),
     {"atol": (0.25, f"{AM}/test_mobilenet_v2_arm.py:96"), "rtol": (1e-3, f"{AP}:468"), "qtol": (1, f"{AM}/test_mobilenet_v2_arm.py:97")}),
    ("arm-u55-mv2", dict(backend="arm", target="fvp://corstone-300/ethos-u55-128", dtype="int8", reference="quantized",
                         model="mobilenet_v2", scale=0.1),
     {"atol": (0.25, f"{AM}/test_mobilenet_v2_arm.py:116"), "rtol": (1e-3, f"{AP}:780"), "qtol": (1, f"{AM}/test_mobilenet_v2_arm.py:117")}),
    ("arm-vgf-bf16-mv2", dict(backend="arm", target="vgf", dtype="bf16", model="mobilenet_v2"),
     {"atol": (0.25, f"{AM}/test_mobilenet_v2_arm.py:207"), "rtol": (0.25, f"{AM}/test_mobilenet_v2_arm.py:208")}),
    ("arm-tosa-fp-bf16-mv2", dict(backend="arm", target="tosa://fp", dtype="bf16", model="mobilenet_v2"),
     {"atol": (6e-2, f"{AM}/test_mobilenet_v2_arm.py:69"), "rtol": (6e-2, f"{AM}/test_mobilenet_v2_arm.py:70")}),
    ("arm-tosa-fp-fp16-deit", dict(backend="arm", target="tosa://fp", dtype="fp16", model="deit_tiny"),
     {"atol": (8e-2, f"{AM}/test_deit_tiny_arm.py:68"), "rtol": (8e-2, f"{AM}/test_deit_tiny_arm.py:68")}),
    ("arm-tosa-int-deit", dict(backend="arm", target="tosa://int", dtype="int8", reference="quantized", model="deit_tiny", scale=0.1),
     {"atol": (1.5, f"{AM}/test_deit_tiny_arm.py:95"), "qtol": (1, f"{AM}/test_deit_tiny_arm.py:96")}),
    ("arm-tosa-int-conformer", dict(backend="arm", target="tosa://int", dtype="int8", reference="quantized", model="conformer", scale=0.1),
     {"atol": (0.45, f"{AM}/test_conformer.py:40"), "rtol": (0.4, f"{AM}/test_conformer.py:41"), "qtol": (1, f"{AP}:469")}),
    ("arm-tosa-int-conv1d", dict(backend="arm", target="tosa://int", dtype="int8", reference="quantized", ops=["conv1d"], scale=0.1),
     {"qtol": (1, "backends/arm/test/ops/test_conv1d.py:325"), "atol": (1e-3, f"{AP}:467")}),
    ("arm-u55-int16-gelu", dict(backend="arm", target="fvp://corstone-300/ethos-u55-128", dtype="int16", reference="quantized",
                                ops=["gelu"], scale=0.001),
     {"qtol": (128, "backends/arm/test/ops/test_gelu.py:195")}),
    ("arm-aarch64-tosa-mv2", dict(backend="arm", target="tosa://int", dtype="int8", reference="quantized", model="mv2", scale=0.1,
                                  host_arch="aarch64"),
     {"atol": (0.25 * 1.1, None)}),
    ("cortex-m-mv2", dict(backend="cortex-m", target="fvp://corstone-300/cortex-m55", dtype="int8", reference="quantized",
                          model="mobilenet_v2", scale=0.1),
     {"qtol": (10, f"{CM}/models/test_mobilenet_v2.py:79"), "top1": (True, f"{CM}/models/test_mobilenet_v2.py:86"),
      "atol": (1e-3, f"{CM}/tester.py:156")}),
    ("cortex-m-mv3", dict(backend="cortex-m", target="fvp://corstone-300/cortex-m55", dtype="int8", reference="quantized",
                          model="mv3", scale=0.1),
     {"qtol": (20, f"{CM}/models/test_mobilenet_v3.py:95"), "top1": (True, f"{CM}/models/test_mobilenet_v3.py:102")}),
    ("cortex-m-conv2d", dict(backend="cortex-m", target="fvp://corstone-300/cortex-m55", dtype="int8", reference="quantized",
                             ops=["conv2d"], scale=0.1),
     {"qtol": (2, f"{CM}/ops/test_conv.py:358"), "rtol": (1e-3, f"{H}:322")}),
    ("cortex-m-dialect-conv2d", dict(backend="cortex-m", target="dialect", dtype="int8", reference="quantized", ops=["conv2d"], scale=0.1),
     {"qtol": (1, f"{CM}/ops/test_conv.py:343")}),
    ("cortex-m-add", dict(backend="cortex-m", target="fvp://corstone-300/cortex-m55", dtype="int8", reference="quantized",
                          ops=["add"], scale=0.1),
     {"qtol": (0, f"{CM}/tester.py:156"), "atol": (1e-3, f"{CM}/tester.py:156")}),
    ("qnn-htp-fp16", dict(backend="qnn", target="htp", dtype="fp16"),
     {"atol": (1e-1, f"{QN}:112"), "rtol": (1e-1, f"{QN}:113"), "nan": ("fail", "backends/qualcomm/tests/utils.py:269-275")}),
    ("qnn-htp-int8", dict(backend="qnn", target="htp", dtype="int8", reference="quantized", scale=0.1),
     {"atol": (1e-1, f"{QN}:3030"), "rtol": (1, f"{QN}:3031"), "qtol": (None, None)}),
    ("qnn-gpu-fp32", dict(backend="qnn", target="adb://x?backend=gpu", dtype="fp32"),
     {"atol": (1e-1, f"{QN}:112"), "rtol": (1e-1, f"{QN}:113")}),
    ("qnn-llama-1b-sqnr", dict(backend="qnn", target="htp", dtype="int16", model="llama3_2-1b_instruct"),
     {"sqnr_min_db": (15, f"{QN}:8775"), "sqnr_strict": (False, f"{QN}:8988"), "sqnr_reference":
      ("reference", "examples/qualcomm/oss_scripts/llama/evaluator/device_evaluator.py:612")}),
    ("vulkan-fp32", dict(backend="vulkan", target="vulkan", dtype="fp32"),
     {"atol": (1e-3, f"{VK}:247"), "rtol": (1e-1, f"{VK}:248"), "nan": ("match", f"{VK}:134")}),
    ("vulkan-fp16", dict(backend="vulkan", target="vulkan", dtype="fp16"),
     {"atol": (1e-2, "backends/vulkan/test/op_tests/utils/gen_correctness_vk.py:40-43"),
      "rtol": (1e-2, "backends/vulkan/test/op_tests/utils/gen_correctness_vk.py:40-43")}),
    ("vulkan-int8", dict(backend="vulkan", target="vulkan", dtype="int8", reference="quantized", scale=0.1),
     {"atol": (1e-2, f"{VK}:2475"), "rtol": (1e-1, f"{VK}:2476")}),
    ("vulkan-floor-divide", dict(backend="vulkan", target="vulkan", dtype="fp32", ops=["floor_divide"]),
     {"atol": (1.001, f"{VK}:465")}),
    ("mlx-fp32-linear", dict(backend="mlx", target="mlx://cpu", dtype="fp32", ops=["linear"]),
     {"rtol": (1e-4, f"{ML}/test_ops.py:1230"), "atol": (1e-4, f"{ML}/test_ops.py:1231")}),
    ("mlx-fp32-gelu", dict(backend="mlx", target="mlx://cpu", dtype="fp32", ops=["gelu"]),
     {"rtol": (1e-5, f"{ML}/test_utils.py:860"), "atol": (1e-5, f"{ML}/test_utils.py:861"),
      "nan": ("fail", f"{ML}/test_utils.py:475"), "cast_float": (True, f"{ML}/test_utils.py:459-462")}),
    ("mlx-bf16-model", dict(backend="mlx", target="mlx://cpu", dtype="bf16"),
     {"atol": (1e-2, f"{ML}/test_utils.py:58"), "rtol": (1e-2, f"{ML}/test_utils.py:58")}),
    ("metal-fp32", dict(backend="metal", target="metal", dtype="fp32"),
     {"atol": (1e-5, f"{MT}:89"), "nan": ("fail", f"{MT}:1198")}),
    ("metal-bf16", dict(backend="metal", target="metal", dtype="bf16"), {"atol": (1e-2, f"{MT}:90"), "rtol": (1e-2, f"{MT}:90")}),
    ("metal-int4-linear", dict(backend="metal", target="metal", dtype="fp32", model="linear_nobias_int4"),
     {"atol": (5e-2, f"{MT}:246"), "rtol": (5e-2, f"{MT}:247")}),
    ("coreml-fp32", dict(backend="coreml", target="coreml", dtype="fp32"),
     {"atol": (1e-2, "backends/apple/coreml/test/test_torch_ops.py:52"), "rtol": (1e-2, "backends/apple/coreml/test/test_torch_ops.py:52")}),
    ("coreml-int8-vs-float", dict(backend="coreml", target="coreml", dtype="int8"),
     {"sqnr_min_db": (20, "backends/apple/coreml/test/test_coreml_recipes.py:62"),
      "sqnr_strict": (True, "backends/apple/coreml/test/test_coreml_recipes.py:70")}),
    ("mps-fp16-linear", dict(backend="mps", target="mps", dtype="fp16", ops=["linear"]),
     {"atol": (5e-2, "backends/apple/mps/test/test_mps_linear.py:28"), "nan": ("fail", "backends/apple/mps/test/test_mps_utils.py:153")}),
    ("nxp-fp32", dict(backend="nxp", target="nxp", dtype="fp32"),
     {"atol": (1e-7, "backends/nxp/tests/model_output_comparator.py:110"),
      "reference_nonzero": (True, "backends/nxp/tests/model_output_comparator.py:119-121")}),
    ("nxp-cifarnet", dict(backend="nxp", target="nxp", dtype="int8", reference="quantized", model="cifarnet", scale=0.1),
     {"mse_max": (1.53e-5, "backends/nxp/tests/generic_tests/test_cifarnet.py:57"), "atol": (None, None)}),
    ("samsung-mv3", dict(backend="samsung", target="enn", dtype="fp16", model="mobilenet_v3"),
     {"atol": (0.07, "backends/samsung/test/models/test_mobilenet_v3.py:32"), "rtol": (0.07, "backends/samsung/test/models/test_mobilenet_v3.py:32")}),
    ("openvino-fp32", dict(backend="openvino", target="openvino", dtype="fp32"),
     {"atol": (1e-3, "backends/openvino/tests/ops/base_openvino_op_test.py:17"), "nan": ("match", "backends/openvino/tests/ops/base_openvino_op_test.py:77-83")}),
    ("cadence-fp32", dict(backend="cadence", target="cadence", dtype="fp32"),
     {"atol": (1e-6, "backends/cadence/aot/tests/test_fusion_ops_passes.py:63"), "rtol": (1e-5, "backends/cadence/aot/tests/test_fusion_ops_passes.py:62")}),
    ("webgpu-softmax", dict(backend="webgpu", target="webgpu", dtype="fp32", ops=["softmax"]),
     {"atol": (1e-6, "backends/webgpu/test/ops/test_softmax.py:93"), "rtol": (1e-5, "backends/webgpu/test/ops/test_softmax.py:94")}),
    ("arm-suite", dict(backend="arm", target="suite", dtype="fp32"),
     {"atol": (1e-1, "backends/test/suite/runner.py:219"), "rtol": (4e-2, "backends/test/suite/runner.py:220")}),
]


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.builtin(BUILTIN_DIR)


def test_the_table_is_big_enough():
    assert len(ROWS) >= 40 and len({r[0] for r in ROWS}) == len(ROWS)
    assert len({r[1]["backend"] for r in ROWS}) >= 14


@pytest.mark.parametrize("name, query, expected", ROWS, ids=[r[0] for r in ROWS])
def test_explain_gives_the_numbers_of_executorchs_test(executorch_src, registry, name, query, expected):
    for key, (value, citation) in expected.items():
        if citation is not None:
            problem = check_value(executorch_src, CitedValue(name, key, value, citation))
            assert problem is None, f"the source no longer says this: {problem}"
    ctx = ToleranceContext(**{"target": query.get("backend", ""), "host_arch": "x86_64", **query})
    crit = explain(ctx, None, registry).criteria
    for key, (value, citation) in expected.items():
        got = getattr(crit, key)
        if isinstance(value, float) and got is not None:
            assert got == pytest.approx(value, rel=1e-12), (key, got)
        else:
            assert got == value, (key, got)
        # the trail's winning entry cites the same line (or its file) for values it states
        if citation is not None and value is not None:
            origin = (crit.trail.get(key) or [{}])[-1].get("origin") or ""
            assert citation.split(":")[0] in origin, (key, origin)
