"""ExecuTorch's backend test suite (from the installed wheel) on bundlerun targets, driven as a
user drives it: `pytest --pyargs executorch.backends.test.suite.operators -m flow_... 
--bundlerun-target URL --json-report` in a fresh process. Real lowering (the suite's own
flows), real runtimes: the aarch64 executor_runner under qemu-aarch64, the TOSA reference model,
the host pybindings. No doubles."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = "bundlerun.runner.pytest_plugin"


def _pytest(cwd: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "pytest_jsonreport.plugin",
                           "-p", "no:cacheprovider", "-q", "-rA", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _subtests(report: Path) -> dict[str, dict]:
    data = json.loads(report.read_text())
    out = {}
    for test in data["tests"]:
        for sub in test["metadata"]["subtests"]:
            name = sub["Test ID"] + (f"#{sub['Subtest']}" if sub["Subtest"] else "")
            out[name] = {**sub, "_outcome": test["outcome"]}
    return out


def test_the_suite_pieces_bundlerun_relies_on():
    """Pinned against the installed wheel: runner/suite/compat.py reads exactly these."""
    from executorch.backends.test.suite import conftest, reporting
    from executorch.backends.test.suite.flow import TestFlow, all_flows
    from executorch.backends.test.harness import Tester

    flows = all_flows()
    assert {"portable", "xnnpack", "arm_tosa_int", "arm_tosa_fp"} <= set(flows)
    assert all(isinstance(f, TestFlow) and callable(f.tester_factory) for f in flows.values())
    runner = conftest.TestRunner(flows["portable"], "test_x[portable]", "test_x")
    assert runner._subtest == 0 and runner._results == [] and runner._flow is flows["portable"]
    assert reporting.MAX_LOGGED_MODEL_OUTPUTS == 2  # why bundlerun writes the other outputs itself
    assert {"Test ID", "Test Case", "Subtest", "Flow", "Result", "Result Detail", "Delegated", "Output 0 Error Max",
            "Output 1 SNR", "Error"} <= set(reporting.CSV_FIELD_NAMES)
    # the seam: the Tester compares `self.stages[stage].run_artifact(inputs)` against its reference
    import inspect

    assert "run_artifact(inputs_to_run)" in inspect.getsource(Tester.run_method_and_compare_outputs)


@pytest.fixture(scope="module")
def qemu_run(tmp_path_factory):
    """portable + xnnpack flows, two operator tests, compare steps on the aarch64 portable runner."""
    root = tmp_path_factory.mktemp("suite-qemu")
    r = _pytest(root, "--pyargs", "executorch.backends.test.suite.operators", "-m", "flow_portable or flow_xnnpack",
                "-k", "test_add_f32_bcast_first or test_split_size_uneven", "--bundlerun-target", "qemu-user://aarch64",
                "--bundlerun-report", str(root / "out"), "--json-report", f"--json-report-file={root / 'r.json'}")
    return root, r


def test_portable_flow_runs_on_qemu_user_with_every_output(qemu_run):
    root, r = qemu_run
    subs = _subtests(root / "r.json")
    assert "test_add_f32_bcast_first[portable]" in subs, r.stdout[-3000:]
    alpha = subs["test_add_f32_bcast_first[portable]"]
    assert alpha["Result"] == "Pass" and alpha["_outcome"] == "passed"
    assert alpha["bundlerun Target"] == "qemu-user://aarch64" and alpha["bundlerun Verdict"] == "PASS"
    assert alpha["bundlerun Criteria"].startswith("out0: atol 0.001 rtol 0.001")  # the registry's portable numbers
    # split returns 3 tensors: the suite's JSON has 3 outputs, and bundlerun judged all 3 on the device
    split = subs["test_split_size_uneven[portable]"]
    assert split["Output 2 SNR"] and split["bundlerun Verdict"] == "PASS"
    report = json.loads(Path(split["bundlerun Report"]).read_text())
    assert report["target"]["url"] == "qemu-user://aarch64" and report["summary"]["outputs"] == 3
    assert report["bundle"]["model"] == "test_split_size_uneven[portable]"
    # the device ran it: the runner's log is in the report folder
    log = Path(split["bundlerun Report"]).parent / "work" / "qemu-user" / "forward-served" / "case-0.log"
    assert "SERVER MODE DONE" in log.read_text()  # executor_runner's line after it wrote the case's outputs
    rows = list(csv.DictReader((root / "out" / "master" / "suite.csv").open()))
    header = list(rows[0])
    assert header[:6] == ["Test ID", "Test Case", "Subtest", "Flow", "Params", "Result"]
    assert header.index("Output 2 Error Max") < header.index("Error") < header.index("bundlerun Verdict")
    by_id = {(row["Test ID"], row["Subtest"]): row for row in rows}
    assert by_id[("test_split_size_uneven[portable]", "0")]["Output 2 SNR"] == split["Output 2 SNR"]


def test_xnnpack_flow_on_qemu_user(qemu_run):
    """The suite's XNNPACK lowering judged on the aarch64 runner's real XNNPACK delegate (the runner
    scripts/setup.sh builds). A test XNNPACK does not delegate is not run at all, as in the suite."""
    from bundlerun.targets.qemu_user import cached_runner

    root, r = qemu_run
    subs = _subtests(root / "r.json")
    xnn = subs["test_add_f32_bcast_first[xnnpack]"]
    assert xnn["Delegated"] == "True" and xnn["bundlerun Target"] == "qemu-user://aarch64"  # lowered by the suite
    runner = cached_runner("aarch64") or {}
    assert "xnnpack" in (runner.get("backends") or []), f"the cached aarch64 runner has no XNNPACK: {runner}"
    assert xnn["Result"] == "Pass" and xnn["bundlerun Verdict"] in ("PASS", "FAIL"), xnn
    assert xnn["bundlerun Backend"] == "xnnpack"
    split = subs["test_split_size_uneven[xnnpack]"]
    assert split["Result"] == "Pass" and split["Delegated"] == "False" and "bundlerun Verdict" not in split


def test_arm_tosa_int_flow_on_the_tosa_reference_model(tmp_path):
    r = _pytest(tmp_path, "--pyargs", "executorch.backends.test.suite.operators", "-m", "flow_arm_tosa_int or flow_xnnpack",
                "-k", "test_add_f32_bcast_first", "--bundlerun-target", "tosa://int", "--json-report",
                f"--json-report-file={tmp_path / 'r.json'}", "--bundlerun-report", str(tmp_path / "out"))
    subs = _subtests(tmp_path / "r.json")
    sub = subs["test_add_f32_bcast_first[arm_tosa_int]"]
    assert sub["bundlerun Target"] == "tosa://int", r.stdout[-3000:]
    assert sub["bundlerun Backend"] == "arm" and sub["bundlerun Dtype"] == "int8"
    assert sub["bundlerun Reference"] == "quantized"  # the suite's reference: the Quantize stage
    assert sub["bundlerun Verdict"] in ("PASS", "FAIL") and sub["Result"] == "Pass", sub
    report = json.loads(Path(sub["bundlerun Report"]).read_text())
    crit = report["cases"][0]["outputs"][0]["criteria"]
    assert crit["qtol"] == 1 and crit["scale"] and crit["scale"] > 0  # one step of the output's scale
    assert report["target"]["url"] == "tosa://int" and report["target"]["info"]["delegate_count"] >= 1
    # the XNNPACK flow's program on the TOSA reference model: a run failure with its kind, never a verdict
    xnn = subs["test_add_f32_bcast_first[xnnpack]"]
    assert xnn["Result Detail"] == "PTE Run Failed" and xnn["bundlerun Failure Kind"] == "missing-backend"
    assert xnn["_outcome"] == "failed" and "XnnpackBackend" in xnn["Error"]


def test_a_test_that_fails_before_the_device_is_recorded_as_the_suite_records_it(tmp_path):
    """The suite's own fixture and hooks (its conftest, re-exported) on a model whose program
    cannot be made (a custom op without an out variant): the suite's Fail / Unknown Failure,
    with no device run and no bundlerun verdict."""
    (tmp_path / "conftest.py").write_text("from executorch.backends.test.suite.conftest import *  # noqa\n")
    (tmp_path / "test_custom.py").write_text(
        "import torch\n"
        "@torch.library.custom_op('bundlerun_test::twice', mutates_args=())\n"
        "def twice(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x * 2\n"
        "@twice.register_fake\n"
        "def _(x):\n"
        "    return torch.empty_like(x)\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return twice(x) + 1\n"
        "class Plain(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.tanh(x) * 3, x - 1\n"
        "def test_custom(test_runner):\n"
        "    test_runner.lower_and_run_model(Plain(), (torch.randn(3, 4),))\n"
        "    test_runner.lower_and_run_model(M(), (torch.randn(3, 4),))\n"
        "def test_later(test_runner):\n"
        "    test_runner.lower_and_run_model(Plain(), (torch.randn(2, 2),))\n")
    r = _pytest(tmp_path, "test_custom.py", "-m", "flow_portable", "--bundlerun-target", "host://portable",
                "--json-report", f"--json-report-file={tmp_path / 'r.json'}", "--bundlerun-report", str(tmp_path / "out"))
    subs = _subtests(tmp_path / "r.json")
    first, second = subs["test_custom[portable]"], subs["test_custom[portable]#1"]
    assert first["Result"] == "Pass" and first["bundlerun Verdict"] == "PASS", r.stdout[-3000:]
    assert second["Result"] == "Fail" and second["Result Detail"] == "Unknown Failure"
    assert "Missing out variants" in second["Error"]
    assert "bundlerun Verdict" not in second  # it never reached the device
    assert not (tmp_path / "out" / "master" / "test_custom_portable" / "sub1").exists()
    rows = list(csv.DictReader((tmp_path / "out" / "master" / "suite.csv").open()))
    assert [(row["Subtest"], row["Result"], row["bundlerun Verdict"]) for row in rows] == [
        ("0", "Pass", "PASS"), ("1", "Fail", ""), ("0", "Pass", "PASS")]
    # one warm runtime for the whole session: the later test's run reused the first test's worker
    later = json.loads(Path(subs["test_later[portable]"]["bundlerun Report"]).read_text())
    assert later["target"]["info"]["worker"] == "warm, reused"
