"""Project configuration: `bundlerun.toml`, or `[tool.bundlerun]` in `pyproject.toml`.

Found upward from the current directory (the nearest directory holding either
file; when both are there, bundlerun.toml is merged over pyproject's section).
`$BUNDLERUN_CONFIG` names a file explicitly. Sections:

    [tolerances]   merged over the built-in tolerance registry (validated here)
    [targets.<scheme>]  passed to the target of that URL scheme
    [perf]         thresholds of the performance gate (`compare`, `--baseline`), validated here
    [history] [regression] ...  owned by their modules, passed through untouched

The returned dict also carries `_file`: the path the configuration came from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.limits import MAX_FILE_BYTES
from bundlerun.bundles.safe_read import UnsafeFileError, read_bounded
from bundlerun.bundles.toml_read import read_toml

if TYPE_CHECKING:
    from bundlerun.bundles.registry import Registry

# The registry (and tomllib, through bundles/toml_read.py) is imported on use: `bundlerun run` reads the project
# config before it starts its target, and most projects have a pyproject.toml with no [tool.bundlerun] in it.

ENV_CONFIG = "BUNDLERUN_CONFIG"
CONFIG_NAME = "bundlerun.toml"
# Sections others own are passed through; an unknown top-level key is most likely a typo.
KNOWN_SECTIONS = {"tolerances", "targets", "history", "regression", "build", "run", "report", "dataset", "accuracy",
                  "perf"}

# [perf]: the performance gate of `compare` and `run --baseline` (docs/performance.md). key -> default;
# the default's type is the key's type (a bool is true/false, a number is a non-negative number).
PERF_DEFAULTS: dict[str, Any] = {
    "cycles_regression": 0.05,    # relative rise of a cycle figure (device or simulator cycles) that fails
    "memory_regression": 0.05,    # relative rise of a memory figure in use (not a pool's capacity) that fails
    "latency_regression": 0.10,   # relative rise of a warm latency median that fails, when it is also past the noise
    "latency_noise": 3.0,         # ... and past this many times the larger spread (MAD) of the two runs' samples
    "latency_min_samples": 3,     # fewer warm samples on a side: latency is reported, not gated (--repeat N)
    "gate_host_latency": False,   # gate host wall time too (a shared host is noisy: off unless asked)
    "gate_memory": True,          # gate memory figures
    "gate_cycles": True,          # gate cycle figures
}


def perf_section(config: dict[str, Any] | None, source: str | None = None) -> dict[str, Any]:
    """The [perf] section checked and completed with its defaults: an unknown key is an error
    with the close match (`cycle_regression` -> did you mean 'cycles_regression'?), a value of
    the wrong type names the key."""
    where = f"{source}: " if source else ""
    section = (config or {}).get("perf")
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where}[perf] must be a table")
    out = dict(PERF_DEFAULTS)
    for key, value in section.items():
        if key not in PERF_DEFAULTS:
            import difflib  # only for a typo's hint

            close = difflib.get_close_matches(str(key), sorted(PERF_DEFAULTS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}[perf] has unknown key {key!r}{hint}; known: {', '.join(PERF_DEFAULTS)}")
        default = PERF_DEFAULTS[key]
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}[perf] {key} must be true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            raise ConfigError(f"{where}[perf] {key} must be a non-negative number, got {value!r}")
        elif isinstance(default, int) and not float(value).is_integer():
            raise ConfigError(f"{where}[perf] {key} must be a whole number, got {value!r}")
        out[key] = type(default)(value)
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    """Bounded (size, nesting: bundles/toml_read.py): a deeply nested file is one line, not a RecursionError."""

    return read_toml(path)


def _pyproject_section(path: Path) -> dict[str, Any] | None:
    if not _may_name_bundlerun(path):
        return None
    section = _read_toml(path).get("tool", {}).get("bundlerun")
    if section is not None and not isinstance(section, dict):
        raise ConfigError(f"{path}: [tool.bundlerun] must be a table")
    return section


def _may_name_bundlerun(path: Path) -> bool:
    """False only when `path` cannot hold a [tool.bundlerun] table: its text has no `bundlerun` and no escape
    that could spell it in a quoted key (`"\\u0062undlerun"`). Such a pyproject.toml (most projects': it configures
    their build) is not parsed; one that cannot be read is, so read_toml says why in its one line."""
    try:
        raw = read_bounded(path, MAX_FILE_BYTES)
    except (OSError, UnsafeFileError):
        return True
    return b"bundlerun" in raw or b"\\u" in raw or b"\\U" in raw


def find_config_files(start: Path | None = None) -> list[Path]:
    """Files of the nearest configured directory, lowest precedence first.

    `start` may also be a config file itself (`--config FILE`), as may $BUNDLERUN_CONFIG.
    """
    return [path for path, _ in _found(start)]


def _found(start: Path | None) -> list[tuple[Path, dict[str, Any] | None]]:
    """find_config_files, each file with its [tool.bundlerun] table when the search parsed it (a pyproject.toml
    found upward: read once, not again by load_project_config), else None."""
    if start is not None and Path(start).is_file():
        return [(Path(start), None)]
    if start is not None and not Path(start).exists():
        raise ConfigError(f"config file {start} does not exist")
    explicit = os.environ.get(ENV_CONFIG)
    if explicit and start is None:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"${ENV_CONFIG} names {path}, which is not a file")
        return [(path, None)]
    here = Path(start or Path.cwd()).resolve()
    for directory in [here, *here.parents]:
        found: list[tuple[Path, dict[str, Any] | None]] = []
        pyproject = directory / "pyproject.toml"
        section = _pyproject_section(pyproject) if pyproject.is_file() else None
        if section is not None:
            found.append((pyproject, section))
        if (directory / CONFIG_NAME).is_file():
            found.append((directory / CONFIG_NAME, None))
        if found:
            return found
    return []


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_project_config(start: Path | None = None, validate_tolerances: bool = True) -> dict[str, Any]:
    """The merged raw configuration ({} when no file is found).

    `start`: directory to search upward from (default: cwd), or a config file.

    Unknown top-level sections and every problem in `[tolerances]` raise a one-line
    ConfigError naming the file (and the close match, for typos).
    """
    config: dict[str, Any] = {}
    source = None
    for path, section in _found(start):
        data = section if section is not None else (
            _pyproject_section(path) if path.name == "pyproject.toml" else _read_toml(path))
        for key in data or {}:
            if key not in KNOWN_SECTIONS:
                import difflib  # only for a typo's hint

                close = difflib.get_close_matches(key, sorted(KNOWN_SECTIONS), n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{path}: unknown section {key!r}{hint}; known: {', '.join(sorted(KNOWN_SECTIONS))}")
        config = _merge(config, data or {})
        source = path
    if source is None:
        return {}
    for name in ("tolerances", "targets"):
        if name in config and not isinstance(config[name], dict):
            raise ConfigError(f"{source}: [{name}] must be a table")
    if "perf" in config:
        perf_section(config, str(source))
    if validate_tolerances and config.get("tolerances"):
        from bundlerun.bundles.registry import Registry  # on use (module comment)

        Registry.builtin().validate_overlay(config["tolerances"], str(source))
    config["_file"] = str(source)
    return config


# ------------------------------------------------- the registry with the project's [tolerances]
# (here, not in registry.py: the registry knows no project file, so neither module imports the other back)

_CACHE: dict[tuple, "Registry"] = {}


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return -1.0


def _data_files_or_none(path: Path) -> list[Path]:
    from bundlerun.bundles.registry import data_files  # on use (module comment)

    try:
        return data_files(path)
    except ConfigError:
        return []


def default_registry(project: bool = True) -> "Registry":
    """Built-in data (honouring $BUNDLERUN_TOLERANCES) + the project's [tolerances], if any."""
    from bundlerun.bundles.registry import BUILTIN_DIR, ENV_PATH, Registry  # on use (module comment)

    base_path = Path(os.environ.get(ENV_PATH) or BUILTIN_DIR)
    key: tuple = (str(base_path), *((str(f), _mtime(f)) for f in _data_files_or_none(base_path)))
    overlay: tuple[dict, str] | None = None
    if project:
        files = find_config_files()
        key += tuple((str(f), _mtime(f)) for f in files)
        if files:
            cfg = load_project_config(validate_tolerances=False)
            section = cfg.get("tolerances")
            if section:
                overlay = (section, str(cfg.get("_file", files[0])))
    if key not in _CACHE:
        reg = Registry.builtin(base_path)
        if overlay:
            reg = reg.with_overlay(*overlay)
        _CACHE.clear()
        _CACHE[key] = reg
    return _CACHE[key]
