"""The history's schema under Alembic (runner/history/migrations): a new database is exactly
runner/history/schema.py, and SQLite files written by the hand-written schema of bundlerun before
Alembic (versions 1 and 2) are upgraded in place, their runs kept. Real SQLite files, real Alembic."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report_samples as rs  # noqa: E402

from bundlerun.runner.history import database  # noqa: E402
from bundlerun.runner.history import store as history  # noqa: E402
from bundlerun.runner.report.model import Report  # noqa: E402


def _quick(**kw) -> Report:
    return Report.from_json(rs.quick_report(**kw))

# The hand-written schema of version 2, as runner/history/store.py created it before Alembic
# (git show d53cbc0:runner/history/store.py, _SCHEMA): what users' files hold today.
LEGACY_V2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_uuid TEXT UNIQUE NOT NULL,
    started TEXT, finished TEXT, recorded TEXT NOT NULL, duration_s REAL,
    bundle_sha256 TEXT, bundle_path TEXT, model TEXT, target TEXT, backend TEXT, dtype TEXT,
    tool_version TEXT, torch_version TEXT, executorch_version TEXT,
    label TEXT, verdict TEXT, exit_code INTEGER, report_path TEXT,
    cases INTEGER, outputs INTEGER, n_pass INTEGER, n_fail INTEGER, n_error INTEGER,
    n_timeout INTEGER, n_skip INTEGER, report_json TEXT NOT NULL,
    inputs_sha256 TEXT, criteria_sha256 TEXT, program_sha256 TEXT, status TEXT);
CREATE INDEX runs_model_target ON runs (model, target, id);
CREATE INDEX runs_label ON runs (label, id);
CREATE TABLE case_outputs (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    method TEXT NOT NULL, case_index INTEGER NOT NULL, output_index INTEGER NOT NULL,
    name TEXT, case_status TEXT, verdict TEXT,
    sqnr REAL, error_mae REAL, error_max REAL, error_l2_norm REAL, cosine_similarity REAL,
    relative_frobenius REAL, psnr REAL, mismatch_count INTEGER, failed TEXT,
    PRIMARY KEY (run_id, method, case_index, output_index));
CREATE TABLE datasets (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT, samples INTEGER, top1 REAL, top5 REAL, reference_top1 REAL, reference_top5 REAL,
    top1_diff REAL, top1_diff_low REAL, top1_diff_high REAL, agreement REAL);
CREATE TABLE farm_attempts (
    farm_uuid TEXT NOT NULL, job TEXT NOT NULL, attempt INTEGER NOT NULL,
    run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
    url TEXT, device TEXT, node TEXT, verdict TEXT, exit_code INTEGER, error_kinds TEXT,
    retried INTEGER, final INTEGER, flaky INTEGER, elapsed_s REAL, recorded TEXT,
    PRIMARY KEY (farm_uuid, job, attempt));
CREATE INDEX farm_attempts_job ON farm_attempts (job, farm_uuid);
CREATE TABLE perf_figures (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    method TEXT NOT NULL, case_index INTEGER NOT NULL, name TEXT NOT NULL, phase TEXT NOT NULL DEFAULT '',
    value REAL, unit TEXT, kind TEXT, per_inference REAL, samples INTEGER, spread REAL,
    PRIMARY KEY (run_id, method, case_index, name, phase));
CREATE INDEX perf_figures_name ON perf_figures (name, run_id);
CREATE TABLE run_tags (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    source TEXT, flow TEXT, operator TEXT, test TEXT, subtest INTEGER,
    commit_sha TEXT, commit_time TEXT, commit_source TEXT, dirty INTEGER,
    suite_result TEXT, suite_detail TEXT, suite_error TEXT);
CREATE TABLE replay_outputs (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    method TEXT NOT NULL, case_index INTEGER NOT NULL, output_index INTEGER NOT NULL, name TEXT,
    runs INTEGER, distinct_results INTEGER, spread REAL, flips INTEGER, finding TEXT, verdicts TEXT,
    PRIMARY KEY (run_id, method, case_index, output_index));
"""


def _revision(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def test_a_new_history_is_exactly_the_schema_module(tmp_path):
    """Alembic's revisions and runner/history/schema.py describe the same tables (compare_metadata
    finds no difference), so the queries' tables are the database's."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from bundlerun.runner.history.schema import metadata

    db = tmp_path / "h.sqlite"
    history.record_report(db, _quick())
    assert _revision(db) == database.HEAD
    engine = database.engine_for(db)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), metadata)
    assert diff == []


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_file_of_the_hand_written_schema_is_upgraded_in_place(tmp_path, version):
    """A file as bundlerun wrote it before Alembic: its runs survive, it gets Alembic's revision
    table at head, and new runs are recorded beside the old ones."""
    made = tmp_path / "made.sqlite"  # the rows an older bundlerun recorded, copied into the legacy file
    old = [history.record_report(made, _quick(label=f"old{i}", noise=10 ** -(i + 3))) for i in range(2)]
    db = tmp_path / "legacy.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(LEGACY_V2)
    conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (version,))
    conn.execute(f"ATTACH DATABASE '{made}' AS made")
    for table in ("runs", "case_outputs", "datasets", "perf_figures", "run_tags", "replay_outputs"):
        conn.execute(f"INSERT INTO {table} SELECT * FROM made.{table}")
    conn.commit()
    conn.execute("DETACH DATABASE made")
    if version == "1":
        conn.execute("UPDATE runs SET inputs_sha256 = NULL, criteria_sha256 = NULL, status = NULL")
    conn.close()
    before = [(r.id, r.label, r.verdict, r.min_sqnr) for r in history.list_runs(made, limit=None)]
    runs = history.list_runs(db, limit=None)  # opening upgrades
    assert [(r.id, r.label, r.verdict, r.min_sqnr) for r in runs] == before
    filled = [(r.status, r.inputs_sha256, r.criteria_sha256) for r in history.list_runs(made, limit=None)]
    assert [(r.status, r.inputs_sha256, r.criteria_sha256) for r in runs] == filled  # version 1: from the reports
    assert {r.status for r in runs} == {"complete"}
    assert _revision(db) == database.HEAD
    new = history.record_report(db, _quick(label="new"))
    assert new > max(old) and [r.label for r in history.list_runs(db, limit=None)] == ["new", "old1", "old0"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "2"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
