"""`bundlerun bisect llm:ARCH`: the delegated layer that makes a step of an LLM's sequence fail.

Real components only: ExecuTorch's export_llama builds every candidate (its own XNNPACK partitioners,
restricted through the `to_edge_transform_and_lower` its builder imports), the host XNNPACK runtime
runs them. The fault is planted in the real lowering by tests/fixtures/planted_llm_fault.py (imported
by the CLI process): the XNNPACK preprocess gets layer 1's `feed_forward.w2` weight negated, so that
layer is wrong only when delegated. The planted runs set $BUNDLERUN_BUILD_TAG (part of the build-cache
key) so their candidates are cached apart from healthy builds; a warm re-run re-lowers nothing.
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
FIXTURE = ROOT / "tests" / "fixtures" / "planted_llm_fault.py"
PLANTED = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(FIXTURE.parent)!r}); import planted_llm_fault; "
           "from bundlerun.runner.cli import main; main()"]
LAYER = "layers.1.feed_forward.w2"


def _tag() -> str:
    return "planted-llm-fault:" + hashlib.sha256(FIXTURE.read_bytes()).hexdigest()[:16]


def _bisect(tmp_path: Path, name: str, *extra: str, target: str = "host://xnnpack") -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / name
    env = {**os.environ, "BUNDLERUN_HISTORY": "off", "BUNDLERUN_BUILD_TAG": _tag()}
    proc = subprocess.run([*PLANTED, "bisect", "llm:llama3", "--target", target, "--report", str(report),
                           *extra], capture_output=True, text=True, env=env, timeout=3600, cwd=tmp_path)
    path = report / "report.json"
    assert path.is_file(), proc.stderr[-3000:]
    return proc, json.loads(path.read_text())


def _assert_w2_culprit(proc: subprocess.CompletedProcess, result: dict) -> dict:
    from bundlerun.runner.debug.bisect import search_bound

    assert proc.returncode == 1, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert result["outcome"] == "culprit" and len(result["culprits"]) == 1
    found = result["culprits"][0]
    assert [u["module"] for u in found["units"]] == [f"{LAYER} (Linear)"]
    unit = found["units"][0]
    assert unit["op"] == "aten.linear.default" and unit["backend"] == "XnnpackBackend"
    assert "feed_forward.py:" in unit["source"] and "self.w2(" in unit["source"]
    # its place: the eager module stack and its index among the delegated linears (wq..w2 of two layers, output)
    assert unit["place"].startswith("Transformer > layers.1 (TransformerBlock) > feed_forward (FeedForward) > w2 (Linear)")
    n = len(result["units"])
    assert n == 15 and "delegated unit 14 of 15" in unit["place"]
    assert found["with"]["verdict"] == "FAIL" and found["without"]["verdict"] == "PASS"
    assert result["lowerings"] <= search_bound(n) == result["bound"]
    steps = result["steps"]
    assert [s["role"] for s in steps[:2]] == ["all", "none"] and steps[1]["verdict"] == "PASS"
    assert f"in {LAYER} (Linear)" in proc.stdout
    return unit


@pytest.mark.slow
def test_bisect_llm_names_the_planted_layer_at_the_first_diverging_step(tmp_path):
    """No --case: the full build runs every step, the first diverging one (the first prompt: layer 1 is
    wrong from the first token on) is bisected."""
    proc, result = _bisect(tmp_path, "first")
    _assert_w2_culprit(proc, result)
    assert result["case"] == 0 and result["sequence"]["name"] == "seq0" and result["sequence"]["prefix"] == []
    assert result["sequence"]["chosen"] is True
    assert any("first diverging step" in n for n in result["notes"])
    # every candidate is a real export_llama bundle whose manifest says what was delegated
    from bundlerun.bundles.bpte import read_bundle

    search = next(s for s in result["steps"] if s["role"] == "search")
    control = read_bundle(search["bundle"]).manifest.build.lowering["partition_control"]
    assert [u["key"] for u in control["units"] if u["delegated"]] == search["delegated"]


@pytest.mark.slow
def test_bisect_llm_decode_step_replays_its_prefix_from_the_build_cache(tmp_path):
    """--case 3 (a decode step of seq0): every candidate runs cases 0-2 first on the same loaded method, and
    only step 3 is judged. The candidates are the same lowerings as above: all from the build cache."""
    proc, result = _bisect(tmp_path, "decode", "--case", "3")
    _assert_w2_culprit(proc, result)
    seq = result["sequence"]
    assert result["case"] == 3 and seq["prefix"] == [0, 1, 2] and seq["kind"] == "decode" and seq["chosen"] is False
    assert "step 3 of sequence seq0 (decode at position" in proc.stdout and "3 earlier step(s) replayed" in proc.stdout
    for step in result["steps"]:
        ran = json.loads(Path(step["report"]).read_text())
        assert [c["case"] for c in ran["cases"]] == [0, 1, 2, 3]  # the prefix ran first, on the same method
    assert {s["cache"] for s in result["steps"]} <= {"hit", "miss"}


def test_bisect_request_takes_llm_models_and_refuses_llm_options_elsewhere():
    from bundlerun.bundles.llm_build import LlmOptions
    from bundlerun.runner.debug.bisect import BisectError, BisectRequest, check_request

    check_request(BisectRequest(model="llm:llama3", target="host://xnnpack", report_dir=Path("out"), case=40))
    with pytest.raises(BisectError) as info:
        check_request(BisectRequest(model="tiny-cnn", target="host://xnnpack", report_dir=Path("out"),
                                    llm=LlmOptions(size="small")))
    assert "\n" not in str(info.value) and "llm:ARCH" in str(info.value)
    with pytest.raises(BisectError):  # not an LLM: --case is still bounded by --cases
        check_request(BisectRequest(model="tiny-cnn", target="host://xnnpack", report_dir=Path("out"), case=8))


def test_unit_place_reads_the_module_stack():
    from bundlerun.runner.debug.bisect import unit_place

    stack = [["", "executorch.examples.models.llama.llama_transformer.Transformer"],
             ["layers.1", "executorch.examples.models.llama.llama_transformer.TransformerBlock"],
             ["layers.1.feed_forward", "executorch.examples.models.llama.feed_forward.FeedForward"],
             ["layers.1.feed_forward.w2", "torch.nn.modules.linear.Linear"]]
    units = [{"key": "a"}, {"key": "b", "module_stack": stack}, {"key": "c"}]
    assert unit_place(units[1], units) == ("Transformer > layers.1 (TransformerBlock) > feed_forward (FeedForward) > "
                                           "w2 (Linear); delegated unit 2 of 3 in graph order")
    assert unit_place({"key": "z"}, units) == ""


def test_build_tag_separates_cache_keys(monkeypatch):
    """$BUNDLERUN_BUILD_TAG is part of the build-cache key: a patched lowering is never served a healthy entry."""
    from bundlerun.bundles import build_cache
    from bundlerun.bundles.builder import BuildRequest

    req = BuildRequest(model="tiny-cnn", output=Path("x.bpte"), backend="xnnpack", target="host://xnnpack")
    monkeypatch.delenv("BUNDLERUN_BUILD_TAG", raising=False)
    plain = build_cache.cache_key(build_cache.key_material(req, "xnnpack", "fp32", "eager-fp32"))
    monkeypatch.setenv("BUNDLERUN_BUILD_TAG", "planted")
    tagged = build_cache.cache_key(build_cache.key_material(req, "xnnpack", "fp32", "eager-fp32"))
    assert plain != tagged


def test_bisect_help_offers_the_llm_options():
    proc = subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", "bisect", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "--size" in proc.stdout and "llm:ARCH" in proc.stdout
