"""tosa://int and tosa://fp for real: bundles built with the Arm recipe, the
program walked in a child process, TOSA delegates on tosa_reference_model.

Numerics are checked against the eager models: INT against the quantized
reference (within one quantization step) and the fp32 model (SQNR), FP against
the fp32 model (tight atol). Unsupported ops/backends and Ethos-U bundles must
fail clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite, read_bundle, write_bundle
from bundlerun.bundles.errors import TargetError
from bundlerun.targets import lowering_info, open_target
from bundlerun.targets.base import CaseStatus, RunOptions, expected_layout


def _run(url: str, bundle_path: Path, work: Path):
    bundle = read_bundle(bundle_path)
    target = open_target(url)
    return bundle, target.run(bundle, bundle_path, RunOptions(work_dir=work, case_timeout_s=120, setup_timeout_s=300))


def _sqnr_db(actual: np.ndarray, reference: np.ndarray) -> float:
    noise = np.linalg.norm(actual.astype(np.float64) - reference)
    return float(20 * np.log10(np.linalg.norm(reference) / max(noise, 1e-30)))


def _eager(model_name: str, bundle: Bundle, case: int) -> np.ndarray:
    import torch

    from bundlerun.bundles.zoo import ZOO

    module = ZOO[model_name].build()
    inputs = [torch.from_numpy(v.to_array().copy()) for v in bundle.suite("forward").test_cases[case].inputs]
    with torch.no_grad():
        return module(*inputs).numpy().astype(np.float64)


def _assert_all_ok(bundle: Bundle, run) -> None:
    assert [c.status for c in run.cases] == [CaseStatus.OK] * bundle.num_cases, [c.error for c in run.cases]
    for case in run.cases:
        layout = expected_layout(bundle, case.method, case.case_index)
        assert [(o.scalar_type, o.shape) for o in case.outputs] == layout


# --------------------------------------------------------------------------- INT


@pytest.mark.parametrize("model", ["tiny-cnn", pytest.param("tiny-gru", marks=pytest.mark.slow)])
def test_int_matches_quantized_reference_and_float_model(bundle_cache, tmp_path, model):
    """tiny-gru: two TOSA partitions with fp32 aten ops (addmm, split_with_sizes_copy,
    sigmoid, tanh) between them on torch kernels."""
    path = bundle_cache(model, dtype="int8", backend="arm", cases=3, target="tosa://int", reference="quantized")
    bundle, run = _run("tosa://int", path, tmp_path)
    _assert_all_ok(bundle, run)
    assert run.info["tosa_specs"] == ["TOSA-1.0+INT"]
    scale = bundle.manifest.methods["forward"].outputs[0].criteria.scale
    assert scale and scale > 0
    for case in run.cases:
        actual = case.outputs[0].to_array().astype(np.float64)
        quantized_ref = bundle.suite("forward").test_cases[case.case_index].expected_outputs[0].to_array()
        # Integer TOSA vs the fake-quantized eager graph: at most one int8 step apart.
        assert np.abs(actual - quantized_ref).max() <= 1.01 * scale
        assert _sqnr_db(actual, _eager(model, bundle, case.case_index)) > 20.0
        assert case.elapsed_s is not None and case.elapsed_s > 0


# --------------------------------------------------------------------------- FP


def test_fp_matches_float_model(bundle_cache, tmp_path):
    path = bundle_cache("tiny-cnn", dtype="fp32", backend="arm", cases=3, target="tosa://fp")
    bundle, run = _run("tosa://fp", path, tmp_path)
    _assert_all_ok(bundle, run)
    assert run.info["tosa_specs"] == ["TOSA-1.0+FP"]
    for case in run.cases:
        actual = case.outputs[0].to_array()
        assert actual.dtype == np.float32
        eager = _eager("tiny-cnn", bundle, case.case_index)
        np.testing.assert_allclose(actual, eager, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- what it cannot run


def _custom_op_bundle(tmp_path: Path) -> Path:
    """linear -> a custom op -> linear, TOSA FP: the custom op stays outside the
    delegate and has no implementation in the worker process."""
    import torch

    from bundlerun.bundles.backends import arm
    from bundlerun.bundles.backends.base import LoweringRequest

    lib = torch.library.Library("bundlerun_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.define("twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("twice.out", lambda x, out: out.copy_(x * 2), "CompositeExplicitAutograd")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.b(torch.ops.bundlerun_test.twice(self.a(x)))

    torch.manual_seed(0)
    x = torch.randn(1, 4)
    result = arm.lower(LoweringRequest(Net().eval(), (x,), [], "fp32", "arm", "tosa://fp", target_info=lowering_info("tosa://fp")))
    case = BundledTestCase([BundledValue.from_array(x.numpy())], [BundledValue.from_array(np.zeros((1, 3), np.float32))])
    bundle = Bundle(program=bytes(result.program.buffer), method_test_suites=[MethodTestSuite("forward", [case, case])])
    return write_bundle(bundle, tmp_path / "custom-op.bpte")


def test_unsupported_op_is_a_per_case_error_naming_it(tmp_path):
    path = _custom_op_bundle(tmp_path)
    bundle, run = _run("tosa://fp", path, tmp_path / "work")
    assert len(run.cases) == 2
    for case in run.cases:
        assert case.status is CaseStatus.ERROR
        assert case.error_kind == "missing-operator"
        assert "bundlerun_test::twice.out" in case.error


def test_other_delegate_is_refused_naming_the_backend(bundle_cache):
    """In-process (the worker path for per-case error kinds is covered above)."""
    from bundlerun.targets.program.walker import ProgramWalker, WalkError, load_program
    from bundlerun.targets.tosa import TosaTarget
    from bundlerun.targets.program.tosa_delegate import delegate_runners

    path = bundle_cache("mlp", dtype="fp32", backend="xnnpack", cases=2, target="host://xnnpack")
    bundle = read_bundle(path)
    assert TosaTarget("tosa://fp", "fp").preflight(bundle)["unsupported_backends"] == ["XnnpackBackend"]
    walker = ProgramWalker(load_program(bundle.program), delegate_runners())
    with pytest.raises(WalkError, match="XnnpackBackend") as info:
        walker.run("forward", [bundle.suite("forward").test_cases[0].inputs[0].to_array()])
    assert info.value.kind == "missing-backend"


@pytest.mark.parametrize("model, dtype", [("tiny-cnn", "fp32"), ("tiny-transformer", "int8"), ("tiny-gru", "fp32")])
def test_walker_matches_the_executorch_runtime_on_a_portable_program(bundle_cache, model, dtype):
    """The kernels outside a delegate: the walker must agree with the real
    runtime (pybindings, portable kernels). tiny-cnn: multi-output ops
    (batch norm, max_pool2d_with_indices) and a flatten that exists only as
    shared planned memory; tiny-transformer int8: q/dq chains, bmm, softmax;
    tiny-gru: split_with_sizes_copy into a tensor list."""
    import torch
    from executorch.extension.pybindings import portable_lib

    from bundlerun.targets.program.walker import ProgramWalker, load_program

    path = bundle_cache(model, dtype=dtype, backend="portable", cases=2, target="host://portable")
    bundle = read_bundle(path)
    walker = ProgramWalker(load_program(bundle.program), {})
    module = portable_lib._load_for_executorch_from_buffer(bundle.program)
    for case in bundle.suite("forward").test_cases:
        inputs = [v.to_array() for v in case.inputs]
        (code, ours), = walker.run("forward", inputs)
        (theirs,) = module.run_method("forward", [torch.from_numpy(a.copy()) for a in inputs])
        assert code == 6 and ours.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-5)


def test_ethos_u_bundle_is_refused_with_a_hint(bundle_cache, tmp_path):
    path = bundle_cache("mlp", dtype="int8", backend="arm", cases=1, target="fvp://corstone-300/ethos-u55-128")
    bundle = read_bundle(path)
    with pytest.raises(TargetError, match=r"Ethos-U.*--target tosa://int"):
        open_target("tosa://int").run(bundle, path, RunOptions(work_dir=tmp_path))
    assert not list(tmp_path.glob("tosa-runtime-*.log")), "no worker may start for a bundle it cannot run"


def test_unknown_profile():
    with pytest.raises(TargetError, match="tosa://int or tosa://fp"):
        open_target("tosa://int16")


def test_cli_validate_on_tosa_fp(cli, tmp_path):
    """The user path end to end: build with the arm recipe, run on tosa://fp, judge."""
    import json

    proc = cli("validate", "mlp", "--target", "tosa://fp", "--dtype", "fp32", "--cases", "2",
               "--report", str(tmp_path), "--no-history")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "mlp-fp32" / "report.json").read_text())
    assert report["summary"]["verdict"] == "PASS" and report["summary"]["counts"]["PASS"] == 2
    assert report["target"]["url"] == "tosa://fp"
    assert report["bundle"]["backend"] == "arm"


def test_delegate_memory_layout_follows_dim_order():
    """A delegate sees memory: channels-last values are handed over as NHWC and
    read back from NHWC (ExecuTorch's dim_order semantics)."""
    import torch

    from bundlerun.targets.program.walker import _from_physical, _to_physical

    logical = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    physical = _to_physical(logical, [0, 2, 3, 1])
    assert physical.shape == (2, 4, 5, 3)
    assert torch.equal(physical, logical.permute(0, 2, 3, 1))
    assert torch.equal(_from_physical(physical.reshape(-1), [2, 3, 4, 5], [0, 2, 3, 1]), logical)
    assert torch.equal(_from_physical(logical.reshape(-1), [2, 3, 4, 5], [0, 1, 2, 3]), logical)


def test_read_delegates_rejects_garbage():
    from bundlerun.targets.program.walker import WalkError, read_delegates

    with pytest.raises(WalkError, match="not an ExecuTorch program"):
        read_delegates(b"\x00" * 64)
