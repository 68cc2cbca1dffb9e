"""Perf figures on the fvp:// lane (issue 17): `bundlerun run X --target fvp://...` carries the Arm
runner's cycle, PMU and memory figures per case, and `--baseline` catches a cycle regression.

No Ethos-U FVP runs on this machine: these tests use the FVP test double (tests/doubles/fvp),
installed under the real FVP binary names, wired as tests/test_fvp_target.py wires it (its
fixtures are reused). The double prints, after each inference, the lines the real
arm_executor_runner prints for an Ethos-U build (StopMeasurements() in arm_perf_monitor.cpp,
log_mem_status() in arm_executor_runner.cpp; checked here against those sources' format strings),
with synthetic cycle counts proportional to the program's size and a double-only knob,
BUNDLERUN_FVP_CYCLE_SCALE, that scales them to fake a regression.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bundlerun.bundles.bpte import read_bundle
from bundlerun.targets.base import CaseStatus
from tests.conftest import run_cli
from tests.test_fvp_target import U55, U85, _run, bundle, bundle_path, fvp_env  # noqa: F401  (fixtures)
from bundlerun.bundles.cache_dirs import cache_root
from tests.test_perf import SRC, _c_formats

CYCLE_FIGURES = ("inference_cpu_cycles", "ethosu_backend_cpu_cycles", "operators_cpu_cycles",
                 "cpu_wait_for_npu_cycles", "npu_active_cycles")
PMU = {
    "u55": ["axi0_rd_data_beat_received", "axi1_rd_data_beat_received", "axi0_wr_data_beat_written", "npu_idle"],
    "u85": ["sram_rd_data_beat_received", "sram_wr_data_beat_written", "ext_rd_data_beat_received",
            "ext_wr_data_beat_written", "npu_idle", "mac_active", "wd_active"],
}


def _figs(case: dict) -> dict[str, dict]:
    return {f["name"]: f for f in case["perf"]}


def _format_regex(fmt: str) -> re.Pattern:
    """A C format string (as tests.test_perf._c_formats joins it) as a regex for its printed line.
    `% lu` is an unsigned conversion with the space flag, which printf ignores for unsigned values."""
    out = []
    for piece in re.split(r"(%%|% ?l*[du]|%zd|%\.2f|%f)", fmt):
        if piece == "%%":
            out.append("%")
        elif piece in ("%.2f", "%f"):
            out.append(r"-?\d+\.\d+")
        elif piece.startswith("%"):
            out.append(r"\d+")
        else:
            out.append(re.escape(piece))
    return re.compile("".join(out) + "$")


@pytest.mark.parametrize("url,variant", [(U55, "u55"), (U85, "u85")])
def test_double_prints_the_real_runner_perf_and_memory_lines(url, variant, bundle, bundle_path, fvp_env):
    """Every StopMeasurements() / log_mem_status() line the double prints is one of the real format
    strings; the PMU counters are the 4 (U55) or 7 (U85) the real runner programs."""
    assert SRC, f"ExecuTorch sources not extracted in {cache_root() / 'src'} (scripts/setup.sh)"
    runner_dir = SRC[0] / "examples/arm/executor_runner"
    perf_formats = [_format_regex(f) for f in _c_formats(runner_dir / "arm_perf_monitor.cpp")]
    runner_formats = [_format_regex(f) for f in _c_formats(runner_dir / "arm_executor_runner.cpp")]
    run = _run(url, bundle, bundle_path, fvp_env, cases=[0])
    (case,) = run.cases
    assert case.status is CaseStatus.OK, case.error
    log = Path(case.log_path).read_text()
    perf_lines = re.findall(r"^I \[executorch:arm_perf_monitor\.cpp:\d+ StopMeasurements\(\)\] (.*)$", log, re.M)
    mem_lines = re.findall(r"^I \[executorch:arm_executor_runner\.cpp:\d+ log_mem_status\(\)\] (.*)$", log, re.M)
    assert len(perf_lines) == 13 + len(PMU[variant]) and len(mem_lines) == 9
    for line in perf_lines:
        assert any(r.match(line) for r in perf_formats), line
    for line in mem_lines:
        assert any(r.match(line) for r in runner_formats), line
    events = perf_lines[-1]
    assert events == "Ethos-U PMU Events:[" + ", ".join(f"ETHOSU_PMU_{e.upper()}" for e in PMU[variant]) + "]"
    # ...and it is the runner's own line for this NPU, verbatim
    assert events in [f for f in _c_formats(runner_dir / "arm_perf_monitor.cpp") if f.startswith("Ethos-U PMU")]
    figs = {f.name: f for f in case.perf}
    program = len(read_bundle(bundle_path).program)
    assert figs["inference_cpu_cycles"].value == 32 * program  # deterministic: proportional to the program
    assert figs["npu_active_cycles"].value == 24 * program
    assert [n.removeprefix("npu_pmu_") for n in figs if n.startswith("npu_pmu_")] == PMU[variant]
    assert figs["pte_program_size"].value == program


def test_double_without_ethos_u_prints_no_cycles(bundle, bundle_path, fvp_env, monkeypatch):
    """BUNDLERUN_FVP_ETHOSU=0 (a Cortex-M only runner): no cycle block, so no cycle figure at all
    (absent, not 0); the memory figures are still there."""
    monkeypatch.setenv("BUNDLERUN_FVP_ETHOSU", "0")
    run = _run("fvp://corstone-300/cortex-m55", bundle, bundle_path, fvp_env, cases=[0])
    (case,) = run.cases
    assert case.status is CaseStatus.OK, case.error
    names = {f.name for f in case.perf}
    assert not [n for n in names if "cycles" in n or n.startswith("npu_")]
    assert {"method_allocator_used", "pte_program_size"} <= names


def _cli_run(bundle_path: Path, elf: Path, report: Path, *extra: str, scale: str | None = None):
    env = {"BUNDLERUN_FVP_CYCLE_SCALE": scale} if scale else {}
    return run_cli("run", str(bundle_path), "--target", U55, "--runner-elf", str(elf), "--report", str(report),
                   "--no-history", *extra, env=env, cwd=report.parent)


def test_cli_fvp_run_carries_perf_and_baseline_catches_a_cycle_regression(bundle_path, fvp_env, monkeypatch):
    monkeypatch.delenv("BUNDLERUN_FVP_CYCLE_SCALE", raising=False)
    tmp, elf = fvp_env["tmp"], fvp_env["elf"]
    # (1) the report's cases carry the runner's CPU, NPU and PMU figures, labelled as simulation
    res = _cli_run(bundle_path, elf, tmp / "base")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    base = json.loads((tmp / "base" / "report.json").read_text())
    assert len(base["cases"]) == 2
    for case in base["cases"]:
        figs = _figs(case)
        for name in CYCLE_FIGURES:
            assert figs[name]["kind"] == "simulation-cycles" and figs[name]["unit"] == "cycles", figs[name]
            assert figs[name]["value"] > 0 and figs[name]["per_inference"] == figs[name]["value"]
        for name in PMU["u55"]:
            assert figs[f"npu_pmu_{name}"]["kind"] == "simulation-counter"
        assert figs["npu_pmu_npu_idle"]["unit"] == "cycles"
        assert figs["npu_pmu_axi0_rd_data_beat_received"]["unit"] == "beats"
        assert figs["inference_npu_ratio"]["kind"] == "ratio" and figs["npu_delegations"]["value"] == 1
        assert figs["method_allocator_used"]["kind"] == "memory"
    # deterministic: every case runs the same program, so the same figures (the host's clock aside)
    printed = [[(f["name"], f["value"]) for f in c["perf"] if f["kind"] != "host-wall"] for c in base["cases"]]
    assert printed[0] == printed[1]
    base_cycles = _figs(base["cases"][0])["inference_cpu_cycles"]["value"]

    # (2) cycles +10% against the first run: exit 1, the figure named in report.json and summary.md
    res = _cli_run(bundle_path, elf, tmp / "slow", "--baseline", str(tmp / "base" / "report.json"), scale="1.10")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    assert "REGRESSION cycles-regression: forward.inference_cpu_cycles" in res.stdout
    slow = json.loads((tmp / "slow" / "report.json").read_text())
    assert slow["summary"]["verdict"] == "PASS" and slow["summary"]["exit_code"] == 1  # numerics fine, cycles not
    regs = {r["where"]: r for r in slow["regressions"]}
    assert regs["forward.inference_cpu_cycles"]["rule"] == "cycles-regression"
    assert regs["forward.inference_cpu_cycles"]["baseline"] == base_cycles
    assert regs["forward.inference_cpu_cycles"]["current"] == round(base_cycles * 1.10)
    assert {r["rule"] for r in slow["regressions"]} == {"cycles-regression"}  # memory did not move
    assert "forward.npu_active_cycles" in regs and "forward.npu_pmu_npu_idle" in regs
    rows = {r["name"]: r for r in slow["baseline"]["perf"]}
    row = rows["inference_cpu_cycles"]
    assert row["gate"] == "cycles" and row["kind"] == "simulation-cycles"
    assert row["change"] == pytest.approx(0.10, abs=1e-4) and row["limit"] == 0.05
    assert rows["method_allocator_used"]["change"] == 0
    summary = (tmp / "slow" / "summary.md").read_text()
    assert "inference\\_cpu\\_cycles" in summary and "cycles-regression" in summary

    # (3) +2% stays within the 5% threshold: exit 0, no regression, the change still reported
    res = _cli_run(bundle_path, elf, tmp / "near", "--baseline", str(tmp / "base" / "report.json"), scale="1.02")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    near = json.loads((tmp / "near" / "report.json").read_text())
    assert near["regressions"] == []
    row = {r["name"]: r for r in near["baseline"]["perf"]}["inference_cpu_cycles"]
    assert row["gate"] == "cycles" and row["change"] == pytest.approx(0.02, abs=1e-4)
