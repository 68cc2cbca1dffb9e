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


def _run_until_stop(tmp_path, events: bytes) -> tuple[EventDriver, list[int]]:
    """A driver on a pipe holding `events` (the worker still in a case); nothing in progress raises."""
    r, w = os.pipe()
    seen: list[int] = []
    d = driver(tmp_path, lambda result: seen.append(result.case_index))
    os.write(w, events)
    try:
        with pytest.raises(KeyboardInterrupt):
            d.run(r, Buffer())
        return d, seen
    finally:
        os.close(r)
        os.close(w)


def test_a_stop_while_a_case_result_is_made_keeps_that_case_and_the_later_ones(tmp_path, monkeypatch):
    # The stop lands while case 0's result is made (its output files read), with cases 1-2 reported
    # behind it: tests/test_streamed_run.py once saw cases 1-2 kept and case 0 lost (its line had left
    # the buffer before the stop, the later ones had not).
    from bundlerun.targets.workers import protocol

    real, calls = protocol.event_result, []

    def event_result(*a, **k):
        calls.append(a[0]["case"])
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(protocol, "event_result", event_result)
    d, seen = _run_until_stop(tmp_path, line(event="ready", load_s=0.1) + start(0) + done(0) + start(1) + done(1)
                              + start(2) + done(2) + start(3))
    assert seen == [0, 1, 2] and sorted(d.results) == PAIRS[:3]
    assert d.results[("forward", 0)].outputs[0].data == struct.pack("<f", 0.0)


def test_a_stop_between_two_output_files_leaves_both_for_the_last_read(tmp_path, monkeypatch):
    # A worker on this machine writes outputs as files: none is removed until all of a case's are read,
    # so the stop's last read finds them; then they are removed.
    from pathlib import Path

    files = [tmp_path / f"out-{i}.bin" for i in range(2)]
    for i, f in enumerate(files):
        f.write_bytes(struct.pack("<f", float(i + 7)))
    real, reads = Path.read_bytes, []

    def read_bytes(self):
        reads.append(self.name)
        if len(reads) == 2:
            raise KeyboardInterrupt  # after out-0 was read, before out-1
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    outs = [{"scalar_type": 6, "shape": [1], "file": str(f)} for f in files]
    d, seen = _run_until_stop(tmp_path, line(event="ready", load_s=0.1) + start(0)
                              + line(event="done", method="forward", case=0, elapsed_s=0.001, outputs=outs) + start(1))
    assert seen == [0]
    assert [o.data for o in d.results[("forward", 0)].outputs] == [struct.pack("<f", 7.0), struct.pack("<f", 8.0)]
    assert not any(f.exists() for f in files)
