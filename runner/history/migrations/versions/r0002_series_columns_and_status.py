"""Version 2: a run's series (inputs, criteria and program digests) and its status.

The hand-written migration it replaces, unchanged in effect: add the columns and fill them from
each run's stored report, as record_reports would have; a run whose report says it was
interrupted gets the status and loses its summary figures (counts, verdict, per-output, perf and
dataset rows: its report_json keeps every finished case). A row whose report cannot be read keeps
NULLs, which read as "not recorded" (runner/history/series.py).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op
from bundlerun.runner.report.model import Report

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

SERIES_COLUMNS = ("inputs_sha256", "criteria_sha256", "program_sha256", "status")
SUMMARY_COLUMNS = ("verdict", "cases", "outputs", "n_pass", "n_fail", "n_error", "n_timeout", "n_skip")
FIGURE_TABLES = ("case_outputs", "perf_figures", "datasets", "replay_outputs")


def upgrade() -> None:
    from bundlerun.runner.history.store import INTERRUPTED, series_fields  # circle: store runs these migrations

    conn = op.get_bind()
    have = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
    for column in SERIES_COLUMNS:
        if column not in have:
            op.add_column("runs", sa.Column(column, sa.Text))
    updates, stopped = [], []
    for run_id, text in conn.execute(sa.text("SELECT id, report_json FROM runs")).fetchall():
        try:
            fields = series_fields(Report.from_json(json.loads(text)))
        except Exception:  # noqa: BLE001 - an unreadable row is reported when read, never here
            continue
        updates.append({**{c: fields[c] for c in SERIES_COLUMNS}, "run_id": run_id})
        if fields["status"] == INTERRUPTED:
            stopped.append({"run_id": run_id})
    if updates:
        conn.execute(sa.text(f"UPDATE runs SET {', '.join(f'{c} = :{c}' for c in SERIES_COLUMNS)} WHERE id = :run_id"),
                     updates)
    if stopped:
        conn.execute(sa.text(f"UPDATE runs SET {', '.join(f'{c} = NULL' for c in SUMMARY_COLUMNS)} WHERE id = :run_id"),
                     stopped)
        for table in FIGURE_TABLES:
            conn.execute(sa.text(f"DELETE FROM {table} WHERE run_id = :run_id"), stopped)
    conn.execute(sa.text("UPDATE meta SET value = '2' WHERE key = 'schema_version'"))


def downgrade() -> None:
    raise NotImplementedError("the history is never downgraded")
