"""A suite flow (or a Tester) -> what the tolerance registry resolves for it.

The suite names backends its own way (`TestFlow.backend`: "qualcomm", "cortex_m"); the
registry (bundles/data/tolerances.toml) uses bundlerun's names. The dtype tier follows from
the flow: a quantizing flow is int8 (int16 for QNN's 16-bit activation flows, named
`qnn_16a...`), judged against the *quantized* reference, because the suite's reference is
the Tester's EXPORT stage, which a quantizing flow runs after Quantize
(backends/test/suite/runner.py run_test; harness/tester.py run_method_and_compare_outputs
uses `self.stages[StageType.EXPORT]`). A float flow's tier is its tensors' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# TestFlow.backend -> registry backend (None: the registry has no numbers for it)
REGISTRY_BACKENDS = {
    "portable": "portable",
    "xnnpack": "xnnpack",
    "arm": "arm",
    "qualcomm": "qnn",
    "qnn": "qnn",
    "vulkan": "vulkan",
    "coreml": "coreml",
    "cortex_m": "cortex-m",
    "cortex-m": "cortex-m",
    "nxp": "nxp",
    "mlx": "mlx",
}

# flow name -> the target a golden of that flow replays on by default (bundles/goldens.py):
# where the registry's variant for the flow lives. Prefixes, longest first.
DEFAULT_TARGETS = (
    ("arm_tosa_int", "tosa://int"),
    ("arm_tosa_fp", "tosa://fp"),
    ("arm_ethos_u55", "fvp://corstone-300/ethos-u55-128"),
    ("arm_ethos_u85", "fvp://corstone-320/ethos-u85-256"),
    ("arm_vgf", "vgf"),
    ("qnn", "qnn://htp-sim"),
    ("vulkan", "vulkan://lavapipe"),
    ("xnnpack", "host://xnnpack"),
    ("portable", "host://portable"),
)

FLOAT_TIERS = {"float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class FlowNumbers:
    """What the registry is asked for one flow's outputs."""

    backend: str | None  # registry backend, None when the registry has none for this flow
    dtype: str  # fp32 | fp16 | bf16 | int8 | int16
    reference: str  # eager-fp32 | quantized
    flow: str
    suite_backend: str

    @property
    def problem(self) -> str | None:
        if self.backend is None:
            return (f"the tolerance registry has no numbers for the {self.suite_backend} backend of flow "
                    f"{self.flow!r}; give them in bundlerun.toml [tolerances] or choose --bundlerun-backend")
        return None


def registry_backend(suite_backend: str) -> str | None:
    return REGISTRY_BACKENDS.get((suite_backend or "").lower())


def quantized_dtype(flow_name: str) -> str:
    return "int16" if "16a" in (flow_name or "").lower() else "int8"


def float_tier(tensors: list[Any]) -> str:
    """fp16/bf16 when the first floating tensor is half/bfloat16, else fp32."""
    for t in tensors:
        name = str(getattr(t, "dtype", "")).removeprefix("torch.")
        if name in FLOAT_TIERS:
            return FLOAT_TIERS[name]
        if name.startswith("float"):
            return "fp32"
    return "fp32"


def numbers_for(flow_name: str, suite_backend: str, quantized: bool, tensors: list[Any],
                backend_override: str | None = None) -> FlowNumbers:
    backend = backend_override or registry_backend(suite_backend)
    if quantized:
        return FlowNumbers(backend, quantized_dtype(flow_name), "quantized", flow_name, suite_backend)
    return FlowNumbers(backend, float_tier(tensors), "eager-fp32", flow_name, suite_backend)


def numbers_from_name(flow_name: str) -> FlowNumbers:
    """For goldens, where only the flow's folder name is known (GOLDEN_ARTIFACTS_DIR/<flow>/)."""
    name = (flow_name or "").lower()
    suite_backend = next((b for b in ("portable", "xnnpack", "arm", "qnn", "vulkan", "coreml", "cortex_m", "nxp", "mlx")
                          if name.startswith(b)), name)
    quantized = any(k in name for k in ("int8", "int16", "8a8w", "16a", "_int", "ethos"))
    return numbers_for(flow_name, suite_backend, quantized, [])


def default_target(flow_name: str) -> str | None:
    name = (flow_name or "").lower()
    for prefix, target in DEFAULT_TARGETS:
        if name.startswith(prefix):
            return target
    return None
