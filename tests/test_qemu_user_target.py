"""`qemu-user://aarch64` end to end: ExecuTorch's real executor_runner, cross-built from source
for aarch64 (cached by scripts/setup.sh), under the real qemu-aarch64, every case and output
judged on the host; faults from the real binary's own log and exit status. No double.

The runner carries XNNPACK (with KleidiAI) built for the emulated CPU (qemu's -cpu max): XNNPACK
bundles run through XNNPACK's aarch64 kernels, which are not the x86 ones host://xnnpack runs; the
same bundle on both targets is compared side by side with `bundlerun compare`."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import BundledValue, read_bundle, serialize_bundle, write_bundle
from tests.conftest import run_cli
from tests.doubles.android_env import real_executor_runner
from bundlerun.targets.runner_cache import read_record

URL = "qemu-user://aarch64"
XNN_DTYPES = ("fp32", "fp16", "int8")
# rfft alone, in the repo so its build is cached across runs (aten::_fft_r2c.out: optimized-only)
FFT_MODEL = f"{Path(__file__).parent / 'fixtures' / 'op_models.py'}:make_spectrum"


@pytest.fixture(scope="module")
def runner():
    return real_executor_runner("aarch64")  # fails with the build command when it is not built


@pytest.fixture(scope="module")
def xnn_runner(runner):
    """The runner folder, checked to carry the XNNPACK delegate (runner.json, written by the build)."""
    meta = read_record(runner)
    assert "xnnpack" in meta["backends"] and meta["xnnpack"]["kleidiai"], (
        f"{runner} has no XNNPACK delegate: rebuild with firmware_scripts/android/build_executor_runner.sh --toolchain gnu")
    return runner


def _qemu_under(folder: Path) -> list[int]:
    """qemu-aarch64 processes running in `folder` (this test's own tmp_path: the target runs each case
    in a folder under its work dir), never anyone else's."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0]
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if argv0.endswith(b"qemu-aarch64") and Path(cwd).is_relative_to(folder):
            found.append(int(proc.name))
    return found


def _no_qemu_left(folder: Path) -> bool:
    return _qemu_under(folder) == []


def test_zoo_fp32_and_int8_on_aarch64(runner, tmp_path):
    res = run_cli("validate", "zoo", "--target", URL, "--dtype", "fp32", "--cases", "3", "--report",
                  str(tmp_path / "fp32"), "--no-history", "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = json.loads(res.stdout)["runs"]
    assert len(runs) == 6 and all(r["verdict"] == "PASS" for r in runs), runs
    report = json.loads((tmp_path / "fp32" / "tiny-transformer-fp32" / "report.json").read_text())
    assert report["bundle"]["backend"] == "portable" and report["target"]["info"]["arch"] == "aarch64"
    assert report["target"]["info"]["runner_mode"] == {"forward": "executor_runner --server_mode: one process for 3 case(s)"}
    for case in report["cases"]:
        assert case["extra"]["outputs_from"] == "files" and case["extra"]["served"].startswith("executor_runner --server")
        assert case["outputs"][0]["stats"]["error_max"] < 1e-5  # aarch64 vs eager x86: ulp-level only
    # a process per case: each one-case bundle is also checked by the runner's own BundleIO check
    # (portable named: int8 on qemu-user defaults to XNNPACK, which test_validate_zoo_xnnpack_every_model_and_dtype runs)
    res = run_cli("validate", "mlp", "--target", URL + "?server=false", "--dtype", "int8", "--backend", "portable",
                  "--cases", "2", "--report", str(tmp_path / "int8"), "--no-history", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["runs"][0]["verdict"] == "PASS", res.stderr[-2000:]
    report = json.loads((tmp_path / "int8" / "mlp-int8" / "report.json").read_text())
    assert [c["device_verdict"]["verdict"] for c in report["cases"]] == ["PASS", "PASS"]
    assert _no_qemu_left(tmp_path)


def test_missing_backend_and_bad_runner_are_classified(runner, bundle_cache, tmp_path):
    # a Vulkan bundle: the aarch64 runner has portable + quantized kernels and XNNPACK, no Vulkan delegate
    vulkan = bundle_cache("mlp", backend="vulkan", cases=1, target=URL)
    res = run_cli("run", str(vulkan), "--target", URL, "--report", str(tmp_path / "x"), "--no-history")
    report = json.loads((tmp_path / "x" / "report.json").read_text())
    assert res.returncode == 2
    (case,) = report["cases"]
    assert case["error_kind"] == "missing-backend" and "VulkanBackend" in case["error"]
    assert any("is not registered" in line for line in case["log_excerpt"])
    portable = bundle_cache("mlp", backend="portable", cases=1, target="host://portable")
    res = run_cli("run", str(portable), "--target", URL + f"?runner={tmp_path / 'none'}", "--report",
                  str(tmp_path / "y"), "--no-history")
    report = json.loads((tmp_path / "y" / "report.json").read_text())
    assert res.returncode == 2 and report["cases"][0]["error_kind"] == "tool-missing"
    assert "build it with firmware_scripts/android/build_executor_runner.sh" in report["cases"][0]["error"]


# -- XNNPACK on the real aarch64 runner -----------------------------------------------------------

def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def test_validate_zoo_xnnpack_every_model_and_dtype(xnn_runner, tmp_path):
    """The README's `bundlerun validate zoo --target qemu-user://aarch64 --backend xnnpack`: every zoo model in
    fp32, fp16 and int8, every case run by XNNPACK's aarch64 kernels and judged with the registry's numbers."""
    from bundlerun.bundles.zoo import names
    from bundlerun.targets.program.walker import read_delegates

    res = run_cli("validate", "zoo", "--target", URL, "--backend", "xnnpack", "--dtype", ",".join(XNN_DTYPES),
                  "--cases", "2", "--report", str(tmp_path / "v"), "--no-history", "--json", timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = json.loads(res.stdout)["runs"]
    assert sorted(r["run"] for r in runs) == sorted(f"{m}-{d}" for m in names() for d in XNN_DTYPES)
    assert all(r["verdict"] == "PASS" for r in runs), [(r["run"], r["verdict"]) for r in runs]
    for r in runs:
        report = _report(Path(r["report"]).parent)
        info = report["target"]["info"]
        assert report["bundle"]["backend"] == "xnnpack" and info["delegates"] == ["xnnpack"] and info["cpu"] == "max"
        assert info["runner"] == str(xnn_runner / "executor_runner")
        assert len(report["cases"]) == 2
        for case in report["cases"]:
            assert case["status"] == "ok" and case["extra"]["outputs_from"] == "files", case
            assert case["outputs"] and all(o["verdict"] == "PASS" for o in case["outputs"])
        # the program really delegates to XNNPACK: the runner would have refused it without the delegate
        program = read_bundle(Path(r["report"]).parent / f"{r['run']}.bpte").program
        assert any(d.backend_id == "XnnpackBackend" for d in read_delegates(bytes(program)))
    assert _no_qemu_left(tmp_path)


def test_same_bundle_on_host_and_aarch64_side_by_side(xnn_runner, bundle_cache, tmp_path):
    """One fp16 XNNPACK bundle on host://xnnpack (x86 kernels) and qemu-user://aarch64 (aarch64 fp16 arithmetic):
    both judged, and `bundlerun compare` shows each output's errors of the two targets side by side."""
    bundle = bundle_cache("tiny-cnn", dtype="fp16", backend="xnnpack", cases=3, target="host://xnnpack")
    for name, url in (("host", "host://xnnpack"), ("arm", URL)):
        res = run_cli("run", str(bundle), "--target", url, "--report", str(tmp_path / name), "--no-history", "--quiet",
                      "--save-outputs")
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    host, arm = np.load(tmp_path / "host" / "outputs.npz"), np.load(tmp_path / "arm" / "outputs.npz")
    assert sorted(host.files) == sorted(arm.files) and len(host.files) == 3
    # different kernels, different fp16 rounding: not bit-identical, yet close
    assert any(host[k].tobytes() != arm[k].tobytes() for k in host.files)
    for k in host.files:
        np.testing.assert_allclose(arm[k].astype(np.float32), host[k].astype(np.float32), atol=5e-3, rtol=5e-3)
    res = run_cli("compare", str(tmp_path / "host"), str(tmp_path / "arm"), "--json")
    assert res.returncode in (0, 1), res.stderr  # 1: the aarch64 run's errors grew past [regression] (reported)
    data = json.loads(res.stdout)
    assert data["cross_target"] is True and data["forced"] is False
    assert data["baseline"]["target"] == "host://xnnpack" and data["current"]["target"] == URL
    (out,) = data["outputs"]
    assert out["cases"] == 3 and out["error_max"]["baseline"] > 0 and out["error_max"]["current"] > 0
    assert out["error_max"]["delta"] == pytest.approx(out["error_max"]["current"] - out["error_max"]["baseline"])
    # the outputs differ (above), so some case's figures differ; which one depends on the kernels' rounding
    # (with the runner built 2026-12-03 every case's worst element came out the same: error_max deltas all 0)
    assert any(row[m]["delta"] not in (0, None) for row in data["case_outputs"] for m in ("error_max", "sqnr"))
    table = run_cli("compare", str(tmp_path / "host"), str(tmp_path / "arm"), "--cases")
    assert f"host://xnnpack → {URL} (delta), same bundle" in table.stdout, table.stdout
    # a different bundle on another target is still refused
    other = bundle_cache("mlp", dtype="fp16", backend="xnnpack", cases=3, target="host://xnnpack")
    res = run_cli("run", str(other), "--target", URL, "--report", str(tmp_path / "other"), "--no-history", "--quiet")
    assert res.returncode == 0, res.stderr[-2000:]
    res = run_cli("compare", str(tmp_path / "host"), str(tmp_path / "other"))
    assert res.returncode == 2 and "refusing to compare unrelated runs" in res.stderr


def test_cpu_setting_reaches_qemu_and_xnnpack_picks_other_kernels(xnn_runner, bundle_cache, tmp_path):
    """cpu=cortex-a53 (Armv8.0: no fp16 arithmetic, no dot product) instead of max: still judged PASS, and the
    fp16 outputs differ from -cpu max's, because XNNPACK chose its kernels from the emulated CPU's features."""
    bundle = bundle_cache("mlp", dtype="fp16", backend="xnnpack", cases=2, target=URL)
    for name, cpu in (("max", "max"), ("a53", "cortex-a53")):
        res = run_cli("run", str(bundle), "--target", f"{URL}?cpu={cpu}", "--report", str(tmp_path / name),
                      "--no-history", "--quiet", "--save-outputs")
        assert res.returncode == 0, res.stderr[-2000:]
        assert _report(tmp_path / name)["target"]["info"]["cpu"] == cpu
    a, b = np.load(tmp_path / "max" / "outputs.npz"), np.load(tmp_path / "a53" / "outputs.npz")
    assert any(a[k].tobytes() != b[k].tobytes() for k in a.files)


# -- faults through the real runtime ----------------------------------------------------------------

@pytest.fixture(scope="module")
def fault_bundles(tmp_path_factory, bundle_cache):
    """XNNPACK bundles that the real runtime refuses, each for a different reason."""
    d = tmp_path_factory.mktemp("faults")
    res = run_cli("build", FFT_MODEL, "--backend", "xnnpack", "--cases", "1", "--target", URL,
                  "-o", str(d / "missing-op.bpte"))
    assert res.returncode == 0, res.stderr
    fp16 = read_bundle(bundle_cache("mlp", dtype="fp16", backend="xnnpack", cases=1, target=URL))
    # fp32 inputs for the fp16 program (what ExecuTorch's BundledProgram API lets a user write)
    suite = fp16.method_test_suites[0]
    case = suite.test_cases[0]
    as_fp32 = [BundledValue.from_array(v.to_array().astype(np.float32)) for v in case.inputs]
    write_bundle(dataclasses.replace(fp16, manifest_json=None, method_test_suites=[
        dataclasses.replace(suite, test_cases=[dataclasses.replace(case, inputs=as_fp32)])]), d / "dtype.bpte")
    # bytes flipped inside the XNNPACK delegate's own flatbuffer (after its "XH00" header), in a bundle without
    # bundlerun's manifest (as ExecuTorch's BundledProgram API writes them): a sealed one is refused before it
    # runs ("the program was changed after the bundle was built"), this one reaches the runtime
    data = bytearray(serialize_bundle(dataclasses.replace(fp16, manifest_json=None)))
    at = data.index(b"XH00") - 4
    fb_offset, fb_size = int.from_bytes(data[at + 10:at + 14], "little"), int.from_bytes(data[at + 14:at + 18], "little")
    for k in range(at + fb_offset + 16, at + fb_offset + fb_size - 16, 7):
        data[k] ^= 0x5A
    (d / "corrupt.bpte").write_bytes(bytes(data))
    return d


@pytest.mark.parametrize("name, kind, says", [
    ("missing-op", "missing-operator", "aten::_fft_r2c.out"),
    ("dtype", "bad-bundle", "the bundle's input 0 is Float but the program takes Half"),
    ("corrupt", "bad-bundle", "the XNNPACK delegate payload is corrupt"),
])
def test_runtime_refusals_are_one_line_errors_with_a_report(xnn_runner, fault_bundles, tmp_path, name, kind, says):
    res = run_cli("run", str(fault_bundles / f"{name}.bpte"), "--target", URL, "--report", str(tmp_path / "r"),
                  "--no-history", "--quiet")
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    (case,) = _report(tmp_path / "r")["cases"]
    assert case["status"] == "error" and case["error_kind"] == kind and says in case["error"], case["error"]
    assert "\n" not in case["error"] and case["log_excerpt"]
    assert case["outputs"] and all(o["verdict"] == "ERROR" for o in case["outputs"])  # listed, none judged
    assert "SIGABRT" not in case["error"]  # the cause the runtime logged, not the abort() that followed it
    assert _no_qemu_left(tmp_path)


def test_unhandled_dtype_line_is_unsupported():
    """The kernels' own dtype switch (runtime/core/exec_aten/util/scalar_type_util.h:928), as the runner logs it."""
    from bundlerun.targets.et_runner.executor_runner import classify
    from bundlerun.targets.failures import FailureKind

    log = ("E 00:00:00.101 executorch:op_logit.cpp:39] Unhandled dtype Half for logit.out\n"
           "F 00:00:00.102 executorch:executor_runner.cpp:790] In function main(), assert failed (status == "
           "Error::Ok): Execution of method forward failed with status 0x12\n")
    failure = classify(log, 134)
    assert failure.kind == FailureKind.UNSUPPORTED and "logit.out kernel does not support dtype Half" in failure.message


def _kill_when_running(folder: Path, sig: int, after_s: float = 1.0) -> threading.Thread:
    """Send `sig` to the qemu-aarch64 running in `folder` (this test's own) once it has run for `after_s`."""
    def kill():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            pids = _qemu_under(folder)
            if pids:
                time.sleep(after_s)
                for pid in _qemu_under(folder):
                    os.kill(pid, sig)
                return
            time.sleep(0.05)

    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


def test_crash_mid_run_is_a_crash_with_a_report(xnn_runner, bundle_cache, tmp_path):
    """SIGSEGV delivered to the running runtime (qemu-user passes it to the guest, which dies of it)."""
    bundle = bundle_cache("mobile-net", backend="xnnpack", cases=1, target=URL)
    killer = _kill_when_running(tmp_path, signal.SIGSEGV)
    res = run_cli("run", str(bundle), "--target", URL, "--repeat", "100000", "--report", str(tmp_path / "r"),
                  "--no-history", "--quiet")
    killer.join(10)
    assert res.returncode == 2, res.stderr[-2000:]
    (case,) = _report(tmp_path / "r")["cases"]
    assert case["error_kind"] == "crash" and "SIGSEGV" in case["error"] and "\n" not in case["error"], case["error"]
    assert _no_qemu_left(tmp_path)


def test_hang_is_stopped_at_the_case_timeout_with_a_report(xnn_runner, bundle_cache, tmp_path):
    bundle = bundle_cache("mobile-net", backend="xnnpack", cases=1, target=URL)
    t0 = time.monotonic()
    res = run_cli("run", str(bundle), "--target", URL, "--repeat", "100000", "--timeout", "5", "--report",
                  str(tmp_path / "r"), "--no-history", "--quiet")
    assert res.returncode == 2 and time.monotonic() - t0 < 120, res.stderr[-2000:]
    (case,) = _report(tmp_path / "r")["cases"]
    assert case["status"] == "timeout" and case["error_kind"] == "host-timeout"
    assert "process group killed" in case["error"]
    assert _no_qemu_left(tmp_path)


def test_debug_shows_the_xnnpack_delegate_call_as_a_row(xnn_runner, bundle_cache, tmp_path):
    """`bundlerun debug` on qemu-user with an XNNPACK bundle: bundlerun's debug runner (the same build tree as the
    executor_runner, so XNNPACK is in it too) writes an ETDump + debug buffer; the delegate call is one row."""
    from bundlerun.runner.debug.localize import debug_bundle

    bundle = bundle_cache("tiny-cnn", backend="xnnpack", cases=2, target=URL, etrecord=True)
    result = debug_bundle(bundle, URL, case=1, work_dir=tmp_path / "d", target_config={})
    delegate_rows = [r for r in result.rows if r.runtime_op == "delegate:XnnpackBackend"]
    assert len(delegate_rows) == 1 and delegate_rows[0].fp32.sqnr > 100, [(r.runtime_op, r.fp32) for r in result.rows]
    assert result.first_bad is None and result.output_stats["error_max"] < 1e-5
    assert any("debug runner" in n and "aarch64 under" in n for n in result.notes), result.notes
    assert _no_qemu_left(tmp_path)
