"""`bundlerun bisect llm:ARCH` on the vendor lanes: a planted fault on one delegated layer, found on Vulkan and QNN.

Real components only: export_llama's Vulkan path (its own partitioner, restricted through
EdgeProgramManager.to_backend) and QNN's static llama (the QNN partitioner restricted in the AOT child) build
every candidate; Mesa's lavapipe and Qualcomm's HTP simulator (QNN 2.49.40) run them. A missing runner or
simulator FAILS these tests. The fault is planted in the real lowering by tests/fixtures/planted_llm_layer_fault.py:
the delegate's preprocess gets layer 1's `feed_forward.w2` weight negated (Vulkan: the `mm` of its permuted
weight; QNN: the 1x1 convolution its static llama made of it), so that layer is wrong only when delegated. QNN
lowers in a child process: the fixture folder `planted_llm_child` (a sitecustomize) plants it there.

Lean by design (each candidate is a real lowering): one bisection per lane, of a decode step, so every candidate
replays that step's prefix first (on QNN with the KV cache threaded from the candidate's own earlier steps), and
$BUNDLERUN_BUILD_TAG (part of the build-cache key) keeps the planted candidates apart: a warm re-run re-lowers
nothing. Measured cold (2026-12-05, 2 cores shared by five helpers, load 11-16): 8 candidates each.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
FIXTURE = FIXTURES / "planted_llm_layer_fault.py"
CHILD = FIXTURES / "planted_llm_child"
PLANTED = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(FIXTURES)!r}); import planted_llm_layer_fault; "
           "from bundlerun.runner.cli import main; main()"]
LAYER = "layers.1.feed_forward.w2"


def _tag() -> str:
    digest = hashlib.sha256(FIXTURE.read_bytes() + (CHILD / "sitecustomize.py").read_bytes()).hexdigest()[:16]
    return f"planted-llm-layer-fault:{digest}"


def _bisect(tmp_path: Path, target: str, case: int) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "bisect"
    path = os.pathsep.join(filter(None, [str(CHILD), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "BUNDLERUN_HISTORY": "off", "BUNDLERUN_BUILD_TAG": _tag(), "PYTHONPATH": path}
    proc = subprocess.run([*PLANTED, "bisect", "llm:llama3", "--size", "tiny", "--target", target, "--case", str(case),
                           "--report", str(report)], capture_output=True, text=True, env=env, timeout=3600, cwd=tmp_path)
    assert (report / "report.json").is_file(), proc.stderr[-3000:]
    return proc, json.loads((report / "report.json").read_text())


def _assert_layer_found(proc: subprocess.CompletedProcess, result: dict, backend: str, case: int) -> dict:
    from bundlerun.runner.debug.bisect import search_bound

    assert proc.returncode == 1, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert result["outcome"] == "culprit" and len(result["culprits"]) == 1
    found = result["culprits"][0]
    assert len(found["units"]) == 1
    unit = found["units"][0]
    assert unit["module"].startswith(LAYER) and unit["backend"] == backend, unit
    # its place: the eager module stack and its index among the searched layers (wq, wk, wv, wo, w1, w3, w2 of
    # two layers, then the output projection)
    # (export_llama's Transformer > layers.1 (TransformerBlock); QNN's LlamaModel > layers.1 (LlamaDecoderLayer))
    assert " > layers.1 (" in unit["place"] and " > feed_forward (FeedForward) > " in unit["place"], unit["place"]
    n = len(result["units"])
    assert n == 15 and "delegated unit 14 of 15" in unit["place"], unit["place"]
    # the rest of the delegate (norms, rope, attention, cache) stays delegated in every candidate: not searched
    assert result["pinned"] and any("stay delegated in every candidate" in note for note in result["notes"])
    assert found["with"]["verdict"] == "FAIL" and found["without"]["verdict"] == "PASS"
    steps = result["steps"]
    assert [s["role"] for s in steps[:2]] == ["all", "none"] and steps[0]["verdict"] == "FAIL"
    assert steps[1]["verdict"] == "PASS"
    assert result["lowerings"] <= search_bound(n) == result["bound"]
    # a decode step: every candidate replays its sequence's earlier steps first, only this one is judged
    seq = result["sequence"]
    assert result["case"] == case and seq["prefix"] == list(range(case)) and seq["kind"] == "decode"
    for step in steps:
        ran = json.loads(Path(step["report"]).read_text())
        assert [c["case"] for c in ran["cases"]] == [*range(case), case]
    assert f"in {LAYER}" in proc.stdout
    return unit


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 8 export_llama Vulkan lowerings cold: about 11 min at load 11-16 (2026-12-05)
def test_bisect_llm_on_vulkan_lavapipe_names_the_planted_layer(tmp_path):
    """vulkan://lavapipe: the Vulkan partitioner takes the whole forward (KV cache included); each candidate
    leaves some linears to the portable kernels beside it (the lavapipe runner links them all)."""
    from bundlerun.bundles.bpte import read_bundle

    proc, result = _bisect(tmp_path, "vulkan://lavapipe", 3)
    unit = _assert_layer_found(proc, result, "VulkanBackend", 3)
    assert unit["module"] == f"{LAYER} (Linear)" and "self.w2(" in unit["source"]
    assert all(s["target"] == "vulkan://lavapipe" for s in result["steps"])
    none = next(s for s in result["steps"] if s["role"] == "none")
    assert none["delegate_calls"] > 1  # the delegate split around the linears left out
    control = read_bundle(none["bundle"]).manifest.build.lowering["partition_control"]
    assert not any(u["delegated"] for u in control["units"] if u["key"] in {v["key"] for v in result["units"]})


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_bisect_llm_on_qnn_htp_simulator_threads_the_kv_cache_in_every_replay(tmp_path):
    """qnn://htp-sim: QNN's static llama, its KV cache program I/O. Every candidate's replayed prefix runs on the
    cache that candidate's own earlier steps returned (threaded by bundlerun, as a plain run does)."""
    from qnn_helpers import require_simulator

    require_simulator()
    proc, result = _bisect(tmp_path, "qnn://htp-sim", 4)
    unit = _assert_layer_found(proc, result, "QnnBackend", 4)
    # static_llama.py:541: the FeedForward's 1x1 convolution made of w2
    assert unit["module"] == f"{LAYER}_conv (Conv2d)" and unit["op"] == "aten.convolution.default"
    assert all(s["target"] == "qnn://htp-sim" for s in result["steps"])  # nothing refused: QNN always delegates
    assert any("threaded by bundlerun" in note for note in result["notes"])
    for step in result["steps"]:
        ran = json.loads(Path(step["report"]).read_text())
        threaded = {c["case"]: (c.get("extra") or {}).get("kv_state_from_case") for c in ran["cases"]}
        assert threaded == {0: None, 1: 0, 2: 1, 3: 2, 4: 3}, threaded


def test_an_llm_bisect_searches_the_layers_with_weights_and_keeps_the_rest_delegated():
    """No lowering: the full build's record of a whole-forward delegate (as Vulkan's and QNN's are) split into
    the searched layers (innermost module nn.Linear / nn.Conv2d) and the pinned rest, whose roots every
    candidate's restriction adds."""
    from bundlerun.runner.debug.bisect import BisectRequest, BisectResult, Bisector

    def unit(key, *stack):
        return {"key": key, "roots": [key], "module_stack": [list(s) for s in stack], "op": "aten.mm.default"}

    block = ("layers.1", "executorch.examples.models.llama.llama_transformer.TransformerBlock")
    units = [unit("embedding", ("", "Transformer")),
             unit("ffn_out_1", block, ("layers.1.feed_forward.w2", "torch.nn.modules.linear.Linear")),
             unit("sdpa", block, ("layers.1.attention", "Attention")),
             unit("w2_conv", block, ("layers.1.feed_forward.w2_conv", "torch.nn.modules.conv.Conv2d"))]
    bisector = Bisector(BisectRequest(model="llm:llama3", target="vulkan://lavapipe", report_dir=Path("out")), None)
    bisector.result = BisectResult(model="llm:llama3", target="vulkan://lavapipe", backend="vulkan", dtype=None,
                                   method="forward", case=None, output=None, mechanism="", outcome="stopped")
    searched = bisector._searched(units)
    assert [u["key"] for u in searched] == ["ffn_out_1", "w2_conv"]
    assert [p["key"] for p in bisector.result.pinned] == ["embedding", "sdpa"]
    assert bisector.pinned_roots == {"embedding", "sdpa"}
    # not an LLM: every unit is searched, nothing pinned
    other = Bisector(BisectRequest(model="tiny-cnn", target="vulkan://lavapipe", report_dir=Path("out")), None)
    other.result = BisectResult(model="tiny-cnn", target="vulkan://lavapipe", backend="vulkan", dtype=None,
                                method="forward", case=0, output=None, mechanism="", outcome="stopped")
    assert other._searched(units) == units and not other.result.pinned
