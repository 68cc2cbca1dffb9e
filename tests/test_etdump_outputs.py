"""Outputs recovered from ETDump data written by ExecuTorch's own ETDump writer.

The ETDump + debug buffer come from the pybindings runtime
(`_load_for_executorch_from_bundled_program(..., enable_etdump=True,
debug_buffer_size=N)` then `write_etdump_result_to_file`). With a debug buffer
the pybindings log at the intermediate-outputs level: the dump holds every
delegate/kernel output *and* the program outputs flagged `output=true`, so the
decoder has to pick the right events. The printed (`Output[i][j]`) path is fed
with lines in the runner's own printf formats.
"""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import read_bundle
from bundlerun.targets.base import expected_layout
from bundlerun.targets.et_runner.outputs import (
    LOSSY_ROUNDING_ATOL,
    PRINTED_DECIMAL_ROUNDING,
    OutputDecodeError,
    lossy_rounding_atol,
    outputs_from_etdump,
    outputs_from_etdump_b64,
    outputs_from_printed,
    parse_etdump_block,
)
from doubles.board import etdump_block
from bundlerun.targets.et_runner.log import parse_runner_log


@pytest.fixture(scope="module")
def multi_bundle(tmp_path_factory) -> Path:
    """float, scaled float, int64 and bool outputs; XNNPACK-delegated linear."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
    from executorch.exir import to_edge_transform_and_lower

    class Multi(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 6)

        def forward(self, x):
            y = self.lin(x)
            return torch.relu(y), y * 1000.0, y.argmax(dim=-1), y > 0

    torch.manual_seed(7)
    model = Multi().eval()
    inputs = [(torch.randn(1, 8),) for _ in range(2)]
    program = to_edge_transform_and_lower(
        torch.export.export(model, inputs[0]), partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    cases = [MethodTestCase(inputs=i, expected_outputs=model(*i)) for i in inputs]
    bp = BundledProgram(program, [MethodTestSuite("forward", cases)])
    path = tmp_path_factory.mktemp("etdump") / "multi.bpte"
    path.write_bytes(serialize_from_bundled_program_to_flatbuffer(bp))
    return path


@pytest.fixture(scope="module")
def device_run(multi_bundle, tmp_path_factory):
    """Run case 0 with ETDump on; return (outputs as numpy, etdump bytes, debug buffer bytes)."""
    import torch
    from executorch.extension.pybindings.portable_lib import (
        _load_bundled_program_from_buffer,
        _load_for_executorch_from_bundled_program,
    )

    buf = multi_bundle.read_bytes()
    bundle = read_bundle(multi_bundle)
    bp = _load_bundled_program_from_buffer(buf)
    module = _load_for_executorch_from_bundled_program(bp, enable_etdump=True, debug_buffer_size=1 << 16)
    x = torch.from_numpy(bundle.suite("forward").test_cases[0].inputs[0].to_array().copy())
    outs = [o.numpy().copy() for o in module.run_method("forward", [x])]
    tmp = tmp_path_factory.mktemp("dump")
    module.write_etdump_result_to_file(str(tmp / "etdump.bin"), str(tmp / "debug.bin"))
    return outs, (tmp / "etdump.bin").read_bytes(), (tmp / "debug.bin").read_bytes()


def _layout(path: Path):
    return expected_layout(read_bundle(path), "forward", 0)


def test_etdump_outputs_are_bit_exact(multi_bundle, device_run):
    outs, etdump, debug = device_run
    layout = _layout(multi_bundle)
    assert [code for code, _ in layout] == [st.FLOAT, st.FLOAT, st.LONG, st.BOOL]
    decoded = outputs_from_etdump(etdump, debug, layout)
    assert len(decoded) == 4
    for raw, ref, (code, shape) in zip(decoded, outs, layout):
        assert raw.lossy is False
        assert raw.scalar_type == code and raw.shape == shape
        assert raw.data == np.ascontiguousarray(ref).astype(st.numpy_dtype(code)).tobytes()


def test_etdump_holds_intermediates_that_are_skipped(device_run):
    """The pybindings dump more tensors than the program outputs; only flagged ones count."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    _, etdump, _ = device_run
    obj = deserialize_from_etdump_flatcc(etdump)
    entries = [
        e.debug_event.debug_entry
        for run in obj.run_data
        for e in (run.events or [])
        if e.debug_event is not None
    ]
    flagged = [d for d in entries if d.output is not None and d.output.bool_val]
    assert len(flagged) == 4
    assert len(entries) > len(flagged)


def test_b64_forms_and_runner_block(multi_bundle, device_run):
    outs, etdump, debug = device_run
    layout = _layout(multi_bundle)
    e64, d64 = base64.b64encode(etdump).decode(), base64.b64encode(debug).decode()
    by_fields = outputs_from_etdump_b64(e64, layout, d64)
    # The block exactly as arm_executor_runner's write_etdump() prints it, cut into a UART log.
    block = "\n".join(
        etdump_block(e64, d64) + ["I [executorch:arm_executor_runner.cpp:1048 main()] Program complete, exiting."]
    )
    by_block = outputs_from_etdump_b64(block, layout)
    log = parse_runner_log(block.replace("\n", "\r\n").encode())
    assert log.etdump_complete
    by_parser = outputs_from_etdump_b64(log.etdump_b64, layout, log.debug_buffer_b64)
    for a, b, c, ref in zip(by_fields, by_block, by_parser, outs):
        assert a.data == b.data == c.data == np.ascontiguousarray(ref).tobytes()
    parsed = parse_etdump_block(block)
    assert parsed.etdump == etdump and parsed.debug_buffer == debug


def test_decode_failures_are_one_line_errors(multi_bundle, device_run):
    _, etdump, debug = device_run
    layout = _layout(multi_bundle)
    cases = {
        "no debug buffer": lambda: outputs_from_etdump(etdump, None, layout),
        "truncated debug buffer": lambda: outputs_from_etdump(etdump, debug[:40], layout),
        "corrupt etdump": lambda: outputs_from_etdump(etdump[:8] + bytes(64), debug, layout),
        "shape mismatch": lambda: outputs_from_etdump(etdump, debug, [(st.FLOAT, [2, 6])] + layout[1:]),
        "dtype mismatch": lambda: outputs_from_etdump(etdump, debug, [(st.INT, [1, 6])] + layout[1:]),
        "too many outputs": lambda: outputs_from_etdump(etdump, debug, layout * 2),
        "bad base64": lambda: outputs_from_etdump_b64("@@not base64@@", layout, "AAAA"),
        "block without etdump": lambda: parse_etdump_block("#[RUN THIS]\n#[END]\n"),
    }
    for label, call in cases.items():
        with pytest.raises(OutputDecodeError) as info:
            call()
        msg = str(info.value)
        assert msg and "\n" not in msg, label


def _printed_log(arrays, codes) -> bytes:
    lines = ["I [executorch:arm_executor_runner.cpp:640 print_outputs()] %d outputs: " % len(arrays)]
    for i, (arr, code) in enumerate(zip(arrays, codes)):
        for j, v in enumerate(np.asarray(arr).reshape(-1)):
            if code == st.FLOAT:
                lines.append("Output[%d][%d]: (float) %f" % (i, j, float(v)))
            elif code == st.BOOL:
                lines.append("Output[%d][%d]: (bool) %s (0x%x)" % (i, j, "true " if v else "false", int(v)))
            elif code in (st.INT, st.CHAR):
                lines.append("Output[%d][%d]: (%s) %d" % (i, j, "int" if code == st.INT else "char", int(v)))
    return ("\r\n".join(lines) + "\r\n").encode()


def test_printed_outputs_are_lossy_within_documented_bound(multi_bundle, device_run):
    outs, _, _ = device_run
    layout = _layout(multi_bundle)
    printable = [0, 1, 3]  # int64 is not printed by the runner
    log = parse_runner_log(_printed_log([outs[i] for i in printable], [layout[i][0] for i in printable]))
    decoded = outputs_from_printed(log.printed_outputs, [layout[i] for i in printable])
    for raw, i in zip(decoded, printable):
        ref = outs[i]
        got = raw.to_array()
        if layout[i][0] == st.FLOAT:
            assert raw.lossy is True
            err = np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()
            assert err <= lossy_rounding_atol(st.FLOAT)
        else:
            assert raw.lossy is False and np.array_equal(got, ref)
    # The runner prints nothing for int64: asking for it is an error, not a guess.
    with pytest.raises(OutputDecodeError, match="does not print"):
        outputs_from_printed(log.printed_outputs, layout)


def test_printed_count_and_kind_mismatches(multi_bundle, device_run):
    outs, _, _ = device_run
    log = parse_runner_log(_printed_log([outs[0]], [st.FLOAT]))
    with pytest.raises(OutputDecodeError, match="printed values"):
        outputs_from_printed(log.printed_outputs, [(st.FLOAT, [1, 7])])
    with pytest.raises(OutputDecodeError, match="expects int8"):
        outputs_from_printed(log.printed_outputs, [(st.CHAR, [1, 6])])
    with pytest.raises(OutputDecodeError, match="no Output"):
        outputs_from_printed({}, [(st.FLOAT, [1, 6])])


def test_lossy_rounding_bound_is_tight_and_sufficient():
    """%f then float32: |stored - x| <= 2 * 5e-7, and 5e-7 alone would not suffice."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for lo, hi in [(0, 1), (1, 8), (8, 16), (16, 4096)]:
        x = rng.uniform(lo, hi, 20000).astype(np.float32)
        x = np.concatenate([x, -x])
        stored = np.array(["%f" % v for v in x.astype(np.float64)], dtype=np.float64).astype(np.float32)
        worst = max(worst, float(np.abs(stored.astype(np.float64) - x.astype(np.float64)).max()))
    assert worst <= LOSSY_ROUNDING_ATOL
    assert worst > PRINTED_DECIMAL_ROUNDING  # why the bound is doubled
    assert lossy_rounding_atol(st.INT) == 0.0 and lossy_rounding_atol(st.BOOL) == 0.0


def test_non_contiguous_output_is_reordered():
    """A strided (dim-order) tensor in the debug buffer comes back in logical order."""
    from types import SimpleNamespace

    from bundlerun.targets.et_runner.outputs import _tensor_bytes

    logical = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    nhwc = np.ascontiguousarray(logical.transpose(0, 2, 3, 1))  # bytes as a channels-last sink stores them
    buf = bytes(16) + nhwc.tobytes()
    tensor = SimpleNamespace(
        sizes=[1, 2, 3, 4], strides=[24, 1, 8, 2], offset=16, scalar_type=SimpleNamespace(value=st.FLOAT)
    )
    data = _tensor_bytes(tensor, buf, st.FLOAT, [1, 2, 3, 4], 0)
    assert data == logical.tobytes()
    assert struct.unpack("<f", data[4:8])[0] == 1.0


def test_compare_never_fails_a_case_on_printed_rounding():
    """A device output equal to the reference, read back from `%f` text, must PASS."""
    from bundlerun.bundles.manifest import Criteria
    from bundlerun.runner.judging.numerics import judge_output

    rng = np.random.default_rng(1)
    ref = rng.uniform(8, 16, 4096).astype(np.float32)  # where float32 re-rounding is largest
    printed = np.array(["%f" % v for v in ref.astype(np.float64)], dtype=np.float64).astype(np.float32)
    criteria = Criteria(atol=1e-9, rtol=0.0)
    verdict = judge_output(printed, ref, criteria, "float32", "float32", lossy=True)
    assert verdict.verdict == "PASS", [f.detail for f in verdict.failed][:2]
