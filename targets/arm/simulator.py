"""Run one simulator session (an FVP, QEMU) as a supervised process group.

The simulator's stdout+stderr stream into a log file and the runner-log parser as
they arrive. The whole group is killed on the host wall-clock bound, when the log
says the session is over but the simulator lingers (FVPs often do), or when the
runner crashed and went quiet. Nothing it started survives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.errors import TargetError
from bundlerun.targets.et_runner.log import IncrementalLogParser, RunnerLog
from bundlerun.targets.et_runner.protocol import SessionEnd
from bundlerun.targets.process import kill_process_group


@dataclass
class ProcessOutcome:
    log: RunnerLog
    returncode: int | None
    host_timeout: bool
    elapsed_s: float
    log_path: Path
    killed_early: bool = False  # finished or crashed per the log, and the simulator did not exit by itself


def run_session_process(
    cmd: list[str],
    cwd: Path,
    log_path: Path,
    wall_timeout_s: float,
    exit_grace_s: float = 5.0,
    env: dict[str, str] | None = None,
) -> ProcessOutcome:
    """Run a simulator in its own process group; stream stdout+stderr into the log file
    and the parser; kill the whole group on the wall-clock bound, when the log says
    the session is over but the FVP lingers, or when the runner crashed and went quiet."""
    parser = IncrementalLogParser()
    start = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as sink:
        sink.write(("$ " + " ".join(cmd) + "\n").encode())
        sink.flush()
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=str(cwd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        except OSError as exc:
            raise TargetError(f"cannot start {cmd[0]}: {exc.strerror or exc}") from None
        finished_at: list[float] = []
        last_data = [start]

        def pump() -> None:
            fd = proc.stdout.fileno()
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                last_data[0] = time.monotonic()
                sink.write(chunk)
                sink.flush()
                parser.feed(chunk)
                if parser.finished and not finished_at:
                    finished_at.append(time.monotonic())

        reader = threading.Thread(target=pump, name="simulator-log", daemon=True)
        reader.start()
        host_timeout = killed_early = False
        deadline = start + wall_timeout_s
        while True:
            try:
                proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now >= deadline:
                    host_timeout = True
                    kill_process_group(proc)
                    break
                if finished_at and now - finished_at[0] > exit_grace_s:
                    killed_early = True
                    kill_process_group(proc)
                    break
                # A crashed runner (fault handler loop, or et_pal_abort's trap on a
                # UART build) never ends the simulation: stop once it has gone quiet.
                if parser.crashed and now - last_data[0] > exit_grace_s:
                    killed_early = True
                    kill_process_group(proc)
                    break
        _reap_group(proc)
        reader.join(timeout=5)
        proc.stdout.close()
    return ProcessOutcome(
        log=parser.result(),
        returncode=proc.returncode,
        host_timeout=host_timeout,
        elapsed_s=time.monotonic() - start,
        log_path=log_path,
        killed_early=killed_early,
    )


def _reap_group(proc: subprocess.Popen) -> None:
    """The simulator exited (or was killed): make sure nothing it started survives."""
    if proc.returncode is None:
        kill_process_group(proc)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def session_end(outcome: ProcessOutcome, tool: str, wall_timeout_s: float) -> SessionEnd:
    """How the stream ended, for targets.et_runner.protocol.classify."""
    if outcome.host_timeout:
        return SessionEnd("host-timeout", tool, outcome.returncode, f"{wall_timeout_s:.0f}s wall clock")
    return SessionEnd("exited", tool, outcome.returncode)
