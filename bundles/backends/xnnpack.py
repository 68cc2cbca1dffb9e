"""XNNPACK recipe: fp32, fp16 (half model and I/O) and int8 (XNNPACKQuantizer PTQ,
symmetric per-channel weights, static activations; fp32 I/O)."""

from __future__ import annotations

import copy

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import (
    export_model,
    graph_ops,
    lower_and_emit,
    output_qparams,
    quantize_pt2e,
)
from bundlerun.bundles.errors import BuildError

DYNAMIC_SHAPES = True  # this recipe exports with the model's dynamic_shapes (others refuse them: builder.py)


def _partitioner():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def lower_with(req: LoweringRequest, partitioners: list) -> LoweringResult:
    """Shared by xnnpack and portable: dtype handling + optional int8 PTQ."""
    import torch

    model, examples = req.model, req.example_inputs
    if req.dtype == "fp32":
        exported = export_model(model, examples, req.dynamic_shapes)
        program, summary = lower_and_emit(exported, partitioners)
        return LoweringResult(program, [x.dtype for x in examples], ops=graph_ops(exported), info=summary)
    if req.dtype in ("fp16", "bf16"):
        target = torch.float16 if req.dtype == "fp16" else torch.bfloat16
        half_model = copy.deepcopy(model).to(target)
        half_examples = tuple(x.to(target) if x.is_floating_point() else x for x in examples)
        exported = export_model(half_model, half_examples, req.dynamic_shapes)
        program, summary = lower_and_emit(exported, partitioners)
        return LoweringResult(program, [x.dtype for x in half_examples], ops=graph_ops(exported), info=summary)
    if req.dtype == "int8":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        quantizer = XNNPACKQuantizer()
        quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
        exported = export_model(model, examples, req.dynamic_shapes)
        converted = quantize_pt2e(exported, quantizer, req.calibration_inputs)
        qparams = output_qparams(converted)
        requantized = export_model(converted, examples, req.dynamic_shapes)
        program, summary = lower_and_emit(requantized, partitioners)
        return LoweringResult(
            program,
            [x.dtype for x in examples],
            quantized_reference=converted,
            output_qparams=qparams,
            ops=graph_ops(exported),
            quantization="xnnpack-ptq-int8-symmetric-per-channel",
            info=summary,
        )
    raise BuildError(f"dtype {req.dtype!r} is not supported by the {req.backend} recipe (fp32, fp16, bf16, int8)")


def lower(req: LoweringRequest) -> LoweringResult:
    result = lower_with(req, [_partitioner()])
    if not result.info.get("delegate_calls"):
        result.info.setdefault("warnings", []).append("XNNPACK delegated nothing; the program runs on portable kernels")
    return result
