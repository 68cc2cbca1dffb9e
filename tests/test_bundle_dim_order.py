"""Bundled inputs stored in a dim order other than contiguous (bundles/bpte.py): the cortex-m recipe
exports image models with channels_last inputs, as ExecuTorch's Cortex-M tests do
(backends/cortex_m/test/models/test_ds_cnn.py:40), and the runtime copies a bundled input's bytes into
the program's input without looking at its dim order (runtime/executor/method.cpp:1250), so the bytes
must be laid out in the program's order while every bundlerun reader still sees logical (NCHW) values.
Pure Python: hand-made values in a bundle whose program is a stub (the checks here never read it);
tests/test_cortex_m_lowering.py checks the same against a real lowered program."""

from __future__ import annotations

import numpy as np
import pytest

from bundlerun.bundles.bpte import (Bundle, BundledTestCase, BundledValue, MethodTestSuite, parse_bundle,
                                    serialize_bundle)
from bundlerun.bundles.errors import BundleFormatError

STUB_PROGRAM = b"\0\0\0\0ET12" + b"\0" * 56  # an ET12 identifier: parse_bundle checks no more of it here


def _bundle(inputs: list[BundledValue], outputs: list[BundledValue]) -> Bundle:
    return Bundle(program=STUB_PROGRAM, method_test_suites=[MethodTestSuite("forward", [BundledTestCase(inputs, outputs)])])


def test_channels_last_input_holds_nhwc_bytes_and_reads_back_nchw():
    nchw = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    value = BundledValue.from_array(nchw, dim_order=[0, 2, 3, 1])
    assert value.sizes == [2, 3, 4, 5] and value.dim_order == [0, 2, 3, 1]  # sizes stay logical (schema: sizes)
    assert value.physical_sizes == [2, 4, 5, 3]
    assert value.data == np.ascontiguousarray(nchw.transpose(0, 2, 3, 1)).tobytes()
    assert value.data != nchw.tobytes()
    np.testing.assert_array_equal(value.to_array(), nchw)
    assert value.to_array().flags["C_CONTIGUOUS"]  # readers that take .tobytes() or reshape(-1) get logical order


def test_contiguous_values_are_written_as_before():
    a = np.arange(6, dtype=np.int8).reshape(2, 3)
    for value in (BundledValue.from_array(a), BundledValue.from_array(a, dim_order=[0, 1])):
        assert value.dim_order == [0, 1] and value.data == a.tobytes()
        np.testing.assert_array_equal(value.to_array(), a)


def test_one_channel_input_has_the_same_bytes_in_either_order():
    """ds_cnn's [1, 1, 49, 10] input: torch.export gives the channels_last example the dim order
    (0, 2, 1, 3) (strides 490, 1, 10, 1, ties kept in index order); with one channel those bytes are
    the NCHW ones, so only the recorded dim order differs."""
    x = np.linspace(-1, 1, 490, dtype=np.float32).reshape(1, 1, 49, 10)
    value = BundledValue.from_array(x, dim_order=[0, 2, 1, 3])
    assert value.data == x.tobytes()
    np.testing.assert_array_equal(value.to_array(), x)


def test_a_bad_dim_order_is_refused_when_written():
    with pytest.raises(ValueError, match="not a permutation"):
        BundledValue.from_array(np.zeros((1, 2, 3, 4), np.float32), dim_order=[0, 2, 2, 1])


def test_channels_last_input_survives_the_file_and_an_output_in_it_is_refused():
    nchw = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    out = BundledValue.from_array(np.zeros((1, 10), np.float32))
    parsed = parse_bundle(serialize_bundle(_bundle([BundledValue.from_array(nchw, dim_order=[0, 2, 3, 1])], [out])))
    stored = parsed.suite("forward").test_cases[0].inputs[0]
    assert stored.dim_order == [0, 2, 3, 1]
    assert bytes(stored.data) == np.ascontiguousarray(nchw.transpose(0, 2, 3, 1)).tobytes()
    np.testing.assert_array_equal(stored.to_array(), nchw)
    # An expected output must stay contiguous: runners' outputs are read in contiguous order.
    nhwc_out = BundledValue.from_array(nchw, dim_order=[0, 2, 3, 1])
    with pytest.raises(BundleFormatError, match=r"expected output 0 has non-contiguous dim_order \[0, 2, 3, 1\]"):
        parse_bundle(serialize_bundle(_bundle([BundledValue.from_array(nchw)], [nhwc_out])))
    # Still a corruption when it is no permutation at all, on an input too.
    broken = BundledValue.from_array(nchw, dim_order=[0, 2, 3, 1])
    broken.dim_order = [0, 2, 2, 1]
    with pytest.raises(BundleFormatError, match="not a permutation"):
        parse_bundle(serialize_bundle(_bundle([broken], [out])))


def test_a_channels_last_golden_is_imported_in_its_dim_order_and_passes_on_host(tmp_path):
    """End to end with a real program whose input is channels_last (exported from a channels_last
    example, as the Cortex-M tests do), written as the backend test suite writes goldens: the input
    bytes in the tensor's dim order (backends/test/harness/tester.py _dump_golden_artifacts,
    `t.permute(t.dim_order()).contiguous()`), the expected output contiguous. `import-goldens` keeps
    the input in that order (it used to refuse it) and reads it back in logical order; the host
    runtime copies the stored bytes into the program's channels_last input: PASS."""
    import json

    import torch
    from executorch.exir import to_edge

    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.program_meta import method_inputs
    from tests.conftest import run_cli

    class ConvMean(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.conv(x).mean(dim=(2, 3))  # a 2-D output: bundles keep outputs contiguous

    torch.manual_seed(0)
    model = ConvMean().eval()
    x = torch.randn(1, 3, 6, 5).to(memory_format=torch.channels_last)
    program = to_edge(torch.export.export(model, (x,), strict=False)).to_executorch().buffer
    assert method_inputs(program, "conv")["forward"][0].dim_order == [0, 2, 3, 1]
    flow = tmp_path / "g" / "portable"
    flow.mkdir(parents=True)
    (flow / "conv.pte").write_bytes(program)
    (flow / "conv_input.bin").write_bytes(x.permute(0, 2, 3, 1).contiguous().numpy().tobytes())
    with torch.no_grad():
        (flow / "conv_expected_output.bin").write_bytes(model(x).contiguous().numpy().tobytes())
    res = run_cli("import-goldens", str(tmp_path / "g"), "-o", str(tmp_path / "b"))
    assert res.returncode == 0 and "imported 1 of 1" in res.stdout, res.stdout + res.stderr
    stored = read_bundle(tmp_path / "b" / "portable" / "conv.bpte").suite("forward").test_cases[0].inputs[0]
    assert stored.dim_order == [0, 2, 3, 1]
    assert bytes(stored.data) == (flow / "conv_input.bin").read_bytes()
    np.testing.assert_array_equal(stored.to_array(), x.contiguous().numpy())
    res = run_cli("run", str(tmp_path / "b" / "portable" / "conv.bpte"), "--target", "host://portable",
                  "--report", str(tmp_path / "r"), "--no-history")
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert res.returncode == 0 and report["summary"]["verdict"] == "PASS", res.stdout[-2000:] + res.stderr[-2000:]
