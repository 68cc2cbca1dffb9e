"""What the history keeps about a run beside its report: where it came from and which commit.

The `run_tags` table (runner/history/store.py schema), one row per run:

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

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bundlerun.runner.history.store import HistoryError, _retrying, connect, read_rows, stored_report

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

_SQL = """
SELECT r.id, r.bundle_path, t.source, t.flow, t.operator, t.test, t.subtest, t.commit_sha, t.commit_time,
       t.commit_source, t.dirty, t.suite_result, t.suite_detail, t.suite_error,
       (SELECT MAX(error_max) FROM case_outputs c WHERE c.run_id = r.id) AS max_error,
       (SELECT COUNT(*) FROM replay_outputs p WHERE p.run_id = r.id AND p.finding IS NOT NULL) AS replay_findings,
       (SELECT COUNT(*) FROM replay_outputs p WHERE p.run_id = r.id AND p.flips = 1) AS replay_flips,
       r.n_error, r.n_timeout,
       (SELECT COALESCE(c.name, 'out' || c.output_index) FROM case_outputs c WHERE c.run_id = r.id AND c.verdict = 'FAIL'
        ORDER BY c.method, c.output_index, c.case_index LIMIT 1) AS fail_output,
       (SELECT c.failed FROM case_outputs c WHERE c.run_id = r.id AND c.verdict = 'FAIL'
        ORDER BY c.method, c.output_index, c.case_index LIMIT 1) AS fail_criteria,
       (SELECT COUNT(DISTINCT c.method || char(31) || c.output_index) FROM case_outputs c
        WHERE c.run_id = r.id AND c.verdict = 'FAIL') AS failing_outputs
FROM runs r LEFT JOIN run_tags t ON t.run_id = r.id
"""


def run_extras(db_path: str | Path, after_id: int | None = None,
               ids: list[int] | None = None) -> dict[int, dict[str, Any]]:
    """run id -> its tags, bundle path, largest max error, `--replay` findings (outputs whose
    results differed between runs, and those whose verdict flipped), its ERROR / TIMEOUT counts and
    its first failing output with that output's failed criteria (JSON) and how many outputs failed:
    what the HUD adds to RunRecord. `after_id`: only runs after that one; `ids`: only those runs."""
    if not Path(db_path).exists() or (ids is not None and not ids):
        return {}
    sql, args = _SQL, []
    if after_id is not None:
        sql += " WHERE r.id > ?"
        args.append(int(after_id))
    if ids is not None:
        sql += (" AND" if after_id is not None else " WHERE") + f" r.id IN ({', '.join(str(int(i)) for i in ids)})"
    conn = connect(db_path)
    try:
        rows = _retrying(lambda: conn.execute(sql, args).fetchall())
    finally:
        conn.close()
    return {int(r["id"]): dict(r) for r in rows}


def load_reports(db_path: str | Path, run_ids: list[int], chunk: int = 500,
                 errors: dict[int, str] | None = None) -> dict[int, Report]:
    """The stored reports of many runs through one connection per chunk (the HUD renders a page per
    shown run: one connection each would cost a write-lock round trip per run), each read by the
    history's one strict reader (history.stored_report). With `errors`, a run whose stored report
    cannot be read goes there (id -> the one-line reason) instead of stopping every other run."""
    out: dict[int, Report] = {}
    ids = sorted(set(int(i) for i in run_ids))
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        rows = read_rows(db_path, f"SELECT id, report_json FROM runs WHERE id IN ({', '.join('?' * len(part))})",
                         part, types={"id": "int"})
        for row in rows:
            try:
                out[int(row["id"])] = stored_report(db_path, int(row["id"]), row["report_json"])
            except HistoryError as exc:
                if errors is None:
                    raise
                errors[int(row["id"])] = str(exc)
    return out
