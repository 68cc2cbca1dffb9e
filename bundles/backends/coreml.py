"""Core ML recipe (Apple): CoreMLPartitioner, fp32 or fp16.

The precision is Core ML's model compute precision (a compile spec): fp16
computes in half inside the delegate while the program's inputs and outputs
stay fp32 (what Core ML itself does with FLOAT16 models), so one set of bundle
inputs serves both dtypes and the fp16 tier applies. Compute units (`all`,
`cpu_only`, `cpu_and_gpu`, `cpu_and_ne`; option `compute_units`, default
`all`) are a compile spec too and go into the build info: they decide where a
Mac runs the model and therefore its numerics. Lowering runs on Linux with
coremltools; prediction needs macOS.
"""

from __future__ import annotations

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import export_model, graph_ops, lower_and_emit
from bundlerun.bundles.errors import BuildError

DTYPES = ("fp32", "fp16")
COMPUTE_UNITS = {"all": "ALL", "cpu_only": "CPU_ONLY", "cpu_and_gpu": "CPU_AND_GPU", "cpu_and_ne": "CPU_AND_NE"}


def _partitioner(dtype: str, compute_units: str):
    try:
        import coremltools as ct
        from executorch.backends.apple.coreml.compiler import CoreMLBackend
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner
    except ImportError as exc:
        raise BuildError(f"the Core ML backend needs coremltools and executorch's apple backend ({exc}); "
                         "pip install coremltools==9.0") from None
    precision = ct.precision.FLOAT32 if dtype == "fp32" else ct.precision.FLOAT16
    specs = CoreMLBackend.generate_compile_specs(
        compute_unit=getattr(ct.ComputeUnit, COMPUTE_UNITS[compute_units]),
        compute_precision=precision,
    )
    return CoreMLPartitioner(compile_specs=specs), ct.__version__, precision.value


def lower(req: LoweringRequest) -> LoweringResult:
    if req.dtype not in DTYPES:
        raise BuildError(f"dtype {req.dtype!r} is not supported by the coreml recipe ({', '.join(DTYPES)})")
    units = str(req.options.get("compute_units", "all")).lower()
    if units not in COMPUTE_UNITS:
        raise BuildError(f"unknown Core ML compute units {units!r}; choose one of {', '.join(COMPUTE_UNITS)}")
    partitioner, ct_version, precision = _partitioner(req.dtype, units)
    exported = export_model(req.model, req.example_inputs)
    program, summary = lower_and_emit(exported, [partitioner])
    summary.update({"partitioner": "CoreMLPartitioner", "compute_units": units, "compute_precision": precision,
                    "coremltools": ct_version})
    if not summary.get("delegate_calls"):
        summary.setdefault("warnings", []).append("Core ML delegated nothing; the program runs on portable kernels")
    return LoweringResult(program, [x.dtype for x in req.example_inputs], ops=graph_ops(exported), info=summary)
