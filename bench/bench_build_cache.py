"""Build cache: `bundlerun validate MODELS --dtype D` with an empty build cache (every bundle
lowered) and then again with the cache it filled (every bundle copied from the cache, checked
by the integrity checks first). Both are fresh `bundlerun` processes with the same warm
runtime worker design; only the cache differs. The second run must rebuild nothing (its
stderr says "cached build" once per bundle), and give the same verdicts.
Goal: second run at least 5x faster than the first.

    .venv/bin/python bench/bench_build_cache.py                      # zoo x fp32,fp16,int8
    .venv/bin/python bench/bench_build_cache.py --models mlp --dtypes fp32 --cache-dir /tmp/c
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from validate_run import timed_validate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["zoo"])
    parser.add_argument("--dtypes", default="fp32,fp16,int8")
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="build cache to fill (must be empty or absent; default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache_dir or Path(tmp) / "cache"
        if cache.exists() and any(cache.iterdir()):
            raise SystemExit(f"{cache} is not empty: the first run must build everything")
        env = {**os.environ, "BUNDLERUN_CACHE": str(cache)}
        env.pop("BUNDLERUN_WARM_WORKER", None)
        load0 = os.getloadavg()
        first, s1, err1 = timed_validate(args.models, args.dtypes, args.cases, Path(tmp) / "r1", env)
        load1 = os.getloadavg()
        second, s2, err2 = timed_validate(args.models, args.dtypes, args.cases, Path(tmp) / "r2", env)
        load2 = os.getloadavg()
        runs = len(s1["runs"])
        hits1, hits2 = err1.count(": cached build "), err2.count(": cached build ")
        v1 = [(r["run"], r["verdict"]) for r in s1["runs"]]
        v2 = [(r["run"], r["verdict"]) for r in s2["runs"]]
        entries = len([p for p in (cache / "builds").iterdir() if not p.name.startswith(".")])
    print(f"validate {' '.join(args.models)} --dtype {args.dtypes} --cases {args.cases}: {runs} bundles")
    print(f"  first run (empty cache):  {first:7.1f} s, {hits1} cached builds, verdicts {dict(v1)}")
    print(f"  second run (warm cache):  {second:7.1f} s, {hits2} cached builds, verdicts {dict(v2)}")
    print(f"  cache entries written: {entries}")
    print(f"  load average (1/5/15 min) before {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, "
          f"after first {load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}, after second {load2[0]:.2f}/{load2[1]:.2f}/{load2[2]:.2f}")
    problems = []
    if hits1 != 0:
        problems.append(f"the first run found {hits1} cached builds in an empty cache")
    if hits2 != runs:
        problems.append(f"the second run rebuilt {runs - hits2} of {runs} bundles")
    if v1 != v2:
        problems.append("the verdicts differ between the runs")
    ratio = first / second
    print(f"RATIO first/second = {ratio:.2f}x (goal >= 5x)")
    for p in problems:
        print(f"PROBLEM: {p}")
    return 0 if ratio >= 5 and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
