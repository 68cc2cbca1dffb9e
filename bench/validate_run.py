"""One timed `bundlerun validate ... --json` in a fresh process, shared by the benchmarks that
compare whole validations (build cache, warm worker)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def timed_validate(models: list[str], dtypes: str, cases: int, report: Path, env: dict[str, str],
                   *extra: str) -> tuple[float, dict, str]:
    """(wall seconds, the --json summary, stderr); exits with the error if validate printed no JSON."""
    cmd = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "validate", *models,
           "--dtype", dtypes, "--cases", str(cases), "--report", str(report), "--no-history", "--json", *extra]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"validate failed ({proc.returncode}): {proc.stderr[-3000:]}") from None
    return elapsed, summary, proc.stderr
