"""A private PostgreSQL server for the tests, from Debian's `postgresql` package (scripts/setup.sh).

`PgServer.start()`: initdb into a temporary folder (superuser `bundlerun` with a password, TCP
auth by SCRAM, the unix socket trusted), then `postgres` itself as our child process (no pg_ctl
daemon: the process we start is the one we stop and reap), listening on 127.0.0.1 at a free port
and on a socket in the folder. `stop()` asks for a fast shutdown (SIGINT) and waits; `kill()`
is the server going away at once (SIGKILL of the postmaster and every backend). As root
(CI containers) the server runs as the `postgres` user (initdb refuses root) through setpriv.

The pytest fixture `pg` (module scope) is one server per test module, always stopped.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

USER = "bundlerun"


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (scripts/setup.sh installs it)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--", *argv]


@dataclass
class PgServer:
    root: Path
    port: int
    password: str
    proc: subprocess.Popen | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, db: str = "postgres", password: bool = True) -> str:
        """postgresql://bundlerun:PASSWORD@127.0.0.1:PORT/DB (TCP, the password in the URL)."""
        secret = f":{self.password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{db}"

    def socket_url(self, db: str = "postgres") -> str:
        """Over the unix socket, no password (the socket is trusted)."""
        return f"postgresql://{USER}@/{db}?host={self.socket_dir}&port={self.port}"

    @classmethod
    def start(cls) -> "PgServer":
        """A new server in its own folder under the temp dir (not pytest's: that one is private to
        root, and the server runs as `postgres` there), removed by stop()."""
        root = Path(tempfile.mkdtemp(prefix="bundlerun-pg-"))
        server = cls(root, _free_port(), secrets.token_urlsafe(18))
        data, pwfile = root / "data", root / "pw"
        server.socket_dir.mkdir()
        pwfile.write_text(server.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
            for p in (server.socket_dir, pwfile):
                shutil.chown(p, "postgres", "postgres")
        bindir = _bindir()
        init = subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-U", USER, "-A", "trust",
                                               "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8",
                                               "--no-sync", "--locale=C.UTF-8"]),
                              capture_output=True, text=True, timeout=300)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr[-2000:]}")
        pwfile.unlink()
        log = open(server.log, "ab")
        try:
            server.proc = subprocess.Popen(
                _as_server_user([str(bindir / "postgres"), "-D", str(data), "-p", str(server.port),
                                 "-k", str(server.socket_dir), "-c", "listen_addresses=127.0.0.1",
                                 "-c", "max_connections=100", "-c", "fsync=on", "-c", "shared_buffers=32MB"]),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        server.wait_ready()
        return server

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            ready = subprocess.run([str(_bindir() / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                                   timeout=30)
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"postgres did not accept connections in {timeout:.0f} s: {self.log.read_text()[-2000:]}")

    def create_database(self, name: str) -> str:
        """A fresh database; its URL (with the password)."""
        import psycopg

        with psycopg.connect(host=str(self.socket_dir), port=self.port, user=USER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def kill(self) -> None:
        """The server goes away at once: SIGKILL to the postmaster's whole process group."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: running transactions rolled back), then reaped; SIGKILL if it hangs."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        try:  # backends of a killed postmaster exit on their own: none may outlive the test
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def pg():
    server = PgServer.start()
    try:
        yield server
    finally:
        server.stop()
