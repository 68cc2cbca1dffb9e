"""ExecuTorch's own arm_executor_runner, built from source, on the real QEMU mps3-an547.

Nothing here is a double: firmware_scripts/arm/build_qemu_runner.sh builds the runner (cached
after the first build), qemu-system-arm runs it, and the assertions read the runner's real
output files and log lines. The fault runners are real builds too (a too-small pool, an op
left out, and link-time wraps of Method::execute / fwrite for a hang, a hard fault and a
short output file). A missing toolchain or QEMU fails the test naming what is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from bundlerun.targets.runner_cache import read_record

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "firmware_scripts" / "arm" / "build_qemu_runner.sh"
BUNDLE_OPS = REPO / "firmware_scripts" / "arm" / "bundle_ops.py"
MODEL_ADDR = 0x7C000000
VERDICT_PASS = "TEST: BundleIO index[0] Test_result: PASS"
HARDFAULT_EXIT = 139


@dataclass(frozen=True)
class QemuRun:
    """One QEMU process: exit status (None when the host timeout killed it) and its log."""

    returncode: int | None
    log: str
    seconds: float
    workdir: Path

    def output(self, index: int = 0) -> Path:
        return self.workdir / f"out-{index}.bin"


def _kill_group(proc: subprocess.Popen) -> None:
    """End QEMU and anything it started; always reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _qemu_base() -> list[str]:
    return ["qemu-system-arm", "-M", "mps3-an547", "-nographic", "-monitor", "none"]


def run_semihosting(runner: Path, bundle: Path, workdir: Path, timeout: float = 120) -> QemuRun:
    """Run the semihosting runner on `bundle` with QEMU's cwd = workdir (its files land there)."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundle, workdir / "model.bpte")
    (workdir / "unused.bin").write_bytes(b"\0" * 4)  # the runner wants an -i; BundleIO ignores it
    args = "arg=arm_executor_runner,arg=-m,arg=model.bpte,arg=-i,arg=unused.bin,arg=-o,arg=out"
    cmd = _qemu_base() + ["-serial", "none", "-semihosting-config", f"enable=on,target=native,{args}",
                          "-kernel", str(runner / "arm_executor_runner.elf")]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)  # what QEMU printed before the kill
        code = None
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    return QemuRun(code, out.decode(errors="replace"), time.monotonic() - start, workdir)


def run_uart(runner: Path, bundle: Path, workdir: Path, timeout: float = 120) -> QemuRun:
    """Run the uart runner: bundle placed by -device loader, UART0 to a file; stop at the end marker."""
    workdir.mkdir(parents=True, exist_ok=True)
    serial = workdir / "uart.log"
    cmd = _qemu_base() + ["-serial", f"file:{serial}",
                          "-device", f"loader,file={bundle},addr={MODEL_ADDR:#x}",
                          "-kernel", str(runner / "arm_executor_runner.elf")]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        while time.monotonic() - start < timeout and proc.poll() is None:
            if serial.exists() and "\x04" in serial.read_text(errors="replace"):
                break
            time.sleep(0.1)
    finally:
        code = proc.poll()
        _kill_group(proc)
    text = serial.read_text(errors="replace") if serial.exists() else ""
    return QemuRun(code, text, time.monotonic() - start, workdir)


@pytest.fixture(scope="session")
def cnn_fp32(bundle_cache) -> Path:
    return bundle_cache("tiny-cnn", "fp32", backend="portable", cases=2)


@pytest.fixture(scope="session")
def mlp_int8(bundle_cache) -> Path:
    # mlp, not tiny-cnn: the CMSIS-NN pooling kernels need channels_last tensors, which the
    # Cortex-M lowering does not produce yet (the runner reports it; see docs/arm-qemu.md).
    return bundle_cache("mlp", "int8", backend="cortex-m", cases=2, target="fvp://corstone-300/cortex-m55")


def _case0(bundle: Path):
    """Program bytes, input arrays and expected outputs of test case 0 of a bundle."""
    from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program

    bp = deserialize_from_flatbuffer_to_bundled_program(bundle.read_bytes())
    case = bp.method_test_suites[0].test_cases[0]
    inputs = [np.frombuffer(bytes(v.val.data), np.float32).reshape(v.val.sizes) for v in case.inputs]
    expected = [np.frombuffer(bytes(v.val.data), np.float32).reshape(v.val.sizes) for v in case.expected_outputs]
    return bytes(bp.program), inputs, expected


def _host_outputs(program: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The same program on the host pybindings (portable kernels), for a bit-level comparison."""
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    module = _load_for_executorch_from_buffer(program)
    return [t.numpy() for t in module.forward([torch.from_numpy(x.copy()) for x in inputs])]


# ---- build script ---------------------------------------------------------------------


def test_build_is_cached_and_described(qemu_runner):
    folder = qemu_runner()
    start = time.monotonic()
    again = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.strip().splitlines()[-1]) == folder
    assert time.monotonic() - start < 30, "a cached runner must come back at once"

    meta = read_record(folder)
    assert meta["kind"] == "arm-qemu" and meta["mode"] == "semihosting"
    assert meta["elf"] == str(folder / "arm_executor_runner.elf")
    assert "cortex_m::quantized_linear.out" in meta["ops"] and "aten::convolution.out" in meta["ops"]
    assert meta["flags"]["max_kernel_num"] == len(meta["ops"])
    assert meta["toolchain"].startswith("arm-none-eabi-gcc")


def test_bad_options_give_one_line_errors():
    for args, needle in ((["--mode", "jtag"], "--mode must be"),
                         (["--ops", "aten::no_such_op.out"], "has no kernel"),
                         (["--ops-from", "/nonexistent.bpte"], "bundle not found"),
                         (["--method-pool-size", "lots"], "--method-pool-size")):
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_print_ops_lists_exactly_the_bundle_ops(cnn_fp32):
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), "--ops-from", str(cnn_fp32), "--print-ops"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ops = proc.stdout.split()
    assert "aten::convolution.out" in ops and "aten::max_pool2d_with_indices.out" in ops
    assert not any(op.startswith("cortex_m::") for op in ops)


def test_only_the_selected_ops_portable_kernel_files_compile(qemu_runner, tmp_path):
    """portable_sources.py maps an op list to its kernels/portable/cpu/op_*.cpp files (the CMake target
    keeps only those): through the kernel function functions.yaml names, also where file and op names
    differ (_softmax -> op_softmax.cpp) and where a macro defines it (sin); ops that are not portable
    ones (cortex_m::) need none. Every op of functions.yaml maps to a file of the pinned tree."""
    ops = "aten::add.out,aten::_softmax.out,aten::sin.out,cortex_m::quantized_add.out"
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), "--ops", ops, "--dry-run"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    cmake = next(ln for ln in proc.stdout.splitlines() if ln.startswith("cmake "))
    assert "-DBUNDLERUN_PORTABLE_SRCS=op_add.cpp\\;op_sin.cpp\\;op_softmax.cpp " in cmake, cmake
    lib_dir = Path(next(ln for ln in proc.stdout.splitlines() if "libraries:" in ln).rsplit(" ", 1)[1])
    et_root = Path(re.search(r"-DEXECUTORCH_ROOT=(\S+)", cmake).group(1))
    script = REPO / "firmware_scripts" / "arm" / "portable_sources.py"
    every = ",".join(f"aten::{m}" for m in re.findall(r"^- op: *(\S+)", (et_root / "kernels/portable/functions.yaml")
                                                        .read_text(), re.M))
    listed = subprocess.run(["python3", str(script), str(et_root), every], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.strip().split(";")) >= 150  # every op file but a handful of helpers
    fake = tmp_path / "fake-et"
    (fake / "kernels/portable/cpu").mkdir(parents=True, exist_ok=True)
    (fake / "kernels/portable/functions.yaml").write_text("- op: add.out\n  kernels:\n    - arg_meta: null\n"
                                                          "      kernel_name: torch::executor::add_out\n")
    missing = subprocess.run(["python3", str(script), str(fake), "aten::add.out"], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "defines add_out" in missing.stderr
    # a runner's archive holds its ops' kernel files only (read by the build under the tree's lock)
    folder = qemu_runner("--ops", "aten::add.out,aten::convolution.out,aten::_softmax.out")
    assert read_record(folder)["portable_kernel_files"] == ["op_add.cpp", "op_convolution.cpp", "op_softmax.cpp"]
    assert lib_dir.is_dir()


# ---- the real runner on the real emulator ----------------------------------------------


def test_fp32_portable_bundle_runs_and_matches_host(qemu_runner, cnn_fp32, tmp_path):
    run = run_semihosting(qemu_runner(), cnn_fp32, tmp_path / "fp32")
    assert run.returncode == 0, run.log
    assert "Model output match expected BundleIO bpte ref data." in run.log
    assert VERDICT_PASS in run.log
    program, inputs, expected = _case0(cnn_fp32)
    got = np.fromfile(run.output(0), np.float32)
    assert got.size == expected[0].size, f"out-0.bin has {got.size} floats, expected {expected[0].size}"
    host = _host_outputs(program, inputs)[0].reshape(-1)
    assert np.max(np.abs(got - host)) <= 1e-5 * max(1.0, float(np.max(np.abs(host)))), (got, host)
    assert np.allclose(got, expected[0].reshape(-1), atol=1e-3, rtol=1e-3)


def test_int8_cortex_m_bundle_runs(qemu_runner, mlp_int8, tmp_path):
    run = run_semihosting(qemu_runner(), mlp_int8, tmp_path / "int8")
    assert run.returncode == 0, run.log
    assert VERDICT_PASS in run.log and "mean_absolute_error" in run.log
    _, _, expected = _case0(mlp_int8)
    got = np.fromfile(run.output(0), np.float32)
    ref = expected[0].reshape(-1)
    assert got.size == ref.size
    cosine = float(np.dot(got, ref) / (np.linalg.norm(got) * np.linalg.norm(ref)))
    assert cosine > 0.98, (cosine, got, ref)


def test_uart_runner_reads_bundle_from_memory(qemu_runner, cnn_fp32, tmp_path):
    run = run_uart(qemu_runner("--mode", "uart"), cnn_fp32, tmp_path / "uart")
    assert "PTE @ 0x7c000000 [----BP" in run.log, run.log
    assert VERDICT_PASS in run.log, run.log
    _, _, expected = _case0(cnn_fp32)
    values = [float(line.split()[-1]) for line in run.log.splitlines() if line.startswith("Output[0][")]
    assert len(values) == expected[0].size
    assert np.allclose(values, expected[0].reshape(-1), atol=1e-5 + 1e-3)


# ---- faults, each on the real emulator -------------------------------------------------


def test_missing_operator(qemu_runner, cnn_fp32, tmp_path):
    ops = subprocess.run(["bash", str(BUILD_SCRIPT), "--ops-from", str(cnn_fp32), "--print-ops"],
                         capture_output=True, text=True, timeout=300).stdout.split()
    kept = [op for op in ops if op != "aten::relu.out"]
    assert len(kept) == len(ops) - 1
    run = run_semihosting(qemu_runner("--ops", ",".join(kept)), cnn_fp32, tmp_path / "missing")
    assert run.returncode not in (0, None), run.log
    # "[%zd]" prints right only thanks to qemu/printf_z.c (Debian's newlib has no C99 %z).
    assert re.search(r"Missing operator: \[\d+\] aten::relu\.out", run.log), run.log
    assert "kernel 'aten::relu.out' not found." in run.log
    assert "Loading of method forward failed with status 0x14" in run.log
    assert not run.output(0).exists()


def test_method_pool_too_small(qemu_runner, cnn_fp32, tmp_path):
    run = run_semihosting(qemu_runner("--method-pool-size", "4096"), cnn_fp32, tmp_path / "pool")
    assert run.returncode not in (0, None), run.log
    assert "Setup Method allocator pool. Size: 4096 bytes." in run.log
    assert "Could not allocate memory for planned buffer" in run.log or "failed with status 0x21" in run.log, run.log
    assert not run.output(0).exists()


def test_hard_fault(qemu_runner, cnn_fp32, tmp_path):
    run = run_semihosting(qemu_runner("--fault", "hardfault"), cnn_fp32, tmp_path / "hardfault")
    assert run.returncode == HARDFAULT_EXIT, run.log
    assert "BUNDLERUN_HARDFAULT pc=" in run.log and "Starting running 1 inferences..." in run.log, run.log
    assert not run.output(0).exists()


def test_hang_is_ended_by_host_timeout(qemu_runner, cnn_fp32, tmp_path):
    run = run_semihosting(qemu_runner("--fault", "spin"), cnn_fp32, tmp_path / "spin", timeout=8)
    assert run.returncode is None, run.log
    assert "Starting running 1 inferences..." in run.log
    assert "Test_result" not in run.log and not run.output(0).exists()
    assert run.seconds < 30


def test_corrupted_bundle(qemu_runner, cnn_fp32, tmp_path):
    data = bytearray(cnn_fp32.read_bytes())
    start = data.find(b"ET12") - 4  # the embedded program's flatbuffer starts 4 bytes before its id
    assert start > 0
    for i in range(start, start + 4):  # its root table offset: garbage after a bit flip
        data[i] ^= 0xFF
    bad = tmp_path / "corrupt.bpte"
    bad.write_bytes(bytes(data))
    run = run_semihosting(qemu_runner(), bad, tmp_path / "corrupt")
    assert run.returncode not in (0, None), run.log
    assert "Program loading failed" in run.log or "get_program_data() from bundle PTE failed" in run.log, run.log
    assert not run.output(0).exists()


def test_short_output_file(qemu_runner, cnn_fp32, tmp_path):
    run = run_semihosting(qemu_runner("--fault", "short-output"), cnn_fp32, tmp_path / "short")
    assert "Failed to write whole output file out-0.bin, wrote 20 of 40 bytes" in run.log, run.log
    assert run.output(0).stat().st_size == 20
