"""One code path to the history database, SQLite or PostgreSQL, through SQLAlchemy Core.

- Engines: one per history per process (forked children drop the parent's). SQLite opens a
  connection per use (no pool: no file handle outlives a call, as before) in WAL mode with a busy
  timeout; a write transaction takes the lock up front (`BEGIN IMMEDIATE`). PostgreSQL keeps a
  small pool and checks a pooled connection before use (a restarted server is reconnected to).
- Schema: the first open in a process brings the database to Alembic's head revision
  (runner/history/migrations) under a lock (SQLite: the write lock; PostgreSQL: an advisory lock),
  so many writers opening a new history at once create it once. A file from before Alembic
  (`meta.schema_version` 1 or 2, no `alembic_version`) is stamped at its revision and upgraded in
  place. When the revision is already head, Alembic is not imported.
- Transactions: `write(db, fn)` runs fn(connection) in one transaction, retried with jittered
  backoff when SQLite says "locked"/"busy" or PostgreSQL reports a serialization failure, deadlock,
  or a unique-key race (the retry finds the other writer's row): a writer that dies mid-transaction
  leaves nothing, the database rolls it back.
- Errors: any database error is one HistoryError line naming the history with its password
  redacted (runner/history/location.py), never SQLAlchemy's statement dump.
"""

from __future__ import annotations

import os
import random
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import Connection, Engine

from bundlerun.bundles.errors import BundlerunError
from bundlerun.runner.history.location import History, HistoryServer, as_history, redact

HEAD = "0003"  # the newest revision in runner/history/migrations/versions
BUSY_TIMEOUT_MS = 30_000
MAX_ATTEMPTS = 20
CONNECT_TIMEOUT_S = 10
_LOCK_KEY = 0x62756E646C  # pg_advisory_xact_lock: "bundl", the schema upgrade's lock

T = TypeVar("T")


class HistoryError(BundlerunError):
    """The history database cannot be opened, written or queried."""

    kind = "history"


_engines: dict[str, Engine] = {}
_ready: set[str] = set()
_guard = threading.Lock()


def _forget_after_fork() -> None:
    for engine in _engines.values():
        engine.dispose(close=False)  # the parent's connections stay the parent's
    _engines.clear()
    _ready.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _key(db: History) -> str:
    return db.url if isinstance(db, HistoryServer) else str(Path(db).absolute())


def _server_url(db: HistoryServer) -> sa.URL:
    url = sa.make_url(db.url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def _sqlite_engine(path: Path) -> Engine:
    engine = sa.create_engine(f"sqlite+pysqlite:///{path}", poolclass=sa.NullPool,
                              connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "isolation_level": None,
                                            "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")  # may be refused (no shared memory): rollback journal is correct too
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:  # pysqlite's own BEGIN is deferred and late: say it ourselves
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("history_write") else "BEGIN")

    return engine


def engine_for(db: Any) -> Engine:
    """The process's engine for this history (created on first use)."""
    where = as_history(db)
    key = _key(where)
    with _guard:
        engine = _engines.get(key)
        if engine is None:
            if isinstance(where, HistoryServer):
                try:
                    url = _server_url(where)
                except (exc.ArgumentError, ValueError) as e:
                    raise HistoryError(f"history {where}: not a database URL ({redact(str(e))})") from None
                engine = sa.create_engine(url, pool_size=2, max_overflow=4, pool_pre_ping=True,
                                          connect_args={"connect_timeout": CONNECT_TIMEOUT_S,
                                                        "application_name": "bundlerun"})
            else:
                try:
                    Path(where).parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise HistoryError(f"cannot open history database {where}: {e}{disk_hint(where)}") from None
                engine = _sqlite_engine(Path(where))
            _engines[key] = engine
    return engine


def disk_hint(db: History) -> str:
    """SQLite words a full disk as "disk I/O error" at times (WAL's shared memory): say so plainly."""
    if isinstance(db, HistoryServer):
        return ""
    import shutil

    try:
        free = shutil.disk_usage(Path(db).parent).free
    except OSError:
        return ""
    return f" (no space left on the disk: {free} bytes free)" if free < 1 << 20 else ""


def reason(error: BaseException, db: History) -> str:
    """A database error as one line: the driver's own first line (no SQL, no parameters, no
    SQLAlchemy background link), any password in it redacted."""
    orig = getattr(error, "orig", None) or error
    text = " ".join(str(orig).split()) or type(orig).__name__
    if isinstance(db, HistoryServer) and db.password:
        text = text.replace(db.password, "***")
    return redact(text)[:400]


def _retryable(error: BaseException) -> bool:
    orig = getattr(error, "orig", None)
    if isinstance(error, exc.OperationalError) and orig is not None and type(orig).__module__.startswith("sqlite3"):
        msg = str(orig).lower()
        return "locked" in msg or "busy" in msg
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code in ("40001", "40P01", "23505")  # serialization failure, deadlock, a unique-key race


def _retrying(fn: Callable[[], T]) -> T:
    delay = 0.01
    for attempt in range(MAX_ATTEMPTS):
        try:
            return fn()
        except exc.DBAPIError as error:
            if not _retryable(error) or attempt == MAX_ATTEMPTS - 1:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def _revision(conn: Connection) -> str | None:
    """The Alembic revision the database is at, None when it has no alembic_version table."""
    names = set(sa.inspect(conn).get_table_names())
    if "alembic_version" not in names:
        return None
    row = conn.execute(sa.text("SELECT version_num FROM alembic_version")).first()
    return str(row[0]) if row else None


def _legacy_revision(conn: Connection) -> str | None:
    """The revision a file from before Alembic is at (its `meta.schema_version`), or None when the
    database is new (no `runs` table)."""
    names = set(sa.inspect(conn).get_table_names())
    if "runs" not in names:
        return None
    row = conn.execute(sa.text("SELECT value FROM meta WHERE key = 'schema_version'")).first() \
        if "meta" in names else None
    return "0001" if row is None or str(row[0]) == "1" else "0002"


def _upgrade(conn: Connection) -> None:
    """Bring the schema to HEAD inside the caller's locked transaction."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
    current = _revision(conn)
    if current == HEAD:
        return
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    config.attributes["connection"] = conn
    if current is None:
        legacy = _legacy_revision(conn)
        if legacy is not None:
            command.stamp(config, legacy)
    command.upgrade(config, "head")


class _Behind(Exception):
    """A read found the schema behind HEAD: upgrade under the write lock, then read again."""


def _at_head(db: History, conn: Connection) -> bool:
    """Whether the schema is at HEAD, asked inside the caller's transaction. A server's answer is
    kept for the process; an SQLite file is asked every time (one small query: a file can be
    replaced or copied over between two calls)."""
    key = _key(db)
    if key in _ready:
        return True
    if conn.dialect.name == "sqlite":
        try:
            row = conn.exec_driver_sql("SELECT version_num FROM alembic_version").first()
        except exc.OperationalError as error:
            if "no such table" not in str(getattr(error, "orig", error)):
                raise
            row = None
        return row is not None and str(row[0]) == HEAD
    with conn.begin_nested():  # a missing table aborts a PostgreSQL transaction: only this savepoint
        current = _revision(conn)
    if current == HEAD:
        _ready.add(key)
    return current == HEAD


def _upgrade_now(engine: Engine) -> None:
    with engine.connect().execution_options(history_write=True) as conn:
        with conn.begin():
            _upgrade(conn)


def _fail(error: BaseException, db: History, doing: str) -> HistoryError:
    return HistoryError(f"{doing.format(db=db)}: {reason(error, db)}{disk_hint(db)}")


@contextmanager
def _usable(db: History) -> Iterator[None]:
    """A database error while opening (the schema check or upgrade) says "not usable"; lock
    contention is left to the retry around it."""
    try:
        yield
    except exc.DBAPIError as error:
        if _retryable(error):
            raise
        raise _fail(error, db, "history database {db} is not usable") from None


@contextmanager
def _errors(db: History, doing: str) -> Iterator[None]:
    try:
        yield
    except HistoryError:
        raise
    except exc.SQLAlchemyError as error:
        raise _fail(error, db, doing) from None
    except ModuleNotFoundError as error:  # a server URL without the [postgres] extra's driver
        raise HistoryError(f"{doing.format(db=db)}: the database driver is not installed ({error.name}: "
                           "pip install 'bundlerun[postgres]')") from None


def _transaction(db: Any, fn: Callable[[Connection], T], writing: bool, doing: str) -> T:
    where = as_history(db)
    with _errors(where, "history database {db} is not usable"):
        engine = engine_for(where)

    def attempt() -> T:
        with _usable(where):
            conn = engine.connect().execution_options(history_write=writing)
        with conn:
            with _usable(where):
                tx = conn.begin()
            with tx:
                with _usable(where):
                    ready = _at_head(where, conn)
                if not ready:
                    if not writing:
                        raise _Behind()
                    with _usable(where):
                        _upgrade(conn)
                return fn(conn)

    with _errors(where, doing):
        try:
            return _retrying(attempt)
        except _Behind:
            with _usable(where):
                _retrying(lambda: _upgrade_now(engine))
            return _retrying(attempt)


def write(db: Any, fn: Callable[[Connection], T], doing: str = "cannot record run in {db}") -> T:
    """fn(connection) in one write transaction (the schema brought to HEAD first, in the same
    transaction), retried on lock contention; all of it or nothing."""
    return _transaction(db, fn, True, doing)


def read(db: Any, fn: Callable[[Connection], T], doing: str = "history database {db} cannot be read") -> T:
    """fn(connection) in one read transaction (a consistent snapshot)."""
    return _transaction(db, fn, False, doing)


def dialect(db: Any) -> str:
    """`sqlite` or `postgresql`, without opening anything."""
    return "postgresql" if isinstance(as_history(db), HistoryServer) else "sqlite"
