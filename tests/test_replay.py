"""`run/validate --replay N`: every case N times, distinct results, spread and verdict flips per output.

The non-deterministic device is a double (tests/fixtures/flaky_target.py, registered through
$BUNDLERUN_TARGETS, declaring `replay=True` in its own SPEC): nothing here gives different results
run to run. Its flip mode must come out as `flaky-numerics` in every report format and in the
history (exit code 1 although the first run passes); its jitter mode, run through the runner's
whole-run repetition (loop=false), as `nondeterministic-output` with a passing verdict. The real
runtimes (host://xnnpack, host://portable, tosa://int in one process; qnn://htp-sim and
vulkan://lavapipe by whole runs) must come out deterministic, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CMD = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()"]
DOUBLE_ENV = {"PYTHONPATH": str(ROOT), "BUNDLERUN_TARGETS": "tests.fixtures.flaky_target"}


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *map(str, args)], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "mlp.bpte"
    proc = _cli("build", "mlp", "--target", "host://portable", "--cases", "2", "-o", path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return path


def test_flaky_double_is_a_named_finding_everywhere(tmp_path, mlp_bundle):
    history = tmp_path / "history.sqlite"
    report_dir = tmp_path / "run"
    proc = _cli("run", mlp_bundle, "--target", "flaky://here?mode=flip", "--replay", "4", "--report", report_dir,
                "--history", history, env=DOUBLE_ENV)
    assert proc.returncode == 1, proc.stderr[-2000:] + proc.stdout[-2000:]  # a replay failed: exit 1
    report = json.loads((report_dir / "report.json").read_text())
    assert report["summary"]["verdict"] == "PASS"  # the first run passed ...
    section = report["replay"]
    assert section["mode"] == "in-process" and section["runs"] == 4
    assert section["verdict"] == "nondeterministic" and section["flaky"] == 2 and section["outputs"] == 2
    for case in report["cases"]:
        entry = case["outputs"][0]["replay"]
        assert entry["runs"] == 4 and entry["distinct"] == 3  # eps 0, 1e-6, 0.05, 0.05
        assert entry["verdicts"] == {"PASS": 2, "FAIL": 2} and entry["flips"] is True
        assert entry["finding"] == "flaky-numerics"
        assert entry["spread"] > 0.01  # 5 % of outputs of magnitude ~0.3
    # console, Markdown, HTML, JUnit, history
    assert "flaky numerics (verdict flips between runs)" in proc.stdout
    md = (report_dir / "summary.md").read_text()
    assert "Determinism replay: 4 runs per case" in md and "flaky-numerics" in md
    html = (report_dir / "report.html").read_text()
    assert "id='replay'" in html and "flaky-numerics" in html
    junit = ET.parse(report_dir / "junit.xml").getroot()
    suite = next(s for s in junit.iter("testsuite") if s.get("name", "").endswith("/replay"))
    failures = [f for f in suite.iter("failure")]
    assert len(failures) == 2 and {f.get("type") for f in failures} == {"flaky-numerics"}
    from bundlerun.runner.history.store import flaky_outputs

    run_id = report["run"]["history_id"]
    rows = flaky_outputs(history, run_id)
    assert [(r["case_index"], r["finding"], r["flips"], r["distinct_results"]) for r in rows] == \
        [(0, "flaky-numerics", 1, 3), (1, "flaky-numerics", 1, 3)]
    # the HUD tells flaky numerics apart from wrong ones: the flaky run's cell is marked, a stable run's not
    stable = _cli("run", mlp_bundle, "--target", "flaky://here?mode=stable", "--replay", "2", "--report",
                  tmp_path / "stable", "--history", history, "--label", "later", env=DOUBLE_ENV)
    assert stable.returncode == 0, stable.stdout[-2000:]
    from bundlerun.runner.pictures.hud import write_site

    _, grid = write_site(history, tmp_path / "site")
    cells = sorted((c for row in grid.rows for c in row.cells.values()), key=lambda c: c.run.id)
    assert [(c.run.id, c.extra.get("replay_findings"), c.extra.get("replay_flips")) for c in cells] == \
        [(run_id, 2, 2), (run_id + 1, 0, 0)]
    page = (tmp_path / "site" / "index.html").read_text()
    assert page.count("class='c PASS flaky'") + page.count("class='c PASS base flaky'") == 1
    assert "flaky numerics: 2 output(s) differed between --replay runs, 2 with a verdict that flipped" in page


def test_whole_run_replay_for_targets_without_a_loop(tmp_path, mlp_bundle):
    report_dir = tmp_path / "run"
    proc = _cli("run", mlp_bundle, "--target", "flaky://here?mode=jitter&loop=false", "--replay", "3", "--report",
                report_dir, "--no-history", env=DOUBLE_ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]  # every run passes: not flaky, but not deterministic
    report = json.loads((report_dir / "report.json").read_text())
    section = report["replay"]
    assert section["mode"] == "whole-run" and "repeated the whole run 2 more time(s)" in section["how"]
    assert section["nondeterministic"] == 2 and section["flaky"] == 0
    entry = report["cases"][0]["outputs"][0]["replay"]
    assert entry["distinct"] == 3 and entry["flips"] is False and entry["finding"] == "nondeterministic-output"
    assert 0 < entry["spread"] < 1e-5
    junit = ET.parse(report_dir / "junit.xml").getroot()
    assert {f.get("type") for f in junit.iter("failure")} == {"nondeterministic-output"}


def test_stable_double_is_deterministic(tmp_path, mlp_bundle):
    proc = _cli("run", mlp_bundle, "--target", "flaky://here?mode=stable", "--replay", "3", "--report", tmp_path / "r",
                "--no-history", env=DOUBLE_ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["replay"]["verdict"] == "deterministic" and not report["replay"]["findings"]
    assert "gave the same bytes in every run" in (tmp_path / "r" / "summary.md").read_text()


@pytest.mark.parametrize("target, backend, dtype, mode", [
    ("host://xnnpack", "xnnpack", "fp32", "in-process"),
    ("host://xnnpack", "xnnpack", "int8", "in-process"),
    ("host://portable", "portable", "fp32", "in-process"),
    ("tosa://int", "arm", "int8", "in-process"),
    ("qnn://htp-sim", "qnn", "fp16", "whole-run"),
    ("vulkan://lavapipe", "vulkan", "fp32", "whole-run"),
])
def test_real_runtimes_are_deterministic(tmp_path, target, backend, dtype, mode):
    bundle = tmp_path / "m.bpte"
    proc = _cli("build", "tiny-cnn", "--target", target, "--backend", backend, "--dtype", dtype, "--cases", "2",
                "-o", bundle)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _cli("run", bundle, "--target", target, "--replay", "3", "--report", tmp_path / "r", "--no-history")
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    section = report["replay"]
    assert section["mode"] == mode and section["outputs"] == 2
    assert section["verdict"] == "deterministic", section["findings"]
    for case in report["cases"]:
        entry = case["outputs"][0]["replay"]
        assert entry["runs"] == 3 and entry["distinct"] == 1 and entry["spread"] == 0.0
