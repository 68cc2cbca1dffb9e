"""Content-addressed cache of built bundles: `$BUNDLERUN_CACHE/builds/<key>/bundle.bpte`
(default `${XDG_CACHE_HOME:-~/.cache}/bundlerun/builds/`).

The key is a sha256 over everything a build depends on:

- the model: its reference as given, and its source — for a zoo model the code of
  bundlerun's `bundles/` package (the zoo, the dataset-trained models, the lowering
  recipes, the builder, the tolerance code and data), for `path.py:factory` the content
  of that file (files it imports are not followed: edit one of those and pass
  `--no-cache`);
- the input spec (`--distribution`), cases, seed, dtype, backend, target (the backend's
  options), reference kind, calibration settings (count, and the samples when given),
  explicit tolerances, dataset samples and labels, `--require-delegation`;
- the tolerance registry as resolved for the build (every layer's file and content), since
  resolved criteria are embedded in the bundle;
- package versions (bundlerun, torch, executorch, numpy, tosa-tools, ethos-u-vela, mlx,
  flatbuffers), Python version, machine, and the environment variables builds read;
- for an `--etrecord` build, the output's file name without its suffix: the ETRecord and the delegate
  graphs are written beside the bundle under that stem, and the manifest records those names. They are
  cached with the bundle and a hit writes them beside its output, each checked against the sha256 its
  manifest records first (a missing or changed one discards the entry);
- `$BUNDLERUN_BUILD_TAG`, a free string for what the key cannot see: a backend patched in
  place or at import (a planted fault in tests/fixtures/planted_llm_fault.py, a fix being
  tried in site-packages) - set it and such builds are cached apart from the others.

The key is recorded in the manifest (`build.cache_key`). Entries are written atomically
(a temp folder renamed into place). A hit is read back through `read_bundle`, i.e. the
same schema, consistency and integrity checks as any bundle; an entry that fails them,
or whose recorded key differs, is discarded and rebuilt, never used.

The folder is bounded: after each store the least recently used entries go until the rest fit in
`$BUNDLERUN_BUILD_CACHE_MB` (default 5120; 0: no bound). A hit marks its entry used. Every change to
`bundles/` makes every key new, so without a bound the folder only grows (a small LLM's entry is
100-220 MB). The default is bundlerun's own, ccache's default `max_size` (5 GB).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from bundlerun.bundles import versions
from bundlerun.bundles.cache_dirs import cache_dir
from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.partition_control import cache_material

SCHEMA = "bundlerun.build-cache/1"
BUNDLE_FILE = "bundle.bpte"
PACKAGES = ("bundlerun", "torch", "executorch", "numpy", "tosa-tools", "ethos-u-vela", "mlx", "flatbuffers")
BUILD_ENV = ("BUNDLERUN_TOLERANCES", "BUNDLERUN_THIRD_PARTY", "BUNDLERUN_EXECUTORCH_SRC", "QNN_SDK_ROOT",
             "BUNDLERUN_BUILD_TAG")
MAX_MB_ENV = "BUNDLERUN_BUILD_CACHE_MB"
DEFAULT_MAX_MB = 5120  # bundlerun's own: ccache's default max_size
_STALE_TEMP_S = 24 * 3600  # a writer's temp folder this old belongs to a killed writer
_CODE_DIGEST: str | None = None


def builds_dir() -> Path:
    """`<cache root>/builds` (bundles/cache_dirs.py), beside runners/."""
    return cache_dir("builds")


def package_versions() -> dict[str, str]:
    return versions.package_versions(PACKAGES)


def code_digest() -> str:
    """sha256 of bundlerun's build code and data (`bundles/`): the source of zoo models and recipes."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        root = Path(__file__).resolve().parent
        h = hashlib.sha256()
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                           and p.suffix not in (".pyc", ".pyo")):
            rel = path.relative_to(root).as_posix().encode()
            h.update(len(rel).to_bytes(4, "little") + rel)
            data = path.read_bytes()
            h.update(len(data).to_bytes(8, "little") + data)
        _CODE_DIGEST = h.hexdigest()
    return _CODE_DIGEST


def _model_source(ref: str) -> dict[str, Any]:
    if ":" in ref and (ref.rpartition(":")[0].endswith(".py") or "/" in ref):
        path = Path(ref.rpartition(":")[0])
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            digest = None  # the build reports the missing file; nothing is cached for it
        return {"factory": ref.rpartition(":")[2], "file": str(path.resolve()), "sha256": digest}
    return {"zoo": ref}


def _file_digest(path: Any) -> str | None:
    """sha256 of a file the build reads (a state dict); "unreadable" keeps such a build uncached."""
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def _inputs_digest(inputs: Any, count: int) -> Any:
    """The real-input source: a packaged set by name, a user's folder by the contents of the files used."""
    if inputs is None:
        return None
    from bundlerun.bundles.real_inputs import source_digest  # start-up: loads numpy on use

    return source_digest(str(inputs), count)


def _arrays_digest(arrays: Any) -> str | None:
    """sha256 over nested lists of numpy arrays (dtype, shape, bytes)."""
    import numpy as np

    if arrays is None:
        return None
    h = hashlib.sha256()

    def add(x: Any) -> None:
        if isinstance(x, (list, tuple)):
            h.update(b"[" + len(x).to_bytes(8, "little"))
            for item in x:
                add(item)
            h.update(b"]")
        else:
            a = np.ascontiguousarray(np.asarray(x))
            head = json.dumps([str(a.dtype), list(a.shape)]).encode()
            h.update(b"A" + len(head).to_bytes(4, "little") + head)
            h.update(a.tobytes())

    add(arrays)
    return h.hexdigest()


def _registry_digest(registry: Any) -> str:
    if registry is None:
        from bundlerun.bundles.project_config import default_registry  # start-up: loads tomli on use

        registry = default_registry()
    layers = [[layer.file, layer.label, layer.data] for layer in getattr(registry, "layers", [])]
    text = json.dumps(layers, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def key_material(req: Any, backend: str, dtype: str, reference: str) -> dict[str, Any]:
    """Everything the bundle built for `req` depends on (see the module docstring)."""
    max_bytes()  # a malformed bound is said before the build, not after it
    dataset = None
    if req.dataset is not None:
        rest = {k: v for k, v in req.dataset.items() if k != "samples"}
        dataset = {"samples": _arrays_digest(req.dataset.get("samples")),
                   "rest": hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()}
    return {
        "schema": SCHEMA,
        "model": {"ref": req.model, **_model_source(req.model)},
        "code": code_digest(),
        "distribution": req.distribution,
        "cases": req.cases,
        "seed": req.seed,
        "dtype": dtype,
        "backend": backend,
        "target": req.target,
        "reference": reference,
        "calibration": {"cases": req.calibration_cases, "samples": _arrays_digest(req.calibration)},
        "overrides": json.loads(json.dumps(req.overrides, sort_keys=True, default=str)),
        "dataset": dataset,
        "state_dict": _file_digest(getattr(req, "state_dict", None)),
        "inputs": _inputs_digest(getattr(req, "inputs", None), req.cases),
        "require_delegation": bool(req.require_delegation),
        # an --etrecord build's side files are named by the output's stem, and its manifest records those names
        "etrecord": Path(req.output).stem if getattr(req, "etrecord", False) else False,
        "registry": _registry_digest(req.registry),
        "versions": package_versions(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "env": {name: os.environ.get(name) for name in BUILD_ENV},
        **({"llm": req.llm.cache_material()} if getattr(req, "llm", None) is not None else {}),
        **_partition_control(),  # `bundlerun bisect` builds: which nodes the delegate may take ({} otherwise)
    }


def _partition_control() -> dict[str, Any]:
    return cache_material()


def cache_key(material: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def cacheable(material: dict[str, Any]) -> bool:
    """A factory whose file cannot be read, or a model passed as an object, is not cached."""
    return material["model"].get("sha256", True) is not None and material.get("state_dict") != "unreadable" \
        and material.get("inputs") != "unreadable"


def lookup(key: str) -> tuple[Any, bytes] | tuple[None, str | None]:
    """(bundle, bytes) of a valid entry; (None, why) for a miss (why None) or a discarded entry."""
    from bundlerun.bundles.bpte import load_bundle  # start-up: loads flatbuffers, numpy on use

    folder = builds_dir() / key
    path = folder / BUNDLE_FILE
    if not path.is_file():
        return None, None
    try:
        data = path.read_bytes()
        bundle = load_bundle(data, str(path))  # schema, consistency and integrity checks
        recorded = bundle.manifest.build.cache_key if bundle.manifest else None
        if recorded != key:
            raise BundlerunError(f"{path}: records cache key {str(recorded)[:16]}..., not {key[:16]}...")
        if bundle.manifest is None or bundle.manifest.integrity is None:
            raise BundlerunError(f"{path}: not sealed")
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with an entry, it is not used
        shutil.rmtree(folder, ignore_errors=True)
        return None, f"discarded a corrupted build-cache entry ({exc}); rebuilding"
    try:
        os.utime(folder)  # used now: the last to go when the folder is pruned
    except OSError:
        pass
    return bundle, data


def max_bytes() -> int | None:
    """The folder's bound from `$BUNDLERUN_BUILD_CACHE_MB` (default DEFAULT_MAX_MB); None: unbounded."""
    raw = os.environ.get(MAX_MB_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_MB * 1024 * 1024
    if not raw.isdigit():
        raise BundlerunError(f"{MAX_MB_ENV}={raw!r}: expected a whole number of MB (0: no bound)")
    return int(raw) * 1024 * 1024 or None


def _entry_bytes(folder: str) -> int:
    total = 0
    with os.scandir(folder) as it:
        for f in it:
            if f.is_file(follow_symlinks=False):
                total += f.stat(follow_symlinks=False).st_size
    return total


def prune(limit: int, keep: str | None = None) -> list[str]:
    """Remove the least recently used entries (by folder mtime: stored or last hit) until the rest fit in
    `limit` bytes; `keep` (the entry just stored) stays whatever its size. Temp folders of writers killed
    a day or more ago go too. Returns the removed keys. A folder that cannot be read is left alone."""
    root = builds_dir()
    entries: list[tuple[float, int, str]] = []  # (mtime, bytes, key)
    now = time.time()
    try:
        with os.scandir(root) as it:
            for d in it:
                try:
                    if not d.is_dir(follow_symlinks=False):
                        continue
                    mtime = d.stat(follow_symlinks=False).st_mtime
                    if d.name.startswith("."):
                        if now - mtime > _STALE_TEMP_S:
                            shutil.rmtree(d.path, ignore_errors=True)
                        continue
                    entries.append((mtime, _entry_bytes(d.path), d.name))
                except OSError:
                    continue
    except OSError:
        return []
    entries.sort(reverse=True)  # newest first
    removed, total = [], 0
    for _, size, key in entries:
        total += size
        if total > limit and key != keep:
            shutil.rmtree(root / key, ignore_errors=True)
            removed.append(key)
            total -= size
    return removed


def store(key: str, bundle_path: Path, side_files: Sequence[Path] = ()) -> Path | None:
    """Copy a freshly built bundle into the cache, atomically (temp folder, then rename), with the files
    its manifest names beside it (an --etrecord build's ETRecord and delegate graphs), by their names.
    A cache that cannot be written never fails the build."""
    root = builds_dir()
    folder = root / key
    if (folder / BUNDLE_FILE).is_file():
        return folder
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=root))
        try:
            for source, name in [(Path(bundle_path), BUNDLE_FILE), *((Path(f), Path(f).name) for f in side_files)]:
                shutil.copyfile(source, tmp / name)
                with open(tmp / name, "rb") as fh:
                    os.fsync(fh.fileno())
            if folder.exists():  # a stale or half-removed entry: replaced, never merged
                shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            return folder if (folder / BUNDLE_FILE).is_file() else None  # another writer won the race
    except OSError:
        return None
    limit = max_bytes()
    if limit is not None:
        prune(limit, keep=key)
    return folder
