"""`--executor ray:ADDRESS` through the farm gateway: a command that never imports Ray.

The gateway (runner/farm/gateway_server.py) is a detached process, one per cluster address and code
hash, that is the Ray driver for every `bundlerun farm` against that cluster; this side finds it by
its socket (runner/farm/gateway_wire.py), starts it when there is none (the first command pays
`import ray` and the connect, in the gateway), and then sends each attempt and gets its report back
as the Ray executor did. A second command starts its first job in well under a second
(bench/bench_farm_scale.py: second-command start, side by side with the in-process driver).

`BUNDLERUN_FARM_GATEWAY=0` makes the command its own driver again (runner/farm/executors.py
RayExecutor), e.g. where a command must leave no process behind.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.runner.farm.gateway_wire import recv, send, socket_path
from bundlerun.runner.farm.ray_workers import code_hash

START_TIMEOUT_S = 300.0  # a loaded head takes long to import Ray and connect (bundlerun's own bound)


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _start(address: str, path: Path) -> tuple[socket.socket, int]:
    """Start a gateway for `address` (detached: it outlives this command) and connect to it."""
    log = path.with_suffix(".log")
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "bundlerun.runner.farm.gateway_server", "--address", address,
                                 "--socket", str(path)], stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock, proc.pid
        code = proc.poll()
        if code not in (None, 0):  # 0: another gateway for this socket was starting: wait for it
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise ConfigError(f"cannot start the farm gateway for the Ray cluster at {address}: "
                              f"{tail[0].replace('GATEWAY-ERROR ', '')} (log: {log})")
        time.sleep(0.05)
    raise ConfigError(f"the farm gateway for {address} did not come up in {START_TIMEOUT_S:.0f} s (log: {log})")


class GatewayExecutor:
    """The executor interface of RayExecutor (submit, resources, describe, after_run, close), over the gateway."""

    name = "ray"
    ship = True  # the attempt runs in the cluster: the bundle travels, the report comes back

    def __init__(self, address: str, release_workers: bool = False) -> None:
        t0 = time.perf_counter()
        self.address = address
        self.release_workers = release_workers
        self.path = socket_path(address, code_hash())
        self.timing: dict[str, float] = {"code_hash_s": time.perf_counter() - t0}
        sock = _connect(self.path)
        self.started = sock is None
        if sock is None:
            sock, _pid = _start(address, self.path)
        self.sock = sock
        self._out = threading.Lock()
        self._ids = itertools.count(1)
        self._futures: dict[int, Future] = {}
        self._replies: dict[str, Future] = {}
        self._reader = threading.Thread(target=self._read, name="bundlerun-farm-gateway", daemon=True)
        self._reader.start()
        hello = self._ask({"op": "hello"}, "hello")
        self.timing["gateway_s"] = time.perf_counter() - t0
        self.hello = hello
        self._resources: set[str] = set(hello["resources"])
        self._last_stats: dict[str, Any] | None = None
        self._closed = False

    def _read(self) -> None:
        why = "the farm gateway closed the connection"
        try:
            while True:
                msg = recv(self.sock)
                if msg is None:
                    break
                if msg.get("op") == "done":
                    fut = self._futures.pop(msg["id"], None)
                    if fut is not None:
                        if "error" in msg:
                            fut.set_exception(RuntimeError(msg["error"]))
                        else:
                            fut.set_result(msg["report"])
                else:
                    reply = self._replies.pop(msg.get("op", ""), None)
                    if reply is not None:
                        reply.set_result(msg)
        except (OSError, ValueError, EOFError, ConnectionError) as exc:
            why = f"the farm gateway connection broke: {type(exc).__name__}: {exc}"
        for fut in list(self._futures.values()) + list(self._replies.values()):
            if not fut.done():
                fut.set_exception(ConnectionError(why))  # each attempt a crash: the scheduler retries it
        self._futures.clear()
        self._replies.clear()

    def _ask(self, msg: dict[str, Any], answer: str, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        fut: Future = Future()
        self._replies[answer] = fut
        try:
            send(self.sock, msg, self._out)
            return fut.result(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - one line
            raise ConfigError(f"farm gateway for {self.address} ({self.path}): {type(exc).__name__}: {exc}") from None

    @property
    def capacity(self) -> int | None:
        return None  # as RayExecutor: the scheduler sends a device job only to a free device

    def resources(self) -> set[str] | None:
        return self._resources

    def submit(self, payload: dict[str, Any], device: str | None) -> Future:
        job = next(self._ids)
        fut: Future = Future()
        self._futures[job] = fut
        try:
            send(self.sock, {"op": "submit", "id": job, "payload": payload, "device": device}, self._out)
        except OSError as exc:
            self._futures.pop(job, None)
            fut.set_exception(ConnectionError(f"the farm gateway connection broke: {exc}"))
        return fut

    def _stats(self) -> None:
        if self._last_stats is None:
            self._last_stats = self._ask({"op": "stats"}, "stats", timeout=60)

    def after_run(self) -> dict[str, Any]:
        """The actors this command reused or created (asked for in close(): run_farm calls this after it)."""
        if self._last_stats is None and not self._closed:
            self._stats()
        stats = self._last_stats or {"reused": [], "created": []}
        timing = dict(self.timing)
        if stats.get("first_actor_lookup_s") is not None:
            timing["first_actor_lookup_s"] = stats["first_actor_lookup_s"]
        workers = {"namespace": "bundlerun-farm", "code": self.hello["code"], "reused": stats["reused"],
                   "created": stats["created"], "stale_killed": self.hello["stale_killed"],
                   "released": self.release_workers}
        return {"workers": workers, "timing": {k: round(v, 4) for k, v in timing.items()}}

    def describe(self) -> dict[str, Any]:
        gateway = {"pid": self.hello["pid"], "socket": str(self.path), "started_by_this_command": self.started,
                   "startup": {k: round(v, 4) for k, v in self.hello["timing"].items()}}
        return {**self.hello["describe"], "gateway": gateway,
                "workers": {"code": self.hello["code"], "reused": [], "created": [],
                            "stale_killed": self.hello["stale_killed"], "released": self.release_workers},
                "timing": {k: round(v, 4) for k, v in self.timing.items()}}

    def close(self, cancel: bool = False) -> None:
        """`cancel`: the farm was stopped; the gateway stops this command's running attempts.
        `release_workers`: the gateway kills the devices' actors and exits."""
        try:
            if cancel:
                self._ask({"op": "cancel"}, "cancelled", timeout=60)
            self._stats()
            if self.release_workers:
                self._ask({"op": "release"}, "released", timeout=120)
        except ConfigError:
            if not cancel:
                raise
        finally:
            self._closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def enabled() -> bool:
    return os.environ.get("BUNDLERUN_FARM_GATEWAY", "1").strip() not in ("0", "false", "no", "off")
