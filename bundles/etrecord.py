"""The ETRecord a bundle's debugger needs, written beside the bundle (`build --etrecord`).

An ETRecord (executorch.devtools) holds the graphs the program came from - the
exported (ATen) program, the edge dialect program before partitioning, the
instruction -> debug handle map and the delegate map of the emitted program -
which is what maps a runtime intermediate output back to an operator of the
eager graph. `bundlerun debug` reads it (runner/debug.py).

How it is recorded without touching the lowering recipes: every recipe calls
`executorch.exir.to_edge_transform_and_lower` (imported at call time); while
`recording(True, recipe.lower)` runs, that name is wrapped to pass
`generate_etrecord=True`, and the ExecutorchProgramManager it returns then
carries the ETRecord (`get_etrecord()`). Builds run one at a time in a process,
so the wrapper never leaks into another build. A recipe that does not go
through `to_edge_transform_and_lower` (the Cortex-M recipe uses `to_edge`)
records none: the build says so.

Extra in the file: for quantized builds the fp32 eager model, exported, under
graph_map["eager_fp32/forward"] (the exported program of an int8 build is the
fake-quantized graph, i.e. the quantized reference; the debugger wants both),
and the representative inputs (case 0; `debug` replaces them with the case it
drills into).

The manifest's `build.etrecord` records {"path" (file name, beside the bundle),
"sha256", "bytes", "debug_handles", "graphs"}.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.fileio import file_sha256

SUFFIX = ".etrecord"
FP32_GRAPH = "eager_fp32"  # graph_map key prefix of the fp32 eager export (quantized builds)


def etrecord_path_for(bundle_path: str | Path) -> Path:
    """Where the ETRecord of `bundle_path` lives: beside it, same stem, `.etrecord`."""
    p = Path(bundle_path)
    return p.with_name(p.stem + SUFFIX)


def recording(enabled: bool, lower: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`lower` itself, or `lower` run with ETRecord generation turned on."""
    if not enabled:
        return lower

    def run(req: Any) -> Any:
        import executorch.exir as exir

        original = exir.to_edge_transform_and_lower

        def with_etrecord(*args: Any, **kwargs: Any) -> Any:
            kwargs["generate_etrecord"] = True
            return original(*args, **kwargs)

        exir.to_edge_transform_and_lower = with_etrecord
        try:
            return lower(req)
        finally:
            exir.to_edge_transform_and_lower = original

    return run


def manifest_entry(enabled: bool, lowering: Any, fp32_module: Any, example_inputs: tuple,
                   bundle_path: str | Path) -> dict[str, Any]:
    """Write the ETRecord beside `bundle_path`; {"etrecord": {...}} for the manifest's build
    section ({} when not enabled)."""
    if not enabled:
        return {}
    get = getattr(lowering.program, "get_etrecord", None)
    try:
        record = get() if get is not None else None
    except RuntimeError:
        record = None
    if record is None:
        raise BuildError("this backend's lowering does not go through to_edge_transform_and_lower, so no ETRecord "
                         "could be recorded; build without --etrecord")
    graphs = ["exported_program", "edge_dialect_exported_program"]
    if lowering.quantized_reference is not None:  # keep the float model beside the fake-quantized graph
        from bundlerun.bundles.backends.common import export_model

        record.add_extra_export_modules({FP32_GRAPH: export_model(fp32_module, tuple(example_inputs))})
        graphs.append(f"{FP32_GRAPH}/forward")
    record.update_representative_inputs([tuple(example_inputs)])
    path = etrecord_path_for(bundle_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        record.save(str(tmp))
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        tmp.unlink(missing_ok=True)
        raise BuildError(f"cannot write the ETRecord {path}: {type(exc).__name__}: {exc}") from None
    handles = record._debug_handle_map or {}
    return {"etrecord": {
        "path": path.name,
        "sha256": file_sha256(path),
        "bytes": path.stat().st_size,
        "debug_handles": sum(len(m) for m in handles.values() if isinstance(m, dict)),
        "graphs": graphs,
    }}


class EtrecordMissing(Exception):
    """The bundle has no usable ETRecord; the message says how to rebuild with one."""


def rebuild_hint(manifest: dict | None, bundle_path: str | Path) -> str:
    build = (manifest or {}).get("build") or {}
    model = ((manifest or {}).get("model") or {}).get("id") or "MODEL"
    parts = [f"bundlerun build {model}"]
    for flag, key in (("--target", "target"), ("--backend", "backend"), ("--dtype", "dtype"),
                      ("--cases", "cases"), ("--seed", "seed"), ("--reference", "reference")):
        if build.get(key) is not None:
            parts.append(f"{flag} {build[key]}")
    parts += ["--etrecord", "-o", str(bundle_path)]
    return " ".join(parts)


def locate(manifest: dict | None, bundle_path: str | Path) -> Path:
    """The bundle's ETRecord, checked against the sha256 its manifest records.
    Raises EtrecordMissing naming the rebuild command otherwise."""
    entry = ((manifest or {}).get("build") or {}).get("etrecord")
    hint = rebuild_hint(manifest, bundle_path)
    if not isinstance(entry, dict) or not entry.get("path"):
        raise EtrecordMissing(f"{bundle_path} was built without an ETRecord, which debug needs to map runtime "
                              f"intermediates to the eager graph; rebuild with it: {hint}")
    path = Path(bundle_path).parent / Path(str(entry["path"])).name
    if not path.is_file():
        raise EtrecordMissing(f"the ETRecord {path} recorded by {bundle_path} is missing; rebuild with: {hint}")
    got = file_sha256(path)
    if entry.get("sha256") and got != entry["sha256"]:
        raise EtrecordMissing(f"the ETRecord {path} does not belong to {bundle_path} (sha256 {got[:16]}..., the "
                              f"manifest records {str(entry['sha256'])[:16]}...); rebuild with: {hint}")
    return path
