"""QEMU's instruction count for the qemu:// perf section (issue 17).

Debian's QEMU 7.2 is built with TCG plugin support but ships no plugins, so bundlerun builds
its own one-file plugin (firmware_scripts/arm/qemu_plugin/insn_count.c, by
firmware_scripts/arm/build_qemu_plugin.sh, cached under ~/.cache/bundlerun/qemu-plugins/).
Loaded with `-plugin LIB -d plugin -D FILE`, it writes one line when QEMU exits:

    bundlerun-insn-count: insns=N

N counts every guest instruction of the session: boot, bundle parsing, method load, the
inference and exit. It is deterministic for a given runner and bundle (the same N run after
run), so it is gated like a cycle count; it is not a cycle count (QEMU models no pipeline)
and says so. Without a plugin built for this QEMU the figure is absent, never 0.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import lru_cache
from pathlib import Path

from bundlerun.bundles.cache_dirs import cache_dir
from bundlerun.targets.base import PerfFigure, PerfKind

PLUGIN_LINE = re.compile(rb"^bundlerun-insn-count: insns=(\d+)\s*$", re.MULTILINE)
FIGURE = "session_instructions"
SOURCE = "QEMU TCG plugin (firmware_scripts/arm/qemu_plugin/insn_count.c): guest instructions of the whole session"
BUILD_HINT = "firmware_scripts/arm/build_qemu_plugin.sh"


def _plugins_dir() -> Path:
    return cache_dir("qemu-plugins")


@lru_cache(maxsize=8)
def _qemu_version(qemu: str) -> str | None:
    try:
        out = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def find_plugin(qemu: str) -> Path | None:
    """The cached instruction-count plugin built (and load-tested) for this QEMU, if any."""
    version = _qemu_version(qemu)
    if version is None or not _plugins_dir().is_dir():
        return None
    for record in sorted(_plugins_dir().glob("*/plugin.json")):
        try:
            meta = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        lib = record.parent / "libinsn_count.so"
        if meta.get("qemu_version") == version and lib.is_file():
            return lib
    return None


def plugin_args(plugin: Path, log_path: Path) -> list[str]:
    """QEMU options that load the plugin and send its exit line to `log_path` (not the UART)."""
    from bundlerun.targets import argv  # start-up: not loaded by `bundlerun --help`

    # -plugin is parsed as QEMU key=value options: a comma in the path is escaped (targets/argv.py)
    return ["-plugin", argv.qemu_opt(argv.local_path(plugin, "QEMU plugin")), "-d", "plugin",
            "-D", argv.local_path(log_path, "QEMU plugin log")]


def read_count(log_path: Path) -> PerfFigure | None:
    """The session's instruction count from the plugin log; None when QEMU did not exit
    normally (killed on a timeout, crashed) and the plugin never wrote its line."""
    try:
        data = Path(log_path).read_bytes()
    except OSError:
        return None
    found = PLUGIN_LINE.findall(data)
    if len(found) != 1:
        return None
    return PerfFigure(FIGURE, int(found[0]), "instructions", PerfKind.SIMULATION_COUNTER, SOURCE,
                      note="boot, bundle load, inference and exit; deterministic per runner and bundle; "
                           "not a cycle count")
