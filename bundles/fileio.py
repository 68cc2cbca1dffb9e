"""Atomic file writes: a report or bundle is either the old file or the new one, never half."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write via a temp file + rename. The file gets the mode a plain open() would give
    (0666 less the umask), not mkstemp's 0600. A folder that is a file, or read-only,
    raises OSError naming the path."""
    return atomic_write_chunks(path, [data])


def atomic_write_chunks(path: str | Path, chunks: Iterable[bytes]) -> Path:
    """atomic_write_bytes for data made piece by piece (a farm's merged report.json, its cases read
    back from disk): an exception from `chunks` leaves the old file, or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            for data in chunks:
                fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise named(exc, path) from None
        raise
    return path


def named(exc: OSError, path: str | Path) -> OSError:
    """`exc` naming `path` when it names no file (a full disk fails a write() on an open file:
    that OSError carries no path, and "No space left on device" alone does not say where)."""
    if exc.filename is None and exc.errno is not None:
        return type(exc)(exc.errno, exc.strerror or str(exc), str(path))
    return exc


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (bundles, runners and libraries can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
