"""The Android lane against the REAL ExecuTorch executor_runner.

The device is the emulated adbd (tests/doubles/adbd.py, real ADB protocol); the
program it runs is ExecuTorch's own examples/portable/executor_runner, cross-built
for aarch64 from source (firmware_scripts/android/build_executor_runner.sh
--toolchain gnu) and executed by the device's shell under qemu-aarch64. Both
clients drive it: adb-shell (`adb+tcp://`) and the real `adb` CLI (`adb://`).
Every case of every bundle and every output comes back and is judged on the host.
Faults go through the real binary: its own "Missing operator" and "Backend ... is
not registered." lines, a corrupted push, SIGKILL mid-run, a link cut mid-pull, a
full device.

Which runner each Android test uses:
  real aarch64 executor_runner  this file, and the executor-runner profile tests of
                                test_android_target.py, test_android_faults.py and
                                test_android_cli.py (portable and XNNPACK bundles: the
                                runner carries XNNPACK, built from the tarballs)
  Python double                 only QNN's qnn_executor_runner layout and faults injected
                                into the runner (segv, missing library, short output,
                                missing flag, logcat), each test saying so

The missing-kernel, missing-delegate and corrupted-bundle tests check the
classification of the real runner's log (targets/et_runner/executor_runner.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle
from doubles.adbd import FakeAdbd
from doubles.android_env import PrivateAdbServer, real_executor_runner
from bundlerun.targets import open_target
from bundlerun.targets.base import CaseStatus, RunOptions
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.runner_cache import read_record

ZOO = ["mlp", "tiny-cnn", "mobile-net", "tiny-transformer", "tiny-gru"]
WORKSPACE = "/data/local/tmp/bundlerun real"
RUN_DIR = "data/local/tmp/bundlerun real/run"
BUNDLERUN = Path(sys.executable).with_name("bundlerun")

# rfft alone, in the repo so its build is cached across runs (aten::_fft_r2c.out: optimized-only)
FFT_MODEL = f"{Path(__file__).parent / 'fixtures' / 'op_models.py'}:make_spectrum"


@pytest.fixture(scope="module")
def runner() -> Path:
    try:
        folder = real_executor_runner("aarch64")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    return Path(read_record(folder)["binary"])


@pytest.fixture
def arm64(tmp_path):
    """An emulated arm64 device: pushed aarch64 ELFs run under qemu-aarch64."""
    try:
        d = FakeAdbd(tmp_path / "device", arm64=True)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    d.start()
    yield d
    d.stop()
    assert d.live_processes() == []


def _wait_idle(device, seconds=10.0):
    deadline = time.monotonic() + seconds
    while device.live_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return device.live_processes()


def _run(device, runner, bundle_path, tmp_path, *, url=None, cases=None, timeout=300.0, retries=1, **cfg):
    config = {"runner": str(runner), "workspace": WORKSPACE, **cfg}
    target = open_target(url or f"adb+tcp://127.0.0.1:{device.port}", config)
    opts = RunOptions(work_dir=tmp_path / "work", case_timeout_s=timeout, retries=retries,
                      cases=list(cases) if cases is not None else None)
    return target.run(read_bundle(bundle_path), bundle_path, opts)


def _kind(case) -> FailureKind | None:
    return FailureKind.parse(case.error_kind)


def _log(case) -> str:
    return open(case.log_path).read() if case.log_path else ""


@pytest.fixture(scope="module")
def mlp_bundle(bundle_cache):
    return bundle_cache("mlp", backend="portable", cases=4, target="host://portable")


# -- every case, every output ---------------------------------------------------------------------

def test_adb_tcp_runs_every_case_on_the_real_runner(arm64, home, runner, mlp_bundle, tmp_path):
    bundle = read_bundle(mlp_bundle)
    run = _run(arm64, runner, mlp_bundle, tmp_path, etdump=True, print_output="summary")
    assert [(c.method, c.case_index) for c in run.cases] == [("forward", i) for i in range(4)]
    for case in run.cases:
        assert case.status == CaseStatus.OK, (case.error, case.log_excerpt)
        want = bundle.suite("forward").test_cases[case.case_index].expected_outputs
        assert len(case.outputs) == len(want)
        for got, exp in zip(case.outputs, want):
            np.testing.assert_allclose(got.to_array(), exp.to_array(), rtol=1e-4, atol=1e-4)
        log = _log(case)
        # the real binary's own lines (posix PAL on stderr, merged by the legacy shell)
        assert "executorch:executor_runner.cpp" in log and "Model file model.bpte is loaded." in log
        assert "TEST: BundleIO index[0] Test_result: PASS" in log and "OutputX 0: tensor(" in log
        assert case.device_verdict["verdict"] == "PASS" and "max_absolute_error" in case.device_verdict["error_stats"]
        assert Path(case.extra["etdump"]).read_bytes()[8:12] == b"ED00"  # size-prefixed flatcc buffer
    assert run.info["pushed"].count("model.bpte") == 4 and "executor_runner" in run.info["pushed"]
    assert _wait_idle(arm64) == []


@pytest.mark.parametrize("model", ZOO)
def test_bundlerun_run_over_the_adb_cli_judges_every_case(arm64, home, runner, bundle_cache, tmp_path, model):
    """`bundlerun run X.bpte --target adb://SERIAL` (the real adb server) on the real runner."""
    bundle = bundle_cache(model, backend="portable", cases=4, target="host://portable")
    server = PrivateAdbServer(tmp_path / "adbhome").start()
    try:
        (tmp_path / "bundlerun.toml").write_text(
            f'[targets.adb]\nrunner = "{runner}"\nworkspace = "{WORKSPACE}"\nserver_port = {server.port}\n')
        env = dict(os.environ, HOME=str(home))
        res = subprocess.run([str(BUNDLERUN), "run", str(bundle), "--target", f"adb://127.0.0.1:{arm64.port}",
                              "--report", "r", "--no-history", "--quiet"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        report = json.loads((tmp_path / "r" / "report.json").read_text())
        assert report["summary"]["counts"]["PASS"] == 4
        for case in report["cases"]:
            assert case["status"] == "ok" and case["verdict"] == "PASS"
            assert case["outputs"] and all(o["verdict"] == "PASS" for o in case["outputs"])
        assert report["target"]["info"]["transport"].startswith("adb CLI")
    finally:
        server.stop()


# -- faults through the real binary ---------------------------------------------------------------

@pytest.fixture(scope="module")
def fft_bundle(tmp_path_factory):
    """A portable bundle needing aten::_fft_r2c.out: the host pybindings have it, this runner does not."""
    folder = tmp_path_factory.mktemp("fft")
    out = folder / "fft.bpte"
    res = subprocess.run([str(BUNDLERUN), "build", FFT_MODEL, "--backend", "portable",
                          "--dtype", "fp32", "--cases", "1", "--target", "host://portable", "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return out


def test_missing_operator_prints_the_real_line(arm64, home, runner, fft_bundle, tmp_path):
    case = _run(arm64, runner, fft_bundle, tmp_path).cases[0]
    assert case.status == CaseStatus.ERROR and not case.outputs
    log = _log(case)
    assert "Missing operator: [0] aten::_fft_r2c.out" in log
    assert "Loading of method forward failed with status 0x" in log
    assert "exit status 134" in log  # ET_CHECK_MSG -> abort(); qemu dies of the same signal


def test_missing_operator_is_classified_with_its_name(arm64, home, runner, fft_bundle, tmp_path):
    case = _run(arm64, runner, fft_bundle, tmp_path).cases[0]
    assert _kind(case) == FailureKind.MISSING_OPERATOR and "aten::_fft_r2c.out" in case.error


@pytest.fixture(scope="module")
def vulkan_bundle(bundle_cache):
    """A delegate the aarch64 runner lacks (it has XNNPACK, not Vulkan)."""
    return bundle_cache("mlp", backend="vulkan", cases=1, target="adb+tcp://127.0.0.1:5555")


def test_missing_backend_prints_the_real_line(arm64, home, runner, vulkan_bundle, tmp_path):
    case = _run(arm64, runner, vulkan_bundle, tmp_path).cases[0]
    assert case.status == CaseStatus.ERROR and not case.outputs
    assert "Backend VulkanBackend is not registered." in _log(case)


def test_missing_backend_is_classified_with_its_name(arm64, home, runner, vulkan_bundle, tmp_path):
    case = _run(arm64, runner, vulkan_bundle, tmp_path).cases[0]
    assert _kind(case) == FailureKind.MISSING_BACKEND and "VulkanBackend" in case.error


# -- XNNPACK bundles on the real runner (XNNPACK's aarch64 kernels) --------------------------------

@pytest.mark.parametrize("model, dtype", [(m, "fp32") for m in ZOO] + [("tiny-cnn", "fp16"), ("mobile-net", "int8")])
def test_xnnpack_bundle_every_case_over_adb_tcp(arm64, home, runner, bundle_cache, tmp_path, model, dtype):
    """The Android lane's main job: an XNNPACK bundle, every case, through the real runner's XNNPACK delegate."""
    path = bundle_cache(model, dtype=dtype, backend="xnnpack", cases=3, target="adb+tcp://127.0.0.1:5555")
    bundle = read_bundle(path)
    run = _run(arm64, runner, path, tmp_path)
    assert [c.case_index for c in run.cases] == [0, 1, 2]
    for case in run.cases:
        assert case.status == CaseStatus.OK, (case.error, case.log_excerpt)
        assert "executorch:executor_runner.cpp" in _log(case) and "is not registered" not in _log(case)
        want = bundle.suite("forward").test_cases[case.case_index].expected_outputs
        for got, exp in zip(case.outputs, want):
            assert got.scalar_type == exp.scalar_type and got.shape == list(exp.sizes)
            tol = {"fp32": 1e-4, "fp16": 2e-2, "int8": 0.05}[dtype]  # loose: the host judges with the registry
            np.testing.assert_allclose(got.to_array().astype(np.float32), exp.to_array().astype(np.float32),
                                       rtol=tol, atol=tol)
    assert _wait_idle(arm64) == []


def test_corrupted_push_fails_the_case_then_the_cache_heals(arm64, home, runner, mlp_bundle, tmp_path):
    # byte 4 is the BundleIO identifier "BP08": the runner no longer sees a bundle, reads
    # the file as a plain .pte and cannot parse it (exit 1, its own E line)
    arm64.set_faults(corrupt_push={"name": "model.bpte", "offset": 4})
    case = _run(arm64, runner, mlp_bundle, tmp_path / "a", cases=[0]).cases[0]
    assert case.status == CaseStatus.ERROR and not case.outputs
    assert "Failed to parse model file model.bpte" in _log(case)
    assert "Failed to parse model file" in case.error
    # next run: the device cache's sha256 check sees the bad copy and pushes it again
    arm64.set_faults()
    pushes = len([p for p in arm64.stats.pushes if "model.bpte" in p])
    again = _run(arm64, runner, mlp_bundle, tmp_path / "b", cases=[0]).cases[0]
    assert again.status == CaseStatus.OK, (again.error, again.log_excerpt)
    assert len([p for p in arm64.stats.pushes if "model.bpte" in p]) == pushes + 1


def test_corrupted_bundle_is_a_bad_bundle(arm64, home, runner, mlp_bundle, tmp_path):
    arm64.set_faults(corrupt_push={"name": "model.bpte", "offset": 4})
    case = _run(arm64, runner, mlp_bundle, tmp_path, cases=[0]).cases[0]
    assert _kind(case) == FailureKind.BAD_BUNDLE


def _kill_when_running(device, seconds=120.0) -> threading.Thread:
    """SIGKILL the runner (by the pid its launcher recorded) once it is running."""
    pidfile = device.root / RUN_DIR / ".runner.pid"

    def kill():
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                pid = int(pidfile.read_text().strip())
                time.sleep(1.0)  # let qemu get into the model's iterations
                os.kill(pid, 9)
                return
            except (OSError, ValueError):
                time.sleep(0.05)

    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


def test_sigkill_mid_run_is_a_crash(arm64, home, runner, bundle_cache, tmp_path):
    bundle = bundle_cache("mobile-net", backend="portable", cases=1, target="host://portable")
    killer = _kill_when_running(arm64)
    case = _run(arm64, runner, bundle, tmp_path, num_executions=100000).cases[0]
    killer.join(5)
    assert case.status == CaseStatus.ERROR and _kind(case) == FailureKind.CRASH
    assert "SIGKILL" in case.error and "137" in case.error
    assert case.extra["attempts"] == 1  # a killed runner is not a transport fault
    assert _wait_idle(arm64) == []


def test_hung_runner_times_out_and_is_killed(arm64, home, runner, bundle_cache, tmp_path):
    bundle = bundle_cache("mobile-net", backend="portable", cases=1, target="host://portable")
    t0 = time.monotonic()
    case = _run(arm64, runner, bundle, tmp_path, timeout=8, num_executions=100000).cases[0]
    assert case.status == CaseStatus.TIMEOUT and time.monotonic() - t0 < 60
    assert _wait_idle(arm64) == []  # qemu-aarch64 and its shell are gone


def test_offline_mid_pull_is_retried_without_rerunning(arm64, home, runner, mlp_bundle, tmp_path):
    arm64.set_faults(cut_pull_after=8, cut_pull_times=1)
    case = _run(arm64, runner, mlp_bundle, tmp_path, cases=[2], retries=2).cases[0]
    assert case.status == CaseStatus.OK, (case.error, case.log_excerpt)
    assert len([c for c in arm64.stats.shell_commands if "executor_runner --model_path" in c]) == 1
    want = read_bundle(mlp_bundle).suite("forward").test_cases[2].expected_outputs[0].to_array()
    np.testing.assert_allclose(case.outputs[0].to_array(), want, rtol=1e-4, atol=1e-4)


def test_offline_mid_pull_without_retries_is_a_transport_error(arm64, home, runner, mlp_bundle, tmp_path):
    arm64.set_faults(cut_pull_after=8, cut_pull_times=5)
    case = _run(arm64, runner, mlp_bundle, tmp_path, cases=[0], retries=0).cases[0]
    assert case.status == CaseStatus.ERROR and _kind(case) == FailureKind.TRANSPORT


def test_no_space_for_the_runner(arm64, home, runner, mlp_bundle, tmp_path):
    arm64.set_faults(free_bytes=runner.stat().st_size // 2)  # the 8 MB static runner does not fit
    case = _run(arm64, runner, mlp_bundle, tmp_path, cases=[0], retries=2).cases[0]
    assert case.status == CaseStatus.ERROR and "No space left on device" in case.error
    assert _kind(case) == FailureKind.DEVICE_FULL
    assert len([p for p in arm64.stats.pushes if p.endswith(".executor_runner.partial")]) == 1  # not retried
    assert arm64.stats.shell_commands and not any("--model_path" in c for c in arm64.stats.shell_commands)
