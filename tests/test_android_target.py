"""The Android target end to end against the emulated device, through both clients.

Bundles are real (zoo models lowered to XNNPACK by the builder). Which runner each test uses:
  real aarch64 executor_runner  (ExecuTorch's, cross-built from source with XNNPACK; the emulated arm64
                                device of tests/doubles/adbd.py runs it under qemu-aarch64): the
                                executor-runner profile tests and the device-cache test
  Python double                 (tests/doubles/android_runner.py): the qnn-executor-runner profile only -
                                Qualcomm's qnn_executor_runner and a phone's HTP cannot run here
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle
from doubles.adbd import FakeAdbd
from doubles.android_env import (PrivateAdbServer, adb_available, fake_qnn_sdk, real_executor_runner,
                                 runner_binaries)
from bundlerun.targets import open_target
from bundlerun.targets.android.profiles import sort_qnn_outputs
from bundlerun.targets.base import CaseStatus, RunOptions
from bundlerun.targets.runner_cache import read_record

WORKSPACE = "/data/local/tmp/bundle run's; $(x)"


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    """The Python double's runner scripts: used for the QNN profile only."""
    return runner_binaries(tmp_path_factory.mktemp("runners"))


@pytest.fixture(scope="module")
def real_runner() -> Path:
    """ExecuTorch's aarch64 executor_runner with XNNPACK (scripts/setup.sh builds it; fails, never skips)."""
    try:
        folder = real_executor_runner("aarch64")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    meta = read_record(folder)
    assert "xnnpack" in meta["backends"], f"{folder}: the aarch64 runner has no XNNPACK delegate; rebuild it"
    return Path(meta["binary"])


@pytest.fixture
def arm64(tmp_path):
    """An emulated arm64 device: pushed aarch64 ELFs run under qemu-aarch64; nothing may survive a test."""
    try:
        d = FakeAdbd(tmp_path / "device", arm64=True)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    d.start()
    yield d
    d.stop()
    assert d.live_processes() == []


@pytest.fixture(scope="module")
def bundle_path(bundle_cache):
    return bundle_cache("mlp", backend="xnnpack", cases=2, target="adb+tcp://127.0.0.1:5555")


def _assert_outputs_match_expected(bundle, run):
    for case in run.cases:
        assert case.status == CaseStatus.OK, (case.error, case.log_excerpt)
        expected = bundle.suite(case.method).test_cases[case.case_index].expected_outputs
        assert len(case.outputs) == len(expected)
        for got, want in zip(case.outputs, expected):
            assert got.shape == list(want.sizes) and got.scalar_type == want.scalar_type
            np.testing.assert_allclose(got.to_array(), want.to_array(), rtol=1e-3, atol=1e-3)
        assert case.log_path and "Test_result: PASS" in open(case.log_path).read()


@pytest.mark.slow
def test_adb_tcp_executor_runner_all_cases_then_nothing_pushed(arm64, home, real_runner, bundle_path, tmp_path):
    """The real aarch64 runner: XNNPACK's aarch64 kernels run every case of the XNNPACK bundle."""
    bundle = read_bundle(bundle_path)
    cfg = {"runner": str(real_runner), "workspace": WORKSPACE}
    target = open_target(f"adb+tcp://127.0.0.1:{arm64.port}", cfg)
    run = target.run(bundle, bundle_path, RunOptions(work_dir=tmp_path / "w1", case_timeout_s=120))
    assert [(c.method, c.case_index) for c in run.cases] == [("forward", 0), ("forward", 1)]
    _assert_outputs_match_expected(bundle, run)
    assert all(c.device_verdict["verdict"] == "PASS" for c in run.cases)
    assert all("executorch:executor_runner.cpp" in open(c.log_path).read() for c in run.cases)  # the real binary
    assert run.info["pushed"].count("model.bpte") == 2 and "executor_runner" in run.info["pushed"]
    pushes = len(arm64.stats.pushes)
    again = open_target(f"adb+tcp://127.0.0.1:{arm64.port}", cfg).run(
        bundle, bundle_path, RunOptions(work_dir=tmp_path / "w2", case_timeout_s=120, cases=[1]))
    assert again.cases[0].status == CaseStatus.OK
    assert again.info["pushed"] == [] and len(arm64.stats.pushes) == pushes
    assert arm64.stats.auth_prompts == 1  # the saved key is trusted from then on


@pytest.mark.skipif(not adb_available(), reason="the adb binary is not installed")
def test_adb_server_executor_runner(arm64, home, real_runner, bundle_path, tmp_path):
    """The real aarch64 runner over the real adb CLI and a private adb server."""
    server = PrivateAdbServer(tmp_path / "adbhome").start()
    try:
        bundle = read_bundle(bundle_path)
        cfg = {"runner": str(real_runner), "workspace": WORKSPACE, "server_port": server.port}
        # the target runs `adb connect` itself for a HOST:PORT serial
        run = open_target(f"adb://127.0.0.1:{arm64.port}", cfg).run(
            bundle, bundle_path, RunOptions(work_dir=tmp_path / "w", case_timeout_s=120))
        _assert_outputs_match_expected(bundle, run)
        assert run.info["transport"].startswith("adb CLI")
    finally:
        server.stop()


def test_qnn_profile_extracts_pte_and_inputs(device, home, runners, bundle_path, tmp_path):
    """Uses the PYTHON DOUBLE of qnn_executor_runner: Qualcomm's binary and a phone's HTP cannot run here."""
    bundle = read_bundle(bundle_path)
    sdk = fake_qnn_sdk(tmp_path / "qnn", "75")
    cfg = {"runner": str(runners["qnn-executor-runner"]), "profile": "qnn-executor-runner",
           "qnn_sdk_root": str(sdk)}  # the HTP arch comes from the device's ro.soc.model
    run = open_target(f"adb+tcp://127.0.0.1:{device.port}", cfg).run(
        bundle, bundle_path, RunOptions(work_dir=tmp_path / "w", case_timeout_s=120))
    assert run.info["htp_arch"] == "75" and run.info["device_model"] == "Emulated_SoC_sm8650"
    for case in run.cases:
        assert case.status == CaseStatus.OK, (case.error, case.log_excerpt)
        want = bundle.suite("forward").test_cases[case.case_index].expected_outputs[0]
        np.testing.assert_allclose(case.outputs[0].to_array(), want.to_array(), rtol=1e-3, atol=1e-3)
    pushed = set(run.info["pushed"])
    assert {"libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV75Stub.so", "libQnnHtpPrepare.so",
            "libQnnHtpV75Skel.so", "model.pte", "input_list.txt", "qnn_executor_runner"} <= pushed
    # one process ran every case
    runs = [c for c in device.stats.shell_commands if "qnn_executor_runner --model_path" in c]
    assert len(runs) == 1 and "--input_list_path input_list.txt" in runs[0]
    listing = open(tmp_path / "w/android/qnn/forward/input_list.txt").read().splitlines()
    assert listing == ["inputs/input_0_0.raw", "inputs/input_1_0.raw"]


def test_qnn_output_files_sort_numerically():
    names = [f"output_{i}_{j}.raw" for i in (10, 2, 1) for j in (10, 0, 2)] + ["junk.txt"]
    grouped = sort_qnn_outputs(names)
    assert list(grouped) == [1, 2, 10]
    assert grouped[10] == ["output_10_0.raw", "output_10_2.raw", "output_10_10.raw"]


def test_qnn_without_sdk_is_a_clear_error(device, home, runners, bundle_path, tmp_path, monkeypatch):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    from bundlerun.bundles.errors import TargetError

    target = open_target(f"adb+tcp://127.0.0.1:{device.port}",
                         {"runner": str(runners["qnn-executor-runner"]), "profile": "qnn-executor-runner", "htp_arch": "75"})
    with pytest.raises(TargetError, match="QNN_SDK_ROOT"):
        target.run(read_bundle(bundle_path), bundle_path, RunOptions(work_dir=tmp_path / "w"))


def test_bad_config_is_rejected():
    from bundlerun.bundles.errors import ConfigError

    with pytest.raises(ConfigError, match="under /data/local/tmp/"):
        open_target("adb+tcp://127.0.0.1:5555", {"workspace": "/sdcard/x"})
    with pytest.raises(ConfigError, match="unknown setting"):
        open_target("adb+tcp://127.0.0.1:5555", {"runer": "x"})
    with pytest.raises(ConfigError, match="profile"):
        open_target("adb://X", {"profile": "nope"})
    t = open_target("adb://SERIAL1?host=10.1.1.1&port=5038", {})
    assert t.transport.server_host == "10.1.1.1" and t.transport.server_port == 5038
    assert t.transport.serial == "SERIAL1"


def test_device_cache_is_bounded_lru(arm64, home, real_runner, bundle_path, tmp_path):
    """The real runner (about 10 MB, static): the bound is this run's files plus 1.5 stale entries."""
    import os
    import time

    device = arm64
    cache = device.root / "data/local/tmp/bundlerun/cache"
    stale = []
    for i in range(3):  # three old 300 kB entries, 0 the least recently used
        d = cache / (f"{i}" * 64)
        d.mkdir(parents=True)
        (d / "old.bpte").write_bytes(b"x" * 300_000)
        os.utime(d, (time.time() - 3600 + i * 60,) * 2)
        stale.append(d)
    # du counts 4 kB blocks: this run's two entries + one stale entry (296 kB) fit, a second one does not
    bound = real_runner.stat().st_size + bundle_path.stat().st_size + 2 * 4096 + 296 * 1024 + 150_000
    cfg = {"runner": str(real_runner), "cache_max_mb": bound / (1024 * 1024)}
    run = open_target(f"adb+tcp://127.0.0.1:{device.port}", cfg).run(
        read_bundle(bundle_path), bundle_path, RunOptions(work_dir=tmp_path / "w", cases=[0]))
    assert run.cases[0].status == CaseStatus.OK, (run.cases[0].error, run.cases[0].log_excerpt)
    # this run's files (touched, newest) + the newest stale entry fit in the bound; the older two go
    assert sorted(run.info["pruned"]) == [stale[0].name, stale[1].name]
    assert not stale[0].exists() and not stale[1].exists() and stale[2].exists()
    assert len(list(cache.iterdir())) == 3  # runner, case bundle, newest stale entry
