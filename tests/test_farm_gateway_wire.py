"""Where the farm gateway's socket lives (runner/farm/gateway_wire.py): a unix socket's name holds at
most 107 bytes, so a deep cache root (a CI job's HOME under a long workspace path, pytest's tmp_path)
moves it to a short private folder instead of failing with "AF_UNIX path too long". Real sockets."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def short_dir():
    """A folder whose path is short (pytest's tmp_path under xdist is itself too deep for a socket)."""
    d = Path(tempfile.mkdtemp(prefix="brg", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)

from bundlerun.bundles.errors import ConfigError
from bundlerun.runner.farm import gateway_wire


def test_a_short_cache_root_keeps_the_socket_in_the_cache(short_dir, monkeypatch):
    monkeypatch.setenv("BUNDLERUN_CACHE", str(short_dir / "c"))
    path = gateway_wire.socket_path("127.0.0.1:6379", "abc")
    assert path.parent == short_dir / "c" / "farm-gateway"
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_a_deep_cache_root_gets_a_short_private_folder_a_socket_can_bind(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    monkeypatch.setenv("BUNDLERUN_CACHE", str(deep))
    path = gateway_wire.socket_path("127.0.0.1:6379", "abc")
    assert len(os.fsencode(path)) <= gateway_wire.SUN_PATH_MAX
    assert not str(path).startswith(str(deep))
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700 and os.stat(path.parent).st_uid == os.getuid()
    # another cache root (another HOME) gets another folder: two test sessions never share a gateway
    monkeypatch.setenv("BUNDLERUN_CACHE", str(deep) + "2")
    assert gateway_wire.socket_path("127.0.0.1:6379", "abc").parent != path.parent
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))  # the name fits: no "AF_UNIX path too long"
    finally:
        sock.close()
        path.unlink()


def test_a_symlinked_gateway_folder_is_refused(short_dir, monkeypatch):
    monkeypatch.setenv("BUNDLERUN_CACHE", str(short_dir / "c"))
    (short_dir / "c").mkdir()
    (short_dir / "elsewhere").mkdir()
    (short_dir / "c" / "farm-gateway").symlink_to(short_dir / "elsewhere")
    with pytest.raises(ConfigError, match="not a folder of this user's"):
        gateway_wire.socket_path("127.0.0.1:6379", "abc")


def test_a_new_gateway_waits_for_an_exiting_one_instead_of_leaving_its_command_waiting(short_dir):
    """A gateway that a command's --release-workers stopped unlinks its socket and keeps the socket's
    lock through ray.shutdown(); the gateway the next command starts meanwhile used to exit at once
    (lock busy) and leave that command waiting 300 s for a socket nobody would open. It now waits and
    takes the lock once the old one lets go. Real flock on a real file, from a second open file."""
    import fcntl
    import threading

    from bundlerun.runner.farm import gateway_server

    path = short_dir / "g.sock"
    old = open(str(path) + ".lock", "w")
    fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the exiting gateway
    threading.Timer(0.3, old.close).start()
    new = open(str(path) + ".lock", "w")
    try:
        assert gateway_server._take_lock(new, path, wait_s=30) is True
    finally:
        new.close()


def test_a_new_gateway_leaves_a_serving_one_alone(short_dir):
    import fcntl

    from bundlerun.runner.farm import gateway_server

    path = short_dir / "g.sock"
    old = open(str(path) + ".lock", "w")
    fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    new = open(str(path) + ".lock", "w")
    try:
        assert gateway_server._take_lock(new, path, wait_s=30) is False  # the command connects to the one serving
    finally:
        new.close()
        srv.close()
        old.close()
