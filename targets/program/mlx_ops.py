"""MLX op nodes executed with the `mlx` Python package, one handler per node type.

Each handler mirrors `exec_*` in ExecuTorch's `backends/mlx/runtime/MLXInterpreter.h`
(the reference for semantics): same mlx call, same scalar dtypes (e.g. GELU's
constants are arrays of the input dtype), same int32 value slots with overflow
checks. `HANDLERS` maps the node name without "Node" to its handler;
`UNSUPPORTED` names the nodes that cannot run here, with the reason.

Tensor ids: constants | inputs | outputs | mutable buffers | temps (one space);
constants are read-only outside the init chain, mutable buffers persist across
executions, everything else is per execution.

Over 500 lines on purpose: a table of small handlers, one per MLX node type, in the order of
MLXInterpreter.h; split, one table would live in two places.
"""

from __future__ import annotations

from typing import Any, Callable

from bundlerun.targets.program.walker import WalkError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

UNSUPPORTED: dict[str, str] = {
    "MetalKernel": "custom Metal kernels need a GPU (and are disabled in the stock MLX runtime)",
    "UpdateAndAttend": "needs the MLX runtime's off-graph KV cache (MLXCache), which a Python run does not have",
    "RandomBits": "mlx's Python API has no random.bits (the C++ runtime calls mlx::core::random::bits)",
}


def _dtype(mx, code: int):
    table = {5: mx.float16, 6: mx.float32, 15: mx.bfloat16, 3: mx.int32, 2: mx.int16, 4: mx.int64,
             28: mx.uint32, 0: mx.uint8, 11: mx.bool_, 1: mx.int8}
    try:
        return table[int(code)]
    except KeyError:
        raise WalkError("missing-operator", f"MLX: unsupported ScalarType {code}") from None


class State:
    """Tensor and value slots of one MLX graph (ExecutionState)."""

    def __init__(self, mx, graph, constants: list[Any], mutable: dict[int, Any]) -> None:
        self.mx = mx
        self.graph = graph
        self.constants = constants
        self.mutable = mutable
        self.tensors: dict[int, Any] = {}
        self.values: dict[int, Any] = {}
        self.is_init = False
        self.nc = graph.num_constants
        self.out_end = graph.num_constants + graph.num_inputs + graph.num_outputs
        self.mut_end = self.out_end + graph.num_mutable

    def dtype(self, code: int):
        return _dtype(self.mx, code)

    def t(self, tid: int):
        if tid < self.nc:
            return self.constants[tid]
        store = self.mutable if self.out_end <= tid < self.mut_end else self.tensors
        try:
            return store[tid]
        except KeyError:
            raise WalkError("runner-error", f"MLX: tensor {tid} read before it was written") from None

    def set(self, tid: int, arr) -> None:
        if tid < self.nc:
            if not self.is_init:
                raise WalkError("runner-error", f"MLX: write to constant tensor {tid} outside the init chain")
            self.constants[tid] = arr
        elif self.out_end <= tid < self.mut_end:
            self.mutable[tid] = arr
        else:
            self.tensors[tid] = arr

    def v(self, vid: int):
        try:
            return self.values[vid]
        except KeyError:
            raise WalkError("runner-error", f"MLX: value slot {vid} read before it was written") from None

    def set_v(self, vid: int, value) -> None:
        self.values[vid] = value

    def i(self, ref) -> int:
        """resolve_int: literals clamp to int32, Vids are int32 slots."""
        kind, value = ref
        if kind == "lit":
            return max(INT32_MIN, min(INT32_MAX, int(value)))
        return int(self.v(value))

    def ints(self, refs) -> list[int]:
        return [self.i(r) for r in refs]

    def fl(self, ref) -> float:
        kind, value = ref
        return float(value) if kind == "lit" else float(self.v(value))


def _int32(op: str, value: int) -> int:
    if not INT32_MIN <= value <= INT32_MAX:
        raise WalkError("runner-error", f"MLX: {op}: overflow")
    return value


def _norm_axis(axis: int, rank: int, op: str) -> int:
    if axis < -rank or axis >= rank:
        raise WalkError("runner-error", f"MLX: {op}: axis out of range")
    return axis + rank if axis < 0 else axis


def _axes(f: dict) -> list[int] | None:
    axes = f.get("axes") or []
    return list(axes) if axes else None


# ---------------------------------------------------------------- element-wise

_UNARY = {
    "Floor": "floor", "Ceil": "ceil", "Square": "square", "Exp": "exp", "Sin": "sin", "Cos": "cos", "Tan": "tan",
    "Arcsin": "arcsin", "Arccos": "arccos", "Arctan": "arctan", "Sinh": "sinh", "Cosh": "cosh",
    "Arcsinh": "arcsinh", "Arccosh": "arccosh", "Arctanh": "arctanh", "Log2": "log2", "Log10": "log10",
    "Log1p": "log1p", "Erf": "erf", "Expm1": "expm1", "Reciprocal": "reciprocal", "Sqrt": "sqrt", "Abs": "abs",
    "Neg": "negative", "Rsqrt": "rsqrt", "Log": "log", "Sigmoid": "sigmoid", "Tanh": "tanh",
    "LogicalNot": "logical_not", "BitwiseInvert": "bitwise_invert", "Sign": "sign", "Trunc": "trunc",
}
_BINARY = {
    "Add": "add", "Multiply": "multiply", "Divide": "divide", "Subtract": "subtract", "Maximum": "maximum",
    "Minimum": "minimum", "Less": "less", "LessEqual": "less_equal", "Greater": "greater",
    "GreaterEqual": "greater_equal", "Equal": "equal", "NotEqual": "not_equal", "LogicalAnd": "logical_and",
    "LogicalOr": "logical_or", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
    "Atan2": "arctan2", "LogAddExp": "logaddexp", "Remainder": "remainder", "Power": "power",
}
_REDUCE = {"Sum": "sum", "Mean": "mean", "Prod": "prod", "Max": "max", "Min": "min", "Median": "median",
           "Any": "any", "All": "all"}
_INT_ARITH = {"AddInt": lambda a, b: a + b, "SubtractInt": lambda a, b: a - b, "MultiplyInt": lambda a, b: a * b}


def _unary(fn: str):
    return lambda st, f: st.set(f["out"], getattr(st.mx, fn)(st.t(f["x"])))


def _binary(fn: str):
    return lambda st, f: st.set(f["out"], getattr(st.mx, fn)(st.t(f["a"]), st.t(f["b"])))


def _reduce(fn: str):
    def run(st: State, f: dict) -> None:
        st.set(f["out"], getattr(st.mx, fn)(st.t(f["x"]), axis=_axes(f), keepdims=bool(f["keepdims"])))

    return run


def _int_arith(name: str, fn: Callable[[int, int], int]):
    return lambda st, f: st.set_v(f["out"], _int32(name, fn(st.i(f["a"]), st.i(f["b"]))))


def _floor_divide_int(st: State, f: dict) -> None:
    a, b = st.i(f["a"]), st.i(f["b"])
    if b == 0:
        raise WalkError("runner-error", "MLX: floor_divide_int: division by zero")
    if a == INT32_MIN and b == -1:
        raise WalkError("runner-error", "MLX: floor_divide_int: overflow (INT32_MIN / -1)")
    st.set_v(f["out"], a // b)  # Python floors, like the C++ adjusted truncation


def _mod_int(st: State, f: dict) -> None:
    a, b = st.i(f["a"]), st.i(f["b"])
    if b == 0:
        raise WalkError("runner-error", "MLX: mod_int: division by zero")
    st.set_v(f["out"], a % b)  # Python's sign follows b, like the C++ adjusted remainder


def _gelu(st: State, f: dict) -> None:
    mx, x = st.mx, st.t(f["x"])
    c = lambda v: mx.array(v, dtype=x.dtype)  # noqa: E731 - scalar of the input dtype, as in C++
    if f["approximate"] == "tanh":
        inner = mx.multiply(c(0.7978845608), mx.add(x, mx.multiply(c(0.044715), mx.multiply(x, mx.multiply(x, x)))))
        out = mx.multiply(c(0.5), mx.multiply(x, mx.add(c(1.0), mx.tanh(inner))))
    else:
        out = mx.multiply(c(0.5), mx.multiply(x, mx.add(c(1.0), mx.erf(mx.multiply(c(0.7071067812), x)))))
    st.set(f["out"], out)


def _silu(st: State, f: dict) -> None:
    x = st.t(f["x"])
    st.set(f["out"], st.mx.multiply(x, st.mx.sigmoid(x)))


def _floor_divide(st: State, f: dict) -> None:
    mx, a, b = st.mx, st.t(f["a"]), st.t(f["b"])
    if mx.issubdtype(a.dtype, mx.inexact):
        st.set(f["out"], mx.floor_divide(a, b))
        return
    zero = mx.array(0, dtype=a.dtype)
    adjust = mx.logical_and(mx.not_equal(mx.remainder(a, b), zero), mx.not_equal(mx.less(a, zero), mx.less(b, zero)))
    st.set(f["out"], mx.subtract(mx.divide(a, b), adjust.astype(a.dtype)))


def _round(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.round(st.t(f["x"]), int(f["decimals"])))


def _clip(st: State, f: dict) -> None:
    lo = st.t(f["a_min"]) if f["a_min"] is not None else None
    hi = st.t(f["a_max"]) if f["a_max"] is not None else None
    st.set(f["out"], st.mx.clip(st.t(f["x"]), lo, hi))


def _where(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.where(st.t(f["condition"]), st.t(f["x"]), st.t(f["y"])))


# ---------------------------------------------------------------- linear algebra, nn


def _addmm(st: State, f: dict) -> None:
    mx = st.mx
    m1, m2 = st.t(f["mat1"]), st.t(f["mat2"])
    if f["bias"] is not None:
        out = mx.addmm(st.t(f["bias"]), m1, m2, alpha=float(f["alpha"]), beta=float(f["beta"]))
    else:
        out = mx.matmul(m1, m2)
    st.set(f["out"], out)


def _conv(nd: int, transpose: bool):
    names = {1: [""], 2: ["_h", "_w"], 3: ["_d", "_h", "_w"]}[nd]

    def arg(f: dict, key: str):
        vals = tuple(int(f[key + s]) for s in names)
        return vals[0] if nd == 1 else vals

    def run(st: State, f: dict) -> None:
        mx = st.mx
        x, w = st.t(f["x"]), st.t(f["w"])
        stride, padding, dilation = arg(f, "stride"), arg(f, "padding"), arg(f, "dilation")
        fn = getattr(mx, f"conv_transpose{nd}d" if transpose else f"conv{nd}d")
        if transpose:
            out = fn(x, w, stride, padding, dilation, arg(f, "output_padding"), int(f["groups"]))
        else:
            out = fn(x, w, stride, padding, dilation, int(f["groups"]))
        st.set(f["out"], out)

    return run


def _layer_norm(st: State, f: dict) -> None:
    w = st.t(f["weight"]) if f["weight"] is not None else None
    b = st.t(f["bias"]) if f["bias"] is not None else None
    st.set(f["out"], st.mx.fast.layer_norm(st.t(f["x"]), w, b, float(f["eps"])))


def _rms_norm(st: State, f: dict) -> None:
    w = st.t(f["weight"]) if f["weight"] is not None else None
    st.set(f["out"], st.mx.fast.rms_norm(st.t(f["x"]), w, float(f["eps"])))


def _rope(st: State, f: dict) -> None:
    freqs = st.t(f["freqs"]) if f["freqs"] is not None else None
    base = None if freqs is not None else float(f["base"])
    kind, idx = f["offset"]
    offset = int(st.v(idx)) if kind == "vid" else st.t(idx)
    st.set(f["out"], st.mx.fast.rope(st.t(f["x"]), int(f["dims"]), traditional=bool(f["traditional"]), base=base,
                                     scale=float(f["scale"]), offset=offset, freqs=freqs))


def _sdpa(st: State, f: dict) -> None:
    mx = st.mx
    q, k, v = st.t(f["q"]), st.t(f["k"]), st.t(f["v"])
    mask = None
    if f["mask"] is not None:
        mask = st.t(f["mask"])
        if mask.dtype != mx.bool_ and mask.dtype != q.dtype:
            mask = mask.astype(q.dtype)
    if f["causal"]:
        mask = "causal" if mask is None else mask  # C++ passes mode "causal" plus the array; MLX rejects both
    st.set(f["out"], mx.fast.scaled_dot_product_attention(q, k, v, scale=float(f["scale"]), mask=mask))


def _softmax(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.softmax(st.t(f["x"]), axis=int(f["axis"]), precise=bool(f["precise"])))


def _logsumexp(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.logsumexp(st.t(f["x"]), axis=list(f["axes"] or []), keepdims=bool(f["keepdims"])))


def _var_std(fn: str):
    def run(st: State, f: dict) -> None:
        st.set(f["out"], getattr(st.mx, fn)(st.t(f["x"]), axis=_axes(f), keepdims=bool(f["keepdims"]), ddof=int(f["ddof"])))

    return run


def _arg_reduce(fn: str):
    return lambda st, f: st.set(f["out"], getattr(st.mx, fn)(st.t(f["x"]), axis=int(f["axis"]), keepdims=bool(f["keepdims"])))


def _cumsum(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.cumsum(st.t(f["x"]), axis=int(f["axis"]), reverse=bool(f["reverse"]), inclusive=bool(f["inclusive"])))


def _quantized_matmul(st: State, f: dict) -> None:
    biases = st.t(f["biases"]) if f["biases"] is not None else None
    st.set(f["out"], st.mx.quantized_matmul(st.t(f["x"]), st.t(f["w"]), st.t(f["scales"]), biases,
                                            transpose=bool(f["transpose"]), group_size=int(f["group_size"]),
                                            bits=int(f["bits"]), mode=f["mode"]))


def _dequantize(st: State, f: dict) -> None:
    biases = st.t(f["biases"]) if f["biases"] is not None else None
    gscale = st.t(f["global_scale"]) if f["global_scale"] is not None else None
    dtype = st.dtype(f["dtype"]) if f["dtype"] is not None else None
    st.set(f["out"], st.mx.dequantize(st.t(f["w"]), st.t(f["scales"]), biases, group_size=int(f["group_size"]),
                                      bits=int(f["bits"]), mode=f["mode"], global_scale=gscale, dtype=dtype))


def _sorted_flag(st: State, f: dict) -> bool:
    flag = f.get("sorted_indices_flag")
    return bool(st.i(flag) != 0) if flag is not None else bool(f["sorted_indices"])


def _gather_mm(st: State, f: dict) -> None:
    lhs = st.t(f["lhs_indices"]) if f["lhs_indices"] is not None else None
    rhs = st.t(f["rhs_indices"]) if f["rhs_indices"] is not None else None
    st.set(f["out"], st.mx.gather_mm(st.t(f["a"]), st.t(f["b"]), lhs, rhs, sorted_indices=_sorted_flag(st, f)))


def _gather_qmm(st: State, f: dict) -> None:
    opt = lambda key: st.t(f[key]) if f[key] is not None else None  # noqa: E731
    st.set(f["out"], st.mx.gather_qmm(st.t(f["x"]), st.t(f["w"]), st.t(f["scales"]), opt("biases"), opt("lhs_indices"),
                                      opt("rhs_indices"), transpose=bool(f["transpose"]), group_size=int(f["group_size"]),
                                      bits=int(f["bits"]), mode=f["mode"], sorted_indices=_sorted_flag(st, f)))


# ---------------------------------------------------------------- shape and data movement


def _id_copy(st: State, f: dict) -> None:
    st.set(f["out"], st.t(f["x"]))


def _reshape(st: State, f: dict) -> None:
    x = st.t(f["x"])
    shape = st.ints(f["shape"])
    if shape.count(-1) > 1:
        raise WalkError("runner-error", "MLX: infer_shape: only one dimension can be -1")
    st.set(f["out"], st.mx.reshape(x, shape))


def _transpose(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.transpose(st.t(f["x"]), list(f["perm"])))


def _expand_dims(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.expand_dims(st.t(f["x"]), int(f["axis"])))


def _squeeze(st: State, f: dict) -> None:
    x = st.t(f["x"])
    dims = f["dims"] or []
    if not dims:
        st.set(f["out"], st.mx.squeeze(x))
        return
    keep = [d for d in dims if 0 <= (d + x.ndim if d < 0 else d) < x.ndim and x.shape[d] == 1]
    st.set(f["out"], st.mx.squeeze(x, axis=keep) if keep else x)


def _tile(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.tile(st.t(f["x"]), st.ints(f["reps"])))


def _broadcast_to(st: State, f: dict) -> None:
    x = st.t(f["x"])
    shape = st.ints(f["shape"])
    offset = len(shape) - x.ndim
    for i, s in enumerate(shape):
        if s == -1 and 0 <= i - offset < x.ndim:
            shape[i] = x.shape[i - offset]
    st.set(f["out"], st.mx.broadcast_to(x, shape))


def _pad(st: State, f: dict) -> None:
    mx = st.mx
    widths = st.ints(f["pad_width"])
    if len(widths) % 2:
        raise WalkError("runner-error", f"MLX: pad: pad_width must have even length, got {len(widths)}")
    pairs = [(widths[i], widths[i + 1]) for i in range(0, len(widths), 2)]
    mode = f["mode"]
    if mode not in ("constant", "edge"):
        raise WalkError("runner-error", f"MLX: unsupported pad mode: {mode}")
    value = mx.array(float(f["constant_value"]) if mode == "constant" else 0.0, dtype=mx.float32)
    st.set(f["out"], mx.pad(st.t(f["x"]), pairs, mode=mode, constant_values=value))


def _as_strided(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.as_strided(st.t(f["x"]), st.ints(f["shape"]), st.ints(f["strides"]), int(f["offset"])))


def _contiguous(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.contiguous(st.t(f["x"]), False))


def _slicer(rank: int, axis: int, start: int | None, stop: int | None, step: int) -> tuple:
    idx = [slice(None)] * rank
    idx[axis] = slice(start, stop, step)
    return tuple(idx)


def _slice(st: State, f: dict) -> None:
    x = st.t(f["x"])
    axis = _norm_axis(st.i(f["axis"]), x.ndim, "Slice")
    step = int(f["step"])
    if step == 0:
        raise WalkError("runner-error", "MLX: Slice: step must not be 0")
    # mlx::slice normalizes start/stop as numpy does (negative wrap, clamp), as does mlx's indexing
    st.set(f["out"], x[_slicer(x.ndim, axis, st.i(f["start"]), st.i(f["stop"]), step)])


def _updated(mx, dst, upd, index: tuple):
    """slice_update without touching `dst` (mlx's __setitem__ rebinds the Python object in place)."""
    out = mx.array(dst)  # a new array node; `dst` keeps its value for other readers
    out[index] = upd
    return out


def _slice_update(st: State, f: dict) -> None:
    mx = st.mx
    dst, upd = st.t(f["dst"]), st.t(f["update"])
    axis = _norm_axis(st.i(f["axis"]), dst.ndim, "SliceUpdate")
    dim = dst.shape[axis]
    start, stop = st.i(f["start"]), st.i(f["stop"])
    start = max(0, min(start + dim if start < 0 else start, dim))
    stop = max(0, min(stop + dim if stop < 0 else stop, dim))
    step = int(f["step"])
    if step < 1:
        raise WalkError("runner-error", "MLX: SliceUpdate: step must be >= 1")
    if start == stop:
        if f["out"] != f["dst"]:
            st.set(f["out"], dst)
        return
    st.set(f["out"], _updated(mx, dst, upd, _slicer(dst.ndim, axis, start, stop, step)))


def _index_copy(st: State, f: dict) -> None:
    import numpy as np

    mx = st.mx
    dst, upd, indices = st.t(f["dst"]), st.t(f["update"]), st.t(f["indices"])
    if indices.ndim != 1:
        raise WalkError("runner-error", "MLX: IndexCopyNode: indices must be 1-D")
    if indices.dtype != mx.int64:
        raise WalkError("runner-error", "MLX: IndexCopyNode: expected int64 indices")
    axis = _norm_axis(int(f["axis"]), dst.ndim, "IndexCopyNode")
    dim = dst.shape[axis]
    idx = np.array(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)
    if ((idx < 0) | (idx >= dim)).any():
        raise WalkError("runner-error", "MLX: IndexCopyNode: index out of range")
    if idx.size == 0:
        if f["out"] != f["dst"]:
            st.set(f["out"], dst)
        return
    sel = [slice(None)] * dst.ndim
    sel[axis] = mx.array(idx.astype(np.int32))
    st.set(f["out"], _updated(mx, dst, upd, tuple(sel)))


def _split(st: State, f: dict) -> None:
    mx = st.mx
    x = st.t(f["x"])
    sizes = st.ints(f["sizes"])
    axis = int(f["axis"])
    if len(sizes) == 1:
        if sizes[0] <= 0:
            raise WalkError("runner-error", f"MLX: split: split_size must be positive, got {sizes[0]}")
        dim = x.shape[axis + x.ndim if axis < 0 else axis]
        cuts = list(range(sizes[0], dim, sizes[0]))
    else:
        cuts, total = [], 0
        for s in sizes[:-1]:
            total += s
            cuts.append(total)
    parts = mx.split(x, cuts, axis=axis)
    if len(parts) != len(f["outs"]):
        raise WalkError("runner-error", "MLX: Split: output count mismatch")
    for tid, part in zip(f["outs"], parts):
        st.set(tid, part)


def _concatenate(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.concatenate([st.t(t) for t in f["tensors"]], axis=int(f["axis"])))


def _stack(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.stack([st.t(t) for t in f["tensors"]], axis=int(f["axis"])))


def _astype(st: State, f: dict) -> None:
    st.set(f["out"], st.t(f["x"]).astype(st.dtype(f["scalar_type"])))


def _take_along_axis(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.take_along_axis(st.t(f["x"]), st.t(f["indices"]), axis=int(f["axis"])))


def _take(st: State, f: dict) -> None:
    x = st.t(f["x"])
    axis = _norm_axis(int(f["axis"]), x.ndim, "Take")
    kind, value = f["index"]
    if kind == "tid":
        st.set(f["out"], st.mx.take(x, st.t(value), axis=axis))
        return
    index = st.i(("lit", value)) if kind == "lit" else int(st.v(value))
    st.set(f["out"], st.mx.take(x, _norm_axis(index, x.shape[axis], "Take"), axis=axis))


def _gather(st: State, f: dict) -> None:
    """mlx::gather(x, indices, axes, slice_sizes): out shape = broadcast(indices) + slice_sizes."""
    mx = st.mx
    x = st.t(f["x"])
    axes, sizes = list(f["axes"]), list(f["slice_sizes"])
    if len(f["indices"]) != len(axes):
        raise WalkError("runner-error", "MLX: GatherNode: indices count must match axes count")
    if len(sizes) != x.ndim:
        raise WalkError("runner-error", "MLX: GatherNode: slice_sizes length must match input ndim")
    idx = mx.broadcast_arrays(*[st.t(t) for t in f["indices"]]) if f["indices"] else []
    batch = list(idx[0].shape) if idx else []
    nb, nd = len(batch), x.ndim
    grids = []
    for d in range(nd):
        window = mx.arange(sizes[d]).reshape([1] * nb + [sizes[d] if k == d else 1 for k in range(nd)])
        if d in axes:
            start = idx[axes.index(d)].astype(mx.int32).reshape(batch + [1] * nd)
            grids.append(start + window)
        else:
            grids.append(window)
    st.set(f["out"], x[tuple(grids)])


def _scatter_add(st: State, f: dict) -> None:
    """mlx::scatter_add_axis: out[..., idx[i], ...] += updates[i] along `axis` (indices shaped like updates)."""
    mx = st.mx
    x, indices, updates = st.t(f["x"]), st.t(f["indices"]), st.t(f["updates"])
    axis = _norm_axis(int(f["axis"]), x.ndim, "ScatterAdd")
    grids = []
    for d in range(x.ndim):
        if d == axis:
            grids.append(indices.astype(mx.int32))
        else:
            shape = [indices.shape[d] if k == d else 1 for k in range(x.ndim)]
            grids.append(mx.broadcast_to(mx.arange(indices.shape[d]).reshape(shape), indices.shape))
    st.set(f["out"], x.at[tuple(grids)].add(updates))


def _repeat(st: State, f: dict) -> None:
    repeats = st.i(f["repeats"])
    if repeats < 0:
        raise WalkError("runner-error", "MLX: repeat: repeats must be non-negative")
    st.set(f["out"], st.mx.repeat(st.t(f["x"]), repeats, axis=int(f["axis"])))


def _roll(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.roll(st.t(f["x"]), tuple(st.ints(f["shift"])), tuple(f["axes"])))


def _flip(st: State, f: dict) -> None:
    st.set(f["out"], st.mx.flip(st.t(f["x"]), axis=list(f["axes"])))


def _sort_like(fn: str):
    return lambda st, f: st.set(f["out"], getattr(st.mx, fn)(st.t(f["x"]), axis=int(f["axis"])))


def _partition_like(fn: str):
    return lambda st, f: st.set(f["out"], getattr(st.mx, fn)(st.t(f["x"]), st.i(f["kth"]), axis=int(f["axis"])))


def _tril_triu(fn: str):
    return lambda st, f: st.set(f["out"], getattr(st.mx, fn)(st.t(f["x"]), int(f["k"])))


# ---------------------------------------------------------------- creation


def _check_shape(shape: list[int], op: str) -> None:
    if any(d <= 0 for d in shape):
        raise WalkError("runner-error", f"MLX: {op}: invalid dimension in {shape}")


def _full(st: State, f: dict) -> None:
    shape = st.ints(f["shape"])
    _check_shape(shape, "full")
    st.set(f["out"], st.mx.full(shape, st.fl(f["v"]), dtype=st.dtype(f["scalar_type"])))


def _full_like(st: State, f: dict) -> None:
    x = st.t(f["x"])
    dtype = st.dtype(f["scalar_type"]) if f["scalar_type"] is not None else x.dtype
    st.set(f["out"], st.mx.full(x.shape, st.mx.array(st.fl(f["v"]), dtype=st.mx.float32), dtype=dtype))


def _arange(st: State, f: dict) -> None:
    start, stop, step = st.i(f["start"]), st.i(f["stop"]), st.i(f["step"])
    if step == 0:
        raise WalkError("runner-error", "MLX: arange: step must not be zero")
    dtype = st.dtype(f["scalar_type"]) if f["scalar_type"] is not None else st.mx.int32
    st.set(f["out"], st.mx.arange(start, stop, step, dtype=dtype))


def _tri(st: State, f: dict) -> None:
    n, m = st.i(f["n"]), st.i(f["m"])
    _check_shape([n, m], "tri")
    st.set(f["out"], st.mx.tri(n, m, int(f["k"]), dtype=st.dtype(f["scalar_type"])))


# ---------------------------------------------------------------- scalar values


def _item_int(st: State, f: dict) -> None:
    st.set_v(f["out"], int(st.t(f["x"]).item()))


def _sym_size(st: State, f: dict) -> None:
    a = st.t(f["a"])
    dim = int(f["dim"])
    dim = dim + a.ndim if dim < 0 else dim
    if not 0 <= dim < a.ndim:
        raise WalkError("runner-error", "MLX: SYM_SIZE: dim out of range")
    st.set_v(f["out"], int(a.shape[dim]))


def _noop(st: State, f: dict) -> None:
    return None


HANDLERS: dict[str, Callable[[State, dict], None]] = {
    **{name: _unary(fn) for name, fn in _UNARY.items()},
    **{name: _binary(fn) for name, fn in _BINARY.items()},
    **{name: _reduce(fn) for name, fn in _REDUCE.items()},
    **{name: _int_arith(name, fn) for name, fn in _INT_ARITH.items()},
    "Noop": _noop, "IdCopy": _id_copy, "Addmm": _addmm, "ItemInt": _item_int, "ExpandDims": _expand_dims,
    "Tile": _tile, "TakeAlongAxis": _take_along_axis, "Take": _take, "RMSNorm": _rms_norm, "LayerNorm": _layer_norm,
    "Rope": _rope, "Sdpa": _sdpa, "FloorDivideInt": _floor_divide_int, "ModInt": _mod_int, "SymSize": _sym_size,
    "Conv1D": _conv(1, False), "Conv2D": _conv(2, False), "Conv3D": _conv(3, False),
    "ConvTranspose1D": _conv(1, True), "ConvTranspose2D": _conv(2, True), "ConvTranspose3D": _conv(3, True),
    "Gelu": _gelu, "ARange": _arange, "Silu": _silu, "Squeeze": _squeeze, "Split": _split, "Softmax": _softmax,
    "BroadcastTo": _broadcast_to, "Pad": _pad, "Where": _where, "Reshape": _reshape, "Transpose": _transpose,
    "AsStrided": _as_strided, "Contiguous": _contiguous, "Gather": _gather, "Slice": _slice, "AsType": _astype,
    "QuantizedMatmul": _quantized_matmul, "ScatterAdd": _scatter_add, "Concatenate": _concatenate, "Full": _full,
    "FullLike": _full_like, "Argmax": _arg_reduce("argmax"), "Argmin": _arg_reduce("argmin"),
    "SliceUpdate": _slice_update, "IndexCopy": _index_copy, "Dequantize": _dequantize, "Tri": _tri,
    "Tril": _tril_triu("tril"), "Triu": _tril_triu("triu"), "Round": _round, "FloorDivide": _floor_divide,
    "LogSumExp": _logsumexp, "Var": _var_std("var"), "Std": _var_std("std"), "Clip": _clip, "Cumsum": _cumsum,
    "Stack": _stack, "Repeat": _repeat, "Sort": _sort_like("sort"), "Argsort": _sort_like("argsort"),
    "Partition": _partition_like("partition"), "ArgPartition": _partition_like("argpartition"),
    "GatherMm": _gather_mm, "GatherQmm": _gather_qmm, "Roll": _roll, "Flip": _flip,
}
# "Scan" and "If" run instruction chains: the interpreter (mlx_delegate.py) handles them.
CONTROL_FLOW = ("Scan", "If")
