"""Where the pinned ExecuTorch source tree is, for the tolerance audit and its tests.

Every number in the tolerance registry cites `path:line-range` in ExecuTorch at one
commit (PINNED_COMMIT, /work/shared/third_party/SOURCES.md). To check those citations
(`bundlerun tolerance audit`, tests/test_registry_provenance.py) bundlerun needs that
tree: a user's checkout (`--executorch-src`, `$BUNDLERUN_EXECUTORCH_SRC`), else the
Python and shell files under `backends/` and `examples/` of `executorch.tar.xz`
(`$BUNDLERUN_THIRD_PARTY` or `../shared/third_party`), extracted once into the cache:
the registry cites nothing else, and it keeps the extraction to seconds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from pathlib import Path

from bundlerun.bundles.cache_dirs import cache_dir
from bundlerun.bundles.errors import ConfigError

PINNED_COMMIT = "cff6f4dd32e630945b7188512c1f2b4f102b05ad"
ENV_SRC = "BUNDLERUN_EXECUTORCH_SRC"
EXTRACT_DIRS = ("backends", "examples")
EXTRACT_SUFFIXES = (".py", ".sh")


def third_party_dirs() -> list[Path]:
    """Folders that may hold executorch.tar.xz: $BUNDLERUN_THIRD_PARTY, then ../shared/third_party
    next to the installed package or the checkout."""
    here = Path(__file__).resolve()
    dirs = [os.environ.get("BUNDLERUN_THIRD_PARTY", "")]
    dirs += [str(here.parents[2] / "shared" / "third_party"), str(here.parents[3] / "shared" / "third_party")]
    return [Path(d) for d in dirs if d]


def _is_tree(path: Path) -> bool:
    return (path / "backends").is_dir()


def find_tarball() -> Path | None:
    for d in third_party_dirs():
        tarball = d / "executorch.tar.xz"
        if tarball.is_file():
            return tarball
    return None


def extract_backends(tarball: Path, dest_root: Path) -> Path:
    """Extract `executorch/{backends,examples}/**.{py,sh}` of `tarball` under `dest_root/<sha16>/`; return the tree.

    Idempotent and safe against a concurrent extraction: a partial folder is renamed into
    place only when complete."""
    digest = hashlib.sha256()
    with open(tarball, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    dest = dest_root / digest.hexdigest()[:16]
    tree = dest / "executorch"
    if (dest / ".complete").is_file():
        return tree
    dest_root.mkdir(parents=True, exist_ok=True)
    partial = dest_root / f".{dest.name}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with tarfile.open(tarball, "r|*") as tar:
            for member in tar:
                parts = member.name.split("/")
                if len(parts) < 3 or parts[1] not in EXTRACT_DIRS or not member.isfile() \
                        or not member.name.endswith(EXTRACT_SUFFIXES):
                    continue
                if any(p in ("", "..") for p in parts) or member.name.startswith("/"):
                    continue
                out = partial / "executorch" / Path(*parts[1:])
                out.parent.mkdir(parents=True, exist_ok=True)
                data = tar.extractfile(member)
                out.write_bytes(data.read() if data else b"")
    except (tarfile.TarError, OSError, EOFError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise ConfigError(f"cannot read {tarball}: {exc}") from None
    if not (partial / "executorch" / "backends").is_dir():
        shutil.rmtree(partial, ignore_errors=True)
        raise ConfigError(f"{tarball} holds no executorch/backends/: not an ExecuTorch source tarball")
    (partial / ".complete").touch()
    try:
        partial.rename(dest)
    except OSError:  # another process won the race: use its copy
        shutil.rmtree(partial, ignore_errors=True)
    return tree


def source_tree(explicit: str | Path | None = None) -> Path:
    """The ExecuTorch source tree to audit: `explicit`, `$BUNDLERUN_EXECUTORCH_SRC`, else the tarball."""
    for label, cand in (("--executorch-src", explicit), (ENV_SRC, os.environ.get(ENV_SRC))):
        if cand:
            path = Path(cand).expanduser()
            if not _is_tree(path):
                raise ConfigError(f"{label} {path}: not an ExecuTorch source tree (no backends/ folder)")
            return path
    tarball = find_tarball()
    if tarball is None:
        raise ConfigError("no ExecuTorch source: pass --executorch-src DIR (a checkout at "
                          f"{PINNED_COMMIT[:8]}), set {ENV_SRC}, or BUNDLERUN_THIRD_PARTY to a folder "
                          "holding executorch.tar.xz")
    return extract_backends(tarball, cache_dir("et-src"))
