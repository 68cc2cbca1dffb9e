"""Process-group handling shared by every target that starts a tool (runtime
worker, FVP, flash/reset commands): nothing we start outlives its case."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any
from bundlerun.bundles.errors import TargetError


def start_program(argv: list[str], what: str, **popen: Any) -> subprocess.Popen:
    """subprocess.Popen(argv, **popen), where a program that cannot be started (missing, not
    executable, not a program for this machine: the exec failed on argv[0]) is a TargetError
    naming it, not an OSError that would read as the host failing to write the run's files."""
    try:
        return subprocess.Popen(argv, **popen)
    except OSError as exc:
        if exc.filename is None or str(exc.filename) != str(argv[0]):
            raise

        raise TargetError(f"{what} {argv[0]} cannot be started: {exc.strerror or exc}") from None


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


def wait_exit(proc: subprocess.Popen, timeout_s: float) -> int | None:
    """`proc`'s exit status, or None when it is still running after `timeout_s`. Why not Popen.wait(timeout):
    with a timeout CPython polls, sleeping up to 50 ms between polls, which a 32-case run pays 32 times;
    a pidfd (Linux >= 5.3) wakes the moment the process ends."""
    import select

    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here: the polling wait
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    return proc.wait() if ready else None
