"""Run `MLXBackend` delegate payloads with the `mlx` Python package (MLX's own kernels).

The program walker (targets.program.walker) executes the plan; each MLX DelegateCall
lands here. Like `MLXBackend::init`, the first call of a payload decodes the
graph, loads constants from the program's named data (by `named_slots`, shaped
and typed by `tensor_meta`), allocates zeroed mutable buffers and runs the init
chain; every call then binds inputs (dtype checked), runs the main chain and
returns each output made contiguous and cast to the program's output dtype.

    from bundlerun.targets.program.walker import ProgramWalker, load_program
    from bundlerun.targets.program.mlx_delegate import delegate_runners
    outputs = ProgramWalker(load_program(pte), delegate_runners()).run("forward", inputs)

Needs `pip install "mlx[cpu]"` on Linux (plain `mlx` has no CPU library there).

Per-instruction outputs (`bundlerun debug`, `capture_inner = True`): every
instruction of the main chain, after it ran, yields an `InnerOutput` with the
tensors its `out` / `outs` / `outputs` fields name (evaluated, copied to numpy;
bfloat16 as float32), tagged with the payload's op digest so the debugger finds
the instruction map recorded at build time (bundles/etrecord.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bundlerun.targets.program.walker import DelegateInvocation, InnerOutput, WalkError
from bundlerun.bundles.etrecord import mlx_ops_digest
from bundlerun.targets.program.mlx_graph import SLOT_INT, SLOT_TENSOR, count_outputs, decode
from bundlerun.targets.program.mlx_ops import CONTROL_FLOW, HANDLERS, State, UNSUPPORTED, _dtype

MLX_BACKEND_ID = "MLXBackend"
MAX_SCHEMA_VERSION = 1
_NP_TO_CODE = {"float32": 6, "float16": 5, "int32": 3, "int64": 4, "int16": 2, "int8": 1, "uint8": 0, "bool": 11,
               "uint32": 28}


def import_mlx():
    """mlx.core, or WalkError naming the fix (the CPU wheel on Linux)."""
    try:
        import mlx.core as mx
    except ImportError as exc:
        raise WalkError("missing-backend", f"MLX delegate needs the mlx package (pip install \"mlx[cpu]\" on Linux): {exc}") from None
    return mx


@dataclass
class _Loaded:
    """One initialized payload: decoded graph, constants, persistent mutable buffers."""

    graph: Any
    constants: list[Any]
    mutable: dict[int, Any] = field(default_factory=dict)


def _to_mlx(mx, array: np.ndarray, code: int, shape: tuple[int, ...]):
    a = np.ascontiguousarray(array)
    if a.size != int(np.prod(shape, dtype=np.int64)):
        raise WalkError("runner-error", f"MLX input has {a.size} elements, the graph expects shape {list(shape)}")
    a = a.reshape(shape)
    if code == 15:  # bfloat16 arrives as raw uint16 words
        return mx.view(mx.array(a.view(np.uint16)), mx.bfloat16)
    return mx.array(a)


def _to_numpy(mx, arr) -> np.ndarray:
    if arr.dtype == mx.bfloat16:
        return np.array(mx.view(arr, mx.uint16))
    return np.array(arr)


class MLXDelegateRunner:
    """DelegateRunner for `MLXBackend`: payload -> MLX graph -> mlx.core calls."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._loaded: dict[str, _Loaded] = {}
        self._output_counts: dict[str, int] = {}
        self.capture_inner = False  # `bundlerun debug`: record every main-chain instruction's outputs
        self.last_inner: list[InnerOutput] = []

    def num_outputs(self, payload: bytes) -> int:
        key = hashlib.sha1(payload).hexdigest()
        if key not in self._output_counts:
            self._output_counts[key] = count_outputs(payload)
        return self._output_counts[key]

    def __call__(self, call: DelegateInvocation) -> list[np.ndarray]:
        mx = import_mlx()
        loaded = self._load(mx, call)
        return self._execute(mx, loaded, call)

    # -- init ---------------------------------------------------------------------------

    def _load(self, mx, call: DelegateInvocation) -> _Loaded:
        key = hashlib.sha1(call.payload).hexdigest()
        if key in self._loaded:
            return self._loaded[key]

        mx.set_default_device(mx.gpu if self.device == "gpu" else mx.cpu)
        graph = decode(call.payload)
        if graph.version and graph.version.isdigit() and int(graph.version) > MAX_SCHEMA_VERSION:
            raise WalkError("runner-error", f"MLX payload schema version {graph.version} is newer than this interpreter ({MAX_SCHEMA_VERSION})")
        for op in sorted(graph.op_names()):
            if op in UNSUPPORTED:
                raise WalkError("missing-operator", f"MLX op {op}Node cannot run here: {UNSUPPORTED[op]}")
            if op not in HANDLERS and op not in CONTROL_FLOW:
                raise WalkError("missing-operator", f"MLX op {op}Node is not implemented by bundlerun's MLX interpreter")
        constants = []
        for tid in range(graph.num_constants):
            meta = graph.tensor_meta[tid] if tid < len(graph.tensor_meta) else None
            name = graph.named_slots.get(tid)
            if meta is None or name is None:
                raise WalkError("runner-error", f"MLX constant {tid} has no {'metadata' if meta is None else 'name'}")
            if name not in call.named_data:
                raise WalkError("bad-bundle", f"MLX constant {name!r} is not in the program's named data")
            dtype = _dtype(mx, meta.scalar_type)
            raw = np.frombuffer(call.named_data[name], dtype=np.uint8)
            constants.append(self._constant(mx, raw, meta.shape, dtype, name))
        loaded = _Loaded(graph, constants)
        for idx, slot_type in graph.mutable_buffer_map:
            if slot_type != SLOT_TENSOR:
                raise WalkError("runner-error", f"MLX mutable buffer slot of type {slot_type}")
            meta = graph.tensor_meta[idx]
            loaded.mutable[idx] = mx.zeros(list(meta.shape), dtype=_dtype(mx, meta.scalar_type))
        if graph.init_chain >= 0:
            st = State(mx, graph, loaded.constants, loaded.mutable)
            st.is_init = True
            self._run_chain(st, graph.init_chain)
            mx.eval(loaded.constants)
        self._loaded[key] = loaded
        return loaded

    @staticmethod
    def _constant(mx, raw: np.ndarray, shape: tuple[int, ...], dtype, name: str):
        if any(d < 0 for d in shape):
            raise WalkError("runner-error", f"MLX constant {name!r} has a dynamic shape")
        numel = int(np.prod(shape, dtype=np.int64))
        nbytes = numel * dtype.size
        if raw.size < nbytes:
            raise WalkError("bad-bundle", f"MLX constant {name!r} has {raw.size} bytes, needs {nbytes}")
        words = raw[:nbytes]
        arr = mx.view(mx.array(words), dtype) if nbytes else mx.zeros([0], dtype=dtype)
        return arr.reshape(list(shape))

    # -- execute ------------------------------------------------------------------------

    def _execute(self, mx, loaded: _Loaded, call: DelegateInvocation) -> list[np.ndarray]:
        graph = loaded.graph
        if len(call.inputs) != len(graph.input_map):
            raise WalkError("runner-error", f"MLX graph takes {len(graph.input_map)} inputs, the program passes {len(call.inputs)}")
        st = State(mx, graph, loaded.constants, loaded.mutable)
        for (idx, slot_type), value in zip(graph.input_map, call.inputs):
            if slot_type == SLOT_TENSOR:
                meta = graph.tensor_meta[idx]
                got = 15 if meta.scalar_type == 15 and value.dtype == np.uint16 else _NP_TO_CODE.get(str(value.dtype))
                if got != meta.scalar_type:
                    raise WalkError("runner-error", f"MLX input dtype mismatch: the program passes {value.dtype}, "
                                                     f"the graph expects ScalarType {meta.scalar_type}")
                shape = tuple(int(s) for s in meta.shape) if all(s >= 0 for s in meta.shape) else value.shape
                st.set(idx, _to_mlx(mx, value, meta.scalar_type, shape))
            elif slot_type == SLOT_INT:
                v = int(np.asarray(value).item())
                if not -(2**31) <= v < 2**31:
                    raise WalkError("runner-error", f"MLX int input {v} exceeds int32 range")
                st.set_v(idx, v)
            else:
                raise WalkError("runner-error", f"MLX input slot type {slot_type} is not handled")
        if self.capture_inner:
            self.last_inner = []
            digest = mlx_ops_digest([[ins.op for ins in chain] for chain in graph.chains])
            self._run_chain(st, graph.main_chain, record=(self.last_inner, digest))
        else:
            self._run_chain(st, graph.main_chain)
        outputs = []
        tensor_slots = [(i, s) for i, s in graph.output_map if s == SLOT_TENSOR]
        if len(tensor_slots) != len(graph.output_map):
            raise WalkError("missing-operator", "MLX graphs with scalar (int) outputs are not supported by the program walker")
        if len(call.output_layouts) != len(tensor_slots):
            raise WalkError("runner-error", f"MLX graph has {len(tensor_slots)} outputs, the program expects {len(call.output_layouts)}")
        prepared = []
        for (idx, _), (sizes, dim_order, code) in zip(tensor_slots, call.output_layouts):
            arr = mx.contiguous(st.t(idx), False).astype(_dtype_for(mx, code))
            prepared.append((arr, dim_order))
        mx.eval([a for a, _ in prepared])
        for arr, dim_order in prepared:
            out = _to_numpy(mx, arr)
            if dim_order and list(dim_order) != list(range(out.ndim)):
                out = np.ascontiguousarray(np.transpose(out, dim_order))
            outputs.append(out)
        return outputs

    def _run_chain(self, st, chain_idx: int, record: tuple[list[InnerOutput], str] | None = None) -> None:
        graph = st.graph
        if not 0 <= chain_idx < len(graph.chains):
            raise WalkError("runner-error", f"MLX chain index {chain_idx} out of range")
        for pos, ins in enumerate(graph.chains[chain_idx]):
            try:
                if ins.op == "Scan":
                    self._scan(st, ins.f)
                elif ins.op == "If":
                    self._run_chain(st, ins.f["then_chain_idx"] if st.i(ins.f["cond"]) != 0 else ins.f["else_chain_idx"])
                else:
                    HANDLERS[ins.op](st, ins.f)
                if record is not None:
                    record[0].append(self._inner(st, chain_idx, pos, ins, record[1]))
            except WalkError:
                raise
            except Exception as exc:  # noqa: BLE001 - an mlx error is this case's backend error
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise WalkError("runner-error", f"MLX {ins.op}Node (chain {chain_idx}, instruction {pos}) failed: {msg}") from None

    @staticmethod
    def _inner(st, chain_idx: int, pos: int, ins, digest: str) -> InnerOutput:
        """The tensors instruction `pos` wrote (its out / outs / outputs fields), as numpy copies."""
        mx = st.mx
        tids: list[int] = []
        for key in ("out", "outs", "outputs"):
            value = ins.f.get(key)
            if isinstance(value, int):
                tids.append(value)
            elif isinstance(value, list):
                tids.extend(v for v in value if isinstance(v, int))
        arrays, dtypes = [], []
        for tid in tids:
            arr = st.t(tid)
            dtypes.append(str(arr.dtype).replace("mlx.core.", ""))
            if arr.dtype == mx.bfloat16:
                arr = arr.astype(mx.float32)
            mx.eval(arr)
            arrays.append(np.array(arr, copy=True))
        return InnerOutput(pos, f"mlx.{ins.op}", f"chain {chain_idx} #{pos}", arrays,
                           {"backend": MLX_BACKEND_ID, "chain": chain_idx, "digest": digest, "tids": tids,
                            "dtypes": dtypes})

    def _scan(self, st, f: dict) -> None:
        mx = st.mx
        axis = int(f["scan_axis"])
        steps = st.t(f["originals"][0]).shape[axis]
        collected: list[list[Any]] = [[] for _ in f["outputs"]]
        for t in range(steps):
            for orig, sliced in zip(f["originals"], f["sliced"]):
                st.set(sliced, mx.take(st.t(orig), t, axis=axis))
            self._run_chain(st, int(f["body_chain_idx"]))
            for i, out in enumerate(f["outputs"]):
                collected[i].append(st.t(out))
        for i, out in enumerate(f["outputs"]):
            st.set(out, mx.stack(collected[i], axis=axis))


def _dtype_for(mx, code: int):
    return _dtype(mx, code)


def delegate_runners(device: str = "cpu") -> dict:
    """Runners for the program walker: MLX payloads on MLX (`cpu`, or `gpu` on a Mac)."""
    return {MLX_BACKEND_ID: MLXDelegateRunner(device)}
