"""The run history: every report (and accuracy run) recorded in one SQLite file.

Why SQLite: one file, no server, safe for several CI jobs on one machine. WAL
mode lets readers run beside a writer; writers take the lock up front
(`BEGIN IMMEDIATE`) with a busy timeout and retry with backoff when SQLite
still says "locked", so parallel runs never lose a record.

The full report JSON is stored with each run, so `compare` and `--baseline`
can judge against any recorded run without its report directory. Reports come in
and go out as the typed `Report` (runner/report/model.py): JSON only in the
`report_json` column, read back through `Report.from_json`, which checks it.

Path resolution (first that is set): `--history PATH`, `$BUNDLERUN_HISTORY`,
config `[history] path`, then `$XDG_DATA_HOME/bundlerun/history.sqlite`
(default `~/.local/share/bundlerun/history.sqlite`). `off`/`none` disables it.

Times (`started`, `finished`, `recorded`) are stored as UTC ISO-8601 with the
offset (`+00:00`). Rows recorded before that (a time without an offset) are read
as UTC; `history` shows local time with its offset (`--utc` for UTC).

Over 500 lines on purpose: the schema, the writes and the queries of one SQLite file, which share
its connection and lock/retry discipline; tags and the HUD's queries are runner/history/tags.py.
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from bundlerun.bundles.errors import BundlerunError, ConfigError
from bundlerun.runner.history import commits
from bundlerun.runner.judging.outcome import VERDICTS
from bundlerun.runner.judging.replay import history_rows  # --replay: flaky vs wrong numerics per output
from bundlerun.runner.report.model import Report
from bundlerun.targets.base import Verdict

ENV_VAR = "BUNDLERUN_HISTORY"
DISABLED = ("off", "none", "false", "0", "")
SCHEMA_VERSION = 2  # 2: the series columns and the run's status (_migrate)
# The columns a run's series is read from (runner/history/series.py) and its status: `complete`, or
# `interrupted` (Ctrl-C/SIGTERM: no summary figures recorded). Added to a version-1 database by _migrate.
SERIES_COLUMNS = ("inputs_sha256", "criteria_sha256", "program_sha256", "status")
INTERRUPTED = "interrupted"
BUSY_TIMEOUT_MS = 30_000
MAX_ATTEMPTS = 20


class HistoryError(BundlerunError):
    """The history database cannot be opened, written or queried."""

    kind = "history"


def default_history_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "bundlerun" / "history.sqlite"


def resolve_history_path(flag: str | None = None, config: dict[str, Any] | None = None) -> Path | None:
    """Where the history lives, or None when recording is turned off."""
    for value in (flag, os.environ.get(ENV_VAR), ((config or {}).get("history") or {}).get("path")):
        if value is None:
            continue
        if not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"[history] path must be a string, got {type(value).__name__}")
        text = os.fspath(value).strip()
        if text.lower() in DISABLED:
            return None
        return Path(os.path.expanduser(text))
    return default_history_path()


resolve_db_path = resolve_history_path  # the name runner/cli.py uses


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_uuid TEXT UNIQUE NOT NULL,
    started TEXT, finished TEXT, recorded TEXT NOT NULL, duration_s REAL,
    bundle_sha256 TEXT, bundle_path TEXT, model TEXT, target TEXT, backend TEXT, dtype TEXT,
    tool_version TEXT, torch_version TEXT, executorch_version TEXT,
    label TEXT, verdict TEXT, exit_code INTEGER, report_path TEXT,
    cases INTEGER, outputs INTEGER, n_pass INTEGER, n_fail INTEGER, n_error INTEGER,
    n_timeout INTEGER, n_skip INTEGER,
    report_json TEXT NOT NULL,
    inputs_sha256 TEXT, criteria_sha256 TEXT, program_sha256 TEXT, status TEXT
);
CREATE INDEX IF NOT EXISTS runs_model_target ON runs (model, target, id);
CREATE INDEX IF NOT EXISTS runs_label ON runs (label, id);
CREATE TABLE IF NOT EXISTS case_outputs (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    method TEXT NOT NULL, case_index INTEGER NOT NULL, output_index INTEGER NOT NULL,
    name TEXT, case_status TEXT, verdict TEXT,
    sqnr REAL, error_mae REAL, error_max REAL, error_l2_norm REAL, cosine_similarity REAL,
    relative_frobenius REAL, psnr REAL, mismatch_count INTEGER, failed TEXT,
    PRIMARY KEY (run_id, method, case_index, output_index)
);
CREATE TABLE IF NOT EXISTS datasets (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT, samples INTEGER, top1 REAL, top5 REAL, reference_top1 REAL, reference_top5 REAL,
    top1_diff REAL, top1_diff_low REAL, top1_diff_high REAL, agreement REAL
);
CREATE TABLE IF NOT EXISTS farm_attempts (
    farm_uuid TEXT NOT NULL, job TEXT NOT NULL, attempt INTEGER NOT NULL,
    run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
    url TEXT, device TEXT, node TEXT, verdict TEXT, exit_code INTEGER, error_kinds TEXT,
    retried INTEGER, final INTEGER, flaky INTEGER, elapsed_s REAL, recorded TEXT,
    PRIMARY KEY (farm_uuid, job, attempt)
);
CREATE INDEX IF NOT EXISTS farm_attempts_job ON farm_attempts (job, farm_uuid);
CREATE TABLE IF NOT EXISTS perf_figures (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    method TEXT NOT NULL, case_index INTEGER NOT NULL, name TEXT NOT NULL, phase TEXT NOT NULL DEFAULT '',
    value REAL, unit TEXT, kind TEXT, per_inference REAL, samples INTEGER, spread REAL,
    PRIMARY KEY (run_id, method, case_index, name, phase)
);
CREATE INDEX IF NOT EXISTS perf_figures_name ON perf_figures (name, run_id);
CREATE TABLE IF NOT EXISTS run_tags (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    source TEXT, flow TEXT, operator TEXT, test TEXT, subtest INTEGER,
    commit_sha TEXT, commit_time TEXT, commit_source TEXT, dirty INTEGER,
    suite_result TEXT, suite_detail TEXT, suite_error TEXT
);
CREATE TABLE IF NOT EXISTS replay_outputs (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    method TEXT NOT NULL, case_index INTEGER NOT NULL, output_index INTEGER NOT NULL, name TEXT,
    runs INTEGER, distinct_results INTEGER, spread REAL, flips INTEGER, finding TEXT, verdicts TEXT,
    PRIMARY KEY (run_id, method, case_index, output_index)
);
"""


def _retrying(fn, *args):
    """Run fn(*args), retrying on SQLITE_BUSY/LOCKED with jittered backoff."""
    delay = 0.01
    for attempt in range(MAX_ATTEMPTS):
        try:
            return fn(*args)
        except sqlite3.OperationalError as exc:
            msg = str(exc).lower()
            if ("locked" not in msg and "busy" not in msg) or attempt == MAX_ATTEMPTS - 1:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


_KINDS = {"text": (str,), "int": (int,), "real": (int, float)}


def read_rows(db_path: str | Path, sql: str, args: Any = (), types: dict[str, str] | None = None) -> list[sqlite3.Row]:
    """Rows of a read query, each column named in `types` checked ("text", "int", "real"; NULL is
    fine). SQLite stores what it is given, so a corrupted or edited database can hold text where a
    number goes: that, and a database that is not one or lacks a table, is one HistoryError
    naming the database, the run and the column, never an internal error."""
    conn = connect(db_path)
    try:
        rows = _retrying(lambda: conn.execute(sql, args).fetchall())
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"history database {db_path} cannot be read: {exc}") from None
    finally:
        conn.close()
    for row in rows:
        keys = row.keys()
        for column, kind in (types or {}).items():
            if column not in keys:
                continue
            value = row[column]
            if value is not None and (isinstance(value, bool) or not isinstance(value, _KINDS[kind])
                                      or (kind == "real" and isinstance(value, float) and value != value)):
                run = f"run #{row['id']}: " if "id" in keys else ""
                shown = repr(value)[:60]
                raise HistoryError(f"history database {db_path}: {run}column {column}: expected "
                                   f"{ {'int': 'a whole number', 'real': 'a number'}.get(kind, 'text')}, got {shown} (corrupted "
                                   "database)")
    return rows
def _disk_hint(db_path: str | Path) -> str:
    """SQLite words a full disk as "disk I/O error" at times (WAL's shared memory): say so plainly."""
    import shutil

    try:
        free = shutil.disk_usage(Path(db_path).parent).free
    except OSError:
        return ""
    return f" (no space left on the disk: {free} bytes free)" if free < 1 << 20 else ""


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo a failed transaction without hiding why it failed: SQLite has already rolled back after
    some errors (a full disk: SQLITE_FULL), and a second ROLLBACK would raise "no transaction is
    active" in place of the cause."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def connect(db_path: str | Path) -> sqlite3.Connection:
    """Open (creating if needed) the history database in WAL mode."""
    db_path = Path(db_path)
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(db_path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise HistoryError(f"cannot open history database {db_path}: {exc}{_disk_hint(db_path)}") from None
    conn.row_factory = sqlite3.Row

    def init() -> None:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # WAL may be refused (e.g. no shared memory); rollback journal is still correct.
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            _migrate(conn)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    try:
        _retrying(init)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise HistoryError(f"history database {db_path} is not usable: {exc}{_disk_hint(db_path)}") from None
    return conn


def _migrate(conn: sqlite3.Connection) -> None:
    """Version 1 -> 2, inside connect()'s transaction, once (a later open finds the columns): add the
    series columns and fill them from each run's stored report, as record_reports would have; a run
    whose report says it was interrupted gets the status and loses its summary figures (counts,
    verdict, per-output, perf and dataset rows: its report_json keeps every finished case). A row
    whose report cannot be read keeps NULLs, which read as "not recorded" (runner/history/series.py)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    missing = [c for c in SERIES_COLUMNS if c not in have]
    if not missing:
        return
    for column in missing:
        conn.execute(f"ALTER TABLE runs ADD COLUMN {column} TEXT")
    updates, stopped = [], []
    for run_id, text in conn.execute("SELECT id, report_json FROM runs").fetchall():
        try:
            fields = _series_fields(Report.from_json(json.loads(text)))
        except Exception:  # noqa: BLE001 - an unreadable row is reported when read, never here
            continue
        updates.append((*(fields[c] for c in SERIES_COLUMNS), run_id))
        if fields["status"] == INTERRUPTED:
            stopped.append((run_id,))
    conn.executemany(f"UPDATE runs SET {', '.join(f'{c} = ?' for c in SERIES_COLUMNS)} WHERE id = ?", updates)
    conn.executemany(f"UPDATE runs SET {', '.join(f'{c} = NULL' for c in _SUMMARY_COLUMNS)} WHERE id = ?", stopped)
    for table in _FIGURE_TABLES:
        conn.executemany(f"DELETE FROM {table} WHERE run_id = ?", stopped)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


# What an interrupted run does not record: figures over the cases that happened to finish.
_SUMMARY_COLUMNS = ("verdict", "cases", "outputs", "n_pass", "n_fail", "n_error", "n_timeout", "n_skip")
_FIGURE_TABLES = ("case_outputs", "perf_figures", "datasets", "replay_outputs")


def _series_fields(report: Report) -> dict[str, Any]:
    """The series columns of a run (runner/history/series.py) and its status."""
    from bundlerun.runner.history.series import of_report

    ident = of_report(report)
    return {"inputs_sha256": ident.inputs, "criteria_sha256": ident.criteria,
            "program_sha256": report.bundle.get("program_sha256"),
            "status": INTERRUPTED if report.summary.interrupted else "complete"}


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


def _run_filters(where: list[str], args: list[Any], target: str | None, dtype: str | None,
                 series: Any = None) -> tuple[list[str], list[Any]]:
    """WHERE clauses (and their arguments) narrowed to one target and one dtype when given, or to
    one series (runner/history/series.py: its target, dtype, inputs and criteria; a hash the series lacks
    matches only runs that lack it too); never an interrupted run."""
    where.append(f"(r.status IS NULL OR r.status != '{INTERRUPTED}')")
    if series is not None:
        target, dtype = series.target, series.dtype
        for column, value in (("r.inputs_sha256", series.inputs), ("r.criteria_sha256", series.criteria)):
            where.append(f"{column} IS ?")
            args.append(_sql_text(value))
    for column, value in (("r.target", target), ("r.dtype", dtype)):
        if value or (series is not None and value is None):
            where.append(f"{column} IS ?")
            args.append(_sql_text(value))
    return where, args


def _sql_text(value: Any) -> Any:
    """Strings as SQLite can store them: a lone surrogate (a label from a non-UTF-8 argv, a
    `\\ud800` in a JSON manifest) becomes its `\\udXXX` text instead of failing the write."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
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


def record_report(db_path: str | Path | None, report: Report, report_path: str | Path | None = None,
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


def record_reports(db_path: str | Path, items: list[tuple[Report, str | Path | None, dict[str, Any] | None]]
                   ) -> list[int]:
    """Record many (report, report_path, tags) in one transaction (an import of hundreds of
    suite results: one connection, one commit); the run ids, in order. Idempotent as record_report."""

    prepared = []
    for report, report_path, tags in items:
        row, tagged = tag_row(_run_row(report, str(report_path) if report_path else None), report, tags)
        prepared.append((report, row, tagged, report.dataset or None))
    conn = connect(db_path)

    def write() -> list[int]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            ids = [one(*item) for item in prepared]
            conn.execute("COMMIT")
            return ids
        except BaseException:
            _rollback(conn)
            raise

    def one(report: Report, row: dict[str, Any], tagged: dict[str, Any], dataset: Any) -> int:
        """One run's rows, inside write()'s transaction."""
        existing = conn.execute("SELECT id FROM runs WHERE run_uuid = ?", (row["run_uuid"],)).fetchone()
        if existing is not None:
            return int(existing[0])
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        cur = conn.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", tuple(row.values()))
        run_id = int(cur.lastrowid)
        if row["status"] == INTERRUPTED:  # recorded as interrupted, with no figures (_FIGURE_TABLES)
            dataset = None
        else:
            conn.executemany(
                "INSERT OR REPLACE INTO case_outputs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                list(_output_rows(run_id, report)),
            )
            conn.executemany("INSERT OR REPLACE INTO perf_figures VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                             list(_perf_rows(run_id, report)))

            conn.executemany("INSERT OR REPLACE INTO replay_outputs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                             history_rows(run_id, report))
            if report.sequences:  # LLM bundles: per-sequence figures, trended like perf figures
                from bundlerun.runner.report.sequences import history_rows as sequence_rows

                conn.executemany("INSERT OR REPLACE INTO perf_figures VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                                 sequence_rows(run_id, report))
        conn.execute(f"INSERT OR REPLACE INTO run_tags (run_id, {', '.join(tagged)}) "
                     f"VALUES (?{', ?' * len(tagged)})", (run_id, *tagged.values()))
        if dataset:
            ci = dataset.get("top1_diff_ci") or [None, None]
            conn.execute(
                "INSERT INTO datasets VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    dataset.get("name"),
                    dataset.get("samples"),
                    _num(dataset.get("top1")),
                    _num(dataset.get("top5")),
                    _num(dataset.get("reference_top1")),
                    _num(dataset.get("reference_top5")),
                    _num(dataset.get("top1_diff")),
                    _num(ci[0]),
                    _num(ci[1]),
                    _num(dataset.get("agreement")),
                ),
            )
        return run_id

    try:
        return _retrying(write)
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"cannot record run in {db_path}: {exc}{_disk_hint(db_path)}") from None
    finally:
        conn.close()



def record_farm_attempts(db_path: str | Path | None, farm_uuid: str, job: str, attempts: list[dict[str, Any]],
                         run_id: int | None = None) -> None:
    """Every attempt of one farm job (runner/farm): device, exit code, failure kinds; `final` marks
    the attempt whose report is the job's run (`run_id`), `flaky` a job that passed after a failed
    attempt. Idempotent per (farm, job, attempt)."""
    if db_path is None:
        return
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = [(_sql_text(farm_uuid), _sql_text(job), int(a.get("attempt", 0)), run_id if a.get("final") else None,
             _sql_text(a.get("url")), _sql_text(a.get("device")),
             _sql_text((a.get("node") or {}).get("ray_node_id") or (a.get("node") or {}).get("host")),
             a.get("verdict"), a.get("exit_code"), json.dumps(a.get("error_kinds") or []), int(bool(a.get("retried"))),
             int(bool(a.get("final"))), int(bool(a.get("flaky"))), _num(a.get("elapsed_s")), now) for a in attempts]
    conn = connect(db_path)

    def write() -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("INSERT OR REPLACE INTO farm_attempts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    try:
        _retrying(write)
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"cannot record farm attempts in {db_path}: {exc}") from None
    finally:
        conn.close()


def flaky_stats(db_path: str | Path, limit: int | None = 20) -> dict[str, list[dict[str, Any]]]:
    """Devices by infrastructure-failure rate (failed attempts that exited 2 / attempts on the
    device) and jobs by flake rate (farm runs where the job passed only after a retry / farm runs
    of the job), worst first; only devices and jobs with at least one failed attempt or flake."""
    if not Path(db_path).exists():
        return {"devices": [], "jobs": []}
    lim = f" LIMIT {int(limit)}" if limit else ""
    dev_sql = ("SELECT COALESCE(device, url) AS device, COUNT(*) AS attempts, "
               "SUM(exit_code = 2) AS infra_failures, SUM(exit_code = 1) AS numerical_failures, "
               "SUM(exit_code = 2) * 1.0 / COUNT(*) AS rate, COUNT(DISTINCT job) AS jobs, MAX(recorded) AS last "
               "FROM farm_attempts WHERE attempt > 0 GROUP BY COALESCE(device, url) HAVING infra_failures > 0 "
               "ORDER BY rate DESC, attempts DESC, device" + lim)
    job_sql = ("SELECT job, COUNT(DISTINCT farm_uuid) AS runs, "
               "COUNT(DISTINCT CASE WHEN flaky = 1 THEN farm_uuid END) AS flaky, "
               "COUNT(DISTINCT CASE WHEN final = 1 AND exit_code != 0 THEN farm_uuid END) AS failed, "
               "SUM(retried) AS retries, "
               "COUNT(DISTINCT CASE WHEN flaky = 1 THEN farm_uuid END) * 1.0 / COUNT(DISTINCT farm_uuid) AS rate, "
               "GROUP_CONCAT(DISTINCT CASE WHEN exit_code = 2 THEN COALESCE(device, url) END) AS failing_devices "
               "FROM farm_attempts GROUP BY job HAVING flaky > 0 OR retries > 0 "
               "ORDER BY rate DESC, retries DESC, job" + lim)
    counts = {k: "int" for k in ("attempts", "infra_failures", "numerical_failures", "jobs", "runs", "flaky",
                                  "failed", "retries")}
    devices = [dict(r) for r in read_rows(db_path, dev_sql, (), {**counts, "device": "text", "rate": "real",
                                                                 "last": "text"})]
    jobs = [dict(r) for r in read_rows(db_path, job_sql, (), {**counts, "job": "text", "rate": "real",
                                                              "failing_devices": "text"})]
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

    @property
    def interrupted(self) -> bool:
        return self.status == INTERRUPTED

    @property
    def series(self) -> Any:
        """Which series the run belongs to (runner/history/series.py)."""
        from bundlerun.runner.history.series import of_row

        return of_row(self)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


_LIST_SQL = """
SELECT r.id, r.run_uuid, r.started, r.model, r.target, r.backend, r.dtype, r.label, r.verdict,
       r.exit_code, r.bundle_sha256, r.report_path, r.cases, r.outputs, r.n_pass, r.n_fail,
       (SELECT MIN(sqnr) FROM case_outputs c WHERE c.run_id = r.id) AS min_sqnr,
       (SELECT MAX(error_mae) FROM case_outputs c WHERE c.run_id = r.id) AS max_mae,
       d.top1, d.reference_top1, d.agreement, r.torch_version, r.executorch_version,
       r.inputs_sha256, r.criteria_sha256, r.status
FROM runs r LEFT JOIN datasets d ON d.run_id = r.id
"""


def list_runs(
    db_path: str | Path,
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
    if not Path(db_path).exists():
        return []
    where, args = [], []
    for col, value in (("r.model", model), ("r.target", target), ("r.label", label), ("r.dtype", dtype)):
        if value is not None:
            where.append(f"{col} = ?")
            args.append(_sql_text(value))
    if after_id is not None:
        where.append("r.id > ?")
        args.append(int(after_id))
    if ids is not None:
        if not ids:
            return []
        where.append(f"r.id IN ({', '.join(str(int(i)) for i in ids)})")
    sql = _LIST_SQL + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.id DESC"
    if limit:
        sql += f" LIMIT {int(limit)}"
    rows = read_rows(db_path, sql, args, _RUN_TYPES)
    for r in rows:
        if r["verdict"] is not None and r["verdict"] not in VERDICTS:
            raise HistoryError(f"history database {db_path}: run #{r['id']}: column verdict: {str(r['verdict'])[:40]!r} "
                               f"is not one of {', '.join(VERDICTS)} (corrupted database)")
    return [RunRecord(**{**dict(r), "started": utc_iso(r["started"])}) for r in rows]


_RUN_TYPES = {"id": "int", "exit_code": "int", "cases": "int", "outputs": "int", "n_pass": "int", "n_fail": "int",
              **{k: "text" for k in ("run_uuid", "started", "model", "target", "backend", "dtype", "label", "verdict",
                                     "bundle_sha256", "report_path", "torch_version", "executorch_version",
                                     "inputs_sha256", "criteria_sha256", "status")},
              **{k: "real" for k in ("min_sqnr", "max_mae", "top1", "reference_top1", "agreement")}}


def load_report(db_path: str | Path, run_id: int) -> Report:
    """The stored report of run `run_id`."""
    rows = read_rows(db_path, "SELECT report_json FROM runs WHERE id = ?", (run_id,))
    row = rows[0] if rows else None
    if row is None:
        raise HistoryError(f"no run #{run_id} in history {db_path}")
    return stored_report(db_path, run_id, row[0])


def stored_report(db_path: str | Path, run_id: int, text: Any) -> Report:
    """The report JSON stored with a run, through the one strict report reader
    (runner/report/model.py), its `run.history_id` set: a corrupted database row is one
    HistoryError naming the database, the run and the field, never an internal error."""
    from bundlerun.runner.report.model import ReportError

    where = f"history {db_path}: run #{run_id}: report_json"
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
    db_path: str | Path | None,
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
        from bundlerun.runner.report.model import ReportError, read_report

        if not path.exists():
            raise HistoryError(f"baseline report {ref} does not exist")
        try:
            return read_report(path)
        except ReportError as exc:
            raise HistoryError(f"cannot read report {ref}: {exc}") from None
    if db_path is None or not Path(db_path).exists():
        raise HistoryError(f"{ref!r} is not a report file and there is no history database to look it up in")
    text = ref.lstrip("#")
    conn = connect(db_path)
    try:
        row = None
        if text.isdigit() and len(text) <= 18:  # a run id (SQLite integers are 64-bit)
            row = conn.execute("SELECT id FROM runs WHERE id = ?", (int(text),)).fetchone()
        if row is None and len(text) >= 6 and all(c in "0123456789abcdef" for c in text.lower()):
            rows = conn.execute("SELECT id FROM runs WHERE run_uuid LIKE ?", (text.lower() + "%",)).fetchall()
            if len(rows) > 1:
                raise HistoryError(f"run id prefix {ref!r} is ambiguous ({len(rows)} runs)")
            row = rows[0] if rows else None
        if row is None:
            base_sql = (f"SELECT id FROM runs WHERE label = ? AND run_uuid != ? "
                        f"AND (status IS NULL OR status != '{INTERRUPTED}')")
            base_args = [_sql_text(ref), exclude_uuid or ""]
            wanted = [(k, v) for k, v in (prefer or {}).items()
                      if k in ("model", "target", "dtype", "inputs_sha256", "criteria_sha256") and v]
            if wanted:
                sql = base_sql + "".join(f" AND {k} = ?" for k, _ in wanted) + " ORDER BY id DESC LIMIT 1"
                row = conn.execute(sql, base_args + [_sql_text(v) for _, v in wanted]).fetchone()
            if row is None:
                row = conn.execute(base_sql + " ORDER BY id DESC LIMIT 1", base_args).fetchone()
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"history database {db_path} cannot be read: {exc}") from None
    finally:
        conn.close()
    if row is None:
        raise HistoryError(f"no run {ref!r} in history {db_path} (not an id, run uuid or label)")
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
        from bundlerun.runner.history.series import Series

        return Series(self.model, self.target, self.dtype, self.inputs, self.criteria)


_TREND_COLUMNS = "r.id, r.started, r.label, r.target, r.dtype, r.inputs_sha256, r.criteria_sha256"
SQNR_CAP_DB = 200.0  # where plots draw an exact match; never averaged in
METRICS = ("sqnr", "mae", "max", "top1", "top5", "agreement")


def trend(
    db_path: str | Path,
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
    if not Path(db_path).exists():
        return []
    where, args = _run_filters(["r.model = ?"], [_sql_text(model)], target, dtype, series)
    w = " AND ".join(where)
    if metric in ("sqnr", "mae", "max"):
        col = {"sqnr": "sqnr", "mae": "error_mae", "max": "error_max"}[metric]
        worst = "MIN" if metric == "sqnr" else "MAX"
        if metric == "sqnr":
            finite = "CASE WHEN c.sqnr < ? THEN c.sqnr END"  # ? = +inf: exact matches are not averaged
            sql = (
                f"SELECT {_TREND_COLUMNS}, AVG({finite}) AS value, MIN({finite}) AS worst, "
                f"SUM(CASE WHEN c.sqnr >= ? THEN 1 ELSE 0 END) AS exact, COUNT({finite}) AS counted "
                f"FROM runs r JOIN case_outputs c ON c.run_id = r.id WHERE {w} "
                f"GROUP BY r.id ORDER BY r.id DESC LIMIT {int(limit)}"
            )
            args = [math.inf] * 4 + args
        else:
            sql = (
                f"SELECT {_TREND_COLUMNS}, AVG(c.{col}) AS value, {worst}(c.{col}) AS worst, "
                f"0 AS exact, COUNT(c.{col}) AS counted "
                f"FROM runs r JOIN case_outputs c ON c.run_id = r.id WHERE {w} "
                f"GROUP BY r.id ORDER BY r.id DESC LIMIT {int(limit)}"
            )
    else:
        col = {"top1": "top1", "top5": "top5", "agreement": "agreement"}[metric]
        ref = {"top1": "reference_top1", "top5": "reference_top5", "agreement": "NULL"}[metric]
        sql = (
            f"SELECT {_TREND_COLUMNS}, d.{col} AS value, d.top1_diff_low, "
            f"d.top1_diff_high, {ref} AS reference FROM runs r JOIN datasets d ON d.run_id = r.id WHERE {w} "
            f"ORDER BY r.id DESC LIMIT {int(limit)}"
        )
    rows = read_rows(db_path, sql, args, {"id": "int", "started": "text", "label": "text", "target": "text",
                                          "dtype": "text", "value": "real", "worst": "real", "exact": "int",
                                          "counted": "int", "top1_diff_low": "real", "top1_diff_high": "real",
                                          "reference": "real", "inputs_sha256": "text", "criteria_sha256": "text"})
    points = []
    for r in reversed(rows):
        common = {"target": r["target"], "dtype": r["dtype"], "model": model, "inputs": r["inputs_sha256"],
                  "criteria": r["criteria_sha256"]}
        if metric in ("sqnr", "mae", "max"):
            p = TrendPoint(r["id"], utc_iso(r["started"]), r["label"], r["value"], exact=int(r["exact"] or 0),
                           counted=int(r["counted"] or 0), **common)
            if metric == "sqnr":
                p.low = r["worst"]
            else:
                p.high = r["worst"]
        else:
            p = TrendPoint(r["id"], utc_iso(r["started"]), r["label"], r["value"], reference=r["reference"],
                           counted=0 if r["value"] is None else 1, **common)
            if metric == "top1" and r["reference"] is not None and r["top1_diff_low"] is not None:
                # the CI is on (target - reference): show it around the target's top-1
                p.low = max(0.0, r["reference"] + r["top1_diff_low"])
                p.high = min(1.0, r["reference"] + r["top1_diff_high"])
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
    db_path: str | Path,
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
    if not Path(db_path).exists():
        return [], {"name": name}
    where, args = _run_filters(["r.model = ?", "p.name = ?"], [_sql_text(model), _sql_text(name)], target, dtype,
                               series)
    sql = (f"SELECT {_TREND_COLUMNS}, p.phase, p.value, p.unit, p.kind "
           f"FROM runs r JOIN perf_figures p ON p.run_id = r.id WHERE {' AND '.join(where)} ORDER BY r.id")
    rows = read_rows(db_path, sql, args, {"id": "int", "started": "text", "label": "text", "target": "text",
                                          "dtype": "text", "phase": "text", "value": "real", "unit": "text",
                                          "kind": "text", "inputs_sha256": "text", "criteria_sha256": "text"})
    phases = {r["phase"] for r in rows}
    chosen = phase if phase is not None else next((p for p in ("warm", "", "first") if p in phases), "")
    if phase is not None and phase not in phases and rows:
        raise HistoryError(f"figure {name!r} has no {phase!r} phase in the history (has: "
                           f"{', '.join(sorted(p or 'none' for p in phases))})")
    runs: dict[int, dict[str, Any]] = {}
    info: dict[str, Any] = {"name": name, "phase": chosen or None}
    for r in rows:
        if r["phase"] != chosen or r["value"] is None:
            continue
        info.setdefault("unit", r["unit"])
        info.setdefault("kind", r["kind"])
        entry = runs.setdefault(r["id"], {"row": r, "values": []})
        entry["values"].append(float(r["value"]))
    from statistics import median

    points = []
    for run_id in sorted(runs)[-int(limit):]:
        r, values = runs[run_id]["row"], runs[run_id]["values"]
        points.append(TrendPoint(run_id, utc_iso(r["started"]), r["label"], float(median(values)), low=min(values),
                                 high=max(values), target=r["target"], dtype=r["dtype"], counted=len(values),
                                 model=model, inputs=r["inputs_sha256"], criteria=r["criteria_sha256"]))
    return points, info


def flaky_outputs(db_path: str | Path, run_id: int) -> list[dict[str, Any]]:
    """The replay findings the history holds for one run (what a HUD shows as flaky vs wrong)."""
    rows = read_rows(db_path, "SELECT * FROM replay_outputs WHERE run_id = ? AND finding IS NOT NULL "
                              "ORDER BY method, case_index, output_index", (int(run_id),),
                     types={"runs": "int", "distinct_results": "int", "spread": "real", "flips": "int"})
    return [dict(r) for r in rows]
