"""Dynamic input dimensions a model source declares, and the shapes a bundle tests them at.

A source declares them the way torch.export takes them (`dynamic_shapes`: per input a dict
{dim: Dim} or a per-dim list; or a dict keyed by forward()'s argument names), as ExecuTorch's
EagerModelFactory.get_dynamic_shapes() returns them, or as the symbolic dims of an
ExportedProgram. The bundle tests every dynamic dim at its minimum, a typical value and its
maximum: ExecuTorch's runner grew `--input_shapes` because bugs hide at the upper bound
(pytorch/executorch PR #22411).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from bundlerun.bundles.errors import ModelSourceError

POINTS = ("min", "typical", "max")  # the order cases cycle through


@dataclass(frozen=True)
class DynDim:
    """One dynamic dimension of one (flat) input: torch.export's Dim, as plain numbers."""

    input: int
    dim: int
    name: str
    min: int
    max: int

    def at(self, point: str, example: int) -> int:
        """The size tested at `point`: typical is the example's size when it lies strictly inside
        the range, else the midpoint (bundlerun's own choice: a size neither bound)."""
        if point == "min":
            return self.min
        if point == "max":
            return self.max
        return example if self.min < example < self.max else (self.min + self.max) // 2

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "dim": self.dim, "name": self.name, "min": self.min, "max": self.max}


def _bound(value: Any, name: str, what: str) -> int:
    try:  # torch's unbounded int_oo raises AttributeError from int(), inf OverflowError
        number = int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        raise ModelSourceError(f"dynamic dim {name!r} has no finite {what} (give Dim({name!r}, min=..., max=...))") from None
    return number


def _dim(spec: Any, index: int, dim: int, rank: int) -> DynDim:
    if not 0 <= dim < rank:
        raise ModelSourceError(f"dynamic_shapes: input {index} has {rank} dimensions, no dimension {dim}")
    name = getattr(spec, "__name__", None)
    if name is None or not hasattr(spec, "max"):
        raise ModelSourceError(f"dynamic_shapes: input {index} dim {dim} is a {type(spec).__name__}, not a "
                               "torch.export.Dim")
    low, high = _bound(spec.min, name, "minimum"), _bound(spec.max, name, "maximum")
    if not 0 <= low <= high:
        raise ModelSourceError(f"dynamic dim {name!r}: range {low}..{high} is empty")
    return DynDim(index, dim, str(name), low, high)


def normalize(dynamic_shapes: Any, module: Any, examples: tuple) -> list[DynDim]:
    """The declared dynamic dims of the flat `examples`, one record each (empty: all static).
    Raises ModelSourceError, one line, for a declaration that names no input or has no bound."""
    if dynamic_shapes is None:
        return []
    per_input: list[Any]
    if isinstance(dynamic_shapes, dict):
        try:
            params = list(inspect.signature(module.forward).parameters)
        except (TypeError, ValueError):
            params = []
        unknown = [k for k in dynamic_shapes if k not in params]
        if unknown:
            raise ModelSourceError(f"dynamic_shapes names {unknown[0]!r}, which is not an argument of forward() "
                                   f"({', '.join(params) or 'none'})")
        per_input = [dynamic_shapes.get(p) for p in params[:len(examples)]]
    elif isinstance(dynamic_shapes, (tuple, list)):
        per_input = list(dynamic_shapes)
    else:
        raise ModelSourceError(f"dynamic_shapes must be a tuple, list or dict, not {type(dynamic_shapes).__name__}")
    if len(per_input) != len(examples):
        raise ModelSourceError(f"dynamic_shapes describes {len(per_input)} inputs, the model takes {len(examples)}")
    dims: list[DynDim] = []
    for i, (spec, example) in enumerate(zip(per_input, examples)):
        rank = len(getattr(example, "shape", ()))
        if spec is None:
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec) if isinstance(spec, (tuple, list)) else None
        if items is None:
            raise ModelSourceError(f"dynamic_shapes: input {i} is a {type(spec).__name__}, not a dict or list of Dims")
        dims.extend(_dim(d, i, int(k), rank) for k, d in items if d is not None)
    return dims


def from_exported(ep: Any) -> Any:
    """An ExportedProgram's symbolic input dims as a `dynamic_shapes` tuple (None: all static),
    bounded by its range constraints; a symbol shared by two inputs stays one Dim."""
    import torch

    user_inputs = list(ep.graph_signature.user_inputs)
    nodes = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    made: dict[str, Any] = {}
    shapes: list[Any] = []
    for name in user_inputs:
        val = nodes[name].meta.get("val") if name in nodes else None
        spec: dict[int, Any] = {}
        for d, size in enumerate(getattr(val, "shape", ())):
            if isinstance(size, torch.SymInt):
                symbol = size.node.expr
                key = str(symbol)
                if key not in made:
                    rng = ep.range_constraints.get(symbol)
                    if rng is None:
                        raise ModelSourceError(f"the ExportedProgram's dim {key} is not a plain symbol with a range")
                    made[key] = torch.export.Dim(f"d_{key}", min=_bound(rng.lower, key, "minimum"),
                                                 max=_bound(rng.upper, key, "maximum"))
                spec[d] = made[key]
        shapes.append(spec or None)
    return tuple(shapes) if any(s is not None for s in shapes) else None


def to_torch(dims: list[DynDim], count: int) -> tuple | None:
    """The `dynamic_shapes` torch.export takes for `count` flat inputs; one Dim per name."""
    if not dims:
        return None
    import torch

    made: dict[str, Any] = {}
    per_input: list[dict[int, Any] | None] = [None] * count
    for d in dims:
        if d.name not in made:
            made[d.name] = torch.export.Dim(d.name, min=d.min, max=d.max)
        per_input[d.input] = {**(per_input[d.input] or {}), d.dim: made[d.name]}
    return tuple(per_input)


def shapes_at(dims: list[DynDim], example_shapes: list[tuple[int, ...]], point: str) -> list[tuple[int, ...]]:
    """Every input's shape with its dynamic dims at `point` (min, typical or max)."""
    shapes = [list(s) for s in example_shapes]
    for d in dims:
        shapes[d.input][d.dim] = d.at(point, example_shapes[d.input][d.dim])
    return [tuple(s) for s in shapes]


def case_points(count: int) -> list[str]:
    """Which point each of `count` cases tests: min, typical, max, min, ..."""
    return [POINTS[i % len(POINTS)] for i in range(count)]


def shape_over_cases(shapes: list[list[int]]) -> tuple[list[int], list[int]]:
    """(the largest size of every dim, the dims whose size varies) over one tensor's cases.
    Cases of different ranks raise ValueError: no program takes both."""
    first = list(shapes[0])
    if any(len(s) != len(first) for s in shapes):
        raise ValueError(f"cases have tensors of different ranks ({sorted({len(s) for s in shapes})})")
    largest = [max(s[d] for s in shapes) for d in range(len(first))]
    varying = [d for d in range(len(first)) if any(s[d] != first[d] for s in shapes)]
    return largest, varying
