"""Divergence at export: the exported program differs from eager, the runtime matches the export.

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
CMD = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()"]


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *map(str, args)], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "BUNDLERUN_HISTORY": "off", **(env or {})})


def test_localize_names_the_first_module_where_export_parts_from_eager():
    import torch

    from bundlerun.bundles.backends.common import export_model
    from bundlerun.bundles.model_source import resolve_model
    from bundlerun.runner.export_divergence import localize

    model = resolve_model(DIVERGENT).module
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    found = localize(model, export_model(model, (x,)), (x,))
    first = found["first_divergent"]
    assert first["module"] == "block.conv" and first["type"] == "ScaledConv" and first["node"] == "conv2d_1"
    assert first["sqnr"] < 20  # 1.5x weight: ~9.5 dB
    by_module = {row["module"]: row for row in found["layers"]}
    assert by_module["conv1"]["status"] == "ok"  # before it, eager and export agree
    # the exported nodes of the module include the scaling the export traced, with its source line
    assert any(n["op"].startswith("mul") and "is_exporting" in (n["source"] or "") for n in first["nodes"])
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
    assert "eager and the exported program part first at block.conv (ScaledConv)" in proc.stdout
