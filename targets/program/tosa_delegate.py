"""Run TOSA delegate payloads on the TOSA reference model (`tosa-tools`).

The `TOSABackend` payload in a `.pte` is a TOSA flatbuffer (graph + constants).
`tosa_reference_model.run(graph_bytes, [numpy inputs])` executes it and returns
`(outputs, GraphStatus)`; only `TOSA_VALID` counts as a result. Inputs are in
memory (dim-order) layout, exactly the bytes the on-device backend would get.

Per-operator outputs (`bundlerun debug`, `capture_inner = True`): the reference
model returns only a block's outputs (its `dump_intermediates` switch writes files
per tensor, named by the reference model, not returned). So the payload is
rewritten so that every operator's output tensor is also a block output
(`with_operator_outputs`: a new `outputs` vector of strings appended at the end of
the flatbuffer and the block's field offset pointed at it - forward offsets stay
valid, nothing else moves), run once, and the extra outputs become one
`InnerOutput` per operator, in graph order. CONST / CONST_SHAPE operators (data,
not computation) and SHAPE-typed tensors are left out; operators inside nested
control-flow regions are not visited (their COND_IF / WHILE_LOOP operator is).

Heavy imports happen inside functions: this module runs in the worker child.
"""

from __future__ import annotations

import os
import struct
import sys
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from bundlerun.targets.program.walker import DelegateInvocation, InnerOutput, WalkError

TOSA_BACKEND_ID = "TOSABackend"
ETHOSU_BACKEND_ID = "EthosUBackend"
VGF_BACKEND_ID = "VgfBackend"


def _block(payload: bytes):
    from tosa.TosaGraph import TosaGraph

    try:
        graph = TosaGraph.GetRootAs(payload, 0)
        region = graph.Regions(0)
        return region.Blocks(0)
    except Exception as exc:  # noqa: BLE001
        raise WalkError("runner-error", f"TOSABackend payload is not a TOSA flatbuffer: {exc}") from None


_NOT_COMPUTED = ("CONST", "CONST_SHAPE")


def _op_names() -> dict[int, str]:
    from tosa.Op import Op

    return {v: k for k, v in vars(Op).items() if isinstance(v, int) and not k.startswith("_")}


def operator_outputs(payload: bytes) -> list[tuple[int, str, list[str]]]:
    """(operator index, "tosa.NAME", output tensor names) of every computing operator of the main
    block, in graph order (CONST / CONST_SHAPE and SHAPE-typed outputs left out)."""
    from tosa.DType import DType

    block = _block(payload)
    names = _op_names()
    shape_tensors = {block.Tensors(i).Name() for i in range(block.TensorsLength())
                     if block.Tensors(i).Type() == DType.SHAPE}
    ops = []
    for j in range(block.OperatorsLength()):
        op = block.Operators(j)
        name = names.get(op.Op(), f"OP{op.Op()}")
        if name in _NOT_COMPUTED:
            continue
        outs = [op.Outputs(k) for k in range(op.OutputsLength())]
        ops.append((j, f"tosa.{name}", [o.decode() for o in outs if o not in shape_tensors]))
    return ops


def with_operator_outputs(payload: bytes, names: list[str]) -> tuple[bytes, list[str]]:
    """The payload with `names` appended to its main block's outputs; (payload, all output names).

    The block's `outputs` field (a vector of strings, vtable slot 4) is re-pointed at a new vector
    written after the end of the buffer; flatbuffer offsets point forward, so this is valid."""
    block = _block(payload)
    tab = block._tab
    field = tab.Offset(12)  # TosaBasicBlock.outputs
    if not field:
        raise WalkError("runner-error", "TOSA block has no outputs field to extend")
    existing = [block.Outputs(i) for i in range(block.OutputsLength())]
    wanted = existing + [n.encode() for n in dict.fromkeys(names) if n.encode() not in existing]
    buf = bytearray(payload)

    def align(n: int) -> None:
        buf.extend(b"\0" * (-len(buf) % n))

    align(4)
    vector = len(buf)
    buf.extend(struct.pack("<I", len(wanted)))
    slots = len(buf)
    buf.extend(b"\0" * (4 * len(wanted)))
    for i, name in enumerate(wanted):
        align(4)
        at = len(buf)
        buf.extend(struct.pack("<I", len(name)) + name + b"\0")
        struct.pack_into("<I", buf, slots + 4 * i, at - (slots + 4 * i))
    align(8)
    position = tab.Pos + field
    struct.pack_into("<I", buf, position, vector - position)
    return bytes(buf), [w.decode() for w in wanted]


@contextmanager
def _quiet_native_stdout() -> Iterator[None]:
    """The reference model prints version warnings on fd 1/2; keep them out of our protocol."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class TosaReferenceRunner:
    """DelegateRunner for `TOSABackend` on the reference model."""

    def __init__(self) -> None:
        self._output_counts: dict[int, int] = {}
        self.capture_inner = False  # `bundlerun debug`: record every operator's outputs
        self.last_inner: list[InnerOutput] = []

    def num_outputs(self, payload: bytes) -> int:
        key = hash(payload)
        if key not in self._output_counts:
            self._output_counts[key] = int(_block(payload).OutputsLength())
        return self._output_counts[key]

    def __call__(self, call: DelegateInvocation) -> list[np.ndarray]:
        import tosa_reference_model as trm

        block = _block(call.payload)
        if block.InputsLength() != len(call.inputs):
            raise WalkError(
                "runner-error",
                f"TOSA graph takes {block.InputsLength()} inputs, the program passes {len(call.inputs)}",
            )
        payload, ops, names = call.payload, [], []
        n_out = block.OutputsLength()
        if self.capture_inner:
            ops = operator_outputs(call.payload)
            payload, names = with_operator_outputs(call.payload, [t for _j, _op, outs in ops for t in outs])
        try:
            with _quiet_native_stdout():
                outputs, status = trm.run(payload, [np.ascontiguousarray(a) for a in call.inputs],
                                          initialize_variable_tensor_from_numpy=1)
        except ValueError as exc:
            raise WalkError("runner-error", f"TOSA reference model rejected the inputs: {exc}") from None
        if status != trm.GraphStatus.TOSA_VALID:
            raise WalkError("runner-error", f"TOSA reference model returned {status.name} (expected TOSA_VALID)")
        arrays = [np.asarray(o) for o in outputs]
        if self.capture_inner:
            if len(arrays) != len(names):
                raise WalkError("runner-error", f"TOSA reference model returned {len(arrays)} outputs for "
                                                 f"{len(names)} requested (operator outputs)")
            by_name = dict(zip(names, arrays))
            self.last_inner = [InnerOutput(j, op, outs[0] if outs else "", [by_name[t].copy() for t in outs],
                                           {"backend": TOSA_BACKEND_ID, "tensors": outs}) for j, op, outs in ops]
        return arrays[:n_out]


def delegate_runners() -> dict:
    return {TOSA_BACKEND_ID: TosaReferenceRunner()}
