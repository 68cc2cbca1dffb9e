"""`qemu-user://aarch64` end to end: ExecuTorch's real executor_runner, cross-built from source
for aarch64 (cached by scripts/setup.sh), under the real qemu-aarch64, every case and output
judged on the host; faults from the real binary's own log and exit status. No double."""

from __future__ import annotations

import json

import pytest

from proc_helpers import mine
from tests.conftest import run_cli
from tests.doubles.android_env import real_executor_runner

URL = "qemu-user://aarch64"


@pytest.fixture(scope="module")
def runner():
    return real_executor_runner("aarch64")  # fails with the build command when it is not built


def _no_qemu_left() -> bool:
    """No qemu-aarch64 of this test is left (a parallel test's are not ours to count)."""
    return not mine(b"qemu-aarch64")


def test_zoo_fp32_and_int8_on_aarch64(runner, tmp_path):
    res = run_cli("validate", "zoo", "--target", URL, "--dtype", "fp32", "--cases", "3", "--report",
                  str(tmp_path / "fp32"), "--no-history", "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = json.loads(res.stdout)["runs"]
    assert len(runs) == 6 and all(r["verdict"] == "PASS" for r in runs), runs
    report = json.loads((tmp_path / "fp32" / "tiny-transformer-fp32" / "report.json").read_text())
    assert report["bundle"]["backend"] == "portable" and report["target"]["info"]["arch"] == "aarch64"
    for case in report["cases"]:
        assert case["extra"]["outputs_from"] == "files" and case["device_verdict"]["verdict"] == "PASS"
        assert case["outputs"][0]["stats"]["error_max"] < 1e-5  # aarch64 vs eager x86: ulp-level only
    res = run_cli("validate", "mlp", "--target", URL, "--dtype", "int8", "--cases", "2", "--report",
                  str(tmp_path / "int8"), "--no-history", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["runs"][0]["verdict"] == "PASS", res.stderr[-2000:]
    assert _no_qemu_left()


def test_missing_backend_and_bad_runner_are_classified(runner, bundle_cache, tmp_path):
    xnn = bundle_cache("mlp", backend="xnnpack", cases=1)
    res = run_cli("run", str(xnn), "--target", URL, "--report", str(tmp_path / "x"), "--no-history")
    report = json.loads((tmp_path / "x" / "report.json").read_text())
    assert res.returncode == 2
    (case,) = report["cases"]
    assert case["error_kind"] == "missing-backend" and "XnnpackBackend" in case["error"]
    assert any("is not registered" in line for line in case["log_excerpt"])
    portable = bundle_cache("mlp", backend="portable", cases=1, target="host://portable")
    res = run_cli("run", str(portable), "--target", URL + f"?runner={tmp_path / 'none'}", "--report",
                  str(tmp_path / "y"), "--no-history")
    report = json.loads((tmp_path / "y" / "report.json").read_text())
    assert res.returncode == 2 and report["cases"][0]["error_kind"] == "tool-missing"
    assert "build it with firmware_scripts/android/build_executor_runner.sh" in report["cases"][0]["error"]
