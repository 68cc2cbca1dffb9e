"""numpy imported in the `bundlerun` process with its OpenBLAS pool held to one thread.

numpy's wheel carries OpenBLAS (scipy-openblas 0.3.27 with numpy 2.1), which starts one thread per core
when numpy is imported; each spins waiting for work for OpenBLAS's thread timeout (THREAD_TIMEOUT 28: 2^28
cycles, driver/others/blas_server.c) before it sleeps, after its start and again after each BLAS call it
shares. On this project's 2-core machine that took 0.15 s of process CPU over a 0.3 s sleep after
`import numpy`, 0.05 s with OPENBLAS_NUM_THREADS=1 (bundlerun's own measurement). `bundlerun run` imports
numpy while its target's runtime loads (runner/session.py Judging.meanwhile) and judges while it runs, so
the spin took the core the runtime needed: on the 192-step tiny llama run on qemu-user://aarch64 the runner
reached its loop 80-98 ms after its spawn instead of 61-62 ms, the CLI used 0.44-0.49 s of CPU instead of
0.35-0.37 s, and the run took 0.78-0.82 s instead of 0.74-0.76 s (bench/bench_llm_sequence.py). The
judging does no BLAS work worth a second thread (element-wise passes over each output,
runner/judging/numerics.py), so the CLI's numpy gets one.

Only the command's own process (cli.main arms it, as runner/judging/heap.py's setting); a library caller's
numpy is its own. A thread count the user set (OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS:
what OpenBLAS reads, driver/others/openblas_env.c) wins. The variable is set only while numpy is imported:
the processes bundlerun starts inherit the user's environment as it was (one started by another thread in
those few milliseconds would see it, and its own numpy would have one OpenBLAS thread: a speed matter, never a
result).
"""

from __future__ import annotations

import os
import sys
import threading

# what OpenBLAS reads for its thread count (driver/others/openblas_env.c), any of which the user may have set
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_armed = False
_lock = threading.Lock()


def arm() -> None:
    """Called by the `bundlerun` command: its process's numpy is imported by `import_numpy` with one BLAS thread."""
    global _armed
    _armed = True


def import_numpy() -> bool:
    """Import numpy (nothing when it is imported already); True when it was imported here with one OpenBLAS
    thread (armed, and no thread count set by the user)."""
    with _lock:
        if "numpy" in sys.modules:
            return False
        if not _armed or any(name in os.environ for name in THREAD_VARIABLES):
            import numpy  # noqa: F401

            return False
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        try:
            import numpy  # noqa: F401,F811
        finally:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        return True
