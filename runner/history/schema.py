"""The history's tables as SQLAlchemy Core `Table`s: one definition for SQLite and PostgreSQL.

The columns are the ones the hand-written SQLite schema (versions 1 and 2) had, so an existing file
is this schema once Alembic's revision table is stamped (runner/history/migrations). Whole numbers
are BIGINT on a server (SQLite's integers are 64-bit; PostgreSQL's INTEGER is 32-bit), except the
run id on SQLite, which stays `INTEGER PRIMARY KEY AUTOINCREMENT` (the rowid: ids never reused).
Floats are double precision: SQNR of an exact match is +inf, stored as such on both.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, ForeignKey, Index, Integer, MetaData, Table, Text

metadata = MetaData()

Id = BigInteger().with_variant(Integer(), "sqlite")
Int = BigInteger
Real = Float(precision=53)


def _run_ref(nullable: bool = False, on_delete: str = "CASCADE", primary: bool = False) -> Column:
    return Column("run_id", Id, ForeignKey("runs.id", ondelete=on_delete), nullable=nullable, primary_key=primary)


meta = Table("meta", metadata, Column("key", Text, primary_key=True), Column("value", Text))

runs = Table(
    "runs", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("run_uuid", Text, unique=True, nullable=False),
    Column("started", Text), Column("finished", Text), Column("recorded", Text, nullable=False),
    Column("duration_s", Real),
    *(Column(name, Text) for name in ("bundle_sha256", "bundle_path", "model", "target", "backend", "dtype",
                                      "tool_version", "torch_version", "executorch_version", "label", "verdict")),
    Column("exit_code", Int), Column("report_path", Text),
    *(Column(name, Int) for name in ("cases", "outputs", "n_pass", "n_fail", "n_error", "n_timeout", "n_skip")),
    Column("report_json", Text, nullable=False),
    # version 2 (migrations/versions/r0002): a run's series and its status
    *(Column(name, Text) for name in ("inputs_sha256", "criteria_sha256", "program_sha256", "status")),
    Index("runs_model_target", "model", "target", "id"),
    Index("runs_label", "label", "id"),
    sqlite_autoincrement=True,
)

case_outputs = Table(
    "case_outputs", metadata,
    _run_ref(primary=True),
    Column("method", Text, primary_key=True), Column("case_index", Int, primary_key=True),
    Column("output_index", Int, primary_key=True),
    Column("name", Text), Column("case_status", Text), Column("verdict", Text),
    *(Column(name, Real) for name in ("sqnr", "error_mae", "error_max", "error_l2_norm", "cosine_similarity",
                                      "relative_frobenius", "psnr")),
    Column("mismatch_count", Int), Column("failed", Text),
)

datasets = Table(
    "datasets", metadata,
    _run_ref(primary=True),
    Column("name", Text), Column("samples", Int),
    *(Column(name, Real) for name in ("top1", "top5", "reference_top1", "reference_top5", "top1_diff",
                                      "top1_diff_low", "top1_diff_high", "agreement")),
)

farm_attempts = Table(
    "farm_attempts", metadata,
    Column("farm_uuid", Text, primary_key=True), Column("job", Text, primary_key=True),
    Column("attempt", Int, primary_key=True),
    _run_ref(nullable=True, on_delete="SET NULL"),
    Column("url", Text), Column("device", Text), Column("node", Text), Column("verdict", Text),
    Column("exit_code", Int), Column("error_kinds", Text),
    Column("retried", Int), Column("final", Int), Column("flaky", Int), Column("elapsed_s", Real),
    Column("recorded", Text),
    Index("farm_attempts_job", "job", "farm_uuid"),
)

perf_figures = Table(
    "perf_figures", metadata,
    _run_ref(primary=True),
    Column("method", Text, primary_key=True), Column("case_index", Int, primary_key=True),
    Column("name", Text, primary_key=True), Column("phase", Text, primary_key=True, server_default=""),
    Column("value", Real), Column("unit", Text), Column("kind", Text), Column("per_inference", Real),
    Column("samples", Int), Column("spread", Real),
    Index("perf_figures_name", "name", "run_id"),
)

run_tags = Table(
    "run_tags", metadata,
    _run_ref(primary=True),
    *(Column(name, Text) for name in ("source", "flow", "operator", "test")),
    Column("subtest", Int),
    *(Column(name, Text) for name in ("commit_sha", "commit_time", "commit_source")),
    Column("dirty", Int),
    *(Column(name, Text) for name in ("suite_result", "suite_detail", "suite_error")),
)

replay_outputs = Table(
    "replay_outputs", metadata,
    _run_ref(primary=True),
    Column("method", Text, primary_key=True), Column("case_index", Int, primary_key=True),
    Column("output_index", Int, primary_key=True), Column("name", Text),
    Column("runs", Int), Column("distinct_results", Int), Column("spread", Real), Column("flips", Int),
    Column("finding", Text), Column("verdicts", Text),
)

# revision 0003 (migrations/versions/r0003): an LLM run's per-sequence figures (runner/report/sequences.py,
# `SequenceRecord`), one row per sequence. first_divergence is NULL when the sequence never diverged;
# sqnr_worst/sqnr_median are over the steps that have logits (+inf: every such step matched exactly).
sequence_figures = Table(
    "sequence_figures", metadata,
    _run_ref(primary=True),
    Column("method", Text, primary_key=True), Column("sequence_index", Int, primary_key=True),
    Column("name", Text), Column("verdict", Text), Column("steps", Int), Column("first_divergence", Int),
    Column("greedy_agreement", Int),
    *(Column(name, Real) for name in ("perplexity_target", "perplexity_reference", "perplexity_ratio",
                                      "sqnr_worst", "sqnr_median")),
)

# version 2's columns (migrations/versions/r0002 adds them to a version-1 database)
SERIES_COLUMNS = ("inputs_sha256", "criteria_sha256", "program_sha256", "status")
# the figure tables, cleared for an interrupted run
FIGURE_TABLES = (case_outputs, perf_figures, datasets, replay_outputs, sequence_figures)
