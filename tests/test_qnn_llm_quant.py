"""llm:llama3 and llm:qwen3 tiny `--dtype 16a4w` on qnn://htp-sim: QNN's static llama quantized with the
recipe QNN's own config names for the architecture (examples/qualcomm/oss_scripts/llama/__init__.py ->
static_llm_quant_recipe.py: Llama3_1BQuantRecipe, Qwen3_0_6BQuantRecipe), calibrated on the bundle's
steps, lowered by ExecuTorch's real Qualcomm AOT and run step by step on Qualcomm's REAL HTP simulator
(QNN 2.49.40), the KV cache threaded by bundlerun. The logits are judged by the SQNR floor QNN's
TestExampleLLMScript holds that config to (test_qnn_delegate.py:8775 / :8807). No double: a missing
simulator FAILS these tests. Builds go through the build cache (cold about 85 s each here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from qnn_helpers import require_simulator

TARGET = "qnn://htp-sim"
FLOOR = {"llama3": 15.0, "qwen3": 7.0}  # test_qnn_delegate.py:8775 (llama3_2-1b_instruct), :8807 (qwen3-0_6b)


def _build(arch: str, folder: Path) -> Path:
    from bundlerun.bundles.builder import BuildRequest, build_bundle
    from bundlerun.bundles.llm_build import LlmOptions

    path = folder / f"{arch}-tiny-16a4w.bpte"
    build_bundle(BuildRequest(model=f"llm:{arch}", output=path, backend="qnn", target=TARGET, dtype="16a4w",
                              cache=True, llm=LlmOptions(size="tiny")))
    return path


@pytest.fixture(scope="module")
def llama3(tmp_path_factory) -> Path:
    require_simulator()
    return _build("llama3", tmp_path_factory.mktemp("qnn-llm-q"))


def _run(path: Path, report: Path) -> tuple[int, dict, str]:
    res = run_cli("run", str(path), "--target", TARGET, "--report", str(report), "--no-history")
    data = json.loads((report / "report.json").read_text()) if (report / "report.json").is_file() else {}
    return res.returncode, data, res.stdout + res.stderr


def _check(path: Path, arch: str, report_dir: Path) -> None:
    from bundlerun.bundles.bpte import read_bundle

    m = read_bundle(path).manifest_json
    recipe = {"llama3": "Llama3_1BQuantRecipe", "qwen3": "Qwen3_0_6BQuantRecipe"}[arch]
    assert m["build"]["dtype"] == "16a4w" and m["build"]["lowering"]["precision"] == "quantized"
    assert recipe in m["build"]["llm"]["quantization"]
    out0 = next(o for o in m["methods"]["forward"]["outputs"] if o["name"] == "out0")
    assert out0["criteria"]["sqnr_min_db"] == FLOOR[arch], out0["criteria"]
    code, report, said = _run(path, report_dir)
    assert code == 0, said
    assert [c["verdict"] for c in report["cases"]] == ["PASS"] * 48
    assert all(s["verdict"] == "PASS" for s in report["sequences"])
    assert all(s["state"].startswith("KV cache threaded by bundlerun") for s in report["sequences"])
    sqnr = [o["stats"]["sqnr"] for c in report["cases"] for o in c["outputs"] if o["name"] == "out0"]
    # quantized for real: above QNN's floor, far below the fp16 build's 58-64 dB
    assert FLOOR[arch] <= min(sqnr) and max(sqnr) < 50, sqnr


def test_llama3_16a4w_passes_qnns_own_floor_on_every_step(llama3, tmp_path):
    _check(llama3, "llama3", tmp_path)


def test_qwen3_16a4w_passes_qnns_own_floor_on_every_step(tmp_path):
    require_simulator()
    _check(_build("qwen3", tmp_path), "qwen3", tmp_path / "report")


def test_a_16a4w_step_below_qnns_floor_fails(llama3, tmp_path):
    """The same program judged with out0's floor raised to 45 dB (above every step's measured SQNR):
    the logits of every step FAIL, so the floor is what decides the verdict, not a formality."""
    res = run_cli("run", str(llama3), "--target", TARGET, "--report", str(tmp_path), "--no-history",
                  "--override", "forward.out0.sqnr_min_db=45")
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    logits = [next(o for o in c["outputs"] if o["name"] == "out0") for c in report["cases"]]
    assert all(o["verdict"] == "FAIL" for o in logits)


def test_other_quantized_dtypes_are_refused_in_one_line(tmp_path):
    res = run_cli("build", "llm:llama3", "--size", "tiny", "--target", TARGET, "--dtype", "int8",
                  "-o", str(tmp_path / "x.bpte"))
    assert res.returncode == 2 and "bundlerun builds fp16, 16a4w" in res.stderr, res.stderr
    assert len([ln for ln in res.stderr.splitlines() if ln.strip()]) == 1, res.stderr
