"""Tolerance resolution entry point used by `build` (and `tolerance explain`).

`resolve_criteria(ctx)` returns the Criteria for one output, each number with its
trail (`Criteria.trail[criterion]` = list of {"value", "source", "file"}, winning
entry last). The numbers come from the tolerance registry: the built-in data
file `bundles/data/tolerances.toml` merged with the project's `[tolerances]`
(bundlerun.toml or pyproject `[tool.bundlerun]`); see bundles/registry.py for the
chain. The result is embedded in the bundle's manifest: `run` judges with those
embedded numbers, never with the registry installed where it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bundlerun.bundles.manifest import Criteria
from bundlerun.bundles.errors import ConfigError


@dataclass
class ToleranceContext:
    """Everything known about one output when its criteria are resolved."""

    backend: str  # a registry backend: xnnpack, arm, cortex-m, qnn, vulkan, mlx, metal, coreml, mps, nxp, ...
    target: str  # target URL the bundle is built for, e.g. host://xnnpack, tosa://int (or a variant name)
    dtype: str  # fp32 | fp16 | bf16 | int8 | int16 (the build's dtype tier)
    model: str | None = None
    method: str = "forward"
    output_index: int = 0
    output_name: str = "out0"
    output_dtype: str = "float32"  # dtype of the output tensor itself
    ops: list[str] = field(default_factory=list)  # aten op names in the model (op rules)
    reference: str = "eager-fp32"  # eager-fp32 | quantized
    input_distribution: str = "randn"
    host_arch: str | None = None  # machine that will judge/simulate (aarch64 adjustments); None = this one
    scale: float | None = None  # output quantization scale, when quantized
    zero_point: int | None = None
    expected: Any = None  # numpy array of expected values (data-dependent rules)
    variant: str | None = None  # target variant (tosa-int, ethos-u55, htp, ...); None = derived from target
    quantization: str | None = None  # quantization scheme (e.g. "...groupwise...", "...int4..."): op rules
    reference_dtype: str | None = None  # dtype of the eager reference's output, when it differs from the program's


def resolve_criteria(ctx: ToleranceContext, overrides: dict[str, Any] | None = None, registry: Any = None) -> Criteria:
    """Criteria for one output. `overrides` are explicit (CLI) values: `{"atol": 0.05}`
    or selector keys `{"out0.atol": 0.05, "forward.out1.qtol": 2}`; None unsets.

    Refuses (ConfigError) an output left with no criterion at all: that happens where the test
    ExecuTorch has for it turns every check of this tier off (Arm's `frobenius_threshold=None,
    cosine_threshold=None` against the float model), and a bundle must not pass it unchecked."""
    res = explain(ctx, overrides, registry)
    if not res.criteria.has_any:
        raise ConfigError(
            f"{ctx.backend} {res.variant or ''} {res.tier} {ctx.model or ''} {ctx.output_name}: no criterion left "
            "(ExecuTorch's own test turns every check of this tier off); build with --reference quantized, "
            "or give one with --tolerance (see `bundlerun tolerance explain`)".replace("  ", " "))
    return res.criteria


def explain(ctx: ToleranceContext, overrides: dict[str, Any] | None = None, registry: Any = None):
    """The full resolution (criteria + every matched registry step), for `tolerance explain`."""
    from bundlerun.bundles.project_config import default_registry  # start-up: loads tomli on use

    reg = registry if registry is not None else default_registry()
    return reg.resolve(ctx, overrides)
