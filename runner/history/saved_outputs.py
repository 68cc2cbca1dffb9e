"""Read `outputs.npz` (the actual outputs `run --save-outputs` kept) without trusting it.

The file is data: it may be truncated, not a zip, hold object or float64 arrays where the run
saved float32, members no case of the report has, or a 4 MB member that inflates to 1 GiB. So
nothing is handed to `np.load`: every member is opened with `zipfile`, its declared size and
its `.npy` header (dtype, shape, order) are checked against what the bundle and the report say
the array must be, and only then exactly that many bytes are read (decompression stops there).
Each failure is one OutputsError line naming the file and the member.

`file_digest` is the sha256 the report records (`outputs_sha256`), which `judge` checks, so
an outputs.npz swapped for another (the expected values, say) is refused instead of judged.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.fileio import file_sha256

NPY_HEADER_MAX = 65536  # a .npy header (magic, version, dict) is far smaller; numpy's own cap is 10,000
MAX_MEMBERS = 1_000_000  # members of one outputs.npz


class OutputsError(BundlerunError):
    """An outputs.npz that cannot be judged; one line naming the file and the member."""

    kind = "bad-outputs"


@dataclass(frozen=True)
class Expect:
    """What one member must be: its dtype, and the most bytes its data may have."""

    dtype: np.dtype
    max_bytes: int


def file_digest(path: str | Path) -> str:
    return file_sha256(path)


def _header(fp, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(fp, max_header_size=NPY_HEADER_MAX)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy.read_array_header_2_0(fp, max_header_size=NPY_HEADER_MAX)
        else:
            raise ValueError(f"unknown .npy version {version}")
    except (ValueError, EOFError, OSError, SyntaxError, TypeError, zipfile.BadZipFile, zlib.error) as exc:
        raise OutputsError(f"{where}: not a .npy array ({type(exc).__name__}: {str(exc)[:120]})") from None
    return tuple(shape), bool(fortran), np.dtype(dtype)


def read_outputs(path: str | Path, expect: Mapping[str, Expect]) -> dict[str, np.ndarray]:
    """{key: array} for every member of the outputs.npz at `path`; each key must be in `expect`
    and match its dtype and size, checked before its data is inflated."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise OutputsError(f"{path}: {len(infos)} members (at most {MAX_MEMBERS})")
            for info in infos:
                name = info.filename
                key = name[:-4] if name.endswith(".npy") else name
                where = f"{path}: member {key!r}"
                want = expect.get(key)
                if want is None:
                    raise OutputsError(f"{where} is no output of a case the report holds (corrupted or edited file)")
                if key in arrays:
                    raise OutputsError(f"{where} is in the file twice")
                if info.file_size > want.max_bytes + NPY_HEADER_MAX:
                    raise OutputsError(f"{where} inflates to {info.file_size} bytes; the bundle's output allows at "
                                       f"most {want.max_bytes} (corrupted or edited file)")
                with zf.open(info) as fp:
                    shape, fortran, dtype = _header(fp, where)
                    if dtype.hasobject or dtype != want.dtype:
                        raise OutputsError(f"{where} is a {dtype} array; the run saved {want.dtype} for this output")
                    if any(int(s) < 0 for s in shape) or len(shape) > 16:
                        raise OutputsError(f"{where} has an impossible shape {list(shape)[:16]}")
                    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if nbytes > want.max_bytes:
                        raise OutputsError(f"{where} has shape {list(shape)} ({nbytes} bytes); the bundle's output "
                                           f"allows at most {want.max_bytes} bytes")
                    data = fp.read(nbytes + 1)
                if len(data) != nbytes:
                    raise OutputsError(f"{where} holds {len(data)} bytes of data, its header says {nbytes} "
                                       "(truncated or corrupted file)")
                array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
                arrays[key] = np.ascontiguousarray(array)
    except OutputsError:
        raise
    except FileNotFoundError:
        raise OutputsError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, ValueError, NotImplementedError, OSError,
            RuntimeError, OverflowError, MemoryError) as exc:
        # RuntimeError: an encrypted member; NotImplementedError: an unknown compression method
        raise OutputsError(f"{path}: not a readable outputs.npz ({type(exc).__name__}: {str(exc)[:160]})") from None
    return arrays
