"""The run history: every report (and accuracy run) recorded in one database, SQLite or PostgreSQL.

SQLite (one file, no server) is the embedded default, safe for several CI jobs on one machine;
PostgreSQL (`--history postgresql://USER@HOST/DB`) is one history for many hosts (docs/history.md).
Both go through one code path: SQLAlchemy Core statements over the tables of
runner/history/schema.py, transactions and retries in runner/history/database.py, the schema
migrated by Alembic (runner/history/migrations).

The full report JSON is stored with each run, so `compare` and `--baseline`
can judge against any recorded run without its report directory. Reports come in
and go out as the typed `Report` (runner/report/model.py): JSON only in the
`report_json` column, read back through `Report.from_json`, which checks it.

Where it lives (first that is set): `--history PATH|URL`, `$BUNDLERUN_HISTORY`, config
`[history] path`, then `$XDG_DATA_HOME/bundlerun/history.sqlite` (default
`~/.local/share/bundlerun/history.sqlite`). `off`/`none` disables it (runner/history/location.py).

Times (`started`, `finished`, `recorded`) are stored as UTC ISO-8601 with the
offset (`+00:00`). Rows recorded before that (a time without an offset) are read
as UTC; `history` shows local time with its offset (`--utc` for UTC).

Over 500 lines on purpose: the writes and the queries of one history, which share its typed row
checks; tags and the HUD's queries are runner/history/tags.py.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bundlerun.runner.history import commits
from bundlerun.runner.history import database as db_
from bundlerun.runner.history import schema as t
from bundlerun.runner.history.database import HistoryError
from bundlerun.runner.history.location import (  # noqa: F401 - the names callers use from here
    DISABLED,
    ENV_VAR,
    History,
    HistoryServer,
    as_history,
    default_history_path,
    exists,
    is_server,
    resolve_history_path,
)
from bundlerun.runner.history.schema import SERIES_COLUMNS
from bundlerun.runner.judging.outcome import VERDICTS
from bundlerun.runner.judging.replay import history_rows  # --replay: flaky vs wrong numerics per output
from bundlerun.runner.report.model import Report
from bundlerun.targets.base import Verdict
from bundlerun.runner.history.series import Series
from bundlerun.runner.history.series import of_report
from bundlerun.runner.history.series import of_row
from bundlerun.runner.report.model import ReportError
from bundlerun.runner.report.model import read_report
from bundlerun.runner.report.sequences import TREND_FIGURES as SEQUENCE_FIGURES
from bundlerun.runner.report.sequences import history_rows as sequence_rows

__all__ = ["HistoryError", "SERIES_COLUMNS", "DISABLED", "ENV_VAR", "History", "HistoryServer"]

SCHEMA_VERSION = 2  # meta.schema_version, kept for older bundlerun readers; Alembic's revision is the schema's
INTERRUPTED = "interrupted"

resolve_db_path = resolve_history_path  # the name runner/cli.py uses

_KINDS = {"text": (str,), "int": (int,), "real": (int, float)}


def read_rows(db_path: Any, stmt: Any, types: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Rows (dicts) of a read statement, each column named in `types` checked ("text", "int",
    "real"; NULL is fine). SQLite stores what it is given, so a corrupted or edited database can hold
    text where a number goes: that, and a database that is not one or lacks a table, is one
    HistoryError naming the database, the run and the column, never an internal error."""
    rows = db_.read(db_path, lambda conn: [dict(r._mapping) for r in conn.execute(stmt)])
    for row in rows:
        for column, kind in (types or {}).items():
            if column not in row:
                continue
            value = row[column]
            if value is not None and (isinstance(value, bool) or not isinstance(value, _KINDS[kind])
                                      or (kind == "real" and isinstance(value, float) and value != value)):
                run = f"run #{row['id']}: " if "id" in row else ""
                shown = repr(value)[:60]
                raise HistoryError(f"history database {as_history(db_path)}: {run}column {column}: expected "
                                   f"{ {'int': 'a whole number', 'real': 'a number'}.get(kind, 'text')}, got {shown} "
                                   "(corrupted database)")
    return rows


def by_ids(column: Any, ids: list[int]) -> tuple[Any, set[int] | None]:
    """A WHERE clause for `column IN ids`, and the ids to keep from its rows (None: all of them).
    Thousands of ids (the HUD's cells of a page, often a near-contiguous run of ids) compile into
    thousands of bind parameters: seconds of SQLAlchemy's time at 4,000 (bench/bench_hud.py). When
    the ids fill at least a quarter of their range (bundlerun's own threshold: at most 4x the rows
    read, each cheap), the clause is the range and the rows are filtered by the caller."""
    wanted = sorted({int(i) for i in ids})
    lo, hi = wanted[0], wanted[-1]
    if len(wanted) > 64 and hi - lo + 1 <= 4 * len(wanted):
        return column.between(lo, hi), set(wanted)
    return column.in_(wanted), None


# What an interrupted run does not record: figures over the cases that happened to finish.
_SUMMARY_COLUMNS = ("verdict", "cases", "outputs", "n_pass", "n_fail", "n_error", "n_timeout", "n_skip")


def series_fields(report: Report) -> dict[str, Any]:
    """The series columns of a run (runner/history/series.py) and its status."""

    ident = of_report(report)
    return {"inputs_sha256": ident.inputs, "criteria_sha256": ident.criteria,
            "program_sha256": report.bundle.get("program_sha256"),
            "status": INTERRUPTED if report.summary.interrupted else "complete"}


_series_fields = series_fields


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f else None  # NaN -> NULL


def utc_iso(value: Any) -> str | None:
    """A time as UTC ISO-8601 with its offset (`2026-11-30T12:44:13.123+00:00`).

    A time with an offset is converted to UTC; one without (rows and reports written
    before times carried a timezone) is read as UTC. Text that is not a time is kept."""
    if value is None or value == "":
        return None
    text = str(value)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        return text
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    try:
        return when.astimezone(timezone.utc).isoformat()
    except (OverflowError, ValueError):  # year 1 with a positive offset: before year 1 in UTC
        return text


def display_time(value: Any, utc: bool = False) -> str:
    """A stored time for people: local time (or UTC) to the second, with its offset."""
    text = utc_iso(value)
    if text is None:
        return "-"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return text
    try:
        when = when.astimezone(timezone.utc if utc else None)
    except (OverflowError, ValueError, OSError):  # a time no local clock can show (year 1 or 9999 at the edge)
        return text
    return when.strftime("%Y-%m-%d %H:%M:%S ") + when.strftime("%z")[:3] + ":" + when.strftime("%z")[3:]



def _run_filters(r: Any, where: list[Any], target: str | None, dtype: str | None, series: Any = None) -> list[Any]:
    """WHERE conditions on runs alias `r`, narrowed to one target and one dtype when given, or to one
    series (runner/history/series.py: its target, dtype, inputs and criteria; a hash the series lacks
    matches only runs that lack it too); never an interrupted run."""
    where.append(sa.or_(r.c.status.is_(None), r.c.status != INTERRUPTED))
    if series is not None:
        target, dtype = series.target, series.dtype
        for column, value in ((r.c.inputs_sha256, series.inputs), (r.c.criteria_sha256, series.criteria)):
            where.append(column.is_not_distinct_from(_sql_text(value)))
    for column, value in ((r.c.target, target), (r.c.dtype, dtype)):
        if value or (series is not None and value is None):
            where.append(column.is_not_distinct_from(_sql_text(value)))
    return where


def _sql_text(value: Any) -> Any:
    """Strings as every database can store them: a lone surrogate (a label from a non-UTF-8 argv, a
    `\\ud800` in a JSON manifest) becomes its `\\udXXX` text, and a NUL (which PostgreSQL's text
    refuses) its `\\x00` text, instead of failing the write."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return value


def _run_row(report: Report, report_path: str | None) -> dict[str, Any]:
    run, bundle, summary = report.run, report.bundle, report.summary
    counts = summary.counts or {}
    versions = bundle.get("versions") or {}
    row = {
        "run_uuid": run.get("id") or os.urandom(16).hex(),
        "started": utc_iso(run.get("started")),
        "finished": utc_iso(run.get("finished")),
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": _num(run.get("duration_s")),
        "bundle_sha256": bundle.get("sha256"),
        "bundle_path": bundle.get("path"),
        "model": bundle.get("model"),
        "target": report.target.get("url") or bundle.get("built_for"),
        "backend": bundle.get("backend"),
        "dtype": bundle.get("dtype"),
        "tool_version": report.tool.get("version"),
        "torch_version": versions.get("torch"),
        "executorch_version": versions.get("executorch"),
        "label": run.get("label"),
        "verdict": summary.verdict,
        "exit_code": summary.exit_code,
        "report_path": report_path or run.get("report_path"),
        "cases": summary.cases,
        "outputs": summary.outputs,
        "n_pass": counts.get(Verdict.PASS),
        "n_fail": counts.get(Verdict.FAIL),
        "n_error": counts.get(Verdict.ERROR),
        "n_timeout": counts.get(Verdict.TIMEOUT),
        "n_skip": counts.get(Verdict.SKIP),
        "report_json": json.dumps(report.to_json(), allow_nan=True, default=str),
        **_series_fields(report),
    }
    if row["status"] == INTERRUPTED:  # no figures over the cases that happened to finish
        row.update(dict.fromkeys(_SUMMARY_COLUMNS))
    return {k: _sql_text(v) for k, v in row.items()}


def _output_rows(run_id: int, report: Report) -> Iterator[tuple]:
    for case in report.cases:
        for out in case.outputs:
            stats = out.stats
            yield (
                run_id,
                _sql_text(case.method),
                case.case,
                out.index,
                _sql_text(out.name),
                case.status,
                out.verdict,
                _num(stats.sqnr if stats else None),
                _num(stats.error_mae if stats else None),
                _num(stats.error_max if stats else None),
                _num(stats.error_l2_norm if stats else None),
                _num(stats.cosine_similarity if stats else None),
                _num(stats.relative_frobenius if stats else None),
                _num(stats.psnr if stats else None),
                stats.mismatch_count if stats else None,
                json.dumps(out.failed_json(), default=str),
            )


def _perf_rows(run_id: int, report: Report) -> Iterator[tuple]:
    """One row per case x perf figure x phase (docs/report-schema.md "perf"): value, and for a median
    of repeated executions the number of samples and their spread (median absolute deviation)."""
    from statistics import median

    for case in report.cases:
        for fig in case.perf:
            if _num(fig.value) is None or not fig.name:
                continue
            samples = [float(v) for v in fig.samples or [] if _num(v) is not None]
            spread = None
            if len(samples) > 1:
                m = median(samples)
                spread = median([abs(v - m) for v in samples])
            yield (run_id, _sql_text(case.method), case.case, _sql_text(fig.name), _sql_text(fig.phase or ""),
                   _num(fig.value), fig.unit, fig.kind, _num(fig.per_inference), len(samples) or None, spread)


# the run_tags row (runner/history/tags.py says what it holds and reads it back)
TAG_COLUMNS = ("source", "flow", "operator", "test", "subtest", "commit_sha", "commit_time", "commit_source", "dirty",
               "suite_result", "suite_detail", "suite_error")


def tag_row(row: dict[str, Any], report: Report, tags: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the runs row, with the commit as label when it has none; the run_tags values)."""
    tags = {k: v for k, v in (tags or {}).items() if k in TAG_COLUMNS}
    tags.setdefault("source", "bundlerun")
    if "commit_sha" not in tags:
        found = commits.detect()
        if found is not None:
            tags.update(commit_sha=found.sha, commit_time=found.time, commit_source=found.source, dirty=int(found.dirty))
    elif tags.get("commit_sha") and not tags.get("commit_time"):
        tags["commit_time"] = commits.commit_time(str(tags["commit_sha"]))
    if tags.get("commit_time"):
        tags["commit_time"] = utc_iso(tags["commit_time"])
    sha = tags.get("commit_sha")
    if not row.get("label") and sha:
        row = {**row, "label": _sql_text(commits.Commit(str(sha), "").label)}
    return row, {k: _sql_text(tags.get(k)) for k in TAG_COLUMNS}


def record_report(db_path: Any, report: Report, report_path: str | Path | None = None,
                  tags: dict[str, Any] | None = None) -> int | None:
    """Record one report; returns the run's id in this database.

    Idempotent per report `run.id`: recording the same report twice returns the
    first id and stores nothing twice. `db_path` None (history turned off)
    records nothing and returns None. `tags` (runner/history/tags.py): source, flow,
    operator, commit...; a run without a label is labelled by its commit (runner/history/commits.py).
    """
    if db_path is None:
        return None
    return record_reports(db_path, [(report, report_path, tags)])[0]


def _table_rows(table: sa.Table, rows: Any) -> list[dict[str, Any]]:
    """Tuples in `table`'s column order -> dicts, strings made storable, one row per primary key
    (the last one given, as SQLite's INSERT OR REPLACE kept): a report that names a case-output twice
    records it once on every database."""
    names = [c.name for c in table.columns]
    key = [names.index(c.name) for c in table.primary_key.columns]
    out: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        values = [_sql_text(v) for v in row]
        out[tuple(values[i] for i in key)] = dict(zip(names, values))
    return list(out.values())


def record_reports(db_path: Any, items: list[tuple[Report, str | Path | None, dict[str, Any] | None]]
                   ) -> list[int]:
    """Record many (report, report_path, tags) in one transaction (an import of hundreds of
    suite results: one connection, one commit); the run ids, in order. Idempotent as record_report:
    a run uuid already recorded (by this or another writer) returns its id and stores nothing.

    One lookup of the uuids already there, one compiled INSERT for the runs and one executemany per
    figure table: a statement built per row (`insert().values(**row)`) cost SQLAlchemy a compile
    each, 2.3 s of a 500-result suite import (cProfile, tests/test_hud_suite.py's nightlies)."""

    prepared = []
    for report, report_path, tags in items:
        row, tagged = tag_row(_run_row(report, str(report_path) if report_path else None), report, tags)
        prepared.append((report, row, tagged, report.dataset or None))

    def write(conn: Connection) -> list[int]:
        known = _run_ids_of(conn, [row["run_uuid"] for _report, row, _tagged, _dataset in prepared])
        insert_run = t.runs.insert()
        pending: dict[sa.Table, list[dict[str, Any]]] = {}
        ids = []
        for report, row, tagged, dataset in prepared:
            if row["run_uuid"] in known:  # recorded before, or twice in this batch: stored once
                ids.append(known[row["run_uuid"]])
                continue
            key: Any = conn.execute(insert_run, row).inserted_primary_key
            run_id = int(key[0])
            known[row["run_uuid"]] = run_id
            ids.append(run_id)
            for table, rows in _figures(run_id, report, row, tagged, dataset):
                pending.setdefault(table, []).extend(_table_rows(table, rows))
            if sum(map(len, pending.values())) >= _FLUSH_ROWS:
                _flush(conn, pending)
        _flush(conn, pending)
        return ids

    return db_.write(db_path, write, "cannot record run in {db}")


_FLUSH_ROWS = 20_000  # figure rows held before an executemany: bundlerun's own bound on an import's memory
_UUID_CHUNK = 500  # uuids per IN (...): under every SQLite build's bound-parameter limit (999 before 3.32)


def _run_ids_of(conn: Connection, uuids: list[str]) -> dict[str, int]:
    """{run_uuid: id} of those already recorded."""
    wanted = sorted(set(uuids))
    found: dict[str, int] = {}
    for i in range(0, len(wanted), _UUID_CHUNK):
        stmt = sa.select(t.runs.c.run_uuid, t.runs.c.id).where(t.runs.c.run_uuid.in_(wanted[i:i + _UUID_CHUNK]))
        found.update((str(uuid), int(run_id)) for uuid, run_id in conn.execute(stmt))
    return found


def recorded_run_uuids(db_path: Any, uuids: list[str]) -> set[str]:
    """Which of `uuids` are recorded (an import counts what it adds without reading every run)."""
    if not exists(db_path) or not uuids:
        return set()
    return set(db_.read(db_path, lambda conn: _run_ids_of(conn, uuids)))


def _figures(run_id: int, report: Report, row: dict[str, Any], tagged: dict[str, Any],
             dataset: Any) -> list[tuple[sa.Table, Any]]:
    """(table, row tuples) of one run's figures; an interrupted run has none (schema.FIGURE_TABLES)."""
    figures: list[tuple[sa.Table, Any]] = []
    if row["status"] != INTERRUPTED:
        columns = [c.name for c in t.sequence_figures.columns]  # LLM bundles: figures per sequence
        figures = [(t.case_outputs, _output_rows(run_id, report)), (t.perf_figures, _perf_rows(run_id, report)),
                   (t.replay_outputs, history_rows(run_id, report)),
                   (t.sequence_figures, [tuple(row[c] for c in columns) for row in sequence_rows(run_id, report)])]
        if dataset:
            ci = dataset.get("top1_diff_ci") or [None, None]
            figures.append((t.datasets, [(run_id, dataset.get("name"), dataset.get("samples"),
                                          *(_num(dataset.get(k)) for k in ("top1", "top5", "reference_top1",
                                                                            "reference_top5", "top1_diff")),
                                          _num(ci[0]), _num(ci[1]), _num(dataset.get("agreement")))]))
    figures.append((t.run_tags, [(run_id, *(tagged.get(k) for k in TAG_COLUMNS))]))
    return figures


def _flush(conn: Connection, pending: dict[sa.Table, list[dict[str, Any]]]) -> None:
    for table, values in pending.items():
        if values:
            conn.execute(table.insert(), values)
    pending.clear()


def _upsert(conn: Connection, table: sa.Table) -> Any:
    """INSERT ... ON CONFLICT (primary key) DO UPDATE, in the connection's dialect."""
    from sqlalchemy.dialects import postgresql, sqlite

    stmt: Any = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)
    keys = [c.name for c in table.primary_key.columns]
    return stmt.on_conflict_do_update(index_elements=keys,
                                      set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys})


def record_farm_attempts(db_path: Any, farm_uuid: str, job: str, attempts: list[dict[str, Any]],
                         run_id: int | None = None) -> None:
    """Every attempt of one farm job (runner/farm): device, exit code, failure kinds; `final` marks
    the attempt whose report is the job's run (`run_id`), `flaky` a job that passed after a failed
    attempt. Idempotent per (farm, job, attempt)."""
    if db_path is None:
        return
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = _table_rows(t.farm_attempts, [
        (farm_uuid, job, int(a.get("attempt", 0)), run_id if a.get("final") else None, a.get("url"), a.get("device"),
         (a.get("node") or {}).get("ray_node_id") or (a.get("node") or {}).get("host"), a.get("verdict"),
         a.get("exit_code"), json.dumps(a.get("error_kinds") or []), int(bool(a.get("retried"))),
         int(bool(a.get("final"))), int(bool(a.get("flaky"))), _num(a.get("elapsed_s")), now) for a in attempts])
    if rows:
        db_.write(db_path, lambda conn: conn.execute(_upsert(conn, t.farm_attempts), rows),
                  "cannot record farm attempts in {db}")


def flaky_stats(db_path: Any, limit: int | None = 20) -> dict[str, list[dict[str, Any]]]:
    """Devices by infrastructure-failure rate (failed attempts that exited 2 / attempts on the
    device) and jobs by flake rate (farm runs where the job passed only after a retry / farm runs
    of the job), worst first; only devices and jobs with at least one failed attempt or flake."""
    if not exists(db_path):
        return {"devices": [], "jobs": []}
    f = t.farm_attempts.alias("f")
    device = sa.func.coalesce(f.c.device, f.c.url)
    attempts = sa.func.count().label("attempts")
    infra = sa.cast(sa.func.sum(sa.case((f.c.exit_code == 2, 1), else_=0)), sa.BigInteger).label("infra_failures")
    rate = (sa.cast(infra, sa.Float) / sa.func.count()).label("rate")
    dev_sql = (sa.select(device.label("device"), attempts, infra,
                         sa.cast(sa.func.sum(sa.case((f.c.exit_code == 1, 1), else_=0)), sa.BigInteger)
                         .label("numerical_failures"),
                         rate, sa.func.count(sa.distinct(f.c.job)).label("jobs"),
                         sa.func.max(f.c.recorded).label("last"))
               .where(f.c.attempt > 0).group_by(device).having(infra > 0)
               .order_by(rate.desc(), attempts.desc(), device))
    runs = sa.func.count(sa.distinct(f.c.farm_uuid))
    flaky = sa.func.count(sa.distinct(sa.case((f.c.flaky == 1, f.c.farm_uuid))))
    retries = sa.cast(sa.func.sum(f.c.retried), sa.BigInteger)
    job_rate = (sa.cast(flaky, sa.Float) / runs).label("rate")
    failing = sa.distinct(sa.case((f.c.exit_code == 2, device)))
    job_sql = (sa.select(f.c.job, runs.label("runs"), flaky.label("flaky"),
                         sa.func.count(sa.distinct(sa.case((sa.and_(f.c.final == 1, f.c.exit_code != 0),
                                                            f.c.farm_uuid)))).label("failed"),
                         retries.label("retries"), job_rate,
                         (sa.func.string_agg(failing, sa.literal_column("','")) if db_.dialect(db_path) == "postgresql"
                          else sa.func.group_concat(failing)).label("failing_devices"))
               .group_by(f.c.job).having(sa.or_(flaky > 0, retries > 0))
               .order_by(job_rate.desc(), retries.desc(), f.c.job))
    if limit:
        dev_sql, job_sql = dev_sql.limit(int(limit)), job_sql.limit(int(limit))
    counts = {k: "int" for k in ("attempts", "infra_failures", "numerical_failures", "jobs", "runs", "flaky",
                                  "failed", "retries")}
    devices = read_rows(db_path, dev_sql, {**counts, "device": "text", "rate": "real", "last": "text"})
    jobs = read_rows(db_path, job_sql, {**counts, "job": "text", "rate": "real", "failing_devices": "text"})
    return {"devices": devices, "jobs": jobs}


@dataclass
class RunRecord:
    """One row of the history listing."""

    id: int
    run_uuid: str
    started: str | None
    model: str | None
    target: str | None
    backend: str | None
    dtype: str | None
    label: str | None
    verdict: str | None
    exit_code: int | None
    bundle_sha256: str | None
    report_path: str | None
    cases: int | None
    outputs: int | None
    n_pass: int | None
    n_fail: int | None
    min_sqnr: float | None
    max_mae: float | None
    top1: float | None
    reference_top1: float | None
    agreement: float | None
    torch_version: str | None
    executorch_version: str | None
    inputs_sha256: str | None = None
    criteria_sha256: str | None = None
    status: str | None = None  # complete | interrupted (NULL: a row runner/history/store.py could not migrate)
    samples: int | None = None  # dataset runs: samples evaluated, the paired top-1 difference (target - float
    top1_diff: float | None = None  # reference) and its confidence interval (runner/judging/accuracy.py)
    top1_diff_low: float | None = None
    top1_diff_high: float | None = None

    @property
    def interrupted(self) -> bool:
        return self.status == INTERRUPTED

    @property
    def series(self) -> Any:
        """Which series the run belongs to (runner/history/series.py)."""

        return of_row(self)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)



def _list_query() -> Any:
    r, d, c = t.runs.alias("r"), t.datasets.alias("d"), t.case_outputs.alias("c")
    worst = {name: sa.select(fn(col)).where(c.c.run_id == r.c.id).scalar_subquery().label(name)
             for name, fn, col in (("min_sqnr", sa.func.min, c.c.sqnr), ("max_mae", sa.func.max, c.c.error_mae))}
    cols: list[Any] = [r.c[n] for n in ("id", "run_uuid", "started", "model", "target", "backend", "dtype", "label", "verdict",
                             "exit_code", "bundle_sha256", "report_path", "cases", "outputs", "n_pass", "n_fail")]
    cols += [worst["min_sqnr"], worst["max_mae"], d.c.top1, d.c.reference_top1, d.c.agreement]
    cols += [r.c[n] for n in ("torch_version", "executorch_version", "inputs_sha256", "criteria_sha256", "status")]
    cols += [d.c.samples, d.c.top1_diff, d.c.top1_diff_low, d.c.top1_diff_high]
    return sa.select(*cols).select_from(r.outerjoin(d, d.c.run_id == r.c.id)), r


def list_runs(
    db_path: Any,
    model: str | None = None,
    target: str | None = None,
    label: str | None = None,
    dtype: str | None = None,
    limit: int | None = 20,
    after_id: int | None = None,
    ids: list[int] | None = None,
) -> list[RunRecord]:
    """Runs newest first, filtered by exact model/target/label/dtype; `after_id`: only runs recorded
    after that run (the HUD reads only what is new), `ids`: only those runs."""
    if not exists(db_path) or (ids is not None and not ids):
        return []
    stmt, r = _list_query()
    for col, value in (("model", model), ("target", target), ("label", label), ("dtype", dtype)):
        if value is not None:
            stmt = stmt.where(r.c[col] == _sql_text(value))
    if after_id is not None:
        stmt = stmt.where(r.c.id > int(after_id))
    keep = None
    if ids is not None:
        clause, keep = by_ids(r.c.id, ids)
        stmt = stmt.where(clause)
    stmt = stmt.order_by(r.c.id.desc())
    if limit and keep is None:
        stmt = stmt.limit(int(limit))
    rows = read_rows(db_path, stmt, _RUN_TYPES)
    if keep is not None:
        rows = [row for row in rows if row["id"] in keep][:int(limit) if limit else None]
    for row in rows:
        if row["verdict"] is not None and row["verdict"] not in VERDICTS:
            raise HistoryError(f"history database {as_history(db_path)}: run #{row['id']}: column verdict: "
                               f"{str(row['verdict'])[:40]!r} is not one of {', '.join(VERDICTS)} (corrupted database)")
    return [RunRecord(**{**row, "started": utc_iso(row["started"])}) for row in rows]


_RUN_TYPES = {"id": "int", "exit_code": "int", "cases": "int", "outputs": "int", "n_pass": "int", "n_fail": "int",
              "samples": "int", **{k: "real" for k in ("top1_diff", "top1_diff_low", "top1_diff_high")},
              **{k: "text" for k in ("run_uuid", "started", "model", "target", "backend", "dtype", "label", "verdict",
                                     "bundle_sha256", "report_path", "torch_version", "executorch_version",
                                     "inputs_sha256", "criteria_sha256", "status")},
              **{k: "real" for k in ("min_sqnr", "max_mae", "top1", "reference_top1", "agreement")}}


def load_report(db_path: Any, run_id: int) -> Report:
    """The stored report of run `run_id`."""
    rows = read_rows(db_path, sa.select(t.runs.c.report_json).where(t.runs.c.id == int(run_id)))
    if not rows:
        raise HistoryError(f"no run #{run_id} in history {as_history(db_path)}")
    return stored_report(db_path, run_id, rows[0]["report_json"])


def stored_report(db_path: Any, run_id: int, text: Any) -> Report:
    """The report JSON stored with a run, through the one strict report reader
    (runner/report/model.py), its `run.history_id` set: a corrupted database row is one
    HistoryError naming the database, the run and the field, never an internal error."""

    where = f"history {as_history(db_path)}: run #{run_id}: report_json"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise HistoryError(f"{where}: not UTF-8 text") from None
    if not isinstance(text, str):
        raise HistoryError(f"{where}: expected the report's JSON text, got {type(text).__name__}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError, MemoryError) as exc:
        raise HistoryError(f"{where}: not a JSON report ({type(exc).__name__}: {str(exc)[:120]})") from None
    try:
        report = Report.from_json(data)
    except ReportError as exc:
        raise HistoryError(f"{where}: {exc}") from None
    report.run["history_id"] = run_id
    return report



def resolve_run(
    db_path: Any,
    ref: str,
    exclude_uuid: str | None = None,
    prefer: dict[str, str | None] | None = None,
) -> Report:
    """A baseline/compare reference -> its report.

    REF is a path to a report.json (or a directory holding one), a history run
    id (`12` or `#12`), a run uuid or unique uuid prefix (6+ hex digits), or a
    label (the newest run with that label that was not interrupted). `exclude_uuid`
    skips the run being judged, which may already be recorded under the same label.
    `prefer` ({"model", "target", "dtype", "inputs_sha256", "criteria_sha256"}: a series,
    runner/history/series.py) makes a label pick the newest run of that series first
    (`validate zoo --baseline v1` compares like with like); else the newest run with
    the label, which `--baseline` then refuses as another series, saying why.
    """
    path = Path(ref)
    if path.is_dir() and (path / "report.json").is_file():
        path = path / "report.json"
    if path.suffix == ".json" or path.is_file():
        if not path.exists():
            raise HistoryError(f"baseline report {ref} does not exist")
        try:
            return read_report(path)
        except ReportError as exc:
            raise HistoryError(f"cannot read report {ref}: {exc}") from None
    if db_path is None or not exists(db_path):
        raise HistoryError(f"{ref!r} is not a report file and there is no history database to look it up in")
    text = ref.lstrip("#")
    runs = t.runs

    def find(conn: Connection) -> Any:
        row = None
        if text.isdigit() and len(text) <= 18:  # a run id (64-bit integers)
            row = conn.execute(sa.select(runs.c.id).where(runs.c.id == int(text))).first()
        if row is None and len(text) >= 6 and all(c in "0123456789abcdef" for c in text.lower()):
            rows = conn.execute(sa.select(runs.c.id).where(runs.c.run_uuid.like(text.lower() + "%"))).fetchall()
            if len(rows) > 1:
                raise HistoryError(f"run id prefix {ref!r} is ambiguous ({len(rows)} runs)")
            row = rows[0] if rows else None
        if row is None:
            base = sa.select(runs.c.id).where(
                runs.c.label == _sql_text(ref), runs.c.run_uuid != (exclude_uuid or ""),
                sa.or_(runs.c.status.is_(None), runs.c.status != INTERRUPTED)).order_by(runs.c.id.desc()).limit(1)
            wanted = [(k, v) for k, v in (prefer or {}).items()
                      if k in ("model", "target", "dtype", "inputs_sha256", "criteria_sha256") and v]
            if wanted:
                row = conn.execute(base.where(*(runs.c[k] == _sql_text(v) for k, v in wanted))).first()
            if row is None:
                row = conn.execute(base).first()
        return row

    row = db_.read(db_path, find)
    if row is None:
        raise HistoryError(f"no run {ref!r} in history {as_history(db_path)} (not an id, run uuid or label)")
    return load_report(db_path, int(row[0]))


@dataclass
class TrendPoint:
    run_id: int
    started: str | None
    label: str | None
    value: float | None  # sqnr: mean over the case-outputs that did not match exactly (None: all exact)
    low: float | None = None  # worst case-output (sqnr: min, mae: max) or CI low for top1
    high: float | None = None
    reference: float | None = None  # top1 of the float reference
    target: str | None = None
    dtype: str | None = None
    exact: int = 0  # sqnr: case-outputs that matched exactly (SQNR infinite), left out of value/low
    counted: int = 0  # case-outputs (or datasets) behind value
    model: str | None = None
    inputs: str | None = None  # the run's inputs_sha256 and criteria_sha256: its series
    criteria: str | None = None

    @property
    def series(self) -> Any:
        """Which line the point belongs to: one per series (runner/history/series.py), never mixed."""

        return Series(self.model, self.target, self.dtype, self.inputs, self.criteria)




SQNR_CAP_DB = 200.0  # where plots draw an exact match; never averaged in
METRICS = ("sqnr", "mae", "max", "top1", "top5", "agreement")


def _trend_columns(r: Any) -> list[Any]:
    return [r.c.id, r.c.started, r.c.label, r.c.target, r.c.dtype, r.c.inputs_sha256, r.c.criteria_sha256]


def trend(
    db_path: Any,
    model: str,
    target: str | None = None,
    metric: str = "sqnr",
    dtype: str | None = None,
    limit: int = 200,
    series: Any = None,
) -> list[TrendPoint]:
    """One point per run (oldest first) of `metric` for this model, each carrying its
    target and dtype (`TrendPoint.series`): callers draw one line per target x dtype, or
    filter with `target`/`dtype`.

    sqnr/mae/max aggregate the run's case-outputs: mean, with the worst
    (min SQNR / max error) as `low`/`high`. An exact match (SQNR infinite: no error at
    all) has no finite SQNR to average: it is counted in `exact` and left out of the
    mean and the worst, so a run of exact matches does not read as "200 dB".
    top1/top5/agreement come from the dataset table.
    """
    if metric not in METRICS:
        raise HistoryError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    if not exists(db_path):
        return []
    r = t.runs.alias("r")
    where = _run_filters(r, [r.c.model == _sql_text(model)], target, dtype, series)
    if metric in ("sqnr", "mae", "max"):
        c = t.case_outputs.alias("c")
        if metric == "sqnr":
            inf = sa.literal(math.inf, sa.Float(precision=53))
            finite = sa.case((c.c.sqnr < inf, c.c.sqnr))  # exact matches (+inf) are not averaged
            figures = [sa.func.avg(finite).label("value"), sa.func.min(finite).label("worst"),
                       sa.cast(sa.func.sum(sa.case((c.c.sqnr >= inf, 1), else_=0)), sa.BigInteger).label("exact"),
                       sa.func.count(finite).label("counted")]
        else:
            col = c.c.error_mae if metric == "mae" else c.c.error_max
            worst = sa.func.min if metric == "sqnr" else sa.func.max
            figures = [sa.func.avg(col).label("value"), worst(col).label("worst"),
                       sa.literal(0, sa.BigInteger).label("exact"), sa.func.count(col).label("counted")]
        stmt = (sa.select(*_trend_columns(r), *figures).select_from(r.join(c, c.c.run_id == r.c.id))
                .where(*where).group_by(r.c.id))
    else:
        d = t.datasets.alias("d")
        ref = {"top1": d.c.reference_top1, "top5": d.c.reference_top5,
               "agreement": sa.null().cast(sa.Float(precision=53))}[metric]
        stmt = (sa.select(*_trend_columns(r), d.c[metric].label("value"), d.c.top1_diff_low, d.c.top1_diff_high,
                          ref.label("reference"))
                .select_from(r.join(d, d.c.run_id == r.c.id)).where(*where))
    stmt = stmt.order_by(r.c.id.desc()).limit(int(limit))
    rows = read_rows(db_path, stmt, {"id": "int", "started": "text", "label": "text", "target": "text",
                                     "dtype": "text", "value": "real", "worst": "real", "exact": "int",
                                     "counted": "int", "top1_diff_low": "real", "top1_diff_high": "real",
                                     "reference": "real", "inputs_sha256": "text", "criteria_sha256": "text"})
    points = []
    for row in reversed(rows):
        common = {"target": row["target"], "dtype": row["dtype"], "model": model, "inputs": row["inputs_sha256"],
                  "criteria": row["criteria_sha256"]}
        if metric in ("sqnr", "mae", "max"):
            p = TrendPoint(row["id"], utc_iso(row["started"]), row["label"], row["value"], exact=int(row["exact"] or 0),
                           counted=int(row["counted"] or 0), **common)
            if metric == "sqnr":
                p.low = row["worst"]
            else:
                p.high = row["worst"]
        else:
            p = TrendPoint(row["id"], utc_iso(row["started"]), row["label"], row["value"], reference=row["reference"],
                           counted=0 if row["value"] is None else 1, **common)
            if metric == "top1" and row["reference"] is not None and row["top1_diff_low"] is not None:
                # the CI is on (target - reference): show it around the target's top-1
                p.low = max(0.0, row["reference"] + row["top1_diff_low"])
                p.high = min(1.0, row["reference"] + row["top1_diff_high"])
        points.append(p)
    return points


def series_of(points: list[TrendPoint]) -> dict[tuple[str | None, str | None], list[TrendPoint]]:
    """Points grouped by target x dtype, in order of first appearance."""
    out: dict[tuple[str | None, str | None], list[TrendPoint]] = {}
    for p in points:
        out.setdefault(p.series, []).append(p)
    return out


# A `trend --metric` that names a performance figure: these aliases, or any figure name.
PERF_ALIASES = {"cycles": "inference_cpu_cycles", "npu-cycles": "npu_active_cycles", "latency": "execution_time",
                "memory": "method_allocator_used", "program-size": "pte_program_size"}



def perf_trend(
    db_path: Any,
    model: str,
    figure: str,
    target: str | None = None,
    dtype: str | None = None,
    phase: str | None = None,
    limit: int = 200,
    series: Any = None,
) -> tuple[list[TrendPoint], dict[str, Any]]:
    """One point per run (oldest first) of a perf figure (`figure`: a name, or an alias of
    PERF_ALIASES): the median over the run's cases, with the min and max over them as low/high.
    `phase` picks first or warm where the figure has both (default: warm if recorded, else the
    figure without a phase, else first). Returns (points, {"name", "unit", "kind", "phase"})."""
    name = PERF_ALIASES.get(figure, figure)
    if not exists(db_path):
        return [], {"name": name}
    r, p = t.runs.alias("r"), t.perf_figures.alias("p")
    where = _run_filters(r, [r.c.model == _sql_text(model), p.c.name == _sql_text(name)], target, dtype, series)
    stmt = (sa.select(*_trend_columns(r), p.c.phase, p.c.value, p.c.unit, p.c.kind)
            .select_from(r.join(p, p.c.run_id == r.c.id)).where(*where).order_by(r.c.id))
    rows = read_rows(db_path, stmt, {"id": "int", "started": "text", "label": "text", "target": "text",
                                     "dtype": "text", "phase": "text", "value": "real", "unit": "text",
                                     "kind": "text", "inputs_sha256": "text", "criteria_sha256": "text"})
    phases = {r["phase"] for r in rows}
    chosen = phase if phase is not None else next((p for p in ("warm", "", "first") if p in phases), "")
    if phase is not None and phase not in phases and rows:
        raise HistoryError(f"figure {name!r} has no {phase!r} phase in the history (has: "
                           f"{', '.join(sorted(p or 'none' for p in phases))})")
    runs: dict[int, dict[str, Any]] = {}
    info: dict[str, Any] = {"name": name, "phase": chosen or None}
    for row in rows:
        if row["phase"] != chosen or row["value"] is None:
            continue
        info.setdefault("unit", row["unit"])
        info.setdefault("kind", row["kind"])
        entry = runs.setdefault(row["id"], {"row": row, "values": []})
        entry["values"].append(float(row["value"]))
    from statistics import median

    points = []
    for run_id in sorted(runs)[-int(limit):]:
        row, values = runs[run_id]["row"], runs[run_id]["values"]
        points.append(TrendPoint(run_id, utc_iso(row["started"]), row["label"], float(median(values)), low=min(values),
                                 high=max(values), target=row["target"], dtype=row["dtype"], counted=len(values),
                                 model=model, inputs=row["inputs_sha256"], criteria=row["criteria_sha256"]))
    return points, info


_SEQUENCE_TYPES = {"run_id": "int", "method": "text", "sequence_index": "int", "name": "text", "verdict": "text",
                   "steps": "int", "first_divergence": "int", "greedy_agreement": "int",
                   **{k: "real" for k in ("perplexity_target", "perplexity_reference", "perplexity_ratio",
                                          "sqnr_worst", "sqnr_median")}}


def sequence_figures(db_path: Any, run_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The per-sequence figures (table sequence_figures) of these runs: run id -> one dict per
    sequence, in the report's order. Runs without sequences are absent."""
    if not run_ids or not exists(db_path):
        return {}
    q = t.sequence_figures
    out: dict[int, list[dict[str, Any]]] = {}
    ids = sorted({int(i) for i in run_ids})
    for start in range(0, len(ids), 500):  # bound the IN list (a HUD row of many commits)
        stmt = (sa.select(q).where(q.c.run_id.in_(ids[start:start + 500]))
                .order_by(q.c.run_id, q.c.sequence_index, q.c.method))
        for row in read_rows(db_path, stmt, _SEQUENCE_TYPES):
            out.setdefault(int(row["run_id"]), []).append(row)
    return out


def sequence_trend(
    db_path: Any,
    model: str,
    figure: str,
    target: str | None = None,
    dtype: str | None = None,
    limit: int = 200,
    series: Any = None,
) -> tuple[list[TrendPoint], dict[str, Any]]:
    """One point per run (oldest first) of a per-sequence figure (a name of
    runner/report/sequences.py's TREND_FIGURES): the median over the run's sequences, min..max as
    low/high. A sequence that never diverged counts its step count as its first divergence; an
    infinite figure (an exact sequence's SQNR) is left out of the median, as `trend --metric sqnr` does."""
    column, unit = SEQUENCE_FIGURES[figure]
    info: dict[str, Any] = {"name": figure, "unit": unit, "kind": "accuracy", "phase": None}
    if not exists(db_path):
        return [], info
    r, q = t.runs.alias("r"), t.sequence_figures.alias("q")
    value = sa.func.coalesce(q.c.first_divergence, q.c.steps) if column == "first_divergence" else q.c[column]
    where = _run_filters(r, [r.c.model == _sql_text(model)], target, dtype, series)
    stmt = (sa.select(*_trend_columns(r), value.label("value"))
            .select_from(r.join(q, q.c.run_id == r.c.id)).where(*where).order_by(r.c.id))
    rows = read_rows(db_path, stmt, {"id": "int", "started": "text", "label": "text", "target": "text",
                                     "dtype": "text", "value": "real", "inputs_sha256": "text",
                                     "criteria_sha256": "text"})
    runs: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row["value"] is None or not math.isfinite(float(row["value"])):
            continue  # no answer, or an SQNR of +inf (every step exact): not drawn as a number
        runs.setdefault(row["id"], {"row": row, "values": []})["values"].append(float(row["value"]))
    from statistics import median

    points = []
    for run_id in sorted(runs)[-int(limit):]:
        row, values = runs[run_id]["row"], runs[run_id]["values"]
        points.append(TrendPoint(run_id, utc_iso(row["started"]), row["label"], float(median(values)), low=min(values),
                                 high=max(values), target=row["target"], dtype=row["dtype"], counted=len(values),
                                 model=model, inputs=row["inputs_sha256"], criteria=row["criteria_sha256"]))
    return points, info


def flaky_outputs(db_path: Any, run_id: int) -> list[dict[str, Any]]:
    """The replay findings the history holds for one run (what a HUD shows as flaky vs wrong)."""
    q = t.replay_outputs
    stmt = (sa.select(q).where(q.c.run_id == int(run_id), q.c.finding.is_not(None))
            .order_by(q.c.method, q.c.case_index, q.c.output_index))
    return read_rows(db_path, stmt, {"runs": "int", "distinct_results": "int", "spread": "real", "flips": "int"})


def newest_run_of_bundle(db_path: Any, bundle_sha256: str) -> int | None:
    """The id of the newest run of the bundle with this digest, or None."""
    rows = read_rows(db_path, sa.select(t.runs.c.id).where(t.runs.c.bundle_sha256 == bundle_sha256)
                     .order_by(t.runs.c.id.desc()).limit(1), {"id": "int"})
    return int(rows[0]["id"]) if rows else None
