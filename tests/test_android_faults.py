"""Every fault scenario of the Android lane gives a classified result, with the device log,
and leaves nothing running on the (emulated) device."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle, write_bundle
from doubles.adbd import FakeAdbd
from doubles.android_env import PrivateAdbServer, adb_available, runner_binaries
from bundlerun.targets import open_target
from bundlerun.targets.base import CaseStatus, RunOptions






def _wait_idle(device, seconds=10.0):
    deadline = time.monotonic() + seconds
    while device.live_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return device.live_processes()


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    return runner_binaries(tmp_path_factory.mktemp("runners"))


@pytest.fixture(scope="module")
def bundle_path(bundle_cache):
    return bundle_cache("mlp", backend="xnnpack", cases=2, target="adb+tcp://127.0.0.1:5555")


def _run(device, runners, bundle_path, tmp_path, *, url=None, cases=(0,), timeout=120.0, retries=1, **cfg):
    config = {"runner": str(runners["executor-runner"]), **cfg}
    target = open_target(url or f"adb+tcp://127.0.0.1:{device.port}", config)
    return target.run(read_bundle(bundle_path), bundle_path,
                      RunOptions(work_dir=tmp_path / "work", case_timeout_s=timeout, cases=list(cases), retries=retries))


def test_segfault_is_a_crash_with_the_log(device, home, runners, bundle_path, tmp_path):
    device.set_faults(runner={"segv": True})
    case = _run(device, runners, bundle_path, tmp_path).cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "crash"
    assert "SIGSEGV" in case.error and "139" in case.error
    assert case.extra["attempts"] == 1  # a crash is not a transport fault: no retry
    assert "exit status 139" in open(case.log_path).read()


def test_hang_times_out_and_is_killed(device, home, runners, bundle_path, tmp_path):
    device.set_faults(runner={"hang": True})
    t0 = time.monotonic()
    case = _run(device, runners, bundle_path, tmp_path, timeout=3).cases[0]
    assert case.status == CaseStatus.TIMEOUT and case.error_kind == "host-timeout"
    assert time.monotonic() - t0 < 30
    assert _wait_idle(device) == []
    assert case.log_path and "timed out" in open(case.log_path).read()


@pytest.mark.skipif(not adb_available(), reason="the adb binary is not installed")
def test_hang_over_adb_server_is_killed_too(device, home, runners, bundle_path, tmp_path):
    server = PrivateAdbServer(tmp_path / "adbhome").start()
    try:
        device.set_faults(runner={"hang": True})
        case = _run(device, runners, bundle_path, tmp_path, url=f"adb://127.0.0.1:{device.port}", timeout=3,
                    server_port=server.port).cases[0]
        assert case.status == CaseStatus.TIMEOUT
        assert _wait_idle(device) == []
    finally:
        server.stop()


def test_missing_library_is_classified(device, home, runners, bundle_path, tmp_path):
    device.set_faults(runner={"missing_lib": "libvulkan_custom.so"})
    case = _run(device, runners, bundle_path, tmp_path).cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "load-failure"
    assert 'library "libvulkan_custom.so" not found' in case.error
    assert any("dlopen failed" in line for line in case.log_excerpt)


def test_no_space_reports_the_device_message(device, home, runners, bundle_path, tmp_path):
    device.set_faults(free_bytes=100)
    run = _run(device, runners, bundle_path, tmp_path, cases=(0, 1), retries=3)
    assert [c.status for c in run.cases] == [CaseStatus.ERROR, CaseStatus.ERROR]
    assert all(c.error_kind == "device-full" and "No space left on device" in c.error for c in run.cases)
    assert len(device.stats.pushes) == 1  # not retried: a full disk is not transient
    assert run.cases[0].log_path and "No space left" in open(run.cases[0].log_path).read()


def test_offline_and_unauthorized_devices(tmp_path, home, runners, bundle_path):
    for faults, accept, kind in (({"offline": True}, True, "offline"), ({}, False, "unauthorized")):
        d = FakeAdbd(tmp_path / kind, faults=faults, accept_new_keys=accept)
        d.start()
        try:
            run = _run(d, runners, bundle_path, tmp_path / kind, cases=(0, 1), connect_timeout_s=1, auth_timeout_s=1)
            assert [c.error_kind for c in run.cases] == ["transport", "transport"]
            assert [c.extra["transport_fault"] for c in run.cases] == [kind, kind]
            assert all(c.status == CaseStatus.ERROR for c in run.cases)
            assert d.stats.shell_commands == []
        finally:
            d.stop()


def test_transfer_cut_exhausts_bounded_retries(device, home, runners, bundle_path, tmp_path):
    device.set_faults(cut_push_after=1000, cut_push_times=10)  # past the ~200-byte runner stand-in
    case = _run(device, runners, bundle_path, tmp_path, retries=2).cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "transport"
    attempts = [p for p in device.stats.pushes if p.endswith("/.model.bpte.partial")]
    assert len(attempts) == 3 and case.extra["attempts"] == 3  # first try + 2 retries, then it gives up


@pytest.mark.slow
def test_cut_push_and_pull_are_retried_and_complete(device, home, runners, bundle_path, tmp_path):
    bundle = read_bundle(bundle_path)
    size = bundle_path.stat().st_size
    device.set_faults(cut_push_after=size // 2, cut_push_times=1, cut_pull_after=8, cut_pull_times=1)
    case = _run(device, runners, bundle_path, tmp_path, retries=2).cases[0]
    assert case.status == CaseStatus.OK, (case.error, case.log_excerpt)
    assert case.extra["attempts"] == 3  # two transport retries out of the budget of 2
    runs = [c for c in device.stats.shell_commands if "executor_runner --model_path" in c]
    assert len(runs) == 1  # the cut pull was retried alone; the case did not run again
    want = bundle.suite("forward").test_cases[0].expected_outputs[0].to_array()
    np.testing.assert_allclose(case.outputs[0].to_array(), want, rtol=1e-3, atol=1e-3)
    assert _wait_idle(device) == []


@pytest.mark.slow
def test_wrong_output_size_and_numerical_failure(device, home, runners, bundle_path, tmp_path):
    device.set_faults(runner={"short_output": True})
    case = _run(device, runners, bundle_path, tmp_path / "a").cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "wrong-output-size"
    assert "expected 40" in case.error

    # a bundle whose expected outputs are off: the runner says FAIL (exit 1), the target
    # still returns the outputs (judged on the host) and does not retry
    device.set_faults()
    bundle = read_bundle(bundle_path)
    exp = bundle.method_test_suites[0].test_cases[0].expected_outputs[0]
    exp.data = (exp.to_array() + 5.0).astype(np.float32).tobytes()
    off = tmp_path / "off.bpte"
    write_bundle(bundle, off)
    case = _run(device, runners, off, tmp_path / "b", retries=3).cases[0]
    assert case.status == CaseStatus.OK and case.device_verdict["verdict"] == "FAIL"
    assert case.extra["attempts"] == 1
    assert np.abs(case.outputs[0].to_array() - exp.to_array()).max() > 4.0


def test_logcat_is_saved_with_the_case_log(device, home, runners, bundle_path, tmp_path):
    # a runner built with the Android PAL logs to logcat; the target clears it before
    # the run and saves `logcat -d` after, and classifies from it too
    device.set_faults(runner={"segv": True})
    (device.root / ".logcat").write_text("stale line from an earlier app\n")
    case = _run(device, runners, bundle_path, tmp_path, logcat=True).cases[0]
    text = open(case.log_path).read()
    assert "--- logcat ---" in text and "stale line" not in text
    assert any(c.startswith("( logcat -c") for c in device.stats.shell_commands)
    assert case.error_kind == "crash"


@pytest.mark.skipif(not adb_available(), reason="the adb binary is not installed")
def test_cut_push_and_no_space_over_adb_server(device, home, runners, bundle_path, tmp_path):
    server = PrivateAdbServer(tmp_path / "adbhome").start()
    url = f"adb://127.0.0.1:{device.port}"
    try:
        # the link drops while the bundle is pushed: the adb server loses the device,
        # the target reconnects it and retries; then the (fast) crash is reported
        device.set_faults(cut_push_after=2000, cut_push_times=1, runner={"segv": True})
        case = _run(device, runners, bundle_path, tmp_path / "a", url=url, retries=2, server_port=server.port).cases[0]
        assert case.error_kind == "crash" and case.extra["attempts"] == 2
        device.set_faults(free_bytes=100)
        (tmp_path / "b").mkdir()
        import shutil

        shutil.rmtree(device.root / "data/local/tmp/bundlerun")
        case = _run(device, runners, bundle_path, tmp_path / "b", url=url, server_port=server.port).cases[0]
        assert case.error_kind == "device-full" and "remote write failed: No space left on device" in case.error
    finally:
        server.stop()


def test_runner_without_a_flag_is_explained(device, home, runners, bundle_path, tmp_path):
    device.set_faults(runner={"missing_flags": ["etdump_path"]})
    case = _run(device, runners, bundle_path, tmp_path, etdump=True).cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "tool-failed"
    assert "--etdump_path" in case.error


def test_transport_errors_land_in_the_case_log(device, home, runners, bundle_path, tmp_path):
    device.set_faults(cut_push_after=1000, cut_push_times=10)
    case = _run(device, runners, bundle_path, tmp_path, retries=0).cases[0]
    assert case.error_kind == "transport" and case.log_path
    assert "--- transport:" in open(case.log_path).read()
