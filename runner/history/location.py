"""Where the history lives: an SQLite file (the embedded default) or a database server's URL.

`--history`, `$BUNDLERUN_HISTORY` and the project config's `[history] path` each take either a path
(`~/h.sqlite`, `sqlite:///abs/h.sqlite`) or a server URL (`postgresql://user@host:5432/db`,
`postgresql://user@/db?host=/run/postgresql`). A server URL may carry a password; it lives only in
`HistoryServer.url`: the object prints, formats and serialises as the URL with the password
replaced by `***` (`shown`), so an error line, a report warning, a log or the HUD that names the
history never carries the credential. Nothing here imports SQLAlchemy: the CLI resolves the
history before it knows whether it will open it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from bundlerun.bundles.errors import ConfigError

ENV_VAR = "BUNDLERUN_HISTORY"
DISABLED = ("off", "none", "false", "0", "")
SERVER_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class HistoryServer:
    """A history on a database server. `url` holds the credential; str()/repr()/format() never do."""

    url: str = field(repr=False)

    @property
    def shown(self) -> str:
        return redact(self.url)

    def __str__(self) -> str:
        return self.shown

    def __repr__(self) -> str:
        return f"HistoryServer({self.shown!r})"

    def __format__(self, spec: str) -> str:
        return format(self.shown, spec)

    @property
    def password(self) -> str | None:
        try:
            value = urlsplit(self.url).password
        except ValueError:
            return None
        return unquote(value) if value else None


History = Path | HistoryServer  # what every history function takes


def redact(text: str) -> str:
    """A URL with its password (and any `password=` query value) replaced by `***`."""
    text = re.sub(r"(://[^/@:\s]*:)[^@/\s]*@", r"\1***@", text)
    return re.sub(r"(?i)(password=)[^&\s]*", r"\1***", text)


def parse(value: str | os.PathLike[str]) -> History:
    """A path or URL -> a Path (SQLite file) or a HistoryServer; another scheme is a ConfigError."""
    text = os.fspath(value).strip()
    match = _SCHEME.match(text)
    if match is None:
        return Path(os.path.expanduser(text))
    scheme = match.group(1).lower()
    if scheme in ("sqlite", "sqlite+pysqlite"):
        rest = text[match.end():]
        if not rest.startswith("/") or rest == "/":
            raise ConfigError(f"history URL {redact(text)!r}: say sqlite:///PATH (a file), e.g. sqlite:///tmp/h.sqlite")
        return Path(os.path.expanduser(rest[1:] if rest.startswith("//") else rest))
    if scheme in SERVER_SCHEMES:
        return HistoryServer(text)
    raise ConfigError(f"history {redact(text)!r}: unsupported database scheme {scheme!r} "
                      f"(a path, sqlite:///PATH or postgresql://USER@HOST/DB)")


def as_history(value: Any) -> History:
    """What the history functions accept (a Path, a str path or URL, a HistoryServer) -> History."""
    if isinstance(value, (Path, HistoryServer)):
        return value
    return parse(value)


def default_history_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "bundlerun" / "history.sqlite"


def resolve_history_path(flag: Any = None, config: dict[str, Any] | None = None) -> History | None:
    """Where the history lives (`--history`, `$BUNDLERUN_HISTORY`, config `[history] path`, the
    default file), or None when recording is turned off."""
    for value in (flag, os.environ.get(ENV_VAR), ((config or {}).get("history") or {}).get("path")):
        if value is None:
            continue
        if isinstance(value, HistoryServer):
            return value
        if not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"[history] path must be a string, got {type(value).__name__}")
        text = os.fspath(value).strip()
        if text.lower() in DISABLED:
            return None
        return parse(text)
    return default_history_path()


def exists(db: Any) -> bool:
    """Whether there is a history to read: an SQLite file that exists (reading never creates one), or
    any server (opening it creates the tables)."""
    where = as_history(db)
    return isinstance(where, HistoryServer) or where.exists()


def is_server(db: Any) -> bool:
    return isinstance(db, HistoryServer) or (isinstance(db, str) and isinstance(parse(db), HistoryServer))
