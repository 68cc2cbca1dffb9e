"""The real ExecuTorch executor_runner, cross-built for aarch64 Linux from source
(firmware_scripts/android/build_executor_runner.sh --toolchain gnu) and run under
qemu-aarch64: the build script, the runner's contract as read from
examples/portable/executor_runner/executor_runner.cpp (flags, log lines, exit
codes, files), and its numerics against the host pybindings for every zoo model.

Needs the runner scripts/setup.sh builds into ~/.cache/bundlerun/runners/ and
qemu-aarch64 (qemu-user): without them these tests fail, naming what is missing.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle, serialize_bundle
from doubles.android_env import BUILD_SCRIPT, real_executor_runner
from bundlerun.targets.runner_cache import read_record

ZOO = ["mlp", "tiny-cnn", "mobile-net", "tiny-transformer", "tiny-gru"]


@pytest.fixture(scope="module")
def runner() -> Path:
    """The aarch64 executor_runner binary (fails, not skips, when setup did not build it)."""
    if shutil.which("qemu-aarch64") is None:
        pytest.fail("qemu-aarch64 is not installed (Debian package qemu-user; scripts/setup.sh installs it)")
    try:
        folder = real_executor_runner("aarch64")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    return Path(read_record(folder)["binary"])


def _qemu(binary: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["qemu-aarch64", str(binary), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, **(env or {}))
    return subprocess.run(["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, timeout=120, env=full)


def _host_outputs(bundle, case_index: int) -> list[np.ndarray]:
    """The same program and inputs through the host ExecuTorch pybindings."""
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed kernels for int8 bundles)
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    case = bundle.method_test_suites[0].test_cases[case_index]
    module = _load_for_executorch_from_buffer(bytes(bundle.program))
    outs = module.run_method("forward", [torch.from_numpy(v.to_array().copy()) for v in case.inputs])
    return [o.numpy() for o in outs]


def _run_case(runner: Path, bundle, index: int, work: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[np.ndarray]]:
    """One case as a one-case bundle (the real runner checks case 0 only)."""
    work.mkdir(parents=True, exist_ok=True)
    method = bundle.method_test_suites[0].method_name
    (work / "model.bpte").write_bytes(serialize_bundle(bundle.single_case(method, index)))
    res = _qemu(runner, work, "--model_path", "model.bpte", "--output_file", "out", "--print_output", "none", *extra)
    expected = bundle.method_test_suites[0].test_cases[index].expected_outputs
    outs = []
    for i, want in enumerate(expected):
        f = work / f"out-{i}.bin"
        if f.is_file():
            outs.append(np.frombuffer(f.read_bytes(), dtype=want.to_array().dtype).reshape(want.sizes))
    return res, outs


# -- the build script ---------------------------------------------------------------------------

def _fake_checkout(root: Path) -> Path:
    (root / "runtime").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("")
    return root


def test_gnu_dry_run_prints_the_cmake_lines_and_the_cache_folder(tmp_path):
    src = _fake_checkout(tmp_path / "et")
    env = {"BUNDLERUN_CACHE": str(tmp_path / "cache")}
    res = _script("--toolchain", "gnu", "--executorch-src", str(src), "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    for flag in ("aarch64-linux-gnu.cmake", "-DEXECUTORCH_BUILD_EXECUTOR_RUNNER=ON", "-DEXECUTORCH_ENABLE_BUNDLE_IO=ON",
                 "-DEXECUTORCH_BUILD_DEVTOOLS=ON", "-DEXECUTORCH_ENABLE_EVENT_TRACER=ON",
                 "-DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON", "-DCMAKE_EXE_LINKER_FLAGS=-static", "-DFLATC_EXECUTABLE=",
                 # aarch64 default: XNNPACK with KleidiAI, its threadpool/cpuinfo, no SME kernels (QEMU 7.2 has no SME2)
                 "-DEXECUTORCH_BUILD_XNNPACK=ON", "-DEXECUTORCH_BUILD_PTHREADPOOL=ON", "-DEXECUTORCH_BUILD_CPUINFO=ON",
                 "-DEXECUTORCH_XNNPACK_ENABLE_KLEIDI=ON", "-DXNNPACK_ENABLE_ARM_SME=OFF", "-DXNNPACK_ENABLE_ARM_SME2=OFF",
                 "-DLIBM=", "toolchains/kleidiai-gcc12.cmake", "-DCMAKE_PROJECT_executorch_INCLUDE=",
                 # one build tree makes both the executor_runner and the debug runner
                 "--target executor_runner bundlerun_debug_runner -j 2"):
        assert flag in res.stdout, flag
    folder = Path(res.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path / "cache" / "runners" and len(folder.name) == 20
    host = _script("--toolchain", "gnu", "--arch", "x86_64", "--executorch-src", str(src), "--dry-run", env=env)
    assert host.returncode == 0 and "aarch64-linux-gnu.cmake" not in host.stdout
    assert "-DEXECUTORCH_BUILD_XNNPACK=OFF" in host.stdout and "KleidiAI" not in host.stdout  # host://xnnpack has its own
    assert Path(host.stdout.strip().splitlines()[-1]) != folder  # the key covers the architecture
    portable = _script("--toolchain", "gnu", "--backends", "portable", "--executorch-src", str(src), "--dry-run", env=env)
    assert portable.returncode == 0 and "-DEXECUTORCH_BUILD_XNNPACK=OFF" in portable.stdout
    assert Path(portable.stdout.strip().splitlines()[-1]) != folder  # ... and the delegates built in
    assert not (tmp_path / "cache" / "runners").exists()  # a dry run builds nothing


@pytest.mark.parametrize("args, message", [
    (["--toolchain", "gnu", "--arch", "sparc"], "unknown --arch 'sparc'"),
    (["--toolchain", "msvc"], "unknown --toolchain 'msvc'"),
    (["--toolchain", "gnu", "--jobs", "two"], "--jobs must be a positive integer"),
    (["--toolchain", "gnu", "--backends", "qnn"], "qnn needs the Android NDK and QNN SDK"),
    (["--toolchain", "gnu", "--backends", "xnnpack,coreml"], "unknown backend 'coreml' for --toolchain gnu"),
    (["--toolchain", "gnu", "--executorch-src", "/nonexistent"], "not an ExecuTorch checkout"),
    (["--toolchain", "gnu", "--arch"], "--arch needs a value"),
])
def test_gnu_bad_input_is_one_line(args, message, tmp_path):
    res = _script(*args, "--dry-run", env={"BUNDLERUN_CACHE": str(tmp_path)})
    assert res.returncode == 2 and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_checkout_without_the_xnnpack_submodules_is_one_line(tmp_path):
    src = _fake_checkout(tmp_path / "et")
    res = _script("--toolchain", "gnu", "--executorch-src", str(src), env={"BUNDLERUN_CACHE": str(tmp_path / "c")})
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "backends/xnnpack/third-party/XNNPACK is missing" in res.stderr and "git submodule update" in res.stderr
    assert not (tmp_path / "c" / "runners").exists()


def test_ndk_path_still_dry_runs(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text("")
    res = _script("--executorch", str(tmp_path), "--ndk", "/opt/ndk", "--backends", "xnnpack", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "-DCMAKE_TOOLCHAIN_FILE=/opt/ndk/build/cmake/android.toolchain.cmake" in res.stdout
    assert res.stdout.strip().endswith("cmake-out-android-bundlerun/executor_runner")


def test_cached_runner_is_a_static_aarch64_elf_described_by_runner_json(runner):
    meta = read_record(runner.parent)
    assert meta["kind"] == "executor_runner" and meta["arch"] == "aarch64" and meta["static"] is True
    assert Path(meta["binary"]) == runner and meta["build_seconds"] > 0
    assert "-DEXECUTORCH_ENABLE_BUNDLE_IO=ON" in meta["flags"] and meta["sources"]["fingerprint"]
    assert "aarch64-linux-gnu-g++" in meta["toolchain"]["compiler"]
    assert meta["backends"] == ["xnnpack"] and meta["xnnpack"]["kleidiai"] and not meta["xnnpack"]["arm_sme2"]
    # KleidiAI from the tarball, extracted beside the ExecuTorch sources the runner was built from (not downloaded
    # by XNNPACK's CMake); the path is checked, not the folder: a cache restored elsewhere (CI) may hold the
    # runner without the sources it was built from
    kai = Path(meta["xnnpack"]["kleidiai_source"])
    assert kai.name == "kleidiai" and kai.parent == Path(meta["sources"]["path"]).parent, (kai, meta["sources"])
    # the debug runner came out of the same build tree: same flags, same build, its own cache entry
    dbg = _script("--toolchain", "gnu", "--debug-runner", "--cached-only")
    assert dbg.returncode == 0, dbg.stderr
    dmeta = read_record(Path(dbg.stdout.strip().splitlines()[-1]))
    assert dmeta["kind"] == "debug_runner" and dmeta["flags"] == meta["flags"] and dmeta["backends"] == ["xnnpack"]
    assert dmeta["build_seconds"] == meta["build_seconds"]
    head = runner.read_bytes()[:64]
    assert head[:4] == b"\x7fELF" and struct.unpack_from("<H", head, 18)[0] == 183  # EM_AARCH64
    phoff, = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    data = runner.read_bytes()[: phoff + phentsize * phnum]
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    assert 3 not in types  # no PT_INTERP: static, runs on any arm64 Linux/Android shell
    t0 = time.monotonic()
    again = _script("--toolchain", "gnu")
    assert again.returncode == 0 and Path(again.stdout.strip().splitlines()[-1]) == runner.parent
    assert time.monotonic() - t0 < 15  # cached: printed at once


# -- the runner's contract (executor_runner.cpp) -------------------------------------------------

def test_flag_errors_and_exit_codes(runner, tmp_path):
    res = _qemu(runner, tmp_path, "--bogus_flag", "1")
    assert res.returncode == 1 and "ERROR: unknown command line flag 'bogus_flag'" in res.stderr
    res = _qemu(runner, tmp_path, "--print_output", "loud")
    assert res.returncode == 1 and "Unknown --print_output mode 'loud'" in res.stderr
    res = _qemu(runner, tmp_path, "--model_path", "nope.bpte")
    assert res.returncode == -6 and "Could not open file 'nope.bpte'" in res.stderr  # ET_CHECK_MSG: abort()
    res = _qemu(runner, tmp_path, "--model_path", "x.bpte", "extra")
    assert res.returncode == 1 and "Extra commandline args: extra" in res.stderr


def test_help_lists_the_flags_the_profile_uses(runner, tmp_path):
    res = _qemu(runner, tmp_path, "--helpfull")
    text = res.stdout + res.stderr
    for flag in ("model_path", "output_file", "bundleio_atol", "bundleio_rtol", "etdump_path", "method_name",
                 "num_executions", "print_output", "cpu_threads", "inputs", "data_path", "server_mode"):
        assert f"-{flag} (" in text, flag


def test_case0_pass_writes_outputs_etdump_and_log_lines(runner, bundle_cache, tmp_path):
    bundle = read_bundle(bundle_cache("mlp", backend="portable", cases=2, target="host://portable"))
    res, outs = _run_case(runner, bundle, 1, tmp_path, "--etdump_path", "run.etdump", "--print_output", "summary")
    assert res.returncode == 0, res.stderr
    for line in ("Model file model.bpte is loaded.", "Using method forward", "Model executed successfully 1 time(s)",
                 "Writing output to file: out-0.bin", "ETDump written to file 'run.etdump'.",
                 "=== Error stats for testset 0 ===", "max_absolute_error:",
                 "Model output match expected BundleIO bpte ref data.", "TEST: BundleIO index[0] Test_result: PASS"):
        assert line in res.stderr, line
    assert res.stderr.splitlines()[0].startswith("I 00:00:")  # posix PAL: "I hh:mm:ss.us executorch:file:line] msg"
    assert "OutputX 0: tensor(" in res.stdout
    assert (tmp_path / "run.etdump").read_bytes()[8:12] == b"ED00"  # size-prefixed flatcc buffer
    expected = bundle.method_test_suites[0].test_cases[1].expected_outputs[0].to_array()
    np.testing.assert_allclose(outs[0], expected, atol=1e-4, rtol=1e-4)


def test_failed_verification_exits_1_and_still_writes_outputs(runner, bundle_cache, tmp_path):
    bundle = read_bundle(bundle_cache("mlp", backend="portable", cases=2, target="host://portable"))
    suite = bundle.method_test_suites[0]
    case = suite.test_cases[0]
    wrong = dataclasses.replace(case.expected_outputs[0], data=(case.expected_outputs[0].to_array() + 1.0).tobytes())
    bad = dataclasses.replace(bundle, manifest_json=None, method_test_suites=[
        dataclasses.replace(suite, test_cases=[dataclasses.replace(case, expected_outputs=[wrong])])])
    res, outs = _run_case(runner, bad, 0, tmp_path)
    assert res.returncode == 1
    assert "TEST: BundleIO index[0] Test_result: FAIL" in res.stderr
    assert "Bundle verification failed with status 0x" in res.stderr
    np.testing.assert_allclose(outs[0], case.expected_outputs[0].to_array(), atol=1e-4, rtol=1e-4)


# -- numerics: every zoo model, aarch64 portable kernels vs the host pybindings -------------------

@pytest.mark.parametrize("model", ZOO)
def test_zoo_fp32_every_case_matches_the_host(runner, bundle_cache, tmp_path, model):
    bundle = read_bundle(bundle_cache(model, backend="portable", cases=2, target="host://portable"))
    for index in range(2):
        res, outs = _run_case(runner, bundle, index, tmp_path / str(index))
        assert res.returncode == 0, res.stderr[-2000:]
        host = _host_outputs(bundle, index)
        assert len(outs) == len(host)
        for got, ref in zip(outs, host):
            assert got.shape == ref.shape and got.dtype == ref.dtype
            # aarch64 gcc contracts a*b+c into fused multiply-adds: ulp-level differences only
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["mlp", "tiny-cnn"])
def test_int8_bundles_run_on_the_quantized_kernels(runner, bundle_cache, tmp_path, model):
    bundle = read_bundle(bundle_cache(model, backend="portable", dtype="int8", cases=1, target="host://portable"))
    assert b"quantized_decomposed::" in bytes(bundle.program)
    res, outs = _run_case(runner, bundle, 0, tmp_path)
    assert res.returncode in (0, 1), res.stderr[-2000:]  # 1: the runner's own 0.01 check of case 0
    assert "Missing operator" not in res.stderr
    for got, ref in zip(outs, _host_outputs(bundle, 0)):
        # dequantized values: one quantization step apart at most when rounding differs
        np.testing.assert_allclose(got, ref, rtol=0, atol=0.05)


# -- XNNPACK: the aarch64 kernels vs the x86 ones of the host pybindings ----------------------------

@pytest.mark.parametrize("model", ZOO)
def test_zoo_xnnpack_fp32_every_case_close_to_the_x86_kernels(runner, bundle_cache, tmp_path, model):
    """The same XNNPACK program and inputs: aarch64 NEON kernels (under qemu-aarch64) vs x86 AVX kernels (the
    pybindings' XNNPACK): different kernels, the same numbers to float32 rounding."""
    from bundlerun.targets.program.walker import read_delegates

    bundle = read_bundle(bundle_cache(model, backend="xnnpack", cases=2, target="qemu-user://aarch64"))
    assert any(d.backend_id == "XnnpackBackend" for d in read_delegates(bytes(bundle.program)))
    for index in range(2):
        res, outs = _run_case(runner, bundle, index, tmp_path / str(index), "--cpu_threads", "1")
        assert res.returncode == 0, res.stderr[-2000:]
        assert "is not registered" not in res.stderr
        host = _host_outputs(bundle, index)
        assert len(outs) == len(host)
        for got, ref in zip(outs, host):
            assert got.shape == ref.shape and got.dtype == ref.dtype
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
