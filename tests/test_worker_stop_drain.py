"""targets/workers/protocol.py: a stop (Ctrl-C, SIGTERM: KeyboardInterrupt in the CLI) while a worker's events
wait to be handled keeps the cases the worker already reported, and waits for nothing more. The race this closes
failed tests/test_series.py once under load: the worker had reported case 1 and hung in case 2, the CLI had not
read that event yet, and the report called case 1 "not finished". A real pipe, no worker process."""

from __future__ import annotations

import base64
import json
import os
import struct
import time

import pytest

from bundlerun.targets.failures import FailureKind
from bundlerun.targets.workers.protocol import Buffer, Ending, EventDriver, Limits

PAIRS = [("forward", i) for i in range(4)]


def line(**msg) -> bytes:
    return (json.dumps(msg) + "\n").encode()


def start(case: int) -> bytes:
    return line(event="start", method="forward", case=case)


def done(case: int) -> bytes:
    value = base64.b64encode(struct.pack("<f", float(case))).decode()
    return line(event="done", method="forward", case=case, elapsed_s=0.001,
                outputs=[{"scalar_type": 6, "shape": [1], "b64": value}])


def driver(tmp_path, progress) -> EventDriver:
    return EventDriver(list(PAIRS), {}, tmp_path / "worker.log", Limits(setup_s=30, case_s=30),
                       Ending(not_ready=str, case_silent=str, gone=lambda ready: (FailureKind.CRASH, "gone", {})),
                       progress=progress)


def stopped(tmp_path, first: bytes, on_first_result) -> tuple[EventDriver, list[int], float]:
    """Run a driver on a pipe holding `first` (the write end kept open: the worker is still in a case); the
    first recorded result calls `on_first_result(write_fd)` and then the stop lands (KeyboardInterrupt)."""
    r, w = os.pipe()
    seen: list[int] = []

    def progress(result) -> None:
        seen.append(result.case_index)
        if len(seen) == 1:
            on_first_result(w)
            raise KeyboardInterrupt  # the signal, while case 0 is being recorded

    d = driver(tmp_path, progress)
    os.write(w, first)
    t = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            d.run(r, Buffer())
        return d, seen, time.monotonic() - t
    finally:
        os.close(r)
        os.close(w)


def test_events_read_but_not_yet_handled_are_kept(tmp_path):
    d, seen, took = stopped(tmp_path, line(event="ready", load_s=0.1) + start(0) + done(0) + start(1) + done(1)
                            + start(2), lambda w: None)
    assert seen == [0, 1] and sorted(d.results) == [("forward", 0), ("forward", 1)]
    assert d.results[("forward", 1)].outputs[0].data == struct.pack("<f", 1.0)
    assert took < 5  # the worker is still in case 2: nothing is waited for


def test_events_still_in_the_pipe_are_read_and_kept(tmp_path):
    # case 1's event reaches the pipe after the CLI's last read: the stop's last read takes it, and only what is there
    d, seen, took = stopped(tmp_path, line(event="ready", load_s=0.1) + start(0) + done(0),
                            lambda w: os.write(w, start(1) + done(1) + start(2) + b'{"event": "done", "meth'))
    assert seen == [0, 1] and sorted(d.results) == [("forward", 0), ("forward", 1)]
    assert took < 5


def test_a_malformed_or_unasked_event_in_the_last_read_is_skipped_and_the_stop_stays_a_stop(tmp_path):
    junk = (line(event="done", method="forward", case="x") + line(event="done", method="forward")
            + line(event="done", method="other", case=1) + line(event="done", method="forward", case=2, outputs=[{}])
            + b"[1, 2]\nnot json\n" + done(3))
    d, seen, _ = stopped(tmp_path, line(event="ready", load_s=0.1) + start(0) + done(0), lambda w: os.write(w, junk))
    assert seen == [0, 3] and sorted(d.results) == [("forward", 0), ("forward", 3)]
