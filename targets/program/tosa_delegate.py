"""Run TOSA delegate payloads on the TOSA reference model (`tosa-tools`).

The `TOSABackend` payload in a `.pte` is a TOSA flatbuffer (graph + constants).
`tosa_reference_model.run(graph_bytes, [numpy inputs])` executes it and returns
`(outputs, GraphStatus)`; only `TOSA_VALID` counts as a result. Inputs are in
memory (dim-order) layout, exactly the bytes the on-device backend would get.

Heavy imports happen inside functions: this module runs in the worker child.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from bundlerun.targets.program.walker import DelegateInvocation, WalkError

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
        raise WalkError("backend-error", f"TOSABackend payload is not a TOSA flatbuffer: {exc}") from None


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
                "backend-error",
                f"TOSA graph takes {block.InputsLength()} inputs, the program passes {len(call.inputs)}",
            )
        try:
            with _quiet_native_stdout():
                outputs, status = trm.run(call.payload, [np.ascontiguousarray(a) for a in call.inputs],
                                          initialize_variable_tensor_from_numpy=1)
        except ValueError as exc:
            raise WalkError("backend-error", f"TOSA reference model rejected the inputs: {exc}") from None
        if status != trm.GraphStatus.TOSA_VALID:
            raise WalkError("backend-error", f"TOSA reference model returned {status.name} (expected TOSA_VALID)")
        return [np.asarray(o) for o in outputs]


def delegate_runners() -> dict:
    return {TOSA_BACKEND_ID: TosaReferenceRunner()}
