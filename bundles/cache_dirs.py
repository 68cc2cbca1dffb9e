"""Where bundlerun keeps what it caches on this machine: one root, one folder per kind.

`$BUNDLERUN_CACHE` if set, else `${XDG_CACHE_HOME:-~/.cache}/bundlerun`. Below it: `builds/`
(bundles/build_cache.py), `runners/` (targets/runner_cache.py), `et-src/` (bundles/et_source.py),
`mlx-gen/` (bundles/mlx_codegen.py), `qnn/`, `qemu-plugins/`, the digits-mlp weights, and the
firmware scripts' own folders. Lives in bundles/ (the bottom floor) so every layer can use it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$BUNDLERUN_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/bundlerun`; read at each call, so
    a test or a caller that sets the environment is honoured."""
    base = os.environ.get("BUNDLERUN_CACHE")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "bundlerun"


def cache_dir(name: str) -> Path:
    """The folder `name` (e.g. "builds", "et-src") under `cache_root()`; not created here."""
    return cache_root() / name
