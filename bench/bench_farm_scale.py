"""The farm at scale on a real local Ray cluster: 200 and 2,000 short jobs over 50 simulated devices.

A Ray cluster of one node with the 50 devices as custom resources (tests/ray_fixture.py; the
devices are tests/fixtures/sim_device.py, `sim://emu-N?sleep=S`, registered through
$BUNDLERUN_TARGETS). For each plan size:

- makespan / ideal: the farm's makespan (report `farm.makespan_s`) over the sum of the job
  times (submit to result, as the coordinator measured them) / devices. Goal <= 1.2.
- coordinator RSS: the `bundlerun farm` process's peak resident memory (getrusage at exit).
  Goal: flat from 200 to 2,000 jobs.
- every job one verdict (PASS), and how many Ray actors ran them.

Then the second command: a plan of one job against the same cluster, where the devices' actors
are up from the runs before (runner/farm/ray_workers.py): seconds from the process's start to the
job's start on its device, with where the time went (import ray, connect, actor lookup), vs a
first command with no actor up (after --release-workers). Goal < 1 s. And the same 200 jobs on
the local executor (a process pool) for the makespan ratio side by side.

    .venv/bin/python bench/bench_farm_scale.py [--devices 50] [--jobs 200,2000] [--sleep 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "BUNDLERUN_TARGETS": "tests.fixtures.sim_device",
       "RAY_AUTH_MODE": "disabled"}
# the coordinator's start time and peak RSS, printed by the process itself
LAUNCH = ("import resource, sys, time, atexit; T0 = time.time(); "
          "atexit.register(lambda: print('COORD', T0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
          "file=sys.stderr)); from bundlerun.runner.cli import main; main()")


def bundlerun(*args: str, timeout: float = 3600, env: dict[str, str] | None = None
              ) -> tuple[subprocess.CompletedProcess, float, int]:
    r = subprocess.run([sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, env={**ENV, **(env or {})},
                       timeout=timeout)
    line = next((x for x in r.stderr.splitlines() if x.startswith("COORD ")), "COORD 0 0")
    _, t0, rss = line.split()
    return r, float(t0), int(rss)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def plan(folder: Path, name: str, devices: int, sleep: float, pattern: str) -> Path:
    devs = ", ".join(f'"sim://emu-{i}?sleep={sleep}"' for i in range(1, devices + 1))
    path = folder / f"{name}.toml"
    path.write_text(f'bundles = ["{pattern}"]\ntargets = ["pool:phones"]\nretries = 2\n'
                    f'[pools.phones]\ndevices = [{devs}]\n')
    return path


def farm(plan_path: Path, report: Path, *extra: str, env: dict[str, str] | None = None
         ) -> tuple[dict, dict, float, int, float]:
    t = time.time()
    r, t0, rss = bundlerun("farm", str(plan_path), "--report", str(report), "--no-history", "--json", *extra, env=env)
    if r.returncode not in (0, 1):
        raise SystemExit(f"farm failed ({r.returncode}): {r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    if not r.stdout.strip():
        raise SystemExit(f"farm printed no result ({r.returncode}): {r.stderr[-3000:]}")
    try:
        result = json.loads(r.stdout)
    except ValueError:
        raise SystemExit(f"farm printed no JSON ({r.returncode}): {r.stdout[:1500]!r}\n{r.stderr[-2000:]}") from None
    return result, json.loads((report / "report.json").read_text()), t0 or t, rss, time.time() - t


def first_start(result: dict, merged: dict, t0: float) -> float:
    """Seconds from the process's start to the first job's start on its device."""
    starts = []
    for j in result["jobs"]:
        rep = json.loads(Path(j["report"]).read_text())
        farm = rep.get("farm") or {}
        if farm.get("started_unix"):
            starts.append(farm["started_unix"])
    return min(starts) - t0


def breakdown(result: dict, merged: dict, devices: int) -> str:
    """Where the makespan went, in device-seconds over the devices (each term / devices): the job on
    its device's actor (bundle written, read, run, judged: the report's farm.elapsed_s), dispatch and
    return (coordinator submit -> result, minus that), each device idle between its jobs (its result
    in -> its next submit: the coordinator's turnaround), and the start (farm start -> a device's first
    submit) and end (a device's last result -> the makespan's end)."""
    t0 = merged["farm"]["started_unix"]
    end = t0 + merged["farm"]["makespan_s"]
    work = dispatch = idle = start = tail = 0.0
    per_device: dict[str, list[tuple[float, float]]] = {}
    for j in result["jobs"]:
        for a in j["attempts"]:
            rep = json.loads((Path(j["report"]).parent.parent / f"attempt-{a['attempt']}" / "report.json").read_text())
            worker = float((rep.get("farm") or {}).get("elapsed_s") or 0.0)
            work += worker
            dispatch += a["elapsed_s"] - worker
            per_device.setdefault(a["device"] or a["url"], []).append((a["submitted_unix"], a["submitted_unix"] + a["elapsed_s"]))
    for spans in per_device.values():
        spans.sort()
        start += spans[0][0] - t0
        tail += end - spans[-1][1]
        idle += sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:]))
    start += (devices - len(per_device)) * (end - t0)  # a device that ran nothing was idle throughout
    parts = {"job on the actor": work, "dispatch+return": dispatch, "idle between jobs": idle, "start": start,
             "end": tail}
    return ", ".join(f"{k} {v / devices:.2f} s" for k, v in parts.items()) + f" (sum {sum(parts.values()) / devices:.2f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=50)
    ap.add_argument("--jobs", default="200,2000")
    ap.add_argument("--sleep", type=float, default=0.5)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--no-local", action="store_true")
    args = ap.parse_args()
    sizes = [int(x) for x in args.jobs.split(",")]
    sys.path.insert(0, str(ROOT / "tests"))
    from ray_fixture import RayCluster

    with tempfile.TemporaryDirectory(prefix="bench-farm-scale-") as tmp:
        folder = Path(tmp)
        (folder / "bundles").mkdir()
        r, _, _ = bundlerun("build", "mlp", "--backend", "portable", "--cases", "2", "-o", str(folder / "mlp.bpte"))
        if r.returncode != 0:
            raise SystemExit(f"build failed: {r.stderr[-2000:]}")
        for i in range(max(sizes)):
            shutil.copy(folder / "mlp.bpte", folder / "bundles" / f"job{i:05d}.bpte")
        (folder / "one").mkdir()
        shutil.copy(folder / "mlp.bpte", folder / "one" / "one.bpte")
        print(f"load average at start: {load()} (2 cores shared with other work)")
        cluster = RayCluster({k: ENV[k] for k in ("PYTHONPATH", "BUNDLERUN_TARGETS")}, cpus_per_node=args.cpus)
        try:
            t = time.perf_counter()
            cluster.start({f"adb:emu-{i}": 1 for i in range(1, args.devices + 1)}, [])
            print(f"ray: one node, {args.cpus} CPUs, {args.devices} device resources; up in {time.perf_counter() - t:.1f} s")
            address = f"ray:{cluster.address}"
            one = plan(folder, "one", args.devices, args.sleep, "one/*.bpte")
            # a first command with no actor up: it starts them (not counted in the sizes below)
            res, merged, t0, rss, wall = farm(one, folder / "cold", "--executor", address)
            print(f"cold command (no actor up): first job started {first_start(res, merged, t0):.2f} s after the "
                  f"process started; timing {merged['farm']['executor'].get('timing')}; whole command {wall:.1f} s")
            warmup = folder / "warmup"  # one job per device: every device's actor up before the timed plans
            warmup.mkdir()
            for i in range(args.devices):
                os.link(folder / "bundles" / f"job{i:05d}.bpte", warmup / f"w{i:05d}.bpte")
            res, merged, t0, rss, wall = farm(plan(folder, "warmup", args.devices, args.sleep, "warmup/*.bpte"),
                                              folder / "warm-up", "--executor", address)
            print(f"warm-up: {len(res['jobs'])} jobs, one per device, {wall:.1f} s (the devices' actors start)")
            rows = []
            for n in sizes:
                sub = folder / f"b{n}"
                sub.mkdir()
                for i in range(n):
                    os.link(folder / "bundles" / f"job{i:05d}.bpte", sub / f"job{i:05d}.bpte")
                p = plan(folder, f"p{n}", args.devices, args.sleep, f"b{n}/*.bpte")
                res, merged, t0, rss, wall = farm(p, folder / f"ray{n}", "--executor", address)
                jobs = res["jobs"]
                verdicts = [j["verdict"] for j in jobs]
                times = [a["elapsed_s"] for j in jobs for a in j["attempts"]]
                makespan = merged["farm"]["makespan_s"]
                ideal = sum(times) / args.devices
                actors = {a["node"].get("ray_worker_id") for j in jobs for a in j["attempts"]}
                ok = len(jobs) == n and all(v == "PASS" for v in verdicts)
                rows.append((n, makespan, ideal, rss))
                print(f"ray {n} jobs: makespan {makespan:.1f} s, ideal {ideal:.1f} s (sum of job times / {args.devices}), "
                      f"device time only {n * args.sleep / args.devices:.1f} s; coordinator peak RSS {rss / 1024:.0f} MB; "
                      f"{len(jobs)} jobs, all one PASS verdict: {ok}; {len(actors)} actor processes; "
                      f"whole command {wall:.1f} s; load {load()}")
                print(f"ray {n} jobs, where the makespan went (per device): {breakdown(res, merged, args.devices)}; "
                      f"results thread: at most {merged['farm']['results']['peak_backlog']} jobs waiting to be written")
                print(f"RATIO ray_{n}_makespan_over_ideal {makespan / ideal:.3f} (goal <= 1.2)")
            if len(rows) > 1:
                print(f"RATIO coordinator_rss_{rows[-1][0]}_over_{rows[0][0]} {rows[-1][3] / rows[0][3]:.3f} "
                      f"({rows[0][3] / 1024:.0f} MB -> {rows[-1][3] / 1024:.0f} MB; goal: flat)")
            # the second command: actors (and the gateway) up; then the same command as its own Ray
            # driver (BUNDLERUN_FARM_GATEWAY=0: import ray + connect in the command), side by side
            starts = {}
            for mode, env in (("gateway", {}), ("in-process driver", {"BUNDLERUN_FARM_GATEWAY": "0"})):
                for k in range(3):
                    res, merged, t0, rss, wall = farm(one, folder / f"warm-{len(starts)}-{k}", "--executor", address,
                                                      env=env)
                    warm = first_start(res, merged, t0)
                    starts.setdefault(mode, []).append(warm)
                    ex = merged["farm"]["executor"]
                print(f"second command, {mode} (actors up, reused {ex['workers']['reused']}): first job started "
                      f"{', '.join(f'{x:.2f}' for x in starts[mode])} s after the process started (3 commands); "
                      f"timing {ex.get('timing')}; gateway {ex.get('gateway')}; whole command {wall:.1f} s; "
                      f"load {load()}")
            best = {m: sorted(v)[len(v) // 2] for m, v in starts.items()}
            print(f"RATIO second_command_first_job_start {best['gateway']:.3f} (goal <= 1: 1 s; median of 3)")
            print(f"RATIO second_command_gateway_over_in_process {best['gateway'] / best['in-process driver']:.3f} "
                  f"({best['gateway']:.2f} s vs {best['in-process driver']:.2f} s)")
            res, merged, t0, rss, wall = farm(one, folder / "release", "--executor", address, "--release-workers")
            print(f"--release-workers: released; whole command {wall:.1f} s")
        finally:
            left = cluster.stop()
            assert not left, f"Ray processes left: {left}"
        if not args.no_local:
            n = sizes[0]
            p = plan(folder, f"local{n}", args.devices, args.sleep, f"b{n}/*.bpte")
            res, merged, t0, rss, wall = farm(p, folder / f"local{n}", "--jobs", str(args.devices))
            times = [a["elapsed_s"] for j in res["jobs"] for a in j["attempts"]]
            makespan = merged["farm"]["makespan_s"]
            print(f"local {n} jobs ({args.devices} pool workers): makespan {makespan:.1f} s, ideal "
                  f"{sum(times) / args.devices:.1f} s; coordinator peak RSS {rss / 1024:.0f} MB; load {load()}")
            print(f"RATIO local_{n}_makespan_over_ideal {makespan / (sum(times) / args.devices):.3f}; "
                  f"ray/local makespan {rows[0][1] / makespan:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
