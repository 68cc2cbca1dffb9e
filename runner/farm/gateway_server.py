"""The farm gateway process: one Ray driver that outlives `bundlerun farm` commands.

`import ray` and connecting a driver to the cluster cost seconds (bench/bench_farm_scale.py), paid
by every `bundlerun farm --executor ray:ADDRESS` when the command itself was the driver. The first
such command starts this process (runner/farm/gateway.py), detached, for its cluster address and
code hash; it connects once, holds the devices' detached actors (runner/farm/ray_workers.py), and
serves every later command over a unix socket (runner/farm/gateway_wire.py): a command sends
attempts and gets their reports back without importing Ray.

Lifetime: it exits when no command has been connected for IDLE_S (bundlerun's own choice: a farm's
commands in one session reuse it, a machine is not left with a driver for days), on a command's
`--release-workers` (after killing the actors), on SIGTERM, or when its cluster goes away. One per
socket: a lock file beside the socket; a second one started meanwhile exits once the holder serves, or
takes over once the holder has gone (one exiting after `--release-workers` still holds the lock).

    python -m bundlerun.runner.farm.gateway_server --address HOST:PORT --socket PATH
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bundlerun.runner.farm.gateway_wire import recv, same_user, send
from bundlerun.runner.farm.job import run_job_ray
from bundlerun.runner.farm.ray_workers import NAMESPACE, DeviceWorkers

IDLE_S = 1800.0
READY_S = 300.0  # how long a restarting device actor is waited for (bundlerun's own bound, a loaded node)
CLIENT_ATTEMPTS = 3  # as RayExecutor: a Ray Client server process can fail to start on a loaded head


class Gateway:
    def __init__(self, ray: Any, address: str, timing: dict[str, float]) -> None:
        self.ray = ray
        self.address = address
        self.timing = timing
        self.workers = DeviceWorkers(ray)
        self.task = ray.remote(run_job_ray)
        self.lock = threading.Lock()  # DeviceWorkers' actor table
        self.clients = 0
        self.suspect: set[str] = set()  # devices whose actor died in an attempt: checked before the next
        self.served = 0  # commands served: the first one's stale actors were killed at start
        self.last_seen = time.monotonic()
        self.stop = threading.Event()

    def resources(self) -> set[str]:
        return {k for k, v in self.ray.cluster_resources().items() if v >= 1}

    def describe(self) -> dict[str, Any]:
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        return {"name": "ray", "address": self.address, "ray_version": self.ray.__version__,
                "nodes": [{"node_id": n["NodeID"], "address": n.get("NodeManagerAddress"),
                           "devices": sorted(k for k in n.get("Resources", {}) if ":" in k and not k.startswith("node:"))}
                          for n in nodes]}

    def serve(self, conn: socket.socket) -> None:
        """One command: its attempts, its stats, its cancel or release."""
        with self.lock:
            first, self.served = self.served == 0, self.served + 1
        out = threading.Lock()
        refs: dict[int, tuple[Any, str | None]] = {}
        reused: set[str] = set()
        created: set[str] = set()
        lookup: list[float] = []

        def done(job_id: int, future: Any) -> None:
            _ref, device = refs.pop(job_id, (None, None))
            try:
                msg = {"op": "done", "id": job_id, "report": future.result()}
            except BaseException as exc:  # noqa: BLE001 - the attempt's worker died: the command's scheduler says so
                msg = {"op": "done", "id": job_id, "error": f"{type(exc).__name__}: {exc}"}
                if device:
                    self.suspect.add(device)
            try:
                send(conn, msg, out)
            except OSError:
                pass  # the command went away

        try:
            while True:
                msg = recv(conn)
                if msg is None:
                    break
                op = msg.get("op")
                if op == "hello":
                    with self.lock:  # actors of other code started since (another checkout's command): they hold devices
                        stale = self.workers.stale_killed if first else self.workers._kill_stale()
                    first = False
                    send(conn, {"op": "hello", "pid": os.getpid(), "code": self.workers.code,
                                "resources": self.resources(), "describe": self.describe(), "timing": self.timing,
                                "stale_killed": stale}, out)
                elif op == "submit":
                    device = msg.get("device")
                    if device and device in self.suspect:  # its actor died: wait for Ray's restart
                        threading.Thread(target=self._submit_when_ready, daemon=True,
                                         args=(msg, refs, done)).start()
                        continue
                    if device:
                        t = time.perf_counter()
                        with self.lock:
                            had = device in self.workers._actors
                            before = len(self.workers.created)
                            ref = self.workers.submit(msg["payload"], device)
                            fresh = len(self.workers.created) > before
                        if device not in reused | created:
                            (created if fresh and not had else reused).add(device)
                        if not lookup:
                            lookup.append(time.perf_counter() - t)
                    else:
                        ref = self.task.options(max_retries=0, num_cpus=1).remote(msg["payload"])
                    refs[msg["id"]] = (ref, device)
                    ref.future().add_done_callback(lambda f, i=msg["id"]: done(i, f))
                elif op == "stats":
                    send(conn, {"op": "stats", "reused": sorted(reused), "created": sorted(created),
                                "first_actor_lookup_s": lookup[0] if lookup else None}, out)
                elif op == "cancel":
                    self._cancel(list(refs.values()))
                    send(conn, {"op": "cancelled"}, out)
                elif op == "release":
                    with self.lock:
                        killed = self.workers.release()
                    send(conn, {"op": "released", "killed": killed}, out)
                    self.stop.set()
        except (OSError, EOFError, ValueError, ConnectionError):
            pass
        finally:
            if refs:  # the command went away mid-run (killed): its attempts stop with it
                self._cancel(list(refs.values()))
            conn.close()
            with self.lock:
                self.clients -= 1
                self.last_seen = time.monotonic()

    def _submit_when_ready(self, msg: dict[str, Any], refs: dict[int, tuple[Any, str | None]], done: Any) -> None:
        """A device whose actor died: Ray restarts it, and a job sent meanwhile fails at once ("the actor
        is restarting"), which would spend the job's retries in a second. Wait (up to READY_S) until it
        answers, then send the job."""
        device = msg["device"]
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            try:
                with self.lock:
                    actor = self.workers.actor(device)
                self.ray.get(actor.pid.remote(), timeout=30)
                break
            except Exception:  # noqa: BLE001 - restarting still
                time.sleep(0.5)
        self.suspect.discard(device)
        with self.lock:
            ref = self.workers.submit(msg["payload"], device)
        refs[msg["id"]] = (ref, device)
        ref.future().add_done_callback(lambda f, i=msg["id"]: done(i, f))

    def _cancel(self, running: list[tuple[Any, str | None]]) -> None:
        for ref, device in running:
            try:
                if device:  # an attempt running on a device: its actor restarted empty for the next one
                    self.ray.kill(self.workers._actors[device], no_restart=False)
                else:
                    self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - finished already, or gone
                pass


def _reachable(address: str) -> bool:
    """The cluster's GCS (or Ray Client server) still takes connections: a gateway whose cluster is
    gone exits instead of waiting out its idle time."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=5):
            return True
    except (OSError, ValueError):
        return False


CHECK_S = 10.0  # how often the gateway checks its cluster (bundlerun's own choice)
LOCK_WAIT_S = 120.0  # how long a new gateway waits for one that is starting or exiting (bundlerun's own bound,
# within the command's START_TIMEOUT_S so the command reads why)


def _serving(path: Path) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _take_lock(lock: Any, path: Path, wait_s: float = LOCK_WAIT_S) -> bool:
    """The socket's lock (True), or False once another gateway serves the socket. The lock's holder may
    be starting (it serves soon) or exiting (a `--release-workers` or idle one: its socket is gone, it
    holds the lock through ray.shutdown()): this one waits for either, instead of leaving the command
    that started it waiting for a socket nobody will open (tests/test_farm.py: the third command after
    a --release-workers)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            pass
        if _serving(path):
            return False
        if time.monotonic() > deadline:
            print(f"GATEWAY-ERROR another gateway holds {path}.lock and has not served it in {wait_s:.0f} s", flush=True)
            raise SystemExit(2)
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bundlerun-farm-gateway")
    ap.add_argument("--address", required=True)
    ap.add_argument("--socket", required=True, type=Path)
    ap.add_argument("--idle", type=float, default=IDLE_S)
    args = ap.parse_args(argv)
    lock = open(str(args.socket) + ".lock", "w")
    if not _take_lock(lock, args.socket):
        return 0  # another gateway for this socket is up: the command connects to it
    t0 = time.perf_counter()
    import ray  # the one place the gateway pays for it

    timing = {"import_ray_s": time.perf_counter() - t0}
    address = args.address
    kw: dict[str, Any] = {"namespace": NAMESPACE}
    if not address.startswith("ray://"):
        kw.update(log_to_driver=False, configure_logging=False)
    for attempt in range(1, CLIENT_ATTEMPTS + 1):
        try:
            ray.init(address=address, **kw)
            break
        except Exception as exc:  # noqa: BLE001 - one line for the command that waits for us (it reads the log)
            if not (address.startswith("ray://") and "client server failed" in str(exc)) or attempt == CLIENT_ATTEMPTS:
                print(f"GATEWAY-ERROR cannot reach the Ray cluster at {address}: {type(exc).__name__}: {exc}", flush=True)
                return 2
            if ray.is_initialized():
                ray.shutdown()
            time.sleep(2.0 * attempt)
    timing["connect_s"] = time.perf_counter() - t0 - timing["import_ray_s"]
    t1 = time.perf_counter()
    gateway = Gateway(ray, address, timing)
    timing["stale_actors_s"] = time.perf_counter() - t1
    signal.signal(signal.SIGTERM, lambda *_: gateway.stop.set())

    args.socket.unlink(missing_ok=True)  # a dead gateway's socket: we hold the lock, it is not serving
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(str(args.socket))
    finally:
        os.umask(old)
    srv.listen(16)
    srv.settimeout(1.0)
    print(f"GATEWAY-READY {os.getpid()} {args.socket}", flush=True)
    checked, misses = time.monotonic(), 0
    try:
        while not gateway.stop.is_set():
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                with gateway.lock:
                    idle = gateway.clients == 0 and time.monotonic() - gateway.last_seen > args.idle
                if time.monotonic() - checked > CHECK_S:
                    checked = time.monotonic()
                    misses = 0 if _reachable(address) else misses + 1
                if idle or misses >= 3 or not ray.is_initialized():
                    print(f"GATEWAY-EXIT {'idle' if idle else 'cluster gone'}", flush=True)
                    break
                continue
            if not same_user(conn):
                conn.close()
                continue
            conn.settimeout(None)
            with gateway.lock:
                gateway.clients += 1
            threading.Thread(target=gateway.serve, args=(conn,), daemon=True).start()
    finally:
        if gateway.stop.is_set():
            print("GATEWAY-EXIT released or stopped", flush=True)
        srv.close()
        args.socket.unlink(missing_ok=True)  # no new command reaches this one
        deadline = time.monotonic() + args.idle
        while time.monotonic() < deadline:  # the commands still connected finish first
            with gateway.lock:
                if gateway.clients == 0:
                    break
            time.sleep(0.2)
        try:
            ray.shutdown()  # the driver goes; the detached actors stay for the next gateway
        finally:
            lock.close()
    return 0


if __name__ == "__main__":
    from bundlerun.bundles.stack_room import call_with_stack_room  # python -m: no chunk thrash

    sys.exit(call_with_stack_room(main))
