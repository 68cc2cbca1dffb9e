"""Turn a model reference into a module + input specs.

A reference is a zoo name (`tiny-cnn`) or a user factory `path/to/file.py:fn`.
The factory returns `(module, example_inputs)`; an optional third element
`{"distribution": "rand"}` (or a per-input list) declares the input distribution, and
`{"dynamic_shapes": ...}` (as torch.export takes it) the dynamic dims (bundles/dynamic_shapes.py).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import ModelSourceError
from bundlerun.bundles.user_code import _bounded, _FactoryTimeout, _raised, factory_timeout, load_callable
from bundlerun.bundles.zoo import ZOO, InputSpec
from bundlerun.bundles import et_models
from bundlerun.bundles.dynamic_shapes import normalize
from bundlerun.bundles.inputs import infer_distribution

_TORCH_TO_NAME = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.int64": "int64",
    "torch.int32": "int32",
    "torch.int8": "int8",
    "torch.uint8": "uint8",
    "torch.bool": "bool",
}


@dataclass
class ResolvedModel:
    name: str
    source: str  # "zoo" | "factory:<path>:<fn>"
    description: str
    module: Any  # torch.nn.Module, eval mode
    inputs: list[InputSpec]
    weights: dict[str, Any] | None = None  # et: sources: seeded random or the user's state dict
    input_structure: str | None = None  # nested example inputs: the pytree spec they were flattened by
    inputs_inferred: bool = False  # distribution read from the example tensors (bundles/inputs.infer_distribution)
    examples: tuple | None = None  # the flat example tensors (real-input readers take their range)
    dynamic: list[Any] = field(default_factory=list)  # bundles/dynamic_shapes.DynDim: declared dynamic dims


def flatten_examples(module: Any, examples: tuple) -> tuple[Any, tuple, str | None]:
    """Flatten nested example inputs (ExecuTorch's lstm: `(x, (h0, c0))`) the way torch.export
    does: its in_spec is the pytree of the arguments and the program takes the leaves in
    `tree_flatten` order, as BundledProgram's cases list them. A nested module is wrapped so it
    takes the flat leaves; returns (module, leaves, spec text or None when already flat)."""
    import torch
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten(examples)
    if all(isinstance(x, torch.Tensor) for x in examples):
        return module, tuple(examples), None
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            raise ModelSourceError(f"example input leaf {i} is a {type(leaf).__name__}; only tensors (in tuples, "
                                   "lists or dicts) are supported")

    class FlatInputs(torch.nn.Module):
        """`module` taking its nested inputs as the flat leaves (torch.export's order)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *flat: Any) -> Any:
            return self.inner(*pytree.tree_unflatten(list(flat), spec))

    shape = repr(pytree.tree_unflatten([_Leaf(f"in{i}") for i in range(len(leaves))], spec))
    wrapper = FlatInputs(module)
    wrapper.training = False  # not .eval(): an ExportedProgram's module() refuses train()/eval()
    return wrapper, tuple(leaves), shape


class _Leaf(str):
    """An input's name printed bare, so a structure reads `(in0, (in1, in2))`."""

    def __repr__(self) -> str:
        return str(self)


def specs_from_examples(examples: tuple, distribution: str | list[str] | None) -> list[InputSpec]:
    """One spec per example tensor; without a declared distribution, the one the example looks
    drawn from (bundles/inputs.infer_distribution)."""
    import torch

    specs = []
    for i, x in enumerate(examples):
        if not isinstance(x, torch.Tensor):
            raise ModelSourceError(f"example input {i} is a {type(x).__name__}; only tensors are supported")
        dtype = _TORCH_TO_NAME.get(str(x.dtype))
        if dtype is None:
            raise ModelSourceError(f"example input {i} has unsupported dtype {x.dtype}")
        dist = distribution[i] if isinstance(distribution, list) else distribution
        if dist is None:
            dist = infer_distribution(x.detach().cpu().float().numpy() if x.dtype == torch.bfloat16
                                      else x.detach().cpu().numpy())
        specs.append(InputSpec(tuple(x.shape), dtype, dist))
    return specs


def _from_examples(name: str, source: str, description: str, module: Any, examples: tuple,
                   distribution: Any, weights: dict[str, Any] | None = None,
                   dynamic_shapes: Any = None) -> ResolvedModel:
    """A model record from a module and its (possibly nested) example inputs; `dynamic_shapes`
    as torch.export takes it (bundles/dynamic_shapes.py)."""

    forward_of = module
    module, flat, structure = flatten_examples(module, examples)
    if dynamic_shapes is not None and structure is not None:
        raise ModelSourceError("dynamic_shapes with nested example inputs is not supported: give flat tensor inputs")
    dynamic = normalize(dynamic_shapes, forward_of, flat)
    specs = specs_from_examples(flat, distribution)
    return ResolvedModel(name, source, description, module, specs, weights=weights, input_structure=structure,
                         inputs_inferred=distribution is None, examples=flat, dynamic=dynamic)


def resolve_model(ref: str, distribution: str | None = None, state_dict: str | Path | None = None) -> ResolvedModel:
    """Instantiate the model named by `ref`; `distribution` overrides the declared one."""

    if ref.startswith(et_models.PREFIX):
        et = et_models.load(ref[len(et_models.PREFIX):], state_dict)
        return _from_examples(et.name, f"executorch-example:{et.name}", "ExecuTorch examples/models factory",
                              et.module, et.examples, distribution, et.weights, et.dynamic_shapes)
    if state_dict is not None:
        raise ModelSourceError("--state-dict applies to ExecuTorch example models (et:NAME) only")
    if ":" in ref and (ref.rpartition(":")[0].endswith(".py") or "/" in ref):
        fn = load_callable(ref)
        limit = factory_timeout()
        try:
            with _bounded(limit):
                produced = fn()
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM stay an interrupt
            raise
        except BaseException as exc:  # SystemExit and other BaseExceptions too: never a silent exit
            if isinstance(exc, _FactoryTimeout):
                raise ModelSourceError(f"model factory {ref} {exc}") from None
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            raise ModelSourceError(
                f"model factory {ref} raised {_raised(exc)} ({Path(frame.filename).name}:{frame.lineno})"
            ) from None
        if not isinstance(produced, tuple) or len(produced) not in (2, 3):
            raise ModelSourceError(f"model factory {ref} must return (module, example_inputs[, options])")
        module, examples = produced[0], produced[1]
        options = produced[2] if len(produced) == 3 else {}
        if not isinstance(examples, tuple):
            examples = (examples,)
        if not hasattr(module, "forward"):
            raise ModelSourceError(f"model factory {ref} returned {type(module).__name__}, not a torch.nn.Module")
        name = Path(ref.rpartition(":")[0]).stem + "." + ref.rpartition(":")[2]
        if not isinstance(options, dict):
            raise ModelSourceError(f"model factory {ref}: its third element must be a dict of options, not "
                                   f"{type(options).__name__}")
        return _from_examples(name, f"factory:{ref}", options.get("description", ""), module.eval(), examples,
                              distribution or options.get("distribution"), dynamic_shapes=options.get("dynamic_shapes"))
    if ref not in ZOO:
        import difflib

        close = difflib.get_close_matches(ref, list(ZOO), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(ZOO)}"
        raise ModelSourceError(f"unknown model {ref!r}{hint} (or give path.py:factory)")
    entry = ZOO[ref]
    specs = entry.inputs
    if distribution:
        specs = [InputSpec(s.shape, s.dtype, distribution) for s in specs]
    try:
        module = entry.build()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise ModelSourceError(f"building zoo model {ref} failed: {_raised(exc)}") from None
    return ResolvedModel(entry.name, "zoo", entry.description, module, specs)
