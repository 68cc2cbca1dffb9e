"""Revision 0003: an LLM run's per-sequence figures in their own table, `sequence_figures`.

One row per run x sequence: steps, first diverging step (NULL: never diverged), greedy agreement
length, perplexity of the reference continuation under the target and the eager reference and
their ratio, worst and median step SQNR, the sequence's verdict. Filled from each stored report
that has sequences (an interrupted run records no figures, as for every figure table; a row whose
report cannot be read gets none). Before this revision three of these figures were kept as
`perf_figures` rows named `sequence_first_divergence`, `sequence_greedy_agreement` and
`sequence_perplexity_ratio`: they move here (deleted there), so `trend` reads one table.

Columns frozen here (not read from runner/history/schema.py); the figures are computed by
runner/report/sequences.py's `history_rows`, the function a new run is recorded with.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op
from bundlerun.runner.report.model import Report
from bundlerun.runner.report.sequences import history_rows

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Real = sa.Float(precision=53)


COLUMNS = ("run_id", "method", "sequence_index", "name", "verdict", "steps", "first_divergence", "greedy_agreement",
           "perplexity_target", "perplexity_reference", "perplexity_ratio", "sqnr_worst", "sqnr_median")


def upgrade() -> None:
    conn = op.get_bind()
    inspector = sa.inspect(conn)
    present = "sequence_figures" in inspector.get_table_names()
    if present and {c["name"] for c in inspector.get_columns("sequence_figures")} == set(COLUMNS):
        # a file stamped at an older revision that already has the table (a schema copied by hand, a test's
        # legacy file): its rows are derived from the stored reports, refilled below
        conn.execute(sa.text("DELETE FROM sequence_figures"))
        table = sa.table("sequence_figures", *(sa.column(c) for c in COLUMNS))
    else:
        if present:  # a table of that name in another shape (a development build's): derived data, rebuilt
            op.drop_table("sequence_figures")
        table = op.create_table(
            "sequence_figures",
            sa.Column("run_id", Id, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, primary_key=True),
            sa.Column("method", sa.Text, primary_key=True), sa.Column("sequence_index", sa.BigInteger, primary_key=True),
            sa.Column("name", sa.Text), sa.Column("verdict", sa.Text), sa.Column("steps", sa.BigInteger),
            sa.Column("first_divergence", sa.BigInteger), sa.Column("greedy_agreement", sa.BigInteger),
            *(sa.Column(name, Real) for name in ("perplexity_target", "perplexity_reference", "perplexity_ratio",
                                                "sqnr_worst", "sqnr_median")),
        )
    from bundlerun.runner.history.store import _sql_text  # circle: store runs these migrations

    # every run whose stored report has sequences (a report without them never names the key)
    candidates = [int(r[0]) for r in conn.execute(sa.text(
        "SELECT id FROM runs WHERE report_json LIKE '%\"sequences\"%' "
        "AND (status IS NULL OR status <> 'interrupted') ORDER BY id")).fetchall()]
    rows = []
    for run_id in candidates:
        text = conn.execute(sa.text("SELECT report_json FROM runs WHERE id = :id"), {"id": run_id}).scalar()
        try:
            report = Report.from_json(json.loads(str(text)))
        except Exception:  # noqa: BLE001 - an unreadable row is reported when read, never here
            continue
        if report.summary.interrupted:
            continue
        rows += [{k: _sql_text(v) for k, v in row.items()} for row in history_rows(run_id, report)]
    if rows:
        op.bulk_insert(table, rows)
    conn.execute(sa.text("DELETE FROM perf_figures WHERE name IN ('sequence_first_divergence', "
                         "'sequence_greedy_agreement', 'sequence_perplexity_ratio')"))


def downgrade() -> None:
    raise NotImplementedError("the history is never downgraded")
