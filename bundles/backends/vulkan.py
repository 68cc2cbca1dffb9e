"""Vulkan recipe (Android GPUs; lavapipe here): VulkanPartitioner, fp32, fp16 or int8.

fp16 uses the partitioner's `force_fp16` compile option (what ExecuTorch's Vulkan tests do): the
delegate computes in half precision while the program's inputs and outputs stay fp32, so the same
bundle inputs serve both dtypes and the fp16 tolerance tier applies.

int8 is what ExecuTorch's Vulkan tests lower for quantized models
(backends/vulkan/test/test_vulkan_delegate.py:88-123 `quantize_and_lower_module`, used with
XNNPACKQuantizer's symmetric per-channel static config at :2454-2459): PT2E post-training
quantization with the XNNPACK quantizer, then to_edge_transform_and_lower with the I64toI32
transform pass and the VulkanPartitioner. Its q8ta shaders need GL_EXT_integer_dot_product support
in the driver (lavapipe has it; SwiftShader does not, :2480). Quantize/dequantize ops the delegate
does not take run on the runner's quantized kernels (build_vulkan_runner.sh builds them).

Partial delegation is the normal case: what the partitioner does not take runs on the portable
kernels between Vulkan subgraphs (the summary's delegate_calls / non-delegated ops say which).
"""

from __future__ import annotations

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import (
    _first_line,
    delegation_summary,
    export_model,
    graph_ops,
    lower_and_emit,
    output_qparams,
    quantize_pt2e,
)
from bundlerun.bundles.errors import BuildError

DTYPES = ("fp32", "fp16", "int8")
QUANTIZATION = "xnnpack-ptq-int8-symmetric-per-channel (Vulkan q8ta)"


def _partitioner(options: dict):
    try:
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    except ImportError as exc:
        raise BuildError(f"the Vulkan backend is not in this executorch build ({exc})") from None
    return VulkanPartitioner(options or None)


def _lower_quantized(exported, partitioner) -> tuple:
    """common.lower_and_emit plus the transform pass ExecuTorch's Vulkan tests apply to quantized
    graphs (I64toI32, test_vulkan_delegate.py:117-119)."""
    from executorch.backends.transforms.convert_dtype_pass import I64toI32
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    config = EdgeCompileConfig(_check_ir_validity=False)
    try:
        edge = to_edge_transform_and_lower(exported, partitioner=[partitioner], compile_config=config,
                                           transform_passes=[I64toI32(config._skip_dim_order)])
    except Exception as exc:
        raise BuildError(f"lowering failed: {type(exc).__name__}: {_first_line(exc)}") from None
    summary = delegation_summary(edge)
    try:
        return edge.to_executorch(), summary
    except Exception as exc:
        raise BuildError(f"to_executorch failed: {type(exc).__name__}: {_first_line(exc)}") from None


def lower(req: LoweringRequest) -> LoweringResult:
    if req.dtype not in DTYPES:
        raise BuildError(f"dtype {req.dtype!r} is not supported by the vulkan recipe ({', '.join(DTYPES)})")
    options = {k: v for k, v in req.options.items() if k in ("texture_limits", "small_texture_limits", "buffer_limit",
                                                            "require_dynamic_shapes", "skip_bool_tensors")}
    if req.dtype == "fp16":
        options["force_fp16"] = True
    exported = export_model(req.model, req.example_inputs)
    extra: dict = {}
    if req.dtype == "int8":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        quantizer = XNNPACKQuantizer()
        quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
        converted = quantize_pt2e(exported, quantizer, req.calibration_inputs)
        extra = dict(quantized_reference=converted, output_qparams=output_qparams(converted), quantization=QUANTIZATION)
        program, summary = _lower_quantized(export_model(converted, req.example_inputs), _partitioner(options))
    else:
        program, summary = lower_and_emit(exported, [_partitioner(options)])
    summary["partitioner"] = "VulkanPartitioner"
    summary["compile_options"] = {k: v for k, v in options.items() if isinstance(v, (bool, int, str))}
    if not summary.get("delegate_calls"):
        summary.setdefault("warnings", []).append("Vulkan delegated nothing; the program runs on portable kernels")
    return LoweringResult(program, [x.dtype for x in req.example_inputs], ops=graph_ops(exported), info=summary,
                          **extra)
