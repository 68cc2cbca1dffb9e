"""Faults of `vulkan://lavapipe` through the real runtime (ExecuTorch's Vulkan executor_runner on lavapipe):
each is a one-line error of the right FailureKind, a written report, exit code 2, and nothing left running.
No double: the faults are real programs, real drivers (or their absence) and real signals."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from tests.conftest import REPO, run_cli
from tests.test_vulkan_lane import URL, processes_under, report, vulkan_runner  # noqa: F401 - the fixture
from bundlerun.targets.runner_cache import read_record

MODELS = REPO / "tests" / "fixtures" / "op_models.py"  # in the repo, so their builds are cached across runs
# rfft between two Vulkan subgraphs: aten::_fft_r2c.out is optimized-only, absent from the runner's kernels
FFT_MODEL = f"{MODELS}:make_fft"
SDPA_MODEL = f"{MODELS}:make_sdpa"  # SDPA: its decomposition has a logical_not the runtime lacks


def _run(bundle: Path, folder: Path, *extra: str, url: str = URL, timeout: float = 600) -> tuple[int, dict, str]:
    res = run_cli("run", str(bundle), "--target", url, "--report", str(folder), "--no-history", *extra,
                  timeout=timeout)
    assert (folder / "report.json").is_file(), res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr.lower(), res.stderr[-3000:]
    return res.returncode, report(folder), res.stdout + res.stderr


def _one_line(case: dict) -> str:
    assert case["error"] and "\n" not in case["error"], case["error"]
    return case["error"]


def test_missing_operator_is_named(vulkan_runner, tmp_path):
    bundle = tmp_path / "fft.bpte"
    res = run_cli("build", FFT_MODEL, "--target", URL, "--cases", "2", "-o", str(bundle), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rc, rep, _ = _run(bundle, tmp_path / "r")
    assert rc == 2
    for case in rep["cases"]:
        assert case["error_kind"] == "missing-operator" and "aten::_fft_r2c.out" in _one_line(case)
        assert any("Missing operator" in ln or "not found" in ln for ln in case["log_excerpt"])
    assert processes_under(tmp_path) == []


def test_op_the_partitioner_delegates_but_the_runtime_lacks(vulkan_runner, tmp_path):
    """A finding, kept as a test: the 1.5.1 VulkanPartitioner delegates aten.logical_not (op_registry.py:1830)
    from SDPA's decomposition, but the Vulkan runtime registers no such op, so the runner aborts in
    build_graph (VulkanBackend.cpp:480): a missing operator inside the delegate, named."""
    bundle = tmp_path / "sdpa.bpte"
    res = run_cli("build", SDPA_MODEL, "--target", URL, "--cases", "1", "-o", str(bundle), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rc, rep, _ = _run(bundle, tmp_path / "r")
    (case,) = rep["cases"]
    assert rc == 2 and case["error_kind"] == "missing-operator"
    assert "aten.logical_not.default" in _one_line(case) and "Vulkan delegate" in case["error"]
    assert processes_under(tmp_path) == []


def _unset_dtype_bundle(path: Path) -> None:
    """A Vulkan program whose graph declares a tensor dtype this runtime does not know (VkDataType UNSET, as
    a serializer newer or older than the runtime could write), made with ExecuTorch's own API."""
    from unittest import mock

    import torch
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.backends.vulkan.serialization import vulkan_graph_builder
    from executorch.backends.vulkan.serialization.vulkan_graph_schema import VkDataType
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    example = (torch.randn(1, 16),)
    with mock.patch.object(vulkan_graph_builder, "get_vk_datatype", lambda dtype: VkDataType.UNSET):
        program = to_edge_transform_and_lower(torch.export.export(model, example),
                                              partitioner=[VulkanPartitioner()]).to_executorch()
    suite = MethodTestSuite("forward", [MethodTestCase(inputs=example, expected_outputs=(model(*example),))])
    path.write_bytes(serialize_from_bundled_program_to_flatbuffer(BundledProgram(program, [suite])))


def test_unsupported_dtype_in_the_program_is_unsupported(vulkan_runner, tmp_path):
    """The Vulkan runtime throws vkcompute::vkapi::Error (VulkanBackend.cpp:94) and nothing catches it: the
    runner aborts. bundlerun names the dtype problem and the place from the runtime's own message."""
    bundle = tmp_path / "unset.bpte"
    _unset_dtype_bundle(bundle)
    rc, rep, _ = _run(bundle, tmp_path / "r")
    (case,) = rep["cases"]
    assert rc == 2 and case["error_kind"] == "unsupported"
    error = _one_line(case)
    assert "Invalid VkDataType" in error and "VulkanBackend.cpp:94" in error and "aborted" in error
    assert any("terminate called after throwing" in ln for ln in case["log_excerpt"])
    assert processes_under(tmp_path) == []


def test_unsupported_dtype_at_build_is_one_line(tmp_path):
    res = run_cli("validate", "mlp", "--target", URL, "--dtype", "bf16", "--report", str(tmp_path / "r"),
                  "--no-history")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "dtype 'bf16' is not supported by the vulkan recipe (fp32, fp16, int8)" in res.stdout + res.stderr


def test_corrupted_vulkan_payload_is_a_bad_bundle(vulkan_runner, tmp_path):
    """An unsealed bundle (ExecuTorch's API: no hashes) with bytes flipped inside the Vulkan payload reaches the
    runtime, whose flatbuffer verifier refuses it; a sealed bundlerun bundle is refused before running."""
    from tests.test_vulkan_lane import _stock_vulkan_bundle

    stock = tmp_path / "stock.bpte"
    _stock_vulkan_bundle(stock)
    data = bytearray(stock.read_bytes())
    at = data.find(b"VK00")  # the VkGraph flatbuffer identifier inside the delegate payload
    assert at > 0
    for k in range(16):
        data[at + 40 + k] ^= 0xA5
    corrupt = tmp_path / "corrupt.bpte"
    corrupt.write_bytes(bytes(data))
    rc, rep, _ = _run(corrupt, tmp_path / "r")
    assert rc == 2 and len(rep["cases"]) == 3
    for case in rep["cases"]:
        assert case["error_kind"] == "bad-bundle" and "VkGraph FlatBuffer verification failed" in _one_line(case)
    assert processes_under(tmp_path) == []


def test_corrupted_sealed_bundle_is_refused_in_one_line(bundle_cache, tmp_path):
    data = bytearray(bundle_cache("mlp", cases=1, target=URL).read_bytes())
    data[data.find(b"VK00") + 64] ^= 0xFF
    corrupt = tmp_path / "corrupt.bpte"
    corrupt.write_bytes(bytes(data))
    res = run_cli("run", str(corrupt), "--target", URL, "--report", str(tmp_path / "r"), "--no-history")
    assert res.returncode == 2 and "the program was changed after the bundle was built" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def _signal_runner_when_running(folder: Path, runner: Path, sig: int, seconds: float = 120.0) -> threading.Thread:
    """Send `sig` to the Vulkan runner this test started (found by its working directory under `folder` and
    its executable) once it is executing."""

    def fire():
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for pid in processes_under(folder):
                try:
                    exe = os.readlink(f"/proc/{pid}/exe")
                    log = Path(os.readlink(f"/proc/{pid}/cwd")) / "runner.log"
                    if exe == str(runner) and "Model loaded" in log.read_text(errors="replace"):
                        os.kill(pid, sig)
                        return
                except OSError:
                    continue
            time.sleep(0.05)

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    return t


def test_crash_of_the_runner_is_a_crash(vulkan_runner, bundle_cache, tmp_path):
    bundle = bundle_cache("tiny-cnn", cases=2, target=URL)
    binary = Path(read_record(vulkan_runner)["binary"])
    killer = _signal_runner_when_running(tmp_path / "r", binary, signal.SIGSEGV)
    rc, rep, _ = _run(bundle, tmp_path / "r", "--select", "0", url=URL + "?num_executions=200000", timeout=900)
    killer.join(5)
    (case,) = rep["cases"]
    assert rc == 2 and case["verdict"] == "ERROR" and case["error_kind"] == "crash"
    assert "SIGSEGV" in _one_line(case) and "exit -11" in case["error"]
    assert processes_under(tmp_path) == []


def test_hang_times_out_and_is_killed(vulkan_runner, bundle_cache, tmp_path):
    bundle = bundle_cache("tiny-cnn", cases=2, target=URL)
    t0 = time.monotonic()
    rc, rep, _ = _run(bundle, tmp_path / "r", "--timeout", "5", "--select", "0",
                      url=URL + "?num_executions=10000000")
    assert time.monotonic() - t0 < 120
    (case,) = rep["cases"]
    assert rc == 2 and case["verdict"] == "TIMEOUT" and case["error_kind"] == "host-timeout"
    assert "within 5 s" in _one_line(case) and "killed" in case["error"]
    assert processes_under(tmp_path) == []


def test_missing_driver_before_the_run(vulkan_runner, bundle_cache, tmp_path):
    bundle = bundle_cache("mlp", cases=2, target=URL)
    missing = tmp_path / "no_such_icd.json"
    rc, rep, _ = _run(bundle, tmp_path / "r", url=f"{URL}?icd={missing}")
    assert rc == 2
    for case in rep["cases"]:
        assert case["error_kind"] == "tool-missing" and f"the Vulkan ICD {missing} does not exist" in _one_line(case)


def test_driver_library_missing_through_the_runtime(vulkan_runner, bundle_cache, tmp_path):
    """An ICD json whose driver library is gone: the loader finds no driver, the runner's VulkanBackend is not
    available (runtime/executor/method.cpp:93) and bundlerun says which ICD and library."""
    bundle = bundle_cache("mlp", cases=2, target=URL)
    icd = tmp_path / "gone_icd.json"
    lib = tmp_path / "libvulkan_gone.so"
    icd.write_text(json.dumps({"file_format_version": "1.0.0", "ICD": {"library_path": str(lib),
                                                                       "api_version": "1.3.230"}}))
    rc, rep, out = _run(bundle, tmp_path / "r", url=f"{URL}?icd={icd}")
    assert rc == 2 and "the Vulkan driver probe failed" in out
    for case in rep["cases"]:
        error = _one_line(case)
        assert case["error_kind"] == "tool-missing" and str(icd) in error and str(lib) in error
        assert any("Backend VulkanBackend is not available" in ln for ln in case["log_excerpt"])
    assert rep["target"]["info"]["driver"]["error"].startswith("vkCreateInstance returned -9")
    assert processes_under(tmp_path) == []


def test_missing_runner_names_the_build_command(bundle_cache, tmp_path):
    bundle = bundle_cache("mlp", cases=1, target=URL)
    rc, rep, _ = _run(bundle, tmp_path / "r", url=f"{URL}?runner={tmp_path / 'none'}")
    (case,) = rep["cases"]
    assert rc == 2 and case["error_kind"] == "tool-missing"
    assert "firmware_scripts/vulkan/build_vulkan_runner.sh" in _one_line(case)

