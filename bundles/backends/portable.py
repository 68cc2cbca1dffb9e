"""Portable recipe: no delegate, every op on ExecuTorch's portable kernels
(int8 keeps quantize/dequantize + quantized kernels where they exist)."""

from __future__ import annotations

from bundles.backends.base import LoweringRequest, LoweringResult
from bundles.backends.xnnpack import lower_with


def lower(req: LoweringRequest) -> LoweringResult:
    return lower_with(req, [])
