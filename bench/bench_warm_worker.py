"""Warm runtime worker: `bundlerun validate MODELS --dtype D` on host://xnnpack with one runtime
child per bundle (the design before warm workers, forced with BUNDLERUN_WARM_WORKER=0) vs one
warm worker per target reused across the bundles of the command (the default). Builds come from
a build cache filled before timing (untimed), so both sides time the same thing: the command
minus lowering. Fresh `bundlerun` processes, alternated (cold, warm, cold, warm, ...), best and
median of N each; verdicts must be the same on both sides, and the warm side's reports must
show one worker started and reused by every later bundle.
Goal: warm/cold wall time <= 0.4.

    .venv/bin/python bench/bench_warm_worker.py                     # zoo x fp32,fp16,int8, 2 rounds
    .venv/bin/python bench/bench_warm_worker.py --models mlp tiny-cnn --dtypes fp32 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from validate_run import timed_validate


def validate(models: list[str], dtypes: str, cases: int, report: Path, env: dict[str, str]) -> tuple[float, dict, int]:
    elapsed, summary, err = timed_validate(models, dtypes, cases, report, env, "--target", "host://xnnpack")
    return elapsed, summary, err.count(": cached build ")


def workers(summary: dict) -> list[str | None]:
    out = []
    for run in summary["runs"]:
        report = json.loads(Path(run["report"]).read_text())
        out.append(report["target"]["info"].get("worker"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["zoo"])
    parser.add_argument("--dtypes", default="fp32,fp16,int8")
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=None, help="build cache to use (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache_dir or Path(tmp) / "cache"
        base = {**os.environ, "BUNDLERUN_CACHE": str(cache)}
        base.pop("BUNDLERUN_WARM_WORKER", None)
        t = time.perf_counter()
        _, warmup, _ = validate(args.models, args.dtypes, args.cases, Path(tmp) / "prewarm", base)  # fills the cache
        print(f"build cache filled in {time.perf_counter() - t:.1f} s (untimed): {len(warmup['runs'])} bundles")
        cold_env = {**base, "BUNDLERUN_WARM_WORKER": "0"}
        cold, warm, loads = [], [], []
        verdicts: dict[str, list] = {"cold": [], "warm": []}
        kinds: dict[str, list] = {"cold": [], "warm": []}
        rebuilt: list[str] = []
        for i in range(args.rounds):
            for side, env, times in (("cold", cold_env, cold), ("warm", base, warm)):
                load = os.getloadavg()[0]
                elapsed, summary, hits = validate(args.models, args.dtypes, args.cases, Path(tmp) / f"{side}{i}", env)
                if hits != len(summary["runs"]):  # bundlerun's bundles/ code changed under us: builds got timed
                    rebuilt.append(f"round {i + 1} {side}: {len(summary['runs']) - hits} bundles rebuilt")
                times.append(elapsed)
                loads.append(load)
                verdicts[side].append([(r["run"], r["verdict"]) for r in summary["runs"]])
                kinds[side].append(workers(summary))
                print(f"  round {i + 1} {side:4}: {elapsed:7.1f} s (load average at start {load:.2f})", flush=True)
    n = len(warmup["runs"])
    print(f"validate {' '.join(args.models)} --dtype {args.dtypes} --cases {args.cases} on host://xnnpack: {n} bundles, "
          f"builds from the cache")
    print(f"  one child per bundle: best {min(cold):.1f} s, median {statistics.median(cold):.1f} s  {[round(x, 1) for x in cold]}")
    print(f"  warm worker:          best {min(warm):.1f} s, median {statistics.median(warm):.1f} s  {[round(x, 1) for x in warm]}")
    print(f"  load average (1 min) at the start of each run: {[round(x, 2) for x in loads]}; now {os.getloadavg()}")
    problems = [f"not every build came from the cache ({r})" for r in rebuilt]
    if any(v != verdicts["cold"][0] for v in verdicts["cold"] + verdicts["warm"]):
        problems.append("verdicts differ between runs")
    if any(any(k is not None for k in ks) for ks in kinds["cold"]):
        problems.append("a cold run used a warm worker")
    for ks in kinds["warm"]:
        if ks[:1] != ["warm, started"] or any(k != "warm, reused" for k in ks[1:]):
            problems.append(f"a warm run did not reuse one worker: {ks}")
    ratio_best = min(warm) / min(cold)
    ratio_median = statistics.median(warm) / statistics.median(cold)
    print(f"RATIO warm/cold = {ratio_best:.3f} (best), {ratio_median:.3f} (median) (goal <= 0.4)")
    for p in problems:
        print(f"PROBLEM: {p}")
    return 0 if ratio_best <= 0.4 and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
