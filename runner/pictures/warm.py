"""matplotlib imported on a thread while the target runs, for the HTML report's plots after it.

The report's first figure paid matplotlib's import (matplotlib, its Agg canvas, the font list: 0.37 s of
a 1.7 s `bundlerun run` of a 64-case tiny-cnn bundle on host://xnnpack, bundlerun's own measurement,
load 0.4) after the run, on the path to the exit, while the CLI had sat idle in select() waiting on the
runtime worker for 1.0 s. `start` begins that import before the target runs; `wait` is called by every
plot before its own matplotlib import, so the two threads never import matplotlib's modules at once (no
import-lock cycle between them). A failed import here is ignored: the plot's own import says what is wrong.
The process's exit waits for the import too (atexit): no import is left running into the interpreter's teardown.
"""

from __future__ import annotations

import atexit
import sys
import threading

_thread: threading.Thread | None = None
_lock = threading.Lock()


def _import() -> None:
    try:
        from bundlerun.runner.judging.blas_threads import import_numpy  # on this thread, before matplotlib's numpy

        import_numpy()  # matplotlib's numpy, with the CLI's one OpenBLAS thread
        import matplotlib.backends.backend_agg  # noqa: F401  the canvas (and matplotlib, numpy with it)
        import matplotlib.figure  # noqa: F401
        import matplotlib.ticker  # noqa: F401
        import matplotlib.transforms  # noqa: F401
    except Exception:  # noqa: BLE001 - reported where a plot imports it
        pass


def start() -> None:
    """Import matplotlib on a daemon thread, once per process (nothing when it is imported already)."""
    global _thread
    with _lock:
        if _thread is None and "matplotlib.figure" not in sys.modules:
            _thread = threading.Thread(target=_import, name="matplotlib-import", daemon=True)
            _thread.start()
            # A run that ends before the import does (a target refusing at once) must not reach the
            # interpreter's teardown with this thread inside an extension's import: that aborted the
            # process once (SIGABRT, "Python thread state is NULL", after the report was written).
            atexit.register(wait)


def wait() -> None:
    """Until `start`'s import is done (at once when none was started)."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join()
