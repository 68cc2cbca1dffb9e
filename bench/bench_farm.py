"""Farm scheduling: 40 short jobs over a pool of 4 simulated devices.

1. local executor: the farm's makespan (from the start of `run_farm` to the last job's end:
   worker start-up included) vs the ideal, sum of the job times / 4 devices. Job time = what
   the coordinator measured per attempt (submit to result: the device's sleep plus reading,
   judging and writing the job's report). Goal <= 1.15.
2. the same plan on a real Ray cluster already running on this machine (one node, the 4
   devices as custom resources) vs the local executor: makespan of each and overhead per job
   (attempt time minus the device's busy time), mean and median.
3. one device of the pool made flaky (30% of its jobs fail with a transport error), 8 of the
   40 bundles failing numerically: every job must end with a verdict, no job with a numerical
   failure may have been retried, and the flaky device must come first in the device table.

The simulated device is tests/fixtures/sim_device.py (registered through $BUNDLERUN_TARGETS,
never on the user's path). Prints RATIO lines; run from the repo root:

    .venv/bin/python bench/bench_farm.py [--sleep 0.5] [--jobs 40] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "BUNDLERUN_TARGETS": "tests.fixtures.sim_device",
       "RAY_AUTH_MODE": "disabled"}  # the loopback test cluster of tests/ray_fixture.py runs without token auth
DEVICES = 4


def bundlerun(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from bundlerun.runner.cli import main; main()", *args],
                          capture_output=True, text=True, env=ENV, timeout=timeout)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def make_bundles(folder: Path, n: int, failing: int) -> None:
    import shutil

    src = folder / "mlp.bpte"
    r = bundlerun("build", "mlp", "--backend", "portable", "--cases", "2", "-o", str(src))
    if r.returncode != 0:
        raise SystemExit(f"build failed: {r.stderr[-2000:]}")
    for i in range(n - failing):
        shutil.copy(src, folder / f"job{i:02d}.bpte")
    for i in range(n - failing, n):  # the simulated devices fail these numerically (fail_match)
        shutil.copy(src, folder / f"bad{i:02d}.bpte")
    src.unlink()


def plan(folder: Path, name: str, sleep: float, flaky: float = 0.0, retries: int = 2) -> Path:
    devices = [f'"sim://emu-{i}?sleep={sleep}"' for i in range(1, DEVICES)]
    devices.append(f'"sim://emu-{DEVICES}?sleep={sleep}' + (f'&flaky={flaky}"' if flaky else '"'))
    path = folder / f"{name}.toml"
    path.write_text(f'bundles = ["bundles/*.bpte"]\ntargets = ["pool:phones"]\nretries = {retries}\n'
                    f'[pools.phones]\ndevices = [{", ".join(devices)}]\noptions = {{fail_match = "bad*"}}\n')
    return path


def farm(plan_path: Path, report: Path, *extra: str) -> tuple[dict, dict, float]:
    t = time.perf_counter()
    r = bundlerun("farm", str(plan_path), "--report", str(report), "--no-history", "--json", *extra)
    wall = time.perf_counter() - t
    if r.returncode not in (0, 1):
        raise SystemExit(f"farm failed ({r.returncode}): {r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout), json.loads((report / "report.json").read_text()), wall


def overheads(result: dict, sleep: float) -> list[float]:
    return [a["elapsed_s"] - sleep for j in result["jobs"] for a in j["attempts"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sleep", type=float, default=0.5, help="device time per job (s)")
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the Ray node (this machine has 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-farm-") as tmp:
        folder = Path(tmp)
        (folder / "bundles").mkdir()
        make_bundles(folder / "bundles", args.jobs, failing=0)
        print(f"load average at start: {load()}")

        # 1. local makespan vs ideal
        result, merged, wall = farm(plan(folder, "local", args.sleep), folder / "local")
        jobs = result["jobs"]
        assert len(jobs) == args.jobs and all(j["verdict"] == "PASS" for j in jobs), "every job must pass"
        job_times = [a["elapsed_s"] for j in jobs for a in j["attempts"]]
        makespan = merged["farm"]["makespan_s"]
        ideal = sum(job_times) / DEVICES
        nominal = args.jobs * args.sleep / DEVICES
        per_device = {}
        for j in jobs:
            for a in j["attempts"]:
                per_device[a["device"]] = per_device.get(a["device"], 0) + 1
        print(f"local: {args.jobs} jobs x {args.sleep} s device time over {DEVICES} devices, "
              f"jobs per device {dict(sorted(per_device.items()))}")
        print(f"local: makespan {makespan:.2f} s (whole command {wall:.2f} s); sum of job times {sum(job_times):.2f} s, "
              f"ideal {ideal:.2f} s; device time only: ideal {nominal:.2f} s")
        print(f"RATIO local makespan / ideal = {makespan / ideal:.3f} (goal <= 1.15); "
              f"vs device-time-only ideal = {makespan / nominal:.3f}; load {load()}")
        local_over = overheads(result, args.sleep)

        # 2. Ray vs local
        if not args.no_ray:
            sys.path.insert(0, str(ROOT / "tests"))
            from ray_fixture import RayCluster

            cluster = RayCluster({k: ENV[k] for k in ("PYTHONPATH", "BUNDLERUN_TARGETS")}, cpus_per_node=args.ray_cpus)
            try:
                t = time.perf_counter()
                cluster.start({f"adb:emu-{i}": 1 for i in range(1, DEVICES + 1)}, [])
                print(f"ray: one node, {args.ray_cpus} CPUs, 4 device resources; up in {time.perf_counter() - t:.1f} s "
                      f"(not counted)")
                rounds = []
                for rnd in range(2):  # the first round also starts Ray's workers
                    r_result, r_merged, r_wall = farm(plan(folder, "ray", args.sleep), folder / f"ray{rnd}",
                                                      "--executor", f"ray:{cluster.address}")
                    assert all(j["verdict"] == "PASS" for j in r_result["jobs"])
                    rounds.append((r_merged["farm"]["makespan_s"], overheads(r_result, args.sleep), r_wall))
                    workers = {a["node"].get("ray_worker_id") for j in r_result["jobs"] for a in j["attempts"]}
                    over = sorted(rounds[-1][1])
                    print(f"ray round {rnd + 1}: makespan {rounds[-1][0]:.2f} s (whole command {r_wall:.2f} s), "
                          f"overhead per job mean {statistics.mean(over) * 1000:.0f} ms, median "
                          f"{statistics.median(over) * 1000:.0f} ms, worst 5 {[round(x, 2) for x in over[-5:]]} s; "
                          f"{len(workers)} distinct Ray worker processes ran the {len(over)} jobs; load {load()}")
            finally:
                left = cluster.stop()
                assert not left, f"Ray processes left: {left}"
            print(f"local: overhead per job mean {statistics.mean(local_over) * 1000:.0f} ms, median "
                  f"{statistics.median(local_over) * 1000:.0f} ms")
            best = min(rounds)
            print(f"RATIO ray makespan / local makespan = {best[0] / makespan:.3f} (warm round); overhead per job "
                  f"ray - local = {(statistics.median(best[1]) - statistics.median(local_over)) * 1000:+.0f} ms (median)")

        # 3. a flaky device, numerical failures
        for f in (folder / "bundles").glob("*.bpte"):
            f.unlink()
        make_bundles(folder / "bundles", args.jobs, failing=8)
        result, merged, wall = farm(plan(folder, "flaky", args.sleep, flaky=0.3), folder / "flaky")
        jobs = result["jobs"]
        verdicts = {j["verdict"] for j in jobs}
        numerical_retried = [j["job"] for j in jobs if any(a["exit_code"] == 1 for a in j["attempts"][:-1])]
        failing = [j for j in jobs if j["verdict"] == "FAIL"]
        worst = result["devices"][0]
        flaky_jobs = [j["job"] for j in jobs if j["flaky"]]
        retries = sum(len(j["attempts"]) - 1 for j in jobs)
        print(f"flaky: {len(jobs)} jobs, verdicts {sorted(verdicts)}: PASS {sum(j['verdict'] == 'PASS' for j in jobs)}, "
              f"FAIL {len(failing)}, ERROR {sum(j['verdict'] == 'ERROR' for j in jobs)}; {retries} retries, "
              f"{len(flaky_jobs)} jobs flaky (passed after a retry); makespan {merged['farm']['makespan_s']:.2f} s")
        for d in result["devices"]:
            print(f"  device {d['resource']}: {d['attempts']} attempts, {d['infra_failures']} infrastructure failures "
                  f"({d['infra_rate'] * 100:.0f}%), {d['numerical_failures']} numerical failures")
        ok = (all(j["verdict"] in ("PASS", "FAIL", "ERROR") for j in jobs) and not numerical_retried
              and len(failing) == 8 and worst["resource"] == f"adb:emu-{DEVICES}" and worst["infra_failures"] > 0)
        print(f"RESULT flaky device named: {worst['resource']} ({worst['infra_rate'] * 100:.0f}% infrastructure "
              f"errors); numerical failures retried: {len(numerical_retried)}; every job has a verdict: "
              f"{all(j['verdict'] for j in jobs)} -> {'OK' if ok else 'NOT OK'}; load {load()}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
