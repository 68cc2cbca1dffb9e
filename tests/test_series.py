"""One series per bundle identity (runner/history/series.py), and interrupted runs as no data point.

The user's reproduction on host://xnnpack, through the real CLI: one bundle of mlp (rand inputs)
run twice, then another bundle of mlp (other inputs, tighter criteria) labelled `v1-tight`. Before,
the HUD put the three runs in one row and named `v1-tight` the culprit, and the second bundle's
HTML report plotted the first bundle's runs. Then a real regression within one series (reports
made by the real judge, tests/report_samples.py) is still named; a real SIGTERM'd run is recorded
as interrupted with no figures; a version-1 database is migrated from its stored reports.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

import report_samples as rs
from bundlerun.runner.history import store as history
from bundlerun.runner.pictures import hud
from bundlerun.runner.history import series
from bundlerun.bundles.integrity import inputs_digest
from bundlerun.runner.history.regression import unrelated_reasons
from bundlerun.runner.report.model import Report

ROOT = Path(__file__).resolve().parents[1]


def _report(bundle, noise: float, label: str, seed: int = 1, **kw) -> Report:
    """A report by the real judge, carrying its bundle's inputs digest as `run` records it."""
    data = rs.make_report(bundle, rs.target_run(bundle, noise=noise, seed=seed), label=label, **kw)
    data["bundle"]["inputs_sha256"] = inputs_digest(bundle)
    return Report.from_json(data)


def _interrupted(report: Report) -> Report:
    stopped = copy.deepcopy(report)
    stopped.summary.interrupted, stopped.summary.exit_code = True, 130
    return stopped


# ------------------------------------------------------------------------------- the user's reproduction


def test_two_bundles_of_one_model_are_two_series_and_no_culprit_is_named(bundle_cache, cli, tmp_path):
    rand = bundle_cache("mlp", cases=3, seed=0, distribution="rand")
    db = tmp_path / "h.sqlite"
    env = {"BUNDLERUN_HISTORY": str(db), "COLUMNS": "250"}
    tight = tmp_path / "mlp-tight.bpte"  # the same model, other inputs and tighter criteria
    proc = cli("build", "mlp", "-o", str(tight), "--cases", "3", "--seed", "1", "--tolerance", "sqnr_min_db=400",
               env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]

    def run(bundle, label):
        proc = cli("run", str(bundle), "--report", str(tmp_path / label), "--label", label, "--quiet", env=env)
        return proc, json.loads((tmp_path / label / "report.json").read_text())

    for label in ("v1", "v1b"):
        proc, report = run(rand, label)
        assert proc.returncode == 0, proc.stderr[-2000:]
    proc, tight_report = run(tight, "v1-tight")
    # the other bundle fails its own (tighter) criteria: in one row with v1 that read as a regression
    assert proc.returncode == 1 and tight_report["summary"]["verdict"] == "FAIL", proc.stderr[-2000:]
    assert len(tight_report["bundle"]["criteria_sha256"]) == 64
    assert tight_report["bundle"]["criteria_sha256"] != report["bundle"]["criteria_sha256"]

    site = tmp_path / "site"
    proc = cli("hud", "--out", str(site), "--db", str(db), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "2 rows x 3 labels from 3 runs; 0 row(s) regressed" in proc.stdout, proc.stdout
    grid = hud.build_grid(db)
    rows = {tuple(sorted(r.cells)): r for r in grid.rows}
    assert set(rows) == {("v1", "v1b"), ("v1-tight",)}
    assert all(r.culprit is None and not any(c.regressed for c in r.cells.values()) for r in grid.rows)
    a, b = rows[("v1", "v1b")], rows[("v1-tight",)]
    assert a.tag == f"in {report['bundle']['inputs_sha256'][:6]} · cr {report['bundle']['criteria_sha256'][:6]}"
    assert b.tag.startswith(f"in {tight_report['bundle']['inputs_sha256'][:6]} · cr ") and a.tag != b.tag
    page = (site / "index.html").read_text()
    assert a.tag in page and b.tag in page and "regressed since" not in page

    # compare refuses the same pair by the same identity; the history listing shows the series apart
    proc = cli("compare", "v1", "v1-tight", env=env)
    assert proc.returncode == 2 and "different test inputs" in proc.stderr and "different criteria" in proc.stderr
    proc = cli("compare", "v1", "v1b", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    proc = cli("history", env=env)
    assert proc.returncode == 0 and a.tag in proc.stdout and b.tag in proc.stdout, proc.stdout

    # each report's history plot holds only its own series' runs
    def plotted(label: str) -> list[str]:
        return re.findall(r"last (\d+) recorded run", (tmp_path / label / "report.html").read_text())

    assert plotted("v1b") and set(plotted("v1b")) == {"2"}  # v1 and v1b: one bundle
    assert plotted("v1-tight") and set(plotted("v1-tight")) == {"1"}  # not v1 or v1b: another bundle


# ---------------------------------------------------------------------------- a regression within a series


def test_one_bundle_stays_one_series_and_its_regression_is_named(tmp_path, cli):
    db = tmp_path / "h.sqlite"
    mlp = rs.make_bundle(cases=3, seed=0)
    other = rs.make_bundle(cases=3, seed=5)  # another bundle of mlp: other inputs
    for i, noise in enumerate((1e-6, 1e-6, 3e-4, 3e-4)):  # SQNR drops by ~50 dB at c2 and stays down
        history.record_report(db, _report(mlp, noise, f"c{i}", seed=i, started=f"2026-11-0{i + 1}T00:00:00+00:00"))
    # the other bundle, far worse under c4: in the same row it would be a regression since c2 ... c4
    history.record_report(db, _report(other, 1e-1, "c4", started="2026-11-05T00:00:00+00:00"))
    grid = hud.build_grid(db)
    assert len(grid.rows) == 2
    same = next(r for r in grid.rows if len(r.cells) == 4)
    lone = next(r for r in grid.rows if len(r.cells) == 1)
    assert same.culprit == "c2" and lone.culprit is None and lone.cells["c4"].run.verdict == "FAIL"
    proc = cli("hud", "--out", str(tmp_path / "site"), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    assert "1 row(s) regressed" in proc.stdout
    assert f"mlp / host://xnnpack / fp32 ({same.tag}): regressed since c2" in proc.stdout
    # the trend draws the two bundles as two lines, named apart
    proc = cli("trend", "mlp", "-o", str(tmp_path / "t.png"), env={"BUNDLERUN_HISTORY": str(db)})
    assert proc.returncode == 0, proc.stderr
    assert "5 run(s) of mlp in 2 series" in proc.stdout
    assert f"host://xnnpack fp32 {same.tag}: 4 run(s)" in proc.stdout
    assert f"host://xnnpack fp32 {lone.tag}: 1 run(s)" in proc.stdout
    # --baseline LABEL picks the run of this series under that label, not the newest with it
    from bundlerun.runner.history.regression import check_baseline

    again = _report(mlp, 3e-4, "c5", seed=9)
    assert check_baseline("c4", again, db) == []  # c4 holds only the other bundle: refused, not compared
    assert again.baseline["refused"].startswith("different test inputs")
    history.record_report(db, _report(mlp, 1e-6, "c4", seed=8, started="2026-11-05T00:00:01+00:00"))
    again = _report(mlp, 3e-4, "c5", seed=9)
    assert [r["rule"] for r in check_baseline("c4", again, db)][:1] == ["sqnr-drop"]
    assert "refused" not in again.baseline


def test_html_history_plot_shows_only_the_reports_series(tmp_path):
    from bundlerun.runner.writers.html import render_html

    db = tmp_path / "h.sqlite"
    mlp, other = rs.make_bundle(cases=3, seed=0), rs.make_bundle(cases=3, seed=5)
    for i in range(3):
        history.record_report(db, _report(mlp, 1e-5, f"a{i}", seed=i))
    tight = rs.make_bundle(cases=3, seed=0, criteria=rs.Criteria(atol=1e-9))  # same inputs, other criteria
    history.record_report(db, _report(tight, 1e-5, "t0"))
    mine = _report(other, 1e-5, "b0")
    history.record_report(db, mine)
    page = render_html(mine, history_db=db)
    assert "last 1 recorded run(s)" in page and "last 5 recorded run(s)" not in page
    assert series.of_report(mine).tag in page
    page = render_html(_report(mlp, 1e-5, "a3"), history_db=db)
    assert "last 3 recorded run(s)" in page  # a0..a2: not the tight bundle of the same inputs, not b0


# -------------------------------------------------------------------------------------- the identity


def test_identity_differences_and_criteria_digest():
    mlp = rs.make_bundle(cases=4, seed=0)
    base, cur = _report(mlp, 1e-5, "a"), _report(mlp, 1e-5, "b", seed=2)
    s = series.of_report(base)
    assert s == series.of_report(cur) and len(s.criteria) == 64 and unrelated_reasons(base, cur) == []
    # a subset of the cases has the digest of the whole run; the provenance trail is not a criterion
    assert series.criteria_digest(cur.cases[:1]) == s.criteria
    trailed = copy.deepcopy(cur)
    for case in trailed.cases:
        for out in case.outputs:
            out.criteria.trail = {"atol": [{"value": 1e-3, "source": "x", "file": "/elsewhere/bundlerun.toml"}]}
    assert series.of_report(trailed) == s
    tight = _report(rs.make_bundle(cases=4, seed=0, criteria=rs.Criteria(atol=1e-9)), 1e-5, "t")
    assert series.of_report(tight).inputs == s.inputs and series.of_report(tight).criteria != s.criteria
    [reason] = unrelated_reasons(base, tight)
    assert reason.startswith("different criteria (criteria sha256 ")
    # what the cases were judged by wins over a recorded digest (a stale one: `judge --override` copies the
    # report); the recorded digest serves where no case carries criteria
    recorded = copy.deepcopy(cur)
    recorded.bundle["criteria_sha256"] = "0" * 64
    assert series.of_report(recorded).criteria == s.criteria
    recorded.cases = []
    assert series.of_report(recorded).criteria == "0" * 64
    # a hash one side lacks is not a difference (reports from before it was recorded)
    assert series.differences(s, series.Series(s.model, s.target, s.dtype, None, None)) == []
    # an interrupted run is no side of a comparison
    assert unrelated_reasons(base, _interrupted(cur)) == [
        "the current run was interrupted (a partial run is no data point)"]
    assert series.tags([s, series.Series(s.model, s.target, "int8", s.inputs, s.criteria)]) == {
        s: "", series.Series(s.model, s.target, "int8", s.inputs, s.criteria): ""}


def test_interrupted_run_is_recorded_without_figures_and_is_never_a_point(tmp_path):
    db = tmp_path / "h.sqlite"
    mlp = rs.make_bundle(cases=4, seed=0)
    history.record_report(db, _report(mlp, 1e-6, "c0"))
    stopped = _interrupted(_report(rs.make_bundle(cases=4, seed=0), 1e-1, "c1"))  # 2 finished cases: FAIL
    run_id = history.record_report(db, stopped)
    [rec] = history.list_runs(db, label="c1")
    assert rec.status == "interrupted" and rec.interrupted
    assert (rec.verdict, rec.cases, rec.outputs, rec.n_pass, rec.n_fail, rec.min_sqnr, rec.max_mae) == (None,) * 7
    conn = sqlite3.connect(db)
    for table in ("case_outputs", "perf_figures", "datasets", "replay_outputs"):
        assert conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", (run_id,)).fetchone()[0] == 0
    conn.close()
    assert history.load_report(db, run_id).summary.interrupted  # the finished cases stay readable
    assert [p.label for p in history.trend(db, "mlp", None, "sqnr")] == ["c0"]
    grid = hud.build_grid(db)
    assert grid.interrupted == 1 and grid.runs == 1 and [list(r.cells) for r in grid.rows] == [["c0"]]
    with pytest.raises(history.HistoryError, match="no run 'c1'"):
        history.resolve_run(db, "c1")  # a label never resolves to an interrupted run


# ------------------------------------------------------------------------------------------ migration


def test_a_version_1_database_is_migrated_from_its_stored_reports(tmp_path):
    db = tmp_path / "h.sqlite"
    mlp = rs.make_bundle(cases=3, seed=0)
    whole, stopped = _report(mlp, 1e-5, "c0"), _interrupted(_report(mlp, 1e-5, "c1"))
    ids = [history.record_report(db, r) for r in (whole, stopped)]
    expected = {r.id: (r.inputs_sha256, r.criteria_sha256, r.status) for r in history.list_runs(db, limit=None)}
    # make it what version 1 wrote: no series columns, the interrupted run's figures recorded
    conn = sqlite3.connect(db)
    for column in history.SERIES_COLUMNS:
        conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    conn.execute("UPDATE runs SET verdict = 'FAIL', cases = 3, n_pass = 2 WHERE id = ?", (ids[1],))
    conn.executemany("INSERT INTO case_outputs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     list(history._output_rows(ids[1], stopped)))
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.execute("DROP TABLE alembic_version")  # version 1 was written before Alembic managed the schema
    conn.execute("INSERT INTO runs (run_uuid, recorded, report_json) VALUES ('bad', '2026-01-01', '{not json')")
    conn.commit()
    conn.close()
    runs = {r.id: r for r in history.list_runs(db, limit=None)}  # opening migrates
    assert {i: (runs[i].inputs_sha256, runs[i].criteria_sha256, runs[i].status) for i in ids} == expected
    assert expected[ids[0]][0] == inputs_digest(mlp) and expected[ids[1]][2] == "interrupted"
    assert (runs[ids[1]].verdict, runs[ids[1]].cases, runs[ids[1]].n_pass, runs[ids[1]].min_sqnr) == (None,) * 4
    bad = next(r for r in runs.values() if r.run_uuid == "bad")
    assert (bad.inputs_sha256, bad.criteria_sha256, bad.status) == (None, None, None)  # unreadable: NULLs
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "2"
    assert conn.execute("SELECT COUNT(*) FROM case_outputs WHERE run_id = ?", (ids[1],)).fetchone()[0] == 0
    conn.close()
    assert [p.label for p in history.trend(db, "mlp", None, "sqnr")] == ["c0"]


# --------------------------------------------------------------------------------- a real SIGTERM


@pytest.fixture(scope="module")
def portable_mlp(bundle_cache) -> Path:
    return bundle_cache("mlp", backend="portable", cases=4, target="host://portable")


def test_sigterm_run_is_recorded_as_interrupted_with_no_figures(portable_mlp, tmp_path):
    from proc_helpers import TAG_VAR, new_tag, settled, tagged
    from test_sigterm import CLI as cli, _start, _wait_for_hang  # how test_sigterm starts and stops a run

    db, tag = tmp_path / "h.sqlite", new_tag()
    env = {**os.environ, "PYTHONPATH": str(ROOT), TAG_VAR: tag, "BUNDLERUN_HISTORY": str(db), "COLUMNS": "250"}
    proc = _start(["run", str(portable_mlp), "--target", "host://portable", "--report", str(tmp_path / "cut"),
                   "--label", "cut", "--timeout", "300"], tag, BUNDLERUN_FAULT="hang@forward:2",
                  BUNDLERUN_HISTORY=str(db))
    _wait_for_hang(proc, tmp_path / "cut" / "work", "host-runtime-*.log")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    report = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert report["summary"]["interrupted"] and [c["verdict"] for c in report["cases"][:2]] == ["PASS", "PASS"]
    [rec] = history.list_runs(db)
    assert rec.status == "interrupted" and rec.label == "cut"
    assert (rec.verdict, rec.cases, rec.n_pass, rec.n_fail, rec.min_sqnr, rec.max_mae) == (None,) * 6
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM case_outputs").fetchone()[0] == 0
    listing = subprocess.run([*cli, "history"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert listing.returncode == 0 and "interrupted" in listing.stdout, listing.stderr
    # a label that names only an interrupted run is no baseline
    full = subprocess.run([*cli, "run", str(portable_mlp), "--target", "host://portable", "--report",
                           str(tmp_path / "full"), "--label", "full", "--baseline", "cut", "--quiet"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert full.returncode == 2 and "no run 'cut'" in full.stderr, full.stdout[-2000:] + full.stderr[-2000:]
    grid = hud.build_grid(db)
    assert grid.interrupted == 1 and [list(r.cells) for r in grid.rows] == [["full"]]
    assert settled(lambda: tagged(tag, b"")) == []
