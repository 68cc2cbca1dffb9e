"""The content-addressed cache of runners built from source by firmware_scripts/.

Each `$BUNDLERUN_CACHE/runners/<key>/runner.json` describes one build (kind, mode,
binary, ops, flags, sources, toolchain). Targets find their runner here when none is
configured; `doctor` lists them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    base = os.environ.get("BUNDLERUN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bundlerun")
    return Path(base)


def cached_runners(kind: str | None = None) -> list[dict[str, Any]]:
    """Every readable runner.json (newest first), each with its folder under "dir"."""
    found = []
    root = cache_root() / "runners"
    if not root.is_dir():
        return []
    for meta in root.glob("*/runner.json"):
        try:
            record = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or (kind and record.get("kind") != kind):
            continue
        record["dir"] = str(meta.parent)
        found.append(record)
    return sorted(found, key=lambda r: str(r.get("built_at", "")), reverse=True)


def find_runner(kind: str, binary_key: str, **flags: Any) -> Path | None:
    """The newest cached runner of `kind` whose record matches `flags` (top level or under "flags")."""
    for record in cached_runners(kind):
        flags_record = record.get("flags")
        have = {**(flags_record if isinstance(flags_record, dict) else {}), **record}
        if all(have.get(k) == v for k, v in flags.items()):
            path = Path(str(record.get(binary_key, "")))
            if path.is_file():
                return path
    return None
