"""Synthetic history for the HUD bench: N runs over a grid of series x commits, written through the
history's own API (runner/history/store.py record_reports), from reports made by the real judge.

One real report per series is judged once (tests/report_samples.py: a real bundle, a real judge);
each run is a copy with its own run uuid, label (the commit), start time and a planted SQNR drop for
a few series, so the grid has regressions to show. Used by bench/bench_hud.py.
"""

from __future__ import annotations

import copy
import datetime as dt
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

MODELS = 40
TARGETS = ("host://xnnpack", "host://portable", "tosa://int", "qemu://cortex-m55", "android://htp")
DTYPES = ("fp32", "int8")
BACKENDS = {"host://xnnpack": "xnnpack", "host://portable": "portable", "tosa://int": "arm",
            "qemu://cortex-m55": "cortex_m", "android://htp": "qnn"}


def series() -> list[tuple[str, str, str]]:
    """400 series: 40 models x 5 targets x 2 dtypes."""
    return [(f"model{m:03d}", t, d) for m in range(MODELS) for t in TARGETS for d in DTYPES]


def _templates() -> dict[tuple[str, str], dict]:
    """(dtype, ok|bad) -> a report judged by the real judge."""
    from report_samples import make_bundle, make_report, target_run

    out = {}
    for dtype in DTYPES:
        bundle = make_bundle(cases=2, model="m", dtype=dtype)
        for kind, noise in (("ok", 1e-5), ("bad", 3e-3)):
            out[(dtype, kind)] = make_report(bundle, target_run(bundle, noise=noise), label="x",
                                             started="2026-01-01T00:00:00+00:00")
    return out


def fill(db: Path, runs: int, first_commit: int = 0, batch: int = 2000) -> int:
    """Record `runs` runs into `db`: commit after commit (each commit one run per series, in order),
    starting at commit index `first_commit`; returns the next commit index."""
    from bundlerun.runner.history import store as history
    from bundlerun.runner.report.model import Report

    templates = _templates()
    rows = series()
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    items: list = []
    commit, done = first_commit, 0
    while done < runs:
        label = f"{commit:012x}"
        started = (t0 + dt.timedelta(hours=commit)).isoformat()
        for si, (model, target, dtype) in enumerate(rows):
            if done >= runs:
                break
            bad = si % 37 == 0 and commit % 100 >= 60  # a few series regress for a while
            report = copy.deepcopy(templates[(dtype, "bad" if bad else "ok")])
            report["run"]["id"] = uuid.uuid4().hex
            report["run"]["label"] = label
            report["run"]["started"] = started
            report["target"]["url"] = target
            report["bundle"]["model"] = model
            report["bundle"]["backend"] = BACKENDS[target]
            items.append((Report.from_json(report), None, None))
            done += 1
            if len(items) >= batch:
                history.record_reports(db, items)
                items = []
        commit += 1
    if items:
        history.record_reports(db, items)
    return commit


if __name__ == "__main__":
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    print(fill(Path(sys.argv[1]), n))
