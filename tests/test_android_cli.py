"""`bundlerun run` against the emulated device, configured from bundlerun.toml [targets.adb].

The passing run uses ExecuTorch's real aarch64 executor_runner (with XNNPACK) on the emulated arm64
device; the crash is the Python double's injected segfault (tests/doubles/android_runner.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from doubles.android_env import runner_binaries
from tests.test_android_target import real_runner  # noqa: F401 - the real aarch64 runner fixture

BUNDLERUN = Path(sys.executable).with_name("bundlerun")

def _bundlerun(args, cwd, home):
    env = dict(os.environ, HOME=str(home))
    env.pop("ANDROID_USER_HOME", None)
    return subprocess.run([str(BUNDLERUN), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_run_passes_then_a_crash_exits_2(device, tmp_path, bundle_cache, real_runner):  # noqa: F811
    bundle = bundle_cache("mlp", backend="xnnpack", cases=2, target="adb+tcp://127.0.0.1:5555")
    runner = real_runner
    (tmp_path / "bundlerun.toml").write_text(
        f'[targets.adb]\nrunner = "{runner}"\nworkspace = "/data/local/tmp/ci farm"\n')
    url = f"adb+tcp://127.0.0.1:{device.port}"
    res = _bundlerun(["run", str(bundle), "--target", url, "--select", "1", "--report", "r1", "--no-history", "--quiet"],
                     tmp_path, tmp_path / "home")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "r1" / "report.json").read_text())
    assert report["target"]["info"]["workspace"] == "/data/local/tmp/ci farm"
    assert (device.root / "data/local/tmp/ci farm/run/out/output-0.bin").exists()

    # the crash: the Python double with an injected segfault (the real runner is not made to crash here)
    double = runner_binaries(tmp_path / "bin")["executor-runner"]
    (tmp_path / "bundlerun.toml").write_text(
        f'[targets.adb]\nrunner = "{double}"\nworkspace = "/data/local/tmp/ci farm"\n')
    device.set_faults(runner={"segv": True})
    res = _bundlerun(["run", str(bundle), "--target", url, "--select", "0", "--report", "r2", "--no-history", "--quiet"],
                     tmp_path, tmp_path / "home")
    assert res.returncode == 2, res.stdout + res.stderr
    text = (tmp_path / "r2" / "report.json").read_text()
    assert "crash" in text and "SIGSEGV" in text
