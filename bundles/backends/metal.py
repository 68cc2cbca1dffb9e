"""Metal recipe (Apple GPUs through AOTInductor): lowers on macOS only.

ExecuTorch's Metal backend compiles the graph with AOTInductor into Metal
shaders; that needs torch's MPS device, which exists only in macOS builds of
torch. Elsewhere the recipe stops with one line saying so, instead of a deep
AOTInductor traceback. On a Mac: fp32 and bf16 (ExecuTorch's Metal tests).
"""

from __future__ import annotations

import platform

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import export_model, graph_ops, lower_and_emit
from bundlerun.bundles.errors import BuildError

DTYPES = ("fp32", "bf16")


def _require_macos_mps() -> None:
    if platform.system() != "Darwin":
        raise BuildError(f"the metal backend lowers with AOTInductor for Apple GPUs and needs macOS with torch's MPS "
                         f"device; this is {platform.system()} {platform.machine()} (build MLX or Core ML bundles here)")
    import torch

    if not torch.backends.mps.is_available():
        raise BuildError("the metal backend needs torch's MPS device, which this macOS torch build does not have")


def _partitioner():
    try:
        from executorch.backends.apple.metal.metal_backend import MetalBackend
        from executorch.backends.apple.metal.metal_partitioner import MetalPartitioner
    except ImportError as exc:
        raise BuildError(f"the Metal backend is not in this executorch build ({exc})") from None
    return MetalPartitioner([MetalBackend.generate_method_name_compile_spec("forward")])


def lower(req: LoweringRequest) -> LoweringResult:
    if req.dtype not in DTYPES:
        raise BuildError(f"dtype {req.dtype!r} is not supported by the metal recipe ({', '.join(DTYPES)})")
    _require_macos_mps()
    import copy

    import torch

    model, examples = req.model, req.example_inputs
    if req.dtype == "bf16":
        model = copy.deepcopy(model).to(torch.bfloat16)
        examples = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in examples)
    exported = export_model(model, examples)
    program, summary = lower_and_emit(exported, [_partitioner()])
    summary["partitioner"] = "MetalPartitioner"
    return LoweringResult(program, [x.dtype for x in examples], ops=graph_ops(exported), info=summary)
