"""What the history keeps about a run beside its report: where it came from and which commit.

The `run_tags` table (runner/history/schema.py), one row per run:

- source: `bundlerun` (a run of this tool), `suite` (a row of the backend test suite's own
  report, imported), `suite+bundlerun` (a suite test whose compare step ran on a bundlerun target);
- flow, operator, test, subtest: the suite's flow, the operator its test file covers
  (`operators/test_add.py` -> `add`), the test id and subtest index;
- commit_sha, commit_time, commit_source, dirty: the commit (runner/history/commits.py), its
  committer date (the HUD's column order) and whether the working tree had local changes;
- suite_result, suite_detail, suite_error: the suite's own Result / Result Detail / Error.

A run recorded without a label is labelled with its commit (12 hex digits), so the HUD's
columns are commits with no --label anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from bundlerun.runner.history import schema as t
from bundlerun.runner.history.store import HistoryError, by_ids, exists, read_rows, stored_report

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report


def _extras_query() -> Any:
    r, g = t.runs.alias("r"), t.run_tags.alias("t")
    c, p = t.case_outputs.alias("c"), t.replay_outputs.alias("p")
    failing = (c.c.run_id == r.c.id, c.c.verdict == "FAIL")
    first_fail = (c.c.method, c.c.output_index, c.c.case_index)

    def scalar(*cols: Any, where: Any = (), order: Any = ()) -> Any:
        return sa.select(*cols).where(*where).order_by(*order).limit(1).scalar_subquery()

    def count(cond: Any) -> Any:
        return sa.select(sa.func.count()).select_from(p).where(p.c.run_id == r.c.id, cond).scalar_subquery()

    out_name = sa.func.coalesce(c.c.name, sa.literal("out", sa.Text) + sa.cast(c.c.output_index, sa.Text))
    return (sa.select(
        r.c.id, r.c.bundle_path,
        *(g.c[n] for n in ("source", "flow", "operator", "test", "subtest", "commit_sha", "commit_time",
                           "commit_source", "dirty", "suite_result", "suite_detail", "suite_error")),
        sa.select(sa.func.max(c.c.error_max)).where(c.c.run_id == r.c.id).scalar_subquery().label("max_error"),
        count(p.c.finding.is_not(None)).label("replay_findings"),
        count(p.c.flips == 1).label("replay_flips"),
        r.c.n_error, r.c.n_timeout,
        scalar(out_name, where=failing, order=first_fail).label("fail_output"),
        scalar(c.c.failed, where=failing, order=first_fail).label("fail_criteria"),
        sa.select(sa.func.count(sa.distinct(c.c.method + sa.literal("\x1f", sa.Text) + sa.cast(c.c.output_index, sa.Text))))
        .where(*failing).scalar_subquery().label("failing_outputs"),
    ).select_from(r.outerjoin(g, g.c.run_id == r.c.id)))


def run_extras(db_path: Any, after_id: int | None = None, ids: list[int] | None = None) -> dict[int, dict[str, Any]]:
    """run id -> its tags, bundle path, largest max error, `--replay` findings (outputs whose
    results differed between runs, and those whose verdict flipped), its ERROR / TIMEOUT counts and
    its first failing output with that output's failed criteria (JSON) and how many outputs failed:
    what the HUD adds to RunRecord. `after_id`: only runs after that one; `ids`: only those runs."""
    if not exists(db_path) or (ids is not None and not ids):
        return {}
    stmt = _extras_query()
    run_id = stmt.selected_columns.id
    if after_id is not None:
        stmt = stmt.where(run_id > int(after_id))
    keep = None
    if ids is not None:
        clause, keep = by_ids(run_id, ids)
        stmt = stmt.where(clause)
    return {int(r["id"]): r for r in read_rows(db_path, stmt) if keep is None or int(r["id"]) in keep}


def load_reports(db_path: Any, run_ids: list[int], chunk: int = 500,
                 errors: dict[int, str] | None = None) -> dict[int, Report]:
    """The stored reports of many runs through one query per chunk (the HUD renders a page per
    shown run: one query each would cost a round trip per run), each read by the history's one
    strict reader (history.stored_report). With `errors`, a run whose stored report cannot be read
    goes there (id -> the one-line reason) instead of stopping every other run."""
    out: dict[int, Report] = {}
    ids = sorted(set(int(i) for i in run_ids))
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        rows = read_rows(db_path, sa.select(t.runs.c.id, t.runs.c.report_json).where(t.runs.c.id.in_(part)),
                         types={"id": "int"})
        for row in rows:
            try:
                out[int(row["id"])] = stored_report(db_path, int(row["id"]), row["report_json"])
            except HistoryError as exc:
                if errors is None:
                    raise
                errors[int(row["id"])] = str(exc)
    return out
