"""A `.bpte` file's bytes, and what is read of them before they are verified: the identifier and each
test suite's method name. Apart from bpte.py (the whole parse, the manifest and integrity checks: about
20 ms of imports) so `bundlerun run` can start a served runner on the bytes first and import the rest
while it loads (runner/session.py read_for_run); every check here is bpte.py's own, which imports these.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from bundlerun.bundles.errors import BundleFormatError
from bundlerun.bundles.flatbuf import FlatReader
from bundlerun.bundles.manifest_schema import MAX_NAME

FILE_IDENTIFIER = b"BP08"


def check_identifier(buf: bytes | memoryview, source: str) -> None:
    if len(buf) < 8:
        raise BundleFormatError(f"{source}: file is empty or too short to be a bundle ({len(buf)} bytes)")
    ident = bytes(buf[4:8])
    if ident == FILE_IDENTIFIER:
        return
    if ident[:2] == b"ET" and ident[2:4].isdigit():
        raise BundleFormatError(
            f"{source}: this is a plain ExecuTorch program ({ident.decode()}), not a BundleIO .bpte; "
            "build a bundle with `bundlerun build`"
        )
    raise BundleFormatError(
        f"{source}: not a BundleIO program (file identifier {ident!r}, expected {FILE_IDENTIFIER!r})"
    )


def method_names(buf: bytes | memoryview, source: str = "bundle") -> list[str]:
    """Each test suite's method name, read without the cases (bounds-checked as every read; BundleError when
    unreadable): what `bundlerun run` starts a served runner with before the bundle is read and verified
    (runner/session.py, early start). Nothing here vouches for the bundle: `load_bundle` does."""
    check_identifier(buf, source)
    try:
        root = FlatReader(memoryview(buf), source).root("bundle")
        return [suite.string(0, f"test suite {k} method name", MAX_NAME) or ""
                for k, suite in enumerate(root.tables(1, "test suite"))]
    except BundleFormatError:
        raise
    except (struct.error, IndexError, KeyError, TypeError, ValueError, OverflowError, UnicodeDecodeError) as exc:
        raise BundleFormatError(f"{source}: bundle is corrupted or truncated ({type(exc).__name__}: {exc})"[:400]) from None


def read_bundle_bytes(path: str | Path, writable: bool = False) -> bytes:
    """A `.bpte` file's bytes, or what stops them being read as one line (BundleFormatError).
    `writable`: in a bytearray (bundles/on_file.py takes the address of its views with ctypes)."""
    path = Path(path)
    try:
        if writable:
            with path.open("rb") as fh:
                buf = bytearray(os.fstat(fh.fileno()).st_size)
                if fh.readinto(buf) != len(buf) or fh.read(1):
                    raise BundleFormatError(f"{path}: changed while it was read")
                return buf  # type: ignore[return-value]  # a bytearray reads as bytes everywhere it goes
        return path.read_bytes()
    except FileNotFoundError:
        raise BundleFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BundleFormatError(f"{path}: is a directory, expected a .bpte file") from None
    except OSError as exc:
        raise BundleFormatError(f"{path}: cannot read ({exc.strerror})") from None
