"""The contract of a lowering recipe: one module per backend in bundles/backends/.

Each module exposes `lower(req: LoweringRequest) -> LoweringResult`. The builder
owns everything around it (model source, inputs, expected outputs, tolerances,
manifest, writing the bundle), so a new backend is one module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from bundlerun.bundles.errors import BuildError

BACKENDS: dict[str, str] = {
    "xnnpack": "bundlerun.bundles.backends.xnnpack",
    "portable": "bundlerun.bundles.backends.portable",
    "arm": "bundlerun.bundles.backends.arm",
    "cortex-m": "bundlerun.bundles.backends.arm",
    "vulkan": "bundlerun.bundles.backends.vulkan",
    "qnn": "bundlerun.bundles.backends.qnn",
    "mlx": "bundlerun.bundles.backends.mlx",
    "coreml": "bundlerun.bundles.backends.coreml",
    "metal": "bundlerun.bundles.backends.metal",
}

DTYPES = ("fp32", "fp16", "bf16", "int8", "int16")


@dataclass
class LoweringRequest:
    model: Any  # torch.nn.Module in eval mode, fp32 weights
    example_inputs: tuple  # fp32 torch tensors (or ints/bools) matching forward()
    calibration_inputs: list[tuple]  # for post-training quantization
    dtype: str  # fp32 | fp16 | bf16 | int8 | int16
    backend: str
    target: str  # the target URL the bundle is meant for
    options: dict[str, Any] = field(default_factory=dict)
    target_info: dict[str, Any] = field(default_factory=dict)  # what the target declares to lower for (BuildRequest.target_info)
    dynamic_shapes: Any = None  # torch.export's dynamic_shapes (bundles/dynamic_shapes.to_torch); None: static


@dataclass
class LoweringResult:
    program: Any  # executorch.exir.ExecutorchProgramManager
    input_dtypes: list[Any]  # torch dtype each bundled input must have (fp16 builds take half inputs)
    quantized_reference: Callable[..., Any] | None = None  # eager fake-quant model, for reference="quantized"
    output_qparams: list[tuple[float, int] | None] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)  # aten ops of the exported model
    quantization: str | None = None  # e.g. "xnnpack-ptq-symmetric-per-channel-int8"
    info: dict[str, Any] = field(default_factory=dict)  # partitioner, delegated node counts, ...


def default_dtype(backend: str, target_info: dict[str, Any]) -> str:
    """The dtype a build uses when none is given: the backend module's `default_dtype(target_info)`
    (int8 for integer Arm targets), else fp32. `target_info` is what the target declares to lower
    for: the caller asks the target registry (`bundlerun.targets.lowering_info(url)`), the floor
    above; bundles/ never imports targets/."""
    module = lowering_module(backend)
    chooser = getattr(module, "default_dtype", None)
    return chooser(target_info) if callable(chooser) else "fp32"


# Backends whose upstream tests compare a half-precision program with the eager model run in that
# same dtype, not with fp32: MLX's OpTestCase casts model and inputs to the test's dtype and takes
# `model(*test_inputs)` as the expected output (backends/mlx/test/test_utils.py:912-920), then
# compares with the dtype's TOLERANCE_PRESETS (backends/mlx/test/test_utils.py:1011-1014, 56-58).
_DTYPE_REFERENCE = {"mlx"}


def default_reference(backend: str, dtype: str) -> str:
    """What expected outputs come from when a build names no reference: the eager model in the
    build's dtype where the backend's own tests do that (fp16 / bf16 on MLX), else eager fp32."""
    if backend in _DTYPE_REFERENCE and dtype in ("fp16", "bf16"):
        return "eager-dtype"
    return "eager-fp32"


def lowering_module(backend: str):
    if backend not in BACKENDS:
        raise BuildError(f"unknown backend {backend!r}; known: {', '.join(sorted(BACKENDS))}")
    name = BACKENDS[backend]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise BuildError(f"backend {backend!r} is not available in this build of bundlerun") from None
        raise BuildError(f"backend {backend!r} needs a package that is not installed: {exc.name}") from None
