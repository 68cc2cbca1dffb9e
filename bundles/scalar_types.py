"""ExecuTorch ScalarType codes <-> numpy dtypes, without importing torch.

The codes are the `executorch_flatbuffer.ScalarType` enum used by the
BundledProgram schema (scalar_type.fbs). bfloat16 has no numpy dtype of its own;
it is carried as raw uint16 words and widened to float32 by `to_float_array`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

BYTE, CHAR, SHORT, INT, LONG, HALF, FLOAT, DOUBLE = 0, 1, 2, 3, 4, 5, 6, 7
BOOL, BFLOAT16, UINT16, UINT32, UINT64 = 11, 15, 27, 28, 29

_NAMES = {
    BYTE: "uint8",
    CHAR: "int8",
    SHORT: "int16",
    INT: "int32",
    LONG: "int64",
    HALF: "float16",
    FLOAT: "float32",
    DOUBLE: "float64",
    BOOL: "bool",
    BFLOAT16: "bfloat16",
    UINT16: "uint16",
    UINT32: "uint32",
    UINT64: "uint64",
}
# numpy's name of each code's dtype (bfloat16 as its raw uint16 words) and its size in bytes: reading a
# bundle needs only these, so numpy is imported when an array is made (`bundlerun run` spawns its
# target before that: runner/session.py)
_NUMPY = {**_NAMES, BFLOAT16: "uint16"}
_ITEMSIZE = {BYTE: 1, CHAR: 1, SHORT: 2, INT: 4, LONG: 8, HALF: 2, FLOAT: 4, DOUBLE: 8, BOOL: 1, BFLOAT16: 2,
             UINT16: 2, UINT32: 4, UINT64: 8}
_BY_NAME = {v: k for k, v in _NAMES.items()}
FLOATING = frozenset({HALF, FLOAT, DOUBLE, BFLOAT16})


class UnsupportedScalarType(ValueError):
    pass


def name(code: int) -> str:
    """Human name of a ScalarType code ('float32', 'int8', ...)."""
    try:
        return _NAMES[code]
    except KeyError:
        raise UnsupportedScalarType(f"unsupported ExecuTorch scalar type code {code}") from None


def code_from_name(dtype_name: str) -> int:
    try:
        return _BY_NAME[dtype_name]
    except KeyError:
        raise UnsupportedScalarType(f"unsupported dtype name {dtype_name!r}") from None


def numpy_dtype(code: int) -> np.dtype:
    import numpy as np  # start-up: loaded on use

    try:
        return np.dtype(_NUMPY[code])
    except KeyError:
        raise UnsupportedScalarType(f"unsupported ExecuTorch scalar type code {code}") from None


def itemsize(code: int) -> int:
    try:
        return _ITEMSIZE[code]
    except KeyError:
        raise UnsupportedScalarType(f"unsupported ExecuTorch scalar type code {code}") from None


def code_from_numpy(dtype: np.dtype) -> int:
    import numpy as np  # start-up: loaded on use

    dtype = np.dtype(dtype)
    for code, np_type in _NUMPY.items():
        if code != BFLOAT16 and np.dtype(np_type) == dtype:
            return code
    raise UnsupportedScalarType(f"unsupported numpy dtype {dtype}")


def torch_dtype(code: int):
    """The torch dtype of a ScalarType code (the names above are torch's own); KeyError if none."""
    import torch

    return getattr(torch, _NAMES[int(code)])


def code_from_torch(dtype) -> int:
    """The ScalarType code of a torch dtype; KeyError for a dtype bundles cannot hold."""
    return _BY_NAME[str(dtype).removeprefix("torch.")]


def is_floating(code: int) -> bool:
    return code in FLOATING


def to_array(code: int, shape: tuple[int, ...] | list[int], data: bytes | memoryview) -> np.ndarray:
    """Decode raw little-endian tensor bytes (as written by the runtime) into an array."""
    import numpy as np  # start-up: loaded on use

    dtype = numpy_dtype(code)
    if any(int(s) < 0 for s in shape):  # numpy would infer a -1 dimension instead of refusing it
        raise ValueError(f"{name(code)} tensor has a negative size in its shape {list(shape)[:16]}")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(
            f"{name(code)} tensor of shape {list(shape)} needs {expected} bytes, got {len(data)}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(tuple(shape))


def to_float_array(code: int, array: np.ndarray) -> np.ndarray:
    """Widen any supported array to float64 for comparison (bfloat16 words decoded)."""
    import numpy as np  # start-up: loaded on use

    if code == BFLOAT16:
        return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return array.astype(np.float64, copy=False)
