"""`bundlerun tolerance explain` shows where each number comes from; `tolerance audit` scans the
pinned ExecuTorch tests (tests/et_src_fixture.py) and reports the registry's coverage."""

from __future__ import annotations

import json

from click.testing import CliRunner

from bundlerun.runner.commands.tolerance import command
from tests.et_src_fixture import executorch_src  # noqa: F401  (fixture)


def _explain(*args: str) -> str:
    result = CliRunner().invoke(command, ["explain", "--no-project", "--host-arch", "x86_64", *args], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.output


def test_explain_trail_ends_at_the_executorch_line():
    out = json.loads(_explain("--backend", "xnnpack", "--dtype", "int8", "--reference", "quantized", "--op", "conv1d",
                              "--scale", "0.05", "--json"))
    assert out["executorch_commit"] == "cff6f4dd32e630945b7188512c1f2b4f102b05ad"
    crit = out["criteria"]
    assert (crit["atol"], crit["rtol"], crit["qtol"]) == (0.04, 0.02, 0)
    assert crit["trail"]["rtol"][-1]["origin"].startswith("executorch@cff6f4dd:backends/xnnpack/test/ops/test_conv1d.py:147")
    assert crit["trail"]["qtol"][-1]["origin"] == "executorch@cff6f4dd:backends/test/harness/tester.py:323"
    table = _explain("--backend", "xnnpack", "--dtype", "int8", "--reference", "quantized", "--op", "conv1d", "--scale", "0.05")
    assert "backends/xnnpack/test/ops/test_conv1d.py:146" in table and "origins: ExecuTorch source at commit" in table


def test_explain_marks_bundleruns_own_numbers_and_the_rules():
    out = json.loads(_explain("--backend", "portable", "--dtype", "bf16", "--json"))
    assert out["criteria"]["trail"]["atol"][-1]["origin"].startswith("bundlerun: ")
    table = _explain("--backend", "cortex-m", "--target", "fvp://corstone-300/cortex-m55", "--dtype", "int8",
                     "--reference", "quantized", "--model", "mobilenet_v2", "--scale", "0.1")
    assert "top1" in table and "test_mobilenet_v2.py:86" in table
    off = _explain("--backend", "arm", "--target", "tosa://int", "--dtype", "int8", "--model", "mobilenet_v2")
    assert "no criterion is set" in off and "test_mobilenet_v2_arm.py:98" in off


def test_audit_reports_coverage_and_checks_every_citation(executorch_src):
    result = CliRunner().invoke(command, ["audit", "--executorch-src", str(executorch_src), "--no-project", "--json"])
    assert result.exit_code == 0, result.output[-2000:]
    out = json.loads(result.output)
    assert out["problems"] == [] and out["cited_values"] > 2000
    assert out["sites"] > 1500 and out["coverage"] > 0.75
    assert out["backends"]["cortex-m"]["held"] == out["backends"]["cortex-m"]["sites"]
    listed = CliRunner().invoke(command, ["audit", "--executorch-src", str(executorch_src), "--no-project", "--backend",
                                          "xnnpack", "--uncovered", "--no-check", "--json"])
    uncovered = json.loads(listed.output)["uncovered"]
    assert uncovered and all(u["backend"] == "xnnpack" for u in uncovered)
    # the quantizer's own numerics tests are no backend comparison the registry holds
    assert any(u["path"].endswith("test_pt2e_quantization.py") for u in uncovered)


def test_audit_refuses_a_folder_that_is_no_executorch_tree(tmp_path):
    result = CliRunner().invoke(command, ["audit", "--executorch-src", str(tmp_path), "--no-project"])
    assert result.exit_code != 0 and "not an ExecuTorch source tree" in str(result.exception or result.output)
