"""Read and write BundleIO programs (`.bpte`) with the `flatbuffers` runtime only.

The layout is ExecuTorch's `bundled_program_schema.fbs` (identifier BP08). bundlerun
appends one field to the root table, `bundlerun_manifest: string` (slot 3, after
`program`), holding the manifest as JSON. Stock FlatBuffers readers skip unknown
trailing fields, so the stock runtime still loads and verifies the file; see
`bundles/schema/bundlerun_bundled_program.fbs`.

Nothing here imports torch, so `inspect`, `run` and every target can read bundles
quickly, and per-case bundles (case k moved to index 0, for runners that only
check case 0) can be produced without the ExecuTorch toolchain.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import flatbuffers
from flatbuffers import encode, number_types as N, packer
from flatbuffers.table import Table

from bundles import scalar_types as st
from bundles.errors import BundleFormatError
from bundles.fileio import atomic_write_bytes

FILE_IDENTIFIER = b"BP08"
SCHEMA_VERSION = 2
PROGRAM_ALIGN = 32
TENSOR_DATA_ALIGN = 16

# ValueUnion discriminants in declaration order (NONE = 0).
_TENSOR, _INT, _BOOL, _DOUBLE = 1, 2, 3, 4


@dataclass
class BundledValue:
    """One input or expected output: a tensor, or an int/bool/double scalar."""

    kind: str  # "tensor" | "int" | "bool" | "double"
    scalar_type: int = st.FLOAT
    sizes: list[int] = field(default_factory=list)
    data: bytes = b""
    dim_order: list[int] = field(default_factory=list)
    scalar: int | float | bool | None = None

    @classmethod
    def from_array(cls, array: Any, scalar_type: int | None = None) -> "BundledValue":
        import numpy as np

        array = np.ascontiguousarray(array)
        code = st.code_from_numpy(array.dtype) if scalar_type is None else scalar_type
        return cls(
            kind="tensor",
            scalar_type=code,
            sizes=[int(s) for s in array.shape],
            data=array.tobytes(),
            dim_order=list(range(array.ndim)),
        )

    def to_array(self):
        """Tensor contents as a numpy array (bfloat16 stays as raw uint16 words)."""
        if self.kind != "tensor":
            raise ValueError(f"value is a {self.kind}, not a tensor")
        return st.to_array(self.scalar_type, self.sizes, self.data)

    def describe(self) -> str:
        if self.kind == "tensor":
            return f"{st.name(self.scalar_type)}{list(self.sizes)}"
        return f"{self.kind}({self.scalar})"


@dataclass
class BundledTestCase:
    inputs: list[BundledValue]
    expected_outputs: list[BundledValue]


@dataclass
class MethodTestSuite:
    method_name: str
    test_cases: list[BundledTestCase]


@dataclass
class Bundle:
    """A parsed `.bpte`: the program bytes, the test suites and bundlerun's manifest."""

    program: bytes
    method_test_suites: list[MethodTestSuite]
    manifest: dict[str, Any] | None = None
    version: int = SCHEMA_VERSION

    def suite(self, method_name: str) -> MethodTestSuite:
        for suite in self.method_test_suites:
            if suite.method_name == method_name:
                return suite
        raise KeyError(method_name)

    @property
    def num_cases(self) -> int:
        return sum(len(s.test_cases) for s in self.method_test_suites)

    def single_case(self, method_name: str, case_index: int) -> "Bundle":
        """A bundle holding only `case_index` of `method_name`, as its case 0.

        Stock runners (arm_executor_runner, executor_runner) load and verify test
        case 0 only; running this bundle makes them run the chosen case.
        """
        suite = self.suite(method_name)
        case = suite.test_cases[case_index]
        return replace(
            self,
            method_test_suites=[MethodTestSuite(method_name, [case])],
        )


def _vector_bytes(tab: Table, slot: int) -> bytes:
    off = tab.Offset(4 + 2 * slot)
    if not off:
        return b""
    start = tab.Vector(off)
    length = tab.VectorLen(off)
    if start + length > len(tab.Bytes):
        raise BundleFormatError("bundle is truncated (a byte vector runs past the end of the file)")
    return bytes(tab.Bytes[start : start + length])


def _vector_tables(tab: Table, slot: int) -> list[Table]:
    off = tab.Offset(4 + 2 * slot)
    if not off:
        return []
    start = tab.Vector(off)
    out = []
    for i in range(tab.VectorLen(off)):
        pos = tab.Indirect(start + 4 * i)
        out.append(Table(tab.Bytes, pos))
    return out


def _vector_scalars(tab: Table, slot: int, flags: Any, size: int) -> list[int]:
    off = tab.Offset(4 + 2 * slot)
    if not off:
        return []
    start = tab.Vector(off)
    return [tab.Get(flags, start + i * size) for i in range(tab.VectorLen(off))]


def _scalar(tab: Table, slot: int, flags: Any, default: Any) -> Any:
    off = tab.Offset(4 + 2 * slot)
    return tab.Get(flags, tab.Pos + off) if off else default


def _read_value(tab: Table) -> BundledValue:
    kind = _scalar(tab, 0, N.Uint8Flags, 0)
    off = tab.Offset(6)
    if not off:
        raise BundleFormatError("bundle has a Value without content")
    inner = Table(tab.Bytes, 0)
    tab.Union(inner, off)
    if kind == _TENSOR:
        return BundledValue(
            kind="tensor",
            scalar_type=_scalar(inner, 0, N.Int8Flags, 0),
            sizes=_vector_scalars(inner, 1, N.Int32Flags, 4),
            data=_vector_bytes(inner, 2),
            dim_order=_vector_scalars(inner, 3, N.Uint8Flags, 1),
        )
    if kind == _INT:
        return BundledValue(kind="int", scalar=_scalar(inner, 0, N.Int64Flags, 0))
    if kind == _BOOL:
        return BundledValue(kind="bool", scalar=bool(_scalar(inner, 0, N.BoolFlags, False)))
    if kind == _DOUBLE:
        return BundledValue(kind="double", scalar=_scalar(inner, 0, N.Float64Flags, 0.0))
    raise BundleFormatError(f"bundle has a Value of unknown union type {kind}")


def _check_identifier(buf: bytes, source: str) -> None:
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


def parse_bundle(buf: bytes, source: str = "bundle") -> Bundle:
    """Parse `.bpte` bytes; every malformed input raises BundleFormatError."""
    _check_identifier(buf, source)
    try:
        root = encode.Get(packer.uoffset, buf, 0)
        if root >= len(buf):
            raise BundleFormatError(f"{source}: bundle is truncated (root table beyond end of file)")
        tab = Table(buf, root)
        version = _scalar(tab, 0, N.Uint32Flags, 0)
        suites = []
        for suite_tab in _vector_tables(tab, 1):
            name_off = suite_tab.Offset(4)
            method = suite_tab.String(name_off + suite_tab.Pos).decode() if name_off else ""
            cases = [
                BundledTestCase(
                    inputs=[_read_value(v) for v in _vector_tables(case_tab, 0)],
                    expected_outputs=[_read_value(v) for v in _vector_tables(case_tab, 1)],
                )
                for case_tab in _vector_tables(suite_tab, 1)
            ]
            suites.append(MethodTestSuite(method, cases))
        program = _vector_bytes(tab, 2)
        manifest_off = tab.Offset(10)
        manifest = None
        if manifest_off:
            manifest = json.loads(tab.String(manifest_off + tab.Pos).decode("utf-8"))
    except BundleFormatError:
        raise
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise BundleFormatError(f"{source}: bundle is corrupted or truncated ({type(exc).__name__}: {exc})") from None
    if not program:
        raise BundleFormatError(f"{source}: bundle holds no program")
    if len(program) < 8 or program[4:6] != b"ET":
        raise BundleFormatError(f"{source}: the embedded program is not an ExecuTorch program (corrupted bundle)")
    for suite in suites:
        for case in suite.test_cases:
            for value in case.inputs + case.expected_outputs:
                if value.kind == "tensor":
                    try:
                        expected = st.itemsize(value.scalar_type)
                    except st.UnsupportedScalarType as exc:
                        raise BundleFormatError(f"{source}: {exc}") from None
                    numel = 1
                    for s in value.sizes:
                        numel *= s
                    if numel * expected != len(value.data):
                        raise BundleFormatError(
                            f"{source}: method {suite.method_name!r} has a tensor of shape {value.sizes} "
                            f"with {len(value.data)} bytes of data (expected {numel * expected}); corrupted bundle"
                        )
    return Bundle(program=program, method_test_suites=suites, manifest=manifest, version=version)


def read_bundle(path: str | Path) -> Bundle:
    path = Path(path)
    try:
        buf = path.read_bytes()
    except FileNotFoundError:
        raise BundleFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BundleFormatError(f"{path}: is a directory, expected a .bpte file") from None
    except OSError as exc:
        raise BundleFormatError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_bundle(buf, str(path))


def _aligned_bytes(builder: flatbuffers.Builder, data: bytes, alignment: int) -> int:
    builder.StartVector(1, len(data), alignment)
    builder.head = builder.Head() - len(data)
    builder.Bytes[builder.Head() : builder.Head() + len(data)] = data
    return builder.EndVector()


def _scalar_vector(builder: flatbuffers.Builder, values: list[int], size: int, prepend: Any) -> int:
    builder.StartVector(size, len(values), size)
    for v in reversed(values):
        prepend(v)
    return builder.EndVector()


def _offset_vector(builder: flatbuffers.Builder, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        builder.PrependUOffsetTRelative(off)
    return builder.EndVector()


def _write_value(builder: flatbuffers.Builder, value: BundledValue) -> int:
    if value.kind == "tensor":
        data = _aligned_bytes(builder, value.data, TENSOR_DATA_ALIGN)
        sizes = _scalar_vector(builder, value.sizes, 4, builder.PrependInt32)
        dim_order = _scalar_vector(builder, value.dim_order or list(range(len(value.sizes))), 1, builder.PrependUint8)
        builder.StartObject(4)
        builder.PrependInt8Slot(0, value.scalar_type, -1)  # always written
        builder.PrependUOffsetTRelativeSlot(1, sizes, 0)
        builder.PrependUOffsetTRelativeSlot(2, data, 0)
        builder.PrependUOffsetTRelativeSlot(3, dim_order, 0)
        inner, kind = builder.EndObject(), _TENSOR
    elif value.kind == "int":
        builder.StartObject(1)
        builder.PrependInt64Slot(0, int(value.scalar), 1 << 62)
        inner, kind = builder.EndObject(), _INT
    elif value.kind == "bool":
        builder.StartObject(1)
        builder.PrependBoolSlot(0, bool(value.scalar), not bool(value.scalar))
        inner, kind = builder.EndObject(), _BOOL
    elif value.kind == "double":
        builder.StartObject(1)
        builder.PrependFloat64Slot(0, float(value.scalar), float("nan"))
        inner, kind = builder.EndObject(), _DOUBLE
    else:
        raise ValueError(f"unknown value kind {value.kind}")
    builder.StartObject(2)
    builder.PrependUint8Slot(0, kind, 0)
    builder.PrependUOffsetTRelativeSlot(1, inner, 0)
    return builder.EndObject()


def serialize_bundle(bundle: Bundle) -> bytes:
    """Serialize to `.bpte` bytes; the manifest (if any) goes in root slot 3."""
    size_hint = len(bundle.program) + 1024 + sum(
        len(v.data) + 64
        for s in bundle.method_test_suites
        for c in s.test_cases
        for v in c.inputs + c.expected_outputs
    )
    builder = flatbuffers.Builder(size_hint)
    manifest_off = 0
    if bundle.manifest is not None:
        manifest_off = builder.CreateString(json.dumps(bundle.manifest, sort_keys=True, separators=(",", ":")))
    program_off = _aligned_bytes(builder, bytes(bundle.program), PROGRAM_ALIGN)
    suite_offs = []
    for suite in bundle.method_test_suites:
        case_offs = []
        for case in suite.test_cases:
            inputs = _offset_vector(builder, [_write_value(builder, v) for v in case.inputs])
            outputs = _offset_vector(builder, [_write_value(builder, v) for v in case.expected_outputs])
            builder.StartObject(2)
            builder.PrependUOffsetTRelativeSlot(0, inputs, 0)
            builder.PrependUOffsetTRelativeSlot(1, outputs, 0)
            case_offs.append(builder.EndObject())
        cases = _offset_vector(builder, case_offs)
        name = builder.CreateString(suite.method_name)
        builder.StartObject(2)
        builder.PrependUOffsetTRelativeSlot(0, name, 0)
        builder.PrependUOffsetTRelativeSlot(1, cases, 0)
        suite_offs.append(builder.EndObject())
    suites = _offset_vector(builder, suite_offs)
    builder.StartObject(4)
    builder.PrependUint32Slot(0, bundle.version, 0xFFFFFFFF)
    builder.PrependUOffsetTRelativeSlot(1, suites, 0)
    builder.PrependUOffsetTRelativeSlot(2, program_off, 0)
    if manifest_off:
        builder.PrependUOffsetTRelativeSlot(3, manifest_off, 0)
    root = builder.EndObject()
    builder.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def write_bundle(bundle: Bundle, path: str | Path) -> Path:
    """Serialize and write atomically (temp file + rename)."""
    return atomic_write_bytes(path, serialize_bundle(bundle))
