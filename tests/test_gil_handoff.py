"""targets/gil_handoff.py: the switch interval is lowered only while a lane serves, never raised, and
restored afterwards even when the run raises (it is process-wide)."""

from __future__ import annotations

import sys

import pytest

from bundlerun.targets.gil_handoff import SERVING_SWITCH_INTERVAL_S, responsive_waits


def test_lowered_while_serving_and_restored_after_an_error():
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError):
        with responsive_waits():
            assert sys.getswitchinterval() == pytest.approx(min(before, SERVING_SWITCH_INTERVAL_S), abs=2e-6)
            raise RuntimeError("the run failed")
    assert sys.getswitchinterval() == before


def test_never_raised_above_what_the_process_set():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)
    low = sys.getswitchinterval()  # CPython keeps it in whole microseconds
    try:
        with responsive_waits():
            assert sys.getswitchinterval() == low
    finally:
        sys.setswitchinterval(before)
