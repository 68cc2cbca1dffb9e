"""Process-group handling shared by every target that starts a tool (runtime
worker, FVP, flash/reset commands): nothing we start outlives its case."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_process_group(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """SIGTERM the whole group, then SIGKILL after `grace_s`; always reaps `proc`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
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
