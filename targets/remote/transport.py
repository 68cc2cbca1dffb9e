"""One interface over every way to reach a remote device: Android's two and SSH.

`adb://` goes through the adb server with the real `adb` CLI; `adb+tcp://` and
`adb+usb://` speak the device protocol directly with adb-shell; `ssh://` runs the
system OpenSSH client (ssh_transport.py). All offer the same operations; the exit
status of a shell command is always read from an appended marker
(`; echo __BUNDLERUN_RC=$?`) because adb's legacy shell protocol carries none, so one
code path serves every transport.
"""

from __future__ import annotations

import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bundlerun.bundles.errors import TargetError
from bundlerun.targets.failures import FailureKind

MARKER = "__BUNDLERUN_RC="

# error kinds; TRANSIENT ones are retried a bounded number of times
OFFLINE, UNAUTHORIZED, ABSENT, NO_SPACE, TRANSPORT, TIMEOUT, USB = (
    "offline", "unauthorized", "absent", "no-space", "transport", "timeout", "usb",
)
MISSING_FILE = "missing-file"  # a pull of a file the device does not have
TRANSIENT = frozenset({TRANSPORT})


def failure_kind(transport_kind: str) -> FailureKind:
    """A transport fault as the report's failure kind: a full device is `device-full`, a step that
    ran out of time `host-timeout`, a file the device does not have `missing-output`; every other fault of the link (offline, unauthorized, absent,
    USB, a failed device command) is `transport`. The fault itself stays in extra.transport_fault."""
    return {NO_SPACE: FailureKind.DEVICE_FULL, TIMEOUT: FailureKind.HOST_TIMEOUT,
            MISSING_FILE: FailureKind.MISSING_OUTPUT}.get(transport_kind, FailureKind.TRANSPORT)


class TransportError(TargetError):
    """A device or link failure, with a kind the target classifies and may retry."""

    def __init__(self, message: str, kind: str = TRANSPORT, output: str = ""):
        super().__init__(message)
        self.kind = kind
        self.output = output

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT


@dataclass
class ShellResult:
    output: str  # stdout+stderr as the device sent them, marker removed
    exit_status: int


@dataclass
class RemoteStat:
    mode: int
    size: int


class Transport(Protocol):
    description: str

    def connect(self) -> None: ...
    def close(self) -> None: ...
    def reconnect(self) -> None: ...
    def raw_shell(self, command: str, timeout_s: float) -> str: ...
    def push(self, local: Path, remote: str, timeout_s: float) -> None: ...
    def pull(self, remote: str, local: Path, timeout_s: float) -> None: ...
    def stat(self, remote: str, timeout_s: float) -> RemoteStat | None: ...
    def listdir(self, remote: str, timeout_s: float) -> list[str]: ...


def wrap_with_marker(command: str) -> tuple[str, str]:
    """Append the exit-status marker; the nonce makes it unforgeable by the command's output.
    The command runs in a subshell so an `exit` inside it cannot skip the marker."""
    nonce = secrets.token_hex(4)
    return f"( {command}\n); echo {MARKER}$?:{nonce}", nonce


def parse_marker(output: str, nonce: str) -> ShellResult:
    pattern = re.compile(r"(?:\r?\n)?" + re.escape(MARKER) + r"(\d+):" + nonce + r"\r?\n?\Z")
    match = pattern.search(output)
    if not match:
        raise TransportError(
            "the device shell ended without reporting an exit status (connection dropped?)",
            TRANSPORT,
            output,
        )
    return ShellResult(output=output[: match.start()] + ("\n" if match.group(0).startswith(("\n", "\r")) else ""),
                       exit_status=int(match.group(1)))


def shell(transport: Transport, command: str, timeout_s: float) -> ShellResult:
    """Run `command` through the device's shell (/system/bin/sh on Android, `sh -c` over SSH)
    and return its output and exit status."""
    wrapped, nonce = wrap_with_marker(command)
    return parse_marker(transport.raw_shell(wrapped, timeout_s), nonce)


def check_shell(transport: Transport, command: str, timeout_s: float, what: str) -> str:
    result = shell(transport, command, timeout_s)
    if result.exit_status != 0:
        text = result.output.strip().splitlines()
        detail = text[-1] if text else f"exit status {result.exit_status}"
        kind = NO_SPACE if "No space left" in result.output else "device-command"
        raise TransportError(f"{what} failed on the device: {detail}", kind, result.output)
    return result.output


def mkdir(transport: Transport, remote: str, timeout_s: float) -> None:
    check_shell(transport, f"mkdir -p {shlex.quote(remote)}", timeout_s, f"mkdir {remote}")


def remove(transport: Transport, remote: str, timeout_s: float) -> None:
    check_shell(transport, f"rm -rf {shlex.quote(remote)}", timeout_s, f"rm {remote}")


def classify_message(text: str) -> str:
    """Map a device/adb error text to an error kind."""
    low = text.lower()
    if "no space left" in low:
        return NO_SPACE
    if "unauthorized" in low:
        return UNAUTHORIZED
    if "offline" in low:
        return OFFLINE
    if "not found" in low and "device" in low:
        return ABSENT
    return TRANSPORT
