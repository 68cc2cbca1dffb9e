"""A user's Python file imported and one of its functions returned, bounded in time: the model
factories of model_source.py and the dataset factories of datasets.py (below both, so neither
imports the other for it). Errors are one line; Ctrl-C stays an interrupt."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path

from bundlerun.bundles import limits
from bundlerun.bundles.errors import ModelSourceError

# bundlerun's own bound on importing a user's model file and calling its factory: far above a
# factory that downloads weights, so a hung one (a deadlock, an input() prompt, a network wait with
# no timeout) ends as a one-line error instead of a job that never finishes. $BUNDLERUN_FACTORY_TIMEOUT
# (seconds) changes it.
FACTORY_TIMEOUT_S = 1800.0


class _FactoryTimeout(BaseException):
    """Raised in the main thread when the factory overruns (a BaseException: `except Exception` in
    user code does not swallow it)."""


def factory_timeout() -> float:
    text = os.environ.get("BUNDLERUN_FACTORY_TIMEOUT")
    if not text:
        return FACTORY_TIMEOUT_S
    value: float | str = text
    try:
        value = float(text)
    except ValueError:
        pass  # limits.seconds says it is not a number
    return limits.seconds(value, "$BUNDLERUN_FACTORY_TIMEOUT")


@contextlib.contextmanager
def _bounded(limit: float):
    """User code inside runs at most `limit` seconds (main thread only: SIGALRM)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(_signum, _frame):
        raise _FactoryTimeout(f"did not finish within {limit:g} s (bundlerun's bound, $BUNDLERUN_FACTORY_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load_callable(ref: str, error: type[Exception] = ModelSourceError, what: str = "model factory"):
    """Import `path.py:function` from a file and return the function; one-line errors."""
    path_text, _, fn_name = ref.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise error(f"{what} file {path} not found (expected path.py:function)")
    mod_name = f"bundlerun_user_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise error(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    limit = factory_timeout()
    try:
        with _bounded(limit):
            spec.loader.exec_module(module)
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM stay an interrupt
        raise
    except BaseException as exc:  # the user's file raised (or called sys.exit) while importing
        raise error(f"importing {path} failed: {_raised(exc)}") from None
    fn = getattr(module, fn_name, None)
    if fn is None or not callable(fn):
        raise error(f"{path} has no callable {fn_name!r}")
    return fn


def _raised(exc: BaseException) -> str:
    """What user code raised, in words: `sys.exit(0)` is said as such, not as an empty message."""
    if isinstance(exc, SystemExit):
        return f"SystemExit (it called sys.exit({exc.code!r}))"
    if isinstance(exc, _FactoryTimeout):
        return f"it {exc}"
    return f"{type(exc).__name__}: {exc}"
