"""Vulkan recipe (Android GPUs): VulkanPartitioner, fp32 or fp16.

fp16 uses the partitioner's `force_fp16` compile option (what ExecuTorch's
Vulkan tests do): the delegate computes in half precision while the program's
inputs and outputs stay fp32, so the same bundle inputs serve both dtypes and
the fp16 tolerance tier applies. Quantized Vulkan (weight-only / dynamic via
VulkanQuantizer) is not offered: its runtime kernels need a GPU to check.
"""

from __future__ import annotations

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import export_model, graph_ops, lower_and_emit
from bundlerun.bundles.errors import BuildError


def _partitioner(options: dict):
    try:
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    except ImportError as exc:
        raise BuildError(f"the Vulkan backend is not in this executorch build ({exc})") from None
    return VulkanPartitioner(options or None)


def lower(req: LoweringRequest) -> LoweringResult:
    if req.dtype not in ("fp32", "fp16"):
        raise BuildError(f"dtype {req.dtype!r} is not supported by the vulkan recipe (fp32, fp16)")
    options = {k: v for k, v in req.options.items() if k in ("texture_limits", "small_texture_limits", "buffer_limit",
                                                            "require_dynamic_shapes", "skip_bool_tensors")}
    if req.dtype == "fp16":
        options["force_fp16"] = True
    exported = export_model(req.model, req.example_inputs)
    program, summary = lower_and_emit(exported, [_partitioner(options)])
    summary["partitioner"] = "VulkanPartitioner"
    summary["compile_options"] = {k: v for k, v in options.items() if isinstance(v, (bool, int, str))}
    if not summary.get("delegate_calls"):
        summary.setdefault("warnings", []).append("Vulkan delegated nothing; the program runs on portable kernels")
    return LoweringResult(
        program,
        [x.dtype for x in req.example_inputs],
        ops=graph_ops(exported),
        quantization=None,
        info=summary,
    )
