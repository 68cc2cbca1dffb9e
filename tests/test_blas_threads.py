"""runner/judging/blas_threads.py: the `bundlerun` process imports numpy with one OpenBLAS thread, so no BLAS
thread spins beside the runtime it just started. Fresh interpreters, no target: the threads of the process
right after numpy's import (/proc/self/task), the CPU it burns in the 0.2 s after, and what is left in the
environment for the processes bundlerun starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CODE = """
import json, os, sys, time
from bundlerun.runner.judging import blas_threads
if sys.argv[1] == "armed":
    blas_threads.arm()
cpu = time.process_time()
ours = blas_threads.import_numpy()
threads = len(os.listdir("/proc/self/task"))
time.sleep(0.2)
print(json.dumps({"ours": ours, "threads": threads, "cpu": time.process_time() - cpu,
                  "env": {k: os.environ.get(k) for k in blas_threads.THREAD_VARIABLES},
                  "again": blas_threads.import_numpy()}))
"""

NO_THREAD_VARS = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                                                                   "OMP_NUM_THREADS")}


def _probe(mode: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, check=True,
                         env={**NO_THREAD_VARS, **env}).stdout
    return json.loads(out)


def test_the_commands_numpy_has_one_blas_thread_and_the_environment_is_left_as_it_was():
    plain, armed = _probe("plain"), _probe("armed")
    assert armed["ours"] is True and armed["threads"] == 1, armed
    assert armed["env"] == {"OPENBLAS_NUM_THREADS": None, "GOTO_NUM_THREADS": None, "OMP_NUM_THREADS": None}
    assert armed["again"] is False  # imported once
    assert plain["ours"] is False, plain
    if (os.cpu_count() or 1) >= 2:  # what the module is about: OpenBLAS starts a thread per core, which spins
        assert plain["threads"] >= 2, plain
        assert armed["cpu"] < plain["cpu"], (armed, plain)


@pytest.mark.parametrize("var", ["OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"])
def test_a_thread_count_the_user_set_wins(var):
    armed = _probe("armed", **{var: "2"})
    assert armed["ours"] is False and armed["env"][var] == "2", armed
    if (os.cpu_count() or 1) >= 2:
        assert armed["threads"] == 2, armed  # OpenBLAS took the user's count


ARMING = """
import atexit, sys
from bundlerun.runner.judging import blas_threads
from bundlerun.runner import cli
atexit.register(lambda: print("armed", blas_threads._armed, flush=True))
if sys.argv[1] == "command":
    sys.argv[:] = ["bundlerun", "--version"]
    cli.main()
else:
    try:
        cli.main(["--version"])
    except SystemExit:
        pass
"""


def test_the_bundlerun_command_arms_it_and_a_library_caller_does_not():
    for mode, armed in (("command", "True"), ("library", "False")):
        proc = subprocess.run([sys.executable, "-c", ARMING, mode], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert f"armed {armed}" in proc.stdout.splitlines(), (mode, proc.stdout)
