"""The farm gateway's wire: length-prefixed pickles over a unix socket, and where that socket lives.

Both ends are bundlerun of the same code (the socket's name carries the code hash) run by the same
user: the socket is in a 0700 folder of the user's cache (or of the temp dir where the cache's path
is too long for a socket's name), created 0600, and the gateway accepts only
peers of its own uid (SO_PEERCRED), so a pickle comes from nobody else. No Ray import here: the CLI
side of the gateway (runner/farm/gateway.py) must start in milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
import stat
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any

from bundlerun.bundles.cache_dirs import cache_root
from bundlerun.bundles.errors import ConfigError

_HEADER = struct.Struct("!Q")
MAX_MESSAGE = 1 << 31  # a bundle travels in a submit: bundlerun's own bound against a garbled length


SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes on Linux (unix(7)), one of them the NUL


def _private_dir(d: Path) -> Path:
    """`d` as a 0700 folder of this user's; a folder someone else owns (or a symlink) is refused."""
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise ConfigError(f"the farm gateway's folder {d} is not a folder of this user's: remove it and run again")
    os.chmod(d, 0o700)
    return d


def gateway_dir() -> Path:
    """The user's cache; where that path is too long for a unix socket's name (a deep $HOME or
    $XDG_CACHE_HOME), a short private folder in the temp dir, one per cache root."""
    d = cache_root() / "farm-gateway"
    if len(os.fsencode(d / "0123456789abcdef.sock")) > SUN_PATH_MAX:
        root = hashlib.sha256(os.fsencode(cache_root())).hexdigest()[:12]
        d = Path(tempfile.gettempdir()) / f"bundlerun-gw-{os.getuid()}-{root}"
    return _private_dir(d)


def socket_path(address: str, code: str) -> Path:
    """One gateway per cluster address and code hash (runner/farm/ray_workers.py code_hash)."""
    key = hashlib.sha256(f"{address}\0{code}".encode()).hexdigest()[:16]
    return gateway_dir() / f"{key}.sock"


def send(sock: socket.socket, obj: Any, lock: threading.Lock | None = None) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if lock is None:
        sock.sendall(_HEADER.pack(len(data)) + data)
    else:
        with lock:
            sock.sendall(_HEADER.pack(len(data)) + data)


def _exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> Any:
    """The next message, or None when the other end closed."""
    head = _exact(sock, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise ConnectionError(f"farm gateway: a message of {size} bytes (garbled stream)")
    body = _exact(sock, size)
    if body is None:
        return None
    return pickle.loads(body)


def same_user(conn: socket.socket) -> bool:
    """The peer runs as this process's uid (Linux SO_PEERCRED; elsewhere the 0700 folder guards)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()
