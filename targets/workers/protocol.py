"""The JSON-lines protocol between bundlerun and a runtime worker, once: its codec and its driver.

A worker is a process that loaded a bundle and runs cases for us: a local child (host://,
tosa://, mlx://, through targets/workers/supervisor.py) or `bundlerun worker` on another machine
(ssh://, runner/commands/worker.py). Each speaks one JSON object per line:

    {"event": "ready", "load_s": 0.4, "info": {...}}
    {"event": "start", "method": "forward", "case": 3}
    {"event": "done", "method": "forward", "case": 3, "elapsed_s": 0.01,
     "outputs": [{"scalar_type": 6, "shape": [1, 10], "file": "/abs/out.bin"}]}   # or "b64": "..."
    {"event": "error", "method": "forward", "case": 3, "status": "error", "kind": "runner-error", "error": "..."}
    {"event": "fatal", "kind": "load-failure", "error": "..."}
    {"event": "finished", "info": {...}, "warnings": [...], "setup_s": 0.0}

`kind` is always a value of targets/failures.py. A local worker hands outputs over as files
(no copy through the pipe); a remote one inlines them (base64), so no second round trip is
needed. `EventDriver` reads such a stream and turns it into CaseResults with every wait bounded:
the setup time until "ready", the case time from each "start"; a silent or dead worker ends the
case it was in (TIMEOUT, or ERROR naming the cause) and the caller decides what comes next.
What differs between a local child and an SSH session (how a lost process is worded and
classified) is the `Ending` the caller passes in.
"""

from __future__ import annotations

import base64
import json
import os
import select
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bundlerun.targets.base import CaseResult, CaseStatus, PerfFigure, RawTensor
from bundlerun.targets.failures import FailureKind

Pair = tuple[str, int]


# --------------------------------------------------------------------------- codec


def result_event(result: CaseResult, inline: bool = True) -> dict[str, Any]:
    """The "done"/"error" event of a finished case (the remote worker's side). Inline outputs
    travel as base64; local workers write files and name them instead (their own encoder)."""
    base = {"method": result.method, "case": result.case_index, "elapsed_s": result.elapsed_s}
    if result.status == CaseStatus.OK:
        return {"event": "done", **base, "device_verdict": result.device_verdict, "extra": result.extra,
                "perf": [f.to_dict() for f in result.perf],
                "outputs": [{"scalar_type": t.scalar_type, "shape": list(t.shape), "lossy": t.lossy,
                             "b64": base64.b64encode(t.data).decode("ascii")} for t in result.outputs]}
    return {"event": "error", **base, "status": result.status.value, "error": result.error,
            "kind": result.error_kind.value if result.error_kind else None, "log_excerpt": list(result.log_excerpt),
            "extra": result.extra}


def event_result(msg: dict[str, Any], log_path: Path, default_kind: FailureKind = FailureKind.RUNNER_ERROR,
                 extra: dict[str, Any] | None = None) -> CaseResult:
    """The CaseResult a "done"/"error" event stands for. Output files are read and removed;
    a kind outside the closed set is a protocol error of the worker, reported as the default."""
    method, case = str(msg["method"]), int(msg["case"])
    if msg["event"] == "error":
        status = CaseStatus.TIMEOUT if msg.get("status") == "timeout" else CaseStatus.ERROR
        try:
            kind = FailureKind.parse(msg.get("kind")) or default_kind
        except ValueError:
            kind = default_kind
        return CaseResult(method, case, status, error=msg.get("error"), error_kind=kind,
                          log_excerpt=list(msg.get("log_excerpt") or []) or tail_lines(log_path),
                          log_path=str(log_path), elapsed_s=msg.get("elapsed_s"),
                          extra={**(msg.get("extra") or {}), **(extra or {})})
    result = CaseResult(method, case, CaseStatus.OK, outputs=_tensors(msg.get("outputs", [])),
                        elapsed_s=msg.get("elapsed_s"), device_verdict=msg.get("device_verdict"),
                        extra=dict(msg.get("extra") or {}))
    # --replay N: the outputs of runs 2..N of the case, in the same form (runner/judging/replay.py)
    result.replays = [_tensors(run) for run in msg.get("replays") or []]
    if msg.get("perf"):  # figures the worker measured (e.g. targets/workers/host.py --repeat)
        result.add_perf([PerfFigure.from_dict(f) for f in msg["perf"]])
    return result


def _tensors(outputs: list[dict[str, Any]]) -> list[RawTensor]:
    """Output tensors of an event: inline base64, or files a local worker wrote (read, then removed once
    all are read: a stop in between leaves them for the stop's last read, EventDriver._drain)."""
    tensors, read = [], []
    for out in outputs:
        if "b64" in out:
            data = base64.b64decode(out["b64"])
        else:
            read.append(Path(out["file"]))
            data = read[-1].read_bytes()
        tensors.append(RawTensor(int(out["scalar_type"]), [int(d) for d in out["shape"]], data,
                                 bool(out.get("lossy", False))))
    for path in read:
        path.unlink(missing_ok=True)
    return tensors


def tail_lines(path: Path, lines: int = 12) -> list[str]:
    """The last non-empty lines of a log (a case's excerpt after a crash or hang)."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in text if line.strip()][-lines:]


# --------------------------------------------------------------------------- driver


@dataclass
class Ending:
    """How a worker that went silent or away is reported; the local child and the SSH session word
    and classify it differently (a lost link is `transport`, a dead child `crash`)."""

    not_ready: Callable[[float], str]  # setup limit -> message: no "ready" in time
    case_silent: Callable[[float], str]  # case limit -> message: no result in time
    gone: Callable[[bool], tuple[FailureKind, str, dict]]  # ready? -> (kind, why, extra) when the stream ended
    fatal_kind: FailureKind = FailureKind.LOAD_FAILURE  # a "fatal" event that names no kind


@dataclass
class Limits:
    setup_s: float  # until "ready"
    case_s: float  # from each "start" (and between cases)
    first_case_extra_s: float = 0.0  # added to the first case (a remote worker loads lazily)
    after_ready_s: float | None = None  # until the first "start" (default: case_s + first_case_extra_s)


MAX_DRAIN_BYTES = 64 << 20  # bundlerun's own bound on a stop's last read (a remote worker's inlined outputs)


def _event(line: bytes) -> dict[str, Any] | None:
    """One protocol line's object; None for anything else (a stray print from a library: the protocol lines are JSON)."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


@dataclass
class EventDriver:
    """Reads one worker's event stream for `pairs`, filling `results`. `run` returns how the
    stream ended: "finished" (all done; the worker is idle), "fatal" (it could not load: every
    remaining case has its error), "timeout", "gone" (it died or the link dropped mid-case)."""

    pairs: list[Pair]
    results: dict[Pair, CaseResult]
    log_path: Path
    limits: Limits
    ending: Ending
    progress: Callable[[CaseResult], None] | None = None
    result_extra: dict[str, Any] = field(default_factory=dict)  # added to every case's extra (remote: True)
    info: dict[str, Any] = field(default_factory=dict)  # from "ready" and "finished"
    finished: dict[str, Any] = field(default_factory=dict)  # the "finished" event's fields
    load_s: float = 0.0
    ready_after_s: float | None = None  # wall time until "ready"
    idle: bool = False  # the worker ended its request itself ("finished" or "fatal"): it can take another

    def run(self, fd: int, buffer: "Buffer", alive: Callable[[], bool] | None = None) -> str:
        try:
            return self._run(fd, buffer)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (runner/interrupts.py) while waiting or recording
            self._drain(fd, buffer)
            raise

    def _drain(self, fd: int, buffer: "Buffer") -> None:
        """A stop's last read: the cases the worker already reported (their events in the pipe, not yet read)
        are finished, and keep their results. Only what is there now is read; nothing is waited for."""
        try:
            while select.select([fd], [], [], 0)[0] and len(buffer.data) < MAX_DRAIN_BYTES:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                buffer.data += chunk
        except OSError:
            pass  # the link is gone: what was read stands
        while b"\n" in buffer.data:
            line, buffer.data = buffer.data.split(b"\n", 1)
            msg = _event(line)
            if msg is None or msg.get("event") not in ("done", "error"):
                continue
            try:
                key = (str(msg["method"]), int(msg["case"]))
                if key in self.results or key not in self.pairs:
                    continue
                result = event_result(msg, self.log_path, extra=self.result_extra)
            except (KeyError, TypeError, ValueError, OSError):
                continue  # a malformed line or an output file gone does not replace the stop with its own error
            self._record(result)

    def _run(self, fd: int, buffer: "Buffer") -> str:
        started = time.monotonic()
        deadline = started + self.limits.setup_s
        ready = False
        first = True
        current: Pair | None = None
        while True:
            if b"\n" not in buffer.data:  # events already buffered (a warm worker's last read) go first
                wait = deadline - time.monotonic()
                readable = select.select([fd], [], [], max(0.0, min(wait, 1.0)))[0] if wait > 0 else []
                if not readable:
                    if time.monotonic() < deadline:
                        continue
                    return self._silent(ready, current)
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return self._gone(ready, current)
                buffer.data += chunk
            while b"\n" in buffer.data:
                line, rest = buffer.data.split(b"\n", 1)
                msg = _event(line)
                if msg is None or msg.get("event") not in ("done", "error"):
                    buffer.data = rest
                if msg is None:
                    continue
                event = msg.get("event")
                if event == "ready":
                    ready = True
                    self.info.update(msg.get("info") or {})
                    self.load_s += float(msg.get("load_s") or 0.0)
                    self.ready_after_s = time.monotonic() - started
                    after = self.limits.after_ready_s
                    deadline = time.monotonic() + (after if after is not None else
                                                   self.limits.case_s + self.limits.first_case_extra_s)
                elif event == "start":
                    current = (str(msg["method"]), int(msg["case"]))
                    deadline = time.monotonic() + self.limits.case_s + (self.limits.first_case_extra_s if first else 0)
                elif event in ("done", "error"):
                    # its line leaves the buffer once the case is recorded: a stop while its result is made
                    # (event_result reads the case's files) finds it there (_drain), so no earlier case is
                    # lost while later ones, still buffered, are kept
                    key = (str(msg["method"]), int(msg["case"]))
                    fresh = key not in self.results and key in self.pairs  # else a duplicate or a case nobody asked for
                    if fresh:
                        self._record(event_result(msg, self.log_path, extra=self.result_extra))
                    buffer.data = rest
                    if not fresh:
                        continue
                    current, first = None, False
                    deadline = time.monotonic() + self.limits.case_s
                elif event == "fatal":
                    try:
                        kind = FailureKind.parse(msg.get("kind")) or self.ending.fatal_kind
                    except ValueError:
                        kind = self.ending.fatal_kind
                    self.mark(self._pending(), msg.get("error") or "the runtime worker failed", kind)
                    self.idle = True
                    return "fatal"
                elif event == "finished":
                    self.finished = {k: msg[k] for k in ("warnings", "setup_s") if k in msg}
                    self.info.update(msg.get("info") or {})
                    self.idle = True
                    return "finished"

    def mark(self, pairs: list[Pair], error: str, kind: FailureKind, status: CaseStatus = CaseStatus.ERROR,
             **kw: Any) -> None:
        """Every case of `pairs` without a result gets this one (with the worker's log)."""
        for m, c in pairs:
            if (m, c) not in self.results:
                self.results[(m, c)] = CaseResult(m, c, status, error=error, error_kind=kind,
                                                  log_excerpt=tail_lines(self.log_path), log_path=str(self.log_path),
                                                  **kw)

    def _pending(self) -> list[Pair]:
        return [p for p in self.pairs if p not in self.results]

    def _record(self, result: CaseResult) -> None:
        self.results[(result.method, result.case_index)] = result
        if self.progress:
            self.progress(result)

    def _silent(self, ready: bool, current: Pair | None) -> str:
        if not ready:
            self.mark(self._pending(), self.ending.not_ready(self.limits.setup_s), FailureKind.HOST_TIMEOUT,
                      CaseStatus.TIMEOUT)
            return "fatal"
        pending = current or next(iter(self._pending()), None)
        if pending is None:
            return "timeout"
        limit = self.limits.case_s
        self.mark([pending], self.ending.case_silent(limit), FailureKind.HOST_TIMEOUT, CaseStatus.TIMEOUT,
                  elapsed_s=limit)
        if self.progress:
            self.progress(self.results[pending])
        return "timeout"

    def _gone(self, ready: bool, current: Pair | None) -> str:
        """The stream ended: before "ready" every case gets the cause; mid-case, that case does; between
        cases nobody is blamed (the caller runs the rest on a new worker)."""
        kind, why, extra = self.ending.gone(ready)
        if not ready:
            self.mark(self._pending(), why, kind)
            return "fatal"
        if current is not None:
            self.mark([current], why, kind, extra=extra)
            if self.progress:
                self.progress(self.results[current])
        return "gone"


@dataclass
class Buffer:
    """Bytes read from a worker but not yet handled (kept across bundles by a warm worker)."""

    data: bytes = b""
