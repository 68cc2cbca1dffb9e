"""GitHub Actions: workflow-command escaping, annotations for failing outputs and
infrastructure errors, and the step summary, on real runs of the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bundlerun.bundles.bpte import read_bundle, write_bundle
from bundlerun.runner.report.model import CaseRecord, Report, Summary
from bundlerun.runner.writers import github

BUNDLERUN = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()"]


def _cli(*args, env=None, cwd=None):
    return subprocess.run([*BUNDLERUN, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_escaping_follows_the_workflow_command_rules():
    assert github.escape_data("50%\r\nnext") == "50%25%0D%0Anext"
    assert github.escape_property("a,b:c%\n") == "a%2Cb%3Ac%25%0A"
    line = github.command("error", "bad\n::warning::injected", file="x,y.bpte", title="t:1")
    assert line == "::error file=x%2Cy.bpte,title=t%3A1::bad%0A::warning::injected"
    assert "\n" not in line  # a message cannot start a second command on a new line
    assert github.command("warning", "m") == "::warning::m"


def _report(cases, regressions=None):
    """A typed Report of these case records (only what the annotations read is filled in)."""
    return Report(summary=Summary("FAIL", 1, {}, len(cases), 0), cases=[CaseRecord.from_json(c) for c in cases],
                  bundle={"model": "mlp", "dtype": "fp32", "path": "/elsewhere/mlp.bpte"},
                  target={"url": "host://xnnpack"}, regressions=regressions or [])


def _fail_case(i):
    return {"method": "forward", "case": i, "status": "ok", "verdict": "FAIL", "outputs": [
        {"index": 0, "name": "out0", "verdict": "FAIL", "stats": {"worst_index": [0, 3]},
         "failed": [{"criterion": "elementwise", "measured": 0.5, "limit": 0.002}]}]}


def test_annotations_for_fail_error_and_regression(monkeypatch, tmp_path):
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    cases = [_fail_case(0),
             {"method": "forward", "case": 1, "status": "ok", "verdict": "PASS",
              "outputs": [{"index": 0, "name": "out0", "verdict": "PASS"}]},
             {"method": "forward", "case": 2, "status": "timeout", "verdict": "TIMEOUT", "outputs": [],
              "error_kind": "host-timeout", "error": "case took longer than 5 s"}]
    lines = github.annotations(_report(cases, [{"rule": "sqnr-drop", "message": "SQNR 40 -> 20 dB"}]),
                               tmp_path / "out" / "report.json")
    assert lines == [
        "::error file=out/report.json,title=bundlerun FAIL%3A mlp-fp32 on host%3A//xnnpack forward[0].out0"
        "::elementwise: measured 0.5 limit 0.002 (worst element [0, 3])",
        "::error file=out/report.json,title=bundlerun regression (sqnr-drop)%3A mlp-fp32 on host%3A//xnnpack"
        "::SQNR 40 -> 20 dB",
        "::warning file=out/report.json,title=bundlerun TIMEOUT (host-timeout)%3A mlp-fp32 on host%3A//xnnpack "
        "forward[2]::case took longer than 5 s",
    ]


def test_annotations_are_capped_per_level():
    lines = github.annotations(_report([_fail_case(i) for i in range(25)]), "r.json", limit=10)
    assert len(lines) == 10 and all(line.startswith("::error ") for line in lines)
    assert "16 more failing outputs" in lines[-1] and "25 failing outputs" in lines[-1]


def test_nothing_printed_outside_github_actions(tmp_path):
    import io

    buf = io.StringIO()
    assert github.annotate(_report([_fail_case(0)]), "r.json", stream=buf, env={}) == 0
    assert github.annotate(_report([_fail_case(0)]), "r.json", stream=buf, env={"GITHUB_ACTIONS": "true"}) == 1
    assert buf.getvalue().startswith("::error ")
    assert github.append_step_summary("x", env={}) is False
    summary = tmp_path / "summary.md"
    assert github.append_step_summary("## hi", env={"GITHUB_STEP_SUMMARY": str(summary)}) is True
    assert summary.read_text() == "## hi\n\n"


@pytest.fixture(scope="module")
def failing_bundle(bundle_cache, tmp_path_factory):
    bundle = read_bundle(bundle_cache("mlp", cases=3))
    values = bundle.suite("forward").test_cases[1].expected_outputs[0].to_array().copy()
    values[0, 2] += 0.5
    bundle.suite("forward").test_cases[1].expected_outputs[0].data = values.tobytes()
    return write_bundle(bundle, tmp_path_factory.mktemp("gh") / "bad,name.bpte")


def test_run_under_github_actions_annotates_and_writes_the_step_summary(failing_bundle, tmp_path):
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_WORKSPACE": str(tmp_path)}
    r = _cli("run", str(failing_bundle), "--report", str(tmp_path / "rep"), "--no-history", "--quiet", env=env)
    assert r.returncode == 1, r.stderr[-2000:]  # exit codes keep their meaning
    errors = [line for line in r.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 1, r.stdout
    assert errors[0].startswith("::error file=rep/report.json,title=bundlerun FAIL%3A mlp-fp32 on host%3A//xnnpack "
                                "forward[1].out0::elementwise: measured")
    assert "(worst element [0, 2])" in errors[0]
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "bundlerun: mlp on host://xnnpack: **FAIL**" in text
    # --json keeps stdout pure JSON: the annotations go to stderr
    r = _cli("run", str(failing_bundle), "--report", str(tmp_path / "rep2"), "--no-history", "--json", env=env)
    assert json.loads(r.stdout)["summary"]["exit_code"] == 1 and "::error file=rep2/report.json" in r.stderr
    # outside GitHub Actions: no workflow commands at all
    r = _cli("run", str(failing_bundle), "--report", str(tmp_path / "rep3"), "--no-history", "--quiet",
             env={"GITHUB_ACTIONS": "", "GITHUB_STEP_SUMMARY": ""})
    assert r.returncode == 1 and "::error" not in r.stdout + r.stderr


def test_infrastructure_error_is_a_warning_with_exit_2(failing_bundle, tmp_path):
    env = {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)}
    r = _cli("run", str(failing_bundle), "--target", "adb+tcp://127.0.0.1:9", "--setup-timeout", "5",
             "--report", str(tmp_path / "rep"), "--no-history", "--quiet", env=env)
    assert r.returncode == 2, r.stdout + r.stderr[-2000:]
    warnings = [line for line in r.stdout.splitlines() if line.startswith("::warning")]
    assert len(warnings) == 3 and not any(line.startswith("::error") for line in r.stdout.splitlines()), r.stdout
    assert "title=bundlerun ERROR (" in warnings[0] and "forward[0]::" in warnings[0]
