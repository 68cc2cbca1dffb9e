"""Tolerance resolution entry point used by `build` (and `tolerance explain`).

`resolve_criteria(ctx)` returns the Criteria for one output with a trail per
number. This module holds the simple per-dtype defaults the foundation ships;
the registry (bundles/registry.py + bundles/data/tolerances.toml) replaces the
body of `resolve_criteria` without changing its signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bundles.manifest import Criteria


@dataclass
class ToleranceContext:
    """Everything known about one output when its criteria are resolved."""

    backend: str  # xnnpack | portable | arm | cortex-m | qnn | vulkan | mlx | metal | coreml | nxp
    target: str  # target URL the bundle is built for, e.g. host://xnnpack, tosa://int
    dtype: str  # fp32 | fp16 | bf16 | int8 | int16 (the build's dtype tier)
    model: str | None = None
    method: str = "forward"
    output_index: int = 0
    output_name: str = "out0"
    output_dtype: str = "float32"  # dtype of the output tensor itself
    ops: list[str] = field(default_factory=list)  # aten op names in the model (op rules)
    reference: str = "eager-fp32"  # eager-fp32 | quantized
    input_distribution: str = "randn"
    host_arch: str | None = None  # machine that will judge/simulate (aarch64 adjustments)
    scale: float | None = None  # output quantization scale, when quantized
    zero_point: int | None = None
    expected: Any = None  # numpy array of expected values (data-dependent rules)


def _trail(criteria: Criteria, key: str, value: Any, source: str) -> None:
    criteria.trail.setdefault(key, []).append({"value": value, "source": source, "file": __file__})


# (dtype tier, reference) -> criteria. Foundation defaults only; see DESIGN §5.
_DEFAULTS: dict[tuple[str, str], dict[str, float]] = {
    ("fp32", "eager-fp32"): {"atol": 1e-3, "rtol": 1e-3},
    ("fp16", "eager-fp32"): {"atol": 1e-2, "rtol": 1e-2},
    ("bf16", "eager-fp32"): {"atol": 1e-1, "rtol": 1e-1},
    # int8 against the float model: element-wise bounds are meaningless after PTQ;
    # judge signal quality (xnnpack recipes: SQNR > 20 dB) and direction.
    ("int8", "eager-fp32"): {"sqnr_min_db": 20.0, "cosine_min": 0.98},
    ("int8", "quantized"): {"atol": 1e-3, "rtol": 1e-3, "qtol": 1},
}


def resolve_criteria(ctx: ToleranceContext, overrides: dict[str, Any] | None = None) -> Criteria:
    criteria = Criteria(scale=ctx.scale, zero_point=ctx.zero_point)
    if ctx.output_dtype == "bool":
        criteria.exact = True
        _trail(criteria, "exact", True, "bool outputs are exact")
        return criteria
    values = _DEFAULTS.get((ctx.dtype, ctx.reference)) or _DEFAULTS[("fp32", "eager-fp32")]
    for key, value in values.items():
        setattr(criteria, key, value)
        _trail(criteria, key, value, f"foundation default [{ctx.dtype}, reference={ctx.reference}]")
    for key, value in (overrides or {}).items():
        setattr(criteria, key, value)
        _trail(criteria, key, value, "explicit override")
    return criteria
