"""The fast tier's classifier and guard (tests/tiers.py): a helper that starts a process, named
through another helper, makes its caller slow; pure code stays fast; the guard stops every way of
starting a process and says which tier the test belongs to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tiers import SPAWN_ERROR, StartsProcess, _starts, process_guard


def _spawns():
    return subprocess.run([sys.executable, "-c", "pass"], check=True)


def _through_a_helper():
    return _spawns()


def _pure(x: int) -> int:
    return x + 1


def _exports():
    import torch

    return torch.export.export  # names the export: a build


def test_a_helper_that_starts_a_process_makes_its_callers_slow():
    assert _starts(_spawns)
    assert _starts(_through_a_helper)
    assert _starts(_exports)
    assert not _starts(_pure)


@pytest.mark.parametrize("start", [
    lambda: subprocess.run(["true"]),
    lambda: subprocess.Popen(["true"]),
    lambda: os.system("true"),
    lambda: os.posix_spawn("/bin/true", ["true"], dict(os.environ)),
], ids=["run", "Popen", "system", "posix_spawn"])
def test_the_guard_stops_every_way_to_start_a_process(start):
    mp, attempts = process_guard()
    try:
        with pytest.raises(StartsProcess, match=SPAWN_ERROR):
            start()
    finally:
        mp.undo()
    assert len(attempts) == 1


def test_the_guard_lets_git_through():
    """History records the commit a report came from (runner/history/commits.py): the one allowed program."""
    mp, attempts = process_guard()
    try:
        proc = subprocess.run(["git", "--version"], capture_output=True, text=True)
    finally:
        mp.undo()
    assert proc.returncode == 0 and proc.stdout.startswith("git version") and attempts == []
