"""bundles/stack_room.py: a call from any depth never thrashes CPython 3.11's frame-stack chunks.

Pure Python, no target: minor page faults (getrusage) of a call that keeps going 40 frames down and back
up, started from every depth across a whole 16 KB chunk. Without room one of those starts straddles a
chunk's end and maps a fresh chunk on every descent; with `call_with_stack_room` none does (CPython 3.11,
the project's interpreter).
"""

from __future__ import annotations

import resource
import threading
from typing import Callable

import pytest

from bundlerun.bundles.stack_room import call_with_stack_room


def _down(n: int) -> int:
    return 0 if n == 0 else _down(n - 1)


def _oscillate() -> int:
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(2000):
        _down(40)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def _from(depth: int) -> int:
    return _oscillate() if depth == 0 else _from(depth - 1)


def _worst_start() -> int:
    """The most faults of the oscillation over starting depths 0..299 (~300 small frames, more than a chunk)."""
    return max(_from(d) for d in range(0, 300, 3))


def _on_a_new_thread(fn: Callable[[], int]) -> int:
    """`fn()` on a thread of its own: a frame stack that starts empty (tests/conftest.py gives each test
    room already), its faults counted alone (RUSAGE_THREAD)."""
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_the_oscillation_thrashes_somewhere_without_room_and_nowhere_with_it():
    plain = _on_a_new_thread(_worst_start)
    roomy = _on_a_new_thread(lambda: call_with_stack_room(_worst_start))
    assert plain >= 1000, plain  # one start straddles a chunk's end: a fresh chunk per descent
    assert roomy < 100, roomy


def test_call_with_stack_room_is_a_call():
    assert call_with_stack_room(lambda a, b=0: a + b, 2, b=3) == 5
    assert call_with_stack_room(_from, 50) >= 0

    def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        call_with_stack_room(boom)
