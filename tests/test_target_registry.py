"""Self-describing targets: declarations drive --help, URL parsing, doctor, default backend.

Uses tests/fixtures/echo_target.py, a target module registered only through the
environment: no edit anywhere else makes it appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bundlerun import targets
from bundlerun.bundles.errors import ConfigError, TargetError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "BUNDLERUN_TARGETS": "tests.fixtures.echo_target", "PYTHONPATH": str(ROOT)}


def _cli(*args: str, env=ENV) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.fixture
def echo_registered(monkeypatch):
    monkeypatch.setenv("BUNDLERUN_TARGETS", "tests.fixtures.echo_target")
    targets.reset_registry()
    yield
    targets.reset_registry()


def test_fixture_target_appears_in_help_and_doctor():
    help_text = _cli("--help").stdout
    assert "echo://here" in help_text and "answers every case" in help_text
    doctor = json.loads(_cli("doctor", "--json").stdout)
    assert {"target": "echo", "component": "echo-device", "ok": True, "detail": "always here", "where": ""} in doctor["checks"]
    assert doctor["targets"]["echo"] == {"ready": True, "missing": []}
    # without the registration it is simply not there
    plain = {k: v for k, v in ENV.items() if k != "BUNDLERUN_TARGETS"}
    assert "echo://" not in _cli("--help", env=plain).stdout


def test_fixture_target_parses_runs_and_is_strict(echo_registered, bundle_cache, tmp_path):
    from bundlerun.runner.session import RunRequest, execute_run

    assert targets.default_backend("echo://here") == "portable"
    mlp_fp32 = bundle_cache("mlp", backend="portable", cases=2, target="host://portable")
    report = execute_run(RunRequest(bundle_path=mlp_fp32, target="echo://here", report_dir=tmp_path / "a"))
    assert report["summary"]["verdict"] == "PASS"
    report = execute_run(RunRequest(bundle_path=mlp_fp32, target="echo://here?scale=2", report_dir=tmp_path / "b"))
    assert report["summary"]["verdict"] == "FAIL"
    with pytest.raises(ConfigError, match="did you mean 'scale'"):
        targets.open_target("echo://here?scael=2")
    with pytest.raises(TargetError, match="did you mean 'echo'"):
        targets.parse_target_url("ehco://here")


@pytest.mark.parametrize("url,config,needle", [
    ("fvp://corstone-300/ethos-u55-128", {"runner_efl": "x"}, "did you mean 'runner_elf'"),
    ("fvp://corstone-300/ethos-u55-128", {"corstone-300/ethos-u55-128": {"timelimt": 5}}, "did you mean 'timelimit'"),
    ("serial:///dev/ttyACM0", {"baudrat": 9600}, "did you mean 'baudrate'"),
    ("host://xnnpack", {"thread": 2}, "did you mean 'threads'"),
    ("tosa://int", {"anything": 1}, "unknown setting 'anything'"),
    ("adb://X", {"runer": "x"}, "did you mean 'runner'"),
])
def test_unknown_target_options_are_errors(url, config, needle):
    with pytest.raises(ConfigError, match=needle):
        targets.open_target(url, config)


def test_default_backends_are_declared():
    assert targets.default_backend("host://portable") == "portable"
    assert targets.default_backend("host://xnnpack") == "xnnpack"
    assert targets.default_backend("tosa://int") == "arm"
    assert targets.default_backend("fvp://corstone-300/cortex-m55") == "cortex-m"
    assert targets.default_backend("fvp://corstone-300/ethos-u55-128") == "arm"
