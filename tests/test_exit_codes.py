"""Every command's process exit code is the verdict it prints (0 PASS, 1 FAIL, 2 ERROR).

CI lanes branch on `$?`, so each command runs here as a real process and its return code is
checked against the verdict line it printed (`judge` once printed "exit code 1" and returned 0).
The runs use the real runtime (host://portable); ERROR comes from a real crash of the runtime
worker (`BUNDLERUN_FAULT=crash@forward:0`, a switch of the real host worker). Interrupts
(130 Ctrl-C, 143 SIGTERM) are checked in tests/test_interrupt.py and tests/test_sigterm.py.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import run_cli

VERDICT_LINE = re.compile(r"^(PASS|FAIL|ERROR) \(.*\) in [0-9.]+ s — exit code (\d+)$", re.M)
CODE = {"PASS": 0, "FAIL": 1, "ERROR": 2}
STRICT = ("--override", "out0.atol=0", "--override", "out0.rtol=0")  # portable vs eager differs by ~1e-7


def _printed(proc) -> tuple[str, int]:
    found = VERDICT_LINE.findall(proc.stdout)
    assert found, f"no verdict line in:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    verdict, code = found[-1]
    return verdict, int(code)


def _check(proc, verdict: str) -> None:
    printed, code = _printed(proc)
    assert (printed, code, proc.returncode) == (verdict, CODE[verdict], CODE[verdict]), proc.stderr[-2000:]


@pytest.fixture(scope="module")
def runs(bundle_cache, tmp_path_factory):
    """One bundle, three saved runs: PASS, FAIL (strict override) and ERROR (a crashed case)."""
    bundle = bundle_cache("mlp", backend="portable", cases=3, target="host://portable")
    root = tmp_path_factory.mktemp("exit-codes")
    db = root / "history.sqlite"
    procs = {}
    for name, extra, env in (("pass", (), {}), ("fail", STRICT, {}),
                             ("error", (), {"BUNDLERUN_FAULT": "crash@forward:0"})):
        procs[name] = run_cli("run", str(bundle), "--target", "host://portable", "--report", str(root / name),
                              "--save-outputs", "--history", str(db), "--label", name, *extra, env=env)
    return bundle, root, db, procs


@pytest.mark.parametrize("name,verdict", [("pass", "PASS"), ("fail", "FAIL"), ("error", "ERROR")])
def test_run(runs, name, verdict):
    _check(runs[3][name], verdict)


@pytest.mark.parametrize("name,extra,verdict", [("pass", (), "PASS"), ("pass", STRICT, "FAIL"),
                                                ("error", (), "ERROR")])
def test_judge(runs, name, extra, verdict):
    _check(run_cli("judge", str(runs[1] / name), *extra), verdict)


@pytest.mark.parametrize("name,verdict", [("pass", "PASS"), ("fail", "FAIL"), ("error", "ERROR")])
def test_merge(runs, tmp_path, name, verdict):
    proc = run_cli("merge", str(runs[1] / name), "--report", str(tmp_path / "merged"))
    assert f"merged 1 report(s): {verdict}" in proc.stdout
    assert proc.returncode == CODE[verdict], proc.stderr[-2000:]
    assert json.loads((tmp_path / "merged" / "report.json").read_text())["summary"]["exit_code"] == CODE[verdict]


@pytest.mark.parametrize("current,code", [("pass", 0), ("fail", 1)])
def test_compare(runs, current, code):
    # "fail" was judged by other (strict) criteria: another series (runner/history/series.py), compared only when forced
    force = ("--force",) if current == "fail" else ()
    proc = run_cli("compare", "pass", current, "--history", str(runs[2]), *force)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("no regressions" in proc.stdout) == (code == 0)


def test_other_criteria_are_another_series_at_run_and_at_judge(runs, tmp_path):
    bundle, root, db, procs = runs
    proc = run_cli("compare", "pass", "fail", "--history", str(db))
    assert proc.returncode == 2 and "refusing to compare unrelated runs: different criteria" in proc.stderr, proc.stderr
    digest = {name: json.loads((root / name / "report.json").read_text())["bundle"]["criteria_sha256"]
              for name in ("pass", "fail")}
    assert digest["pass"] != digest["fail"]
    # the same strict override at `judge` re-judges into the strict series, never keeps the copied digest
    proc = run_cli("judge", str(root / "pass"), *STRICT, "--report", str(tmp_path / "strict"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert json.loads((tmp_path / "strict" / "report.json").read_text())["bundle"]["criteria_sha256"] == digest["fail"]


@pytest.mark.parametrize("extra,verdict", [((), "PASS"), (("--tolerance", "atol=0", "--tolerance", "rtol=0"), "FAIL")])
def test_validate(tmp_path, extra, verdict):
    proc = run_cli("validate", "mlp", "--target", "host://portable", "--cases", "2", "--report", str(tmp_path),
                   "--no-history", "--no-cache", *extra)
    _check(proc, verdict)
    assert re.search(rf"mlp-fp32 .*{verdict}", proc.stdout)


@pytest.mark.parametrize("fault,verdict", [("", "PASS"), ("crash@forward:0", "ERROR")])
def test_farm(runs, tmp_path, fault, verdict):
    plan = tmp_path / "plan.toml"
    plan.write_text(f'bundles = ["{runs[0]}"]\ntargets = ["host://portable"]\nretries = 0\n')
    proc = run_cli("farm", str(plan), "--report", str(tmp_path / "out"), "--no-history", "--json",
                   env={"BUNDLERUN_FAULT": fault} if fault else None)
    printed = json.loads(proc.stdout)
    assert (printed["summary"]["verdict"], printed["exit_code"], proc.returncode) == (verdict, CODE[verdict],
                                                                                       CODE[verdict]), proc.stderr[-2000:]


def test_an_error_before_anything_runs_exits_2(tmp_path):
    bad = tmp_path / "bad.bpte"
    bad.write_bytes(b"not a bundle")
    proc = run_cli("run", str(bad), "--report", str(tmp_path / "r"), "--no-history")
    assert proc.returncode == 2 and "internal error" not in proc.stderr and proc.stderr.strip().count("\n") == 0
