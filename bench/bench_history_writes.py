"""History writes per second: SQLite (the embedded default) vs PostgreSQL (a shared history), with
1 and with 16 concurrent writer processes, side by side in one run.

Each writer is tests/history_writer.py in its own process: N runs of a 3-case report, one
transaction each (runs, case_outputs, run_tags rows; what `bundlerun run` records), through the
history's one code path (runner/history/store.py). PostgreSQL is a private server from Debian's
package (tests/pg_server.py), a fresh database per measurement; SQLite a fresh file in a temp dir.
Runs/s = all runs recorded / the wall time from the first writer's start of writing to the last
writer's end (each writer reports its own write time; process start-up is not counted).

    .venv/bin/python bench/bench_history_writes.py [--runs 250] [--writers 1,16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

WRITER = ROOT / "tests" / "history_writer.py"


def measure(history: str, writers: int, runs: int) -> dict:
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(WRITER), history, str(w), str(runs)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT) for w in range(writers)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"writer failed: {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - started
    ids = [i for r in results for i in r["ids"]]
    assert len(set(ids)) == writers * runs, "a run was lost or recorded twice"
    slowest = max(r["seconds"] for r in results)
    return {"writers": writers, "runs": len(ids), "slowest_writer_s": round(slowest, 2), "wall_s": round(wall, 2),
            "runs_per_s": round(len(ids) / slowest, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=250, help="runs per writer")
    parser.add_argument("--writers", default="1,16")
    args = parser.parse_args()
    from pg_server import PgServer

    counts = [int(w) for w in args.writers.split(",")]
    print(f"load average before: {os.getloadavg()}", flush=True)
    server = PgServer.start()
    table: dict[tuple[str, int], dict] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for writers in counts:
                for backend in ("sqlite", "postgresql"):
                    history = (str(Path(tmp) / f"h{writers}.sqlite") if backend == "sqlite"
                               else server.create_database(f"bench{writers}"))
                    result = measure(history, writers, args.runs)
                    table[(backend, writers)] = result
                    print(f"{backend:10s} {writers:2d} writer(s) x {args.runs} runs: {result['runs_per_s']:7.1f} runs/s "
                          f"(slowest writer {result['slowest_writer_s']} s, wall {result['wall_s']} s, "
                          f"load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        server.stop()
    for writers in counts:
        ratio = table[("postgresql", writers)]["runs_per_s"] / table[("sqlite", writers)]["runs_per_s"]
        print(f"RATIO postgresql/sqlite runs/s at {writers} writer(s): {ratio:.2f}")
    print(f"load average after: {os.getloadavg()}")
    print("RESULTS " + json.dumps({f"{b}-{w}": r for (b, w), r in table.items()}))


if __name__ == "__main__":
    main()
