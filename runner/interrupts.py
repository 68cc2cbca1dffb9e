"""Ctrl-C and SIGTERM stop a command the same way.

CI systems cancel a job with SIGTERM (then SIGKILL after a grace period); people press Ctrl-C.
Both must end the same way: finished cases keep their verdicts, the report is written and
marked interrupted, every process bundlerun started is gone. The code paths that do that catch
`KeyboardInterrupt`, so SIGTERM raises `Terminated`, a subclass of it, in the main thread; the
exit code then says which signal it was (runner/judging/outcome.py).

After the first signal further ones are ignored, so they cannot break the cleanup half way
(SIGKILL stays the hard stop). `deferred()` holds a signal over a short section that must not be
torn (judging the finished cases, writing a report); it is raised when the section ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from bundlerun.runner.judging.outcome import EXIT_INTERRUPTED, EXIT_TERMINATED


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled like Ctrl-C, exit code 143."""


_state = {"signal": None, "deferring": 0, "pending": None}


def _raise_for(signum: int) -> None:
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def on_signal(signum: int, _frame) -> None:
    """The handler: the first SIGINT/SIGTERM raises (or waits for the end of a `deferred()` block)."""
    if _state["signal"] is not None:
        return  # the stop is under way: a second signal must not tear the cleanup
    _state["signal"] = signum
    if _state["deferring"]:
        _state["pending"] = signum
        return
    _raise_for(signum)


def install() -> None:
    """SIGINT and SIGTERM raise in the main thread (only there can Python install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def reset() -> None:
    """Forget a signal already handled (a forked pool worker starts clean)."""
    _state.update(signal=None, deferring=0, pending=None)


def received() -> int | None:
    """The signal that stopped this command, if any."""
    return _state["signal"]


def exit_code() -> int:
    """130 for Ctrl-C (and for a KeyboardInterrupt nobody signalled), 143 for SIGTERM."""
    return EXIT_TERMINATED if _state["signal"] == signal.SIGTERM else EXIT_INTERRUPTED


def describe() -> str:
    """How the command was stopped, in words, for console lines and reports."""
    return "terminated (SIGTERM)" if _state["signal"] == signal.SIGTERM else "interrupted (Ctrl-C)"


@contextlib.contextmanager
def deferred(hold: bool = False) -> Iterator[None]:
    """A signal arriving inside is raised when the block ends, not in the middle of it; with
    `hold`, it stays pending until `raise_pending()` or the end of another `deferred()` block
    (a report judged inside is written by the caller before the command stops)."""
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
        if not hold:
            raise_pending()


def raise_pending() -> None:
    """Raise a signal held by `deferred()`, once nothing defers it any more."""
    pending = _state["pending"]
    if pending is not None and not _state["deferring"]:
        _state["pending"] = None
        _raise_for(pending)
