"""The one bounded reader for files bundlerun takes from outside (a golden folder, a runner cache
restored by CI, an ICD json, a plan): nothing in them may hang, exhaust or crash the process.

- **regular files only**: the file is opened with O_NONBLOCK (a FIFO opens at once instead of
  waiting for a writer) and, where no symlink may be followed, O_NOFOLLOW; the *opened* fd is
  fstat'ed, so a FIFO, a device (`-> /dev/zero`) or a folder is refused without a check-then-open
  race;
- **inside its folder**: with `root`, the path is resolved (every link followed) and must stay
  under the resolved `root`; the resolved path is then opened with O_NOFOLLOW;
- **size before reading**: st_size of the fd is checked against `max_bytes` before one byte is
  read, and at most `max_bytes + 1` bytes are ever read (a file that grows meanwhile is refused);
- **JSON**: bracket nesting counted before parsing (json.loads recurses: `[[[[...` is a
  RecursionError), NaN/Infinity and overflowing floats refused, integers within 64 bits, strings
  bounded, the parsed tree's depth checked without recursion.

Every failure is one `UnsafeFileError` line `<path>: <reason>` (a BundlerunError: exit code 2).
The bounds are bundlerun's own (limits.py says why); callers pass the size that fits their file.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.limits import MAX_JSON_DEPTH, MAX_JSON_STRING, MAX_WALK_DEPTH, MAX_WALK_ENTRIES

_INT_RANGE = (-(2**63), 2**64 - 1)  # int64 .. uint64: what any field of a runner.json or ICD json holds


class UnsafeFileError(BundlerunError):
    """A file from outside is not a regular file inside its folder, too large, or malformed.
    The message is one line: `<path>: <reason>`."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def inside(path: str | Path, root: str | Path) -> Path:
    """`path` with every link resolved, if that stays under the resolved `root`; else UnsafeFileError."""
    real, base = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real != base and base not in real.parents:
        raise UnsafeFileError(f"{path}: resolves to {real}, outside {base}")
    return real


def open_regular(path: str | Path, *, root: str | Path | None = None, follow: bool = True) -> tuple[int, int]:
    """(fd, size) of a regular file opened for reading; the caller closes fd. `root`: the file must
    resolve inside it; `follow=False`: a symlink as the last component is refused (O_NOFOLLOW)."""
    target = inside(path, root) if root is not None else Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    if root is not None or not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise UnsafeFileError(f"{path}: missing") from None
    except OSError as exc:
        reason = "a symlink, not followed here" if exc.errno == errno.ELOOP else exc.strerror
        raise UnsafeFileError(f"{path}: cannot open ({reason})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"{path}: {_kind(info.st_mode)}, not a regular file")
        return fd, info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | Path, max_bytes: int, *, root: str | Path | None = None, follow: bool = True,
                 exact: int | None = None, what: str = "") -> bytes:
    """The bytes of a regular file of at most `max_bytes` (or of exactly `exact` bytes), checked on
    the opened fd before reading. `root`, `follow`: as `open_regular`; `what` ends the size errors
    (e.g. "for the program's float32[1, 5] tensor"). UnsafeFileError otherwise."""
    fd, size = open_regular(path, root=root, follow=follow)
    try:
        if exact is not None and size != exact:
            raise UnsafeFileError(f"{path}: {size} bytes, expected {exact} {what}".rstrip())
        if size > max_bytes:
            raise UnsafeFileError(f"{path}: {size} bytes; bundlerun reads at most {max_bytes} {what or 'here'} "
                                  "(docs/security.md)")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise UnsafeFileError(f"{path}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes or (exact is not None and len(data) != exact):
        raise UnsafeFileError(f"{path}: changed size while read ({size} bytes, then {len(data)})")
    return data


def _bracket_depth(text: str) -> int:
    """Deepest [ / { nesting outside JSON strings, counted without parsing."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows a float")
    return value


def _integer(text: str) -> int:
    value = int(text)  # Python refuses more than 4,300 digits with a ValueError
    if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        raise ValueError(f"integer {text[:40]}... is outside 64 bits")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_json_bounded(data: bytes | str, where: str, *, max_depth: int = MAX_JSON_DEPTH,
                       max_string: int = MAX_JSON_STRING) -> Any:
    """Parse JSON text from outside, bounded as the module says; `where` names it in errors."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    except UnicodeDecodeError as exc:
        raise UnsafeFileError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if _bracket_depth(text) > max_depth:
        raise UnsafeFileError(f"{where}: JSON nested deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_float=_finite, parse_int=_integer, parse_constant=_constant)
    except ValueError as exc:  # JSONDecodeError, or one of ours
        raise UnsafeFileError(f"{where}: not valid JSON ({' '.join(str(exc).split())[:200]})") from None
    except (RecursionError, MemoryError):
        raise UnsafeFileError(f"{where}: JSON nested too deeply or too large") from None
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and len(item) > max_string:
            raise UnsafeFileError(f"{where}: a JSON string of {len(item)} characters (at most {max_string})")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def load_json_bounded(path: str | Path, max_bytes: int, *, max_depth: int = MAX_JSON_DEPTH,
                      max_string: int = MAX_JSON_STRING, root: str | Path | None = None,
                      follow: bool = True) -> Any:
    """`read_bounded` + `loads_json_bounded`: a JSON file from outside, or UnsafeFileError."""
    return loads_json_bounded(read_bounded(path, max_bytes, root=root, follow=follow), str(path),
                              max_depth=max_depth, max_string=max_string)


def walk_files(root: str | Path, *, max_depth: int = MAX_WALK_DEPTH,
               max_entries: int = MAX_WALK_ENTRIES) -> Iterator[Path]:
    """Every regular-looking entry under `root` (files and symlinks, sorted per folder), walked
    without recursion and without entering symlinked folders. A tree deeper than `max_depth` or
    with more than `max_entries` entries is an UnsafeFileError. Whether a yielded path may be read
    is `read_bounded(..., root=root)`'s to decide."""
    root = Path(root)
    stack: list[tuple[Path, int]] = [(root, 0)]
    seen = 0
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise UnsafeFileError(f"{folder}: cannot list ({exc.strerror})") from None
        seen += len(entries)
        if seen > max_entries:
            raise UnsafeFileError(f"{root}: more than {max_entries} entries; bundlerun walks at most that many")
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 > max_depth:
                    raise UnsafeFileError(f"{Path(entry.path)}: folders nested deeper than {max_depth} levels "
                                          f"under {root}")
                stack.append((Path(entry.path), depth + 1))
            else:
                yield Path(entry.path)
