"""Output tensors from what an Arm runner prints on its UART.

Two channels exist (see `arm_executor_runner.cpp`):

* **ETDump** (`-DEXECUTORCH_ENABLE_EVENT_TRACER=ON` + `-DET_DUMP_OUTPUTS=ON`, or
  `--etdump` of `build_executor_runner.sh`, which turns on
  `ET_DUMP_INTERMEDIATE_OUTPUTS`): between `#[RUN THIS]` and `#[END]` the runner
  prints `echo "<b64>" | base64 -d >debug_buffer.bin` (the raw tensor bytes) and
  `echo "<b64>" | base64 -d >etdump.bin` (the size-prefixed ETDump flatbuffer).
  The program outputs are the ETDump debug events flagged `output=true`; each
  holds dtype, sizes, strides and an offset into the debug buffer. Bit exact.
* **Printed** (`ET_LOG_DUMP_OUTPUT`, on by default): `Output[i][j]: (float) %f`
  lines. Floats carry 6 decimals only, so tensors decoded from them are marked
  `lossy` and the comparison must widen atol by `LOSSY_ROUNDING_ATOL`.

Nothing here judges numerics; a decode that cannot be trusted raises
`OutputDecodeError` with a one-line reason.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from bundlerun.bundles import scalar_types as st
from bundlerun.targets.et_runner.log import ECHO_RE
from bundlerun.targets.base import RawTensor

# `%f` rounds to 6 decimals: |printed - x| <= 5e-7. Storing the printed decimal
# back into float32 (the output's own dtype) rounds once more, by at most the
# same distance (the nearest float32 to the decimal is no farther from it than
# x is), so |stored - x| <= 2 * 5e-7. Measured worst case: 9.54e-7 for values
# in [8, 16). The comparison adds this to atol_eff for lossy float outputs so a
# rounding error can never fail a case. Integer and bool lines are exact.
PRINTED_DECIMAL_ROUNDING = 5e-7
LOSSY_ROUNDING_ATOL = 2 * PRINTED_DECIMAL_ROUNDING

_UINT64_MAX = (1 << 64) - 1


class OutputDecodeError(ValueError):
    """The device's outputs could not be recovered exactly; message is one line."""


@dataclass
class EtdumpBlock:
    """The two files of one `#[RUN THIS]` block."""

    etdump: bytes
    debug_buffer: bytes | None


def lossy_rounding_atol(scalar_type: int) -> float:
    """Extra absolute tolerance for a lossy (printed) output of this dtype."""
    return LOSSY_ROUNDING_ATOL if st.is_floating(scalar_type) else 0.0


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise OutputDecodeError(f"{what} base64 is corrupt ({exc})") from None


def parse_etdump_block(text: str) -> EtdumpBlock:
    """Decode a whole `#[RUN THIS]` ... `#[END]` block (or just its echo lines)."""
    etdump = debug = None
    for m in ECHO_RE.finditer(text):
        if m.group("name").startswith("debug_buffer"):
            debug = _b64(m.group("b64"), "debug_buffer.bin")
        else:
            etdump = _b64(m.group("b64"), "etdump.bin")
    if etdump is None:
        raise OutputDecodeError("ETDump block holds no 'base64 -d >etdump.bin' line")
    return EtdumpBlock(etdump=etdump, debug_buffer=debug)


def _deserialize(etdump: bytes):
    try:
        from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc
    except ImportError as exc:  # pragma: no cover - executorch is a dependency
        raise OutputDecodeError(f"executorch devtools are not installed ({exc})") from None
    try:
        return deserialize_from_etdump_flatcc(etdump)
    except Exception as exc:  # flatc reports a bad buffer as a subprocess/JSON error
        raise OutputDecodeError(
            f"etdump.bin ({len(etdump)} bytes) is not a readable ETDump: {type(exc).__name__}"
        ) from None


def _output_events(etdump_obj) -> list:
    """The debug events holding program outputs, in the order they were logged.

    ETDumpGen logs program outputs after `Method::execute` with `output=true`
    (chain index -1); intermediates (ET_DUMP_INTERMEDIATE_OUTPUTS) come without
    the flag and are skipped.
    """
    flagged, chainless = [], []
    for run in etdump_obj.run_data or []:
        for event in run.events or []:
            dbg = event.debug_event
            if dbg is None or dbg.debug_entry is None:
                continue
            entry = dbg.debug_entry
            if entry.output is not None and entry.output.bool_val:
                flagged.append(entry)
            elif dbg.chain_index in (_UINT64_MAX, -1):
                chainless.append(entry)
    return flagged or chainless


def _tensor_bytes(tensor, debug_buffer: bytes, code: int, shape: list[int], index: int) -> bytes:
    import numpy as np

    sizes = [int(s) for s in tensor.sizes]
    if sizes != list(shape):
        raise OutputDecodeError(f"ETDump output {index} has shape {sizes}, the bundle expects {list(shape)}")
    got_code = int(getattr(tensor.scalar_type, "value", tensor.scalar_type))
    if got_code != code:
        raise OutputDecodeError(
            f"ETDump output {index} is {_dtype_name(got_code)}, the bundle expects {_dtype_name(code)}"
        )
    item = st.itemsize(code)
    numel = 1
    for s in sizes:
        numel *= s
    if tensor.offset is None:
        raise OutputDecodeError(f"ETDump output {index} has no data offset (runner built without a debug buffer?)")
    start = int(tensor.offset)
    strides = [int(s) for s in (tensor.strides or [])]
    contiguous = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        contiguous[d] = contiguous[d + 1] * sizes[d + 1]
    if not strides or strides == contiguous or numel <= 1:
        end = start + numel * item
        if end > len(debug_buffer):
            raise OutputDecodeError(
                f"ETDump output {index} needs debug buffer bytes {start}..{end}, the buffer has {len(debug_buffer)}"
            )
        return bytes(debug_buffer[start:end])
    # Non-contiguous dim order (e.g. channels-last): the sink copied nbytes as laid out.
    span = 1 + sum((s - 1) * abs(t) for s, t in zip(sizes, strides))
    end = start + span * item
    if end > len(debug_buffer) or any(t < 0 for t in strides):
        raise OutputDecodeError(f"ETDump output {index} strides {strides} run outside the debug buffer")
    flat = np.frombuffer(debug_buffer, dtype=np.uint8, count=span * item, offset=start).view(st.numpy_dtype(code))
    arr = np.lib.stride_tricks.as_strided(flat, shape=sizes, strides=[t * item for t in strides])
    return np.ascontiguousarray(arr).tobytes()


def _dtype_name(code: int) -> str:
    try:
        return st.name(code)
    except Exception:
        return f"ScalarType({code})"


def outputs_from_etdump(
    etdump: bytes, debug_buffer: bytes | None, layout: list[tuple[int, list[int]]]
) -> list[RawTensor]:
    """Full-precision outputs from ETDump bytes + the debug buffer they point into.

    `layout` is the bundle's expected (scalar_type, shape) per output. With
    several inferences (ET_NUM_INFERENCES > 1) the last set is returned.
    """
    obj = _deserialize(etdump)
    entries = _output_events(obj)
    if not entries:
        raise OutputDecodeError(
            "ETDump holds no output tensors; build the runner with -DET_DUMP_OUTPUTS=ON "
            "(and -DEXECUTORCH_ENABLE_EVENT_TRACER=ON)"
        )
    if len(entries) < len(layout):
        raise OutputDecodeError(f"ETDump holds {len(entries)} output tensors, the bundle expects {len(layout)}")
    entries = entries[len(entries) - len(layout) :]  # the last inference's outputs
    if debug_buffer is None:
        raise OutputDecodeError("ETDump block has no debug_buffer.bin; the output bytes live there (ET_DUMP_OUTPUTS)")
    outputs = []
    for index, (entry, (code, shape)) in enumerate(zip(entries, layout)):
        if entry.tensor is None:
            raise OutputDecodeError(f"ETDump output {index} is a {entry.val}, not a tensor")
        data = _tensor_bytes(entry.tensor, debug_buffer, code, shape, index)
        outputs.append(RawTensor(code, list(shape), data, lossy=False))
    return outputs


def outputs_from_etdump_b64(
    b64: str, layout: list[tuple[int, list[int]]], debug_buffer_b64: str | None = None
) -> list[RawTensor]:
    """Outputs from the runner's base64 ETDump.

    `b64` is either the etdump.bin base64 (RunnerLog.etdump_b64, with
    RunnerLog.debug_buffer_b64 passed as `debug_buffer_b64`) or the whole
    `#[RUN THIS]` block text, whose echo lines hold both files.
    """
    if "base64 -d" in b64:
        block = parse_etdump_block(b64)
        etdump, debug = block.etdump, block.debug_buffer
        if debug_buffer_b64 is not None:
            debug = _b64(debug_buffer_b64, "debug_buffer.bin")
    else:
        etdump = _b64(b64, "etdump.bin")
        debug = _b64(debug_buffer_b64, "debug_buffer.bin") if debug_buffer_b64 is not None else None
    return outputs_from_etdump(etdump, debug, layout)


_PRINTED_KINDS = {
    st.FLOAT: ("float",),
    st.DOUBLE: ("float", "double"),
    st.INT: ("int",),
    st.CHAR: ("char", "int"),
    st.BOOL: ("bool",),
}


def outputs_from_printed(
    printed: dict[int, list[tuple[str, float | int | bool]]],
    layout: list[tuple[int, list[int]]],
    elided: set[int] | frozenset[int] = frozenset(),
) -> list[RawTensor]:
    """Outputs from `Output[i][j]: (kind) value` lines, marked lossy.

    The runner prints float, int, int8 (char) and bool tensors only; any other
    dtype, a missing or extra element, or a kind that contradicts the bundle's
    dtype is an error, never a guess.
    """
    import numpy as np

    outputs = []
    for i, (code, shape) in enumerate(layout):
        numel = 1
        for s in shape:
            numel *= s
        values = printed.get(i)
        if values is None:
            raise OutputDecodeError(f"no Output[{i}][*] lines in the log (ET_LOG_DUMP_OUTPUT off, or log cut short)")
        if i in elided:
            raise OutputDecodeError(f"output {i} was printed in summary form (elided with '...'); print all values "
                                    "(--print_output all) or write output files")
        kinds = {k for k, _ in values} - {"untagged", "missing"}  # untagged values take the bundle's dtype
        if "summary" in kinds:
            if st.is_floating(code):
                raise OutputDecodeError(f"output {i} was printed as a tensor summary (6 significant digits); "
                                        "use output files (--output_file) or ETDump for floating outputs")
            kinds.discard("summary")
        if kinds and code not in _PRINTED_KINDS:
            raise OutputDecodeError(
                f"output {i} is {_dtype_name(code)}, which the runner does not print; enable ETDump output dumping"
            )
        real = [v for v in values if v[0] != "missing"]
        if len(real) != numel or len(values) != numel:
            raise OutputDecodeError(f"Output[{i}] has {len(real)} printed values, the bundle expects {numel}")
        bad = kinds - set(_PRINTED_KINDS.get(code, ()))
        if bad:
            raise OutputDecodeError(
                f"Output[{i}] printed as ({', '.join(sorted(bad))}), the bundle expects {_dtype_name(code)}"
            )
        arr = np.asarray([v for _, v in values], dtype=np.float64)
        if not st.is_floating(code) and np.isnan(arr).any():
            raise OutputDecodeError(f"Output[{i}] has an unreadable value")
        data = arr.astype(st.numpy_dtype(code)).reshape(shape).tobytes()
        outputs.append(RawTensor(code, list(shape), data, lossy=st.is_floating(code)))
    return outputs
