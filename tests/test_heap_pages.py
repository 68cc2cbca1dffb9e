"""runner/judging/heap.py: the `bundlerun` process keeps freed heap pages, so a judged step's temporaries do not
page-fault again (glibc; this machine's Linux). Fresh interpreters, no target: minor page faults of 300
rounds of the float64 temporaries a 32,000-logit step makes, with and without keep_heap_pages."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import resource, sys
import numpy as np
from bundlerun.runner.judging.heap import keep_heap_pages
tuned = keep_heap_pages() if sys.argv[1] == "1" else None
row = np.random.default_rng(0).standard_normal(32000)
for _ in range(3):
    np.exp(row - row.max()).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(300):
    np.exp(row - row.max()).sum()  # two 256 KB temporaries alive at once, as in log_softmax
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(tune: bool, env: dict[str, str] | None = None) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CODE, "1" if tune else "0"], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    return out[0], int(out[1])


def test_kept_pages_take_the_faults_of_a_steps_temporaries_away():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    tuned, faults = _faults(True, env)
    plain_tuned, plain = _faults(False, env)
    assert tuned == "True" and plain_tuned == "None"
    assert plain >= 300 * 32, plain  # glibc trimmed and re-faulted at least half a temporary every round
    assert faults < 300, faults


def test_the_users_own_malloc_setting_wins():
    env = {**os.environ, "MALLOC_TOP_PAD_": "131072"}
    assert _faults(True, env)[0] == "False"
