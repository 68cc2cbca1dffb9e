"""Cortex-M int8 lowering (bundles/backends/arm.py: _lower_cortex_m) of zoo models, checked
against what ExecuTorch's arm_executor_runner can actually run: every operator of the
program must have a kernel (portable, cortex_m or in the default QEMU runner's op list),
convolutions must be CMSIS-NN ones (which need channels_last tensors), and an image model's
program takes channels_last inputs, as ExecuTorch's Cortex-M tests export them
(backends/cortex_m/test/models/test_resnet8.py:38), with the bundle storing each input's bytes in
that dim order (set_input copies bytes without looking at dim_order, runtime/executor/method.cpp:1250)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bundlerun.bundles.backends import arm
from bundlerun.targets import lowering_info
from bundlerun.bundles.errors import BuildError

REPO = Path(__file__).resolve().parents[1]
ZOO_OPS = REPO / "firmware_scripts" / "arm" / "qemu" / "zoo_ops.txt"
TARGET = "qemu://mps3-an547"


def _kernel_ops() -> set[str]:
    """Operators with a kernel: portable functions.yaml + cortex_m operators.yaml of the installed
    executorch (the same lists the runner is built from; the pinned runtime has no *_nhwc
    cortex_m variants, so those are left out)."""
    import executorch

    root = Path(next(iter(executorch.__path__)))
    portable = (root / "kernels" / "portable" / "functions.yaml").read_text()
    cortex_m = (root / "backends" / "cortex_m" / "ops" / "operators.yaml").read_text()
    ops = {f"aten::{m}" for m in re.findall(r"^- op: *(\S+)", portable, re.M)}
    ops |= set(re.findall(r"^- func: *(\w+::[\w.]+)\(", portable, re.M))
    ops |= {o for o in re.findall(r"^- func: *(\w+::[\w.]+)\(", cortex_m, re.M) if "_nhwc" not in o}
    assert "aten::addmm.out" in ops and "cortex_m::quantized_conv2d.out" in ops  # the parse worked
    assert "aten::linear.out" not in ops  # the kernel tiny-gru used to need
    return ops


def _zoo_ops() -> set[str]:
    return {line.strip() for line in ZOO_OPS.read_text().splitlines() if line.strip() and not line.startswith("#")}


def _program(bundle_path: Path):
    from executorch.exir._serialize._program import deserialize_pte_binary

    from bundlerun.bundles.bpte import read_bundle

    pte = deserialize_pte_binary(read_bundle(bundle_path).program)
    return getattr(pte, "program", pte)


def _ops(program) -> set[str]:
    return {f"{op.name}.{op.overload}" if op.overload else op.name for plan in program.execution_plan for op in plan.operators}


def _input_dim_orders(program) -> list[list[int]]:
    plan = program.execution_plan[0]
    return [list(plan.values[i].val.dim_order) for i in plan.inputs]


def _tensor_dim_orders(program) -> list[list[int]]:
    plan = program.execution_plan[0]
    return [list(v.val.dim_order) for v in plan.values if hasattr(v.val, "dim_order")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from bundlerun.bundles.builder import BuildRequest, build_bundle
    from bundlerun.bundles.bpte import read_bundle

    out = {}
    folder = tmp_path_factory.mktemp("cortex_m")
    for name in ("tiny-cnn", "tiny-gru"):
        path = folder / f"{name}.bpte"
        result = build_bundle(
            BuildRequest(model=name, output=path, backend="cortex-m", target=TARGET, target_info=lowering_info(TARGET), dtype="int8",
                         cases=2, calibration_cases=16)
        )
        assert path.is_file()
        out[name] = (path, result, _program(path), read_bundle(path))
    return out


@pytest.mark.parametrize("name", ["tiny-cnn", "tiny-gru"])
def test_every_operator_has_a_kernel(built, name):
    _, _, program, _ = built[name]
    ops = _ops(program)
    assert ops, "the program has no operators"
    assert not ops - _kernel_ops(), f"operators without a portable/cortex_m kernel: {sorted(ops - _kernel_ops())}"
    assert not ops - _zoo_ops(), f"not in zoo_ops.txt (the default QEMU runner): {sorted(ops - _zoo_ops())}"
    assert "aten::linear.out" not in ops


def test_tiny_cnn_convolutions_are_cmsis_nn(built):
    path, result, program, _ = built["tiny-cnn"]
    ops = _ops(program)
    assert "aten::convolution.out" not in ops, "a convolution stayed in float"
    assert "cortex_m::quantized_conv2d.out" in ops
    assert {"cortex_m::quantized_max_pool2d.out", "cortex_m::quantized_avg_pool2d.out"} <= ops
    # The NHWC layout comes in with the input (no dim-order clone at the input any more), and the
    # intermediates stay channels_last.
    assert "dim_order_ops::_clone_dim_order.out" not in ops
    assert [0, 2, 3, 1] in _tensor_dim_orders(program)
    info = result.manifest.build.lowering
    assert "quantized_conv2d" in info["cortex_m_kernels"]
    assert info["layout"].startswith("channels_last")


def test_tiny_cnn_bundled_input_is_in_the_programs_dim_order(built):
    """The program takes its input channels_last (dim order 0,2,3,1); each bundled input records that
    dim order and holds its bytes in it (NHWC), while reading it back gives the logical NCHW case the
    reference was computed on."""
    import numpy as np

    from bundlerun.bundles.inputs import generate_cases
    from bundlerun.bundles.model_source import resolve_model

    _, _, program, bundle = built["tiny-cnn"]
    assert _input_dim_orders(program) == [[0, 2, 3, 1]]
    model = resolve_model("tiny-cnn")
    cases = generate_cases([(s.shape, s.dtype, s.dist) for s in model.inputs], 2, 0, "cases")
    for k, case in enumerate(bundle.method_test_suites[0].test_cases):
        stored = case.inputs[0]
        assert list(stored.sizes) == [1, 3, 32, 32]
        assert list(stored.dim_order) == [0, 2, 3, 1]
        logical = np.asarray(cases[k][0], dtype=np.float32)
        assert stored.data == np.ascontiguousarray(logical.transpose(0, 2, 3, 1)).tobytes()
        assert stored.data != logical.tobytes()  # 3 channels: the two layouts differ
        np.testing.assert_array_equal(stored.to_array(), logical)


def test_tiny_cnn_stores_each_conv_weight_once(built):
    """The recipe hands the Cortex-M passes channels_last weights (bundles/backends/arm.py
    _channels_last_model): with OIHW weights the passes add each conv weight again as OHWI and the
    program carries both (et:resnet8: 173,368 bytes against 99,208). A second copy is a constant
    buffer holding the same bytes in another order."""
    _, _, program, _ = built["tiny-cnn"]
    seen: dict[bytes, int] = {}
    for i, buf in enumerate(program.constant_buffer):
        data = bytes(buf.storage)
        if len(data) >= 64:  # scales, zero points and small biases may repeat by value
            key = bytes(sorted(data))
            assert key not in seen, f"constant buffers {seen[key]} and {i} ({len(data)} bytes) are one tensor reordered"
            seen[key] = i
    assert len(seen) >= 2  # the convolutions' weights were looked at


def test_tiny_gru_float_linears_become_addmm(built):
    _, result, program, _ = built["tiny-gru"]
    ops = _ops(program)
    assert "aten::addmm.out" in ops and "aten::permute_copy.out" in ops
    assert "cortex_m::quantized_linear.out" in ops  # the head is still quantized
    assert _input_dim_orders(program) == [[0, 1, 2]]
    # What runs outside cortex_m:: kernels is named plainly, not as EdgeOpOverload reprs.
    portable = result.manifest.build.lowering["undelegated_ops"]
    assert "aten::addmm" in portable and not any("EdgeOpOverload" in o or o.startswith("cortex_m") for o in portable)


def test_decompose_float_linear_pass_rank3_matches_eager():
    import torch
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import to_edge

    torch.manual_seed(0)
    for bias in (True, False):
        model = torch.nn.Linear(8, 5, bias=bias).eval()
        x = torch.randn(2, 3, 8)
        edge = to_edge(torch.export.export(model, (x,), strict=False), compile_config=cortex_m_edge_compile_config())
        before = {str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"}
        assert any("aten.linear" in t for t in before)  # preserved by the Cortex-M edge config
        edge = edge.transform([arm._decompose_float_linear_pass()])
        after = {str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"}
        assert not any("aten.linear" in t for t in after)
        assert any(("aten.addmm" if bias else "aten.mm.") in t for t in after)
        assert torch.allclose(edge.exported_program().module()(x), model(x), atol=1e-6)


def test_tiny_transformer_failure_names_the_pass_and_operator(tmp_path):
    from bundlerun.bundles.builder import BuildRequest, build_bundle

    with pytest.raises(BuildError) as err:
        build_bundle(BuildRequest(model="tiny-transformer", output=tmp_path / "t.bpte", backend="cortex-m",
                                  target=TARGET, target_info=lowering_info(TARGET), dtype="int8", cases=1, calibration_cases=4))
    message = str(err.value)
    assert "\n" not in message
    assert "ReplaceScalarWithTensorArgPass" in message and "aten::bmm" in message
    assert "FoldAndAnnotateQParamsPass" in message
