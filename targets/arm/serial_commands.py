"""The board's external commands: a flash / reset tool run to completion (`run_command`), and a
`launch` command kept running as the board itself (`Board`: an emulator, a serial bridge).

Apart from the port and the capture because these are host processes, not bytes on a wire:
each runs in its own process group, its output saved to a log, and is always reaped or killed
(targets/process.py kill_process_group), whatever the UART did.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.errors import ConfigError
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.process import kill_process_group


@dataclass
class CommandResult:
    ok: bool
    kind: str | None  # None | "not-found" | "timeout" | "failed"
    message: str
    log_path: Path


def render_command(template: str, values: dict[str, str]) -> list[str]:
    """Split like a shell, then substitute {names} inside each word (paths stay one word)."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"cannot parse command {template!r}: {exc}") from None
    out = []
    for word in words:
        try:
            out.append(word.format(**values))
        except KeyError as exc:
            raise ConfigError(
                f"command {template!r} uses {{{exc.args[0]}}}; known: {', '.join(sorted(values))}"
            ) from None
        except (IndexError, ValueError) as exc:
            raise ConfigError(f"command {template!r}: bad placeholder ({exc})") from None
    if not out:
        raise ConfigError("empty external command")
    return out


def run_command(argv: list[str], timeout_s: float, log_path: Path, what: str) -> CommandResult:
    """Run a flash/reset tool in its own process group; always reaped, output saved."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        log.write(("$ " + shlex.join(argv) + "\n").encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except FileNotFoundError:
            return CommandResult(False, "not-found", f"{what} tool {argv[0]!r} not found on PATH", log_path)
        except PermissionError:
            return CommandResult(False, "not-found", f"{what} tool {argv[0]!r} is not executable", log_path)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_process_group(proc)
            return CommandResult(False, "timeout", f"{what} command timed out after {timeout_s:g}s", log_path)
        except BaseException:
            kill_process_group(proc)
            raise
    if rc != 0:
        tail = _tail(log_path)
        return CommandResult(False, "failed", f"{what} command exited with {rc}{': ' + tail if tail else ''}", log_path)
    return CommandResult(True, None, "", log_path)


def _tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()[1:] if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


class LaunchFault(Exception):
    """The launched board process is missing, exited before the port opened, or died mid-case."""

    def __init__(self, kind: FailureKind, detail: str, message: str):
        super().__init__(message)
        self.kind, self.detail = kind, detail


class Board:
    """A `launch` command bundlerun owns: started in its own session (process group), output
    saved, stopped with the whole group (SIGTERM, then SIGKILL) on every exit path."""

    def __init__(self, argv: list[str], log_path: Path):
        self.argv, self.log_path = argv, log_path
        self.proc: subprocess.Popen | None = None
        self.stopped_by_us = False

    def start(self) -> "Board":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(("$ " + shlex.join(self.argv) + "\n").encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
            except (FileNotFoundError, PermissionError) as exc:
                why = "not found on PATH" if isinstance(exc, FileNotFoundError) else "not executable"
                raise LaunchFault(FailureKind.TOOL_MISSING, "launch",
                                  f"launch tool {self.argv[0]!r} {why}") from None
        return self

    def exited(self, wait_s: float = 0.0) -> int | None:
        """The exit status if the board process has ended by itself (waiting up to `wait_s`)."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=wait_s) if wait_s > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            return None

    def describe_exit(self, rc: int) -> str:
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        try:  # its last words (QEMU: the error, then a hint line)
            said = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines()[1:] if ln.strip()]
        except OSError:
            said = []
        tail = " / ".join(said[-2:])[:300]
        return f"the board process ({Path(self.argv[0]).name}, pid {self.proc.pid}) {how}" + (f": {tail}" if tail else "")

    def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.stopped_by_us = True
            kill_process_group(self.proc)
        if self.proc is not None:  # whatever it left behind in its group goes too
            try:
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
