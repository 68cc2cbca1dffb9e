"""export_llama's `vulkan_8w` lowering (pt2e's Vulkan 8-bit weight quantizer, then the Vulkan partitioner) of a
tiny llama3, built for real through bundlerun (issue 37). At executorch 1.5.1 it fails in the Vulkan rms_norm
fusion (backends/vulkan/patterns/rms_norm.py:254: the pt2e-lifted epsilon is read with `.item()` from a
FakeTensor); bundles/vulkan_rms_norm_eps.py reads it from the program instead, and the manifest says so.
No double: the real export, the real Vulkan preprocess."""

from __future__ import annotations

import pytest

from bundlerun.bundles.bpte import read_bundle
from bundlerun.bundles.program_meta import program_operators
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_vulkan_8w_lowers_with_the_lifted_epsilon_read_from_the_program(tmp_path):
    out = tmp_path / "l3-8w.bpte"
    res = run_cli("build", "llm:llama3", "--size", "tiny", "--backend", "vulkan", "--dtype", "vulkan_8w", "-o", str(out),
                  timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    bundle = read_bundle(out)
    build = bundle.manifest.build
    assert build.quantization and "vulkan_8w" in build.quantization
    lowering = build.lowering or {}
    assert lowering["delegate"] == "vulkan" and lowering["exporter"] == "export_llama"
    (note,) = lowering["workarounds"]
    # tiny llama3: 2 layers x (attention_norm, ffn_norm) + the final norm, each epsilon 1e-5 (params norm_eps)
    assert note.startswith("backends/vulkan/patterns/rms_norm.py:254") and note.count("=1e-05") == 5, note
    # the whole forward is one Vulkan delegate: no portable or LLM custom op is left outside it
    assert not {op for op in program_operators(bundle.program, "bundle")}, program_operators(bundle.program, "bundle")
