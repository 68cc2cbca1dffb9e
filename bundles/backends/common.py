"""Pieces every lowering recipe shares: export, PT2E quantization, output qparams,
graph inspection. Recipes call these instead of repeating them."""

from __future__ import annotations

import warnings
from typing import Any

from bundlerun.bundles.errors import BuildError

# Ops that only move or reshape data: an output behind them keeps its producer's qparams.
_PASSTHROUGH = ("view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "clone", "_to_copy", "contiguous", "getitem")


def quiet_framework_logs() -> None:
    """torchao and torch warn at import about optional CUDA kernels and pytree
    registrations; on a CPU host that is noise in every build log."""
    import logging

    for name in ("torchao", "torch.utils._pytree", "torch._export", "executorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def export_model(module: Any, example_inputs: tuple, dynamic_shapes: Any = None):
    """torch.export (non-strict) with a one-line BuildError on failure; `dynamic_shapes` as
    torch.export takes it (None: every dim static)."""
    import torch

    warnings.filterwarnings("ignore")
    try:
        return torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:
        raise BuildError(f"torch.export failed: {type(exc).__name__}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def quantize_pt2e(exported, quantizer: Any, calibration_inputs: list[tuple]):
    """prepare -> calibrate -> convert; returns the converted GraphModule (the eager
    quantized reference) ready to be exported again."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    try:
        prepared = prepare_pt2e(exported.module(check_guards=False), quantizer)
        for sample in calibration_inputs:
            prepared(*sample)
        return convert_pt2e(prepared)
    except Exception as exc:
        raise BuildError(f"post-training quantization failed: {type(exc).__name__}: {_first_line(exc)}") from None


def _is_dequantize(node: Any) -> bool:
    return node.op == "call_function" and "dequantize_per_tensor" in str(node.target)


def _constant(graph_module: Any, value: Any) -> Any:
    """A scale/zero point argument may be a literal or a get_attr node."""
    if hasattr(value, "op") and value.op == "get_attr":
        obj = graph_module
        for part in str(value.target).split("."):
            obj = getattr(obj, part)
        return obj.item() if hasattr(obj, "item") else obj
    return value


def output_qparams(graph_module: Any) -> list[tuple[float, int] | None]:
    """(scale, zero_point) of each graph output that comes out of a dequantize."""
    output_node = next(n for n in graph_module.graph.nodes if n.op == "output")
    args = output_node.args[0]
    if not isinstance(args, (list, tuple)):
        args = [args]
    result: list[tuple[float, int] | None] = []
    for arg in args:
        node, found = arg, None
        for _ in range(16):
            if not hasattr(node, "op"):
                break
            if _is_dequantize(node):
                scale = _constant(graph_module, node.args[1])
                zero_point = _constant(graph_module, node.args[2])
                found = (float(scale), int(zero_point))
                break
            if node.op == "call_function" and any(p in str(node.target) for p in _PASSTHROUGH) and node.args:
                node = node.args[0]
                continue
            break
        result.append(found)
    return result


def graph_ops(exported) -> list[str]:
    """Sorted aten op names of an exported program (used by op rules in the registry)."""
    ops = set()
    for node in exported.graph_module.graph.nodes:
        if node.op == "call_function":
            ops.add(op_name(node.target))
    return sorted(ops)


def op_name(target: Any) -> str:
    """'aten.convolution.default' / aten::addmm.out -> 'convolution' / 'addmm';
    other namespaces keep theirs ('quantized_decomposed.quantize_per_tensor')."""
    text = str(target) if hasattr(target, "_schema") else (getattr(target, "__name__", None) or str(target))
    text = text.replace("::", ".")
    parts = text.split(".")
    if len(parts) < 2:
        return text
    return parts[1] if parts[0] == "aten" else f"{parts[0]}.{parts[1]}"


def delegation_summary(edge_manager) -> dict[str, Any]:
    """How much of the graph went to delegates, and which ops stayed on portable kernels."""
    graph = edge_manager.exported_program().graph_module.graph
    delegates = 0
    undelegated: set[str] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target)
        if "executorch_call_delegate" in target:
            delegates += 1
        elif "getitem" not in target:
            undelegated.add(op_name(node.target))
    return {"delegate_calls": delegates, "undelegated_ops": sorted(undelegated)}


def lower_and_emit(exported, partitioners: list[Any]) -> tuple[Any, dict[str, Any]]:
    """to_edge_transform_and_lower + to_executorch with one-line errors."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    try:
        edge = to_edge_transform_and_lower(
            exported,
            partitioner=partitioners,
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    except Exception as exc:
        raise BuildError(f"lowering failed: {type(exc).__name__}: {_first_line(exc)}") from None
    summary = delegation_summary(edge)
    try:
        program = edge.to_executorch()
    except Exception as exc:
        raise BuildError(f"to_executorch failed: {type(exc).__name__}: {_first_line(exc)}") from None
    return program, summary
