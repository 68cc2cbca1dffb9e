"""The judging's modules, imported on a thread while the target's runtime starts and runs.

`bundlerun run` judges on the host, with numpy (imported with one OpenBLAS thread: judging/blas_threads.py),
the judging modules and the report formats' writers: about 65 ms of imports on the 192-step tiny llama run
on qemu-user://aarch64 (bundlerun's own measurement, load 0.5). Imported on the command's thread between
the runner's spawn and its first trigger, they took as long as the emulated runner took to load, so the
host's own work before that spawn (reading and verifying the bundle) could not move behind it. On a thread
(runner/session.py Judging.meanwhile) they take the host's idle time instead: while the runner loads and
between its steps, when the command's thread sits in select(). The judge waits for that thread before it
imports anything itself, so two threads never import the same modules at once (no import-lock cycle
between them), and this import waits for matplotlib's (pictures/warm.py) for the same reason.
"""

from __future__ import annotations

from bundlerun.runner.judging.blas_threads import import_numpy
from bundlerun.runner.pictures import warm


def imports() -> None:
    """Import what judging a run and writing its report need (at once when it is imported already)."""
    warm.wait()  # matplotlib's import, when the report plots (numpy's modules are imported by one thread at a time)
    import_numpy()  # first: numpy with one OpenBLAS thread
    import bundlerun.runner.judging.ahead  # noqa: F401  what this is for: the judge, numpy's numerics with it
    from bundlerun.runner.writers import registered  # what this is for

    registered()  # each report format's module (xml.etree, html, the writers: about 10 ms)
    # and what the run's end imports after its last step (about 6 ms): the perf summary's statistics, the
    # history's location and the baseline check (finish_run), the console's lines (the CLI)
    import statistics  # noqa: F401
    import bundlerun.runner.history.location  # noqa: F401
    import bundlerun.runner.history.regression  # noqa: F401
    import bundlerun.runner.report.console  # noqa: F401
