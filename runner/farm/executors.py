"""Where job attempts run: `local` (a process pool here) or `ray[://ADDRESS]` (Ray actors and tasks).

Both take `submit(payload, device)` and return a concurrent.futures.Future of the attempt's
report; the scheduler (scheduler.py) decides which device each attempt gets, so a device
never runs two jobs at once. On Ray a device's jobs run in the device's detached actor, which
holds the device's custom resource (`{"adb:SERIAL": 1}`, so it lives on the node that holds the
device) and outlives the command (runner/farm/ray_workers.py); jobs without a device (host,
simulators) are CPU tasks (`num_cpus=1`). A device actor asks for no CPU: the device is what it
occupies.

Ray is imported only here, only when asked for (`pip install 'bundlerun[farm]'`).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.runner import interrupts
from bundlerun.runner.farm.job import pool_worker_init, run_job, run_job_ray
from bundlerun.runner.farm import gateway
from bundlerun.runner.farm.gateway import GatewayExecutor
from bundlerun.runner.farm.ray_workers import DeviceWorkers
from bundlerun.targets import target_specs


class LocalExecutor:
    """A pool of worker processes on this machine. On Linux they are forked after the modules a
    job needs are imported here, so a worker starts in milliseconds instead of importing them
    again (no thread, target or runtime worker is open in the coordinator at that point; each
    worker opens its own Session); elsewhere they are spawned."""

    name = "local"
    ship = False  # workers read the bundles and write the reports in place

    def __init__(self, workers: int) -> None:
        import multiprocessing
        import sys

        self.workers = max(1, int(workers))
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        if method == "fork":
            import bundlerun.bundles.bpte  # noqa: F401 - inherited by the workers
            import bundlerun.runner.judging.judge  # noqa: F401
            import bundlerun.runner.report.record  # noqa: F401
            import bundlerun.runner.session  # noqa: F401

            target_specs()
        self._context = multiprocessing.get_context(method)
        self._pool = self._new_pool()
        self.replaced = 0  # pools replaced after a worker died

    def _new_pool(self):
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(max_workers=self.workers, mp_context=self._context, initializer=pool_worker_init)

    @property
    def capacity(self) -> int | None:
        return self.workers

    def resources(self) -> set[str] | None:
        return None  # every device of the plan is reachable from here

    def submit(self, payload: dict[str, Any], device: str | None) -> Future:
        """A worker that dies (OOM killer, a native crash in a runtime) breaks the whole pool: the
        attempts it held come back as crashes (the scheduler retries them) and a new pool takes
        the later ones, so one dead worker does not fail the rest of the run."""
        from concurrent.futures.process import BrokenProcessPool

        try:
            return self._pool.submit(run_job, payload)
        except BrokenProcessPool:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            self.replaced += 1
            return self._pool.submit(run_job, payload)

    def describe(self) -> dict[str, Any]:
        return {"name": "local", "workers": self.workers}

    def close(self, cancel: bool = False) -> None:
        """`cancel`: the farm was stopped (Ctrl-C, SIGTERM). Queued attempts are dropped and every
        worker is told to stop (SIGTERM: a running attempt writes its report, interrupted, and
        its runtime workers are killed); one that has not gone within the grace time is killed."""
        if not cancel:
            self._pool.shutdown(wait=True)
            return
        import signal

        procs = [p for p in list((getattr(self._pool, "_processes", None) or {}).values()) if p.is_alive()]
        for proc in procs:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.join(STOP_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)


# Seconds a stopped farm's pool worker gets to write its attempt's report and reap its children.
STOP_GRACE_S = 20.0
# Tries to connect through a Ray Client server whose per-client server process failed to start.
CLIENT_ATTEMPTS = 3


class RayExecutor:
    """Each attempt a Ray task. `address`: None (RAY_ADDRESS, else a Ray started here for this
    command with the plan's devices as resources of this node), `auto`, HOST:PORT of a cluster's
    GCS, or `ray://HOST:PORT` (Ray Client)."""

    name = "ray"
    ship = True  # the task may run on another machine: the bundle travels with it, the report back

    def __init__(self, address: str | None, devices: set[str], cpus: int = 2, release_workers: bool = False) -> None:
        t0 = time.perf_counter()
        try:
            import ray
        except ModuleNotFoundError:
            raise ConfigError("--executor ray needs Ray: pip install 'bundlerun[farm]'") from None
        self.ray = ray
        self.timing: dict[str, float] = {"import_ray_s": time.perf_counter() - t0}
        self.release_workers = release_workers
        address = address or os.environ.get("RAY_ADDRESS") or None
        self.started_here = address is None
        kw: dict[str, Any] = {"namespace": "bundlerun-farm"}
        if not str(address or "").startswith("ray://"):  # a driver here (Ray Client takes fewer options)
            kw.update(log_to_driver=False, configure_logging=False)
        if self.started_here:
            kw.update(num_cpus=max(1, cpus), resources={d: 1 for d in sorted(devices)}, include_dashboard=False,
                      object_store_memory=96 * 1024 * 1024)
        if ray.is_initialized():
            ray.shutdown()
        for attempt in range(1, CLIENT_ATTEMPTS + 1):
            try:  # "local": a new Ray for this command, never an unrelated cluster found on this machine
                ray.init(address=address or "local", **kw)
                break
            except Exception as exc:  # noqa: BLE001 - one line, not Ray's traceback
                # A Ray Client server starts a server process per client; on a loaded head that
                # process can fail to come up ("Starting Ray client server failed"): another try.
                transient = str(address or "").startswith("ray://") and "client server failed" in str(exc)
                if not transient or attempt == CLIENT_ATTEMPTS:
                    raise ConfigError(f"cannot reach the Ray cluster at {address or 'a new local instance'}: "
                                      f"{type(exc).__name__}: {exc}") from None
                if ray.is_initialized():
                    ray.shutdown()
                time.sleep(2.0 * attempt)
        self.address = address or "local"
        self.timing["connect_s"] = time.perf_counter() - t0 - self.timing["import_ray_s"]

        interrupts.install()  # Ray's core worker installs a SIGTERM handler that exits at once: ours again

        self._task = ray.remote(run_job_ray)
        self._refs: list[Any] = []  # every task sent, so a stopped farm can cancel the running ones

        t1 = time.perf_counter()
        self.workers = DeviceWorkers(ray)  # device jobs: the devices' detached actors (runner/farm/ray_workers.py)
        self.timing["stale_actors_s"] = time.perf_counter() - t1

    @property
    def capacity(self) -> int | None:
        return None  # Ray queues CPU tasks itself; device tasks are only sent to a free device

    def resources(self) -> set[str] | None:
        return {k for k, v in self.ray.cluster_resources().items() if v >= 1}

    def submit(self, payload: dict[str, Any], device: str | None) -> Future:
        """A device job goes to the device's actor (it holds the device: one job at a time, on
        the device's node); a job without a device is a CPU task. No retries by Ray: retries are
        the farm's decision, by failure kind."""
        if device:
            t = time.perf_counter()
            ref = self.workers.submit(payload, device)
            self.timing.setdefault("first_actor_lookup_s", time.perf_counter() - t)
            return ref.future()
        ref = self._task.options(max_retries=0, num_cpus=1).remote(payload)
        self._refs.append(ref)
        return ref.future()

    def after_run(self) -> dict[str, Any]:
        """The devices' actors this command reused, created or killed, and where its start went."""
        workers = {"namespace": "bundlerun-farm", "code": self.workers.code, "reused": sorted(self.workers.reused),
                   "created": sorted(self.workers.created), "stale_killed": self.workers.stale_killed,
                   "released": self.release_workers}
        return {"workers": workers, "timing": {k: round(v, 4) for k, v in self.timing.items()}}

    def describe(self) -> dict[str, Any]:
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        return {"name": "ray", "address": self.address, "ray_version": self.ray.__version__, **self.after_run(),
                "nodes": [{"node_id": n["NodeID"], "address": n.get("NodeManagerAddress"),
                           "devices": sorted(k for k in n.get("Resources", {}) if ":" in k and not k.startswith("node:"))}
                          for n in nodes]}

    def close(self, cancel: bool = False) -> None:
        """`cancel`: the farm was stopped. Attempts still running are cancelled with their worker
        processes (force), so nothing of this command keeps running on the cluster; a Ray
        started for this command is shut down with it."""
        if cancel:
            for ref in self._refs:
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - finished already, or the cluster is gone
                    pass
            for actor in list(self.workers._actors.values()):  # an attempt running on a device: stopped,
                try:  # the actor restarted empty for the next command
                    self.ray.kill(actor, no_restart=False)
                except Exception:  # noqa: BLE001 - gone already
                    pass
        if self.release_workers:
            self.workers.release()
        self.ray.shutdown()


def make_executor(spec: str, devices: set[str], workers: int,
                  release_workers: bool = False) -> LocalExecutor | RayExecutor | GatewayExecutor:
    """`local`, `ray`, `ray://HOST:PORT` (Ray Client) or `ray:HOST:PORT` (a cluster's GCS address).
    `release_workers`: Ray's device actors are killed when the command ends (else kept for the next).
    A cluster's address goes through the farm gateway (runner/farm/gateway.py: no `import ray` and no
    connect in the command) unless BUNDLERUN_FARM_GATEWAY=0; `ray` (a Ray for this command) never does."""
    spec = (spec or "local").strip()
    if spec == "local":
        return LocalExecutor(workers)
    if spec == "ray":
        return RayExecutor(None, devices, cpus=workers, release_workers=release_workers)
    if spec.startswith("ray:"):
        address = spec if spec.startswith("ray://") else spec[4:]
        if gateway.enabled():
            return GatewayExecutor(address, release_workers=release_workers)
        return RayExecutor(address, devices, cpus=workers, release_workers=release_workers)
    raise ConfigError(f"--executor {spec!r}: expected local, ray, ray://HOST:PORT or ray:HOST:PORT")
