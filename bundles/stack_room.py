"""Call a function with 1 MB of room on CPython's frame stack: no chunk thrash at any depth.

CPython 3.11 keeps Python frames on a per-thread stack of 16 KB chunks that it maps when a call
does not fit and unmaps as soon as the first frame of that chunk returns (Python/pystate.c:
DATA_STACK_CHUNK_SIZE, push_chunk, _PyThreadState_PopFrame). Code that keeps calling in and out
across a chunk's end (an import chain, torch registering operators) maps, faults in and unmaps a
fresh chunk every time. Where the ends fall depends on how deep the caller started: the host worker
importing ExecuTorch's LLM custom ops and loading a 120 MB llama bundle took 5.7 s started from
`python -c`, 7.4 s from `python -m` (two runpy frames deeper; 351,000 minor page faults against
126,000) and up to 10.9 s a few frames deeper still (843,000), bundlerun's own measurement with
Python 3.11.7 on this project's 2-core machine.

`call_with_stack_room` calls `fn` from a frame whose code declares a value stack of 2**17 slots
(1 MB) it never uses: CPython gives that frame a chunk of its own of 2 MB, and `fn` and everything
it calls live in the unused megabyte without reaching a chunk's end (the same run: 5.7-5.9 s and
119,000 faults at every depth). Only the pages used are touched. Where frames are kept otherwise
(another interpreter or version) it is an ordinary call.
"""

from __future__ import annotations

import types
from typing import Any, Callable, TypeVar

T = TypeVar("T")

ROOM_SLOTS = 1 << 17  # bundlerun's own: 1 MB of frame slots, far beyond the deepest import chain (~50 KB)


def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return fn(*args, **kwargs)


_ROOMY: Callable[..., Any] = types.FunctionType(
    _call.__code__.replace(co_stacksize=_call.__code__.co_stacksize + ROOM_SLOTS), globals(), "call_with_stack_room")


def call_with_stack_room(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, with 1 MB of frame stack to itself (see the module docstring)."""
    result: T = _ROOMY(fn, *args, **kwargs)
    return result
