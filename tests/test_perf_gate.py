"""The performance gate (issue 17, items 3 and 4): perf figures against a baseline, thresholds from
`[perf]`, a regression is exit 1 and named in every report format, a figure on one side only is a
note, history stores the figures and `trend` plots them, `--repeat N` gives N warm samples.

Figures come from the real parsers fed the runners' printed formats (arm_executor_runner's
`Inference runtime: N CPU cycles total`, executor_runner's `Iteration i of N: X ms`), and the live
tests run the real arm_executor_runner on qemu-system-arm and the real executor_runner under
qemu-aarch64."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET

import pytest

from bundlerun.bundles.errors import ConfigError
from bundlerun.runner.history.regression import (
    PerfRules, check_baseline, comparison_notes, find_regressions, format_regressions, perf_deltas,
)
from bundlerun.runner.report.model import Report
from bundlerun.targets.arm.perf import arm_runner_figures
from bundlerun.targets.base import PerfFigure
from bundlerun.targets.et_runner.executor_runner import executions_for, perf_figures, runner_args
from tests.conftest import run_cli
from tests.report_samples import make_bundle, make_report, target_run

ARM = "I [executorch:arm_perf_monitor.cpp:150 StopMeasurements()] "
MEM = "I [executorch:arm_executor_runner.cpp:700 log_mem_status()] "


def _arm_log(cycles: int, npu: int | None = None, method_used: int = 2276, method_size: int = 67108864,
             inferences: int = 1) -> str:
    """An arm_executor_runner log in the format it prints (arm_perf_monitor.cpp, log_mem_status)."""
    lines = [ARM + f"NPU Inferences : {inferences}",
             ARM + f"Inference runtime: {cycles} CPU cycles total ({cycles / inferences:.2f} per inference)"]
    if npu is not None:
        lines.append(ARM + f"ethosu_pmu_cycle_cntr : {npu} ({npu / inferences:.2f} per inference)")
    lines += [MEM + f"method_allocator_used: {method_used} / {method_size}  free: {method_size - method_used} "
                    f"( used: {method_used * 100 / method_size:.2f} % ) "]
    return "\n".join(lines) + "\n"


def _exec_log(iterations: list[float]) -> str:
    """An executor_runner log (posix PAL) with one `Iteration i of N` line per execution."""
    n = len(iterations)
    lines = ["I 00:00:00.025927 executorch:executor_runner.cpp:624] Model loaded in 8.261225 ms."]
    lines += [f"I 00:00:00.031082 executorch:executor_runner.cpp:779] Iteration {i} of {n}: {ms:.6f} ms"
              for i, ms in enumerate(iterations, 1)]
    lines.append(f"I 00:00:00.032061 executorch:executor_runner.cpp:789] Model executed successfully {n} time(s) "
                 f"in {sum(iterations):.6f} ms.")
    return "\n".join(lines) + "\n"


def _report(url: str, figures, label: str = "r") -> Report:
    """A real judged report (tests.report_samples) whose cases carry `figures(case_index)`, read as a
    report.json is."""
    bundle = make_bundle(cases=3)
    run = target_run(bundle)
    run.target = url
    for case in run.cases:
        case.add_perf(figures(case.case_index))
    report = make_report(bundle, run, label=label)
    report["run"]["id"] = f"{label}-{url}"
    return Report.from_json(report)


def _arm_report(cycles=(100_000, 101_000, 99_000), label="base", **kw) -> Report:
    return _report("fvp://corstone-300/ethos-u55-128",
                   lambda i: arm_runner_figures(_arm_log(cycles[i], **kw), simulated=True), label)


def _names(regs) -> list[tuple[str, str]]:
    return [(r.rule, r.where) for r in regs]


# ----------------------------------------------------------------------------------------- the gate


def test_cycle_rise_past_the_threshold_is_a_regression_naming_the_figure():
    base = _arm_report()
    same = _arm_report(label="same")
    assert find_regressions(base, same) == []
    up4 = _arm_report(cycles=(104_000, 105_040, 102_960), label="up4")  # +4%: under the 5% default
    assert find_regressions(base, up4) == []
    up8 = _arm_report(cycles=(108_000, 109_080, 106_920), label="up8")  # +8%
    regs = find_regressions(base, up8)
    assert _names(regs) == [("cycles-regression", "forward.inference_cpu_cycles")]
    assert regs[0].baseline == 100_000 and regs[0].current == 108_000 and regs[0].limit == 0.05
    assert "inference_cpu_cycles" in regs[0].message and "+8.00% > 5%" in regs[0].message
    assert "[simulation-cycles]" in regs[0].message
    # a fall is an improvement, never a regression
    assert find_regressions(up8, base) == []


def test_thresholds_come_from_the_perf_section():
    base, up8 = _arm_report(), _arm_report(cycles=(108_000, 109_080, 106_920), label="up8")
    loose = PerfRules.from_config({"perf": {"cycles_regression": 0.10}})
    assert find_regressions(base, up8, perf_rules=loose) == []
    off = PerfRules.from_config({"perf": {"gate_cycles": False}})
    assert find_regressions(base, up8, perf_rules=off) == []
    tight = PerfRules.from_config({"perf": {"cycles_regression": 0.01}})
    assert _names(find_regressions(base, _arm_report(cycles=(102_000, 103_020, 100_980), label="up2"),
                                   perf_rules=tight)) == [("cycles-regression", "forward.inference_cpu_cycles")]


def test_a_figure_on_one_side_only_is_a_note_not_a_failure():
    base = _arm_report(npu=50_000)
    cur = _arm_report(label="cur")  # this runner printed no NPU cycle counter
    assert find_regressions(base, cur) == []
    assert perf_deltas(base, cur)[1] == []
    notes = comparison_notes(base, cur)
    assert any("npu_active_cycles" in n and "only in the baseline" in n for n in notes), notes
    notes = comparison_notes(cur, base)
    assert any("npu_active_cycles" in n and "only in the current run" in n for n in notes), notes
    # a baseline from before figures were collected: one note, no failure
    old = copy.deepcopy(base)
    for case in old.cases:
        case.perf = []
    assert find_regressions(old, cur) == []
    assert [n for n in comparison_notes(old, cur) if "perf" in n] == [
        # inferences, inference_cpu_cycles, method_allocator_used, method_allocator_size, session_wall_time
        "the baseline has no perf figures: 5 figure(s) of the current run not compared"]


def test_memory_in_use_is_gated_and_a_pools_capacity_is_not():
    base = _arm_report()
    bigger_pool = _arm_report(label="pool", method_size=2 * 67108864)
    assert find_regressions(base, bigger_pool) == []
    rows = {r["name"]: r for r in perf_deltas(base, bigger_pool)[0]}
    assert rows["method_allocator_size"]["gate"] is None and "capacity" in rows["method_allocator_size"]["not_gated"]
    from bundlerun.runner.history.regression import perf_gate

    def memory(name: str) -> PerfFigure:
        return PerfFigure(name, 4096, "bytes", "memory", "arm_executor_runner log")

    for name in ("pte_loaded_size", "input_file_allocator_used"):  # the .bpte file: grows with the manifest
        gate, why = perf_gate(memory(name), PerfRules())
        assert gate is None and "bundle file" in why
    assert perf_gate(memory("pte_program_size"), PerfRules()) == ("memory", None)
    more_used = _arm_report(label="used", method_used=2600)  # +14%
    regs = find_regressions(base, more_used)
    assert _names(regs) == [("memory-regression", "forward.method_allocator_used")]
    assert "2276 B" in regs[0].message and "2600 B" in regs[0].message


def _latency_report(samples_per_case, kind_sim=False, label="l", url="adb://R58M"):
    """executor_runner lanes: iteration 1 is the warm-up, the rest the warm samples."""
    return _report(url, lambda i: perf_figures(_exec_log([5.0, *samples_per_case[i]]), simulated=kind_sim), label)


def test_latency_needs_the_rise_past_threshold_and_past_the_noise_band():
    steady = [[1.00, 1.01, 0.99, 1.00, 1.02]] * 3
    base = _latency_report(steady)
    slower = _latency_report([[1.20, 1.21, 1.19, 1.22, 1.20]] * 3, label="slow")
    regs = find_regressions(base, slower)
    assert _names(regs) == [("latency-regression", "forward.execution_time (warm)")]
    assert "15 vs 15 warm samples" in regs[0].message and "[device-latency]" in regs[0].message
    # the same median rise in samples that scatter widely is within the noise: not a regression
    noisy = _latency_report([[0.70, 1.20, 1.70, 1.21, 0.75]] * 3, label="noisy")
    rows = {(r["name"], r["phase"]): r for r in perf_deltas(base, noisy)[0]}
    warm = rows[("execution_time", "warm")]
    assert warm["current"] == pytest.approx(1.20) and warm["change"] > 0.10
    assert warm["current"] - warm["baseline"] < warm["noise_band"]
    assert find_regressions(base, noisy) == []
    # the first (cold) execution is reported, never gated
    assert rows[("execution_time", "first")]["gate"] is None


def test_latency_with_too_few_samples_is_a_note():
    base = _latency_report([[1.0]] * 3)  # --repeat 1 on 3 cases: 3 warm samples pooled over the cases
    slow = _latency_report([[2.0]] * 3, label="slow")
    assert _names(find_regressions(base, slow)) == [("latency-regression", "forward.execution_time (warm)")]
    rules = PerfRules(latency_min_samples=5)
    assert find_regressions(base, slow, perf_rules=rules) == []
    notes = comparison_notes(base, slow, rules)
    assert any("latency not gated" in n and "--repeat" in n for n in notes), notes


def test_simulation_time_is_never_latency_and_host_wall_only_when_asked():
    base = _latency_report([[1.0, 1.0, 1.0]] * 3, kind_sim=True)  # qemu-user: simulation-time
    slow = _latency_report([[3.0, 3.0, 3.0]] * 3, kind_sim=True, label="slow")
    assert find_regressions(base, slow) == []
    assert find_regressions(base, slow, perf_rules=PerfRules(gate_host_latency=True)) == []
    rows = {(r["name"], r["phase"]): r for r in perf_deltas(base, slow)[0]}
    assert "never gated" in rows[("execution_time", "warm")]["not_gated"]

    def host(values, label):
        report = _report("host://xnnpack", lambda i: [], label).to_json()
        for case, seconds in zip(report["cases"], values):
            case["elapsed_s"] = seconds
            case["perf"] = []
        return Report.from_json(report)  # elapsed_s -> execution_wall_time, first then warm

    hb, hs = host([0.010, 0.001, 0.001], "hb"), host([0.010, 0.003, 0.003], "hs")
    assert find_regressions(hb, hs) == []
    rules = PerfRules(gate_host_latency=True, latency_min_samples=2)
    assert _names(find_regressions(hb, hs, perf_rules=rules)) == [
        ("latency-regression", "forward.execution_wall_time (warm)")]


def test_perf_section_is_validated_with_did_you_mean(tmp_path):
    from bundlerun.bundles.project_config import load_project_config

    cfg = tmp_path / "bundlerun.toml"
    cfg.write_text("[perf]\ncycle_regression = 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'cycle_regression' \(did you mean 'cycles_regression'\?\)"):
        load_project_config(cfg)
    cfg.write_text("[perf]\ngate_host_latency = 1\n")
    with pytest.raises(ConfigError, match="gate_host_latency must be true or false"):
        load_project_config(cfg)
    cfg.write_text("[perf]\nlatency_regression = -0.1\n")
    with pytest.raises(ConfigError, match="latency_regression must be a non-negative number"):
        load_project_config(cfg)
    cfg.write_text("[perf]\nlatency_min_samples = 2.5\n")
    with pytest.raises(ConfigError, match="whole number"):
        load_project_config(cfg)
    cfg.write_text("[perf]\ncycles_regression = 0.02\ngate_host_latency = true\n")
    rules = PerfRules.from_config(load_project_config(cfg))
    assert rules.cycles_regression == 0.02 and rules.gate_host_latency and rules.memory_regression == 0.05


# ----------------------------------------------------------------------------------------- every format


def test_a_cycle_regression_is_named_in_every_report_format(tmp_path):
    from bundlerun.runner.writers.html import render_html
    from bundlerun.runner.writers.junit import junit_bytes
    from bundlerun.runner.writers.markdown import render_markdown

    base = _arm_report()
    (tmp_path / "base.json").write_text(json.dumps(base.to_json()))
    cur = _arm_report(cycles=(108_000, 109_080, 106_920), label="cur")
    cur.regressions = check_baseline(str(tmp_path / "base.json"), cur, None, {})
    assert [r["rule"] for r in cur.regressions] == ["cycles-regression"]
    assert "forward.inference_cpu_cycles" in format_regressions(cur.regressions)
    perf_rows = {r["name"]: r for r in cur.baseline["perf"]}
    assert perf_rows["inference_cpu_cycles"]["change"] == pytest.approx(0.08)
    md = render_markdown(cur, cur.regressions)
    assert "**cycles-regression** forward.inference\\_cpu\\_cycles" in md
    assert "| forward.inference\\_cpu\\_cycles | simulation-cycles | 100000 cycles | 108000 cycles | +8.00% | cycles 5% |" in md
    root = ET.fromstring(junit_bytes(cur))
    (suite,) = [s for s in root.findall("testsuite") if s.get("name").endswith("/regressions")]
    (failure,) = suite.findall("testcase/failure")
    assert failure.get("type") == "cycles-regression" and "inference_cpu_cycles" in failure.get("message")
    assert root.get("failures") == "1"  # the outputs all passed: the one failure is the regression
    page = render_html(cur, regressions=cur.regressions)
    assert "<b>cycles-regression</b> forward.inference_cpu_cycles" in page
    assert "<tr class='bad'><td class='l'>forward.inference_cpu_cycles</td>" in page
    # and the JSON report keeps it through the typed reader
    assert Report.from_json(cur.to_json()).regressions[0]["where"] == "forward.inference_cpu_cycles"


def test_compare_command_exit_codes_and_perf_json(tmp_path):
    base, up8 = _arm_report(), _arm_report(cycles=(108_000, 109_080, 106_920), label="up8")
    only_base = _arm_report(npu=50_000, label="npu")
    for name, rep in (("base", base), ("up8", up8), ("npu", only_base)):
        (tmp_path / f"{name}.json").write_text(json.dumps(rep.to_json()))
    res = run_cli("compare", str(tmp_path / "base.json"), str(tmp_path / "up8.json"), "--history=off")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION cycles-regression: forward.inference_cpu_cycles" in res.stdout
    res = run_cli("compare", str(tmp_path / "base.json"), str(tmp_path / "up8.json"), "--history=off",
                  "--cycles-regression", "0.1", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    (row,) = [r for r in data["perf"] if r["name"] == "inference_cpu_cycles"]
    assert row["gate"] == "cycles" and row["limit"] == 0.1 and row["change"] == pytest.approx(0.08)
    res = run_cli("compare", str(tmp_path / "npu.json"), str(tmp_path / "base.json"), "--history=off")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "perf figure(s) only in the baseline, not compared: forward.npu_active_cycles [simulation-cycles]" \
        in res.stdout


# ----------------------------------------------------------------------------------------- history + trend


def test_history_stores_perf_figures_and_trend_plots_them(tmp_path):
    from bundlerun.runner.history import store as history

    db = tmp_path / "h.sqlite"
    for k, scale in enumerate((1.00, 1.02, 1.10)):
        rep = _arm_report(cycles=tuple(int(c * scale) for c in (100_000, 101_000, 99_000)), label=f"v{k}")
        rep.run["id"] = f"run-{k}"
        history.record_report(db, rep)
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT case_index, value, unit, kind FROM perf_figures WHERE name = "
                            "'inference_cpu_cycles' AND run_id = 3 ORDER BY case_index").fetchall()
    finally:
        conn.close()
    assert [tuple(r) for r in rows] == [(0, 110_000, "cycles", "simulation-cycles"),
                                        (1, 111_100, "cycles", "simulation-cycles"),
                                        (2, 108_900, "cycles", "simulation-cycles")]
    points, info = history.perf_trend(db, "mlp", "cycles")
    assert info["name"] == "inference_cpu_cycles" and info["unit"] == "cycles"
    assert [p.value for p in points] == [100_000, 102_000, 110_000]
    assert (points[-1].low, points[-1].high, points[-1].counted) == (108_900, 111_100, 3)
    out = tmp_path / "cycles.png"
    res = run_cli("trend", "mlp", "--metric", "cycles", "--history", str(db), "-o", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "latest median 110000 cycles" in res.stdout
    res = run_cli("trend", "mlp", "--metric", "npu_active_cycles", "--history", str(db), "-o", str(out))
    assert res.returncode != 0 and "npu_active_cycles" in res.stderr
    from bundlerun.runner.writers.html import render_html

    page = render_html(rep, history_db=db)  # the newest run's report: its cycles over the history
    assert "alt=\"trend inference_cpu_cycles\"" in page and "last 3 recorded run(s)" in page


# ----------------------------------------------------------------------------------------- --repeat


def test_repeat_maps_to_one_warm_up_plus_n_executions():
    assert executions_for(1) == 1 and executions_for(1, configured=4) == 4
    assert executions_for(5) == 6 and executions_for(5, configured=4) == 6
    args = runner_args("m.bpte", "forward", "out/o", num_executions=executions_for(3))
    assert args[args.index("--num_executions") + 1] == "4"
    figs = {(f.name, f.phase): f for f in perf_figures(_exec_log([9.0, 1.0, 1.1, 0.9]))}
    warm = figs[("execution_time", "warm")]
    assert warm.samples == [1.0, 1.1, 0.9] and warm.value == 1.0 and "first excluded" in warm.note


def test_live_repeat_on_the_real_executor_runner_gives_n_samples(tmp_path):
    from tests.doubles.android_env import real_executor_runner

    real_executor_runner("aarch64")  # fails with the build command when it is not built
    res = run_cli("validate", "mlp", "--target", "qemu-user://aarch64", "--dtype", "fp32", "--cases", "2",
                  "--report", str(tmp_path), "--no-history", "--repeat", "4", "--json")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads((tmp_path / "mlp-fp32" / "report.json").read_text())
    assert (report["perf"]["repeat"], report["perf"]["warmup"]) == (4, 1)
    load = report["perf"]["load"]
    assert len(load["before"]) == 3 and len(load["after"]) == 3 and load["cpus"] >= 1
    for case in report["cases"]:
        figs = {(f["name"], f.get("phase")): f for f in case["perf"]}
        assert figs[("executions", None)]["value"] == 5  # the warm-up + 4 measured
        warm = figs[("execution_time", "warm")]
        assert len(warm["samples"]) == 4 and warm["kind"] == "simulation-time"
        assert min(warm["samples"]) <= warm["value"] <= max(warm["samples"])


# ----------------------------------------------------------------------------------------- live: QEMU


def test_live_qemu_run_against_a_baseline_fails_on_a_memory_rise(qemu_runner, bundle_cache, tmp_path):
    """The real runner's method_allocator_used against a baseline that used less: exit 1 naming the
    figure in the console, report.json, summary.md, junit.xml and report.html; a baseline whose
    figure is missing gives a note and exit 0; --repeat on this lane is said to be not applied."""
    qemu_runner()
    bundle = bundle_cache("tiny-cnn", "fp32", backend="portable", cases=2)
    first = tmp_path / "first"
    res = run_cli("run", str(bundle), "--target", "qemu://mps3-an547", "--report", str(first), "--no-history",
                  "--repeat", "3")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    report = json.loads((first / "report.json").read_text())
    assert report["perf"].get("repeat") == 1 and "--repeat 3 not applied" in report["perf"]["notes"][0]
    used = {c["case"]: next(f["value"] for f in c["perf"] if f["name"] == "method_allocator_used")
            for c in report["cases"]}
    baseline = copy.deepcopy(report)
    baseline["run"]["id"] = "baseline-less-memory"
    for case in baseline["cases"]:
        for f in case["perf"]:
            if f["name"] == "method_allocator_used":
                f["value"] = int(f["value"] / 1.2)  # the baseline used 1/1.2 of what the runner uses now
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))
    res = run_cli("run", str(bundle), "--target", "qemu://mps3-an547", "--report", str(tmp_path / "cur"),
                  "--no-history", "--baseline", str(tmp_path / "baseline.json"))
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    assert "REGRESSION memory-regression: forward.method_allocator_used" in res.stdout
    cur = json.loads((tmp_path / "cur" / "report.json").read_text())
    assert cur["summary"]["verdict"] == "PASS" and cur["summary"]["exit_code"] == 1  # numerics fine, perf not
    (reg,) = cur["regressions"]
    from statistics import median

    assert reg["rule"] == "memory-regression" and reg["where"] == "forward.method_allocator_used"
    assert reg["current"] == median(used.values())
    assert reg["baseline"] == median(int(v / 1.2) for v in used.values())
    assert "method\\_allocator\\_used" in (tmp_path / "cur" / "summary.md").read_text()
    junit = ET.parse(tmp_path / "cur" / "junit.xml").getroot()
    assert [f.get("type") for f in junit.iter("failure")] == ["memory-regression"]
    assert "memory-regression</b> forward.method_allocator_used" in (tmp_path / "cur" / "report.html").read_text()
    # a baseline without the figure: a note, exit 0
    missing = copy.deepcopy(report)
    missing["run"]["id"] = "baseline-without-figure"
    for case in missing["cases"]:
        case["perf"] = [f for f in case["perf"] if f["name"] != "method_allocator_used"]
    (tmp_path / "missing.json").write_text(json.dumps(missing))
    res = run_cli("run", str(bundle), "--target", "qemu://mps3-an547", "--report", str(tmp_path / "again"),
                  "--no-history", "--baseline", str(tmp_path / "missing.json"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert again["regressions"] == []
    assert any("method_allocator_used" in n and "only in the current run" in n for n in again["baseline"]["notes"])


# ----------------------------------------------------------------------------------------- ETDump profile


def test_live_etdump_profile_matches_executorchs_inspector(tmp_path):
    """qemu-user://aarch64 with the runner's --etdump_path and --repeat 3: the report's operator
    profile equals what ExecuTorch's Inspector reads from the same file (warm executions only)."""
    from statistics import median

    from tests.doubles.android_env import real_executor_runner

    real_executor_runner("aarch64")
    res = run_cli("validate", "tiny-cnn", "--target", "qemu-user://aarch64", "--dtype", "fp32", "--cases", "1",
                  "--report", str(tmp_path), "--no-history", "--repeat", "3", "--target-opt", "etdump=true", "--json")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = tmp_path / "tiny-cnn-fp32"
    report = json.loads((out / "report.json").read_text())
    (prof,) = report["perf"]["profile"]
    assert (prof["method"], prof["executions"], prof["phase"], prof["unit"]) == ("forward", 4, "warm", "ms")
    assert prof["kind"] == "simulation-time"  # under qemu-aarch64: never device latency
    ops = {o["name"]: o for o in prof["operators"]}
    assert ops["convolution.out"]["calls"] == 2 and prof["operators"][0]["name"] == "convolution.out"

    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=report["cases"][0]["extra"]["etdump"])
    per_exec: dict[str, list[float]] = {}
    execute: list[float] = []
    for block in inspector.event_blocks:
        for event in block.events:
            if event.name == "Method::execute" and event.perf_data is not None:
                execute = list(event.perf_data.raw)
            if event.name.startswith("native_call_") and event.perf_data is not None:
                raw = event.perf_data.raw
                name = event.name.removeprefix("native_call_")
                acc = per_exec.setdefault(name, [0.0] * len(raw))
                for i, ms in enumerate(raw):
                    acc[i] += ms
    assert set(per_exec) == set(ops)
    for name, times in per_exec.items():
        assert len(times) == 4
        assert ops[name]["time"] == pytest.approx(median(times[1:]), rel=1e-6), name  # the warm-up excluded
    # operators run inside Method::execute: in every execution (a sum of per-operator medians can exceed the
    # median total by noise: it did by 0.3% once, 9.260 vs 9.233 ms)
    assert len(execute) == 4 and prof["total"] == pytest.approx(median(execute[1:]), rel=1e-6)
    for i in range(4):
        assert sum(times[i] for times in per_exec.values()) < execute[i], i
    assert "Top operators of forward" in (out / "summary.md").read_text()
    assert "class='flame'" in (out / "report.html").read_text()


def test_live_host_repeat_gives_n_warm_samples_per_case(bundle_cache, tmp_path):
    """host://xnnpack with --repeat 3: the case's outputs come from its first execution (the
    warm-up), then 3 timed executions; the method's first case also reports its cold execution."""
    bundle = bundle_cache("mlp", "fp32", cases=3)
    res = run_cli("run", str(bundle), "--target", "host://xnnpack", "--report", str(tmp_path), "--no-history",
                  "--repeat", "3")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["perf"]["repeat"], report["perf"]["warmup"]) == (3, 1) and "notes" not in report["perf"]
    for case in report["cases"]:
        figs = {(f["name"], f.get("phase")): f for f in case["perf"]}
        warm = figs[("execution_wall_time", "warm")]
        assert len(warm["samples"]) == 3 and warm["kind"] == "host-wall"
        assert warm["value"] == sorted(warm["samples"])[1]  # the median of 3
        assert (("execution_wall_time", "first") in figs) == (case["case"] == 0)
        if case["case"] == 0:
            assert figs[("execution_wall_time", "first")]["value"] == case["elapsed_s"]
