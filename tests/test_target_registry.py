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
    assert report.summary.verdict == "PASS"
    report = execute_run(RunRequest(bundle_path=mlp_fp32, target="echo://here?scale=2", report_dir=tmp_path / "b"))
    assert report.summary.verdict == "FAIL"
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


def test_default_backend_follows_the_dtype_where_the_target_says():
    """qemu-user://aarch64: fp32 stays on the portable kernels, int8 takes XNNPACK (the delegate its runner links,
    what XNNPACKQuantizer's PTQ is made for); a wrapper asks its inner URL with the dtype; --backend still wins."""
    from bundlerun.runner.cli import resolve_backend_dtype

    assert targets.default_backend("qemu-user://aarch64") == "portable"
    assert targets.default_backend("qemu-user://aarch64", "fp32") == "portable"
    assert targets.default_backend("qemu-user://aarch64", "int8") == "xnnpack"
    assert targets.default_backend("ssh://lab/qemu-user://aarch64", "int8") == "xnnpack"
    assert targets.default_backend("ssh://lab/qemu-user://aarch64") == "portable"
    assert targets.default_backend("host://portable", "int8") == "portable"  # the URL names its backend
    assert resolve_backend_dtype("qemu-user://aarch64", None, "int8") == ("xnnpack", "int8")
    assert resolve_backend_dtype("qemu-user://aarch64", None, None) == ("portable", "fp32")
    assert resolve_backend_dtype("qemu-user://aarch64", "portable", "int8") == ("portable", "int8")


def test_a_plugin_target_gets_debug_farm_repeat_and_perf_from_its_declarations(bundle_cache, tmp_path):
    """tests/fixtures/echo_target.py declares capture, device_key, repeat and its elapsed clock in its
    own SPEC; nothing else in bundlerun names echo://, and each capability works through the CLI."""
    from bundlerun.bundles.builder import BuildRequest, build_bundle

    bundle = build_bundle(BuildRequest(model="mlp", output=tmp_path / "mlp.bpte", backend="portable", dtype="fp32",
                                       cases=2, target="host://portable", target_info={}, etrecord=True, cache=False)).path
    # debug: the target's capture runs (one row per output of the echo, in its own words)
    proc = _cli("debug", str(bundle), "--target", "echo://here", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    debug = json.loads(proc.stdout)
    assert debug["granularity"] == "every output of the echo (test fixture)" and len(debug["rows"]) == 1
    # farm: the device the target declares is what the farm locks
    plan = tmp_path / "plan.toml"
    plan.write_text(f'bundles = ["{bundle}"]\ntargets = ["echo://here?device=bench-7", "echo://cpu"]\n')
    proc = _cli("farm", str(plan), "--dry-run", "--json", "--report", str(tmp_path / "farm"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    resources = {job["group"]: job["resources"] for job in json.loads(proc.stdout)["jobs"]}
    assert resources == {"echo://here?device=bench-7": ["echo:bench-7"], "echo://cpu": []}  # no device: a CPU job
    # --repeat reaches a target that declares it, and its perf clock labels elapsed_s
    proc = _cli("run", str(bundle), "--target", "echo://here", "--repeat", "3", "--report", str(tmp_path / "r"),
                "--no-history")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["perf"]["repeat"] == 3 and "notes" not in report["perf"]
    figures = {f["name"]: f for f in report["cases"][0]["perf"]}
    assert figures["echo_latency"]["samples"] == [1e-6, 2e-6, 3e-6]
    assert figures["echo_time"]["kind"] == "host-wall" and "echo fixture" in figures["echo_time"]["source"]
    # and a target that does not declare repeat is not asked: the report says so, naming those that can
    env = {**ENV, "BUNDLERUN_TARGETS": "tests.fixtures.echo_target,tests.fixtures.sim_device"}
    proc = _cli("run", str(bundle), "--target", "sim://emu-1?sleep=0", "--repeat", "2", "--report",
                str(tmp_path / "s"), "--no-history", env=env)
    perf = json.loads((tmp_path / "s" / "report.json").read_text())["perf"]
    assert proc.returncode == 0 and perf["repeat"] == 1 and "echo://" in perf["notes"][0], proc.stderr[-2000:]


def test_builtin_scheme_table_matches_each_modules_declaration():
    from bundlerun.targets import BUILTIN_SCHEMES, BUILTIN_TARGETS, _module_spec

    derived: dict[str, str] = {}
    for name in BUILTIN_TARGETS:
        for scheme in _module_spec(name).schemes:
            derived.setdefault(scheme, name)
    assert BUILTIN_SCHEMES == derived


def test_builtin_scheme_resolves_from_its_own_module_alone(echo_registered):
    # a fresh process: the URL of a run names one builtin target; neither the other builtin target
    # modules nor the entry-point scan of every installed distribution is loaded for it
    code = ("import sys; from bundlerun import targets; c = targets.parse_target_url('qemu-user://aarch64?cpu=max'); "
            "print(c.declared.module, c.settings['cpu']); "
            "print(sorted(m for m in targets.BUILTIN_TARGETS if m in sys.modules)); "
            "print('importlib.metadata' in sys.modules); "
            "print(targets.target_specs()['qemu-user'] is c.declared, 'echo' in targets.target_specs())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=ROOT,
                         timeout=300).stdout.splitlines()
    assert out == ["bundlerun.targets.qemu_user max", "['bundlerun.targets.qemu_user']", "False", "True True"]
    # a scheme no builtin declares still reaches the registered modules, and a typo their did-you-mean
    assert targets.parse_target_url("echo://here").declared.module == "tests.fixtures.echo_target"
    with pytest.raises(TargetError, match="did you mean 'echo'"):
        targets.parse_target_url("ehco://here")
