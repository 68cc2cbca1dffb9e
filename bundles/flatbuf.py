"""A bounds-checked FlatBuffers table reader for untrusted files.

The `flatbuffers` runtime trusts its input: a bad vtable or offset raises
TypeError/IndexError/struct.error, and a negative position silently reads from
the end of the buffer. Every read here goes through `_need`, which rejects any
range outside the file with a BundleError naming what was being read, so a
malformed bundle can only ever produce a one-line error.

Two budgets stop blow-ups from shared or looping offsets: a file cannot yield
more tables than it has 4-byte words, nor more copied bytes than its own size
times the number of references a writer could legitimately make.
`high` is the highest byte any read touched: the end of the data, for the
trailing-bytes rule (docs/security.md).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bundlerun.bundles.errors import BundleError

_FORMATS = {"u8": "<B", "i8": "<b", "u16": "<H", "u32": "<I", "i32": "<i", "i64": "<q", "f64": "<d", "bool": "<?"}
_SIZES = {k: struct.calcsize(v) for k, v in _FORMATS.items()}
_UNPACK = {k: struct.Struct(v).unpack_from for k, v in _FORMATS.items()}


class FlatReader:
    """Bounds-checked access to one FlatBuffers buffer."""

    def __init__(self, buf: bytes | memoryview, source: str, what: str = "bundle") -> None:
        # a memoryview is read in place: the byte vectors `copy` returns are then views of it, not copies
        # (the host worker's read of a bundle the runtime also holds, targets/workers/host.py)
        self.buf: bytes | memoryview = buf.cast("B") if isinstance(buf, memoryview) else bytes(buf)
        self.source = source
        self.what = what
        self.high = 0
        self.tables = 0
        self.copied = 0

    def fail(self, problem: str) -> BundleError:
        return BundleError(f"{self.source}: {self.what} is corrupted or truncated ({problem})")

    def _need(self, pos: int, size: int, what: str) -> None:
        end = pos + size
        if pos < 0 or size < 0 or end > len(self.buf):
            raise self.fail(f"{what} at byte {pos} (+{size}) lies outside the {len(self.buf)}-byte file")
        if end > self.high:
            self.high = end

    def get(self, kind: str, pos: int, what: str) -> int | float | bool:
        # _need inlined: the reader's most frequent call (15,000 for a 192-case LLM bundle)
        end = pos + _SIZES[kind]
        if pos < 0 or end > len(self.buf):
            raise self.fail(f"{what} at byte {pos} (+{_SIZES[kind]}) lies outside the {len(self.buf)}-byte file")
        if end > self.high:
            self.high = end
        return _UNPACK[kind](self.buf, pos)[0]

    def indirect(self, pos: int, what: str) -> int:
        target = pos + int(self.get("u32", pos, what))
        self._need(target, 1, what)
        return target

    def root(self, what: str) -> "FlatTable":
        return FlatTable.at(self, self.indirect(0, f"{what} root offset"), what)

    def copy(self, start: int, length: int, what: str) -> bytes | memoryview:
        """The bytes at [start, start + length): a view when the reader reads a memoryview."""
        self._need(start, length, what)
        self.copied += length
        if self.copied > 64 * len(self.buf) + (1 << 20):
            raise self.fail(f"{what}: offsets reuse the same data far more than any writer does")
        return self.buf[start : start + length]


@dataclass
class FlatTable:
    """One table: its position, its vtable and the inline size the vtable declares."""

    reader: FlatReader
    pos: int
    vtable: int
    vtable_size: int
    object_size: int
    what: str

    @classmethod
    def at(cls, reader: FlatReader, pos: int, what: str) -> "FlatTable":
        reader.tables += 1
        if reader.tables > len(reader.buf) // 4 + 16:
            raise reader.fail(f"{what}: more tables than the file can hold (looping offsets)")
        vtable = pos - int(reader.get("i32", pos, f"{what} table"))
        vtable_size = int(reader.get("u16", vtable, f"{what} vtable"))
        object_size = int(reader.get("u16", vtable + 2, f"{what} vtable"))
        if vtable_size < 4 or vtable_size % 2:
            raise reader.fail(f"{what} has a vtable of impossible size {vtable_size}")
        if object_size < 4:
            raise reader.fail(f"{what} has an impossible inline size {object_size}")
        reader._need(vtable, vtable_size, f"{what} vtable")
        reader._need(pos, object_size, f"{what} table")
        return cls(reader, pos, vtable, vtable_size, object_size, what)

    def field(self, slot: int, size: int) -> int:
        """Absolute position of field `slot` (0 when absent); it must lie inside the table."""
        voff = 4 + 2 * slot
        if voff + 2 > self.vtable_size:
            return 0
        off = int(self.reader.get("u16", self.vtable + voff, f"{self.what} vtable"))
        if not off:
            return 0
        if off < 4 or off + size > self.object_size:
            raise self.reader.fail(f"{self.what} field {slot} at offset {off} lies outside its table")
        return self.pos + off

    def scalar(self, slot: int, kind: str, default: int | float | bool) -> int | float | bool:
        pos = self.field(slot, _SIZES[kind])
        return self.reader.get(kind, pos, f"{self.what} field {slot}") if pos else default

    def _target(self, slot: int, what: str) -> int:
        pos = self.field(slot, 4)
        return self.reader.indirect(pos, what) if pos else 0

    def table(self, slot: int, what: str) -> "FlatTable | None":
        target = self._target(slot, what)
        return FlatTable.at(self.reader, target, what) if target else None

    def vector(self, slot: int, elem_size: int, what: str) -> tuple[int, int]:
        """(start, length) of a vector field, its whole extent checked; (0, 0) when absent."""
        target = self._target(slot, what)
        if not target:
            return 0, 0
        length = int(self.reader.get("u32", target, f"{what} length"))
        if length * elem_size > len(self.reader.buf):
            raise self.reader.fail(f"{what} claims {length} elements, more than the file holds")
        self.reader._need(target + 4, length * elem_size, what)
        return target + 4, length

    def tables(self, slot: int, what: str) -> list["FlatTable"]:
        start, length = self.vector(slot, 4, what)
        return [FlatTable.at(self.reader, self.reader.indirect(start + 4 * i, what), f"{what}[{i}]")
                for i in range(length)]

    def scalars(self, slot: int, kind: str, what: str) -> list:
        start, length = self.vector(slot, _SIZES[kind], what)
        if not length:
            return []
        return list(struct.unpack_from(f"<{length}{_FORMATS[kind][1]}", self.reader.buf, start))

    def bytes(self, slot: int, what: str) -> bytes | memoryview:
        start, length = self.vector(slot, 1, what)
        return self.reader.copy(start, length, what) if length else b""

    def string(self, slot: int, what: str, max_len: int) -> str | None:
        start, length = self.vector(slot, 1, what)
        if not start:
            return None
        if length > max_len:
            raise BundleError(f"{self.reader.source}: {what} is {length} bytes long (at most {max_len})")
        self.reader._need(start, length + 1, f"{what} terminator")
        raw = bytes(self.reader.copy(start, length, what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.reader.fail(f"{what} is not valid UTF-8 at byte {exc.start}") from None
