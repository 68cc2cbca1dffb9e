"""Dynamic shapes (issue 36 item 3): a factory's `dynamic_shapes` and an ExportedProgram's symbolic
dims are honoured in the export, each dynamic dim is tested at its minimum, a typical size and its
maximum, the manifest says which case is which, and host:// and qemu-user:// run every case at its
own shape. Real builds and real runtimes; the manifest checks are pure Python."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite, read_bundle
from bundlerun.bundles.dynamic_shapes import DynDim, case_points, shape_over_cases, shapes_at
from bundlerun.bundles.errors import BundleError, ManifestError
from bundlerun.bundles.manifest_schema import validate_manifest
from tests.conftest import run_cli
from tests.security_fuzz import VALUES

FIXTURE = Path(__file__).parent / "fixtures" / "dynamic_models.py"
MLP = f"{FIXTURE}:batch_mlp"  # [B, 16], B in 1..8, example B = 4
CONV = f"{FIXTURE}:length_conv"  # [1, 4, L], L in 8..64, example L = 24


def test_points_cycle_min_typical_max_and_typical_is_the_example_inside_the_range():
    assert case_points(7) == ["min", "typical", "max", "min", "typical", "max", "min"]
    dim = DynDim(0, 0, "batch", 1, 8)
    assert [dim.at(p, 4) for p in ("min", "typical", "max")] == [1, 4, 8]
    assert dim.at("typical", 8) == 4  # the example at a bound: the midpoint, so typical is neither bound
    assert shapes_at([dim], [(4, 16), (3,)], "max") == [(8, 16), (3,)]


def test_shape_over_cases_records_the_largest_size_and_the_dims_that_vary():
    assert shape_over_cases([[1, 16], [4, 16], [8, 16]]) == ([8, 16], [0])
    assert shape_over_cases([[2, 3], [2, 3]]) == ([2, 3], [])
    with pytest.raises(ValueError, match="different ranks"):
        shape_over_cases([[2, 3], [2, 3, 1]])


def _bundle(sizes: list[list[int]], spec: dict) -> Bundle:
    cases = [BundledTestCase(inputs=[BundledValue.from_array(np.zeros(s, np.float32))],
                             expected_outputs=[BundledValue.from_array(np.zeros(s, np.float32))]) for s in sizes]
    manifest = {"methods": {"forward": {"name": "forward", "inputs": [{"name": "in0", "dtype": "float32", **spec}],
                                        "outputs": [{"name": "out0", "dtype": "float32", "criteria": {}, **spec}]}}}
    return Bundle(program=b"", method_test_suites=[MethodTestSuite("forward", cases)], manifest_json=manifest)


def test_consistency_takes_smaller_sizes_of_dynamic_dims_only():
    from bundlerun.bundles.consistency import check_consistency

    dynamic = {"shape": [8, 16], "dynamic": [0]}
    check_consistency(_bundle([[1, 16], [4, 16], [8, 16]], dynamic), "b")  # unreadable program: manifest check only
    with pytest.raises(BundleError, match=r"case 0: expected output 0 \(out0\) is a float32\[9, 16\].*dims \[0\] at most"):
        check_consistency(_bundle([[9, 16]], dynamic), "b")
    with pytest.raises(BundleError, match=r"is a float32\[8, 15\] tensor"):
        check_consistency(_bundle([[8, 15]], dynamic), "b")  # dim 1 is static
    with pytest.raises(BundleError, match=r"is a float32\[1, 16\] tensor, but the manifest describes a float32\[8, 16\]"):
        check_consistency(_bundle([[1, 16]], {"shape": [8, 16]}), "b")  # static: a smaller case is wrong


def _manifest_with_dynamic() -> dict:
    return {"schema": "bundlerun.manifest/1", "model": {"id": "m"},
            "build": {"backend": "xnnpack", "dynamic_shapes": {
                "dims": [{"input": 0, "dim": 0, "name": "batch", "min": 1, "max": 8}],
                "cases": ["min", "typical", "max"]}},
            "methods": {"forward": {"name": "forward",
                                    "inputs": [{"name": "in0", "dtype": "float32", "shape": [8, 16], "dynamic": [0]}],
                                    "outputs": [{"name": "out0", "dtype": "float32", "shape": [8, 4], "dynamic": [0],
                                                 "criteria": {"atol": 0.001}}]}}}


def test_hostile_dynamic_fields_are_one_line_manifest_errors():
    """Seeded mutations of every dynamic-shape field: each is accepted or refused as a ManifestError,
    never another exception."""
    base = _manifest_with_dynamic()
    validate_manifest(base)
    paths = [("build", "dynamic_shapes"), ("build", "dynamic_shapes", "dims"), ("build", "dynamic_shapes", "cases"),
             ("build", "dynamic_shapes", "cases", 1), ("build", "dynamic_shapes", "dims", 0),
             *[("build", "dynamic_shapes", "dims", 0, k) for k in ("input", "dim", "name", "min", "max")],
             ("methods", "forward", "inputs", 0, "dynamic"), ("methods", "forward", "inputs", 0, "dynamic", 0),
             ("methods", "forward", "outputs", 0, "dynamic"), ("methods", "forward", "outputs", 0, "dynamic", 0)]
    rng = random.Random(36)
    refused = 0
    for path in paths:
        for value in rng.sample(VALUES, 12):
            data = copy.deepcopy(base)
            node = data
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            try:
                validate_manifest(data)
            except ManifestError as exc:
                assert "\n" not in str(exc) and len(str(exc)) < 1000  # 10**400 is printed whole by the checker
                refused += 1
    assert refused > len(paths) * 6  # most of the mutations are wrong and said so
    data = copy.deepcopy(base)
    data["methods"]["forward"]["inputs"][0]["dynamic"] = [2]  # past the rank
    with pytest.raises(ManifestError, match=r"dynamic\[0\]: 2 is outside \[0, 1\]"):
        validate_manifest(data)


def _shapes(report: Path) -> list[tuple[list[int], list[int]]]:
    data = json.loads(report.read_text())
    return [(c["outputs"][0]["expected"]["shape"], c["outputs"][0]["actual"]["shape"]) for c in data["cases"]]


def test_mlp_factory_at_min_typical_max_on_host(tmp_path):
    bpte = tmp_path / "mlp.bpte"
    res = run_cli("build", MLP, "-o", str(bpte), "--cases", "3")
    assert res.returncode == 0, res.stderr[-2000:]
    bundle = read_bundle(bpte)
    assert [list(c.inputs[0].sizes) for c in bundle.method_test_suites[0].test_cases] == [[1, 16], [4, 16], [8, 16]]
    build = bundle.manifest_json["build"]
    assert build["dynamic_shapes"] == {"dims": [{"input": 0, "dim": 0, "name": "batch", "min": 1, "max": 8}],
                                       "cases": ["min", "typical", "max"]}
    method = bundle.manifest_json["methods"]["forward"]
    assert method["inputs"][0]["shape"] == [8, 16] and method["inputs"][0]["dynamic"] == [0]
    assert method["outputs"][0]["shape"] == [8, 4] and method["outputs"][0]["dynamic"] == [0]
    res = run_cli("run", str(bpte), "--report", str(tmp_path / "r"), "--no-history")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "dynamic dims in0[0] batch 1..8: cases at 0 min, 1 typical, 2 max" in res.stdout
    assert _shapes(tmp_path / "r" / "report.json") == [([1, 4], [1, 4]), ([4, 4], [4, 4]), ([8, 4], [8, 4])]


def test_conv_over_a_dynamic_length_int8_on_host_and_qemu_user(tmp_path):
    """The length of a 1-D conv at 8, 24 and 64; int8 (PTQ re-exported with the same dims); on the
    host runtime and on the served aarch64 executor_runner, which loads each case by index."""
    from tests.doubles.android_env import real_executor_runner

    bpte = tmp_path / "conv.bpte"
    res = run_cli("build", CONV, "-o", str(bpte), "--cases", "3", "--dtype", "int8")
    assert res.returncode == 0, res.stderr[-2000:]
    want = [([1, 8, n], [1, 8, n]) for n in (8, 24, 64)]
    res = run_cli("run", str(bpte), "--report", str(tmp_path / "host"), "--no-history")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert _shapes(tmp_path / "host" / "report.json") == want
    real_executor_runner("aarch64")  # fails with the build command when it is not built
    res = run_cli("run", str(bpte), "--target", "qemu-user://aarch64", "--report", str(tmp_path / "qu"), "--no-history")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads((tmp_path / "qu" / "report.json").read_text())
    assert report["target"]["info"]["runner_mode"] == {"forward": "executor_runner --server_mode: one process for 3 case(s)"}
    assert _shapes(tmp_path / "qu" / "report.json") == want


def test_exported_program_dims_and_bundle_program_of_three_shapes(tmp_path):
    import torch

    from bundlerun import api
    from tests.fixtures.dynamic_models import batch_mlp

    module, examples, options = batch_mlp()
    ep = torch.export.export(module, examples, dynamic_shapes=options["dynamic_shapes"])
    path = api.build(ep, output=tmp_path / "ep.bpte", cases=3, cache=False)
    dims = read_bundle(path).manifest_json["build"]["dynamic_shapes"]["dims"]
    assert [(d["input"], d["dim"], d["min"], d["max"]) for d in dims] == [(0, 0, 1, 8)]
    assert api.run(path).summary.exit_code == 0

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    cases = [(torch.randn(b, 16),) for b in (1, 5, 8)]
    out = api.bundle_program(program, cases, reference=module, backend="xnnpack", output=tmp_path / "bp.bpte")
    method = read_bundle(out).manifest_json["methods"]["forward"]
    assert method["inputs"][0] == {"name": "in0", "dtype": "float32", "shape": [8, 16], "dynamic": [0]}
    report = api.run(out)
    assert report.summary.exit_code == 0 and report.summary.cases == 3
    assert [c.outputs[0].actual["shape"] for c in report.cases] == [[1, 4], [5, 4], [8, 4]]


@pytest.mark.parametrize("args, needle", [
    ([f"{FIXTURE}:unbounded_mlp"], "dynamic dim 'batch' has no finite maximum"),
    ([MLP, "--target", "tosa://int"], "declares dynamic dims; the arm recipe exports static shapes only"),
    ([MLP, "--cases", "2"], "give --cases 3 or more"),
])
def test_dynamic_dims_that_cannot_be_honoured_are_one_line_errors(tmp_path, args, needle):
    res = run_cli("build", *args, "-o", str(tmp_path / "x.bpte"))
    assert res.returncode == 2 and needle in res.stderr, res.stderr[-2000:]
    assert "internal error" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
