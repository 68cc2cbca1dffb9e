"""Every fault scenario of the Android lane gives a classified result, with the device log,
and leaves nothing running on the (emulated) device.

The device is tests/doubles/adbd.py as an arm64 device (pushed aarch64 ELFs run under qemu-aarch64).
Which runner each test uses (the `real` / `runners` fixture it takes):
  real aarch64 executor_runner  ExecuTorch's, with XNNPACK, for the XNNPACK bundle: a real hang (the runner
                                looping --num_executions) stopped at the case timeout, transport faults
                                (no space, offline, unauthorized, cut push/pull), a numerical failure
  Python double                 only for faults injected INTO the runner, which the real binary cannot be
                                made to show here: segfault, missing library, short output file, a runner
                                lacking a flag, and the logcat of an Android-PAL build
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle, write_bundle
from doubles.adbd import FakeAdbd
from doubles.android_env import PrivateAdbServer, adb_available, runner_binaries
from bundlerun.targets import open_target
from bundlerun.targets.base import CaseStatus, RunOptions
from tests.test_android_target import real_runner  # noqa: F401 - the real aarch64 runner fixture


def _wait_idle(device, seconds=10.0):
    deadline = time.monotonic() + seconds
    while device.live_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return device.live_processes()


@pytest.fixture
def device(tmp_path):
    """An emulated arm64 device (overrides conftest's, which is arm64 only when qemu-aarch64 and cc exist)."""
    try:
        d = FakeAdbd(tmp_path / "device", arm64=True)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    d.start()
    yield d
    d.stop()
    assert d.live_processes() == []


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    """The PYTHON DOUBLE (tests/doubles/android_runner.py), for runner-injected faults only."""
    return runner_binaries(tmp_path_factory.mktemp("runners"))


@pytest.fixture(scope="module")
def real(real_runner):  # noqa: F811
    """The real runner, in the shape `_run` takes."""
    return {"executor-runner": real_runner}


@pytest.fixture(scope="module")
def bundle_path(bundle_cache):
    return bundle_cache("mlp", backend="xnnpack", cases=2, target="adb+tcp://127.0.0.1:5555")


def _run(device, runners, bundle_path, tmp_path, *, url=None, cases=(0,), timeout=120.0, retries=1, **cfg):
    config = {"runner": str(runners["executor-runner"]), **cfg}
    target = open_target(url or f"adb+tcp://127.0.0.1:{device.port}", config)
    return target.run(read_bundle(bundle_path), bundle_path,
                      RunOptions(work_dir=tmp_path / "work", case_timeout_s=timeout, cases=list(cases), retries=retries))


def test_segfault_is_a_crash_with_the_log(device, home, runners, bundle_path, tmp_path):
    """Python double: a segfault injected into the runner (qemu-user://'s tests kill the real one with SIGSEGV)."""
    device.set_faults(runner={"segv": True})
    case = _run(device, runners, bundle_path, tmp_path).cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "crash"
    assert "SIGSEGV" in case.error and "139" in case.error
    assert case.extra["attempts"] == 1  # a crash is not a transport fault: no retry
    assert "exit status 139" in open(case.log_path).read()


def test_hang_times_out_and_is_killed(device, home, real, bundle_path, tmp_path):
    """The real runner looping (--num_executions 100000) past the case timeout: qemu-aarch64 is killed."""
    t0 = time.monotonic()
    case = _run(device, real, bundle_path, tmp_path, timeout=5, num_executions=100000).cases[0]
    assert case.status == CaseStatus.TIMEOUT and case.error_kind == "host-timeout"
    assert time.monotonic() - t0 < 60
    assert _wait_idle(device) == []
    assert case.log_path and "timed out" in open(case.log_path).read()


@pytest.mark.skipif(not adb_available(), reason="the adb binary is not installed")
def test_hang_over_adb_server_is_killed_too(device, home, real, bundle_path, tmp_path):
    server = PrivateAdbServer(tmp_path / "adbhome").start()
    try:
        case = _run(device, real, bundle_path, tmp_path, url=f"adb://127.0.0.1:{device.port}", timeout=5,
                    num_executions=100000, server_port=server.port).cases[0]
        assert case.status == CaseStatus.TIMEOUT
        assert _wait_idle(device) == []
    finally:
        server.stop()


def test_missing_library_is_classified(device, home, runners, bundle_path, tmp_path):
    """Python double: bionic's dlopen message (the static glibc runner loads no library)."""
    device.set_faults(runner={"missing_lib": "libvulkan_custom.so"})
    case = _run(device, runners, bundle_path, tmp_path).cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "load-failure"
    assert 'library "libvulkan_custom.so" not found' in case.error
    assert any("dlopen failed" in line for line in case.log_excerpt)


def test_no_space_reports_the_device_message(device, home, real, bundle_path, tmp_path):
    device.set_faults(free_bytes=100)
    run = _run(device, real, bundle_path, tmp_path, cases=(0, 1), retries=3)
    assert [c.status for c in run.cases] == [CaseStatus.ERROR, CaseStatus.ERROR]
    assert all(c.error_kind == "device-full" and "No space left on device" in c.error for c in run.cases)
    assert len(device.stats.pushes) == 1  # not retried: a full disk is not transient
    assert run.cases[0].log_path and "No space left" in open(run.cases[0].log_path).read()


def test_offline_and_unauthorized_devices(tmp_path, home, real, bundle_path):
    for faults, accept, kind in (({"offline": True}, True, "offline"), ({}, False, "unauthorized")):
        d = FakeAdbd(tmp_path / kind, faults=faults, accept_new_keys=accept)
        d.start()
        try:
            run = _run(d, real, bundle_path, tmp_path / kind, cases=(0, 1), connect_timeout_s=1, auth_timeout_s=1)
            assert [c.error_kind for c in run.cases] == ["transport", "transport"]
            assert [c.extra["transport_fault"] for c in run.cases] == [kind, kind]
            assert all(c.status == CaseStatus.ERROR for c in run.cases)
            assert d.stats.shell_commands == []
        finally:
            d.stop()


def _model_pushes(device) -> int:
    return len([p for p in device.stats.pushes if p.endswith("/.model.bpte.partial")])


def test_transfer_cut_exhausts_bounded_retries(device, home, real, bundle_path, tmp_path):
    # case 1 first, cleanly: the (10 MB) runner is then in the device cache and only case 0's bundle is pushed
    assert _run(device, real, bundle_path, tmp_path / "warm", cases=(1,)).cases[0].status == CaseStatus.OK
    before = _model_pushes(device)
    device.set_faults(cut_push_after=1000, cut_push_times=10)
    case = _run(device, real, bundle_path, tmp_path, retries=2).cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "transport"
    assert _model_pushes(device) - before == 3 and case.extra["attempts"] == 3  # first try + 2 retries


@pytest.mark.slow
def test_cut_push_and_pull_are_retried_and_complete(device, home, real, bundle_path, tmp_path):
    bundle = read_bundle(bundle_path)
    size = bundle_path.stat().st_size
    assert _run(device, real, bundle_path, tmp_path / "warm", cases=(1,)).cases[0].status == CaseStatus.OK
    runs_before = len([c for c in device.stats.shell_commands if "executor_runner --model_path" in c])
    device.set_faults(cut_push_after=size // 2, cut_push_times=1, cut_pull_after=8, cut_pull_times=1)
    case = _run(device, real, bundle_path, tmp_path, retries=2).cases[0]
    assert case.status == CaseStatus.OK, (case.error, case.log_excerpt)
    assert case.extra["attempts"] == 3  # two transport retries out of the budget of 2
    runs = [c for c in device.stats.shell_commands if "executor_runner --model_path" in c]
    assert len(runs) - runs_before == 1  # the cut pull was retried alone; the case did not run again
    want = bundle.suite("forward").test_cases[0].expected_outputs[0].to_array()
    np.testing.assert_allclose(case.outputs[0].to_array(), want, rtol=1e-3, atol=1e-3)
    assert _wait_idle(device) == []


def test_wrong_output_size(device, home, runners, bundle_path, tmp_path):
    """Python double: a runner whose output file is cut short (injected)."""
    device.set_faults(runner={"short_output": True})
    case = _run(device, runners, bundle_path, tmp_path / "a").cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "wrong-output-size"
    assert "expected 40" in case.error


@pytest.mark.slow
def test_numerical_failure_keeps_the_outputs(device, home, real, bundle_path, tmp_path):
    # a bundle whose expected outputs are off: the real runner says FAIL (exit 1), the target
    # still returns the outputs (judged on the host) and does not retry
    bundle = read_bundle(bundle_path)
    exp = bundle.method_test_suites[0].test_cases[0].expected_outputs[0]
    exp.data = (exp.to_array() + 5.0).astype(np.float32).tobytes()
    off = tmp_path / "off.bpte"
    write_bundle(bundle, off)
    case = _run(device, real, off, tmp_path / "b", retries=3).cases[0]
    assert "Test_result: FAIL" in open(case.log_path).read()
    assert case.status == CaseStatus.OK and case.device_verdict["verdict"] == "FAIL"
    assert case.extra["attempts"] == 1
    assert np.abs(case.outputs[0].to_array() - exp.to_array()).max() > 4.0


def test_logcat_is_saved_with_the_case_log(device, home, runners, bundle_path, tmp_path):
    """Python double (injected segfault); the real gnu runner logs to stderr, not logcat."""
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
    """Python double: its injected crash ends the retried case at once."""
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
    """Python double: a runner built without the event tracer (the real one here has every flag)."""
    device.set_faults(runner={"missing_flags": ["etdump_path"]})
    case = _run(device, runners, bundle_path, tmp_path, etdump=True).cases[0]
    assert case.status == CaseStatus.ERROR and case.error_kind == "tool-failed"
    assert "--etdump_path" in case.error


def test_transport_errors_land_in_the_case_log(device, home, real, bundle_path, tmp_path):
    # the runner is pushed by a clean run first (a cut runner push fails the setup, logged in setup.log):
    # here the case's own bundle push is cut
    assert _run(device, real, bundle_path, tmp_path / "warm", cases=(1,)).cases[0].status == CaseStatus.OK
    device.set_faults(cut_push_after=1000, cut_push_times=10)
    case = _run(device, real, bundle_path, tmp_path, retries=0).cases[0]
    assert case.error_kind == "transport" and case.log_path
    assert "--- transport:" in open(case.log_path).read()
