"""The checks of every option a command or `bundlerun.api` call takes, in one place.

The CLI's option callbacks and the Python API call these same functions, so a value one refuses
the other refuses too, before any work starts (a timeout of nan, a label that is not text, a
report folder that is a file). Each raises ConfigError (a one-line BundlerunError, kind
"bad-config"); the CLI turns it into click's usage error for the option it checks. The bounds
are bundles/limits.py's (docs/security.md, "Bounds").
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from bundlerun.bundles import limits
from bundlerun.bundles.errors import BundlerunError, ConfigError
from bundlerun.targets import TargetConfig, default_backend, resolve_target

MAX_PATH_CHARS = 4096  # PATH_MAX on Linux: a longer path cannot be opened anyway
MAX_LABEL_CHARS = 256  # bundlerun's own: a label is a commit sha or a short name shown in every table
MAX_NAME_CHARS = 256  # a method, output or model id


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {repr(value)[:60]}"


def path(value: Any, what: str) -> Path:
    """A file system path given as str or os.PathLike: not empty, no NUL, at most PATH_MAX."""
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{what}: expected a path, got {_kind(value)}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text or "\0" in text or len(text) > MAX_PATH_CHARS:
        raise ConfigError(f"{what}: {repr(text)[:60]} is not a usable path (empty, a NUL byte, or over "
                          f"{MAX_PATH_CHARS} characters)")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise ConfigError(f"{what}: {text[:60]!r} is not a usable path (a lone surrogate)") from None
    return Path(text)


def report_folder(value: Any, what: str = "--report") -> Path:
    """A folder a command writes into: it must be (or become) a writable folder."""
    folder = path(value, what)
    for parent in [folder, *folder.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{what}: {parent} is a file, so {folder} cannot be a report folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError(f"{what}: {parent} is not writable")
            break
    return folder


def output_file(value: Any, what: str = "-o") -> Path:
    """A file a command writes (a .bpte): not a folder, in a folder that is (or can become) writable."""
    out = path(value, what)
    if out.is_dir():
        raise ConfigError(f"{what}: {out} is a folder; give the .bpte file to write")
    report_folder(out.parent, what)
    return out


def text(value: Any, what: str, limit: int = MAX_NAME_CHARS) -> str:
    """A name or label: printable text (no control or surrogate characters), 1 to `limit` characters."""
    if not isinstance(value, str):
        raise ConfigError(f"{what}: expected text, got {_kind(value)}")
    if not value or len(value) > limit or not value.isprintable():
        raise ConfigError(f"{what}: {repr(value)[:60]} is not a name of 1 to {limit} printable characters")
    return value


def label(value: Any, what: str = "--label") -> str | None:
    return None if value is None else text(value, what, MAX_LABEL_CHARS)


def inside(folder: Path, name: Any, what: str) -> str:
    """A name used as a file name in `folder`: one path component, so the file stays inside it."""
    name = text(name, what)
    if name in (".", "..") or "/" in name or "\\" in name:
        raise ConfigError(f"{what}: {name!r} is not a plain file name (it would write outside {folder})")
    return name


def seconds(value: Any, what: str) -> float:
    """A positive, finite number of seconds (limits.seconds)."""
    return limits.seconds(value, what)


def flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{what}: expected True or False, got {_kind(value)}")
    return value


def names(value: Any, what: str) -> list[str] | None:
    """A list of names (methods), or None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{what}: expected a list of names, got {_kind(value)}")
    if len(value) > limits.MAX_CASES:
        raise ConfigError(f"{what}: {len(value)} entries (at most {limits.MAX_CASES})")
    return [text(v, f"{what}[{i}]") for i, v in enumerate(value)]


def case_indexes(value: Any, what: str = "cases") -> list[int] | None:
    """Case indexes (each in [0, MAX_CASES)), or None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{what}: expected a list of case indexes, got {_kind(value)}")
    if not value or len(value) > limits.MAX_CASES:
        raise ConfigError(f"{what}: give 1 to {limits.MAX_CASES} case indexes")
    return sorted({limits.count(v, f"{what}[{i}]", 0, limits.MAX_CASES - 1) for i, v in enumerate(value)})


def mapping(value: Any, what: str) -> dict[str, Any]:
    """A mapping with text keys, or None (-> {})."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what}: expected a mapping, got {_kind(value)}")
    for key in value:
        text(key, f"{what} key")
    return dict(value)


def tolerance(key: Any, value: Any, what: str = "--tolerance") -> float:
    """One explicit criterion (KEY=VALUE of `build --tolerance`): a known key, a finite number >= 0
    (top_k: a whole number >= 1)."""

    if key == "top_k":
        from bundlerun.bundles.registry import top_k_value  # start-up: loads tomli on use

        return top_k_value(value, f"{what}: top_k")
    from bundlerun.bundles.manifest import CRITERIA_FIELDS  # start-up: the manifest's records load with a bundle

    if key not in CRITERIA_FIELDS:
        raise ConfigError(f"{what}: {str(key)[:60]!r} is not one of {', '.join((*CRITERIA_FIELDS, 'top_k'))}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{what}: {key}={value[:40]!r}: not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ConfigError(f"{what}: {key}={repr(value)[:40]}: expected a finite number")
    if value < 0:
        raise ConfigError(f"{what}: {key}={value}: tolerances cannot be negative")
    return float(value)


def tolerances(value: Any, what: str = "tolerances") -> dict[str, float]:
    """A mapping of explicit criteria, each checked by `tolerance`."""
    return {k: tolerance(k, v, what) for k, v in mapping(value, what).items()}


def overrides(value: Any, what: str = "overrides") -> list[str]:
    """`[METHOD.]OUTPUT.KEY=VALUE` strings, parsed (runner/judging/overrides.py) so a bad one fails now."""

    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{what}: expected a list of OUTPUT.KEY=VALUE strings, got {_kind(value)}")
    items = [text(v, f"{what}[{i}]", 4096) for i, v in enumerate(value)]
    if items:
        from bundlerun.runner.judging.overrides import parse_overrides  # start-up: as CRITERIA_FIELDS above

        parse_overrides(items)
    return items


def choice(value: Any, what: str, options: Sequence[str], optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or value not in options:
        raise ConfigError(f"{what}: {repr(value)[:60]} is not one of {', '.join(options)}")
    return value


def target_url(value: Any, what: str = "--target") -> str:
    """A target URL whose scheme bundlerun knows (targets/__init__.py parses it)."""
    return resolved_target(value, what).raw


def resolved_target(value: Any, what: str = "--target") -> TargetConfig:
    """A target URL whose scheme bundlerun knows, as the `TargetConfig` the run passes down (the
    URL's one parse, targets/__init__.py `resolve_target`)."""
    url = text(value, what, MAX_PATH_CHARS)
    try:
        resolved = resolve_target(url)
        default_backend(resolved)
    except BundlerunError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    return resolved
