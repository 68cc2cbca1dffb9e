"""A real Ray cluster on this machine for the farm tests: a head node and a second node, each
its own `ray start --block` process (so each node's processes are that process's children, in
a session of their own), with simulated devices as custom resources on different nodes.

Teardown stops exactly what was started: SIGTERM to each node's process group (by its id),
SIGKILL after a grace period, then a check that no process of those groups is left. (`ray stop`
would kill every Ray process of this user by name, including clusters this test did not start.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
AUTH_ENV = {"RAY_AUTH_MODE": "disabled"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group."""
    out = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(pgid)], capture_output=True, text=True)
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return [int(r[0]) for r in rows if len(r) > 1 and not r[1].startswith("Z")]


def _wait_group(pgid: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _running(pid: int) -> bool:
    """Alive and not a zombie (a gateway's parent, the CLI, has exited: whoever adopted it reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class RayCluster:
    """`RayCluster(env).start(head={"adb:emu-1": 1}, nodes=[{"adb:emu-2": 1}])`; `.address` is the
    GCS address (HOST:PORT) for `--executor ray:ADDRESS`; `.nodes()` maps node id -> resources."""

    def __init__(self, env: dict[str, str] | None = None, cpus_per_node: int = 1) -> None:
        # a loopback test cluster without token auth (a token in ~/.ray from another Ray would otherwise
        # switch it on for some processes and not others); drivers must run with AUTH_ENV too
        self.env = {**os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0", **AUTH_ENV}
        self.cpus = cpus_per_node
        self.procs: list[subprocess.Popen] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="rbr", dir="/tmp"))  # short: Ray's unix sockets live under it
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"

    def _spawn(self, args: list[str], log: str) -> None:
        proc = subprocess.Popen([RAY, "start", "--block", *args], stdout=open(self.tmp / log, "w"),
                                stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        self.procs.append(proc)

    def status(self) -> str:
        res = subprocess.run([RAY, "status", "--address", self.address], capture_output=True, text=True,
                             env=self.env, timeout=60)
        return res.stdout if res.returncode == 0 else ""

    def _wait_for(self, resource: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Ray node exited ({proc.returncode}): {self.logs()}")
            if resource in self.status():
                return
            time.sleep(0.5)
        raise RuntimeError(f"Ray resource {resource} did not appear in {timeout} s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.tmp.glob("*.log")))

    def start(self, head: dict[str, float], nodes: list[dict[str, float]]) -> "RayCluster":
        common = ["--num-cpus", str(self.cpus), "--object-store-memory", str(80 * 1024 * 1024),
                  "--disable-usage-stats"]
        self.client_address = f"ray://127.0.0.1:{free_port()}"  # the head's Ray Client server
        self._spawn(["--head", "--port", str(self.port), "--resources", json.dumps(head), "--include-dashboard=false",
                     "--temp-dir", str(self.tmp / "r"), "--ray-client-server-port", self.client_address.rsplit(":", 1)[1],
                     "--min-worker-port", "0", "--max-worker-port", "0", *common], "head.log")
        self._wait_for(next(iter(head)) if head else "CPU")
        for i, resources in enumerate(nodes):
            self._spawn(["--address", self.address, "--resources", json.dumps(resources),
                         "--min-worker-port", "0", "--max-worker-port", "0", *common], f"node{i + 1}.log")
            self._wait_for(next(iter(resources)))
        return self

    def nodes(self) -> dict[str, dict[str, float]]:
        """node id -> resources of every live node, asked from a driver process of its own."""
        code = ("import json, ray; ray.init(address=%r, log_to_driver=False, configure_logging=False); "
                "print(json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']})); "
                "ray.shutdown()") % self.address
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=self.env, timeout=180)
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-3000:])
        return json.loads(res.stdout.strip().splitlines()[-1])

    def gateways(self) -> list[int]:
        """Pids of the farm gateways (runner/farm/gateway_server.py) a command started for this cluster:
        detached by design, so the cluster that outlives them in a test must end them too."""
        mine = {self.address, getattr(self, "client_address", None)} - {None}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            args = [a.decode(errors="replace") for a in argv]
            if "bundlerun.runner.farm.gateway_server" in args and "--address" in args:
                address = args[args.index("--address") + 1] if args.index("--address") + 1 < len(args) else ""
                if address.removeprefix("ray:") in mine or address in mine:
                    found.append(int(entry.name))
        return found

    def stop(self) -> list[int]:
        """Stop every node this cluster started and the farm gateways started for it; returns the pids
        still alive afterwards (none)."""
        gateways = self.gateways()
        for pid in gateways:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 8
        for proc in self.procs:
            _wait_group(proc.pid, max(0.1, deadline - time.monotonic()))
        left: list[int] = []
        for proc in self.procs:
            if _group_alive(proc.pid):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            left += _wait_group(proc.pid, 15)
        for pid in gateways:
            deadline = time.monotonic() + 10
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _running(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                left.append(pid)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return left
