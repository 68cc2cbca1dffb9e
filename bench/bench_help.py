"""Wall time of `bundlerun --help` (fresh process each time). Goal: under 0.5 s."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    times = []
    for _ in range(7):
        t = time.perf_counter()
        subprocess.run([exe, "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(f"bundlerun --help: median {med:.3f} s, best {min(times):.3f} s over {len(times)} runs (goal < 0.5 s)")
    return 0 if med < 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
