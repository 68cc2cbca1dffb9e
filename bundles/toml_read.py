"""Read a TOML file (bundlerun.toml, a farm plan) without letting its content crash the reader.

tomllib recurses on nested arrays and inline tables (`a = [[[[...` raises RecursionError), reads
whole files into memory, and gives `[a.b.c...]` headers any depth, which later walks of the data
would recurse on. So: the file is bounded in size (bundles/limits.py), its bracket nesting is
counted before parsing (strings and comments left out), and the parsed tree's depth is checked
without recursion. Every failure is one ConfigError line naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.limits import MAX_FILE_BYTES, MAX_TOML_DEPTH
from bundlerun.bundles.safe_read import UnsafeFileError, read_bounded

# strings (basic, literal, multi-line) and comments: their brackets are not nesting
_SKIP = re.compile(r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*', re.S)


def _bracket_depth(text: str) -> int:
    depth = deepest = 0
    for ch in re.findall(r"[\[\]{}]", _SKIP.sub("", text)):
        depth = depth + 1 if ch in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def tree_depth(data: Any) -> int:
    """Nesting depth of parsed TOML/JSON data, walked without recursion."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return deepest


def loads_toml(text: str, where: str) -> dict[str, Any]:
    """Parse TOML text, bounded as the module says; `where` names the file in errors."""
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: {len(text)} characters; bundlerun reads at most {MAX_FILE_BYTES} (docs/security.md)")
    if _bracket_depth(text) > MAX_TOML_DEPTH:
        raise ConfigError(f"{where}: not valid here: arrays or tables nested deeper than {MAX_TOML_DEPTH} levels")
    try:  # imported here: `bundlerun run` reads its project config before its target starts, often with no file
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from None
    except (RecursionError, MemoryError):
        raise ConfigError(f"{where}: not valid here: nested too deeply or too large to read") from None
    if tree_depth(data) > MAX_TOML_DEPTH:
        raise ConfigError(f"{where}: not valid here: keys nested deeper than {MAX_TOML_DEPTH} levels")
    return data


def read_toml(path: str | Path, what: str = "") -> dict[str, Any]:
    """Read and parse a TOML file; ConfigError (one line naming it) for a missing, unreadable,
    oversized, undecodable, invalid or too deeply nested file."""
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    if not path.exists():
        raise ConfigError(f"no {what or 'file'} at {path}")
    if path.is_dir():
        raise ConfigError(f"{label} is a directory, not a TOML file")
    try:  # a regular file only (a FIFO would block the read), its size checked on the opened file
        text = read_bounded(path, MAX_FILE_BYTES).decode("utf-8")
    except UnsafeFileError as exc:
        raise ConfigError(f"{what + ' ' if what else ''}{exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return loads_toml(text, str(path))
