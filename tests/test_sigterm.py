"""SIGTERM ends a command the way Ctrl-C does (CI systems cancel jobs with SIGTERM, then SIGKILL).

Real SIGTERMs to real `bundlerun run`, `validate` and `farm` processes (local pool and a Ray
started by the command), each running the real runtime (host://portable) with a case that hangs
(`BUNDLERUN_FAULT=hang@...`, a switch of the real host worker): finished cases keep their
verdicts, the report is written and marked interrupted, the exit code is 143 (128 + SIGTERM),
and no process the command started is left: every process of the test carries a tag in its
environment (tests/proc_helpers.py), so the check sees only what this test started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc_helpers import TAG_VAR, new_tag, settled, tagged

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()"]


def _start(args: list[str], tag: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled",
                                 "RAY_USAGE_STATS_ENABLED": "0", TAG_VAR: tag, **env})


def _wait_for_hang(proc: subprocess.Popen, logs: Path, pattern: str, where: str = "forward:2") -> None:
    """Until the runtime worker says it hangs before `where` (the cases before it are finished)."""
    deadline = time.monotonic() + 600
    while not any(f"hanging before {where}" in p.read_text(errors="replace") for p in logs.glob(pattern)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the runtime never reached the hanging case"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def mlp(bundle_cache) -> Path:
    return bundle_cache("mlp", backend="portable", cases=4, target="host://portable")


@pytest.mark.parametrize("command", ["run", "validate"])
def test_sigterm_keeps_finished_cases_writes_the_report_and_exits_143(command, mlp, tmp_path):
    tag = new_tag()
    if command == "run":
        args, report_dir = ["run", str(mlp), "--target", "host://portable", "--report", str(tmp_path)], tmp_path
    else:
        args = ["validate", "mlp", "tiny-cnn", "--target", "host://portable", "--cases", "4", "--report", str(tmp_path)]
        report_dir = tmp_path / "mlp-fp32"
    proc = _start([*args, "--no-history", "--timeout", "300"], tag, BUNDLERUN_FAULT="hang@forward:2")
    _wait_for_hang(proc, report_dir / "work", "host-runtime-*.log")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    assert "terminated (SIGTERM)" in err
    report = json.loads((report_dir / "report.json").read_text())
    assert report["summary"]["interrupted"] is True and report["summary"]["exit_code"] == 143
    assert [c["verdict"] for c in report["cases"][:2]] == ["PASS", "PASS"]
    assert {c["error_kind"] for c in report["cases"][2:]} == {"interrupted"}
    assert any("terminated (SIGTERM)" in w for w in report["warnings"])
    if command == "validate":
        assert not (tmp_path / "tiny-cnn-fp32").exists()  # the command stopped: the next model never started
    assert settled(lambda: tagged(tag, b"")) == []


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_sigterm_to_a_farm_writes_the_merged_report_and_leaves_nothing_running(executor, mlp, tmp_path):
    """The farm's pool workers (local) or Ray's processes (a Ray this command started) and their
    runtime workers are all gone; the attempt that was running is `interrupted`."""
    tag = new_tag()
    plan = tmp_path / "plan.toml"
    plan.write_text(f'bundles = ["{mlp}"]\ntargets = ["host://portable"]\n')
    out_dir = tmp_path / "out"
    proc = _start(["farm", str(plan), "--report", str(out_dir), "--no-history", "--executor", executor], tag,
                  BUNDLERUN_FAULT="hang@forward:2")
    deadline = time.monotonic() + 600
    while not _a_worker_hangs(tag, "forward:2"):  # (a Ray task runs in a scratch folder of its own)
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the farm's job never reached the hanging case"
        time.sleep(0.3)
    assert len(tagged(tag, b"bundlerun.targets.workers.host")) >= 1  # the runtime worker is running now
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, out[-2000:] + err[-3000:]
    report = json.loads((out_dir / "report.json").read_text())
    assert report["summary"]["interrupted"] is True and report["summary"]["exit_code"] == 143
    assert {c["verdict"] for c in report["cases"]} <= {"PASS", "ERROR"}
    assert "interrupted" in {c["error_kind"] for c in report["cases"]}
    assert settled(lambda: tagged(tag, b""), 60.0) == []


def _a_worker_hangs(tag: str, where: str) -> bool:
    """A runtime worker of this test has said it hangs before `where` (its stderr is its log)."""
    for pid in tagged(tag, b"bundlerun.targets.workers.host"):
        try:
            if f"hanging before {where}" in Path(os.readlink(f"/proc/{pid}/fd/2")).read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False
