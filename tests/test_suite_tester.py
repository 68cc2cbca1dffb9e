"""The Tester on a target: a real Tester pipeline from the wheel (XNNPACK's Tester, the harness
Tester) lowers as usual; its compare step runs on a bundlerun target through
runner/suite/tester.py. No doubles: the real runtime (host://) and the real aarch64 runner
under qemu-aarch64 (qemu-user://)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from bundlerun.bundles.bpte import read_bundle
from bundlerun.runner.suite.tester import DeviceRunError, on_target


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(64, 48)

    def forward(self, x):
        return self.fc(x).relu(), x.sum(dim=1)


def _xnnpack_tester():
    from executorch.backends.xnnpack.test.tester import Tester

    torch.manual_seed(1)
    inputs = (torch.randn(4, 64),)
    return Tester(Linear(), inputs).export().to_edge_transform_and_lower().to_executorch().serialize(), inputs


def test_xnnpack_tester_compares_on_the_host_target(tmp_path):
    tester, inputs = _xnnpack_tester()
    with on_target(tester, "host://xnnpack", report_dir=tmp_path) as t:
        assert t is tester
        t.run_method_and_compare_outputs(inputs=inputs, atol=1e-3, rtol=1e-3)
    # the Tester's own method is back after the block
    assert "run_method_and_compare_outputs" not in tester.__dict__
    (record,) = tester.bundlerun_records
    assert record.verdict == "PASS" and record.target == "host://xnnpack"
    assert record.backend == "xnnpack" and record.dtype == "fp32" and record.reference == "eager-fp32"
    assert [o["name"] for o in record.outputs] == ["out0", "out1"]  # every output judged
    bundle = read_bundle(tmp_path / "bundle.bpte")
    crit = bundle.manifest_json["methods"]["forward"]["outputs"][0]["criteria"]
    # the registry's numbers for XNNPACK, with their trail (linear has an XNNPACK op rule)
    assert crit["atol"] == 1e-3 and "xnnpack" in crit["trail"]["atol"][-1]["source"]
    assert any("backends.xnnpack" in t["source"] for t in crit["trail"]["atol"])
    # the bundle holds the Tester's inputs and the eager reference, bit for bit
    case = bundle.suite("forward").test_cases[0]
    assert (case.inputs[0].to_array() == inputs[0].numpy()).all()
    eager = Linear()(inputs[0])
    assert (case.expected_outputs[0].to_array() == eager[0].detach().numpy()).all()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["target"]["url"] == "host://xnnpack" and report["summary"]["outputs"] == 2


def test_a_mismatch_is_the_testers_own_assertion(tmp_path):
    """atol=rtol=0: XNNPACK's float summation order differs from eager in the last bits; the
    Tester's own check fails, on the outputs the target computed, with its own message."""
    tester, inputs = _xnnpack_tester()
    with on_target(tester, "host://xnnpack", report_dir=tmp_path) as t:
        with pytest.raises(AssertionError, match="Output 0 does not match reference output"):
            t.run_method_and_compare_outputs(inputs=inputs, atol=0.0, rtol=0.0)
    assert tester.bundlerun_records[0].verdict == "PASS"  # within the registry's 1e-3: bundlerun passes it


def test_strict_fails_on_the_registry_numbers(tmp_path, monkeypatch):
    """A project override of atol 1e-12 (bundlerun.toml [tolerances.override]) makes the registry
    stricter than the Tester's call: with strict the compare step fails with bundlerun's message."""
    (tmp_path / "bundlerun.toml").write_text("[tolerances.override]\natol = 1e-12\nrtol = 0.0\n")
    monkeypatch.chdir(tmp_path)
    tester, inputs = _xnnpack_tester()
    with on_target(tester, "host://xnnpack", report_dir=tmp_path / "r", strict=True) as t:
        with pytest.raises(AssertionError, match=r"bundlerun FAIL on host://xnnpack \(registry: out0: atol 1e-12"):
            t.run_method_and_compare_outputs(inputs=inputs, atol=1e-3, rtol=1e-3)
    assert tester.bundlerun_records[0].verdict == "FAIL"


def test_harness_tester_on_qemu_user_and_a_missing_backend(tmp_path):
    """The harness Tester (portable, no delegate) on the aarch64 runner under qemu-aarch64; then an
    XNNPACK program on the TOSA reference model, which has no XNNPACK: the run failure names its kind."""
    from executorch.backends.test.harness import Tester

    class AddMul(torch.nn.Module):
        def forward(self, x, y):
            return x + y, x * y

    inputs = (torch.randn(3, 5), torch.randn(3, 5))
    tester = Tester(AddMul(), inputs).export().to_edge_transform_and_lower().to_executorch().serialize()
    with on_target(tester, "qemu-user://aarch64", report_dir=tmp_path / "portable") as t:
        t.run_method_and_compare_outputs(inputs=inputs)
    record = tester.bundlerun_records[0]
    assert record.verdict == "PASS" and record.backend == "portable", record.message
    assert len(record.outputs) == 2
    # the emulated runner served the case: its log for that case is in the work folder
    assert "SERVER MODE DONE" in (tmp_path / "portable" / "work" / "qemu-user" / "forward-served" / "case-0.log").read_text()
    xnn, xin = _xnnpack_tester()
    with on_target(xnn, "tosa://int", report_dir=tmp_path / "xnn") as t:
        with pytest.raises(DeviceRunError, match=r"missing-backend.*XnnpackBackend") as err:
            t.run_method_and_compare_outputs(inputs=xin)
    assert err.value.kind == "missing-backend" and xnn.bundlerun_records[0].verdict == "ERROR"


def test_fixture_uses_the_leased_target(tmp_path):
    (tmp_path / "test_t.py").write_text(
        "import torch\n"
        "from executorch.backends.xnnpack.test.tester import Tester\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.sigmoid(x) * 2\n"
        "def test_one(bundlerun_tester):\n"
        "    t = Tester(M(), (torch.randn(2, 8),)).export().to_edge_transform_and_lower().to_executorch().serialize()\n"
        "    bundlerun_tester(t).run_method_and_compare_outputs()\n"
        "    rec = t.bundlerun_records[0]\n"
        "    assert rec.verdict == 'PASS' and rec.target == 'host://xnnpack', rec.message\n")
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        env.pop(key, None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "bundlerun.runner.pytest_plugin", "-p", "no:cacheprovider",
                        "-q", "--bundlerun-target", "host://xnnpack", "--bundlerun-report", str(tmp_path / "out")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:]
    assert (tmp_path / "out" / "master" / "test_one" / "report.json").is_file()
