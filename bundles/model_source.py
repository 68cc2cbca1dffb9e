"""Turn a model reference into a module + input specs.

A reference is a zoo name (`tiny-cnn`) or a user factory `path/to/file.py:fn`.
The factory returns `(module, example_inputs)`; an optional third element
`{"distribution": "rand"}` (or a per-input list) declares the input distribution.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import ModelSourceError
from bundlerun.bundles.user_code import _bounded, _FactoryTimeout, _raised, factory_timeout, load_callable
from bundlerun.bundles.zoo import ZOO, InputSpec

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


def specs_from_examples(examples: tuple, distribution: str | list[str] | None) -> list[InputSpec]:
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
            dist = "randn" if x.is_floating_point() else "randint(0,9)"
        specs.append(InputSpec(tuple(x.shape), dtype, dist))
    return specs


def resolve_model(ref: str, distribution: str | None = None) -> ResolvedModel:
    """Instantiate the model named by `ref`; `distribution` overrides the declared one."""
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
        specs = specs_from_examples(examples, distribution or options.get("distribution"))
        name = Path(ref.rpartition(":")[0]).stem + "." + ref.rpartition(":")[2]
        return ResolvedModel(name, f"factory:{ref}", options.get("description", ""), module.eval(), specs)
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
