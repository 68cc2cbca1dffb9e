"""`bundlerun farm PLAN.toml`: a plan of bundles x targets on a local process pool or on Ray."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bundlerun.runner import seal
from bundlerun.targets.base import Verdict
from bundlerun.runner.shard import parse_shard


def _print_jobs(plan, jobs, as_json: bool) -> None:
    if as_json:
        import json

        click.echo(json.dumps({"plan": str(plan.path), "retries": plan.retries, "jobs": [j.describe() for j in jobs]},
                              indent=2))
        return
    from rich.table import Table

    from bundlerun.runner.report.console import plain, wide_console  # start-up: not loaded by `bundlerun --help`

    table = Table(title=f"farm plan {plain(plan.path)}: {len(jobs)} jobs, retries {plan.retries}", title_justify="left")
    for col in ("#", "job", "bundle", "target", "devices", "concurrency"):
        table.add_column(col, justify="right" if col in ("#", "concurrency") else "left")
    for i, job in enumerate(jobs, 1):
        bundle = (f"build {job.build.model} {job.build.dtype or '(default dtype)'}" if job.build else str(job.bundle))
        devices = ", ".join(d.url + (f" [{d.resource}]" if d.resource else " [cpu]") for d in job.group.devices)
        table.add_row(str(i), plain(job.id), plain(bundle), plain(job.group.name), plain(devices),
                      str(job.group.concurrency))
    wide_console().print(table)


@click.command(name="farm")
@click.argument("plan_path", metavar="PLAN.toml", type=click.Path(path_type=Path))
@click.option("--executor", default="local", show_default=True,
              help="local (a process pool here), ray (RAY_ADDRESS or a Ray started here), ray://HOST:PORT "
                   "(Ray Client) or ray:HOST:PORT (a cluster's GCS).")
@click.option("--dry-run", is_flag=True, help="Print the expanded job list and stop.")
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=Path("out/farm"), show_default=True,
              help="Folder of the merged report (and jobs/<job>/attempt-<n>/ for every attempt).")
@click.option("--retries", type=click.IntRange(min=0), default=None,
              help="Retries of infrastructure errors per job (default: the plan's, else 2). Numerical failures "
                   "are never retried.")
@click.option("--jobs", "workers", type=click.IntRange(min=1), default=None,
              help="Local worker processes / Ray CPUs of a Ray started here (default: the plan's total concurrency).")
@click.option("--json", "as_json", is_flag=True, help="Print the result (or the --dry-run job list) as JSON.")
@click.option("--history", "history_db", default=None, envvar="BUNDLERUN_HISTORY", metavar="PATH|URL",
              help="History database (default ~/.local/share/bundlerun/history.sqlite).")
@click.option("--no-history", is_flag=True, help="Do not record the jobs in the history database.")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="bundlerun.toml to use (default: searched upward from the current directory).")
@click.option("--target-opt", "target_opts", multiple=True, metavar="KEY=VALUE",
              help="Target setting for every job (a plan's per-target options win).")
@click.option("--shard", default=None, metavar="I/N",
              help="Run only shard I of N of the plan's jobs (stable split by job id; `bundlerun merge` joins the "
                   "shards' reports).")
@click.option("--release-workers", is_flag=True,
              help="Ray: kill the devices' worker actors (and stop the farm gateway) when the command ends (by default "
                   "they stay up, so the next farm against the cluster starts its first job at once; new code gets new "
                   "actors).")
@seal.option
def command(plan_path, executor, dry_run, report_dir, retries, workers, as_json, history_db, no_history, config_path,
            target_opts, shard, release_workers):
    """Run a PLAN of bundles (or zoo models x dtypes to build) x targets (URLs or device pools).

    Each device runs one job at a time; infrastructure errors (exit 2) are retried on the same or
    another device of the pool, numerical failures (exit 1) never. One merged report (JSON, JUnit,
    Markdown, HTML) and one history record per job. Exit codes as `run`: 0, 1, 2.
    See docs/farm.md for the plan format.
    """
    from bundlerun.runner.farm.plan import load_plan, shard_jobs  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.safe_text import visible  # start-up: not loaded by `bundlerun --help`

    shard = parse_shard(shard)  # a bad value: one line, exit 2, before anything is read or built
    plan = load_plan(plan_path, retries)
    report_dir = Path(report_dir)
    jobs, record = shard_jobs(plan.jobs(report_dir.resolve() / "bundles"), shard)
    if record is not None and not (as_json and dry_run):
        click.echo(f"shard {shard}: {len(jobs)} of {len(record['universe'])} jobs", err=True)
    if dry_run:
        _print_jobs(plan, jobs, as_json)
        return
    # before the first job: neither numpy nor SQLAlchemy (the history is written by the results thread)
    from bundlerun.runner.history.location import resolve_history_path  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.farm.run import run_farm  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.settings import Settings  # start-up: not loaded by `bundlerun --help`

    session = Settings.load(config_path, target_opts=tuple(target_opts))
    db = None if no_history else resolve_history_path(history_db, session.project)
    quiet = as_json

    def say(message: str) -> None:
        if not quiet:
            click.echo(visible(message), err=True)  # job ids and URLs come from the plan

    result = run_farm(plan, report_dir, executor=executor, workers=workers, session=session, history_db=db, say=say,
                      shard=shard, require_seal=seal.required(), release_workers=release_workers)
    if as_json:
        import json

        # printed as it is encoded, job by job (result.jobs reads them from disk): json.dumps' one string,
        # and the list of pieces it joins, grew the coordinator's peak memory with the jobs
        doc = {"exit_code": result.exit_code, "report": str(report_dir / "report.json"),
               "summary": result.report.summary.to_json(), "jobs": result.jobs, "devices": result.devices,
               "flaky_jobs": result.report.extras["farm"]["flaky_jobs"]}
        buf: list[str] = []
        size = 0
        for piece in json.JSONEncoder(indent=2, default=str).iterencode(doc):
            buf.append(piece)
            size += len(piece)
            if size >= 1 << 16:
                click.echo("".join(buf), nl=False)
                buf, size = [], 0
        click.echo("".join(buf))
    else:
        from rich.table import Table

        from bundlerun.runner.report.console import plain, wide_console  # start-up: not loaded by `bundlerun --help`

        table = Table(title=f"farm: {len(result.jobs)} jobs, {result.report.extras['farm']['makespan_s']:.1f} s",
                      title_justify="left")
        for col in ("job", "verdict", "attempts", "devices", "flaky"):
            table.add_column(col)
        color = {Verdict.PASS: "green", Verdict.FAIL: "red"}
        for job in result.jobs:
            devs = ", ".join(dict.fromkeys(a["url"] for a in job["attempts"])) or "-"
            table.add_row(plain(job["job"]), f"[{color.get(job['verdict'], 'yellow')}]{job['verdict']}[/]",
                          str(len(job["attempts"])), plain(devs), "flaky" if job["flaky"] else "")
        console = wide_console()
        console.print(table)
        bad = [d for d in result.devices if d["infra_failures"]]
        for d in bad:
            click.echo(f"device {visible(d['url'])}: {d['infra_failures']} of {d['attempts']} attempts failed with an "
                       f"infrastructure error ({d['infra_rate'] * 100:.0f}%)")
    from bundlerun.runner.report.console import echo_must_show, say_report  # start-up: not loaded by `bundlerun --help`

    echo_must_show(result.report)  # jobs missing from the history: said in every output mode
    say_report(result.report, report_dir)
    sys.exit(result.exit_code)
