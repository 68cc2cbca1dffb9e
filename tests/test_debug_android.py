"""`bundlerun debug` on qemu-user:// and on Android over ADB (targets/android/intermediates.py).

Which runner each test uses:
  real debug runner   bundlerun's debug runner (firmware_scripts/android/debug_runner/), built from
                      ExecuTorch's sources for aarch64 by build_executor_runner.sh --toolchain gnu
                      --debug-runner (cached by scripts/setup.sh), run under the real qemu-aarch64:
                      directly for qemu-user://aarch64, and by the emulated arm64 device
                      (tests/doubles/adbd.py: real ADB protocol, pushed aarch64 ELFs exec'd under
                      qemu-aarch64) for adb:// (the real `adb` CLI and a private adb server) and
                      adb+tcp:// (adb-shell). Every test below except the last.
  Python QNN double   test_qnn_profile_uses_qnn_executor_runner_debug_flags only: the emulated
                      device runs tests/doubles/android_runner.py's qnn_executor_runner (the real
                      QNN SDK and HTP cannot run here), which takes the real runner's debug flags and
                      writes a real ETDump + debug buffer from the host ExecuTorch runtime.

The bundles are tests/test_debug.py's fixture: tiny-cnn built with --etrecord, and a copy whose
second convolution's weights were negated inside the lowered program.
"""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle
from proc_helpers import mine
from doubles.adbd import FakeAdbd
from doubles.android_env import PrivateAdbServer, fake_qnn_sdk, runner_binaries
from tests.test_debug import assert_conv2d_1_first_bad, fp32_bundles  # noqa: F401 - fp32_bundles: the shared fixture
from bundlerun.targets.runner_cache import read_record

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "firmware_scripts" / "android" / "build_executor_runner.sh"
BUNDLERUN = [sys.executable, "-m", "bundlerun.runner.cli"]
WORKSPACE = "/data/local/tmp/bundlerun dbg"  # a space: every device path is quoted
QEMU_URL = "qemu-user://aarch64"


@pytest.fixture(scope="module")
def debug_runner() -> Path:
    """The aarch64 debug runner scripts/setup.sh builds; fails (never skips) with the build command."""
    cmd = ["bash", str(BUILD_SCRIPT), "--toolchain", "gnu", "--arch", "aarch64", "--debug-runner", "--cached-only"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        pytest.fail(f"the aarch64 debug runner is not built: {res.stderr.strip()} "
                    f"(build it: bash {BUILD_SCRIPT} --toolchain gnu --arch aarch64 --debug-runner)")
    meta = read_record(Path(res.stdout.strip().splitlines()[-1]))
    assert meta["kind"] == "debug_runner" and meta["arch"] == "aarch64" and meta["static"] is True
    binary = Path(meta["binary"])
    assert binary.read_bytes()[:4] == b"\x7fELF" and binary.read_bytes()[18] == 183  # EM_AARCH64
    return binary


@pytest.fixture
def arm64(tmp_path, debug_runner, monkeypatch):
    """An emulated arm64 device: pushed aarch64 ELFs run under qemu-aarch64. The runner cache stays the
    real one (runners/<key>/debug_runner) although `home` moves HOME, so the lookup finds the built runner."""
    monkeypatch.setenv("BUNDLERUN_CACHE", str(debug_runner.parents[2]))
    try:
        d = FakeAdbd(tmp_path / "device", arm64=True)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    d.start()
    yield d
    d.stop()
    assert d.live_processes() == []


def _no_qemu_left() -> bool:
    """No qemu-aarch64 of this test is left (a parallel test's are not ours to count)."""
    return not mine(b"qemu-aarch64")


def _assert_names_conv2d_1(bad, good) -> None:
    assert_conv2d_1_first_bad(bad)
    assert len(bad.rows) == 10  # every kernel call of tiny-cnn is a row (the permute is merged, not dropped)
    assert good.first_bad is None and all(r.fp32.sqnr > 100 for r in good.rows if r.fp32 is not None)
    assert sum(r.status == "matched" for r in good.rows) == 9


def _device_dir(device: FakeAdbd, method: str = "forward", case: int = 2) -> Path:
    return device.host_path(posixpath.join(WORKSPACE, "debug", f"{method}-{case}"))


# ------------------------------------------------------------------ the build


def test_debug_runner_build_is_the_executor_runner_build_plus_one_target(tmp_path):
    """--debug-runner: the very configure and build tree of the executor_runner (the injected target is in both,
    one cold build makes both), its own cache key (the executor_runner's cache entry is untouched), and the NDK
    path builds the same target."""
    src = tmp_path / "et"
    (src / "runtime").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("")
    env = {**os.environ, "BUNDLERUN_CACHE": str(tmp_path / "cache")}

    def dry(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(BUILD_SCRIPT), *args, "--dry-run"], capture_output=True, text=True,
                              env=env, timeout=120)

    plain = dry("--toolchain", "gnu", "--executorch-src", str(src))
    debug = dry("--toolchain", "gnu", "--executorch-src", str(src), "--debug-runner")
    assert plain.returncode == 0 and debug.returncode == 0, plain.stderr + debug.stderr
    cmake = lambda out: next(ln for ln in out.stdout.splitlines() if ln.startswith("cmake -S")).split()  # noqa: E731
    inject = f"-DCMAKE_PROJECT_executorch_INCLUDE={BUILD_SCRIPT.parent / 'debug_runner' / 'inject.cmake'}"
    assert cmake(debug) == cmake(plain) and inject in cmake(plain)  # one configure, one build tree
    assert "--target bundlerun_debug_runner executor_runner" in debug.stdout  # the one asked for, then the other
    assert "--target executor_runner bundlerun_debug_runner" in plain.stdout
    assert debug.stdout.strip().splitlines()[-1] != plain.stdout.strip().splitlines()[-1]
    ndk = subprocess.run(["bash", str(BUILD_SCRIPT), "--executorch", str(src), "--ndk", "/opt/ndk", "--debug-runner",
                          "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert ndk.returncode == 0 and inject in ndk.stdout and "-DEXECUTORCH_ENABLE_EVENT_TRACER=ON" in ndk.stdout
    assert ndk.stdout.strip().endswith("cmake-out-android-bundlerun/bundlerun_debug_runner")
    assert not (tmp_path / "cache" / "runners").exists()


# ------------------------------------------------------------------ (a) the miscompiled conv is named


def test_qemu_user_names_the_miscompiled_conv(fp32_bundles, debug_runner, tmp_path):  # noqa: F811
    from bundlerun.runner.debug.localize import debug_bundle

    bad = debug_bundle(fp32_bundles / "bad.bpte", QEMU_URL, case=2, work_dir=tmp_path / "bad", target_config={})
    good = debug_bundle(fp32_bundles / "good.bpte", QEMU_URL, case=2, work_dir=tmp_path / "good", target_config={})
    _assert_names_conv2d_1(bad, good)
    # the runner found in the cache ran under qemu-aarch64, and wrote what its contract says
    assert any(f"debug runner {debug_runner}" in n and "aarch64 under" in n for n in bad.notes), bad.notes
    folder = tmp_path / "bad" / "qemu-user" / "forward-2"
    log = (folder / "runner.log").read_text()
    assert "Using method forward, test case 2" in log and "ETDump written to file 'outputs/etdump.etdp'." in log
    assert (folder / "outputs" / "etdump.etdp").read_bytes()[8:12] == b"ED00"
    assert 0 < (folder / "outputs" / "debug_output.bin").stat().st_size < 64 << 20  # the used bytes only
    # the final outputs came back bit exact from outputs/output_0_0.raw and were judged on the host
    assert good.output_stats["error_max"] < 1e-5 and bad.output_stats["sqnr"] < 10
    assert _no_qemu_left()


def test_adb_cli_and_adb_tcp_name_the_miscompiled_conv(fp32_bundles, debug_runner, arm64, home, tmp_path):  # noqa: F811
    """bad.bpte over adb:// (the real adb CLI and a private adb server), good.bpte over adb+tcp://
    (adb-shell); the gnu debug runner for the device's ABI (ro.product.cpu.abi = arm64-v8a)."""
    from bundlerun.runner.debug.localize import debug_bundle

    server = PrivateAdbServer(tmp_path / "adbhome").start()
    try:
        cfg = {"workspace": WORKSPACE, "server_port": server.port}
        bad = debug_bundle(fp32_bundles / "bad.bpte", f"adb://127.0.0.1:{arm64.port}", case=2,
                           work_dir=tmp_path / "bad", target_config=cfg)
    finally:
        server.stop()
    good = debug_bundle(fp32_bundles / "good.bpte", f"adb+tcp://127.0.0.1:{arm64.port}", case=2,
                        work_dir=tmp_path / "good", target_config={"workspace": WORKSPACE})
    _assert_names_conv2d_1(bad, good)
    note = next(n for n in bad.notes if n.startswith("runner:"))
    assert f"debug runner {debug_runner}" in note and "adb CLI" in note and "(removed)" in note
    assert not any("assumed" in n for n in bad.notes)
    assert not list(tmp_path.rglob("build_debug_runner-*.log"))  # found in the cache, not rebuilt
    runs = [c for c in arm64.stats.shell_commands if "debug_runner --model_path" in c]
    assert len(runs) == 2 and all("--testset_idx 2" in c and "--dump_intermediate_outputs" in c for c in runs)
    # pushed once into the device cache (content-addressed), the per-case folder removed each time
    assert len([p for p in arm64.stats.pushes if p.endswith(".debug_runner.partial")]) == 1
    assert not _device_dir(arm64).exists() and _device_dir(arm64).parent.is_dir()
    pulled = {posixpath.basename(p) for p in arm64.stats.pulls}
    assert {"etdump.etdp", "debug_output.bin", "output_0_0.raw"} <= pulled
    log = (tmp_path / "bad" / "android" / "forward-2" / "runner.log").read_text()
    assert "executorch:debug_runner.cpp" in log and "Test_result: FAIL" in log  # the device's own check of case 2


# ------------------------------------------------------------------ (b) a debug buffer too small


def test_small_debug_buffer_is_one_line_naming_the_size(fp32_bundles, debug_runner, tmp_path):  # noqa: F811
    proc = subprocess.run([*BUNDLERUN, "debug", str(fp32_bundles / "bad.bpte"), "--target", QEMU_URL, "--case", "2",
                           "--target-opt", "debug_buffer_bytes=4096"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**os.environ, "BUNDLERUN_HISTORY": "off"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    error = next(ln for ln in lines if ln.startswith("bundlerun: error:"))
    assert "the debug buffer (4096 B = 4 KiB) is too small for every intermediate output of forward[2]" in error
    assert "pass a larger --debug-buffer-mb (at least 1)" in error
    need = int(error.split("they need ")[1].split(" B")[0])
    assert 100_000 < need < 4 << 20  # tiny-cnn's intermediates: ~0.3 MB, counted by the runner to the end
    assert _no_qemu_left()


def test_small_debug_buffer_on_the_device(fp32_bundles, debug_runner, arm64, home, tmp_path):  # noqa: F811
    from bundlerun.targets.intermediates import IntermediatesFailed, capture

    with pytest.raises(IntermediatesFailed) as info:
        capture(f"adb+tcp://127.0.0.1:{arm64.port}", fp32_bundles / "bad.bpte", "forward", 2, tmp_path / "w",
                config={"workspace": WORKSPACE, "debug_buffer_bytes": 65536})
    text = str(info.value)
    assert "\n" not in text and "the debug buffer (65536 B = 64 KiB) is too small" in text
    assert "--debug-buffer-mb" in text and "device folder" in text and "removed" in text
    assert not _device_dir(arm64).exists()
    runs = [c for c in arm64.stats.shell_commands if "debug_runner --model_path" in c]
    assert len(runs) == 1 and "--debug_buffer_size 65536" in runs[0]
    assert not [p for p in arm64.stats.pulls if p.endswith(".etdp")]  # nothing to pull after an overflow


# ------------------------------------------------------------------ (c) faults: a cut link, a missing runner


def test_device_gone_mid_pull_is_a_clear_failure_and_the_folder_goes(fp32_bundles, debug_runner, arm64, home,  # noqa: F811
                                                                       tmp_path):
    from bundlerun.targets.intermediates import IntermediatesFailed, capture

    arm64.set_faults(cut_pull_after=8, cut_pull_times=5)
    with pytest.raises(IntermediatesFailed) as info:
        capture(f"adb+tcp://127.0.0.1:{arm64.port}", fp32_bundles / "bad.bpte", "forward", 2, tmp_path / "w",
                config={"workspace": WORKSPACE, "retries": 1})
    text = str(info.value)
    assert "\n" not in text
    assert "lost the device while pulling the ETDump, the debug buffer and the outputs" in text
    assert f"device folder {WORKSPACE}/debug/forward-2 removed" in text
    assert len([p for p in arm64.stats.pulls if p.endswith("etdump.etdp")]) == 2  # tried, retried once, then gave up
    assert not _device_dir(arm64).exists()
    # the case ran once: the pull retry did not run it again
    assert len([c for c in arm64.stats.shell_commands if "debug_runner --model_path" in c]) == 1


def test_missing_debug_runner_is_a_clear_failure(fp32_bundles, arm64, home, tmp_path):  # noqa: F811
    from bundlerun.targets.intermediates import IntermediatesFailed, capture

    missing = tmp_path / "no" / "debug_runner"
    with pytest.raises(IntermediatesFailed, match=re.escape(f"debug_runner {missing} does not exist")):
        capture(f"adb+tcp://127.0.0.1:{arm64.port}", fp32_bundles / "bad.bpte", "forward", 2, tmp_path / "w",
                config={"workspace": WORKSPACE, "debug_runner": str(missing)})
    assert arm64.stats.connections == 0 and not _device_dir(arm64).exists()
    with pytest.raises(IntermediatesFailed, match=re.escape(f"debug_runner {missing} does not exist")) as info:
        capture(QEMU_URL, fp32_bundles / "bad.bpte", "forward", 2, tmp_path / "q", config={"debug_runner": str(missing)})
    assert "--debug-runner" in str(info.value)


def test_runner_that_dies_on_the_device_is_classified_and_cleaned(fp32_bundles, debug_runner, arm64, home,  # noqa: F811
                                                                   bundle_cache, tmp_path):
    """A Vulkan bundle: the debug runner (portable + quantized + XNNPACK) logs its own 'Backend ... is not
    registered.' line."""
    from bundlerun.targets.intermediates import IntermediatesFailed, capture

    vulkan = bundle_cache("mlp", backend="vulkan", cases=1, target="adb+tcp://127.0.0.1:5555")
    with pytest.raises(IntermediatesFailed) as info:
        capture(f"adb+tcp://127.0.0.1:{arm64.port}", vulkan, "forward", 0, tmp_path / "w",
                config={"workspace": WORKSPACE})
    text = str(info.value)
    assert "bundlerun's debug runner failed on forward[0]" in text and "VulkanBackend" in text
    assert not _device_dir(arm64, case=0).exists()


# ------------------------------------------------------------------ QNN profile (Python double)


def test_qnn_profile_uses_qnn_executor_runner_debug_flags(fp32_bundles, device, home, tmp_path):  # noqa: F811
    """Uses the PYTHON QNN DOUBLE (tests/doubles/android_runner.py), not Qualcomm's binary: checks that the
    qnn-executor-runner profile drives qnn_executor_runner with its own debug flags (plain .pte + one
    input line) and reads back the same files; the numerics are the host runtime's."""
    from bundlerun.runner.debug.localize import debug_bundle

    runners = runner_binaries(tmp_path / "runners")
    sdk = fake_qnn_sdk(tmp_path / "qnn", "75")
    cfg = {"runner": str(runners["qnn-executor-runner"]), "profile": "qnn-executor-runner",
           "qnn_sdk_root": str(sdk), "workspace": WORKSPACE}
    bad = debug_bundle(fp32_bundles / "bad.bpte", f"adb+tcp://127.0.0.1:{device.port}", case=2,
                       work_dir=tmp_path / "bad", target_config=cfg)
    row = bad.first_bad_row
    assert row is not None and row.aot_ops == ["conv2d_1"] and row.instruction == 4
    (run,) = [c for c in device.stats.shell_commands if "qnn_executor_runner --model_path" in c]
    for flag in ("--model_path model.pte", "--input_list_path input_list.txt", "--dump_intermediate_outputs",
                 "--debug_output_path outputs/debug_output.bin", "--etdump_path outputs/etdump.etdp",
                 f"--debug_buffer_size {64 << 20}", "--output_folder_path outputs"):
        assert flag in run
    assert "ADSP_LIBRARY_PATH=." in run and ".libQnnHtpV75Skel.so.partial" in {Path(p).name for p in device.stats.pushes}
    inputs = (tmp_path / "bad" / "android" / "forward-2" / "input_list.txt").read_text().split()
    case2 = read_bundle(fp32_bundles / "bad.bpte").suite("forward").test_cases[2].inputs[0]
    assert inputs == ["input_0_0.raw"]
    assert (tmp_path / "bad" / "android" / "forward-2" / "input_0_0.raw").read_bytes() == bytes(case2.data)
    assert not _device_dir(device).exists()
    assert np.isfinite(bad.output_stats["sqnr"])
