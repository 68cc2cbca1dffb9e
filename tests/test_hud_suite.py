"""The HUD at the backend test suite's scale, fed the way a CI feeds it: 30 nightly
pytest-json-report files of the suite (500 subtests each, the suite's own metadata format:
suite/conftest.py pytest_json_runtest_metadata) imported with `history import --commit SHA`,
in shuffled order, for the commits of a real git repository made here (their committer dates
order the columns). Then the site in real headless Chromium (tests/browser.py), and a look at
runs labelled by commit automatically (git, CI variables) and unlabelled runs in day buckets.

The reports are generated (no suite run: 15,000 results), with planted regressions: conv2d on
the xnnpack flow loses 40 dB of SNR from commit 20 on, gelu on portable fails from commit 25 on,
relu on xnnpack blips at commit 10 only; commit 5 is imported twice (abs on portable at 25 dB
the first time, as usual the second: the cell shows the latest and names the worst).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from browser import check_page
from bundlerun.runner.history import commits
from bundlerun.runner.history import store as history
from bundlerun.runner.pictures import hud
from bundlerun.runner.report.model import Report
from bundlerun.runner.suite.importer import _operator_names, import_suite_report
from report_samples import make_bundle, make_report, target_run

FLOWS = ["xnnpack", "portable", "xnnpack_static_int8_per_tensor", "arm_tosa_int"]
COMMITS = 30
ROWS = 500
T0 = dt.datetime(2026, 10, 1, tzinfo=dt.timezone.utc)


def _git(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, list[str]]:
    """A git repository with 30 commits, one a day (committer dates set)."""
    if shutil.which("git") is None:
        pytest.fail("git is needed (apt-get install git)")
    root = tmp_path_factory.mktemp("repo")
    _git(root, "init", "-q")
    shas = []
    for i in range(COMMITS):
        when = (T0 + dt.timedelta(days=i)).isoformat()
        env = {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
        _git(root, "commit", "-q", "--allow-empty", "-m", f"c{i}", env=env)
        shas.append(_git(root, "rev-parse", "HEAD"))
    return root, shas


def _suite_report(i: int, ops: list[str], abs_snr: float | None = None) -> dict:
    tests = []
    for flow in FLOWS:
        for op in ops:
            for v in range(2):
                if len(tests) >= ROWS:
                    break
                tid = f"test_{op}_case{v}[{flow}]"
                snr, result, detail = 60.0 + sum(map(ord, tid)) % 7, "Pass", ""
                if op == "conv2d" and flow == "xnnpack" and i >= 20:
                    snr = 20.0
                if op == "relu" and flow == "xnnpack" and i == 10:
                    snr = 30.0
                if op == "gelu" and flow == "portable" and i >= 25:
                    result, detail = "Fail", "Output Mismatch"
                if op == "abs" and flow == "portable" and abs_snr is not None:
                    snr = abs_snr
                sub = {"Test ID": tid, "Test Case": f"test_{op}_case{v}", "Subtest": 0, "Flow": flow, "Result": result,
                       "Result Detail": detail, "Error": "" if result == "Pass" else "Output 0 does not match",
                       "Delegated": "True", "Lower Time (s)": "0.100",
                       "Output 0 Error Max": "0.001", "Output 0 Error MAE": "0.000", "Output 0 SNR": f"{snr:.3f}",
                       "Output 1 Error Max": "0.002", "Output 1 Error MAE": "0.001", "Output 1 SNR": "55.000"}
                tests.append({"nodeid": f"operators/test_{op}.py::{tid}", "outcome": "passed" if result == "Pass" else
                              "failed", "metadata": {"subtests": [sub]}, "call": {"duration": 0.4}})
    created = (T0 + dt.timedelta(days=i, hours=5)).timestamp()
    return {"created": created, "duration": 100.0, "exitcode": 0, "root": "/x", "environment": {}, "tests": tests}


@pytest.fixture(scope="module")
def suite_db(repo, tmp_path_factory):
    root, shas = repo
    folder = tmp_path_factory.mktemp("hud-suite")
    db = folder / "history.sqlite"
    ops = sorted(_operator_names())
    assert len(ops) * 2 * len(FLOWS) >= ROWS and "conv2d" in ops and "gelu" in ops
    order = list(range(COMMITS))
    random.Random(7).shuffle(order)  # imported out of order: the columns must still be in commit order
    cwd = os.getcwd()
    os.chdir(root)  # the commits' dates come from this repository
    try:
        for i in order:
            path = folder / f"nightly-{i}.json"
            path.write_text(json.dumps(_suite_report(i, ops, abs_snr=25.0 if i == 5 else None)))
            summary = import_suite_report(db, path, commit=shas[i])
            assert summary.recorded == ROWS and summary.commit == shas[i]
        again = folder / "nightly-5-rerun.json"
        again.write_text(json.dumps(_suite_report(5, ops)))
        import_suite_report(db, again, commit=shas[5])
        assert import_suite_report(db, again, commit=shas[5]).already == ROWS  # re-import records nothing twice
    finally:
        os.chdir(cwd)
    return db, shas


def _row(grid, name):
    return next(r for r in grid.rows if r.model == name)


def test_columns_are_commits_in_commit_order_and_rows_are_grouped(suite_db):
    db, shas = suite_db
    grid = hud.build_grid(db)
    assert len(grid.rows) == ROWS and grid.runs == COMMITS * ROWS + ROWS
    assert [c.key for c in grid.columns] == [s[:12] for s in shas]  # auto-labelled by commit, git's order
    assert all(c.commit in shas and c.commit_time for c in grid.columns)
    conv = _row(grid, "test_conv2d_case0[xnnpack]")
    assert conv.group == "xnnpack" and conv.operator == "conv2d" and conv.source == "suite"
    assert conv.culprit == shas[20][:12] and "worst SQNR" in conv.cells[shas[20][:12]].why
    gelu = _row(grid, "test_gelu_case1[portable]")
    assert gelu.culprit == shas[25][:12] and gelu.cells[shas[25][:12]].why == "PASS -> FAIL"
    relu = _row(grid, "test_relu_case0[xnnpack]")
    assert relu.culprit is None and relu.cells[shas[10][:12]].regressed  # a blip, not a culprit
    # one commit imported twice: the latest run is shown, the worst is named
    cell = _row(grid, "test_abs_case0[portable]").cells[shas[5][:12]]
    assert cell.runs == 2 and cell.value == pytest.approx(55.0) and not cell.regressed  # worst output: out1
    assert cell.worst is not None and cell.worst.id != cell.run.id and cell.worst_value == pytest.approx(25.0)
    # regressed first at every level: the first rows are the regressed ones of a regressed group
    assert grid.rows[0].culprit is not None
    groups = [r.group for r in grid.rows]
    assert sorted(set(groups), key=groups.index)[:2] == ["portable", "xnnpack"]  # both have a culprit
    assert {r.dtype for r in grid.rows if r.group == "arm_tosa_int"} == {"int8"}
    assert {r.target for r in grid.rows} == {"host (suite)"}


def test_site_in_chromium(suite_db, tmp_path, cli):
    db, shas = suite_db
    out = tmp_path / "site"
    res = cli("hud", "--out", str(out), "--db", str(db), "--window", str(COMMITS), "--page-rows", str(ROWS),
              timeout=1200)  # one page: the whole grid (paging: tests/test_hud_site.py)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{ROWS} rows x {COMMITS} labels" in res.stdout and "4 row(s) regressed" in res.stdout
    page = (out / "index.html").read_text()
    assert page.count("<tr class='grp g1") == len(FLOWS)
    assert "class='grp g2 shut'" in page  # quiet operator groups start folded at this size
    grid = hud.build_grid(db)
    regressed = sum(c.regressed for r in grid.rows for c in r.cells.values())
    assert regressed == 2 * 10 + 2 * 5 + 2  # conv2d x2 from commit 20, gelu x2 from commit 25, relu x2 at 10
    assert re.search(r"latest of 2 runs in this column \| worst: run #\d+ PASS 25\.0", page)
    open_rows = sum(1 for r in grid.rows if any(x.culprit or x.failing(grid.columns)
                                                   for x in grid.rows if (x.group, x.operator) == (r.group, r.operator)))
    shot = tmp_path / "hud-500x30.png"
    result = check_page(out.joinpath("index.html").as_uri(), shot, width=1600)
    assert result.console_errors == []
    assert result.title == (f"bundlerun HUD: {ROWS} rows, {COMMITS} labels, {COMMITS * ROWS} runs, {regressed} regressed, "
                            f"{open_rows} shown")
    assert open_rows == 2 + 2  # the conv2d and gelu groups; the recovered relu blip's group starts folded
    # a filter in the URL: the rows of one operator, every group unfolded for them
    filtered = check_page(out.joinpath("index.html").as_uri() + "#q=conv2d_case", tmp_path / "filtered.png", width=1600)
    conv_rows = sum(1 for r in grid.rows if "conv2d_case" in r.model)
    assert conv_rows >= 4 and filtered.title.endswith(f", {conv_rows} shown")
    saved = os.environ.get("BUNDLERUN_HUD_SCREENSHOT")  # keep a copy to look at
    if saved:
        shutil.copy(shot, saved)
        shutil.copy(tmp_path / "filtered.png", Path(saved).with_name(Path(saved).stem + "-filtered.png"))
    assert shot.stat().st_size > 50_000


def test_runs_are_labelled_by_commit_unless_labelled(repo, tmp_path, monkeypatch):
    root, shas = repo
    db = tmp_path / "h.sqlite"
    bundle = make_bundle(cases=2)

    def stock(report) -> Report:  # a stock ExecuTorch bundle: no manifest, no model id
        report["bundle"].update(model=None, has_manifest=False)
        return Report.from_json(report)

    monkeypatch.delenv(commits.ENV_VAR, raising=False)
    for var in commits.CI_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(root)
    commits._CACHE.clear()
    plain = stock(make_report(bundle, target_run(bundle, seed=1), bundle_path=tmp_path / "stock-model.bpte"))
    history.record_report(db, plain)  # in a git working tree: HEAD
    monkeypatch.setenv("GITHUB_SHA", shas[3])
    commits._CACHE.clear()
    history.record_report(db, stock(make_report(bundle, target_run(bundle, seed=2),
                                                bundle_path=tmp_path / "stock-model.bpte")))
    history.record_report(db, stock(make_report(bundle, target_run(bundle, seed=3), label="v1.0",
                                                bundle_path=tmp_path / "stock-model.bpte")))
    monkeypatch.delenv("GITHUB_SHA")
    monkeypatch.setenv(commits.ENV_VAR, "off")
    commits._CACHE.clear()
    history.record_report(db, stock(make_report(bundle, target_run(bundle, seed=4), started="2026-11-30T10:00:00+00:00",
                                                bundle_path=tmp_path / "stock-model.bpte")))
    commits._CACHE.clear()
    runs = history.list_runs(db, limit=None)[::-1]
    assert [r.label for r in runs] == [shas[-1][:12], shas[3][:12], "v1.0", None]
    grid = hud.build_grid(db)
    assert [c.key for c in grid.columns][-1] == "~2026-11-30" and grid.columns[-1].bucket
    assert {c.key for c in grid.columns} == {shas[-1][:12], shas[3][:12], "v1.0", "~2026-11-30"}
    (row,) = grid.rows  # a stock bundle without a manifest model: named by its file
    assert row.model == "stock-model.bpte"
    tags = __import__("bundlerun.runner.history.tags", fromlist=["run_extras"]).run_extras(db)
    assert [tags[r.id]["commit_source"] for r in runs] == ["git", "GITHUB_SHA", "GITHUB_SHA", None]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT.*", tags[runs[0].id]["commit_time"])
