"""A whole farm run: build what the plan builds, schedule every job, merge, record.

    REPORT/
      report.json, junit.xml, summary.md, report.html   the merged report (runner/report/merge.py)
      bundles/                                          bundles the plan built
      jobs/<job>/attempt-<n>/report.json (+ work/)      every attempt of every job

The merged report's `farm` section lists each job with all of its attempts (device, node,
exit code, failure kinds, time), whether it is flaky (passed after a failed attempt), and
each device's attempts and infrastructure failures. The history gets one run per job (its
final attempt) plus a row per attempt (runner/history/store.py `farm_attempts`), which
`bundlerun history --flaky` ranks by flake rate.

With `shard` ("i/n", `bundlerun farm --shard`) only that part of the plan's jobs runs (split by
job id, runner/shard.py) and the merged report carries the `shard` record (axis "jobs"), so
`bundlerun merge` of the shards' reports gives the unsharded farm's report and names the jobs of
a missing shard. The merge is runner/report/merge.py's `merge_reports` in its jobs mode.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bundlerun.runner import interrupts
from bundlerun.runner.farm.results import ResultWriter
from bundlerun.runner.farm.plan import Device, Job, Plan
from bundlerun.runner.farm.scheduler import Attempt, Scheduler
from bundlerun.runner.judging.outcome import EXIT_FAIL, EXIT_PASS, VERDICTS, combine_exit_codes
from bundlerun.runner.report.model import Report
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.base import Verdict
from bundlerun.bundles.backends.base import default_dtype
from bundlerun.bundles.errors import BundlerunError
from bundlerun.runner.farm.executors import make_executor
from bundlerun.runner.farm.job import _bad_report
from bundlerun.runner.farm.plan import shard_jobs
from bundlerun.runner.report.model import Summary
from bundlerun.targets import default_backend, lowering_info


@dataclass
class FarmResult:
    report: Report
    exit_code: int
    jobs: list[dict[str, Any]] = field(default_factory=list)  # a farm's: read from disk as iterated (merge_jobs.SpooledList)
    devices: list[dict[str, Any]] = field(default_factory=list)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def job_dir_name(job_id: str) -> str:
    """The folder of a job: a readable slug of its id plus 16 hex digits of the id's sha256.
    Slugs alone collide (`a b.bpte` and `a_b.bpte` both give `a_b@host_portable`, and so do ids
    cut at the length limit or differing only in case on a case-insensitive disk): two jobs then
    wrote one folder and a PASS job's report link showed the FAIL job's report."""
    import hashlib

    slug = re.sub(r"[^A-Za-z0-9_.@#-]+", "_", job_id).strip("_.")[:100] or "job"
    return f"{slug}-{hashlib.sha256(job_id.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def build_bundles(jobs: list[Job], registry: Any = None, say: Callable[[str], None] = lambda m: None) -> dict[str, str]:
    """Build each distinct bundle the plan asks for (through the build cache); job id -> error
    for the jobs whose build failed."""
    failed: dict[str, str] = {}
    done: dict[Path, str | None] = {}
    for job in jobs:
        spec = job.build
        if spec is None:
            continue
        if job.bundle not in done:
            from bundlerun.bundles.builder import BuildRequest, build_bundle  # start-up: flatbuffers, numpy: builds only

            try:
                backend = spec.backend or default_backend(spec.target, spec.dtype)
                info = lowering_info(spec.target)
                dtype = spec.dtype or default_dtype(backend, info)
                say(f"building {spec.model} {dtype} for {spec.target} ({backend})")
                result = build_bundle(BuildRequest(model=spec.model, output=job.bundle, backend=backend, dtype=dtype,
                                                   cases=spec.cases, seed=spec.seed, target=spec.target, target_info=info,
                                                   registry=registry, cache=True))
                done[job.bundle] = None
                if result.info.get("cache") == "hit":
                    say(f"  cached build {str(result.info.get('cache_key'))[:12]}")
            except BundlerunError as exc:
                done[job.bundle] = f"build of {spec.model} {spec.dtype or ''} for {spec.target} failed: {exc}"
        if done[job.bundle]:
            failed[job.id] = done[job.bundle]
    return failed


def run_farm(plan: Plan, report_dir: Path, executor: str = "local", workers: int | None = None,
             session: Any = None, history_db: Path | None = None,
             say: Callable[[str], None] = lambda m: None, shard: Any = None,
             require_seal: bool = False, release_workers: bool = False) -> FarmResult:
    """Run the plan (only the jobs of `shard`, "i/n", if given); write the merged report and
    every attempt's; record the history. `require_seal`: an unsealed bundle is an ERROR job.
    `release_workers`: on Ray, the devices' actors are killed at the end (else the next command reuses them)."""
    from bundlerun.runner.report.merge_jobs import JobsMerge  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.settings import Settings  # start-up: not loaded by `bundlerun --help`

    session = session or Settings()
    report_dir = Path(report_dir).resolve()
    report_dir.mkdir(parents=True, exist_ok=True)
    farm_id, started, t0, t0_unix = uuid.uuid4().hex, _now(), time.perf_counter(), time.time()
    jobs, shard_rec = shard_jobs(plan.jobs(report_dir / "bundles"), shard)
    if not jobs and shard_rec is not None:
        return _empty_shard(plan, report_dir, shard_rec, farm_id, started)
    build_failed = build_bundles(jobs, registry=session.registry if plan.models else None, say=say)
    runnable = [j for j in jobs if j.id not in build_failed]
    devices = {d.resource for j in runnable for d in j.group.devices if d.resource}
    if workers is None:
        workers = min(32, sum(g.concurrency for g in {id(j.group): j.group for j in runnable}.values()) or 1)
    project = {k: v for k, v in (session.project or {}).items() if k != "_file"}
    configs: dict[tuple[str, str], dict[str, Any]] = {}

    def payload(job: Job, attempt: int, device: Device) -> dict[str, Any]:
        key = (job.group.name, device.url)
        if key not in configs:
            configs[key] = {**session.target_config(device.url), **job.group.options}
        out = report_dir / "jobs" / job_dir_name(job.id) / f"attempt-{attempt}"
        p = {"job": job.id, "attempt": attempt, "group": job.group.name, "url": device.url,
             "device": device.resource, "bundle_path": str(job.bundle), "report_dir": str(out),
             "case_timeout_s": plan.case_timeout_s, "setup_timeout_s": plan.setup_timeout_s, "label": plan.label,
             "target_config": configs[key], "project": project, "require_seal": require_seal}
        if ex.ship:
            p["bundle_bytes"] = Path(job.bundle).read_bytes()
        return p

    by_id = {j.id: j for j in jobs}
    # what the coordinator keeps of each finished job is what the merged report's head needs: its id
    # (and whether it was flaky), its exit code among the set of them, its attempts counted per device.
    # Each job's record goes with its report to the results thread, which folds both into the merged
    # report: its cases to a spool file, its sections (the record, its entry, ...) to another, so the
    # coordinator's memory does not grow with the jobs (runner/report/merge_jobs.py)
    finished: set[str] = set()
    flaky_jobs: set[str] = set()
    exit_codes: set[int] = set()
    device_stats: dict[str, dict[str, Any]] = {}
    merge = JobsMerge([j.id for j in jobs], report_dir / ".merged-cases.jsonl")
    writer = ResultWriter(history_db, farm_id, fold=merge.add, spool=report_dir / ".results-queue.bin")

    def finish(job: Job, tries: list[Attempt]) -> None:
        """A job's final report and record, written (and sent to the history) when it is known."""
        why = build_failed.get(job.id) or (scheduler.unplaceable.get(job.id) if scheduler else None)
        final, record, final_dir, writes = _job_result(job, tries, report_dir, farm_id, plan, why,
                                                       job.id in build_failed, interrupted, ex.ship)
        finished.add(job.id)
        flaky = record["flaky"]
        if flaky:
            flaky_jobs.add(job.id)
        exit_codes.add(record["exit_code"])
        for a in record["attempts"]:
            d = device_stats.setdefault(a["url"], {"url": a["url"], "resource": a["device"], "attempts": 0,
                                                   "infra_failures": 0, "numerical_failures": 0, "passed": 0})
            d["attempts"] += 1
            d["infra_failures"] += a["exit_code"] == 2
            d["numerical_failures"] += a["exit_code"] == 1
            d["passed"] += a["exit_code"] == 0
        rows = [{**t.record(), "final": t is tries[-1], "flaky": flaky and t is tries[-1]} for t in tries] or [
            {"attempt": 0, "url": job.group.url, "device": None, "exit_code": 2, "verdict": Verdict.ERROR,
             "error_kinds": [], "final": True, "flaky": False}]
        # a job the Ctrl-C kept from running is no result: its report is written, not recorded
        writer.add(job.id, final, final_dir, rows, record, writes, record_history=bool(tries or not interrupted))
        for t in tries:
            t.release()  # the writer holds the reports until they are written and folded in

    def on_attempt(a: Attempt) -> None:
        where = a.device or a.url
        node = a.node.get("ray_node_id", "")[:12] or a.node.get("host", "")
        extra = f" [{', '.join(a.kinds)}]" if a.kinds else ""
        say(f"{a.job} attempt {a.attempt} on {where} ({node}): {a.verdict}{extra}"
            + (" -> retry" if a.retryable else ""))
        if not a.retryable and scheduler is not None:  # the job's last attempt: its result goes out now
            tries, scheduler.attempts[a.job] = scheduler.attempts[a.job], []  # its record holds what is kept of them
            finish(by_id[a.job], tries)

    ex = make_executor(executor, devices, workers, release_workers=release_workers)
    scheduler: Scheduler | None = None
    interrupted = False
    try:
        described = ex.describe()
        scheduler = Scheduler(runnable, ex, plan.retries, payload, on_attempt)
        attempts = scheduler.run()
    except KeyboardInterrupt:
        # Ctrl-C: queued attempts are dropped, running ones end (their workers got it too); the jobs
        # that finished keep their verdicts, the rest become `interrupted`, and the merged report is
        # still written before the command exits 130.
        ex.close(cancel=True)
        if scheduler is None:
            raise
        interrupted, attempts = True, dict(scheduler.attempts)
    except BaseException:
        ex.close(cancel=True)
        try:
            writer.close()  # the jobs that finished keep their reports and history records
        except Exception:  # noqa: BLE001 - the first error is the one to raise
            pass
        merge.discard()
        raise
    else:
        ex.close()
    makespan = time.perf_counter() - t0
    if hasattr(ex, "after_run"):
        described.update(ex.after_run())  # Ray: the actors the run used (looked up as jobs were sent)

    for job in jobs:  # jobs with no final attempt: not built, no device, stopped by Ctrl-C
        if job.id not in finished:
            tries = attempts.get(job.id, []) if job.id not in build_failed else []
            finish(job, tries)
    try:
        writer.close()  # the last batch, and every report written (with its history id) and folded in
    except BaseException:
        merge.discard()
        raise
    job_records = merge.records()  # read back from the spool, in plan order, one at a time

    for d in device_stats.values():
        d["infra_rate"] = d["infra_failures"] / d["attempts"] if d["attempts"] else 0.0
    devices_out = sorted(device_stats.values(), key=lambda d: (-d["infra_rate"], d["url"]))

    # the farm's jobs are different bundles by design: merge_reports' jobs mode, folded job by job
    merged = merge.report()
    exit_code = interrupts.exit_code() if interrupted else combine_exit_codes(sorted(exit_codes))
    merged.summary.exit_code = exit_code
    merged.summary.verdict = {EXIT_PASS: Verdict.PASS, EXIT_FAIL: Verdict.FAIL}.get(exit_code, Verdict.ERROR)
    if interrupted:
        merged.summary.interrupted = True
    merged.run.update(id=farm_id, started=started, finished=_now(), duration_s=makespan, label=plan.label,
                         command=["bundlerun", "farm", str(plan.path)])
    replaced = getattr(ex, "replaced", 0)
    if replaced:
        described["pools_replaced"] = replaced  # local: a worker died and its pool was replaced
    merged.extras["farm"] = {"id": farm_id, "plan": str(plan.path), "executor": described, "retries": plan.retries,
                      "makespan_s": makespan, "started_unix": round(t0_unix, 4), "jobs": job_records, "devices": devices_out,
                      "flaky_jobs": [j.id for j in jobs if j.id in flaky_jobs],
                      "flaky_devices": [d["url"] for d in devices_out if d["infra_failures"]],
                      "results": {"history_batches": writer.batches, "peak_backlog": writer.peak_backlog}}
    if shard_rec is not None:  # `bundlerun merge` of the farm's shards checks overlaps and missing jobs with it
        merged.extras["shard"] = shard_rec
        merged.extras["farm"]["shard"] = shard_rec["spec"]
    from bundlerun.runner.report.record import write_record  # numpy: after the jobs, not before the first
    from bundlerun.runner.writers import write_reports  # start-up: loads numpy on use

    try:
        write_record(merged, report_dir)  # the verdicts first, whatever a writer does
        write_reports(merged, report_dir)
    finally:
        merge.discard()
    if interrupted:
        raise KeyboardInterrupt  # the report is written; the CLI says so and exits 130 (143 for SIGTERM)
    return FarmResult(merged, exit_code, job_records, devices_out)


def _job_result(job: Job, tries: list[Attempt], report_dir: Path, farm_id: str, plan: Plan, why: str | None,
                not_built: bool, interrupted: bool, shipped: bool
                ) -> tuple[Report, dict[str, Any], Path, list[tuple[Report, Path]]]:
    """A job's final report (its last attempt's, else one saying why it did not run), its record in
    the merged report, its folder, and the attempt reports to write there."""

    if tries:
        final = tries[-1].report
    elif interrupted and not not_built:
        final = _bad_report({"url": job.group.url, "bundle_path": str(job.bundle), "label": plan.label},
                            f"not run: the farm was {interrupts.describe()}", FailureKind.INTERRUPTED)
    else:
        final = _bad_report({"url": job.group.url, "bundle_path": str(job.bundle), "label": plan.label}, why or "not run",
                            FailureKind.BAD_BUNDLE if not_built else FailureKind.TOOL_MISSING)
    flaky = bool(tries) and final.summary.exit_code == EXIT_PASS and any(t.exit_code != EXIT_PASS for t in tries)
    final_dir = (report_dir / "jobs" / job_dir_name(job.id) / f"attempt-{len(tries)}") if tries else (
        report_dir / "jobs" / job_dir_name(job.id) / "not-run")
    writes = []
    for t in tries:
        attempt_dir = report_dir / "jobs" / job_dir_name(job.id) / f"attempt-{t.attempt}"
        # Ray: the reports came back as results; local: a worker that died wrote none (the
        # scheduler's crash report stands in), so every attempt folder holds its report
        if (shipped or not (attempt_dir / "report.json").is_file()) and t.report is not final:
            writes.append((t.report, attempt_dir))  # the final one: written by the results thread with its history id
    farm = dict(final.extras.get("farm") or {})
    farm.update(job=job.id, group=job.group.name, farm_id=farm_id, flaky=flaky,
                attempts=[t.record() for t in tries])
    final.extras["farm"] = farm
    record = {"job": job.id, "group": job.group.name, "bundle": str(job.bundle),
              "verdict": final.summary.verdict, "exit_code": final.summary.exit_code,
              "flaky": flaky, "attempts": [t.record() for t in tries], "report": str(final_dir / "report.json")}
    if why and not tries:
        record["error"] = why
    return final, record, final_dir, writes


def _empty_shard(plan: Plan, report_dir: Path, record: dict[str, Any], farm_id: str, started: str) -> FarmResult:
    """A farm shard that holds no job (more shards than jobs): nothing ran, verdict SKIP, exit 0;
    its report still carries the shard record so `bundlerun merge` counts it."""
    from bundlerun.runner.report.record import tool_version  # start-up: loads numpy on use
    from bundlerun.runner.writers import write_reports  # start-up: loads numpy on use

    report = Report(
        summary=Summary(Verdict.SKIP, EXIT_PASS, {v: 0 for v in VERDICTS}, 0, 0), cases=[],
        tool={"name": "bundlerun", "version": tool_version()},
        run={"id": farm_id, "label": plan.label, "started": started, "finished": _now(), "duration_s": 0.0,
             "command": ["bundlerun", "farm", str(plan.path)]},
        bundle={"model": "0 jobs", "path": None, "sha256": None, "models": []},
        target={"url": "0 targets", "targets": []},
        warnings=[f"shard {record['spec']} holds none of the {len(record['universe'])} jobs; nothing ran"],
        extras={
            "jobs": [],
            "merged": {"mode": "jobs", "reports": 0, "run_ids": [], "from": [], "groups": [], "complete": True},
            "farm": {"id": farm_id, "plan": str(plan.path), "executor": {"name": None}, "retries": plan.retries,
                     "makespan_s": 0.0, "jobs": [], "devices": [], "flaky_jobs": [], "flaky_devices": [],
                     "shard": record["spec"]},
            "shard": record,
        },
    )
    write_reports(report, report_dir)
    return FarmResult(report, EXIT_PASS, [], [])
