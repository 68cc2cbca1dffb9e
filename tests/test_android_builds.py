"""Vulkan/QNN lowering recipes and the Android firmware build scripts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bundlerun.bundles.backends.base import LoweringRequest, lowering_module
from bundlerun.bundles.errors import BuildError

SCRIPTS = Path(__file__).resolve().parents[1] / "firmware_scripts" / "android"


def _request(backend: str, dtype: str = "fp32") -> LoweringRequest:
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 8 * 8, 4)).eval()
    x = (torch.randn(1, 3, 8, 8),)
    return LoweringRequest(model=model, example_inputs=x, calibration_inputs=[x], dtype=dtype, backend=backend,
                           target="adb://SERIAL")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_vulkan_lowers_and_delegates(dtype):
    result = lowering_module("vulkan").lower(_request("vulkan", dtype))
    assert result.info["delegate_calls"] >= 1
    assert result.info["partitioner"] == "VulkanPartitioner"
    assert result.info["compile_options"].get("force_fp16", False) is (dtype == "fp16")
    buf = result.program.buffer
    assert buf[4:6] == b"ET" and b"VulkanBackend" in buf


def test_vulkan_rejects_bf16():
    """fp32, fp16 (force_fp16) and int8 (XNNPACK-style PTQ) lower for Vulkan; bf16 is refused by name."""
    with pytest.raises(BuildError, match=r"dtype 'bf16' is not supported by the vulkan recipe \(fp32, fp16, int8\)"):
        lowering_module("vulkan").lower(_request("vulkan", "bf16"))


def test_qnn_needs_the_sdk(monkeypatch, tmp_path):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    monkeypatch.setenv("BUNDLERUN_CACHE", str(tmp_path / "no-cache"))  # no HTP simulator libraries either
    with pytest.raises(BuildError, match="install_htp_sim.sh.*QNN_SDK_ROOT"):
        lowering_module("qnn").lower(_request("qnn", "fp16"))
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    with pytest.raises(BuildError, match="does not look like a QNN SDK"):
        lowering_module("qnn").lower(_request("qnn", "fp16"))


def _script(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("QNN_SDK_ROOT", "ANDROID_NDK_ROOT", "ANDROID_NDK")}
    full_env.update(env or {})
    return subprocess.run(["bash", str(SCRIPTS / name), *args], capture_output=True, text=True, env=full_env, timeout=60)


def test_executor_runner_script_flags(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text("")
    res = _script("build_executor_runner.sh", "--executorch", str(tmp_path), "--ndk", "/opt/ndk",
                  "--backends", "xnnpack,vulkan", "--dry-run")
    assert res.returncode == 0, res.stderr
    for flag in ("-DCMAKE_TOOLCHAIN_FILE=/opt/ndk/build/cmake/android.toolchain.cmake", "-DANDROID_ABI=arm64-v8a",
                 "-DEXECUTORCH_BUILD_DEVTOOLS=ON", "-DEXECUTORCH_ENABLE_BUNDLE_IO=ON", "-DEXECUTORCH_PAL_DEFAULT=posix",
                 "-DEXECUTORCH_BUILD_XNNPACK=ON", "-DEXECUTORCH_BUILD_VULKAN=ON", "-DEXECUTORCH_BUILD_QNN=OFF",
                 "--target executor_runner"):
        assert flag in res.stdout
    assert res.stdout.strip().endswith("executor_runner")


def test_scripts_refuse_missing_prerequisites(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text("")
    res = _script("build_executor_runner.sh", "--executorch", str(tmp_path), "--backends", "xnnpack", "--dry-run")
    assert res.returncode == 2 and "ANDROID_NDK_ROOT" in res.stderr
    res = _script("build_executor_runner.sh", "--executorch", str(tmp_path), "--ndk", "/x", "--backends", "qnn", "--dry-run")
    assert res.returncode == 2 and "QNN_SDK_ROOT" in res.stderr
    res = _script("build_qnn_executor_runner.sh", "--executorch", str(tmp_path), "--ndk", "/x", "--dry-run")
    assert res.returncode == 2 and "QNN_SDK_ROOT" in res.stderr
    res = _script("build_executor_runner.sh", "--executorch", str(tmp_path / "nope"), "--ndk", "/x", "--dry-run")
    assert res.returncode == 2 and "not an ExecuTorch checkout" in res.stderr


def test_qnn_runner_script_flags(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text("")
    res = _script("build_qnn_executor_runner.sh", "--executorch", str(tmp_path), "--ndk", "/opt/ndk", "--dry-run",
                  env={"QNN_SDK_ROOT": "/opt/qnn"})
    assert res.returncode == 0, res.stderr
    assert "-DEXECUTORCH_BUILD_QNN=ON" in res.stdout and "-DQNN_SDK_ROOT=/opt/qnn" in res.stdout
    assert "examples/qualcomm" in res.stdout and "--target qnn_executor_runner" in res.stdout
    assert res.stdout.strip().splitlines()[-1].endswith("libqnn_executorch_backend.so")
