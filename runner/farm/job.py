"""One job attempt, run in the executor's process (a local pool worker or a Ray worker).

`run_job(payload) -> result` uses the Session API: the process keeps one open Session, so
host://, tosa:// and mlx:// jobs reuse one warm runtime worker per target (torch imported
once per process, not once per job); it is closed when the process exits. No history is
recorded here: the coordinator records one run per job, after its retries.

The payload carries the bundle's bytes when the executor may run the job on another machine
(`ship=True`, Ray): the bundle is written to a temporary folder there, the report comes back
as the result, and the coordinator writes it beside the others.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bundlerun.runner.judging.outcome import EXIT_INFRA, VERDICTS
from bundlerun.runner.report.model import CaseRecord, Report, Summary
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.base import CaseStatus, Verdict
from bundlerun.bundles.errors import BundlerunError
from bundlerun.runner import interrupts

_SESSION: Any = None
_SESSION_KEY: str | None = None
_FINALIZER: Any = None


def _session(project: dict[str, Any]):
    global _SESSION, _SESSION_KEY
    key = json.dumps(project, sort_keys=True, default=str)
    if _SESSION is not None and _SESSION_KEY == key:
        return _SESSION
    if _SESSION is not None:
        _SESSION.close()
    from bundlerun.runner.session import Session  # start-up: loads flatbuffers, numpy on use

    _SESSION, _SESSION_KEY = Session(project=project, no_history=True).open(), key
    global _FINALIZER
    if _FINALIZER is None:  # a forked pool worker ends with os._exit: atexit would not run, this does
        from multiprocessing import util

        _FINALIZER = util.Finalize(None, close_session, exitpriority=100)
    return _SESSION


_RUNNING = {"job": False}  # a pool worker is inside run_job


def pool_worker_init() -> None:
    """A local pool worker stops on its coordinator's SIGTERM (runner/farm/executors.py): in the
    middle of an attempt like any command (the attempt's report is written, interrupted, its runtime
    workers killed); idle, at once, after killing its warm runtime workers. Ctrl-C reaches the
    coordinator, which tells the workers: a terminal's SIGINT to the whole group is ignored here."""
    import signal

    interrupts.reset()

    def on_term(signum, frame) -> None:
        if _RUNNING["job"]:
            interrupts.on_signal(signum, frame)
        else:
            close_session()
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@atexit.register
def close_session() -> None:
    """Kill and reap this process's warm runtime workers (also called by executors' shutdown)."""
    global _SESSION
    session, _SESSION = _SESSION, None
    if session is not None:
        session.close()


def _bad_report(payload: dict[str, Any], error: str, kind: FailureKind) -> Report:
    """A report for an attempt that could not even start (bundle unreadable, worker failure):
    one ERROR case, so the job still ends with a verdict."""
    from bundlerun.runner.report.record import tool_version  # start-up: loads numpy on use

    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    return Report(
        summary=Summary(Verdict.ERROR, EXIT_INFRA, {**{v: 0 for v in VERDICTS}, Verdict.ERROR: 1}, 1, 0),
        cases=[CaseRecord(method="-", case=0, status=CaseStatus.ERROR, verdict=Verdict.ERROR, error=error,
                          error_kind=FailureKind.parse(kind))],
        tool={"name": "bundlerun", "version": tool_version()},
        run={"id": os.urandom(16).hex(), "label": payload.get("label"), "started": now, "finished": now,
             "duration_s": 0.0, "command": ["bundlerun", "farm"]},
        bundle={"path": payload.get("bundle_path"), "model": Path(str(payload.get("bundle_path"))).stem},
        target={"url": payload["url"]}, warnings=[error],
    )


def run_job(payload: dict[str, Any]) -> Report:
    """Run one attempt; never raises for a bundle or target problem (the report says it)."""
    t0, started = time.perf_counter(), time.time()
    _RUNNING["job"] = True
    try:
        return _run_job(payload, t0, started)
    finally:
        _RUNNING["job"] = False


def _run_job(payload: dict[str, Any], t0: float, started: float) -> Report:
    from bundlerun.runner.report.record import write_record  # start-up: loads numpy on use
    from bundlerun.runner.session import RunRequest  # start-up: loads flatbuffers, numpy on use

    scratch = None
    report_dir = Path(payload["report_dir"])
    bundle_path = Path(payload["bundle_path"])
    try:
        if payload.get("bundle_bytes") is not None:
            scratch = tempfile.mkdtemp(prefix="bundlerun-farm-")
            report_dir = Path(scratch) / "report"
            bundle_path = Path(scratch) / bundle_path.name
            bundle_path.write_bytes(payload["bundle_bytes"])
        report_dir.mkdir(parents=True, exist_ok=True)
        from bundlerun.bundles.bpte import read_bundle  # optional: its failure to load is handled here

        try:
            bundle = read_bundle(bundle_path, require_seal=bool(payload.get("require_seal")))
        except BundlerunError as exc:
            report = _bad_report(payload, f"bundle not readable: {exc}",
                                 getattr(exc, "kind", None) or FailureKind.BAD_BUNDLE)
        else:
            session = _session(payload.get("project") or {})
            req = RunRequest(bundle_path=bundle_path, target=payload["url"], report_dir=report_dir,
                             case_timeout_s=payload["case_timeout_s"], setup_timeout_s=payload["setup_timeout_s"],
                             label=payload.get("label"), target_config=dict(payload.get("target_config") or {}))
            report = session.execute(req, bundle)
        if scratch:
            report.bundle["path"] = payload["bundle_path"]  # where the coordinator has it
    except Exception as exc:  # noqa: BLE001 - a worker failure is an infrastructure error of this attempt
        report = _bad_report(payload, f"farm worker failed: {type(exc).__name__}: {exc}", FailureKind.TOOL_FAILED)
        report.warnings.append(traceback.format_exc(limit=5))
    finally:
        if scratch:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
    node = {"host": socket.gethostname(), "pid": os.getpid()}
    node.update(payload.get("node") or {})
    farm = {"job": payload["job"], "attempt": payload["attempt"], "device": payload.get("device"),
            "group": payload.get("group"), "node": node, "started_unix": started,
            "elapsed_s": time.perf_counter() - t0}
    report.extras["farm"] = farm
    if not payload.get("bundle_bytes"):
        write_record(report, Path(payload["report_dir"]))
    return report


def run_job_ray(payload: dict[str, Any]) -> dict[str, Any]:
    """The Ray task: run_job plus the Ray node it ran on."""
    import ray

    ctx = ray.get_runtime_context()
    payload = {**payload, "node": {"ray_node_id": ctx.get_node_id(), "ray_worker_id": ctx.get_worker_id()}}
    return run_job(payload)
