"""Qualcomm QNN recipe (HTP): QnnPartitioner with HTP compile specs, fp16 or int8 (PTQ).

Lowering for QNN runs the QNN compiler from the Qualcomm AI Engine Direct SDK
(`$QNN_SDK_ROOT`, Python bindings built by ExecuTorch's backends/qualcomm
scripts). Without it the build stops with a one-line BuildError naming what to
install; nothing is silently lowered to something else.
"""

from __future__ import annotations

import os
from pathlib import Path

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import export_model, graph_ops, lower_and_emit, output_qparams, quantize_pt2e
from bundlerun.bundles.errors import BuildError

# SoC names ExecuTorch's QcomChipset enum knows, by common marketing name
DEFAULT_SOC = "SM8650"


def _check_sdk() -> Path:
    root = os.environ.get("QNN_SDK_ROOT")
    if not root:
        raise BuildError(
            "the qnn backend needs the Qualcomm AI Engine Direct SDK: set QNN_SDK_ROOT to its folder "
            "(and build ExecuTorch's QNN Python bindings, backends/qualcomm/scripts/build.sh)")
    path = Path(root)
    if not (path / "lib").is_dir():
        raise BuildError(f"QNN_SDK_ROOT={root} does not look like a QNN SDK (no lib/ folder)")
    return path


def _qnn_api():
    try:
        from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner
        from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
        from executorch.backends.qualcomm.utils.utils import (
            generate_htp_compiler_spec,
            generate_qnn_executorch_compiler_spec,
        )
    except Exception as exc:  # the bindings import PyQnnManagerAdaptor, built against the SDK
        raise BuildError(f"ExecuTorch's QNN Python bindings are not usable here ({type(exc).__name__}: {exc}); "
                         "build them with backends/qualcomm/scripts/build.sh against $QNN_SDK_ROOT") from None
    return QnnPartitioner, QcomChipset, generate_htp_compiler_spec, generate_qnn_executorch_compiler_spec


def lower(req: LoweringRequest) -> LoweringResult:
    if req.dtype not in ("fp16", "int8", "fp32"):
        raise BuildError(f"dtype {req.dtype!r} is not supported by the qnn recipe (fp16, int8; fp32 runs as fp16 on HTP)")
    _check_sdk()
    QnnPartitioner, QcomChipset, htp_spec, qnn_spec = _qnn_api()
    soc = str(req.options.get("soc_model", DEFAULT_SOC)).upper()
    try:
        chipset = getattr(QcomChipset, soc)
    except AttributeError:
        raise BuildError(f"unknown Qualcomm SoC {soc!r} for QNN") from None
    use_fp16 = req.dtype != "int8"
    compiler_specs = qnn_spec(soc_model=chipset, backend_options=htp_spec(use_fp16=use_fp16))
    exported = export_model(req.model, req.example_inputs)
    qparams, reference, scheme = [], None, None
    if req.dtype == "int8":
        from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer

        converted = quantize_pt2e(exported, QnnQuantizer(), req.calibration_inputs)
        qparams = output_qparams(converted)
        reference, scheme = converted, "qnn-ptq-8a8w"
        exported = export_model(converted, req.example_inputs)
    program, summary = lower_and_emit(exported, [QnnPartitioner(compiler_specs)])
    summary.update(partitioner="QnnPartitioner", soc_model=soc)
    return LoweringResult(program, [x.dtype for x in req.example_inputs], quantized_reference=reference,
                          output_qparams=qparams, ops=graph_ops(exported), quantization=scheme, info=summary)
