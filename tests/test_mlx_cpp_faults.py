"""Faults through ExecuTorch's real C++ MLX delegate on mlx://cpu (the cached executor_runner of
firmware_scripts/mlx/build_mlx_runner.sh), each from the CLI as a user meets it: a one-line error,
the right FailureKind, a written report, exit code 2, and none of the processes this test started
left running (found by the test's own environment tag, tests/proc_helpers.py).

No double. The faults are real: an MLX op the pinned runtime's schema lacks (TruncNode, which
only the newer executorch wheel's partitioner emits), payloads edited after lowering (a dtype the
runtime's resolve_dtype rejects; a broken header; a broken flatbuffer), the running runner
killed with SIGSEGV, a runner executing for longer than the case timeout, the runner binary
without its libmlx.so, and no runner at all.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.proc_helpers import TAG_VAR, new_tag, tagged

TRUNC_FACTORY = '''
import torch

class Trunc(torch.nn.Module):
    def forward(self, x):
        return torch.trunc(x * 3.0) + x

def trunc():
    return Trunc(), (torch.randn(2, 8),)
'''


@pytest.fixture(scope="module")
def runner() -> Path:
    from bundlerun.targets.mlx_runner import BUILD_COMMAND, default_runner

    found = default_runner()
    if found is None:
        pytest.fail(f"no MLX executor_runner in the runner cache: scripts/setup.sh builds it ({BUILD_COMMAND})")
    return found


@pytest.fixture
def tag():
    return new_tag()


def _run(bundle: Path, report: Path, tag: str, *args: str, env: dict | None = None):
    res = run_cli("run", str(bundle), "--target", "mlx://cpu", "--report", str(report), "--no-history", *args,
                  env={TAG_VAR: tag, **(env or {})})
    assert (report / "report.json").is_file(), res.stdout[-2000:] + res.stderr[-2000:]
    return res, json.loads((report / "report.json").read_text())


def _assert_failed(res, report: dict, kind: str, *needles: str) -> dict:
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "internal error" not in (res.stdout + res.stderr)
    case = report["cases"][0]
    assert case["error_kind"] == kind, (case["error_kind"], case["error"])
    assert "\n" not in case["error"]
    for needle in needles:
        assert needle in case["error"], (needle, case["error"])
    return case


def _idle(tag: str, timeout_s: float = 10.0) -> list[int]:
    """The runner processes this test started that are still alive (bounded wait for reaping)."""
    deadline = time.monotonic() + timeout_s
    while (left := tagged(tag, b"executor_runner")) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _payload(bundle) -> bytes:
    from bundlerun.targets.program.walker import load_program

    program = load_program(bundle.program).program
    ref = program.execution_plan[0].delegates[0]
    assert ref.id == "MLXBackend"
    return bytes(program.backend_delegate_data[ref.processed.index].data)


def _with_payload(bundle, new: bytes, path: Path) -> Path:
    from bundlerun.bundles.bpte import write_bundle

    old = _payload(bundle)
    assert len(new) == len(old) and bundle.program.count(old) == 1
    write_bundle(replace(bundle, program=bundle.program.replace(old, new)), path)
    return path


@pytest.fixture(scope="module")
def mlp(bundle_cache):
    from bundlerun.bundles.bpte import read_bundle

    path = bundle_cache("mlp", "fp32", backend="mlx", cases=2, target="mlx://cpu")
    return path, read_bundle(path)


def test_an_mlx_op_the_runtime_lacks_is_a_missing_operator(runner, tmp_path, tag):
    factory = tmp_path / "trunc_model.py"
    factory.write_text(TRUNC_FACTORY)
    bundle = tmp_path / "trunc.bpte"
    built = run_cli("build", f"{factory}:trunc", "--backend", "mlx", "--target", "mlx://cpu", "--cases", "2",
                    "-o", str(bundle))
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    res, report = _run(bundle, tmp_path / "r", tag)
    case = _assert_failed(res, report, "missing-operator", "TruncNode", "newer MLX schema")
    assert "Unknown op_type in load_instruction: 135" in "\n".join(case["log_excerpt"])  # MLXLoader.cpp's own line
    assert all(c["error_kind"] == "missing-operator" for c in report["cases"])
    assert _idle(tag) == []
    # bundlerun's interpreter follows the wheel's schema (which has TruncNode): it runs what the pinned C++ cannot
    res, report = _run(bundle, tmp_path / "i", tag, "--target-opt", "runtime=interpreter")
    assert res.returncode == 0 and report["summary"]["verdict"] == "PASS", report["cases"][0].get("error")


def test_a_dtype_the_runtime_does_not_support(runner, mlp, tmp_path, tag):
    """The graph's input metadata rewritten to float64 (ScalarType 7): MLXBackend.cpp's tensor_to_mlx asks
    resolve_dtype (MLXExecutor.h:587), which maps no Double, for the dtype the model expects."""
    from bundlerun.bundles.mlx_codegen import ensure_mlx_importable

    path, bundle = mlp
    ensure_mlx_importable()
    from executorch.backends.mlx.serialization._generated.mlx_delegate.MLXGraph import MLXGraph

    payload = bytearray(_payload(bundle))
    (data_offset,) = __import__("struct").unpack_from("<Q", payload, 8)
    graph = MLXGraph.GetRootAs(bytes(payload[24:data_offset]), 0)
    meta = graph.TensorMeta(graph.InputMap(0).Idx())
    assert meta.ScalarType() == 6
    pos = 24 + meta._tab.Pos + meta._tab.Offset(6)  # TensorMeta.scalar_type: field 1, vtable slot 6
    assert payload[pos] == 6
    payload[pos] = 7
    bad = _with_payload(bundle, bytes(payload), tmp_path / "f64.bpte")
    res, report = _run(bad, tmp_path / "r", tag)
    _assert_failed(res, report, "unsupported", "does not run this dtype", "Unsupported ScalarType: 7")
    assert _idle(tag) == []


@pytest.mark.parametrize("damage, said", [("magic", "Invalid MLX header"), ("flatbuffer", "Invalid FlatBuffer data")])
def test_a_corrupted_mlx_payload_is_a_bad_bundle(runner, mlp, tmp_path, tag, damage, said):
    path, bundle = mlp
    payload = bytearray(_payload(bundle))
    if damage == "magic":
        payload[4:8] = b"MLX9"
    else:
        payload[24:28] = (0x7FFFFFF0).to_bytes(4, "little")  # the flatbuffer's root offset points outside it
    bad = _with_payload(bundle, bytes(payload), tmp_path / "bad.bpte")
    res, report = _run(bad, tmp_path / "r", tag)
    _assert_failed(res, report, "bad-bundle", "could not load its payload", said)
    assert _idle(tag) == []


def test_a_runner_killed_by_sigsegv_is_a_crash(runner, mlp, tmp_path, tag):
    path, _ = mlp
    killed: list[int] = []

    def kill() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for pid in tagged(tag, str(runner).encode()):
                time.sleep(0.5)  # into its executions
                os.kill(pid, signal.SIGSEGV)
                killed.append(pid)
                return
            time.sleep(0.02)

    t = threading.Thread(target=kill, daemon=True)
    t.start()
    res, report = _run(path, tmp_path / "r", tag, "--select", "0", "--repeat", "100000")
    t.join(5)
    assert killed, "the runner never started"
    _assert_failed(res, report, "crash", "SIGSEGV")
    assert _idle(tag) == []


def test_a_hung_runner_times_out_and_is_killed(runner, mlp, tmp_path, tag):
    path, _ = mlp
    t0 = time.monotonic()
    res, report = _run(path, tmp_path / "r", tag, "--select", "0", "--repeat", "100000", "--timeout", "2")
    assert res.returncode == 2 and report["cases"][0]["status"] == "timeout" and report["cases"][0]["verdict"] == "TIMEOUT"
    assert report["cases"][0]["error_kind"] == "host-timeout" and "process group killed" in report["cases"][0]["error"]
    assert time.monotonic() - t0 < 120
    assert _idle(tag) == []


def test_a_runner_without_its_libmlx_cannot_start(runner, mlp, tmp_path, tag):
    path, _ = mlp
    alone = tmp_path / "alone" / "executor_runner"
    alone.parent.mkdir()
    shutil.copy2(runner, alone)  # no mlx/lib/libmlx.so beside it
    res, report = _run(path, tmp_path / "r", tag, "--target-opt", f"runner={alone}")
    case = _assert_failed(res, report, "tool-missing", "libmlx.so: cannot open shared object file",
                          "build_mlx_runner.sh")
    assert all(c["error"] == case["error"] for c in report["cases"])  # said once for the run, for every case
    assert _idle(tag) == []


def test_no_runner_built_names_the_build_command(mlp, tmp_path, tag):
    path, _ = mlp
    res, report = _run(path, tmp_path / "r", tag, env={"BUNDLERUN_CACHE": str(tmp_path / "empty-cache")})
    _assert_failed(res, report, "tool-missing", "no MLX executor_runner",
                   "bash firmware_scripts/mlx/build_mlx_runner.sh --jobs 2")
