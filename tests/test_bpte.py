"""The .bpte reader/writer against the real ExecuTorch serializer and runtime."""

from __future__ import annotations

import numpy as np
import pytest

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import Bundle, BundledValue, parse_bundle, read_bundle, serialize_bundle
from bundlerun.bundles.errors import BundleFormatError


@pytest.fixture(scope="module")
def stock_bundle_bytes():
    """A bundle made by ExecuTorch's own BundledProgram API (no manifest)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)).eval()
    example = (torch.randn(2, 6),)
    program = to_edge_transform_and_lower(torch.export.export(model, example), partitioner=[XnnpackPartitioner()]).to_executorch()
    cases = []
    for _ in range(3):
        x = torch.randn(2, 6)
        cases.append(MethodTestCase(inputs=(x,), expected_outputs=(model(x),)))
    return serialize_from_bundled_program_to_flatbuffer(BundledProgram(program, [MethodTestSuite("forward", cases)]))


def test_reads_executorch_bundle_without_manifest(stock_bundle_bytes):
    bundle = parse_bundle(stock_bundle_bytes)
    assert bundle.manifest is None
    assert bundle.version == 2
    suite = bundle.suite("forward")
    assert len(suite.test_cases) == 3
    out = suite.test_cases[1].expected_outputs[0]
    assert out.kind == "tensor" and out.scalar_type == st.FLOAT and out.sizes == [2, 3]
    assert bundle.program[4:6] == b"ET"


def test_roundtrip_adds_manifest_and_stock_runtime_still_verifies(stock_bundle_bytes):
    from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program
    from executorch.extension.pybindings.portable_lib import _load_bundled_program_from_buffer

    bundle = parse_bundle(stock_bundle_bytes)
    bundle.manifest_json = {"schema": "bundlerun.manifest/1", "probe": [1, 2, 3]}
    data = serialize_bundle(bundle)
    again = parse_bundle(data)
    assert again.manifest_json == bundle.manifest_json
    assert again.program == bundle.program
    for a, b in zip(again.suite("forward").test_cases, bundle.suite("forward").test_cases):
        assert a.inputs[0].data == b.inputs[0].data
        assert a.expected_outputs[0].data == b.expected_outputs[0].data
    # program stays 32-byte aligned in the file, as the schema's force_align requires
    assert data.find(bundle.program) % 32 == 0
    # ExecuTorch's Python deserializer and C++ runtime ignore the extra root field
    assert len(deserialize_from_flatbuffer_to_bundled_program(data).method_test_suites) == 1
    loaded = _load_bundled_program_from_buffer(data)
    for i in range(3):
        outs = loaded.verify_result_with_bundled_expected_output("forward", i, 1e-5, 1e-6)
        assert np.allclose(outs[0].numpy(), again.suite("forward").test_cases[i].expected_outputs[0].to_array(), atol=1e-6)


def test_single_case_moves_case_to_index_zero(stock_bundle_bytes):
    bundle = parse_bundle(stock_bundle_bytes)
    single = parse_bundle(serialize_bundle(bundle.single_case("forward", 2)))
    assert len(single.suite("forward").test_cases) == 1
    assert single.suite("forward").test_cases[0].inputs[0].data == bundle.suite("forward").test_cases[2].inputs[0].data


def test_scalar_values_roundtrip():
    prog = b"\x00" * 4 + b"ET12" + b"\x00" * 24
    from bundlerun.bundles.bpte import BundledTestCase, MethodTestSuite

    values = [BundledValue(kind="int", scalar=-7), BundledValue(kind="bool", scalar=True),
              BundledValue(kind="double", scalar=2.5), BundledValue.from_array(np.arange(6, dtype=np.int8).reshape(2, 3))]
    bundle = Bundle(prog, [MethodTestSuite("m", [BundledTestCase(values, values[:1])])])
    back = parse_bundle(serialize_bundle(bundle)).suite("m").test_cases[0]
    assert [v.scalar for v in back.inputs[:3]] == [-7, True, 2.5]
    assert back.inputs[3].to_array().tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "too short"),
        (b"hello world, not a flatbuffer at all", "not a BundleIO program"),
        (b"\x10\x00\x00\x00ET12" + b"\x00" * 64, "plain ExecuTorch program"),
    ],
)
def test_bad_files_get_clear_errors(data, message):
    with pytest.raises(BundleFormatError, match=message):
        parse_bundle(data)


def test_truncated_and_corrupted_bundles(stock_bundle_bytes):
    for cut in (12, len(stock_bundle_bytes) // 3, len(stock_bundle_bytes) - 100):
        with pytest.raises(BundleFormatError):
            parse_bundle(stock_bundle_bytes[:cut])
    corrupted = bytearray(stock_bundle_bytes)
    corrupted[0:4] = (len(corrupted) + 1000).to_bytes(4, "little")
    with pytest.raises(BundleFormatError):
        parse_bundle(bytes(corrupted))


def test_read_bundle_missing_file(tmp_path):
    with pytest.raises(BundleFormatError, match="no such file"):
        read_bundle(tmp_path / "nope.bpte")
