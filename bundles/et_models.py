"""`et:NAME`: ExecuTorch's example model factory (`executorch.examples.models.MODEL_NAME_TO_MODEL`,
`EagerModelFactory`, examples/models/model_factory.py:20-56) as a model source.

The factories load pretrained weights, which cannot be downloaded here and which bundlerun does not
need: the same architecture is built with seeded random weights (per name below: how), unless the
user gives `--state-dict FILE`. Example inputs are the factory's own `get_example_inputs()`, drawn
under a fixed seed; they decide the shapes, dtypes and (bundles/inputs.infer_distribution) the
distribution of the generated cases. Any download a factory still tries is refused (one line).
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import types
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from bundlerun.bundles.errors import ModelSourceError

PREFIX = "et:"
_EX = "examples/models"


def _tv(name: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import torchvision.models as tvm

        return getattr(tvm, name)(weights=None, **kwargs)
    return build


def _dl3() -> Any:
    from torchvision.models.segmentation import deeplabv3_resnet50

    # DEFAULT weights set num_classes=21 and aux_loss=True (torchvision segmentation/deeplabv3.py)
    return deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=True)


@dataclass(frozen=True)
class Offline:
    """How a name whose factory downloads weights is built without them."""
    how: str
    build: Callable[[], Any]


# name -> the same architecture as ExecuTorch's get_eager_model(), weights left to torch's seeded init
OFFLINE: dict[str, Offline] = {
    "mv2": Offline(f"torchvision mobilenet_v2(weights=None); {_EX}/mobilenet_v2/model.py:23 loads DEFAULT",
                   _tv("mobilenet_v2")),
    "mv3": Offline(f"torchvision mobilenet_v3_small(weights=None); {_EX}/mobilenet_v3/model.py:22-24 loads IMAGENET1K_V1",
                   _tv("mobilenet_v3_small")),
    "resnet18": Offline(f"torchvision resnet18(weights=None); {_EX}/resnet/model.py:27 loads IMAGENET1K_V1",
                        _tv("resnet18")),
    "resnet50": Offline(f"torchvision resnet50(weights=None); {_EX}/resnet/model.py:42 loads IMAGENET1K_V1",
                        _tv("resnet50")),
    "ic3": Offline(f"torchvision inception_v3(weights=None, transform_input=True, aux_logits=True) as the weighted "
                   f"builder sets; {_EX}/inception_v3/model.py:22 loads IMAGENET1K_V1",
                   _tv("inception_v3", transform_input=True, aux_logits=True, init_weights=True)),
    "vit": Offline(f"torchvision vit_b_16(weights=None); {_EX}/torchvision_vit/model.py:22 loads IMAGENET1K_V1",
                   _tv("vit_b_16")),
    "dl3": Offline(f"torchvision deeplabv3_resnet50(weights=None, num_classes=21, aux_loss=True); "
                   f"{_EX}/deeplab_v3/model.py:25-27 loads DEFAULT", _dl3),
}

# names whose get_eager_model() downloads and that bundlerun has no offline constructor for (why)
NO_OFFLINE: dict[str, str] = {
    "ic4": f"timm inception_v4(pretrained=True) ({_EX}/inception_v4/model.py:21); timm is not a dependency",
    "deit_tiny": f"timm deit_tiny_patch16_224(pretrained=True) ({_EX}/deit_tiny/model.py:27); timm is not a dependency",
    "edsr": f"torchsr edsr_r16f64(2, True) downloads ({_EX}/edsr/model.py:22); torchsr is not a dependency",
    "mobilebert": f"transformers from_pretrained model and tokenizer ({_EX}/mobilebert/model.py:23-30)",
}

# torchvision's classifiers take ImageNet-normalized RGB: torchvision/transforms/_presets.py
# ImageClassification (mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
IMAGENET_NORMALIZED = {"mv2", "mv2_untrained", "mv3", "resnet18", "resnet50", "ic3", "vit", "dl3"}


def _torchvision_importable() -> None:
    """The PyPI torchvision 0.28.0 wheel is CUDA-linked (0.28.0+cu130): its compiled ops (nms,
    roi_align; detection only) do not load with torch 2.13.0+cpu, and `import torchvision` fails
    registering their fake kernels. The model definitions are pure Python, so the op registrations
    are skipped when the ops are absent; with a CPU build of torchvision nothing changes."""
    if "torchvision" in sys.modules:
        return
    try:
        import importlib.util

        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    import torch

    ext = [p for p in Path(list(spec.submodule_search_locations)[0]).glob("_C*.so")]
    try:
        for so in ext:
            torch.ops.load_library(str(so))
        loaded = bool(ext)
    except OSError:
        loaded = False
    if not loaded:
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")


@contextlib.contextmanager
def _no_downloads(name: str) -> Iterator[None]:
    """A factory that still reaches for the network fails at once, in one line."""
    import torch.hub

    def refuse(url: Any, *args: Any, **kwargs: Any) -> Any:
        raise ModelSourceError(f"et:{name} tried to download {str(url)[:120]} (pretrained weights are not "
                               "fetched; pass --state-dict FILE)")

    saved = torch.hub.load_state_dict_from_url, torch.hub.download_url_to_file
    torch.hub.load_state_dict_from_url, torch.hub.download_url_to_file = refuse, refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.hub.load_state_dict_from_url, torch.hub.download_url_to_file = saved  # type: ignore[assignment]


def names() -> list[str]:
    from executorch.examples.models import MODEL_NAME_TO_MODEL

    return sorted(MODEL_NAME_TO_MODEL)


@dataclass
class EtModel:
    name: str
    module: Any
    examples: tuple
    dynamic_shapes: Any
    weights: dict[str, Any]  # {"kind": "seeded-random", "seed", "how"} or {"kind": "state-dict", "file", "sha256"}


def load(name: str, state_dict: str | Path | None = None) -> EtModel:
    """ExecuTorch's example `name`, with seeded random weights or the user's state dict."""
    import importlib

    import torch

    from executorch.examples.models import MODEL_NAME_TO_MODEL

    if name not in MODEL_NAME_TO_MODEL:
        import difflib

        close = difflib.get_close_matches(name, list(MODEL_NAME_TO_MODEL), n=1)
        hint = f"; did you mean et:{close[0]}?" if close else f"; known: {', '.join(sorted(MODEL_NAME_TO_MODEL))}"
        raise ModelSourceError(f"unknown ExecuTorch example model {name!r}{hint}")
    if name in NO_OFFLINE:
        raise ModelSourceError(f"et:{name} cannot be built here: {NO_OFFLINE[name]}")
    _torchvision_importable()
    module_name, class_name = MODEL_NAME_TO_MODEL[name]
    seed = zlib.crc32(f"et:{name}".encode())
    with _no_downloads(name):
        try:
            mod = importlib.import_module(f"executorch.examples.models.{module_name}")
            factory = getattr(mod, class_name)()
            torch.manual_seed(seed)
            examples = factory.get_example_inputs()
            torch.manual_seed(seed)
            offline = OFFLINE.get(name)
            module = offline.build() if offline else factory.get_eager_model()
            dynamic = factory.get_dynamic_shapes() if hasattr(factory, "get_dynamic_shapes") else None
        except ModelSourceError:
            raise
        except ModuleNotFoundError as exc:
            raise ModelSourceError(f"et:{name} needs the Python package {exc.name!r}, which is not installed") from None
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            raise ModelSourceError(f"building et:{name} failed: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(module, torch.nn.Module):
        raise ModelSourceError(f"et:{name}'s factory returned {type(module).__name__}, not an nn.Module")
    if not isinstance(examples, tuple):
        examples = (examples,)
    if state_dict is None:
        from bundlerun.bundles.zoo import _randomize_norm_stats  # start-up: loads numpy on use

        _randomize_norm_stats(module, seed + 1)
        how = offline.how if offline else "the factory's own get_eager_model() (it downloads nothing)"
        weights: dict[str, Any] = {"kind": "seeded-random", "seed": seed, "how": how}
    else:
        weights = _load_state_dict(name, module, Path(state_dict))
    return EtModel(name, module.eval(), examples, dynamic, weights)


def _load_state_dict(name: str, module: Any, path: Path) -> dict[str, Any]:
    """The user's weights: `torch.load(weights_only=True)` (no pickle code runs), strict key match."""
    import torch

    if not path.is_file():
        raise ModelSourceError(f"--state-dict {path}: no such file")
    data = path.read_bytes()
    try:
        import io

        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelSourceError(f"--state-dict {path}: not a torch state dict ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise ModelSourceError(f"--state-dict {path}: holds a {type(state).__name__}, not a name -> tensor mapping")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).replace("\n", " ")[:240]
        raise ModelSourceError(f"--state-dict {path} does not fit et:{name}: {first}") from None
    return {"kind": "state-dict", "file": str(path), "sha256": hashlib.sha256(data).hexdigest()}
