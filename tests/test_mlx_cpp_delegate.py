"""ExecuTorch's own C++ MLX delegate (backends/mlx/runtime at the pinned commit), built into
executor_runner against the mlx wheel's libmlx.so by firmware_scripts/mlx/build_mlx_runner.sh,
and bundlerun's Python MLX interpreter (targets/program/mlx_delegate.py): both on the same
bundles, every zoo model in fp32, fp16 and bf16, every case, output for output.

No double: the real runner from the runner cache (scripts/setup.sh builds it; without it these
tests fail and name the build command) and the real `mlx` package. Both runtimes call the same
libmlx.so (the runner carries a copy of the wheel's), so their outputs are compared byte for
byte: the interpreter exists to see inside the payload (`bundlerun debug`), and it is only worth
that if it computes what ExecuTorch's delegate computes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli
from bundlerun.targets.runner_cache import read_record

DTYPES = ("fp32", "fp16", "bf16")
SCRIPT = Path(__file__).resolve().parents[1] / "firmware_scripts" / "mlx" / "build_mlx_runner.sh"


def _zoo() -> list[str]:
    from bundlerun.bundles.zoo import names

    return sorted(names())  # the `validate zoo` set (mnist-cnn is judged by its dataset accuracy)


@pytest.fixture(scope="module")
def runner() -> Path:
    """The cached MLX executor_runner (a failure naming the build command when setup did not build it)."""
    from bundlerun.targets.mlx_runner import BUILD_COMMAND, default_runner

    found = default_runner()
    if found is None:
        pytest.fail(f"no MLX executor_runner in the runner cache: scripts/setup.sh builds it ({BUILD_COMMAND})")
    return found


def _interpreter_outputs(bundle, method: str, index: int) -> list[np.ndarray]:
    from bundlerun.targets.program.mlx_delegate import delegate_runners
    from bundlerun.targets.program.walker import ProgramWalker, load_program

    walker = ProgramWalker(load_program(bundle.program), delegate_runners())
    case = bundle.suite(method).test_cases[index]
    return [array for _code, array in walker.run(method, [v.to_array() for v in case.inputs])]


def test_runner_is_exectorchs_delegate_on_the_wheels_libmlx(runner):
    from importlib.metadata import version

    meta = read_record(runner.parent)
    assert meta["kind"] == "mlx_executor_runner" and meta["backends"] == ["mlx"] and meta["bundle_io"] is True
    assert meta["mlx"]["version"] == version("mlx")  # built against the installed wheel
    assert meta["patches"] == ["0001-mlx-backend-default-device.patch", "0002-mlx-0.32-api.patch",
                               "executor_runner-server-testset.patch"]
    assert meta["server_testset"] is True  # an LLM's sequence served on one loaded method (docs/llm.md)
    assert "-DEXECUTORCH_BUILD_MLX=OFF" in meta["flags"] and meta["build_seconds"] > 0
    lib = runner.parent / "mlx" / "lib" / "libmlx.so"
    assert lib.is_file() and (runner.parent / "mlx_cpu.libs").is_dir()
    dyn = subprocess.run(["readelf", "-d", str(runner)], capture_output=True, text=True, check=True).stdout
    assert "[$ORIGIN/mlx/lib]" in dyn and "libmlx.so" in dyn  # its own copy, not the venv's
    binary = runner.read_bytes()  # ExecuTorch's delegate linked in (the Release runner has no symbol table)
    for text in (b"Failed to load MLX program: %s", b"MLX execute failed: %s", b"Unknown op_type in load_instruction: "):
        assert text in binary, text


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model", _zoo())
def test_cpp_delegate_and_interpreter_agree_bit_for_bit(runner, bundle_cache, tmp_path, model, dtype):
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.targets.base import CaseStatus, RunOptions
    from bundlerun.targets.mlx_runner import run_bundle

    bundle = read_bundle(bundle_cache(model, dtype, backend="mlx", cases=4, target="mlx://cpu"))
    run = run_bundle("mlx://cpu", bundle, RunOptions(work_dir=tmp_path), runner)
    assert [c.status for c in run.cases] == [CaseStatus.OK] * 4, [(c.error, c.log_excerpt) for c in run.cases]
    for case in run.cases:
        want = bundle.suite(case.method).test_cases[case.case_index].expected_outputs
        interp = _interpreter_outputs(bundle, case.method, case.case_index)
        assert len(case.outputs) == len(interp) == len(want)
        for got, ref, expected in zip(case.outputs, interp, want):
            assert got.scalar_type == expected.scalar_type and list(got.shape) == list(expected.sizes)
            assert got.data == np.ascontiguousarray(ref).tobytes(), (
                f"{model} {dtype} case {case.case_index}: C++ delegate and interpreter differ, max "
                f"{np.max(np.abs(got.to_array().astype(np.float64) - ref.astype(np.float64)))}")


def test_validate_zoo_on_the_cpp_delegate_from_the_cli(runner, tmp_path):
    """What a user runs: every case judged with the bundle's embedded criteria, on the C++ delegate."""
    res = run_cli("validate", "mlp", "tiny-transformer", "--target", "mlx://cpu", "--dtype", "fp32,bf16", "--cases", "3",
                  "--report", str(tmp_path), "--no-history")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for slug in ("mlp-fp32", "mlp-bf16", "tiny-transformer-fp32", "tiny-transformer-bf16"):
        report = json.loads((tmp_path / slug / "report.json").read_text())
        assert report["summary"]["verdict"] == "PASS" and report["summary"]["counts"]["PASS"] == 3
        info = report["target"]["info"]
        assert info["runtime"].startswith("ExecuTorch MLX delegate") and info["runner"] == str(runner)
        assert info["runner_mode"] == {"forward": "executor_runner --server_mode: one process for 3 case(s)"}
        for case in report["cases"]:  # each case's own time on the server: its trigger, on the host's clock
            (fig,) = [f for f in case["perf"] if f["name"] == "runner_case_wall_time"]
            assert fig["kind"] == "host-wall" and 0 < fig["value"] < 10


def test_a_bundle_made_with_executorchs_bundledprogram_api_is_judged(runner, tmp_path):
    """No bundlerun manifest: ExecuTorch's BundledProgram + serialize_from_bundled_program_to_flatbuffer
    around an MLXPartitioner program; one expected output deliberately wrong in case 1."""
    import torch
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    from bundlerun.bundles.backends.base import LoweringRequest
    from bundlerun.bundles.backends.mlx import lower

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    xs = [torch.randn(2, 8) for _ in range(2)]
    program = lower(LoweringRequest(model, (xs[0],), [], "fp32", "mlx", "mlx://cpu")).program
    with torch.no_grad():
        cases = [MethodTestCase(inputs=[x], expected_outputs=[model(x) + (0.5 if i == 1 else 0.0)]) for i, x in enumerate(xs)]
    path = tmp_path / "et.bpte"
    path.write_bytes(serialize_from_bundled_program_to_flatbuffer(BundledProgram(program, [MethodTestSuite("forward", cases)])))
    res = run_cli("run", str(path), "--target", "mlx://cpu", "--report", str(tmp_path / "r"), "--no-history")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]  # a numerical failure, judged here
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [c["verdict"] for c in report["cases"]] == ["PASS", "FAIL"]
    assert report["cases"][0]["outputs"][0]["stats"]["error_max"] < 1e-5
    assert abs(report["cases"][1]["outputs"][0]["stats"]["error_max"] - 0.5) < 1e-3


def test_build_script_dry_run_and_bad_input(tmp_path):
    env = {**os.environ, "BUNDLERUN_CACHE": str(tmp_path / "cache")}
    res = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    for flag in ("generate.py --flatc", "-DEXECUTORCH_BUILD_MLX=OFF", "-DEXECUTORCH_ENABLE_BUNDLE_IO=ON",
                 "-DCMAKE_PROJECT_executorch_INCLUDE=", "inject.cmake", "-DBUNDLERUN_MLX_CMAKE_DIR=",
                 "share/cmake/MLX", "--target executor_runner -j 2", "0002-mlx-0.32-api.patch"):
        assert flag in res.stdout, flag
    folder = Path(res.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path / "cache" / "runners" and len(folder.name) == 20
    assert not (tmp_path / "cache" / "runners").exists()  # a dry run builds nothing
    only = subprocess.run(["bash", str(SCRIPT), "--cached-only"], capture_output=True, text=True, env=env, timeout=120)
    assert only.returncode == 3 and "no cached MLX executor_runner" in only.stderr
    for args, message in ((["--jobs", "two"], "--jobs must be a positive integer"),
                          (["--executorch-src", "/nonexistent"], "not an ExecuTorch checkout"),
                          (["--python", "/bin/false"], "cannot import mlx"), (["--frobnicate"], "unknown option")):
        bad = subprocess.run(["bash", str(SCRIPT), *args, "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1


def _doctor_mlx(env: dict | None = None) -> tuple[list[dict], dict]:
    res = run_cli("doctor", "--json", env=env)
    data = json.loads(res.stdout)
    return [c for c in data["checks"] if c["target"] == "mlx"], data["targets"]["mlx"]


def test_doctor_reports_the_runner_and_the_build_command(runner, tmp_path):
    rows, summary = _doctor_mlx()
    row = next(r for r in rows if r["component"].startswith("MLX C++ delegate runner") and r["where"] == str(runner.parent))
    assert row["ok"] is True and "mlx 0.32" in row["detail"] and summary["ready"] is True
    rows, summary = _doctor_mlx({"BUNDLERUN_CACHE": str(tmp_path / "empty")})
    row = next(r for r in rows if r["component"] == "MLX C++ delegate runner")
    assert row["ok"] is False and "bash firmware_scripts/mlx/build_mlx_runner.sh --jobs 2" in row["detail"]
    assert summary["ready"] is False and "MLX C++ delegate runner" in summary["missing"]
