"""What every model source's build shares (the zoo/user models in builder.py, LLMs in llm_build.py):
the result record, the tool versions a manifest records, torch tensor -> BundledValue, and the
build-cache key and lookup."""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import BundledValue
from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.manifest import Manifest
from bundlerun.bundles.versions import package_versions
from bundlerun.bundles import build_cache
from bundlerun.bundles.fileio import atomic_write_bytes, file_sha256
from bundlerun.bundles.manifest_records import EtrecordInfo
from bundlerun.bundles.report_fit import bundle_report_fit

if TYPE_CHECKING:
    from bundlerun.bundles.builder import BuildRequest


@dataclass
class BuildResult:
    path: Path
    manifest: Manifest
    info: dict[str, Any]


def _versions() -> dict[str, str]:
    return {"python": platform.python_version(), "host": platform.machine(),
            **package_versions(("bundlerun", "torch", "executorch"))}


def _torch_to_code(dtype: Any) -> int:
    try:
        return st.code_from_torch(dtype)
    except KeyError:
        raise BuildError(f"unsupported tensor dtype {dtype}") from None


def _value_from_tensor(t: Any, dim_order: list[int] | None = None) -> BundledValue:
    """`t` as a bundled tensor, its bytes in `dim_order` (None: contiguous), the order the program
    declares for that input (bundles/bpte.py BundledValue.from_array says why the bytes must follow it)."""
    import torch

    t = t.detach().contiguous().cpu()
    code = _torch_to_code(t.dtype)
    if t.dtype == torch.bfloat16:
        array = t.view(torch.int16).numpy().view(np.uint16)
    else:
        array = t.numpy()
    return BundledValue.from_array(array, code, dim_order=dim_order)


def _cache_key(req: BuildRequest, backend: str, reference: str) -> str | None:
    """The build-cache key of `req` (None when its model source cannot be hashed)."""

    material = build_cache.key_material(req, backend, req.dtype, reference)
    return build_cache.cache_key(material) if build_cache.cacheable(material) else None


def side_files(manifest: Manifest | None) -> list[tuple[str, str]]:
    """(file name, sha256) of each file the manifest says lies beside its bundle: an --etrecord build's
    ETRecord and delegate graphs (bundles/etrecord.py)."""
    record = manifest.build.etrecord if manifest is not None else None
    if not isinstance(record, EtrecordInfo):
        return []
    entries = [(record.path, record.sha256), *([(record.delegate_graphs.get("path"), record.delegate_graphs.get("sha256"))]
                                               if isinstance(record.delegate_graphs, dict) else [])]
    return [(str(name), str(sha)) for name, sha in entries if name and sha]


def _from_cache(req: BuildRequest, key: str, say: Callable[[str], None]) -> BuildResult | str | None:
    """A valid cached build of `key` written to req.output, with the files its manifest names beside it;
    else None (a miss) or why the entry was discarded (it is rebuilt)."""

    bundle, data = build_cache.lookup(key)
    if bundle is None:
        return data
    manifest = bundle.manifest
    assert manifest is not None  # lookup refuses an entry whose manifest does not record this cache key
    folder = build_cache.builds_dir() / key
    sides = side_files(manifest)
    for name, sha in sides:  # checked before anything is written: a bad entry is rebuilt, never half used
        cached = folder / Path(name).name
        if not cached.is_file() or file_sha256(cached) != sha:
            shutil.rmtree(folder, ignore_errors=True)
            return f"discarded a build-cache entry whose {name} is missing or not the one its manifest records; rebuilding"
    say(f"using cached build {key[:12]}")
    try:
        path = atomic_write_bytes(req.output, data)
        for name, _ in sides:
            atomic_write_bytes(Path(req.output).with_name(Path(name).name), (folder / Path(name).name).read_bytes())
        if isinstance(manifest.build.etrecord, EtrecordInfo) and not manifest.build.etrecord.delegate_graphs:
            from bundlerun.bundles.etrecord import delegate_graphs_path_for  # start-up: only an --etrecord hit needs it

            delegate_graphs_path_for(req.output).unlink(missing_ok=True)  # a stale one is never picked up, as a build
    except OSError as exc:
        raise BuildError(f"cannot write {req.output}: {exc.strerror or exc}") from None
    info = dict(manifest.build.lowering or {})
    info.update({"cache": "hit", "cache_key": key})
    fit = bundle_report_fit(bundle)  # a run that would not fit in its report is said at every build
    if fit:
        info["warnings"] = [*info.get("warnings", []), *fit]
    return BuildResult(path=path, manifest=manifest, info=info)
