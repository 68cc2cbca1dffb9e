"""Make ExecuTorch's MLX backend importable from a wheel that lacks its generated files.

Why: the Linux executorch wheel ships `backends/mlx/serialization/{generate.py,
schema.fbs}` but not what `generate.py` produces (`mlx_graph_schema.py`,
`_generated_serializers.py`, `_generated/` flatbuffer bindings,
`_generated_inspector.py`), so `import MLXPartitioner` fails. bundlerun runs
that generator itself, once, with the wheel's own `flatc`, into
`~/.cache/bundlerun/mlx-gen/<hash>/` (hash of the wheel's serialization files
and version, so an upgraded wheel regenerates).

How it becomes importable: an import-system overlay, not a write into
site-packages. A meta-path finder serves `executorch.backends.mlx.serialization`
(a full copy: the wheel's own modules plus the generated ones) and
`executorch.backends.mlx._generated_inspector` from the cache. That works with a
read-only or shared venv, leaves nothing behind after `pip uninstall`, and
cannot mix files of two executorch versions. Every process that lowers or runs
MLX calls `ensure_mlx_importable()` first (the builder and the MLX runner do).

`generate.py` also reads two C++ templates (`MLXLoader.{h,cpp}.tmpl`) that are
only in ExecuTorch's sources: from `$BUNDLERUN_EXECUTORCH_SRC` (a checkout),
else from `executorch.tar.xz` in `$BUNDLERUN_THIRD_PARTY` or `../shared/third_party`.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.cache_dirs import cache_dir
from bundlerun.bundles.errors import BuildError

SERIALIZATION_PKG = "executorch.backends.mlx.serialization"
INSPECTOR_MOD = "executorch.backends.mlx._generated_inspector"
TEMPLATES = ("MLXLoader.h.tmpl", "MLXLoader.cpp.tmpl")
_TEMPLATE_DIR = "backends/mlx/serialization"
_COMPLETE = "COMPLETE"


@dataclass(frozen=True)
class GeneratedFiles:
    """Where the importable MLX serialization package comes from."""

    root: Path  # cache dir (holds serialization/ and _generated_inspector.py), or the wheel's mlx dir
    in_wheel: bool  # True: the wheel already had them (e.g. after install_executorch.py)


class _OverlayFinder(importlib.abc.MetaPathFinder):
    """Serves the MLX serialization package and the inspector from the cache."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib signature
        if fullname == SERIALIZATION_PKG:
            pkg = self.root / "serialization"
            return importlib.util.spec_from_file_location(
                fullname, pkg / "__init__.py", submodule_search_locations=[str(pkg)]
            )
        if fullname == INSPECTOR_MOD:
            return importlib.util.spec_from_file_location(fullname, self.root / "_generated_inspector.py")
        return None


def _executorch_dir() -> Path:
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("the MLX backend needs executorch, which is not installed (pip install executorch==1.5.1)")
    return Path(list(spec.submodule_search_locations)[0])


def _executorch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch")
    except PackageNotFoundError:
        return "unknown"


def _wheel_serialization(et_dir: Path) -> Path:
    ser = et_dir / "backends" / "mlx" / "serialization"
    if not (ser / "generate.py").is_file() or not (ser / "schema.fbs").is_file():
        raise BuildError(f"this executorch build has no MLX backend sources ({ser} lacks generate.py/schema.fbs)")
    return ser


def _source_files(ser: Path) -> list[Path]:
    return sorted(p for p in ser.iterdir() if p.is_file() and p.suffix in (".py", ".fbs"))


def cache_key(et_dir: Path) -> str:
    """Hash of the wheel's serialization sources and version: regenerate when they change."""
    h = hashlib.sha256(_executorch_version().encode())
    for p in _source_files(_wheel_serialization(et_dir)):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _copy_templates(dest: Path) -> str:
    """Put the two C++ templates into `dest`; return where they came from."""
    src = os.environ.get("BUNDLERUN_EXECUTORCH_SRC")
    if src:
        folder = Path(src) / _TEMPLATE_DIR
        missing = [t for t in TEMPLATES if not (folder / t).is_file()]
        if missing:
            raise BuildError(f"BUNDLERUN_EXECUTORCH_SRC={src} is not an ExecuTorch checkout: {folder} lacks {', '.join(missing)}")
        for t in TEMPLATES:
            shutil.copyfile(folder / t, dest / t)
        return str(folder)
    from bundlerun.bundles.et_source import third_party_dirs  # late: looked up at call time (tests replace it)

    for d in third_party_dirs():
        tarball = d / "executorch.tar.xz"
        if tarball.is_file():
            _extract_templates(tarball, dest)
            return str(tarball)
    raise BuildError(
        "the MLX backend's generated files are missing from the executorch wheel and bundlerun needs ExecuTorch's "
        "sources to regenerate them: set BUNDLERUN_EXECUTORCH_SRC to a checkout, or BUNDLERUN_THIRD_PARTY to a "
        "folder holding executorch.tar.xz"
    )


def _extract_templates(tarball: Path, dest: Path) -> None:
    wanted = {f"{_TEMPLATE_DIR}/{t}": t for t in TEMPLATES}
    found = 0
    try:
        with tarfile.open(tarball, "r|*") as tar:
            for member in tar:
                rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
                if rel in wanted and member.isfile():
                    data = tar.extractfile(member)
                    (dest / wanted[rel]).write_bytes(data.read() if data else b"")
                    found += 1
                    if found == len(wanted):
                        return
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BuildError(f"cannot read {tarball}: {exc}") from None
    raise BuildError(f"{tarball} holds no {_TEMPLATE_DIR}/{{{','.join(TEMPLATES)}}}: not an ExecuTorch source tarball")


def _flatc(et_dir: Path) -> Path:
    flatc = et_dir / "data" / "bin" / "flatc"
    if not flatc.is_file():
        found = shutil.which("flatc")
        if not found:
            raise BuildError(f"flatc not found (expected in the executorch wheel at {flatc}, or on PATH)")
        return Path(found)
    return flatc


def _generate(et_dir: Path, target: Path) -> None:
    """Run the wheel's generate.py in a scratch tree shaped like backends/mlx/, then keep its Python outputs."""
    ser = _wheel_serialization(et_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mlx-gen-", dir=target.parent) as tmp:
        mlx = Path(tmp) / "mlx"
        work = mlx / "serialization"
        work.mkdir(parents=True)
        (mlx / "runtime").mkdir()
        for p in _source_files(ser):
            shutil.copyfile(p, work / p.name)
        origin = _copy_templates(work)
        cmd = [sys.executable, str(work / "generate.py"), "--flatc", str(_flatc(et_dir))]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"MLX code generation could not run: {exc}") from None
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise BuildError(f"MLX code generation failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")
        if not (work / "mlx_graph_schema.py").is_file() or not (work / "_generated" / "mlx_delegate").is_dir():
            raise BuildError("MLX code generation produced no mlx_graph_schema.py / _generated/ bindings")
        for t in TEMPLATES:
            (work / t).unlink()
        staged = Path(tmp) / "out"
        staged.mkdir()
        shutil.move(str(work), staged / "serialization")
        shutil.move(str(mlx / "_generated_inspector.py"), staged / "_generated_inspector.py")
        (staged / _COMPLETE).write_text(f"executorch {_executorch_version()}\ntemplates {origin}\n")
        try:
            os.replace(staged, target)
        except OSError:
            if not (target / _COMPLETE).is_file():  # a concurrent process may have won the race
                raise


_STATE: dict[str, GeneratedFiles] = {}


def ensure_mlx_importable() -> GeneratedFiles:
    """Generate (once, cached) and overlay MLX's generated modules; BuildError with one line if impossible."""
    if "files" in _STATE:
        return _STATE["files"]
    et_dir = _executorch_dir()
    ser = _wheel_serialization(et_dir)
    if (ser / "mlx_graph_schema.py").is_file() and (ser / "_generated").is_dir():
        files = GeneratedFiles(ser.parent, in_wheel=True)
    else:
        root = cache_dir("mlx-gen") / cache_key(et_dir)
        if not (root / _COMPLETE).is_file():
            if root.exists():
                shutil.rmtree(root, ignore_errors=True)  # a half-written cache from a killed run
            try:
                _generate(et_dir, root)
            except OSError as exc:
                raise BuildError(f"cannot write the MLX generated-files cache {root}: {exc}") from None
        if not any(isinstance(f, _OverlayFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _OverlayFinder(root))
        stale = sys.modules.get(SERIALIZATION_PKG)
        if stale is not None and not str(getattr(stale, "__file__", "")).startswith(str(root)):
            for name in [m for m in sys.modules if m == SERIALIZATION_PKG or m.startswith(SERIALIZATION_PKG + ".")]:
                del sys.modules[name]
        files = GeneratedFiles(root, in_wheel=False)
    _STATE["files"] = files
    return files
