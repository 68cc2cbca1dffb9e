"""`bundlerun worker` (hidden): the remote half of `ssh://HOST/<inner URL>`.

Started over SSH by targets/ssh.py on the machine that runs the bundle. It opens the
INNER target (e.g. host://xnnpack) here, runs the requested cases and streams one JSON
line per event on stdout, the protocol of targets/workers/protocol.py (its encoder and the
driver that reads it on the other side live there) with the raw outputs inline, so no second
round trip is needed:

    stdin : {"cases": [["forward", 0], ...]}          (first line; stdin then stays open)
    stdout: {"event": "ready", "version": "0.1.0", "load_s": ..., "info": {...}}
            {"event": "start", "method": "forward", "case": 0}
            {"event": "done", "method": "forward", "case": 0, "elapsed_s": ...,
             "outputs": [{"scalar_type": 6, "shape": [1, 10], "b64": "...", "lossy": false}]}
            {"event": "error", "method": ..., "case": ..., "status": "error|timeout", "kind": ..., "error": ...}
            {"event": "fatal", "error": "...", "kind": "version-mismatch|bad-bundle|..."}
            {"event": "finished", "info": {...}, "warnings": [...], "setup_s": ...}

Judging never happens here: the local host judges with the bundle's criteria.

Lifetime: when stdin closes (the SSH session ended, the link dropped, the local side
gave up) the worker kills every process it started (the inner target's runtime
children run in their own sessions, so their process groups are killed one by one)
and exits at once. SIGTERM/SIGHUP/SIGPIPE do the same. Nothing outlives the session.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import click
from bundlerun.targets.failures import FailureKind
from bundlerun._version import __version__
from bundlerun.bundles.errors import BundleError, BundlerunError, ConfigError
from bundlerun.targets.base import RunOptions
from bundlerun.targets.workers.protocol import result_event

_OUT = None  # the protocol stream (the real stdout); sys.stdout goes to stderr
_LOCK = threading.Lock()
_WORK_DIR: Path | None = None


def _emit(**event) -> None:
    line = json.dumps(event, default=str) + "\n"
    with _LOCK:
        try:
            _OUT.write(line)
            _OUT.flush()
        except (BrokenPipeError, OSError, ValueError):
            _shutdown("the protocol stream closed")


def _descendants(root: int) -> list[tuple[int, int]]:
    """(pid, pgid) of every process below `root` (Linux /proc, else `ps`)."""
    parent: dict[int, int] = {}
    if os.path.isdir("/proc/self"):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            parent[int(name)] = int(fields[1])
    else:
        import subprocess

        try:
            out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, timeout=10).stdout
        except Exception:  # noqa: BLE001 - best effort; the caller still exits
            out = ""
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                parent[int(parts[0])] = int(parts[1])
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child, ppid in parent.items():
            if ppid == pid and child != root:
                try:
                    found.append((child, os.getpgid(child)))
                except OSError:
                    continue
                todo.append(child)
    return found


def kill_descendants() -> int:
    """SIGKILL everything this process started (their process groups too); how many."""
    me, my_group = os.getpid(), os.getpgid(0)
    victims = _descendants(me)
    for pid, pgid in victims:
        try:
            if pgid != my_group:
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(victims)


def _shutdown(why: str, code: int = 3) -> None:
    n = kill_descendants()
    try:
        sys.stderr.write(f"bundlerun worker: {why}; killed {n} process(es), exiting\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    if _WORK_DIR is not None:
        import shutil

        shutil.rmtree(_WORK_DIR, ignore_errors=True)
    os._exit(code)


def _watch_stdin() -> None:
    """Block on stdin; its end means the session is gone."""
    try:
        while True:
            chunk = os.read(0, 4096)
            if not chunk:
                break
    except OSError:
        pass
    _shutdown("stdin closed (session ended)")


def _groups(pairs: list[tuple[str, int]]) -> list[tuple[list[str], list[int]]]:
    """(methods, cases) selections whose product is exactly `pairs`."""
    methods = list(dict.fromkeys(m for m, _ in pairs))
    cases = sorted({c for _, c in pairs})
    if {(m, c) for m in methods for c in cases} == set(pairs):
        return [(methods, cases)]
    return [([m], sorted(c for mm, c in pairs if mm == m)) for m in methods]


@click.command(name="worker", hidden=True)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--target", "inner", required=True, help="The target to open on this machine (e.g. host://xnnpack).")
@click.option("--case-timeout", type=float, default=120.0)
@click.option("--setup-timeout", type=float, default=300.0)
@click.option("--expect-version", default=None, help="Refuse to run unless this bundlerun is that version.")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None, help="Scratch folder (removed at exit).")
@click.option("--config-json", default="{}", help="The inner target's settings, as JSON.")
@click.option("--session", default="", help="An id in the argv, so the caller can find this session's processes.")
def command(bundle: Path, inner: str, case_timeout: float, setup_timeout: float, expect_version: str | None,
            work_dir: Path | None, config_json: str, session: str) -> None:
    """Run BUNDLE's cases on --target here and stream the results as JSON lines (used by ssh://)."""
    global _OUT, _WORK_DIR
    _OUT = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # library chatter never mixes with the protocol
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, lambda signum, _frame: _shutdown(f"got {signal.Signals(signum).name}"))
    t0 = time.perf_counter()

    request_line = sys.stdin.buffer.readline()
    if not request_line:
        _shutdown("stdin closed before the request")
    threading.Thread(target=_watch_stdin, daemon=True).start()
    if expect_version and expect_version != __version__:
        _emit(event="fatal", kind=FailureKind.VERSION_MISMATCH, version=__version__,
              error=f"remote bundlerun is {__version__}, the local one is {expect_version}")
        _shutdown("version mismatch", 3)
    try:
        pairs = [(str(m), int(c)) for m, c in json.loads(request_line)["cases"]]
        config = json.loads(config_json)
    except (ValueError, KeyError, TypeError) as exc:
        _emit(event="fatal", kind=FailureKind.BAD_CONFIG, error=f"bad worker request: {exc}")
        _shutdown("bad request", 3)

    from bundlerun.targets import open_target  # late: looked up at call time (tests replace it)

    try:
        from bundlerun.bundles.bpte import read_bundle  # optional: its failure to load is handled here

        bundle_obj = read_bundle(bundle)
        target = open_target(inner, config)
    except BundleError as exc:
        _emit(event="fatal", kind=FailureKind.BAD_BUNDLE, error=str(exc))
        _shutdown("bad bundle", 3)
    except BundlerunError as exc:
        kind = "bad-config" if isinstance(exc, ConfigError) else str(getattr(exc, "kind", "tool-missing"))
        _emit(event="fatal", kind=kind, error=str(exc))
        _shutdown("cannot open the target", 3)

    import platform
    import tempfile

    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    _WORK_DIR = Path(tempfile.mkdtemp(prefix="run-", dir=work_dir))
    _emit(event="ready", version=__version__, load_s=time.perf_counter() - t0,
          info={"remote_host": platform.node(), "remote_platform": f"{platform.system()} {platform.machine()}",
                "remote_python": platform.python_version(), "remote_bundlerun": __version__, "inner_target": inner})

    sent: set[tuple[str, int]] = set()
    order = list(pairs)

    def start_next() -> None:
        for m, c in order:
            if (m, c) not in sent:
                _emit(event="start", method=m, case=c)
                return

    def progress(result) -> None:
        key = (result.method, result.case_index)
        if key in sent or key not in set(order):
            return
        sent.add(key)
        _emit(**result_event(result))
        start_next()

    info: dict = {}
    warnings: list[str] = []
    setup_s = 0.0
    start_next()
    for methods, cases in _groups(pairs):
        options = RunOptions(work_dir=_WORK_DIR, case_timeout_s=case_timeout, setup_timeout_s=setup_timeout,
                             methods=methods, cases=cases, progress=progress)
        try:
            run = target.run(bundle_obj, bundle, options)
        except BundlerunError as exc:
            kind = "bad-config" if isinstance(exc, ConfigError) else str(getattr(exc, "kind", "tool-missing"))
            _emit(event="fatal", kind=kind, error=str(exc))
            _shutdown("the target failed", 3)
        except Exception as exc:  # noqa: BLE001 - a bug of the inner target: one clear line, not a retry loop
            import traceback

            traceback.print_exc()
            _emit(event="fatal", kind=FailureKind.RUNNER_ERROR, error=f"remote worker internal error: {type(exc).__name__}: {exc}")
            _shutdown("internal error", 3)
        for result in run.cases:
            progress(result)
        info.update(run.info)
        warnings += [w for w in run.warnings if w not in warnings]
        setup_s += run.setup_s or 0.0
    _emit(event="finished", info=info, warnings=warnings, setup_s=setup_s)
    _shutdown("finished", 0)
