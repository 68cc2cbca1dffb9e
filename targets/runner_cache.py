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
