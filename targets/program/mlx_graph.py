"""Decode an MLX delegate payload into plain Python data, once per payload.

Why: the generated flatbuffer accessors are slow and verbose to call on every
execution; the interpreter wants each instruction as `(op name, fields)` with
slot references already resolved to small tuples. The field list per op node
comes from ExecuTorch's own generated inspector table (`OP_NODE_FIELDS`), so a
schema change in a new executorch wheel is picked up without edits here.

Payload layout (backends/mlx/serialization/mlx_graph_serialize.py): a 24-byte
header (4 zero bytes, b"MLX0", u64 data offset, u64 data size), then the
`MLXGraph` flatbuffer up to the data offset. Constants are not in the payload:
they come from the program's named data, keyed by `named_slots`.
"""

from __future__ import annotations

import importlib
import struct
from dataclasses import dataclass, field
from typing import Any

from bundlerun.targets.program.walker import WalkError
from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.mlx_codegen import ensure_mlx_importable

HEADER_LENGTH = 24
MAGIC = b"MLX0"
SLOT_TENSOR, SLOT_INT, SLOT_FLOAT, SLOT_BOOL = 0, 1, 2, 3

# Field references, as decoded:
#   tid / vid                 -> int index, or None when an optional field is absent
#   int_or_vid / float_or_vid -> ("lit", value) | ("vid", index)
#   int_or_vid_or_tid         -> ("lit", value) | ("vid", index) | ("tid", index)
#   vid_or_tid                -> ("vid", index) | ("tid", index)
#   lists                     -> Python lists of the above / ints / strings


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]  # -1 marks a dynamic dimension
    scalar_type: int
    dim_order: tuple[int, ...]


@dataclass
class Instr:
    op: str  # op node name without the "Node" suffix, e.g. "Addmm"
    f: dict[str, Any]  # decoded fields, by schema field name


@dataclass
class MLXGraph:
    version: str
    num_constants: int
    num_inputs: int
    num_outputs: int
    num_mutable: int
    num_temps: int
    num_values: int
    chains: list[list[Instr]]
    main_chain: int
    init_chain: int
    input_map: list[tuple[int, int]]  # (slot index, slot type)
    output_map: list[tuple[int, int]]
    mutable_buffer_map: list[tuple[int, int]]
    named_slots: dict[int, str]  # tensor id -> named-data key
    tensor_meta: list[TensorMeta | None] = field(default_factory=list)

    def op_names(self) -> set[str]:
        return {ins.op for chain in self.chains for ins in chain}


def parse_header(payload: bytes) -> tuple[int, int]:
    """(flatbuffer offset, flatbuffer size); WalkError if this is not an MLX payload."""
    if len(payload) < HEADER_LENGTH or payload[4:8] != MAGIC:
        raise WalkError("runner-error", "MLX delegate payload lacks the MLX0 header")
    data_offset, _size = struct.unpack_from("<QQ", payload, 8)
    if not HEADER_LENGTH <= data_offset <= len(payload):
        raise WalkError("runner-error", f"MLX payload data offset {data_offset} is outside the payload ({len(payload)} bytes)")
    return HEADER_LENGTH, data_offset - HEADER_LENGTH


def _bindings():
    """Generated flatbuffer package + inspector field table (after the codegen overlay)."""

    try:
        ensure_mlx_importable()
        fb = importlib.import_module("executorch.backends.mlx.serialization._generated.mlx_delegate")
        inspector = importlib.import_module("executorch.backends.mlx._generated_inspector")
    except BundlerunError as exc:
        raise WalkError("runner-error", f"MLX flatbuffer bindings unavailable: {exc}") from None
    except ImportError as exc:
        raise WalkError("runner-error", f"MLX flatbuffer bindings unavailable: {exc}") from None
    return fb, inspector.OP_NODE_FIELDS


def _node_class(name: str):
    module = importlib.import_module(f"executorch.backends.mlx.serialization._generated.mlx_delegate.{name}")
    return getattr(module, name)


def _ref_int_or_vid(obj) -> tuple[str, Any] | None:
    if obj is None:
        return None
    if obj.IsVid():
        return ("vid", obj.Vid().Idx())
    return ("lit", obj.Literal())


def _decode_field(node, accessor: str, kind: str) -> Any:  # noqa: C901 - one branch per field kind
    get = getattr(node, accessor)
    if kind in ("tid", "vid"):
        ref = get()
        return None if ref is None else ref.Idx()
    if kind in ("int_or_vid", "float_or_vid"):
        return _ref_int_or_vid(get())
    if kind == "vid_or_tid":
        obj = get()
        if obj is None:
            return None
        return ("vid", obj.Vid().Idx()) if obj.IsVid() else ("tid", obj.Tid().Idx())
    if kind == "int_or_vid_or_tid":
        obj = get()
        if obj is None:
            return None
        k = obj.Kind()
        if k == 0:
            return ("lit", obj.Literal())
        if k == 1:
            return ("vid", obj.Vid().Idx())
        if k == 2:
            return ("tid", obj.Tid().Idx())
        raise WalkError("runner-error", f"IntOrVidOrTid with unknown kind {k}")
    n = getattr(node, f"{accessor}Length")() if kind.endswith("_list") else 0
    if kind == "int_list":
        return [int(get(i)) for i in range(n)]
    if kind == "tid_list":
        return [get(i).Idx() for i in range(n)]
    if kind == "int_or_vid_list":
        return [_ref_int_or_vid(get(i)) for i in range(n)]
    if kind == "string_list":
        return [(get(i) or b"").decode("utf-8") for i in range(n)]
    if kind == "string":
        value = get()
        return value.decode("utf-8") if value is not None else None
    return get()  # scalar (None for an absent null-default scalar)


def decode(payload: bytes) -> MLXGraph:
    """Parse the payload into an MLXGraph; WalkError("runner-error") on a malformed one."""
    fb_offset, fb_size = parse_header(payload)
    fb, fields_by_op = _bindings()
    buf = bytearray(payload[fb_offset : fb_offset + fb_size])
    try:
        root = fb.MLXGraph.MLXGraph.GetRootAs(buf, 0)
        union_names = {v: k for k, v in vars(fb.OpNode.OpNode).items() if isinstance(v, int) and k != "NONE"}
        classes: dict[int, Any] = {}
        chains = []
        for c in range(root.InstructionChainsLength()):
            chain = root.InstructionChains(c)
            decoded = []
            for i in range(chain.InstructionsLength()):
                ins = chain.Instructions(i)
                type_id = ins.OpType()
                name = union_names.get(type_id)
                if name is None:
                    raise WalkError("missing-operator", f"MLX op type id {type_id} is not in this executorch's schema")
                if type_id not in classes:
                    classes[type_id] = _node_class(name)
                node = classes[type_id]()
                table = ins.Op()
                node.Init(table.Bytes, table.Pos)
                f = {fname: _decode_field(node, acc, kind) for fname, acc, kind in fields_by_op[name]}
                decoded.append(Instr(name[:-4] if name.endswith("Node") else name, f))
            chains.append(decoded)

        def slots(n: int, get) -> list[tuple[int, int]]:
            return [(get(i).Idx(), get(i).SlotType()) for i in range(n)]

        metas: list[TensorMeta | None] = []
        for t in range(root.TensorMetaLength()):
            m = root.TensorMeta(t)
            if m is None:
                metas.append(None)
                continue
            shape = tuple(int(m.Shape(d).Value()) for d in range(m.ShapeLength()))
            order = tuple(int(m.DimOrder(d)) for d in range(m.DimOrderLength()))
            metas.append(TensorMeta(shape, int(m.ScalarType()), order))
        named = {}
        for s in range(root.NamedSlotsLength()):
            ns = root.NamedSlots(s)
            if ns.Slot().SlotType() == SLOT_TENSOR:
                named[ns.Slot().Idx()] = ns.Name().decode("utf-8")
        version = root.Version()
        return MLXGraph(
            version=version.decode("utf-8") if version else "",
            num_constants=root.NumConstantTensors(),
            num_inputs=root.NumInputTensors(),
            num_outputs=root.NumOutputTensors(),
            num_mutable=root.NumMutableBufferTensors(),
            num_temps=root.NumTempTensors(),
            num_values=root.NumValues(),
            chains=chains,
            main_chain=root.MainChainIdx(),
            init_chain=root.InitChainIdx(),
            input_map=slots(root.InputMapLength(), root.InputMap),
            output_map=slots(root.OutputMapLength(), root.OutputMap),
            mutable_buffer_map=slots(root.MutableBufferMapLength(), root.MutableBufferMap),
            named_slots=named,
            tensor_meta=metas,
        )
    except WalkError:
        raise
    except Exception as exc:  # noqa: BLE001 - any flatbuffer decoding failure is a malformed payload
        raise WalkError("runner-error", f"MLX payload is not a readable MLXGraph flatbuffer: {type(exc).__name__}: {exc}") from None


def count_outputs(payload: bytes) -> int:
    """Number of outputs without decoding the instructions (DelegateRunner.num_outputs)."""
    fb_offset, fb_size = parse_header(payload)
    fb, _ = _bindings()
    try:
        root = fb.MLXGraph.MLXGraph.GetRootAs(bytearray(payload[fb_offset : fb_offset + fb_size]), 0)
        return int(root.OutputMapLength())
    except Exception as exc:  # noqa: BLE001
        raise WalkError("runner-error", f"MLX payload is not a readable MLXGraph flatbuffer: {exc}") from None
