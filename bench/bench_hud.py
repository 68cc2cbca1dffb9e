"""The HUD at scale: first build, +100 runs, the page a person opens, in real Chromium.

For each size (default 1,000 / 10,000 / 100,000 runs: 400 series, a run per series per commit,
bench/hud_synthetic.py, written through the history's API):

1. first build of the site from the history (no state): wall and CPU seconds. Goal at 100k < 60 s.
2. 100 more runs recorded (the next commit), then the build again: only the new runs read, only
   the changed pages written. Goal < 5 s.
3. index.html: bytes (goal < 2 MB) and its load in headless Chromium (/usr/bin/chromium, via
   tests/browser.py): navigation start to the end of the load event, the page's script run
   (goal < 1 s), and a screenshot (bench/out/hud-<size>.png).

Histories are kept in --cache (generating 100k runs takes minutes). Run from the repo root:

    .venv/bin/python bench/bench_hud.py [--sizes 1000,10000,100000] [--cache /tmp/bundlerun-hud-bench]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def build(db: Path, site: Path) -> tuple[float, float, object]:
    from bundlerun.runner.pictures.hud_site import write_site

    t, c = time.perf_counter(), _cpu()
    built = write_site(db, site)
    return time.perf_counter() - t, _cpu() - c, built


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/bundlerun-hud-bench"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = ap.parse_args()
    from browser import check_page
    from hud_synthetic import fill

    args.cache.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    import os
    import tempfile

    args.out = args.out.resolve()
    os.chdir(tempfile.mkdtemp(prefix="bench-hud-"))  # not in a git checkout: runs carry their label, no commit
    # of this repository (runner/history/commits.py detects the working directory's), so columns
    # are in the synthetic runs' time order
    for size in (int(s) for s in args.sizes.split(",")):
        db = args.cache / f"history-{size}.sqlite"
        base = args.cache / f"history-{size}.base.sqlite"
        if not base.exists():
            t = time.perf_counter()
            fill(base, size)
            print(f"generated {size} runs in {time.perf_counter() - t:.0f} s")
        shutil.copy(base, db)  # every measurement starts from the same history
        for suffix in ("-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        # a base generated inside a git checkout (before the chdir above) carries that checkout's
        # commit on every run: its columns then sort by that commit's date, and the +100 runs'
        # column (no commit) lands first, shifting every window: every page rewritten, not what
        # an incremental build of a real history does. Cleared, the columns are in the runs' order.
        import sqlite3

        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE run_tags SET commit_sha = NULL, commit_time = NULL, commit_source = NULL, "
                         "dirty = NULL WHERE commit_sha IS NOT NULL")
        site = args.cache / f"site-{size}"
        shutil.rmtree(site, ignore_errors=True)
        wall, cpu, built = build(db, site)
        print(f"HUD {size} runs: first build {wall:.1f} s wall ({cpu:.1f} s CPU): {built.grid.runs} runs, "
              f"{len(built.grid.rows)} rows x {len(built.grid.columns)} commits, {built.pages_written} pages, "
              f"{built.run_pages_written} run pages")
        commits = len(built.grid.columns)
        fill(db, 100, first_commit=commits)
        wall2, cpu2, built2 = build(db, site)
        print(f"HUD {size} runs: +100 runs {wall2:.2f} s wall ({cpu2:.2f} s CPU): {built2.new_runs} read, "
              f"{built2.pages_written} pages written, {built2.pages_kept} unchanged, {built2.run_pages_written} run pages")
        index = site / "index.html"
        shot = args.out / f"hud-{size}.png"
        page = check_page(index.as_uri(), shot, width=1600, evaluate=(
            "(function(){var n=performance.getEntriesByType('navigation')[0];"
            "return {load: n.loadEventEnd - n.startTime, dom: n.domContentLoadedEventEnd - n.startTime};})()"))
        load = page.evaluated["load"]
        print(f"HUD {size} runs: index.html {index.stat().st_size / 1e6:.2f} MB, Chromium load {load:.0f} ms "
              f"(DOM ready {page.evaluated['dom']:.0f} ms), console errors {len(page.console_errors)}, screenshot {shot}")
        print(f"RATIO hud_first_build_{size} {wall / 60:.3f} (goal <= 1: 60 s)")
        print(f"RATIO hud_plus100_{size} {wall2 / 5:.3f} (goal <= 1: 5 s)")
        print(f"RATIO hud_index_bytes_{size} {index.stat().st_size / 2e6:.3f} (goal <= 1: 2 MB)")
        print(f"RATIO hud_chromium_load_{size} {load / 1000:.3f} (goal <= 1: 1 s)")


if __name__ == "__main__":
    main()
