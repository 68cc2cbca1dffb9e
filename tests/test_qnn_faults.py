"""Faults through the REAL QNN runtime on Qualcomm's HTP simulator (no double): each one is a
one-line error with its FailureKind, a written report, exit code 2, and nothing left running.

Faulty programs are real QNN programs (bundlerun's qnn recipe) with one thing wrong: a kernel the
runtime lacks, an input of the wrong dtype, a context binary overwritten in its middle, a context
binary whose recorded HTP API version is newer than the simulator's, online_prepare=True. The
crash and the hang use targets/workers/host.py's BUNDLERUN_FAULT switch (a real SIGSEGV / a real stop inside
the real worker); the missing library is a copy of the simulator folder without libc++abi."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from proc_helpers import TAG_VAR, new_tag, tagged
from qnn_helpers import (htp_api_version_offset, lower_qnn, require_simulator, run_on_simulator, tiny_linear,
                         write_plain_bundle)



@pytest.fixture(scope="module")
def sim():
    return require_simulator()


@pytest.fixture(scope="module")
def plain(sim, tmp_path_factory):
    """(program bytes, input, expected output) of a tiny fp16 QNN program."""
    import torch

    model, x = tiny_linear()
    program = lower_qnn(model, x).program.buffer
    with torch.no_grad():
        return program, x[0].numpy(), model(*x).numpy()


def _run(bundle: Path, tmp_path: Path, *extra: str, env: dict | None = None, timeout: float = 600):
    """The real CLI in its own session, tagged: returns (exit code, report, pids of ours still alive)."""
    tag = new_tag()
    full_env = {**os.environ, TAG_VAR: tag, **(env or {})}
    report = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "run", str(bundle),
                           "--target", "qnn://htp-sim", "--report", str(report), "--no-history", "--no-require-seal",
                           "--override", "out0.atol=0.1", "--override", "out0.rtol=0.1", *extra],
                          capture_output=True, text=True, env=full_env, timeout=timeout, start_new_session=True)
    data = json.loads((report / "report.json").read_text())
    return proc, data, tagged(tag, b"bundlerun")


@pytest.fixture(scope="module")
def pool(sim):
    """One warm qnn worker shared by this module's in-process runs; nothing of it outlives the module."""
    from bundlerun.targets.workers.supervisor import WorkerPool

    workers = WorkerPool()
    yield workers
    workers.close()
    assert _our_workers() == []


def _our_workers() -> list[int]:
    """Live qnn worker processes started by this (test) process."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and b"bundlerun.targets.qnn" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _inproc(path: Path, tmp_path: Path, pool, **kw) -> dict:
    """The target's cases for one bundle on the module's warm worker, as report-like records; the only qnn
    processes left afterwards are the pool's idle workers."""
    run = run_on_simulator(path, tmp_path / "work", pool, **kw)
    assert set(_our_workers()) <= set(pool.pids())  # no stray worker: only the pool's idle ones
    return {"cases": [{"verdict": c.status.value.upper() if c.status.value != "ok" else "OK",
                       "error_kind": None if c.error_kind is None else c.error_kind.value, "error": c.error}
                      for c in run.cases]}


def _one_kind(data: dict, kind: str, *words: str) -> None:
    for case in data["cases"]:
        assert case["error_kind"] == kind, case
        assert "\n" not in case["error"] and all(w in case["error"] for w in words), case["error"]


CUSTOM_OP_MODEL = """
import torch

lib = torch.library.Library("bundlerun_qnn_test", "FRAGMENT")
lib.define("twice(Tensor x) -> Tensor")
lib.define("twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
lib.impl("twice.out", lambda x, out: out.copy_(x * 2), "CompositeExplicitAutograd")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.ops.bundlerun_qnn_test.twice(self.a(x)))
"""


def test_missing_operator(sim, tmp_path):
    """A user model whose custom op (registered by its own file) stays outside the QNN delegate:
    the recipe's AOT child imports that file to load the model; the runtime has no kernel for it."""
    import importlib.util

    import torch

    source = tmp_path / "custom_op_model.py"
    source.write_text(CUSTOM_OP_MODEL)
    spec = importlib.util.spec_from_file_location("custom_op_model", source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_op_model"] = module
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model, x = module.Net().eval(), (torch.randn(1, 8),)
    result = lower_qnn(model, x)
    assert result.info["delegate_calls"] == 2  # QNN took both linears; the custom op stays outside
    with torch.no_grad():
        path = write_plain_bundle(result.program.buffer, [x[0].numpy()], [model(*x).numpy()], tmp_path / "op.bpte")
    proc, data, left = _run(path, tmp_path)
    assert proc.returncode == 2 and not left
    _one_kind(data, "missing-operator", "bundlerun_qnn_test::twice.out")


def test_unsupported_dtype_at_build_is_one_line(sim, tmp_path):
    for dtype in ("bf16", "fp32"):
        res = subprocess.run([sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "build", "mlp",
                              "--target", "qnn://htp-sim", "--dtype", dtype, "-o", str(tmp_path / "x.bpte")],
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert f"dtype '{dtype}' is not supported by the qnn recipe" in res.stderr


def test_input_of_the_wrong_dtype_at_run_is_a_bad_bundle(plain, pool, tmp_path):
    """The runtime raises a C++ exception after libQnnHtp was loaded (RTLD_GLOBAL): the worker imported
    the pybindings first, so it is an error line, not a crash."""
    program, x, y = plain
    path = write_plain_bundle(program, [x.astype("float16")], [y], tmp_path / "half.bpte")
    data = _inproc(path, tmp_path, pool)
    _one_kind(data, "bad-bundle", "input 0 is Half", "takes Float")


def test_corrupted_context_binary(plain, pool, tmp_path):
    program, x, y = plain
    broken = bytearray(program)
    start = htp_api_version_offset(program) + 0x378  # inside the context binary, past its header
    broken[start:start + 0x2000] = bytes((i * 7) & 0xFF for i in range(0x2000))
    path = write_plain_bundle(bytes(broken), [x], [y], tmp_path / "corrupt.bpte")
    data = _inproc(path, tmp_path, pool)
    _one_kind(data, "bad-bundle", "QNN context binary cannot be loaded", "QNN:")


def test_context_binary_from_a_newer_qnn(plain, pool, tmp_path):
    program, x, y = plain
    newer = bytearray(program)
    at = htp_api_version_offset(program)
    newer[at:at + 12] = struct.pack("<III", 6, 0, 0)  # compiled by an HTP API 6.0.0 QNN
    path = write_plain_bundle(bytes(newer), [x], [y], tmp_path / "newer.bpte")
    data = _inproc(path, tmp_path, pool)
    _one_kind(data, "load-failure", "Using newer context binary on old SDK", "QNN 2.49.40")


def test_online_prepare_is_refused_before_anything_runs(sim, tmp_path):
    import torch
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
    )

    model, x = tiny_linear()
    specs = generate_qnn_executorch_compiler_spec(soc_model=QcomChipset.SM8650, online_prepare=True,
                                                  backend_options=generate_htp_compiler_spec(use_fp16=True))
    program = _lower_with_specs(model, x, specs, tmp_path)
    with torch.no_grad():
        path = write_plain_bundle(program, [x[0].numpy()], [model(*x).numpy()], tmp_path / "online.bpte")
    proc, data, left = _run(path, tmp_path)
    assert proc.returncode == 2 and not left
    _one_kind(data, "unsupported", "online_prepare=True", "libQnnSystem")
    assert not list((tmp_path / "report" / "work").glob("qnn-sim-*.log"))  # no worker was started


def _lower_with_specs(model, x, specs, tmp_path: Path) -> bytes:
    """ExecuTorch's own to_edge_transform_and_lower_to_qnn with these specs, in a child (libQnnHtp
    never enters the test process)."""
    import torch

    torch.save({"model": model, "x": x, "specs": specs}, tmp_path / "req.pt")
    script = (
        "import torch\n"
        "from executorch.backends.qualcomm.utils.utils import to_edge_transform_and_lower_to_qnn\n"
        f"r = torch.load({str(tmp_path / 'req.pt')!r}, weights_only=False)\n"
        "p = to_edge_transform_and_lower_to_qnn(r['model'], r['x'], r['specs']).to_executorch()\n"
        f"open({str(tmp_path / 'out.pte')!r}, 'wb').write(p.buffer)\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(require_simulator()), "QNN_SDK_ROOT": ""}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return (tmp_path / "out.pte").read_bytes()


def test_crash_costs_only_its_case(plain, pool, tmp_path, monkeypatch):
    program, x, y = plain
    path = write_plain_bundle(program, [x], [y], tmp_path / "crash.bpte")
    monkeypatch.setenv("BUNDLERUN_FAULT", "crash@forward:1")
    data = _inproc(path, tmp_path, pool)  # the crashed worker is replaced for case 2
    assert [c["verdict"] for c in data["cases"]] == ["OK", "ERROR", "OK"]
    assert data["cases"][1]["error_kind"] == "crash" and "SIGSEGV" in data["cases"][1]["error"]


def test_hang_is_a_timeout_and_the_rest_still_runs(plain, tmp_path):
    program, x, y = plain
    path = write_plain_bundle(program, [x], [y], tmp_path / "hang.bpte")
    proc, data, left = _run(path, tmp_path, "--timeout", "15", env={"BUNDLERUN_FAULT": "hang@forward:1"})
    assert proc.returncode == 2 and not left
    assert [c["verdict"] for c in data["cases"]] == ["PASS", "TIMEOUT", "PASS"]
    assert data["cases"][1]["error_kind"] == "host-timeout"


def test_missing_library_names_it(plain, sim, pool, tmp_path):
    program, x, y = plain
    partial = tmp_path / "lib"
    shutil.copytree(sim, partial)
    (partial / "libc++abi-0539aa51.so.1.0").unlink()
    path = write_plain_bundle(program, [x], [y], tmp_path / "lib.bpte")
    data = _inproc(path, tmp_path, pool, config={"lib_dir": str(partial)})
    _one_kind(data, "tool-missing", "libQnnHtp.so", "libc++abi-0539aa51.so.1.0: cannot open shared object file")


def test_simulator_not_installed_names_the_command(plain, tmp_path):
    program, x, y = plain
    path = write_plain_bundle(program, [x], [y], tmp_path / "none.bpte")
    proc, data, left = _run(path, tmp_path, env={"BUNDLERUN_CACHE": str(tmp_path / "empty")})
    assert proc.returncode == 2 and not left
    _one_kind(data, "tool-missing", "bash firmware_scripts/qnn/install_htp_sim.sh")
