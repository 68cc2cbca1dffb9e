"""Divergence at export: the exported program differs from eager, the runtime matches the export.

tests/fixtures/export_divergent_ops.py alters one step written in `forward` itself (a functional
layer norm, a tensor method, a step of inline attention) only while exporting: `debug` must name that
operation at its source line, and the next module (`l2`, `o`) as downstream of it, not as the first
divergent one.

tests/fixtures/export_divergent.py scales `block.conv`'s weight only while
torch.compiler.is_exporting(). Built and run for real, its output fails on host://portable, yet
every runtime layer matches the exported program; `bundlerun debug` must say so and name
block.conv as the first module where eager and the exported program part - on host://portable
(portable kernels) and host://xnnpack (one opaque delegate row) alike, since the comparison is on
the host. No doubles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIVERGENT = f"{ROOT / 'tests' / 'fixtures' / 'export_divergent.py'}:model"
OPS = ROOT / "tests" / "fixtures" / "export_divergent_ops.py"
CMD = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()"]


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *map(str, args)], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "BUNDLERUN_HISTORY": "off", **(env or {})})


def test_localize_names_the_first_module_where_export_parts_from_eager():
    import torch

    from bundlerun.bundles.backends.common import export_model
    from bundlerun.bundles.model_source import resolve_model
    from bundlerun.runner.debug.export_divergence import localize

    model = resolve_model(DIVERGENT).module
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    found = localize(model, export_model(model, (x,)), (x,))
    first = found["first_divergent"]
    assert first["module"] == "block.conv" and first["type"] == "ScaledConv" and first["node"] == "conv2d_1"
    assert first["op"] == "aten.conv2d.default" and first["eager_op"] == "aten.convolution.default"
    assert first["sqnr"] < 20 and first["bound"] is None  # 1.5x weight: ~9.5 dB; its place is certain
    by_module = {row["module"]: row for row in found["layers"]}
    assert by_module["conv1"]["status"] == "ok"  # before it, eager and export agree
    assert by_module["block.conv"]["status"] == "FIRST DIVERGENT" and by_module["block.conv"]["input_sqnr"] > 100
    assert by_module["fc"]["status"] == "downstream" and by_module["fc"]["input_sqnr"] < 20
    # the scaling the export traced feeds it and has no eager counterpart: named with its source line
    assert any(n["op"] == "aten.mul.Tensor" and "is_exporting" in (n["source"] or "")
               for n in first["exported_only_inputs"])
    # an honest model: no divergence
    plain = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    assert localize(plain, export_model(plain, (x,)), (x,))["first_divergent"] is None


@pytest.mark.parametrize("target, backend", [("host://portable", "portable"), ("host://xnnpack", "xnnpack")])
def test_debug_says_the_divergence_is_at_export(tmp_path, target, backend):
    bundle = tmp_path / "m.bpte"
    proc = _cli("build", DIVERGENT, "--target", target, "--backend", backend, "--cases", "2", "--etrecord", "-o", bundle)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = _cli("run", bundle, "--target", target, "--report", tmp_path / "run")
    assert run.returncode == 1, run.stdout[-2000:]  # the output fails against eager
    proc = _cli("debug", bundle, "--target", target, "--case", "0", "--report", tmp_path / "debug")
    assert proc.returncode == 1, proc.stderr[-2000:] + proc.stdout[-2000:]
    result = json.loads((tmp_path / "debug" / "report.json").read_text())["debug"]
    assert result["first_bad_layer"] is None  # every runtime layer matches the exported program
    assert all(r["status"] == "unmatched" or not r.get("exceeds") for r in result["rows"])
    found = result["export_divergence"]
    assert "divergence at export" in found["finding"]
    assert found["runtime_vs_exported"]["sqnr"] > 100  # the runtime is the export, float rounding apart
    assert found["exported_vs_eager"]["sqnr"] < 30
    assert found["first_divergent"]["module"] == "block.conv"
    assert "export_divergent.py:" in found["first_divergent"]["source"]
    assert "divergence at export, not at run time" in proc.stdout
    assert ("eager and the exported program part first at operation conv2d (node conv2d_1, eager convolution) in "
            "block.conv (ScaledConv)") in proc.stdout


def _ops_model(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("export_divergent_ops", OPS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)()


def _line(text: str) -> int:
    """The line of OPS that holds `text`."""
    return next(i for i, line in enumerate(OPS.read_text().splitlines(), start=1) if text in line)


@pytest.mark.parametrize("name", ["mlp", "tiny-cnn", "mobile-net", "tiny-transformer", "tiny-gru"])
def test_honest_zoo_models_match_eager_at_every_operation(name):
    """No false divergence: every ATen node of the zoo's models (nn.Sequential of torch modules, attention,
    a GRU cell called in a loop) is paired with an eager op and agrees with it, every module too."""
    import torch

    from bundlerun.bundles.backends.common import export_model
    from bundlerun.bundles.model_source import resolve_model

    from bundlerun.runner.debug.export_divergence import localize

    resolved = resolve_model(name)
    inputs = tuple(torch.randn(*spec.shape, generator=torch.Generator().manual_seed(1)) for spec in resolved.inputs)
    with torch.no_grad():
        found = localize(resolved.module, export_model(resolved.module, inputs), inputs)
    assert found["first_divergent"] is None
    assert found["operations"] and all(r["status"] == "ok" for r in found["operations"]), \
        [(r["node"], r["status"]) for r in found["operations"] if r["status"] != "ok"]
    assert all(r["status"] == "ok" for r in found["layers"])


def test_a_node_without_stack_trace_is_matched_by_order_and_its_place_bounded():
    """Stack traces stripped from the exported graph: layer_norm still pairs with native_layer_norm by op order
    within its module, but the finding says the match is by order and bounds the place by its neighbours."""
    import torch

    from bundlerun.bundles.backends.common import export_model
    from bundlerun.runner.debug.export_divergence import localize

    model, inputs = _ops_model("layer_norm")
    exported = export_model(model, inputs)
    for node in exported.graph.nodes:
        node.meta.pop("stack_trace", None)
    with torch.no_grad():
        found = localize(model, exported, inputs)
    first = found["first_divergent"]
    assert first["node"] == "layer_norm" and first["eager_op"] == "aten.native_layer_norm.default"
    assert first["match"] == "order"
    assert first["bound"].startswith("between ") and "matched to eager by order only" in first["bound"]
    assert {r["module"]: r["status"] for r in found["layers"]} == {"l1": "ok", "l2": "downstream"}


def test_decoder_blocks_name_the_altered_step_of_the_first_block():
    """Two decoder blocks with causal attention written inline (split/view/transpose/mask) and the softmax
    temperature altered under export in both: the first block's `att * temperature` is named; every op before
    it is paired and agrees; all it reaches - the second block's altered step included - is downstream."""
    import torch

    from bundlerun.bundles.backends.common import export_model
    from bundlerun.runner.debug.export_divergence import localize

    model, inputs = _ops_model("two_blocks")
    with torch.no_grad():
        found = localize(model, export_model(model, inputs), inputs)
    first = found["first_divergent"]
    line = _line("att = F.softmax(att * temperature, dim=-1)")
    assert (first["node"], first["op"], first["module"], first["type"]) == ("mul", "aten.mul.Tensor", "blocks.0",
                                                                           "Block")
    assert first["line"] == ["export_divergent_ops.py", line, "forward"] and first["bound"] is None
    ops = found["operations"]
    k = next(i for i, r in enumerate(ops) if r["status"] == "FIRST DIVERGENT")
    assert ops[:k] and all(r["status"] == "ok" for r in ops[:k])  # split, views, transposes, matmul, mask: paired
    # after it, everything its value reaches is downstream - the second block's own altered step too
    assert not [r for r in ops[k + 1:] if r["status"] == "diverges"]
    again = next(r for r in ops if r["node"] == "mul_1")
    assert (again["module"], again["line"][1], again["status"]) == ("blocks.1", line, "downstream")
    assert {r["status"] for r in ops[k + 1:] if r["node"] not in ("ones", "tril", "bitwise_not", "ones_1", "tril_1",
                                                                    "bitwise_not_1", "to", "to_1")} == {"downstream"}
    status = {r["module"]: r["status"] for r in found["layers"]}
    assert status["blocks.0.qkv"] == "ok" and status["blocks.0"] == "FIRST DIVERGENT"
    assert status["blocks.0.o"] == status["blocks.1"] == status["blocks.1.ln"] == "downstream"


def test_a_step_only_eager_runs_is_named_and_bounds_the_place():
    """Eager multiplies by 2 on a line the export skipped: the first exported node that parts (tanh) is named,
    with the eager-only op just before it and the place bounded between l1's output and tanh."""
    import torch

    from bundlerun.bundles.backends.common import export_model
    from bundlerun.runner.debug.export_divergence import localize, summary_line

    model, inputs = _ops_model("eager_only")
    with torch.no_grad():
        found = localize(model, export_model(model, inputs), inputs)
    first = found["first_divergent"]
    line = _line("h = h * 2.0")
    assert first["node"] == "tanh" and first["match"] == "op"
    assert first["eager_only_before"] == [{"op": "aten.mul.Tensor", "module": "",
                                           "line": ["export_divergent_ops.py", line, "forward"]}]
    assert first["bound"] == (f"between linear (l1, export_divergent_ops.py:{line - 2}) and tanh "
                              f"(forward, export_divergent_ops.py:{line + 1}): eager ran 1 op(s) in between that the "
                              f"exported program has no node for (mul at export_divergent_ops.py:{line})")
    assert "place bounded between linear (l1" in summary_line(found)


# (fixture factory, exported node, exported op, eager op, text on its line, the module downstream of it, target)
OP_CASES = [
    ("layer_norm", "layer_norm", "aten.layer_norm.default", "aten.native_layer_norm.default",
     "h = F.layer_norm(h, (32,), w, self.bias)", "l2", "host://xnnpack"),
    ("tensor_method", "mul", "aten.mul.Tensor", "aten.mul.Tensor", "h = h.mul(s).sin()", "l2", "host://xnnpack"),
    ("attention", "mul", "aten.mul.Tensor", "aten.mul.Tensor", "att = (scores * scale).softmax(dim=-1)", "o",
     "host://xnnpack"),
    ("layer_norm", "layer_norm", "aten.layer_norm.default", "aten.native_layer_norm.default",
     "h = F.layer_norm(h, (32,), w, self.bias)", "l2", "host://portable"),
]


@pytest.mark.parametrize("factory, node, op, eager_op, code, downstream, target", OP_CASES,
                         ids=[f"{c[0]}-{c[-1].split('//')[1]}" for c in OP_CASES])
def test_debug_names_the_first_diverging_operation(tmp_path, factory, node, op, eager_op, code, downstream, target):
    """Through the CLI on host://xnnpack (and host://portable): `run` fails, `debug` names the operation in
    forward (not the next module), at its source line, and the next module as downstream of it."""
    bundle = tmp_path / "m.bpte"
    proc = _cli("build", f"{OPS}:{factory}", "--target", target, "--backend", target.split("//")[1], "--cases", "2",
                "--etrecord", "-o", bundle)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = _cli("run", bundle, "--target", target, "--report", tmp_path / "run")
    assert run.returncode == 1, run.stdout[-2000:]
    proc = _cli("debug", bundle, "--target", target, "--case", "0", "--report", tmp_path / "debug")
    assert proc.returncode == 1, proc.stderr[-2000:] + proc.stdout[-2000:]
    result = json.loads((tmp_path / "debug" / "report.json").read_text())["debug"]
    found = result["export_divergence"]
    first = found["first_divergent"]
    line = _line(code)
    assert (first["node"], first["op"], first["eager_op"]) == (node, op, eager_op)
    assert first["module"] == "" and first["line"] == ["export_divergent_ops.py", line, "forward"]
    assert first["source"].endswith(f"export_divergent_ops.py:{line} in forward: {code}")
    assert first["sqnr"] < 20 and first["bound"] is None
    assert first["downstream_modules"] == [downstream]
    statuses = {r["module"]: r["status"] for r in found["layers"]}
    assert statuses[downstream] == "downstream" and "FIRST DIVERGENT" not in statuses.values()
    assert all(s == "ok" for m, s in statuses.items() if m != downstream)  # every module before it agrees
    ops = found["operations"]
    k = next(i for i, r in enumerate(ops) if r["node"] == node)
    assert ops[k]["status"] == "FIRST DIVERGENT"
    assert all(r["status"] in ("ok", "exported only") for r in ops[:k])  # eager and export agree up to it
    assert all(r["status"] == "downstream" for r in ops[k + 1:])
    # the runtime row that computes it matches the export (the divergence is not the target's)
    at = result["rows"][found["runtime_row"]["row"]]
    assert node in at["aot_ops"] and at["fp32"]["sqnr"] > 100 and "first parts from eager" in at["note"]
    assert f"part first at operation {op.split('.')[1]} (node {node}, eager {eager_op.split('.')[1]}) in the model's " \
           f"own forward" in proc.stdout
    assert f"downstream of it: {downstream}" in proc.stdout
    summary = (tmp_path / "debug" / "summary.md").read_text()  # the same tables in summary.md and report.html
    assert "## Divergence at export" in summary and f"| {node} | {op.split('.')[1]} |" in summary
    html = (tmp_path / "debug" / "report.html").read_text()
    assert "<h2>Divergence at export</h2>" in html and f"<td>{node}</td>" in html


def test_hostile_node_metadata_is_read_without_error():
    """The exported graph comes from the bundle's ETRecord (outside input): seeded hostile `stack_trace` and
    `nn_module_stack` values on a real exported graph never raise; every row gets a known status."""
    import random

    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from security_fuzz import VALUES

    from bundlerun.bundles.backends.common import export_model
    from bundlerun.runner.debug.eager_ops import capture, compared_nodes, node_module, node_source
    from bundlerun.runner.debug.export_divergence import compare_modules, compare_ops, capture_graph, _first_divergent

    model, inputs = _ops_model("layer_norm")
    gm = export_model(model, inputs).module()
    values, _ = capture_graph(gm, inputs)
    run = capture(model, inputs)
    nodes = compared_nodes(gm)
    traces = VALUES + ['File "x.py", line 9, in f', 'File "/torch/a.py", line 1, in g\n' * 50,
                       'File "', 'File "a.py", line 99999999999999999999, in f']
    stacks = VALUES + [{"k": VALUES[-1]}, {"k": ("l1",)}, {"k": ("l1", None)}, {"k": (None, 3)}, {"k": ["l2", "X"]}]
    statuses = {"ok", "diverges", "downstream", "FIRST DIVERGENT", "exported only", "no eager value",
                "not comparable (shape)"}
    rng = random.Random(39)
    for _ in range(60):
        for n in nodes:
            n.meta["stack_trace"] = rng.choice(traces)
            n.meta["nn_module_stack"] = rng.choice(stacks)
            src, (path, kind) = node_source(n), node_module(n)
            assert src is None or (isinstance(src[0], str) and isinstance(src[1], int))
            assert isinstance(path, str) and isinstance(kind, str)
        with torch.no_grad():
            rows = compare_ops(nodes, values, run, 100.0)
            _first_divergent(rows, nodes)
            layers = compare_modules(run, values, gm, 100.0)
        assert {r["status"] for r in rows} <= statuses and len(rows) == len(nodes)
        assert all(isinstance(r["status"], str) for r in layers)
