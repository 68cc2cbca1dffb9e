"""ExecuTorch's executor_runner in `--server_mode` (targets/et_runner/server.py), as mlx://cpu runs it:
one process for every case of a method, the cases' inputs as `--inputs` files.

No double: the real MLX executor_runner from the runner cache (scripts/setup.sh builds it; without it
these tests fail and name the build command) on real MLX bundles. Faults are real too: a truncated
input file is refused by the runner's own prepare_input_tensors (an abort), and a stopped server is
one that never answers.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from bundlerun.targets.et_runner import server
from tests.test_mlx_cpp_delegate import runner  # noqa: F401  (the cached MLX executor_runner, or a failure naming its build)


@pytest.fixture(scope="module")
def mlp(bundle_cache):
    from bundlerun.bundles.bpte import read_bundle

    return read_bundle(bundle_cache("mlp", "fp32", backend="mlx", cases=6, target="mlx://cpu"))


def _run(bundle, runner: Path, work: Path, timeout_s: float = 60.0, **settings):
    from bundlerun.targets.base import RunOptions
    from bundlerun.targets.mlx_runner import run_bundle

    return run_bundle("mlx://cpu", bundle, RunOptions(work_dir=work, case_timeout_s=timeout_s), runner, **settings)


def _bytes(run) -> list[list[bytes]]:
    return [[t.data for t in case.outputs] for case in run.cases]


def test_served_cases_are_the_one_process_cases_bit_for_bit(runner, mlp, tmp_path):
    served = _run(mlp, runner, tmp_path / "served")
    alone = _run(mlp, runner, tmp_path / "alone", etdump=True)  # an ETDump per case: one process each
    assert served.info["runner_mode"] == {"forward": "executor_runner --server_mode: one process for 6 case(s)"}
    assert alone.info["runner_mode"] == {"forward": "one executor_runner process per case (etdump: one ETDump per process)"}
    assert [c.status.value for c in served.cases] == ["ok"] * 6 and [c.case_index for c in served.cases] == list(range(6))
    assert all(c.extra["served"] == "executor_runner --server_mode, process 1" for c in served.cases)
    assert _bytes(served) == _bytes(alone)
    assert len({tuple(o) for o in _bytes(served)}) == 6  # six different cases, not one answer six times
    log = (tmp_path / "served" / "mlx-runner" / "forward-served" / "server-1.log").read_text()
    assert log.count(server.DONE) == 6 and server.READY in log


def test_a_server_that_aborts_on_a_case_leaves_it_and_the_rest_to_one_case_processes(runner, mlp, tmp_path,
                                                                                   monkeypatch):
    real = server.input_bytes
    fed: list[int] = []

    def short_for_case_2(value):
        data = real(value)
        fed.append(1)
        # feed() writes case 0 twice (before start, then for its trigger): the fourth file is case 2's
        return data[:-4] if len(fed) == 4 else data

    monkeypatch.setattr(server, "input_bytes", short_for_case_2)
    run = _run(mlp, runner, tmp_path / "w")
    log = (tmp_path / "w" / "mlx-runner" / "forward-served" / "server-1.log").read_text()
    assert "input size (124) and tensor size (128) mismatch!" in log  # inputs.cpp's own line, then its abort
    assert [c.status.value for c in run.cases] == ["ok"] * 6
    assert ["served" in c.extra for c in run.cases] == [True, True, False, False, False, False]
    assert run.info["runner_mode"]["forward"].endswith("4 case(s) from case 2 on, one process each (the server stopped)")
    assert _bytes(run) == _bytes(_run(mlp, runner, tmp_path / "alone", etdump=True))


def test_a_server_that_stops_answering_times_out_and_a_new_one_takes_the_rest(runner, mlp, tmp_path, monkeypatch):
    started: list[int] = []
    real_start, real_send = server.RunnerServer.start, server.RunnerServer.send
    triggers = {"n": 0}

    def start(self, timeout_s, meanwhile=None):
        served = real_start(self, timeout_s, meanwhile)
        started.append(self.proc.pid)
        return served

    def send(self, case=None):  # serve() writes each trigger with send(), then waits for it
        triggers["n"] += 1
        if triggers["n"] == 2:
            os.kill(self.proc.pid, signal.SIGSTOP)  # case 1 never finishes
        return real_send(self, case)

    monkeypatch.setattr(server.RunnerServer, "start", start)
    monkeypatch.setattr(server.RunnerServer, "send", send)
    run = _run(mlp, runner, tmp_path / "w", timeout_s=2.0)
    assert [c.status.value for c in run.cases] == ["ok", "timeout", "ok", "ok", "ok", "ok"]
    assert run.cases[1].error == "the MLX runner did not finish within 2 s; process group killed"
    assert run.cases[1].error_kind.value == "host-timeout"
    assert [c.extra.get("served") for c in run.cases if c.case_index != 1] == [
        "executor_runner --server_mode, process 1"] + ["executor_runner --server_mode, process 2"] * 4
    assert len(started) == 2
    for pid in started:  # both reaped: no zombie, no stopped process left
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_inputs_the_files_cannot_carry_run_one_process_per_case(mlp):
    from bundlerun.bundles import scalar_types as st
    from bundlerun.bundles.bpte import MethodTestSuite

    assert server.unservable(mlp, "forward") is None
    suite = mlp.suite("forward")
    first = suite.test_cases[0]
    as_int = replace(first, inputs=[replace(first.inputs[0], scalar_type=st.INT)])  # same bytes, another dtype
    tampered = replace(mlp, method_test_suites=[MethodTestSuite("forward", [as_int, *suite.test_cases[1:]])])
    assert server.unservable(tampered, "forward") == (
        "case 0 input 0 is not the [1, 32] tensor the program declares, in its layout")
    channels_last = replace(first, inputs=[replace(first.inputs[0], dim_order=[1, 0])])
    moved = replace(mlp, method_test_suites=[MethodTestSuite("forward", [channels_last])])
    assert server.unservable(moved, "forward").startswith("case 0 input 0 is not")


def test_a_trigger_that_leaves_no_output_file_is_an_error_not_the_last_cases_outputs(runner, mlp, tmp_path,
                                                                                    monkeypatch):
    """Each trigger's output files are read the moment it says DONE (before the next trigger can overwrite
    them) and removed before the next one: a trigger whose file is gone is that case's missing output, never
    the previous case's bytes taken for its own. No double: the real MLX runner; the file is removed by the test."""
    real_wait = server.RunnerServer.wait
    waits = {"n": 0}

    def wait(self, t0, timeout_s):
        served = real_wait(self, t0, timeout_s)
        waits["n"] += 1
        if waits["n"] == 3:  # case 2's answer: its output file removed before bundlerun reads it
            (self.cwd / "out" / "output-0.bin").unlink()
        return served

    monkeypatch.setattr(server.RunnerServer, "wait", wait)
    run = _run(mlp, runner, tmp_path / "w")
    assert [c.status.value for c in run.cases] == ["ok", "ok", "error", "ok", "ok", "ok"]
    assert run.cases[2].error == "expected 1 output files, found 0"
    assert run.cases[2].error_kind.value == "missing-output"
    alone = _run(mlp, runner, tmp_path / "alone", etdump=True)
    assert [b for i, b in enumerate(_bytes(run)) if i != 2] == [b for i, b in enumerate(_bytes(alone)) if i != 2]
