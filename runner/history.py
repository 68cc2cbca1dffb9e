"""The run history: every report (and accuracy run) recorded in one SQLite file.

Why SQLite: one file, no server, safe for several CI jobs on one machine. WAL
mode lets readers run beside a writer; writers take the lock up front
(`BEGIN IMMEDIATE`) with a busy timeout and retry with backoff when SQLite
still says "locked", so parallel runs never lose a record.

The full report JSON is stored with each run, so `compare` and `--baseline`
can judge against any recorded run without its report directory.

Path resolution (first that is set): `--history PATH`, `$BUNDLERUN_HISTORY`,
config `[history] path`, then `$XDG_DATA_HOME/bundlerun/history.sqlite`
(default `~/.local/share/bundlerun/history.sqlite`). `off`/`none` disables it.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from bundlerun.bundles.errors import BundlerunError, ConfigError

ENV_VAR = "BUNDLERUN_HISTORY"
DISABLED = ("off", "none", "false", "0", "")
SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 30_000
MAX_ATTEMPTS = 20


class HistoryError(BundlerunError):
    """The history database cannot be opened, written or queried."""


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
    report_json TEXT NOT NULL
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


def connect(db_path: str | Path) -> sqlite3.Connection:
    """Open (creating if needed) the history database in WAL mode."""
    db_path = Path(db_path)
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(db_path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise HistoryError(f"cannot open history database {db_path}: {exc}") from None
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
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    try:
        _retrying(init)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise HistoryError(f"history database {db_path} is not usable: {exc}") from None
    return conn


def _get(d: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f else None  # NaN -> NULL


def _run_row(report: dict[str, Any], report_path: str | None) -> dict[str, Any]:
    run = report.get("run") or {}
    bundle = report.get("bundle") or {}
    summary = report.get("summary") or {}
    counts = summary.get("counts") or {}
    versions = bundle.get("versions") or {}
    return {
        "run_uuid": run.get("id") or os.urandom(16).hex(),
        "started": run.get("started"),
        "finished": run.get("finished"),
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": _num(run.get("duration_s")),
        "bundle_sha256": bundle.get("sha256"),
        "bundle_path": bundle.get("path"),
        "model": bundle.get("model"),
        "target": _get(report, "target", "url") or bundle.get("built_for"),
        "backend": bundle.get("backend"),
        "dtype": bundle.get("dtype"),
        "tool_version": _get(report, "tool", "version"),
        "torch_version": versions.get("torch"),
        "executorch_version": versions.get("executorch"),
        "label": run.get("label"),
        "verdict": summary.get("verdict"),
        "exit_code": summary.get("exit_code"),
        "report_path": report_path or run.get("report_path"),
        "cases": summary.get("cases"),
        "outputs": summary.get("outputs"),
        "n_pass": counts.get("PASS"),
        "n_fail": counts.get("FAIL"),
        "n_error": counts.get("ERROR"),
        "n_timeout": counts.get("TIMEOUT"),
        "n_skip": counts.get("SKIP"),
        "report_json": json.dumps(report, allow_nan=True, default=str),
    }


def _output_rows(run_id: int, report: dict[str, Any]) -> Iterator[tuple]:
    for case in report.get("cases") or []:
        for out in case.get("outputs") or []:
            stats = out.get("stats") or {}
            yield (
                run_id,
                case.get("method", "forward"),
                int(case.get("case", 0)),
                int(out.get("index", 0)),
                out.get("name"),
                case.get("status"),
                out.get("verdict") or case.get("verdict"),
                _num(stats.get("sqnr")),
                _num(stats.get("error_mae")),
                _num(stats.get("error_max")),
                _num(stats.get("error_l2_norm")),
                _num(stats.get("cosine_similarity")),
                _num(stats.get("relative_frobenius")),
                _num(stats.get("psnr")),
                stats.get("mismatch_count"),
                json.dumps(out.get("failed") or [], default=str),
            )


def record_report(db_path: str | Path | None, report: dict[str, Any], report_path: str | Path | None = None) -> int | None:
    """Record one JSON report; returns the run's id in this database.

    Idempotent per report `run.id`: recording the same report twice returns the
    first id and stores nothing twice. `db_path` None (history turned off)
    records nothing and returns None.
    """
    if db_path is None:
        return None
    row = _run_row(report, str(report_path) if report_path else None)
    dataset = report.get("dataset") or None
    conn = connect(db_path)

    def write() -> int:
        conn.execute("BEGIN IMMEDIATE")
        try:
            existing = conn.execute("SELECT id FROM runs WHERE run_uuid = ?", (row["run_uuid"],)).fetchone()
            if existing is not None:
                conn.execute("COMMIT")
                return int(existing[0])
            cols = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            cur = conn.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", tuple(row.values()))
            run_id = int(cur.lastrowid)
            conn.executemany(
                "INSERT OR REPLACE INTO case_outputs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                list(_output_rows(run_id, report)),
            )
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
            conn.execute("COMMIT")
            return run_id
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    try:
        return _retrying(write)
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"cannot record run in {db_path}: {exc}") from None
    finally:
        conn.close()


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

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


_LIST_SQL = """
SELECT r.id, r.run_uuid, r.started, r.model, r.target, r.backend, r.dtype, r.label, r.verdict,
       r.exit_code, r.bundle_sha256, r.report_path, r.cases, r.outputs, r.n_pass, r.n_fail,
       (SELECT MIN(sqnr) FROM case_outputs c WHERE c.run_id = r.id) AS min_sqnr,
       (SELECT MAX(error_mae) FROM case_outputs c WHERE c.run_id = r.id) AS max_mae,
       d.top1, d.reference_top1, d.agreement, r.torch_version, r.executorch_version
FROM runs r LEFT JOIN datasets d ON d.run_id = r.id
"""


def list_runs(
    db_path: str | Path,
    model: str | None = None,
    target: str | None = None,
    label: str | None = None,
    dtype: str | None = None,
    limit: int | None = 20,
) -> list[RunRecord]:
    """Runs newest first, filtered by exact model/target/label/dtype."""
    if not Path(db_path).exists():
        return []
    where, args = [], []
    for col, value in (("r.model", model), ("r.target", target), ("r.label", label), ("r.dtype", dtype)):
        if value is not None:
            where.append(f"{col} = ?")
            args.append(value)
    sql = _LIST_SQL + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.id DESC"
    if limit:
        sql += f" LIMIT {int(limit)}"
    conn = connect(db_path)
    try:
        rows = _retrying(lambda: conn.execute(sql, args).fetchall())
    finally:
        conn.close()
    return [RunRecord(**dict(r)) for r in rows]


def load_report(db_path: str | Path, run_id: int) -> dict[str, Any]:
    """The stored JSON report of run `run_id`."""
    conn = connect(db_path)
    try:
        row = _retrying(lambda: conn.execute("SELECT report_json FROM runs WHERE id = ?", (run_id,)).fetchone())
    finally:
        conn.close()
    if row is None:
        raise HistoryError(f"no run #{run_id} in history {db_path}")
    report = json.loads(row[0])
    report.setdefault("run", {})["history_id"] = run_id
    return report


def resolve_run(
    db_path: str | Path | None,
    ref: str,
    exclude_uuid: str | None = None,
    prefer: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """A baseline/compare reference -> report dict.

    REF is a path to a report.json (or a directory holding one), a history run
    id (`12` or `#12`), a run uuid or unique uuid prefix (6+ hex digits), or a
    label (the newest run with that label). `exclude_uuid` skips the run being
    judged, which may already be recorded under the same label. `prefer`
    ({"model", "target", "dtype"}) makes a label pick the newest run of the same
    model/target/dtype first (`validate zoo --baseline v1` compares like with like).
    """
    path = Path(ref)
    if path.is_dir() and (path / "report.json").is_file():
        path = path / "report.json"
    if path.suffix == ".json" or path.is_file():
        from bundlerun.runner.report_model import ReportError, read_report

        if not path.exists():
            raise HistoryError(f"baseline report {ref} does not exist")
        try:
            return read_report(path).to_json()
        except ReportError as exc:
            raise HistoryError(f"cannot read report {ref}: {exc}") from None
    if db_path is None or not Path(db_path).exists():
        raise HistoryError(f"{ref!r} is not a report file and there is no history database to look it up in")
    text = ref.lstrip("#")
    conn = connect(db_path)
    try:
        row = None
        if text.isdigit():
            row = conn.execute("SELECT id FROM runs WHERE id = ?", (int(text),)).fetchone()
        if row is None and len(text) >= 6 and all(c in "0123456789abcdef" for c in text.lower()):
            rows = conn.execute("SELECT id FROM runs WHERE run_uuid LIKE ?", (text.lower() + "%",)).fetchall()
            if len(rows) > 1:
                raise HistoryError(f"run id prefix {ref!r} is ambiguous ({len(rows)} runs)")
            row = rows[0] if rows else None
        if row is None:
            base_sql, base_args = "SELECT id FROM runs WHERE label = ? AND run_uuid != ?", [ref, exclude_uuid or ""]
            wanted = [(k, v) for k, v in (prefer or {}).items() if k in ("model", "target", "dtype") and v]
            if wanted:
                sql = base_sql + "".join(f" AND {k} = ?" for k, _ in wanted) + " ORDER BY id DESC LIMIT 1"
                row = conn.execute(sql, base_args + [v for _, v in wanted]).fetchone()
            if row is None:
                row = conn.execute(base_sql + " ORDER BY id DESC LIMIT 1", base_args).fetchone()
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
    value: float | None
    low: float | None = None  # worst case-output (sqnr: min, mae: max) or CI low for top1
    high: float | None = None
    reference: float | None = None  # top1 of the float reference


SQNR_CAP_DB = 200.0
METRICS = ("sqnr", "mae", "max", "top1", "top5", "agreement")


def trend(
    db_path: str | Path,
    model: str,
    target: str | None = None,
    metric: str = "sqnr",
    dtype: str | None = None,
    limit: int = 200,
) -> list[TrendPoint]:
    """One point per run (oldest first) of `metric` for this model (and target).

    sqnr/mae/max aggregate the run's case-outputs: mean, with the worst
    (min SQNR / max error) as `low`/`high`. top1/top5/agreement come from the
    dataset table.
    """
    if metric not in METRICS:
        raise HistoryError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    if not Path(db_path).exists():
        return []
    where, args = ["r.model = ?"], [model]
    if target:
        where.append("r.target = ?")
        args.append(target)
    if dtype:
        where.append("r.dtype = ?")
        args.append(dtype)
    w = " AND ".join(where)
    if metric in ("sqnr", "mae", "max"):
        col = {"sqnr": "sqnr", "mae": "error_mae", "max": "error_max"}[metric]
        worst = "MIN" if metric == "sqnr" else "MAX"
        # An exact match has SQNR inf; cap it so averages and plots stay finite.
        expr = f"MIN(c.{col}, {SQNR_CAP_DB})" if metric == "sqnr" else f"c.{col}"
        sql = (
            f"SELECT r.id, r.started, r.label, AVG({expr}) AS value, {worst}({expr}) AS worst "
            f"FROM runs r JOIN case_outputs c ON c.run_id = r.id WHERE {w} "
            f"GROUP BY r.id ORDER BY r.id DESC LIMIT {int(limit)}"
        )
    else:
        col = {"top1": "top1", "top5": "top5", "agreement": "agreement"}[metric]
        ref = {"top1": "reference_top1", "top5": "reference_top5", "agreement": "NULL"}[metric]
        sql = (
            f"SELECT r.id, r.started, r.label, d.{col} AS value, d.top1_diff_low, d.top1_diff_high, "
            f"{ref} AS reference FROM runs r JOIN datasets d ON d.run_id = r.id WHERE {w} "
            f"ORDER BY r.id DESC LIMIT {int(limit)}"
        )
    conn = connect(db_path)
    try:
        rows = _retrying(lambda: conn.execute(sql, args).fetchall())
    finally:
        conn.close()
    points = []
    for r in reversed(rows):
        if metric in ("sqnr", "mae", "max"):
            worst = r["worst"]
            p = TrendPoint(r["id"], r["started"], r["label"], r["value"])
            if metric == "sqnr":
                p.low = worst
            else:
                p.high = worst
        else:
            p = TrendPoint(r["id"], r["started"], r["label"], r["value"], reference=r["reference"])
            if metric == "top1" and r["reference"] is not None and r["top1_diff_low"] is not None:
                # the CI is on (target - reference): show it around the target's top-1
                p.low = max(0.0, r["reference"] + r["top1_diff_low"])
                p.high = min(1.0, r["reference"] + r["top1_diff_high"])
        points.append(p)
    return points
