"""A history writer process for the load and crash tests (tests/test_history_postgres.py) and
bench/bench_history_writes.py: `python tests/history_writer.py HISTORY WORKER N [--hold-in-transaction]`.

Records N runs one transaction each (a report of 3 cases x 1 output, as `bundlerun run` records
it: runs, case_outputs, run_tags rows), run ids `w{WORKER}-{k}`, labels the same, and prints one
JSON line {"ids": [...], "seconds": S} (S: the writes only, not the start-up). With
--hold-in-transaction it records one run but stops inside the transaction, after the runs row is
written and before its tags row, prints "HOLDING" and waits to be killed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import report_samples  # noqa: E402

from bundlerun.runner.history import schema  # noqa: E402
from bundlerun.runner.history import store as history  # noqa: E402
from bundlerun.runner.report.model import Report  # noqa: E402


def report_for(worker: int, k: int, base: dict) -> Report:
    report = Report.from_json(base)
    report.run["id"] = f"w{worker}-{k}"
    report.run["label"] = f"w{worker}-{k}"
    return report


def main() -> None:
    db, worker, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    base = report_samples.quick_report(cases=3, seed=worker)
    if "--hold-in-transaction" in sys.argv:
        real = history._table_rows

        def hold(table, rows):
            if table is schema.run_tags:
                print("HOLDING", flush=True)
                time.sleep(3600)
            return real(table, rows)

        history._table_rows = hold
    reports = [report_for(worker, k, base) for k in range(n)]
    started = time.perf_counter()
    ids = [history.record_report(db, r) for r in reports]
    print(json.dumps({"ids": ids, "seconds": time.perf_counter() - started}), flush=True)


if __name__ == "__main__":
    main()
