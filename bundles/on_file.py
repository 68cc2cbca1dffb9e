"""A read and verified bundle whose bytes stay in its file (issue 36 item 6, "cost that stays bounded").

`bundlerun run` reads a bundle to plan and judge the run; on host:// (and every lane driven through
targets/workers/supervisor.py) the runtime's own process reads the file again and holds it, so a
CLI that also held its parsed copy held the bundle twice (dl3: 312 MB, 386 MiB of the CLI's RSS
while the worker ran, bench/README.md). Here the bundle is read once, parsed as views of that
buffer, validated as `read_bundle` validates it (manifest, consistency, seal), and then only the
structure is kept: every tensor's data and the program become spans of the file with the sha256 of
the bytes that were verified. Each read of a span reads it again and compares: bytes changed on
disk after the check (an edited expected output, a swapped program) are an IntegrityError, never a
verdict. The judge reads one case's expected outputs at a time, when it judges that case.

The program is read back (and kept) the first time something asks for it: a lane that sends the
program itself (serial, qemu, android: `Bundle.single_case`) reads it once, as before; host:// never
asks.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundlerun.bundles.bpte import (Bundle, BundledTestCase, BundledValue, MethodTestSuite, load_bundle, read_bundle_bytes,
                                    serialize_bundle)
from bundlerun.bundles.errors import BundleFormatError, IntegrityError
from bundlerun.bundles.integrity import inputs_digest


@dataclass(frozen=True)
class FileSpan:
    """`length` bytes at `offset` of `path`, whose sha256 was `digest` when the bundle was verified."""

    path: Path
    offset: int
    length: int
    digest: bytes
    what: str

    def read(self) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(self.length)
        except OSError as exc:
            raise BundleFormatError(f"{self.path}: cannot read {self.what} again ({exc.strerror or exc}): "
                                    "the bundle was moved or removed during the run") from None
        if len(data) != self.length or hashlib.sha256(data).digest() != self.digest:
            raise IntegrityError(f"{self.path}: {self.what} changed on disk after the bundle was read and verified "
                                 "(the file was edited or replaced during the run): not judged")
        return data


class FileValue(BundledValue):
    """A tensor whose data is read from the file at each use (FileSpan: checked against the bytes
    that were verified). Everything else (kind, dtype, sizes, dim order) is held."""

    def __init__(self, value: BundledValue, span: FileSpan) -> None:  # noqa: D107 - no dataclass __init__: data is a span
        self.kind, self.scalar_type, self.sizes = value.kind, value.scalar_type, list(value.sizes)
        self.dim_order, self.scalar = list(value.dim_order), value.scalar
        self._span: FileSpan | None = span
        self._data = b""

    @property  # type: ignore[override]
    def data(self) -> bytes:
        return self._span.read() if self._span is not None else self._data

    @data.setter
    def data(self, value: bytes) -> None:  # assigned bytes are held, as a plain value's
        self._span, self._data = None, value

    @property
    def nbytes(self) -> int:
        return self._span.length if self._span is not None else len(self._data)


@dataclass(frozen=True)
class FileLayout:
    """The whole file as it was verified: its size, the spans (their own digests) and the digest of
    every byte no span covers (the FlatBuffers structure, the manifest), so the file can be checked
    again in one pass without a second digest of the whole file at every read."""

    size: int
    spans: tuple[FileSpan, ...]
    gaps_digest: bytes


def _gaps_digest(buf: Any, spans: tuple[FileSpan, ...]) -> bytes:
    """sha256 of the bytes outside the union of `spans`, each gap prefixed by its offset and length."""
    digest, at = hashlib.sha256(), 0
    for start, end in sorted((s.offset, s.offset + s.length) for s in spans) + [(len(buf), len(buf))]:
        if start > at:
            digest.update(b"%d:%d:" % (at, start - at))
            digest.update(buf[at:start])
        at = max(at, end)
    return digest.digest()


class FileBundle(Bundle):
    """A Bundle whose program and tensor data stay in its file (see the module docstring); the
    digests a report names the bundle by (program, inputs) are taken at the read."""

    program_sha256_hex: str | None = None
    inputs_sha256_hex: str | None = None
    layout: FileLayout | None = None
    as_read: tuple[Any, ...] | None = None  # _structure() at the read: the bundle is still the file's

    @property  # type: ignore[override]
    def program(self) -> bytes:
        if self.__dict__.get("_program") is None:
            self.__dict__["_program"] = self.__dict__["_program_span"].read()  # a lane that sends it: read once, kept
        return self.__dict__["_program"]

    @program.setter
    def program(self, value: Any) -> None:
        if isinstance(value, FileSpan):
            self.__dict__.update(_program_span=value, _program=None)
        else:
            self.__dict__.update(_program_span=None, _program=value)

    def unchanged(self) -> bool:
        """Whether the bundle is still what was read and verified (nothing changed in memory since)."""
        return self.as_read is not None and _structure(self) == self.as_read

    def file_bytes(self) -> bytes | None:
        """The file's bytes, read again and checked against what was verified (every span's digest and
        the gaps' digest: one pass), for a runtime that loads the whole bundle: no FlatBuffers rebuild
        (serialize_bundle: 0.6 s for a 120 MB LLM bundle, bundlerun's own measurement at load 5). None
        when the bundle was changed in memory since the read (then it must be serialized). Bytes
        changed on disk are an IntegrityError, as any span's read."""
        layout = self.layout
        if layout is None or not self.unchanged():
            return None
        path = layout.spans[0].path
        try:
            with open(path, "rb") as fh:
                data = fh.read(layout.size + 1)
        except OSError as exc:
            raise BundleFormatError(f"{path}: cannot read the bundle again ({exc.strerror or exc}): "
                                    "the bundle was moved or removed during the run") from None
        view = memoryview(data)
        changed = len(data) != layout.size or _gaps_digest(view, layout.spans) != layout.gaps_digest or any(
            hashlib.sha256(view[s.offset:s.offset + s.length]).digest() != s.digest for s in layout.spans)
        if changed:
            raise IntegrityError(f"{path}: the bundle changed on disk after it was read and verified "
                                 "(the file was edited or replaced during the run): not judged")
        return data


def whole_bundle_bytes(bundle: Bundle) -> bytes:
    """The whole bundle for a runtime that loads it (a served runner): the file as verified
    (FileBundle.file_bytes) or, for a bundle made or changed in memory, serialize_bundle's."""
    as_read = bundle.file_bytes() if isinstance(bundle, FileBundle) else None
    return as_read if as_read is not None else serialize_bundle(bundle)


def _structure(bundle: Bundle) -> tuple[Any, ...]:
    """What a change in memory to a FileBundle alters: the manifest (its text: an edit in place too;
    0.4 ms for an LLM bundle's 38 KB), the program's span, and each value's description and span (or
    held bytes). Cheap: no tensor data is read."""
    def value(v: BundledValue) -> tuple[Any, ...]:
        held = v._span if isinstance(v, FileValue) and v._span is not None else bytes(v.data)
        return (v.kind, v.scalar_type, tuple(v.sizes), tuple(v.dim_order), v.scalar, held)

    return (json.dumps(bundle.manifest_json, sort_keys=True), bundle.version, bundle.__dict__.get("_program_span"),
            tuple((s.method_name, tuple((tuple(map(value, c.inputs)), tuple(map(value, c.expected_outputs)))
                                        for c in s.test_cases)) for s in bundle.method_test_suites))


def _address(view: memoryview) -> int:
    """Where a view of the bundle's (writable) buffer starts in memory: ctypes, not numpy, so that reading
    a bundle does not import numpy (`bundlerun run` spawns its target first: runner/session.py)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) if len(view) else 0


def read_bundle_on_file(path: str | Path, require_seal: bool = False, data: bytes | None = None) -> Bundle:
    """`read_bundle`'s reading and checks, keeping the bundle's bytes in its file (FileBundle). `data`: the
    file's bytes as read_bundle_bytes(path, writable=True) read them (`bundlerun run`'s early start wrote
    these very bytes for its runner before they were verified here: runner/session.py)."""
    path = Path(path)
    buf = read_bundle_bytes(path, writable=True) if data is None else data
    view = memoryview(buf)
    parsed = load_bundle(view, str(path), require_seal)  # type: ignore[arg-type]  # views of `buf`: no second copy
    base = _address(view)

    def span(data: Any, what: str) -> FileSpan:
        return FileSpan(path, _address(data) - base, len(data), hashlib.sha256(data).digest(), what)

    def lean(value: BundledValue, what: str) -> BundledValue:
        if value.kind != "tensor" or not len(value.data):
            return BundledValue(value.kind, value.scalar_type, list(value.sizes), bytes(value.data),
                                list(value.dim_order), value.scalar)
        return FileValue(value, span(value.data, what))

    suites = [MethodTestSuite(s.method_name, [
        BundledTestCase(inputs=[lean(v, f"method {s.method_name!r} case {i} input {j}") for j, v in enumerate(c.inputs)],
                        expected_outputs=[lean(v, f"method {s.method_name!r} case {i} expected output {j}")
                                          for j, v in enumerate(c.expected_outputs)])
        for i, c in enumerate(s.test_cases)]) for s in parsed.method_test_suites]
    program = span(parsed.program, "the program")
    out = FileBundle(program=program, method_test_suites=suites, manifest_json=parsed.manifest_json,  # type: ignore[arg-type]
                     version=parsed.version, warnings=list(parsed.warnings))
    out.program_sha256_hex = program.digest.hex()
    out.inputs_sha256_hex = inputs_digest(parsed)
    spans = (program, *(v._span for s in suites for c in s.test_cases for v in (*c.inputs, *c.expected_outputs)
                        if isinstance(v, FileValue) and v._span is not None))
    out.layout = FileLayout(len(buf), spans, _gaps_digest(view, spans))
    out.as_read = _structure(out)
    return out  # `buf` goes with `parsed` and its views
