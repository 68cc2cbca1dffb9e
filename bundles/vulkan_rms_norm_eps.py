"""A workaround that lets export_llama's `vulkan_8w` lowering finish at executorch 1.5.1.

The Vulkan partitioner's preprocess fuses RMSNorm into `et_vk.rms_norm` (FusePatternsPass,
backends/vulkan/patterns/rms_norm.py) and reads the epsilon with `_extract_eps_value` (lines 248-257).
In fp32/fp16 the epsilon is a float argument of `aten.add`; after pt2e quantization (`vulkan_8w`:
prepare_pt2e turns scalar arguments into tensor constants) it is a lifted buffer placeholder
(`b__tensor_constant_N`) whose `meta["val"]` is a FakeTensor, and `float(val.item())` at line 254 raises
GuardOnDataDependentSymNode: the export fails ("An error occurred when running the 'FusePatternsPass'").

While bundlerun runs export_llama for Vulkan, the rms_norm replacement is wrapped: an epsilon that is
a placeholder of the ExportedProgram is read from the program's own buffers or lifted constants
(`ep.state_dict` / `ep.constants`, named by `ep.graph_signature`) - the real value the quantizer lifted,
1e-5 for these models - and handed to ExecuTorch's unchanged replacement as a float. Nothing else of the
lowering changes; the manifest's `build.lowering.workarounds` says how many epsilons were read this way.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

PATTERN = "rms_norm"
WHERE = "backends/vulkan/patterns/rms_norm.py:254"


def _lifted_value(ep: Any, node: Any) -> float | None:
    """The float a placeholder of `ep` holds when it is a one-element buffer or lifted constant, else None."""
    sig = ep.graph_signature
    name = sig.inputs_to_lifted_tensor_constants.get(node.name) or sig.inputs_to_buffers.get(node.name)
    if name is None:
        return None
    tensor = ep.constants.get(name) if name in ep.constants else ep.state_dict.get(name)
    if tensor is None or tensor.numel() != 1:
        return None
    return float(tensor.item())


@contextlib.contextmanager
def lifted_eps_resolved() -> Iterator[list[str]]:
    """Within the block, the Vulkan rms_norm fusion reads a lifted epsilon from the program; yields the list
    of `placeholder=value` it resolved (empty when every epsilon was already a float: fp32, fp16)."""
    import torch  # start-up: torch and the Vulkan backend load only for a Vulkan LLM export
    from executorch.backends.vulkan.patterns import pattern_registry
    import executorch.backends.vulkan.patterns.rms_norm  # noqa: F401 - registers the pattern

    entry = pattern_registry.fusable_patterns[PATTERN]
    original = entry.create_replacement_fn
    resolved: list[str] = []

    def replacement(ep: Any, graph_module: Any, match: Any) -> Any:
        node = match.eps_node
        if isinstance(node, torch.fx.Node) and node.op == "placeholder":
            value = _lifted_value(ep, node)
            if value is not None:
                match.eps_node = value
                resolved.append(f"{node.name}={value:g}")
        return original(ep, graph_module, match)

    entry.create_replacement_fn = replacement
    try:
        yield resolved
    finally:
        entry.create_replacement_fn = original
