"""The MLX delegate interpreter (targets/program/) against eager torch.

Small modules per group of op node types are lowered with the real MLXPartitioner
(bundles/backends/mlx.py), run through the program walker with MLX payloads on
the real `mlx` package, and compared with eager torch in the same dtype at the
tolerances of ExecuTorch's MLX op tests (backends/mlx/test/test_utils.py:
f32 1e-5, f16 1e-3, bf16 1e-2; ints and bools exact). Each group also asserts
which MLX node types its graph holds, so a partitioner change that stops
exercising a node is noticed. Zoo models run as whole bundles.
"""

from __future__ import annotations

import numpy as np
import pytest

TOL = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1e-2}


@pytest.fixture(scope="module")
def mx():
    try:
        import mlx.core as mx
    except ImportError as exc:  # a missing mlx is a failure of this lane, never a skip
        pytest.fail(f"the mlx package is required (pip install \"mlx[cpu]\" / bundlerun[apple]): {exc}")
    return mx


def _torch_dtype(dtype: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def _lower(module, inputs: tuple, dtype: str = "fp32") -> tuple[bytes, tuple]:
    """Lower with the bundlerun MLX recipe; returns (pte bytes, inputs in program dtypes)."""
    from bundlerun.bundles.backends.base import LoweringRequest
    from bundlerun.bundles.backends.mlx import lower

    result = lower(LoweringRequest(module.eval(), inputs, [], dtype, "mlx", "mlx://cpu"))
    assert result.info["delegate_calls"] >= 1
    target = _torch_dtype(dtype)
    cast = tuple(x.to(target) if x.is_floating_point() else x for x in inputs)
    return result.program.buffer, cast


def _run(pte: bytes, inputs: tuple, runners=None):
    from bundlerun.targets.program.mlx_delegate import delegate_runners
    from bundlerun.targets.program.walker import ProgramWalker, load_program, tensor_to_numpy

    walker = ProgramWalker(load_program(pte), runners or delegate_runners())
    return walker, walker.run("forward", [tensor_to_numpy(x) for x in inputs])


def _as_float(code: int, arr: np.ndarray) -> np.ndarray:
    import torch

    if code == 15:
        return torch.from_numpy(np.ascontiguousarray(arr)).view(torch.bfloat16).double().numpy()
    return arr.astype(np.float64) if arr.dtype != np.bool_ else arr


def _node_types(pte: bytes) -> set[str]:
    from bundlerun.targets.program.mlx_graph import decode
    from bundlerun.targets.program.walker import load_program

    loaded = load_program(pte)
    return set().union(*(decode(bytes(d.data)).op_names() for d in loaded.program.backend_delegate_data))


def _compare(outputs, reference, tol: float) -> None:
    ref = reference if isinstance(reference, tuple) else (reference,)
    assert len(outputs) == len(ref)
    for i, ((code, actual), r) in enumerate(zip(outputs, ref)):
        r = r.detach()
        expected = r.numpy() if r.dtype.is_floating_point is False and r.dtype.itemsize == 1 else r.double().numpy()
        got = _as_float(code, actual)
        assert got.shape == expected.shape, f"output {i}: shape {got.shape} != {expected.shape}"
        if not r.dtype.is_floating_point:
            np.testing.assert_array_equal(got.astype(expected.dtype), expected, err_msg=f"output {i} ({r.dtype})")
        else:
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol, err_msg=f"output {i} ({r.dtype})")


# ---------------------------------------------------------------- op groups


def _groups():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Fn(nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, *args):
            return self.fn(*args)

    class Conv(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.c1 = nn.Conv1d(3, 4, 3, padding=1)
            self.c2 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
            self.dw = nn.Conv2d(3, 3, 3, groups=3)
            self.t1 = nn.ConvTranspose1d(3, 2, 3, stride=2)
            self.t2 = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1)
            self.c3 = nn.Conv3d(3, 2, 2)
            self.t3 = nn.ConvTranspose3d(3, 2, 2, stride=2)
            self.bn = nn.BatchNorm2d(3)

        def forward(self, x):
            y = x[:, :, 0]
            v = x.unsqueeze(2).expand(-1, -1, 3, -1, -1)
            return (self.c1(y), self.c2(x), self.dw(x), self.t1(y), self.t2(x), self.c3(v), self.t3(v), self.bn(x),
                    F.max_pool2d(x, 2),
                    F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 1))

    class Misc(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = nn.Embedding(10, 4)
            self.lin = nn.Linear(4, 3)
            self.lin2 = nn.Linear(4, 3, bias=False)

        def forward(self, x, idx):
            q = torch.cat([x, x]).reshape(1, 2, 4, 4)
            return (self.emb(idx), self.lin(x), self.lin2(x), torch.bmm(x.unsqueeze(0), x.T.unsqueeze(0)),
                    x[idx % 4], F.scaled_dot_product_attention(q, q, q),
                    F.scaled_dot_product_attention(q, q, q, is_causal=True), torch.arange(6), torch.full((2, 3), 1.5),
                    torch.zeros_like(x), torch.ones_like(x), idx.to(torch.float32), torch.sort(x, 1)[0],
                    torch.argsort(x, 1), torch.topk(x, 2, 1)[0], x.repeat_interleave(2, 0))

    class Index(nn.Module):
        def forward(self, x, i0, i1, src, sidx):
            y = torch.zeros(4, 4)
            return (x[i0, i1], x[:, i1], torch.scatter_add(y, 1, sidx, src), torch.slice_scatter(y, src[:1], 0, 1, 2))

    class DynArange(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(32, 16)

        def forward(self, pos):
            torch._check(pos.numel() == 1)
            p = pos.item()
            torch._check(p >= 0)
            torch._check(p < 20)
            return self.embed(torch.arange(p, p + 4, dtype=torch.long))

    g = torch.Generator().manual_seed(0)
    randn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731

    def unary(x):
        a = x.abs()
        c = x.clamp(-0.9, 0.9)
        return (torch.exp(x), torch.sin(x), torch.cos(x), torch.tan(x), torch.atan(x), torch.sinh(x), torch.cosh(x),
                torch.asinh(x), torch.log(a + 1), torch.log2(a + 1), torch.log10(a + 1), torch.log1p(a), torch.erf(x),
                torch.expm1(x), torch.rsqrt(a + 1), torch.sqrt(a), -x, torch.floor(x), torch.ceil(x), torch.round(x),
                torch.reciprocal(x + 3), torch.sigmoid(x), torch.tanh(x), F.silu(x), torch.trunc(x), torch.sign(x),
                torch.square(x), torch.asin(c), torch.acos(c), torch.atanh(c), torch.acosh(a + 1.5), F.gelu(x),
                F.gelu(x, approximate="tanh"), F.relu(x), F.hardtanh(x), F.leaky_relu(x, 0.1), torch.clamp(x, -0.5, 0.5))

    def binary(a, b):
        pos = b.abs() + 0.5
        return (a + b, a - b, a * b, a / pos, torch.maximum(a, b), torch.minimum(a, b), torch.atan2(a, b),
                torch.pow(a.abs() + 0.5, b), torch.remainder(a, pos), torch.floor_divide(a, pos), torch.logaddexp(a, b),
                torch.where(a > b, a, b), a < b, a <= b, a > b, a >= b, a == b, a != b,
                torch.logical_and(a > 0, b > 0), torch.logical_or(a > 0, b > 0), torch.logical_not(a > 0))

    def reduce(x):
        return (x.sum(1), x.mean(-1, keepdim=True), x.prod(0), x.amax(1), x.amin(0), x.var(1), x.std(1), x.argmax(1),
                x.argmin(0), torch.logsumexp(x, 1), x.sum(), torch.cumsum(x, 1), (x > 0).any(1), (x > 0).all(0))

    def shape(x):
        return (x.unsqueeze(0), x.permute(1, 0, 2), x.reshape(6, 4), x[:, 1:3], x.narrow(2, 1, 2), x.select(1, 2),
                x.repeat(1, 2, 1), torch.roll(x, 1, 2), torch.cat([x, x], 1), F.pad(x, (1, 2)),
                x.unsqueeze(0).expand(2, 2, 3, 4)[1], torch.stack([x, x], 0), x.split(2, 2)[1], torch.flip(x, [2]),
                x.transpose(1, 2).contiguous())

    def bitwise(a, b):
        return (a & b, a | b, a ^ b, ~a)

    def select(x):
        return (torch.topk(x, 2, 1)[1], x.std(1), torch.squeeze(x.unsqueeze(1), 1))

    def norms(x):
        return (F.softmax(x, -1), F.log_softmax(x, -1), F.layer_norm(x, (8,)), F.rms_norm(x, (8,)), torch.tril(x),
                torch.triu(x, 1))

    # name -> (module, inputs, node types the graph must hold, tolerance override)
    return {
        "unary": (Fn(unary), (randn(2, 8),), {"Exp", "Sin", "Cos", "Tan", "Arctan", "Sinh", "Cosh", "Arcsinh", "Log",
                                               "Log2", "Log10", "Log1p", "Erf", "Expm1", "Rsqrt", "Sqrt", "Abs", "Neg",
                                               "Floor", "Ceil", "Round", "Reciprocal", "Sigmoid", "Tanh", "Silu",
                                               "Trunc", "Sign", "Square", "Arcsin", "Arccos", "Arctanh", "Arccosh",
                                               "Gelu", "Clip", "Maximum", "Where"}, None),
        "binary": (Fn(binary), (randn(3, 4), randn(3, 4)), {"Add", "Subtract", "Multiply", "Divide", "Maximum",
                                                            "Minimum", "Atan2", "Power", "Remainder", "FloorDivide",
                                                            "LogAddExp", "Where", "Less", "LessEqual", "Greater",
                                                            "GreaterEqual", "Equal", "NotEqual", "LogicalAnd",
                                                            "LogicalOr", "LogicalNot"}, None),
        "reduce": (Fn(reduce), (randn(4, 6),), {"Sum", "Mean", "Prod", "Max", "Min", "Var", "Argmax", "Argmin",
                                                "LogSumExp", "Cumsum", "Any", "All"}, None),
        "shape": (Fn(shape), (randn(2, 3, 4),), {"ExpandDims", "Transpose", "Reshape", "Slice", "Take", "Tile", "Roll",
                                                 "Concatenate", "Pad", "BroadcastTo", "Stack", "Split", "Flip",
                                                 "Contiguous"}, None),
        # RMSNorm: ExecuTorch's RMSNormTest uses rtol/atol 1e-4 (fast::rms_norm vs torch's reference)
        "norms": (Fn(norms), (randn(2, 8, 8),), {"Softmax", "LogSumExp", "LayerNorm", "RMSNorm", "Tril", "Triu"}, 1e-4),
        "conv": (Conv(), (randn(1, 3, 8, 8),), {"Conv1D", "Conv2D", "Conv3D", "ConvTranspose1D", "ConvTranspose2D",
                                                 "ConvTranspose3D", "Max", "Mean"}, None),
        "misc": (Misc(), (randn(4, 4), torch.tensor([1, 7, 3, 0, 9])), {"Take", "Addmm", "Sdpa", "ARange", "Full",
                                                                       "FullLike", "AsType", "Sort", "Argsort",
                                                                       "Partition", "Repeat"}, None),
        # AdvancedIndexTest in ExecuTorch uses 1e-4
        "index": (Index(), (randn(4, 5), torch.tensor([0, 3, 1]), torch.tensor([4, 2, 0]), randn(4, 4),
                            torch.randint(0, 4, (4, 4), generator=g)), {"Gather", "ScatterAdd", "SliceUpdate"}, 1e-4),
        "dynamic-int": (DynArange(), (torch.tensor([3]),), {"ItemInt", "AddInt", "ARange", "Take"}, None),
        "bitwise": (Fn(bitwise), (torch.randint(-50, 50, (3, 4), dtype=torch.int32, generator=g),
                                  torch.randint(-50, 50, (3, 4), dtype=torch.int32, generator=g)),
                    {"BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseInvert"}, None),
        "select": (Fn(select), (randn(4, 5),), {"ArgPartition", "TakeAlongAxis", "Squeeze"}, None),
    }


GROUPS = ["unary", "binary", "reduce", "shape", "norms", "conv", "misc", "index", "dynamic-int", "bitwise", "select"]
HALF = [("norms", "fp16"), ("conv", "fp16"), ("unary", "bf16"), ("misc", "bf16")]


@pytest.fixture(scope="module")
def groups():
    return _groups()


@pytest.mark.parametrize("name,dtype", [(g, "fp32") for g in GROUPS] + HALF)
def test_op_group_matches_eager_torch(mx, groups, name, dtype):
    import copy

    import torch

    module, inputs, nodes, tol = groups[name]
    pte, cast = _lower(copy.deepcopy(module), inputs, dtype)
    assert nodes <= _node_types(pte), f"{name}: graph lacks {sorted(nodes - _node_types(pte))}"
    _, outputs = _run(pte, cast)
    eager = copy.deepcopy(module).to(_torch_dtype(dtype)).eval()
    with torch.no_grad():
        reference = eager(*cast)
    _compare(outputs, reference, max(TOL[dtype], tol or 0.0) if dtype == "fp32" else TOL[dtype])


def test_dynamic_shape_int_value_ops(mx):
    """A dynamic batch dim: SymSize, FloorDivideInt, ModInt, SubtractInt value slots feed Reshape / Full."""
    import torch
    from executorch.exir import to_edge_transform_and_lower
    from torch.export import Dim

    from bundlerun.bundles.mlx_codegen import ensure_mlx_importable

    ensure_mlx_importable()
    from executorch.backends.mlx import MLXPartitioner

    class Dyn(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            return x.reshape(n // 2, 2 * x.shape[1]) * (n % 3) - (n - 1), torch.ones(n, n).tril()

    x = torch.randn(16, 3)  # the walker binds inputs at the planned (upper-bound) size
    exported = torch.export.export(Dyn(), (x,), dynamic_shapes=({0: Dim("n", min=2, max=8) * 2},), strict=False)
    pte = to_edge_transform_and_lower(exported, partitioner=[MLXPartitioner()]).to_executorch().buffer
    assert {"SymSize", "FloorDivideInt", "ModInt", "SubtractInt", "Full", "Tril"} <= _node_types(pte)
    _, outputs = _run(pte, (x,))
    with torch.no_grad():
        _compare(outputs, Dyn()(x), 1e-5)


def test_quantized_linear_and_dequantize(mx):
    """int4 weight-only (torchao): QuantizedMatmulNode for linear, DequantizeNode for conv."""
    import torch
    import torch.nn as nn
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    torch.manual_seed(0)
    lin = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)).eval()
    quantize_(lin, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    conv = nn.Sequential(nn.Conv2d(32, 16, 3, padding=1, bias=False)).eval()
    quantize_(conv, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
              lambda m, fqn: isinstance(m, nn.Conv2d))
    for module, x, node in ((lin, torch.randn(2, 64), "QuantizedMatmul"), (conv, torch.randn(1, 32, 6, 6), "Dequantize")):
        pte, cast = _lower(module, (x,))
        assert node in _node_types(pte)
        _, outputs = _run(pte, cast)
        with torch.no_grad():
            _compare(outputs, module(x), 1e-4)


def test_mutable_buffer_persists_across_executions(mx):
    """index_copy_ on a registered buffer: IndexCopyNode on an MLX-owned mutable buffer, kept between runs."""
    import torch
    import torch.nn as nn

    class Upd(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("data", torch.zeros(16, 8))

        def forward(self, idx, upd):
            self.data.index_copy_(0, idx, upd)
            return self.data.clone()

    first, second = (torch.tensor([1, 5, 6]), torch.randn(3, 8)), (torch.tensor([2, 5, 9]), torch.randn(3, 8))
    pte, _ = _lower(Upd(), first)
    assert "IndexCopy" in _node_types(pte)
    walker, out1 = _run(pte, first)
    from bundlerun.targets.program.walker import tensor_to_numpy

    out2 = walker.run("forward", [tensor_to_numpy(x) for x in second])
    eager = Upd()
    with torch.no_grad():
        _compare(out1, eager(*first), 0.0)
        _compare(out2, eager(*second), 0.0)
    assert np.count_nonzero(out2[0][1].any(axis=1)) == 5  # rows 1, 2, 5, 6, 9: the first run's rows survived


# ---------------------------------------------------------------- errors


def test_unimplemented_op_is_a_clear_unsupported_op_error(mx, monkeypatch):
    import torch

    from bundlerun.targets.program import mlx_ops
    from bundlerun.targets.program.walker import WalkError

    pte, cast = _lower(torch.nn.Linear(4, 3), (torch.randn(2, 4),))
    monkeypatch.delitem(mlx_ops.HANDLERS, "Addmm")
    with pytest.raises(WalkError) as err:
        _run(pte, cast)
    assert err.value.kind == "missing-operator"
    assert "AddmmNode" in err.value.message


def test_gpu_only_op_names_the_reason(mx, monkeypatch):
    import torch

    from bundlerun.targets.program import mlx_ops
    from bundlerun.targets.program.walker import WalkError

    pte, cast = _lower(torch.nn.Linear(4, 3), (torch.randn(2, 4),))
    monkeypatch.setitem(mlx_ops.UNSUPPORTED, "Addmm", "pretend GPU-only")
    with pytest.raises(WalkError, match="AddmmNode cannot run here: pretend GPU-only") as err:
        _run(pte, cast)
    assert err.value.kind == "missing-operator"


def test_garbage_payload_is_a_backend_error(mx):
    from bundlerun.targets.program.mlx_delegate import MLXDelegateRunner
    from bundlerun.targets.program.walker import WalkError

    runner = MLXDelegateRunner()
    with pytest.raises(WalkError) as err:
        runner.num_outputs(b"\x00" * 8 + b"not an MLX payload")
    assert err.value.kind == "runner-error" and "MLX0" in err.value.message
    with pytest.raises(WalkError) as err:
        runner.num_outputs(b"\x00\x00\x00\x00MLX0" + (10**9).to_bytes(8, "little") + bytes(8))
    assert "outside the payload" in err.value.message


# ---------------------------------------------------------------- zoo bundles


@pytest.mark.parametrize("model", ["mlp", "tiny-cnn"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_zoo_bundle_runs_on_mlx(mx, bundle_cache, model, dtype):
    """Whole bundles built by the builder: every case within the MLX tier of the bundle's expected outputs."""
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.targets.program.mlx_delegate import delegate_runners
    from bundlerun.targets.program.walker import ProgramWalker, load_program

    bundle = read_bundle(bundle_cache(model, dtype, backend="mlx", cases=3, target="mlx://cpu"))
    loaded = load_program(bundle.program)
    assert loaded.delegate_ids == ["MLXBackend"] and loaded.named_data
    walker = ProgramWalker(loaded, delegate_runners())
    worst = 0.0
    for case in bundle.suite("forward").test_cases:
        outputs = walker.run("forward", [v.to_array() for v in case.inputs])
        for (code, actual), expected in zip(outputs, case.expected_outputs):
            want = expected.to_array()
            assert actual.dtype == want.dtype and actual.shape == want.shape
            err = np.abs(actual.astype(np.float64) - want.astype(np.float64))
            np.testing.assert_allclose(actual.astype(np.float64), want.astype(np.float64), rtol=TOL[dtype], atol=TOL[dtype])
            worst = max(worst, float(err.max()))
    assert worst < TOL[dtype]
