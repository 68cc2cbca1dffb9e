"""One LLM bundle-set across lanes (issue 37 items 2 and 3): `bundlerun compare` lines up the steps of
llm:qwen3 tiny (same seeded weights, same prompts) lowered by each lane's own backend and run on the
real runtimes: host://xnnpack (export_llama's XNNPACK path, pybindings), qnn://htp-sim (QNN's static
llama on Qualcomm's HTP simulator, one token a step) and mlx://cpu (export_llama's MLX path on
ExecuTorch's C++ MLX delegate, the served runner of build_mlx_runner.sh); and `--replay N` on a sequence re-runs the whole sequence in order and
says per step whether the logits changed. No double: a lane whose runtime is missing FAILS here
(scripts/setup.sh installs them). Builds go through the build cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow
LANES = {"host://xnnpack": ("xnnpack", "fp32"), "qnn://htp-sim": ("qnn", "fp16"), "mlx://cpu": ("mlx", "fp32")}

@pytest.fixture(scope="module")
def require_simulator_first():
    from qnn_helpers import require_simulator

    require_simulator()

@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    from bundlerun.bundles.builder import BuildRequest, build_bundle
    from bundlerun.bundles.llm_build import LlmOptions

    root = tmp_path_factory.mktemp("lanes")
    out: dict[str, Path] = {}
    for url, (backend, dtype) in LANES.items():
        name = url.split(":")[0]
        path = root / f"qwen3-{name}.bpte"
        build_bundle(BuildRequest(model="llm:qwen3", output=path, backend=backend, target=url, dtype=dtype, cache=True,
                                  llm=LlmOptions(size="tiny")))
        res = run_cli("run", str(path), "--target", url, "--report", str(root / name), "--no-history")
        assert res.returncode == 0, (url, (res.stdout + res.stderr)[-2000:])
        out[url] = root / name / "report.json"
    return out

def test_one_bundle_set_across_lanes_is_one_per_step_table(require_simulator_first, reports):
    runs = [str(reports[url]) for url in LANES]
    data = json.loads(Path(runs[0]).read_text())
    sets = {json.loads(Path(r).read_text())["bundle"]["sequence_set"] for r in runs}
    assert len(sets) == 1  # same model, params, weights, seed and prompt tokens whatever the lowering
    res = run_cli("compare", *runs, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    table = json.loads(res.stdout)
    assert [lane["target"] for lane in table["lanes"]] == list(LANES)
    assert [lane["backend"] for lane in table["lanes"]] == ["xnnpack", "qnn", "mlx"]
    # export_llama's lanes: a prompt in one step (15 steps); QNN's static llama one token a step (48)
    assert [lane["steps"] for lane in table["lanes"]] == [15, 48, 15]
    rows = {(r["sequence"], r["position"]): r["lanes"] for r in table["rows"]}
    assert len(rows) == 48  # every position QNN judged; export_llama's lanes have 15 of them
    shared = [k for k, lanes in rows.items() if all(s is not None for s in lanes)]
    assert len(shared) == 15
    # export_llama's XNNPACK and MLX lanes share one eager reference: the same token at every step
    assert all(rows[k][0]["reference_token"] == rows[k][2]["reference_token"] for k in shared)
    # QNN's eager static llama (same weights, linears as convolutions) may split a near-tie of the seeded
    # model's flat logits with export_llama's eager model (seq0 pos 6 in one run: 500 vs 151; a split decode token then feeds different tokens to the
    # later steps of each lane): the `ref` column
    # shows it as `500|151`.
    agree = sum(1 for key in shared if len({s["reference_token"] for s in rows[key]}) == 1)
    print(f"reference tokens agree on {agree}/{len(shared)} shared positions")
    by_key = {(r["sequence"], r["position"]): r["reference"] for r in table["rows"]}
    assert all(("|" in by_key[k]) == (len({s["reference_token"] for s in rows[k]}) > 1) for k in shared)
    assert data["sequences"][0]["steps"][0]["start_pos"] == 0
    console = run_cli("compare", *runs)
    said = console.stdout + console.stderr
    assert console.returncode == 0, said
    for url in LANES:
        assert url in said
    assert "15/15 steps PASS" in said and "48/48 steps PASS" in said

def test_runs_of_different_bundle_sets_are_refused_in_one_line(require_simulator_first, reports, tmp_path):
    other = json.loads(reports["qnn://htp-sim"].read_text())
    other["bundle"]["sequence_set"] = "0" * 64
    path = tmp_path / "other.json"
    path.write_text(json.dumps(other))
    res = run_cli("compare", str(reports["host://xnnpack"]), str(reports["mlx://cpu"]), str(path))
    assert res.returncode == 2
    assert "different bundle-sets" in res.stderr and len(res.stderr.strip().splitlines()) == 1

def test_replay_reruns_the_whole_sequence_and_says_per_step_whether_logits_changed(require_simulator_first, reports,
                                                                                    tmp_path):
    bundle = reports["host://xnnpack"].parent.parent / "qwen3-host.bpte"
    res = run_cli("run", str(bundle), "--target", "host://xnnpack", "--replay", "3", "--report", str(tmp_path / "r"),
                  "--no-history")
    said = res.stdout + res.stderr
    assert res.returncode == 0, said[-3000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    # host:// has its own in-process replay loop; a stateful sequence never uses it (a step replayed alone
    # would run on the cache its first run left): two more whole runs, each from every sequence's prompt
    assert report["replay"]["mode"] == "whole-sequence"
    assert all((tmp_path / "r" / "work" / f"replay-{k}").is_dir() for k in (1, 2))
    for seq in report["sequences"]:
        assert "replay on host://xnnpack" in seq["replay"] and "0/5 steps' logits changed" in seq["replay"]
        assert all(s["replay"] == {"runs": 3, "distinct": 1, "spread": 0.0, "changed": False} for s in seq["steps"])
    assert "same x3" in said

def test_a_step_whose_logits_changed_is_named_with_its_lane(require_simulator_first, reports):
    """The per-step mapping of replay.py on a real report: one step's logits given a second distinct result."""
    from bundlerun.runner.judging.replay import lane_name, step_replay
    from bundlerun.runner.report.model import read_report
    from bundlerun.runner.report.sequences import text_lines

    report = read_report(reports["host://xnnpack"])
    case = report.sequences[1].steps[2].case
    for c in report.cases:
        c.outputs[0].replay = {"runs": 3, "distinct": 2 if c.case == case else 1, "spread": 1.5e-6 if c.case == case else 0.0}
    step_replay(report, {"mode": "whole-sequence"}, lane_name("vulkan://lavapipe", {"driver": {"devices": [
        {"name": "llvmpipe (LLVM 19.1.7, 256 bits)", "driver_name": "llvmpipe", "driver_info": "Mesa 25.0.7"}]}}))
    seq = report.sequences[1]
    assert seq.steps[2].replay == {"runs": 3, "distinct": 2, "spread": 1.5e-6, "changed": True}
    assert "1/5 steps' logits changed (first at step 2)" in seq.replay and "Mesa 25.0.7" in seq.replay
    assert any("changed: 2 distinct in 3, spread 1.5e-06" in line for line in text_lines(seq))
    assert "0/5 steps' logits changed" in report.sequences[0].replay
