"""Portable recipe: no delegate, every op on ExecuTorch's portable kernels
(int8 keeps quantize/dequantize + quantized kernels where they exist)."""

from __future__ import annotations

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.xnnpack import lower_with

DYNAMIC_SHAPES = True  # lower_with exports with the model's dynamic_shapes


def lower(req: LoweringRequest) -> LoweringResult:
    if req.dtype in ("int8", "int16"):
        # registers the quantize/dequantize out-variants to_executorch needs without a delegate
        import executorch.kernels.quantized  # noqa: F401
    return lower_with(req, [])
