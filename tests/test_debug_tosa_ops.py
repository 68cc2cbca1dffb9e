"""`bundlerun debug` on tosa://: one row per TOSA operator inside the delegate, mapped back to the
eager graph through the Arm backend graph recorded by `build --etrecord`. Real Arm lowering, real
TOSA reference model; the miscompiled bundles are changed inside the TOSA payload after lowering
(one convolution's weights, one RESCALE's multipliers) and re-sealed with bundlerun's writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle, write_bundle
from bundlerun.targets import lowering_info
from bundlerun.bundles.builder import BuildRequest, build_bundle

BUNDLERUN = [sys.executable, "-m", "bundlerun.runner.cli"]


def _payload(bundle_path: Path) -> bytes:
    from bundlerun.targets.program.walker import load_program

    loaded = load_program(read_bundle(bundle_path).program)
    delegates = loaded.program.execution_plan[0].delegates
    assert [d.id for d in delegates] == ["TOSABackend"]
    return bytes(loaded.program.backend_delegate_data[delegates[0].processed.index].data)


def _tensor_bytes(payload: bytes, name: bytes) -> bytes:
    from bundlerun.targets.program.tosa_delegate import _block

    block = _block(payload)
    tensor = next(block.Tensors(i) for i in range(block.TensorsLength()) if block.Tensors(i).Name() == name)
    return tensor.DataAsNumpy().tobytes()


def _tamper(good: Path, bad: Path, raw: bytes, new: bytes) -> None:
    """Replace bytes inside the lowered program (here: inside the TOSA payload) and re-seal the bundle.
    The copy stays beside the original, whose ETRecord and delegate graphs its manifest names."""
    bundle = read_bundle(good)
    assert bundle.program.count(raw) == 1 and len(new) == len(raw)
    write_bundle(replace(bundle, program=bundle.program.replace(raw, new)), bad)


@pytest.fixture(scope="module")
def int8(tmp_path_factory):
    """tiny-cnn int8 on tosa://int with --etrecord; copies with conv2d_1's int8 weights negated and with
    the multipliers of the RESCALE after conv2d_1 halved, both inside the TOSA payload."""
    d = tmp_path_factory.mktemp("tosa-int")
    build_bundle(BuildRequest(model="tiny-cnn", output=d / "good.bpte", backend="arm", target="tosa://int", target_info=lowering_info("tosa://int"),
                              dtype="int8", cases=2, etrecord=True))
    payload = _payload(d / "good.bpte")
    raw = _tensor_bytes(payload, b"aten_convolution_default_1_weight_ohwi")
    flipped = np.clip(-np.frombuffer(raw, np.int8).astype(np.int16), -127, 127).astype(np.int8).tobytes()
    _tamper(d / "good.bpte", d / "bad-weight.bpte", raw, flipped)
    raw = _tensor_bytes(payload, b"tosa_rescale_default_1_multipliers")
    halved = (np.frombuffer(raw, np.int32) >> 1).astype(np.int32).tobytes()
    _tamper(d / "good.bpte", d / "bad-rescale.bpte", raw, halved)
    return d


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    """tiny-cnn fp32 on tosa://fp with --etrecord, and a copy with conv2d_1's weights negated in the payload."""
    d = tmp_path_factory.mktemp("tosa-fp")
    build_bundle(BuildRequest(model="tiny-cnn", output=d / "good.bpte", backend="arm", target="tosa://fp", target_info=lowering_info("tosa://fp"),
                              dtype="fp32", cases=2, etrecord=True))
    raw = _tensor_bytes(_payload(d / "good.bpte"), b"aten_convolution_default_1_weight_ohwi")
    _tamper(d / "good.bpte", d / "bad.bpte", raw, (-np.frombuffer(raw, np.float32)).tobytes())
    return d


def _op_rows(result):
    return [r for r in result.rows if r.kind == "delegate-op"]


def test_build_records_the_arm_backend_graph(int8):
    """The TOSA tensor names are the Arm backend graph's FX node names (not the ETRecord's): the build
    records that graph, with debug handles, quantization and layout, sealed by sha256 in the manifest."""
    from bundlerun.bundles.etrecord import load_delegate_graphs
    from bundlerun.bundles.fileio import file_sha256
    from bundlerun.targets.program.tosa_delegate import operator_outputs

    manifest = read_bundle(int8 / "good.bpte").manifest
    entry = manifest.build.etrecord.delegate_graphs
    assert entry["path"] == "good.delegates.json" and entry["backends"] == ["TOSABackend"]
    assert entry["sha256"] == file_sha256(int8 / "good.delegates.json")
    graphs, why = load_delegate_graphs(manifest, int8 / "good.bpte")
    assert why == "" and graphs["errors"] == []
    nodes = graphs["graphs"][0]["nodes"]
    ops = operator_outputs(_payload(int8 / "good.bpte"))
    assert ops and all(outs and outs[0] in nodes for _j, _op, outs in ops)  # every TOSA operator's tensor
    conv = nodes["tosa_conv2d_default_1"]
    assert conv["op"] == "tosa.CONV2D" and conv["roots"] == ["conv2d_1"] and conv["dtype"] == "int32"
    assert conv["layout"] == [0, 2, 3, 1] and len(conv["scale"]) == 16  # per-channel accumulator scale
    rescale = nodes["tosa_rescale_default_1"]
    assert rescale["debug_handle"] == conv["debug_handle"] and rescale["zero_point"] == -128
    assert isinstance(rescale["scale"], float) and 1e-4 < rescale["scale"] < 1e-1
    # the ReLU after the conv is gone from the backend graph: folded into the conv's group
    assert graphs["graphs"][0]["absorbed"][str(conv["debug_handle"])] != conv["debug_handle"]


def test_operator_outputs_rewrite_keeps_the_graph_outputs(int8):
    """The payload rewritten with every operator's output as a block output runs on the reference
    model and returns the same graph outputs first."""
    import tosa_reference_model as trm

    from bundlerun.targets.program.tosa_delegate import _block, operator_outputs, with_operator_outputs

    payload = _payload(int8 / "good.bpte")
    names = [t for _j, _op, outs in operator_outputs(payload) for t in outs]
    rewritten, order = with_operator_outputs(payload, names)
    assert order[0] == _block(payload).Outputs(0).decode() and set(names) <= set(order)
    assert len(rewritten) > len(payload) and rewritten[: len(payload)] != payload  # one offset re-pointed, data appended
    x = np.random.default_rng(0).integers(-128, 127, (1, 3, 32, 32), dtype=np.int8)
    plain, status = trm.run(payload, [x])
    every, status2 = trm.run(rewritten, [x])
    assert status == status2 == trm.GraphStatus.TOSA_VALID
    assert len(every) == len(order) and np.array_equal(np.asarray(every[0]), np.asarray(plain[0]))
    conv = np.asarray(every[order.index("tosa_conv2d_default")])
    assert conv.dtype == np.int32 and conv.shape == (1, 32, 32, 8)


def test_good_int8_bundle_has_a_row_per_tosa_operator_and_nothing_exceeds(int8, tmp_path):
    from bundlerun.runner.debug.localize import debug_bundle
    from bundlerun.targets.program.tosa_delegate import operator_outputs

    result = debug_bundle(int8 / "good.bpte", "tosa://int", case=0, work_dir=tmp_path / "w")
    assert result.first_bad is None
    ops = _op_rows(result)
    expected = operator_outputs(_payload(int8 / "good.bpte"))
    assert [(r.delegate_op, r.runtime_op, r.tensor) for r in ops] == [(j, op, outs[0]) for j, op, outs in expected]
    delegate_row = next(r for r in result.rows if r.kind == "delegate")
    assert all(r.instruction == delegate_row.instruction and r.index < delegate_row.index for r in ops)
    # the call's own row is merged with the quantize / dequantize around it, as the Inspector does
    assert delegate_row.status == "unmatched" and "merged" in delegate_row.note
    assert "covers delegate:TOSABackend" in result.rows[-1].note and result.rows[-1].quantized.sqnr == float("inf")
    assert [r.runtime_op for r in ops if r.status == "matched"][:4] == ["tosa.CONV2D", "tosa.RESCALE",
                                                                        "tosa.MAX_POOL2D", "tosa.CONV2D"]
    for r in ops:  # never dropped: compared, or a step that says where its group is compared
        assert r.status == "matched" or (r.compared_at is not None and r.note and "compared at row" in r.note), r
    convs = [r for r in ops if r.runtime_op == "tosa.CONV2D"]
    assert [r.aot_ops for r in convs] == [["conv2d"], ["conv2d_1"], ["linear"]]
    # the runtime reproduces the quantized reference: accumulators to float rounding, requantized tensors exactly
    assert all(r.quantized.sqnr > 100 for r in convs)
    rescale = next(r for r in ops if r.runtime_op == "tosa.RESCALE" and "conv2d_1" in r.aot_ops)
    assert rescale.quantized.sqnr == float("inf") and "relu_1" in rescale.aot_ops and rescale.dtype == "float32"
    assert 30 < rescale.fp32.sqnr < 60  # what int8 quantization costs at that layer


def test_miscompiled_conv_weights_name_the_tosa_conv(int8, tmp_path):
    from bundlerun.runner.debug.localize import debug_bundle

    result = debug_bundle(int8 / "bad-weight.bpte", "tosa://int", case=0, work_dir=tmp_path / "w")
    row = result.first_bad_row
    assert row is not None and row.kind == "delegate-op", [(r.runtime_op, r.quantized) for r in result.rows]
    assert row.runtime_op == "tosa.CONV2D" and row.tensor == "tosa_conv2d_default_1" and row.aot_ops == ["conv2d_1"]
    assert row.attribution == "lowering" and row.quantized.sqnr < 10
    earlier = [r for r in result.rows if r.status == "matched" and r.index < row.index]
    assert len(earlier) == 3 and all(r.quantized.sqnr > 100 and not r.exceeds for r in earlier)
    from bundlerun.runner.debug.localize_report import verdict_line

    assert verdict_line(result).startswith("first bad layer: instruction 1, TOSA operator 19 tosa.CONV2D = conv2d_1:")


def test_changed_rescale_names_the_rescale_not_the_conv(int8, tmp_path):
    from bundlerun.runner.debug.localize import debug_bundle

    result = debug_bundle(int8 / "bad-rescale.bpte", "tosa://int", case=0, work_dir=tmp_path / "w")
    row = result.first_bad_row
    assert row is not None and row.runtime_op == "tosa.RESCALE" and row.tensor == "tosa_rescale_default_1"
    assert "conv2d_1" in row.aot_ops and row.attribution == "lowering" and row.quantized.sqnr < 20
    conv = next(r for r in result.rows if r.tensor == "tosa_conv2d_default_1")
    assert conv.index < row.index and conv.quantized.sqnr > 100 and not conv.exceeds  # the conv itself is right


def test_fp_miscompiled_conv_from_the_cli(fp32, tmp_path):
    """tosa://fp, through the CLI: the TOSA CONV2D of conv2d_1 is the first bad layer; report.json has
    the operator rows."""
    env = {**os.environ, "BUNDLERUN_HISTORY": "off"}
    proc = subprocess.run([*BUNDLERUN, "debug", str(fp32 / "bad.bpte"), "--target", "tosa://fp", "--case", "1",
                           "--report", str(tmp_path / "r")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "first bad layer: instruction 0, TOSA operator" in proc.stdout and "tosa.CONV2D = conv2d_1" in proc.stdout
    assert "step→#" in proc.stdout  # the layout transpose and the mean's partial sums
    debug = json.loads((tmp_path / "r" / "report.json").read_text())["debug"]
    first = debug["first_bad_layer"]
    assert first["runtime_op"] == "tosa.CONV2D" and first["aot_ops"][0] == "conv2d_1"
    assert isinstance(first["delegate_op"], int)
    rows = debug["rows"]
    assert [r["runtime_op"] for r in rows if r["kind"] == "delegate-op"][:3] == ["tosa.TRANSPOSE", "tosa.CONV2D",
                                                                                 "tosa.CLAMP"]
    ok = [r for r in rows if r["kind"] == "delegate-op" and r["status"] == "matched" and r["index"] < first["row"]]
    assert len(ok) == 3 and all(r["fp32"]["sqnr"] > 100 for r in ok)


def test_without_delegate_graphs_operators_are_unmatched_with_the_reason(int8, tmp_path):
    """A bundle whose delegate graphs are gone: every TOSA operator is still a row, unmatched, saying why;
    the kernel and delegate rows are compared as before."""
    from executorch.devtools.etrecord import parse_etrecord

    from bundlerun.bundles.etrecord import load_delegate_graphs
    from bundlerun.runner.debug.localize import compare_layers
    from bundlerun.targets.intermediates import capture

    for name in ("good.bpte", "good.etrecord"):
        (tmp_path / name).write_bytes((int8 / name).read_bytes())
    graphs, why = load_delegate_graphs(read_bundle(tmp_path / "good.bpte").manifest, tmp_path / "good.bpte")
    assert graphs is None and "good.delegates.json" in why and "missing" in why
    run = capture("tosa://int", tmp_path / "good.bpte", "forward", 0, tmp_path / "w")
    import torch

    inputs = tuple(torch.from_numpy(v.to_array().copy()) for v in read_bundle(tmp_path / "good.bpte")
                   .suite("forward").test_cases[0].inputs)
    rows, _ = compare_layers(run, parse_etrecord(str(tmp_path / "good.etrecord")), inputs, "forward", True, graphs, why)
    ops = [r for r in rows if r.kind == "delegate-op"]
    assert len(ops) == 10 and all(r.status == "unmatched" and r.note == why for r in ops)
    assert len(rows) == len(run.intermediates) == 13
    assert rows[-1].status == "matched" and rows[-1].quantized.sqnr == float("inf")  # the dequantize after it
