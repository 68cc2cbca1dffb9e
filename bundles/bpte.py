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
import math
import re
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.errors import BundleFormatError, ManifestError
from bundlerun.bundles.fileio import atomic_write_bytes
from bundlerun.bundles.flatbuf import FlatReader, FlatTable
from bundlerun.bundles.bpte_bytes import FILE_IDENTIFIER, method_names, read_bundle_bytes  # noqa: F401  (here too)
from bundlerun.bundles.bpte_bytes import check_identifier as _check_identifier
from bundlerun.bundles.manifest_schema import MAX_DEPTH, MAX_DIMS, MAX_NAME
from bundlerun.bundles.manifest import Manifest
from bundlerun.bundles.integrity import seal, validate_bundle

if TYPE_CHECKING:
    import flatbuffers

SCHEMA_VERSION = 2
PROGRAM_ALIGN = 32
TENSOR_DATA_ALIGN = 16
MAX_MANIFEST_BYTES = 16 << 20
TRAILING_SLACK = 32  # fewer zero bytes after the data are alignment padding (docs/security.md)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')  # JSON strings, removed before counting brackets

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
    def from_array(cls, array: Any, scalar_type: int | None = None,
                   dim_order: list[int] | None = None) -> "BundledValue":
        """`array` (logical order) stored in `dim_order` (None: contiguous). The bytes are laid out
        in that order because the runtime copies them as they are: BundleIO's load_bundled_input
        builds the TensorImpl with the bundled dim_order (devtools/bundled_program/bundled_program.cpp:82)
        and Method::set_input copies the bytes without looking at it (runtime/executor/method.cpp:1250, internal::copy_tensor_data),
        as ExecuTorch's own writer stores `spec.storage` with `dim_order=list(spec.dim_order)`
        (devtools/bundled_program/core.py:181)."""
        import numpy as np

        array = np.asarray(array)
        order = list(range(array.ndim)) if dim_order is None else [int(d) for d in dim_order]
        if sorted(order) != list(range(array.ndim)):
            raise ValueError(f"dim order {order} is not a permutation of {array.ndim} dimensions")
        code = st.code_from_numpy(array.dtype) if scalar_type is None else scalar_type
        return cls(
            kind="tensor",
            scalar_type=code,
            sizes=[int(s) for s in array.shape],
            data=np.ascontiguousarray(array.transpose(order)).tobytes(),
            dim_order=order,
        )

    @property
    def physical_sizes(self) -> list[int]:
        """The sizes in the order the data is laid out (the logical sizes for contiguous data)."""
        if not self.dim_order or len(self.dim_order) != len(self.sizes):
            return list(self.sizes)
        return [int(self.sizes[d]) for d in self.dim_order]

    def to_array(self):
        """Tensor contents as a numpy array in logical (row-major, e.g. NCHW) order whatever the
        stored dim order, so every reader compares logical values (bfloat16 stays as raw uint16 words)."""
        if self.kind != "tensor":
            raise ValueError(f"value is a {self.kind}, not a tensor")
        physical = st.to_array(self.scalar_type, self.physical_sizes, self.data)
        order = list(self.dim_order)
        if not order or order == list(range(len(order))) or len(order) != len(self.sizes):
            return physical
        import numpy as np

        return np.ascontiguousarray(physical.transpose(np.argsort(order)))

    @property
    def nbytes(self) -> int:
        """Bytes of data (bundles/on_file.py FileValue answers without reading them)."""
        return len(self.data or b"")

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
    """A parsed `.bpte`: the program bytes, the test suites and bundlerun's manifest.

    `manifest_json` is the manifest as stored (the JSON object the seal hashes and `write_bundle`
    writes, read only by the checkers in bundles/integrity.py and bundles/consistency.py);
    `manifest` is the typed `Manifest` every other reader uses, parsed once from it."""

    program: bytes
    method_test_suites: list[MethodTestSuite]
    manifest_json: dict[str, Any] | None = None
    version: int = SCHEMA_VERSION
    warnings: list[str] = field(default_factory=list)  # set by load_bundle (e.g. an unsealed bundle)
    _parsed: tuple[dict[str, Any], Manifest] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def manifest(self) -> Manifest | None:
        """The typed manifest (None: a bundle made by ExecuTorch's own BundledProgram API), parsed and
        validated on first use and kept while `manifest_json` is the same object (assign a new dict to
        change it: an edit made in place after the first read is not seen)."""
        if self.manifest_json is None:
            return None
        if self._parsed is None or self._parsed[0] is not self.manifest_json:
            self._parsed = (self.manifest_json, Manifest.from_dict(self.manifest_json))
        return self._parsed[1]

    def __deepcopy__(self, memo: dict[int, Any]) -> "Bundle":
        """A copy parses its own manifest: the cache is not copied (an edit to the copy's
        manifest_json must not be answered by the original's parse)."""
        import copy
        import dataclasses

        return dataclasses.replace(self, **{f.name: copy.deepcopy(getattr(self, f.name), memo)
                                            for f in dataclasses.fields(self) if f.init})

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
        single = replace(self, method_test_suites=[MethodTestSuite(method_name, [case])])
        if isinstance(self.manifest_json, dict) and isinstance(self.manifest_json.get("methods"), dict):
            manifest = dict(self.manifest_json)
            manifest["methods"] = {k: v for k, v in manifest["methods"].items() if k == method_name}
            single = replace(single, manifest_json=manifest)
            if manifest.get("integrity") is not None:
                single = seal(single)
        return single


def _read_value(tab: FlatTable, what: str) -> BundledValue:
    kind = int(tab.scalar(0, "u8", 0))
    inner = tab.table(1, what)
    if inner is None:
        raise tab.reader.fail(f"{what} has no content")
    if kind == _TENSOR:
        return BundledValue(
            kind="tensor",
            scalar_type=int(inner.scalar(0, "i8", 0)),
            sizes=[int(s) for s in inner.scalars(1, "i32", f"{what} sizes")],
            # a view of the buffer when parse_bundle was given a memoryview (the host worker): read like bytes
            data=cast(bytes, inner.bytes(2, f"{what} data")),
            dim_order=[int(d) for d in inner.scalars(3, "u8", f"{what} dim_order")],
        )
    if kind == _INT:
        return BundledValue(kind="int", scalar=int(inner.scalar(0, "i64", 0)))
    if kind == _BOOL:
        return BundledValue(kind="bool", scalar=bool(inner.scalar(0, "bool", False)))
    if kind == _DOUBLE:
        return BundledValue(kind="double", scalar=float(inner.scalar(0, "f64", 0.0)))
    raise tab.reader.fail(f"{what} has unknown value type {kind}")


def _brief(values: list[int], limit: int = MAX_DIMS) -> str:
    """A list for a one-line message: at most `limit` items, then how many more."""
    shown = ", ".join(map(str, values[:limit]))
    return f"[{shown}, ... ({len(values)} in all)]" if len(values) > limit else f"[{shown}]"


def _check_tensor(value: BundledValue, source: str, where: str, any_order: bool = False) -> None:
    """Sizes, dtype, data length and dim order agree. `any_order`: an input may be stored in another
    dim order (channels-last, as the cortex-m recipe exports it), which `to_array` reads back in logical
    order; an expected output must be contiguous (docs/security.md), as the runners' outputs are read."""
    try:
        itemsize = st.itemsize(value.scalar_type)
    except st.UnsupportedScalarType as exc:
        raise BundleFormatError(f"{source}: {where}: {exc}") from None
    if len(value.sizes) > MAX_DIMS or any(s < 0 for s in value.sizes):
        raise BundleFormatError(f"{source}: {where} has impossible sizes {_brief(value.sizes)}; corrupted bundle")
    numel = math.prod(value.sizes)
    if numel * itemsize != len(value.data):
        raise BundleFormatError(
            f"{source}: {where} is a tensor of shape {value.sizes} with {len(value.data)} bytes of data "
            f"(expected {numel * itemsize}); corrupted bundle"
        )
    if value.dim_order and sorted(value.dim_order) != list(range(len(value.sizes))):
        raise BundleFormatError(f"{source}: {where} has dim_order {_brief(value.dim_order)}, not a permutation of its "
                                f"{len(value.sizes)} dimensions; corrupted bundle")
    if value.dim_order and value.dim_order != list(range(len(value.sizes))) and not any_order:
        raise BundleFormatError(f"{source}: {where} has non-contiguous dim_order {_brief(value.dim_order)}; bundlerun reads "
                                "tensor data in contiguous (0, 1, ...) order only, so it would misread it")


def _decode_manifest(text: str, source: str) -> dict[str, Any]:
    """JSON object with no duplicate keys and bounded nesting (checked before json recurses)."""
    depth = deepest = 0
    for ch in re.findall(r"[\[\]{}]", _STRINGS.sub("", text)):
        depth += 1 if ch in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        raise ManifestError(f"{source}: invalid bundlerun manifest: nested deeper than {MAX_DEPTH} levels")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ManifestError(f"{source}: invalid bundlerun manifest: duplicate key {key[:60]!r}")
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{source}: the bundlerun manifest is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: invalid bundlerun manifest: expected a JSON object, got {type(data).__name__}")
    return data


def _parse(reader: FlatReader, source: str, in_memory: bool = False) -> Bundle:
    root = reader.root("bundle")
    version = int(root.scalar(0, "u32", 0))
    if version != SCHEMA_VERSION:
        raise BundleFormatError(f"{source}: BundledProgram schema version {version} is not supported "
                                f"(bundlerun reads version {SCHEMA_VERSION}); corrupted or from another ExecuTorch")
    suites = []
    for k, suite_tab in enumerate(root.tables(1, "test suite")):
        method = suite_tab.string(0, f"test suite {k} method name", MAX_NAME)
        if not method:
            raise BundleFormatError(f"{source}: test suite {k} has no method name; corrupted bundle")
        cases = []
        for i, case_tab in enumerate(suite_tab.tables(1, f"method {method!r} test cases")):
            where = f"method {method!r} case {i}"
            cases.append(BundledTestCase(
                inputs=[_read_value(v, f"{where} input {j}")
                        for j, v in enumerate(case_tab.tables(0, f"{where} inputs"))],
                expected_outputs=[_read_value(v, f"{where} expected output {j}")
                                  for j, v in enumerate(case_tab.tables(1, f"{where} expected outputs"))],
            ))
        suites.append(MethodTestSuite(method, cases))
    program = cast(bytes, root.bytes(2, "program"))  # a view, as each value's data (see _read_value)
    text = root.string(3, "bundlerun manifest", MAX_MANIFEST_BYTES)
    if text is None and root.vtable_size > 4 + 2 * 3:
        # FlatBuffers writers trim trailing absent fields from a vtable: a declared but
        # empty manifest slot is a zeroed offset, not a stock bundle (docs/security.md).
        raise BundleFormatError(f"{source}: the bundlerun manifest field is declared but empty; corrupted bundle")
    manifest = None if text is None else _decode_manifest(text, source)
    trailing = reader.buf[reader.high :]
    if not in_memory and (len(trailing) >= TRAILING_SLACK or bytes(trailing).strip(b"\0")):
        raise BundleFormatError(f"{source}: {len(trailing)} bytes follow the end of the bundle data "
                                "(appended or corrupted); rebuild the bundle")
    return Bundle(program=program, method_test_suites=suites, manifest_json=manifest, version=version)


def parse_bundle(buf: bytes | memoryview, source: str = "bundle", in_memory: bool = False) -> Bundle:
    """Parse `.bpte` bytes structurally: every malformed input raises BundleError.

    This is the flatbuffer layer only (also used on per-case bundles sent to
    devices); `read_bundle`/`load_bundle` add the manifest, consistency and
    integrity checks that every reader must run (bundles/integrity.py).
    `in_memory`: the bytes are a memory image (a bundle linked into firmware), where
    whatever follows the bundle is other data, as the device runtime sees it.
    Given a memoryview, the program and every value's data are views of it (no copy: a
    reader that holds the buffer anyway, as the host worker does, holds the bundle once).
    """
    _check_identifier(buf, source)
    try:
        bundle = _parse(FlatReader(buf, source), source, in_memory)
    except BundleFormatError:
        raise
    except (struct.error, IndexError, KeyError, TypeError, ValueError, OverflowError, RecursionError,
            MemoryError, UnicodeDecodeError) as exc:
        raise BundleFormatError(f"{source}: bundle is corrupted or truncated ({type(exc).__name__}: {exc})"[:400]) from None
    if not bundle.program:
        raise BundleFormatError(f"{source}: bundle holds no program")
    if len(bundle.program) < 8 or bundle.program[4:6] != b"ET":
        raise BundleFormatError(f"{source}: the embedded program is not an ExecuTorch program (corrupted bundle)")
    for suite in bundle.method_test_suites:
        for i, case in enumerate(suite.test_cases):
            for label, values in (("input", case.inputs), ("expected output", case.expected_outputs)):
                for j, value in enumerate(values):
                    if value.kind == "tensor":
                        _check_tensor(value, source, f"method {suite.method_name!r} case {i} {label} {j}",
                                      any_order=label == "input")
    return bundle


def load_bundle(buf: bytes, source: str = "bundle", require_seal: bool = False) -> Bundle:
    """Parse and validate (manifest schema, consistency with the program, integrity): what
    every reader of a user's bundle uses. Warnings (an unsealed bundle) are in `.warnings`;
    with `require_seal` an unsealed bundle is an IntegrityError (`--require-seal`)."""

    bundle = parse_bundle(buf, source)
    try:
        return validate_bundle(bundle, source, require_seal)
    except BundleFormatError:
        raise
    except (struct.error, IndexError, KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise BundleFormatError(f"{source}: bundle is corrupted ({type(exc).__name__}: {exc})"[:400]) from None


def read_bundle(path: str | Path, require_seal: bool = False) -> Bundle:
    """Read and validate a `.bpte` file (see `load_bundle`)."""
    return load_bundle(read_bundle_bytes(path), str(path), require_seal)


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
    import flatbuffers  # start-up: the runtime imports numpy; reading (bundles/flatbuf.py) needs neither

    builder = flatbuffers.Builder(size_hint)
    manifest_off = 0
    if bundle.manifest_json is not None:
        manifest_off = builder.CreateString(json.dumps(bundle.manifest_json, sort_keys=True, separators=(",", ":")))
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
    """Seal (record program, case and manifest sha256 in a bundlerun manifest), serialize
    and write atomically (temp file + rename). Sealing here means every bundle bundlerun
    writes, at build time or edited through this API, is checked by every later reader."""

    return atomic_write_bytes(path, serialize_bundle(seal(bundle)))
