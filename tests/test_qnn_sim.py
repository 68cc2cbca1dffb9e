"""qnn://htp-sim on Qualcomm's REAL HTP simulator (x86_64 libQnnHtp.so from onnxruntime-qnn 2.5.0,
QNN 2.49.40) through ExecuTorch 1.5.1's real Qualcomm AOT and runtime. No double anywhere: a
missing simulator FAILS these tests (scripts/setup.sh installs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from qnn_helpers import lower_qnn, require_simulator, run_on_simulator, tiny_linear, write_plain_bundle

from bundlerun.bundles.backends.qnn import SOCS


@pytest.fixture(scope="module")
def sim():
    return require_simulator()


@pytest.fixture(scope="module")
def built(sim, tmp_path_factory):
    """Bundles built by the real CLI for qnn://htp-sim (fp16 mlp, int8 tiny-cnn)."""
    root = tmp_path_factory.mktemp("qnn-built")
    out = {}
    for model, dtype in (("mlp", "fp16"), ("tiny-cnn", "int8")):
        path = root / f"{model}-{dtype}.bpte"
        res = run_cli("build", model, "--target", "qnn://htp-sim", "--dtype", dtype, "--cases", "4", "-o", str(path))
        assert res.returncode == 0, res.stderr
        assert "Starting stage" not in res.stdout + res.stderr  # QNN's compiler output stays out of the console
        out[(model, dtype)] = path
    return out


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def _manifest(path: Path) -> dict:
    from bundlerun.bundles.bpte import read_bundle

    return read_bundle(path).manifest_json


def test_build_records_the_qnn_lowering_in_the_manifest(built):
    lowering = _manifest(built[("mlp", "fp16")])["build"]["lowering"]
    assert lowering["partitioner"] == "QnnPartitioner" and lowering["delegate_calls"] >= 1
    assert (lowering["soc_model"], lowering["htp_arch"], lowering["precision"]) == ("SM8650", "v75", "fp16")
    assert lowering["qnn_version"] == "2.49.40"
    int8 = _manifest(built[("tiny-cnn", "int8")])["build"]
    assert int8["quantization"] == "qnn-ptq-8a8w-per-channel-conv" and int8["lowering"]["precision"] == "quantized"


@pytest.mark.parametrize("key", [("mlp", "fp16"), ("tiny-cnn", "int8")])
def test_every_case_runs_on_the_simulator_and_is_judged(built, key, tmp_path):
    res = run_cli("run", str(built[key]), "--target", "qnn://htp-sim", "--report", str(tmp_path), "--no-history",
                  "--save-outputs")
    assert res.returncode == 0, res.stdout + res.stderr
    report = _report(tmp_path)
    assert [c["verdict"] for c in report["cases"]] == ["PASS"] * 4
    assert report["target"]["info"]["qnn_version"] == "2.49.40"
    assert "QnnBackend" in report["target"]["info"]["backends"]
    # the outputs are the simulator's, not the expected ones copied: HTP fp16/int8 differs from eager fp32
    errs = [o["stats"]["error_max"] for c in report["cases"] for o in c["outputs"]]
    assert all(0 < e < 0.1 for e in errs), errs
    logs = "".join(Path(p).read_text(errors="replace") for p in report["target"]["logs"].values())
    assert "[Qnn ExecuTorch]" in logs  # the QNN delegate itself ran (its log), on the x86 HTP libraries


def test_doctor_reports_the_simulator_and_the_command_when_missing(sim, tmp_path):
    res = run_cli("doctor")
    assert "QNN HTP simulator" in res.stdout and "2.49.40" in res.stdout
    res = run_cli("doctor", env={"BUNDLERUN_CACHE": str(tmp_path)})
    assert "not installed" in res.stdout and "install_htp_sim.sh" in res.stdout


@pytest.fixture(scope="module")
def linear_programs(sim):
    """One tiny program per SoC, lowered in this (test) process through the recipe's AOT child."""
    model, x = tiny_linear()
    return model, x, {soc: lower_qnn(model, x, "fp16", soc) for soc in SOCS}


def test_lowering_never_loads_qnn_into_the_build_process(linear_programs):
    from bundlerun.bundles.backends import qnn

    maps = Path("/proc/self/maps").read_text()
    assert "libQnnHtp.so" not in maps  # the AOT child loaded it, not us
    pid = qnn._AOT.pid()
    assert pid is not None and "libQnnHtp.so" in Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture(scope="module")
def pool(sim):
    from bundlerun.targets.workers.supervisor import WorkerPool

    workers = WorkerPool()
    yield workers
    workers.close()
    assert workers.pids() == []


@pytest.mark.parametrize("soc", SOCS)
def test_each_soc_lowers_and_runs_on_the_simulator(linear_programs, pool, soc, tmp_path):
    import numpy as np
    import torch
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset

    from bundlerun.targets.qnn import program_info

    model, x, programs = linear_programs
    result = programs[soc]
    assert result.info["soc_model"] == soc
    assert program_info(result.program.buffer).socs == [int(getattr(QcomChipset, soc))]
    with torch.no_grad():
        expected = model(*x).numpy()
    path = write_plain_bundle(result.program.buffer, [x[0].numpy()], [expected], tmp_path / f"{soc}.bpte", cases=2)
    run = run_on_simulator(path, tmp_path / "work", pool, url=f"qnn://htp-sim?soc={soc}")
    assert [c.status.value for c in run.cases] == ["ok", "ok"], [c.error for c in run.cases]
    assert not run.warnings  # built for the URL's SoC: no mismatch said
    for case in run.cases:
        err = np.abs(case.outputs[0].to_array() - expected).max()
        assert 0 < err < 0.05, err  # HTP fp16, not a copy of the reference


def test_soc_from_the_target_url_reaches_the_program(sim, tmp_path):
    """`build --target qnn://htp-sim?soc=SM8550` lowers for SM8550 (SPEC.lowering -> LoweringRequest.target_info)."""
    path = tmp_path / "mlp-8550.bpte"
    res = run_cli("build", "mlp", "--target", "qnn://htp-sim?soc=SM8550", "--cases", "1", "-o", str(path))
    assert res.returncode == 0, res.stderr
    assert _manifest(path)["build"]["lowering"]["soc_model"] == "SM8550"


def test_unknown_soc_is_a_one_line_error(built, tmp_path):
    res = run_cli("run", str(built[("mlp", "fp16")]), "--target", "qnn://htp-sim?soc=SM9999", "--no-history",
                  "--report", str(tmp_path / "r"))
    assert res.returncode == 2  # refused before any case runs: one line, no report folder
    error = res.stderr.strip().splitlines()[-1]
    assert "SM9999" in error and "SM8650" in error and not (tmp_path / "r").exists()
    res = run_cli("build", "mlp", "--target", "qnn://htp-sim?soc=SM9999", "-o", str(tmp_path / "x.bpte"))
    assert res.returncode == 2 and "unknown Qualcomm SoC 'SM9999'" in res.stderr
    assert "Traceback" not in res.stderr


def test_bundled_program_api_bundle_is_judged_right(linear_programs, tmp_path):
    """A bundle made by ExecuTorch's own BundledProgram API (no bundlerun manifest) from a QNN program:
    its cases are judged against its own expected outputs, a wrong expected output fails that case only."""
    import torch
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    model, x, programs = linear_programs
    pte = tmp_path / "model.pte"
    pte.write_bytes(programs["SM8650"].program.buffer)
    inputs = [(torch.randn(1, 8),) for _ in range(3)]
    with torch.no_grad():
        expected = [model(*i) for i in inputs]
    expected[1] = expected[1] + 1.0  # a wrong expectation
    suite = MethodTestSuite("forward", [MethodTestCase(inputs=list(i), expected_outputs=[e]) for i, e in zip(inputs, expected)])
    path = tmp_path / "api.bpte"
    path.write_bytes(serialize_from_bundled_program_to_flatbuffer(BundledProgram(None, [suite], pte_file_path=str(pte))))
    res = run_cli("run", str(path), "--target", "qnn://htp-sim", "--report", str(tmp_path / "r"), "--no-history",
                  "--no-require-seal", "--override", "out0.atol=0.1", "--override", "out0.rtol=0.1")
    assert res.returncode == 1, res.stdout + res.stderr  # a numerical failure, not an error
    cases = _report(tmp_path / "r")["cases"]
    assert [c["verdict"] for c in cases] == ["PASS", "FAIL", "PASS"]
    assert 0.9 < cases[1]["outputs"][0]["stats"]["error_max"] < 1.1


def test_pybindings_imported_after_libqnnhtp_crash_on_an_exception_but_not_before(sim, tmp_path):
    """The trap the lane is built around, shown on the real libraries: with libQnnHtp (RTLD_GLOBAL,
    its own libc++abi) loaded first, the pybindings' first C++ exception kills the process; imported
    first (what the qnn worker does), the same exception is a Python error."""
    model, x = tiny_linear()
    program = lower_qnn(model, x).program.buffer
    pte = tmp_path / "m.pte"
    pte.write_bytes(program)
    script = (
        "import sys, ctypes, torch\n"
        "if sys.argv[1] == 'first':\n    from executorch.extension.pybindings import portable_lib\n"
        f"ctypes.CDLL({str(sim / 'libQnnHtp.so')!r}, mode=ctypes.RTLD_GLOBAL)\n"
        "from executorch.extension.pybindings import portable_lib\n"
        f"m = portable_lib._load_for_executorch({str(pte)!r})\n"
        "try:\n    m.run_method('forward', [torch.zeros(1, 8, dtype=torch.half)])\n"
        "except RuntimeError as e:\n    print('caught', e)\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(sim), "QNN_SDK_ROOT": ""}
    first = subprocess.run([sys.executable, "-c", script, "first"], capture_output=True, text=True, env=env, timeout=300)
    after = subprocess.run([sys.executable, "-c", script, "after"], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0 and "caught" in first.stdout
    assert after.returncode < 0 and "caught" not in after.stdout  # killed by a signal (SIGSEGV)
