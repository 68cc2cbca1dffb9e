"""Process-group handling shared by every target that starts a tool (runtime
worker, FVP, flash/reset commands): nothing we start outlives its case."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_process_group(proc: subprocess.Popen, grace_s: float = 3.0, *, term_first: bool = True) -> None:
    """SIGTERM the whole group, then SIGKILL after `grace_s` (straight to SIGKILL when
    `term_first` is False, for a hung runtime that has nothing to flush); always reaps `proc`."""
    for sig in (signal.SIGTERM, signal.SIGKILL) if term_first else (signal.SIGKILL,):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
