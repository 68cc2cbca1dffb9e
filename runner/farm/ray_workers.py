"""Ray workers that outlive a command: one detached actor per device, reused by the next `bundlerun farm`.

A Ray task starts in a Ray worker process that imports bundlerun (the session, the judge, the
target registry) before its first job: seconds per command, every command. A device's jobs run
instead in a detached actor named `<code>:<device>` in the `bundlerun-farm` namespace, which
holds the device's resource (so it lands on the node that has the device, and runs one job at a
time) and stays up after the command ends; the next command against the same cluster finds it
by name and sends its first job at once (bench/bench_farm.py: second-command start).

`<code>` is a hash of bundlerun's own source files and of the extra target modules named in
$BUNDLERUN_TARGETS: a changed checkout gets new actors and never runs on stale ones; the stale
ones (other hashes) are killed when a command starts, as they hold the devices' resources.
`bundlerun farm --release-workers` kills this namespace's actors when the command ends. An actor
that dies (a crash, the OOM killer) fails the attempt it held (a crash: retried by the
scheduler) and is restarted by Ray for the next one.

Ray is imported only through runner/farm/executors.py, only for `--executor ray`.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any
from bundlerun.runner.farm.job import run_job_ray
from bundlerun.targets import target_specs

NAMESPACE = "bundlerun-farm"
PACKAGES = ("bundlerun", "bundlerun.bundles", "bundlerun.targets", "bundlerun.runner")  # bundlerun's own code


@lru_cache(maxsize=1)
def code_hash() -> str:
    """12 hex digits over bundlerun's .py files (each package folder's, as installed) and the
    modules named in $BUNDLERUN_TARGETS."""
    import importlib
    import importlib.util

    dirs = []
    for name in PACKAGES:
        module = importlib.import_module(name)
        dirs += [Path(p) for p in getattr(module, "__path__", [])]
    files = [f for d in dirs for f in sorted(d.rglob("*.py")) if "__pycache__" not in f.parts]
    extra = os.environ.get("BUNDLERUN_TARGETS", "")
    for name in filter(None, (n.strip() for n in extra.split(","))):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            files.append(Path(spec.origin))
    h = hashlib.sha256(extra.encode())
    for f in files:
        try:
            data = f.read_bytes()
        except OSError:
            continue
        h.update(f"{f.parent.name}/{f.name}".encode() + b"\0" + data)
    return h.hexdigest()[:12]


def actor_name(device: str) -> str:
    return f"{code_hash()}:{device}"


class DeviceWorker:
    """The actor: imports what a job needs once, then runs the device's attempts one at a time."""

    def __init__(self, device: str) -> None:
        import bundlerun.bundles.bpte  # noqa: F401 - warm: the first job starts without imports
        import bundlerun.runner.judging.judge  # noqa: F401
        import bundlerun.runner.report.record  # noqa: F401
        import bundlerun.runner.session  # noqa: F401

        target_specs()
        self.device = device

    def run(self, payload: dict[str, Any]) -> Any:
        return run_job_ray(payload)

    def pid(self) -> int:
        return os.getpid()


class DeviceWorkers:
    """The detached actors of one command's devices: looked up (or created) on first use."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.code = code_hash()
        self._cls = ray.remote(DeviceWorker)
        self._actors: dict[str, Any] = {}
        self.reused: list[str] = []  # devices whose actor an earlier command started
        self.created: list[str] = []
        self.stale_killed = self._kill_stale()

    def _named(self) -> list[str]:
        try:
            return [n if isinstance(n, str) else n.get("name", "")
                    for n in self.ray.util.list_named_actors(all_namespaces=False)]
        except Exception:  # noqa: BLE001 - an older Ray or a client without the call: nothing to clean
            return []

    def _kill_stale(self) -> list[str]:
        """Actors of another code hash: they hold the devices and run old code."""
        killed = []
        for name in self._named():
            code, _, device = name.partition(":")
            if device and code != self.code:
                try:
                    self.ray.kill(self.ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
                    killed.append(name)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        return killed

    def actor(self, device: str) -> Any:
        actor = self._actors.get(device)
        if actor is None:
            name = f"{self.code}:{device}"
            try:
                actor = self.ray.get_actor(name, namespace=NAMESPACE)
                self.reused.append(device)
            except ValueError:
                actor = self._cls.options(
                    name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
                    resources={device: 1}, max_restarts=-1, max_task_retries=0, max_concurrency=1,
                ).remote(device)
                self.created.append(device)
            self._actors[device] = actor
        return actor

    def submit(self, payload: dict[str, Any], device: str) -> Any:
        return self.actor(device).run.remote(payload)

    def release(self) -> list[str]:
        """Kill every bundlerun actor of the namespace (this code's and any other's)."""
        killed = []
        for name in self._named():
            if ":" not in name:
                continue
            try:
                self.ray.kill(self.ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
                killed.append(name)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors.clear()
        return killed
