"""llm:ARCH on mlx://cpu: export_llama's own MLX path (`backend.mlx`: `_to_edge_and_lower_llama_mlx` after
the MLX attention / KV-cache / RMSNorm source transforms, examples/models/llama/export_llama_lib.py:1325,
2161-2171; backends/mlx/examples/llm/README.md points ExecuTorch's llama there) run step by step on
ExecuTorch's REAL C++ MLX delegate (backends/mlx/runtime in executor_runner, on the mlx wheel's libmlx).

The runner serves the whole bundle and each trigger names the case (the server-testset patch,
firmware_scripts/mlx/build_mlx_runner.sh): one process, one loaded method, the sequence's cases in
order, so the KV cache in the method carries from step to step. No double: a runner without the patch,
or none, FAILS these tests naming the build command. Builds go through the build cache (a cold
export is 50-110 s here, a warm one a copy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow
TARGET = "mlx://cpu"
STEPS = 15  # tiny: 3 sequences (prompts of 3, 9, 24 tokens) x (prompt + 4 decode steps)


@pytest.fixture(scope="module")
def runner() -> Path:
    from bundlerun.targets.mlx_runner import BUILD_COMMAND, default_runner, runner_record

    found = default_runner()
    if found is None or runner_record(found).get("server_testset") is not True:
        pytest.fail(f"no MLX executor_runner with the server-testset patch in the runner cache ({found}): "
                    f"scripts/setup.sh builds it ({BUILD_COMMAND})")
    return found


def _build(tmp: Path, arch: str, dtype: str) -> Path:
    from bundlerun.bundles.builder import BuildRequest, build_bundle
    from bundlerun.bundles.llm_build import LlmOptions

    path = tmp / f"{arch}-tiny-mlx-{dtype}.bpte"
    build_bundle(BuildRequest(model=f"llm:{arch}", output=path, backend="mlx", target=TARGET, dtype=dtype,
                              cache=True, llm=LlmOptions(size="tiny")))
    return path


def _run(path: Path, report: Path, query: str = "") -> tuple[int, dict, str]:
    res = run_cli("run", str(path), "--target", TARGET + query, "--report", str(report), "--no-history")
    data = json.loads((report / "report.json").read_text()) if (report / "report.json").is_file() else {}
    return res.returncode, data, res.stdout + res.stderr


def _served_in_order(report_dir: Path) -> None:
    log = (report_dir / "work" / "mlx-runner" / "forward-served" / "server-1.log").read_text()
    assert log.count("Model loaded in") == 1  # one program load, one method for all 15 steps
    assert [int(line.rsplit(" ", 1)[1]) for line in log.splitlines() if "Loading bundled test set" in line] \
        == list(range(STEPS))


@pytest.mark.parametrize("arch", ["qwen3", "llama3"])
def test_fp32_every_step_passes_on_one_served_method(runner, tmp_path, arch):
    path = _build(tmp_path, arch, "fp32")
    from bundlerun.bundles.bpte import read_bundle

    m = read_bundle(path).manifest_json
    assert m["build"]["backend"] == "mlx" and m["build"]["lowering"]["exporter"] == "export_llama"
    assert m["build"]["lowering"]["delegate"] == "mlx"
    code, report, said = _run(path, tmp_path / "r")
    assert code == 0, said[-3000:]
    assert report["target"]["info"]["runner_mode"] == {
        "forward": f"executor_runner --server_mode: one process for {STEPS} case(s)"}
    assert [c["verdict"] for c in report["cases"]] == ["PASS"] * STEPS
    _served_in_order(tmp_path / "r")
    sqnr = [s["sqnr"] for seq in report["sequences"] for s in seq["steps"]]
    # MLX's fp32 op-test bound (1e-5) on logits of about +-1: above 100 dB, and not "exact" (not copied back)
    assert all(isinstance(x, float) and 100 < x < 200 for x in sqnr), sqnr
    assert all(s["argmax_match"] for seq in report["sequences"] for s in seq["steps"])
    for seq in report["sequences"]:
        assert seq["verdict"] == "PASS" and seq["greedy_agreement"] == 5
    assert "seq2" in said and "decode" in said  # the per-step table is printed
    print(arch, "fp32 per-step SQNR (dB):", [round(x, 1) for x in sqnr])


def test_validate_is_the_issues_done_means(runner, tmp_path):
    """`bundlerun validate llm:qwen3 --size tiny --target mlx://cpu`: the backend and dtype are the target's own."""
    res = run_cli("validate", "llm:qwen3", "--size", "tiny", "--target", TARGET, "--report", str(tmp_path / "v"),
                  "--no-history")
    said = res.stdout + res.stderr
    assert res.returncode == 0, said[-3000:]
    reports = list((tmp_path / "v").rglob("report.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert report["bundle"]["backend"] == "mlx" and report["bundle"]["dtype"] == "fp32"
    assert [s["verdict"] for seq in report["sequences"] for s in seq["steps"]] == ["PASS"] * STEPS
    assert "first divergence" in said or "PASS" in said


def test_a_lane_forced_to_a_fresh_method_per_case_refuses(runner, tmp_path):
    path = _build(tmp_path, "qwen3", "fp32")
    code, report, said = _run(path, tmp_path / "alone", "?server=false")
    assert code == 2, said[-3000:]
    errors = {c.get("error_kind") for c in report["cases"]}
    assert errors == {"bad-config"}, errors
    assert "server=false" in said and "fresh" in said
    assert not (tmp_path / "alone" / "work" / "mlx-runner").exists()  # refused before any process started


def test_4w_runs_every_step_on_one_served_method(runner, tmp_path):
    path = _build(tmp_path, "qwen3", "4w")
    code, report, said = _run(path, tmp_path / "q")
    assert code in (0, 1), said[-3000:]  # a numerical verdict, never "could not run"
    assert [c["status"] for c in report["cases"]] == ["ok"] * STEPS
    _served_in_order(tmp_path / "q")
    sqnr = [s["sqnr"] for seq in report["sequences"] for s in seq["steps"]]
    print("qwen3 4w per-step SQNR (dB):", sqnr, "verdicts:", [c["verdict"] for c in report["cases"]])


def test_the_interpreter_runtime_refuses_a_sequence_in_one_line(runner, tmp_path):
    path = _build(tmp_path, "qwen3", "fp32")
    code, report, said = _run(path, tmp_path / "i", "?runtime=interpreter")
    assert code == 2, said[-3000:]
    assert {c.get("error_kind") for c in report["cases"]} == {"bad-config"}
    assert "runtime=interpreter" in said and "upper-bound" in said
