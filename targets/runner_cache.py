"""The content-addressed cache of runners built from source by firmware_scripts/.

Each `$BUNDLERUN_CACHE/runners/<key>/runner.json` describes one build (kind, mode,
binary, ops, flags, sources, toolchain). Targets find their runner here when none is
configured; `doctor` lists them. An entry is relocatable: a cache restored or copied to
another path (a CI cache, a farm's shared volume) is read through `read_record`, which moves
the paths the build recorded onto where the entry is now.
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


def read_record(folder: Path) -> dict[str, Any] | None:
    """The runner.json of the cache entry `folder`, with its folder under "dir", or None if unreadable.

    The build scripts record absolute paths (`binary`, `elf`, the sources they used). Where the cache
    has moved since, every recorded path under the old `<root>/runners/<key>/` is moved onto `folder`
    and every other one under the old `<root>/` onto the cache root `folder` is in now, so a copied
    cache names its own files, never the ones it was built beside."""
    folder = Path(folder)
    try:
        record = json.loads((folder / "runner.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    old_root = _recorded_root(record, folder.name)
    new_root = folder.parent.parent
    if old_root is not None and old_root != str(new_root):
        record = _rebased(record, old_root, str(new_root))
    record["dir"] = str(folder)
    return record


def _recorded_root(value: Any, key: str) -> str | None:
    """The cache root the build ran in: the prefix of any recorded `<root>/runners/<key>/...` path."""
    if isinstance(value, str):
        marker = f"/runners/{key}/"
        at = value.find(marker)
        return value[:at] if value.startswith("/") and at > 0 else None
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        root = _recorded_root(child, key)
        if root is not None:
            return root
    return None


def _rebased(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {k: _rebased(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebased(v, old, new) for v in value]
    return value


def cached_runners(kind: str | None = None) -> list[dict[str, Any]]:
    """Every readable runner.json (newest first), each with its folder under "dir"."""
    found = []
    root = cache_root() / "runners"
    if not root.is_dir():
        return []
    for meta in root.glob("*/runner.json"):
        record = read_record(meta.parent)
        if record is None or (kind and record.get("kind") != kind):
            continue
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


def run_build(cmd: list[str], log: Path, timeout_s: float, script: str) -> tuple[Path | None, str]:
    """Run a firmware_scripts build in its own process group (the whole build is killed on a
    timeout or Ctrl-C), its stderr into `log`. Returns (the folder the script printed last, "")
    or (None, why: the script's own last error line `<script>: ...`, else the log's last line)."""
    import signal
    import subprocess

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except BaseException:  # timeout, Ctrl-C: the whole build goes
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        why = next((ln for ln in reversed(lines) if ln.startswith(f"{script}:")),
                   lines[-1] if lines else f"exit code {proc.returncode}")
        return None, why
    return Path(out.decode().strip().splitlines()[-1]), ""
