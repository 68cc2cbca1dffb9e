"""The history's version-1 tables, as the hand-written SQLite schema created them.

Frozen here (not read from runner/history/schema.py): a later revision that changes a table must
find it as this one left it.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Int = sa.BigInteger
Real = sa.Float(precision=53)


def _cols(kind, *names):
    return [sa.Column(n, kind) for n in names]


def _run_ref(on_delete="CASCADE", nullable=False, primary=True):
    return sa.Column("run_id", Id, sa.ForeignKey("runs.id", ondelete=on_delete), nullable=nullable,
                     primary_key=primary)


def upgrade() -> None:
    op.create_table("meta", sa.Column("key", sa.Text, primary_key=True), sa.Column("value", sa.Text))
    op.create_table(
        "runs",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("run_uuid", sa.Text, unique=True, nullable=False),
        sa.Column("started", sa.Text), sa.Column("finished", sa.Text), sa.Column("recorded", sa.Text, nullable=False),
        sa.Column("duration_s", Real),
        *_cols(sa.Text, "bundle_sha256", "bundle_path", "model", "target", "backend", "dtype", "tool_version",
               "torch_version", "executorch_version", "label", "verdict"),
        sa.Column("exit_code", Int), sa.Column("report_path", sa.Text),
        *_cols(Int, "cases", "outputs", "n_pass", "n_fail", "n_error", "n_timeout", "n_skip"),
        sa.Column("report_json", sa.Text, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("runs_model_target", "runs", ["model", "target", "id"])
    op.create_index("runs_label", "runs", ["label", "id"])
    op.create_table(
        "case_outputs", _run_ref(),
        sa.Column("method", sa.Text, primary_key=True), sa.Column("case_index", Int, primary_key=True),
        sa.Column("output_index", Int, primary_key=True),
        *_cols(sa.Text, "name", "case_status", "verdict"),
        *_cols(Real, "sqnr", "error_mae", "error_max", "error_l2_norm", "cosine_similarity", "relative_frobenius",
               "psnr"),
        sa.Column("mismatch_count", Int), sa.Column("failed", sa.Text),
    )
    op.create_table(
        "datasets", _run_ref(),
        sa.Column("name", sa.Text), sa.Column("samples", Int),
        *_cols(Real, "top1", "top5", "reference_top1", "reference_top5", "top1_diff", "top1_diff_low",
               "top1_diff_high", "agreement"),
    )
    op.create_table(
        "farm_attempts",
        sa.Column("farm_uuid", sa.Text, primary_key=True), sa.Column("job", sa.Text, primary_key=True),
        sa.Column("attempt", Int, primary_key=True),
        _run_ref(on_delete="SET NULL", nullable=True, primary=False),
        *_cols(sa.Text, "url", "device", "node", "verdict"), sa.Column("exit_code", Int),
        sa.Column("error_kinds", sa.Text), *_cols(Int, "retried", "final", "flaky"), sa.Column("elapsed_s", Real),
        sa.Column("recorded", sa.Text),
    )
    op.create_index("farm_attempts_job", "farm_attempts", ["job", "farm_uuid"])
    op.create_table(
        "perf_figures", _run_ref(),
        sa.Column("method", sa.Text, primary_key=True), sa.Column("case_index", Int, primary_key=True),
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("phase", sa.Text, primary_key=True, server_default=""),
        sa.Column("value", Real), *_cols(sa.Text, "unit", "kind"), sa.Column("per_inference", Real),
        sa.Column("samples", Int), sa.Column("spread", Real),
    )
    op.create_index("perf_figures_name", "perf_figures", ["name", "run_id"])
    op.create_table(
        "run_tags", _run_ref(),
        *_cols(sa.Text, "source", "flow", "operator", "test"), sa.Column("subtest", Int),
        *_cols(sa.Text, "commit_sha", "commit_time", "commit_source"), sa.Column("dirty", Int),
        *_cols(sa.Text, "suite_result", "suite_detail", "suite_error"),
    )
    op.create_table(
        "replay_outputs", _run_ref(),
        sa.Column("method", sa.Text, primary_key=True), sa.Column("case_index", Int, primary_key=True),
        sa.Column("output_index", Int, primary_key=True), sa.Column("name", sa.Text),
        *_cols(Int, "runs", "distinct_results"), sa.Column("spread", Real), sa.Column("flips", Int),
        *_cols(sa.Text, "finding", "verdicts"),
    )
    op.execute(sa.text("INSERT INTO meta (key, value) VALUES ('schema_version', '1')"))


def downgrade() -> None:
    raise NotImplementedError("the history is never downgraded")
