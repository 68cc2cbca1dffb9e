"""`bundlerun debug` on mlx://cpu: one row per MLX instruction of the delegate (the mlx package's own
kernels, in a child process), mapped back to the eager graph through the instruction map recorded by
`build --etrecord`. Real MLX lowering; the miscompiled bundle has one weight constant changed in the
program's named data after lowering, re-sealed with bundlerun's writer."""

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


def _main_chain(bundle_path: Path) -> list[str]:
    from bundlerun.targets.program.mlx_graph import decode
    from bundlerun.targets.program.walker import load_program

    loaded = load_program(read_bundle(bundle_path).program)
    delegate = loaded.program.execution_plan[0].delegates[0]
    assert delegate.id == "MLXBackend"
    graph = decode(bytes(loaded.program.backend_delegate_data[delegate.processed.index].data))
    return [ins.op for ins in graph.chains[graph.main_chain]]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """mlp and tiny-cnn fp32 lowered to MLX with --etrecord; an mlp whose second linear's weights are negated."""
    d = tmp_path_factory.mktemp("mlx")
    for model in ("mlp", "tiny-cnn"):
        build_bundle(BuildRequest(model=model, output=d / f"{model}.bpte", backend="mlx", target="mlx://cpu", target_info=lowering_info("mlx://cpu"),
                                  dtype="fp32", cases=2, etrecord=True))
    from bundlerun.targets.program.walker import load_program

    bundle = read_bundle(d / "mlp.bpte")
    named = load_program(bundle.program).named_data
    key = next(k for k in named if k.endswith("/2.weight"))  # nn.Sequential index 2: the second Linear
    raw = named[key]
    assert bundle.program.count(raw) == 1
    negated = (-np.frombuffer(raw, np.float32)).tobytes()
    write_bundle(replace(bundle, program=bundle.program.replace(raw, negated)), d / "mlp-bad.bpte")
    return d


@pytest.mark.parametrize("model", ["mlp", "tiny-cnn"])
def test_good_bundle_has_a_row_per_mlx_instruction_and_nothing_exceeds(bundles, model, tmp_path):
    from bundlerun.runner.debug.localize import debug_bundle

    result = debug_bundle(bundles / f"{model}.bpte", "mlx://cpu", case=0, work_dir=tmp_path / "w")
    assert result.first_bad is None, [(r.runtime_op, r.fp32) for r in result.rows]
    ops = [r for r in result.rows if r.kind == "delegate-op"]
    chain = _main_chain(bundles / f"{model}.bpte")
    assert [r.runtime_op for r in ops] == [f"mlx.{op}" for op in chain]  # every instruction, in order
    assert [r.delegate_op for r in ops] == list(range(len(chain)))
    assert result.rows[-1].kind == "delegate" and result.rows[-1].index == len(ops)
    for r in ops:  # compared, or a step of a node whose output is compared at a later row
        assert r.status == "matched" or (r.compared_at is not None and r.compared_at > r.index), (r.runtime_op, r.note)
    matched = [r for r in ops if r.status == "matched"]
    assert all(r.fp32.sqnr > 100 for r in matched)
    eager = {op for r in matched for op in r.aot_ops}
    if model == "mlp":
        assert [r.runtime_op for r in matched] == ["mlx.Addmm", "mlx.Maximum", "mlx.Addmm", "mlx.Tanh", "mlx.Addmm"]
        assert eager == {"linear", "relu", "linear_1", "tanh", "linear_2"}
    else:
        assert {"conv2d", "batch_norm", "relu", "max_pool2d", "conv2d_1", "batch_norm_1", "linear"} <= eager
        assert len(matched) >= 10 and len(ops) - len(matched) >= 20  # the conv/bn decompositions are steps


def test_miscompiled_constant_names_the_instruction_from_the_cli(bundles, tmp_path):
    env = {**os.environ, "BUNDLERUN_HISTORY": "off"}
    proc = subprocess.run([*BUNDLERUN, "debug", str(bundles / "mlp-bad.bpte"), "--target", "mlx://cpu", "--case", "1",
                           "--report", str(tmp_path / "r")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "first bad layer: instruction 0, MLX instruction 4 mlx.Addmm = linear_1:" in proc.stdout
    debug = json.loads((tmp_path / "r" / "report.json").read_text())["debug"]
    assert debug["first_bad_layer"]["delegate_op"] == 4 and debug["first_bad_layer"]["aot_ops"] == ["linear_1"]
    rows = {r["index"]: r for r in debug["rows"]}
    assert rows[1]["fp32"]["sqnr"] > 100 and rows[2]["fp32"]["sqnr"] > 100  # linear, relu before it are right
    assert rows[4]["fp32"]["sqnr"] < 10 and rows[3]["status"] == "unmatched" and rows[3]["compared_at"] == 4
    assert debug["granularity"].startswith("every kernel call, every MLX delegate call and every MLX instruction")


def test_a_bundle_with_other_delegates_is_refused_in_one_line(tmp_path, bundle_cache):
    from bundlerun.targets.intermediates import IntermediatesUnsupported, capture

    xnn = bundle_cache("mlp", backend="xnnpack", cases=1)
    with pytest.raises(IntermediatesUnsupported) as info:
        capture("mlx://cpu", xnn, "forward", 0, tmp_path / "w")
    assert str(info.value).startswith("mlx://cpu:") and "XnnpackBackend" in str(info.value)
    assert "--backend mlx" in str(info.value) and "\n" not in str(info.value)
