"""`qemu://mps3-an547` end to end: ExecuTorch's own arm_executor_runner (built from source by
firmware_scripts/arm/build_qemu_runner.sh, cached) on the real qemu-system-arm, driven through
bundlerun's target, every case and output judged on the host. No double anywhere: the fault
scenarios are real runner builds (qemu_runner fixture, tests/conftest.py) classified from the
real runner's log by targets/et_runner/protocol.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from proc_helpers import mine
from tests.conftest import run_cli

URL = "qemu://mps3-an547"


def _qemu_alive() -> list[int]:
    """This test's QEMUs still running (a parallel test's are not ours to count)."""
    return mine(b"qemu-system-arm")


@pytest.fixture(scope="module")
def default_runner(qemu_runner):
    return qemu_runner()  # the zoo-ops semihosting runner the target finds in the cache


def _run(bundle: Path, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    res = run_cli("run", str(bundle), "--target", URL, "--report", str(tmp_path / "r"), "--no-history", *extra)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    return res.returncode, report


def test_validate_fp32_and_int8_on_the_real_runner(default_runner, tmp_path):
    res = run_cli("validate", "tiny-cnn", "mobile-net", "--target", URL, "--backend", "portable", "--dtype", "fp32",
                  "--cases", "3", "--report", str(tmp_path / "fp32"), "--no-history")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    res = run_cli("validate", "mlp", "--target", URL, "--cases", "3", "--report", str(tmp_path / "int8"), "--no-history")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    for report_file in [*(tmp_path / "fp32").glob("*/report.json"), tmp_path / "int8" / "mlp-int8" / "report.json"]:
        report = json.loads(report_file.read_text())
        assert report["target"]["info"]["runner_elf"].startswith(str(default_runner))
        assert [c["verdict"] for c in report["cases"]] == ["PASS"] * 3
        for case in report["cases"]:
            assert case["extra"]["outputs_from"] == "files"  # out-<i>.bin, bit exact
            assert case["device_verdict"]["verdict"] == "PASS"  # the runner's own check of this case
    int8 = json.loads((tmp_path / "int8" / "mlp-int8" / "report.json").read_text())
    assert int8["bundle"]["backend"] == "cortex-m" and int8["bundle"]["dtype"] == "int8"
    assert not _qemu_alive()


@pytest.mark.parametrize("variant,kind,needle", [
    (("--method-pool-size", "4096"), "allocation-failure", "B requested, 4096 B available"),
    (("--fault", "hardfault"), "hard-fault", "BUNDLERUN_HARDFAULT"),
    (("--fault", "short-output"), "wrong-output-size", "has 20 bytes, expected 40"),
])
def test_faults_on_the_real_emulator_are_classified(qemu_runner, bundle_cache, tmp_path, variant, kind, needle):
    bundle = bundle_cache("tiny-cnn", "fp32", backend="portable", cases=2)
    elf = qemu_runner(*variant) / "arm_executor_runner.elf"
    # memory_check=false: the real runner's own out-of-memory line (the pre-flight check would refuse
    # the 4 KiB pool before QEMU starts: tests/test_qemu_memory_fit.py)
    code, report = _run(bundle, tmp_path, "--target-opt", f"runner_elf={elf}", "--target-opt", "memory_check=false")
    assert code == 2
    for case in report["cases"]:
        assert case["error_kind"] == kind and needle in case["error"], case["error"]
        assert case["log_excerpt"]
    assert not _qemu_alive()


def test_missing_operator_is_named(qemu_runner, bundle_cache, tmp_path):
    bundle = bundle_cache("tiny-cnn", "fp32", backend="portable", cases=1)
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.program_meta import program_operators

    ops = sorted(program_operators(read_bundle(bundle).program) - {"aten::relu.out"})
    elf = qemu_runner("--ops", ",".join(ops)) / "arm_executor_runner.elf"
    code, report = _run(bundle, tmp_path, "--target-opt", f"runner_elf={elf}")
    assert code == 2
    (case,) = report["cases"]
    assert case["error_kind"] == "missing-operator" and "aten::relu.out" in case["error"]


def test_a_hang_is_ended_by_the_wall_clock_bound(qemu_runner, bundle_cache, tmp_path):
    bundle = bundle_cache("tiny-cnn", "fp32", backend="portable", cases=1)
    elf = qemu_runner("--fault", "spin") / "arm_executor_runner.elf"
    code, report = _run(bundle, tmp_path, "--target-opt", f"runner_elf={elf}", "--timeout", "3",
                        "--target-opt", "host_timeout_grace_s=2")
    assert code == 2
    (case,) = report["cases"]
    assert case["verdict"] == "TIMEOUT" and case["error_kind"] == "host-timeout"
    assert 4 <= case["elapsed_s"] < 30
    assert not _qemu_alive()


def test_missing_qemu_elf_and_uncovered_ops_are_one_line_errors(default_runner, bundle_cache, tmp_path):
    bundle = bundle_cache("tiny-cnn", "fp32", backend="portable", cases=1)
    code, report = _run(bundle, tmp_path, "--target-opt", f"runner_elf={tmp_path / 'nope.elf'}")
    assert code == 2 and "does not exist" in report["cases"][0]["error"]
    env = {"PATH": "/nonexistent"}
    res = run_cli("run", str(bundle), "--target", URL, "--report", str(tmp_path / "s"), "--no-history",
                  env={**os.environ, **env})
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    assert res.returncode == 2 and "qemu-system-arm not found" in report["cases"][0]["error"]
    assert report["cases"][0]["error_kind"] == "tool-missing"
    res = run_cli("run", str(bundle), "--target", URL + "?mode=turbo", "--report", str(tmp_path / "t"), "--no-history")
    assert res.returncode == 2  # a bad URL option is refused before any case runs: one line, no report folder
    assert "mode must be semihosting or uart" in res.stderr and not (tmp_path / "t").exists()
