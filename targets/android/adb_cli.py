"""`adb://SERIAL`: the device through the adb server, with the real `adb` CLI.

Honours ANDROID_SERIAL (empty serial) and a remote server (`-H`/`-P`, from the
config or `?host=&port=`; the CLI itself also honours ANDROID_ADB_SERVER_PORT).
Every call has a timeout; a timed-out client is killed with its process group,
which closes the stream so adbd hangs up the device-side shell.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bundlerun.targets.remote.transport import (
    ABSENT, MISSING_FILE, OFFLINE, TIMEOUT, TRANSPORT, UNAUTHORIZED, RemoteStat, TransportError, classify_message,
)
from bundlerun.targets import argv
from bundlerun.targets.remote.transport import shell


@dataclass
class DeviceEntry:
    serial: str
    state: str  # device | offline | unauthorized | authorizing | connecting | ...
    info: dict[str, str]


def parse_devices(text: str) -> list[DeviceEntry]:
    """Parse `adb devices -l`."""
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("List of devices", "*", "adb server")):
            continue
        parts = line.split()
        if len(parts) < 2:
            continue
        info = dict(p.split(":", 1) for p in parts[2:] if ":" in p)
        entries.append(DeviceEntry(parts[0], parts[1], info))
    return entries


def _run(argv: list[str], timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run with a hard timeout; the whole process group goes on expiry."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        raise TransportError(
            f"`{' '.join(argv[:1] + argv[-2:])}` timed out after {timeout_s:g} s", TIMEOUT,
            (out or b"").decode("utf-8", "replace") + (err or b"").decode("utf-8", "replace"),
        ) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class AdbCliTransport:
    """Shell/push/pull through `adb -s SERIAL`."""

    def __init__(self, serial: str | None, *, adb_path: str | None = None, server_host: str | None = None,
                 server_port: int | None = None, auto_connect: bool = True, connect_timeout_s: float = 20.0):
        from bundlerun.targets import argv  # each value below reaches adb's argv (`adb connect SERIAL`)

        self.adb = argv.program(adb_path or shutil.which("adb") or "adb", "adb", "adb")
        self.serial = serial or os.environ.get("ANDROID_SERIAL") or None
        if self.serial is not None:
            self.serial = argv.serial(self.serial, "adb serial", "adb")
        self.server_host = None if server_host is None else argv.host(server_host, "adb server host", "adb")
        self.server_port = None if server_port is None else argv.port(server_port, "adb server port", "adb")
        self.auto_connect = auto_connect
        self.connect_timeout_s = connect_timeout_s
        self.description = f"adb CLI ({self.adb}), serial {self.serial or '(only device)'}"

    # -- plumbing
    def _base(self) -> list[str]:
        argv = [self.adb]
        if self.server_host:
            argv += ["-H", self.server_host]
        if self.server_port:
            argv += ["-P", str(self.server_port)]
        return argv

    def _device_argv(self) -> list[str]:
        return self._base() + (["-s", self.serial] if self.serial else [])

    def _check_binary(self) -> None:
        if not (os.path.isabs(self.adb) and os.access(self.adb, os.X_OK)) and not shutil.which(self.adb):
            raise TransportError(
                f"adb not found ({self.adb}); install Android platform-tools (Debian: apt install adb) "
                "or use adb+tcp://HOST:PORT, which needs no adb server", ABSENT)

    def devices(self, timeout_s: float = 20.0) -> list[DeviceEntry]:
        self._check_binary()
        res = _run(self._base() + ["devices", "-l"], timeout_s)
        if res.returncode != 0:
            raise TransportError(f"adb devices failed: {res.stderr.decode(errors='replace').strip()}", TRANSPORT)
        return parse_devices(res.stdout.decode("utf-8", "replace"))

    # -- lifecycle
    def connect(self) -> None:
        deadline = time.monotonic() + self.connect_timeout_s
        tried_connect = False
        while True:
            entries = self.devices()
            if self.serial is None:
                ready = [e for e in entries if e.state == "device"]
                if len(ready) == 1 and len(entries) == 1:
                    self.serial = ready[0].serial
                    return
                if not entries:
                    raise TransportError("no Android device is attached to the adb server (adb devices is empty)", ABSENT)
                if len(entries) > 1:
                    listing = ", ".join(f"{e.serial} ({e.state})" for e in entries)
                    raise TransportError(f"several devices attached ({listing}); name one: adb://SERIAL or ANDROID_SERIAL", ABSENT)
                entry = entries[0]
            else:
                entry = next((e for e in entries if e.serial == self.serial), None)
            if entry is None:
                if self.auto_connect and not tried_connect and re.fullmatch(r"[\w.\-\[\]:]+:\d+", self.serial or ""):
                    tried_connect = True
                    self._adb_connect()
                    continue
                listing = ", ".join(f"{e.serial} ({e.state})" for e in entries) or "none"
                raise TransportError(f"device {self.serial} is not attached to the adb server (attached: {listing})", ABSENT)
            if entry.state == "device":
                return
            if time.monotonic() > deadline or entry.state not in ("connecting", "authorizing", "offline", "unauthorized"):
                raise self._state_error(entry)
            time.sleep(0.5)

    def _adb_connect(self) -> None:
        """`adb connect HOST:PORT`; it blocks while the device stays silent, so a
        timeout here only means "look at the device state" (offline, unauthorized)."""
        try:
            _run(self._base() + ["connect", self.serial], min(10.0, self.connect_timeout_s))
        except TransportError as exc:
            if exc.kind != TIMEOUT:
                raise

    def _state_error(self, entry: DeviceEntry) -> TransportError:
        if entry.state == "unauthorized" or entry.state == "authorizing":
            return TransportError(
                f"device {entry.serial} is unauthorized: accept the 'Allow USB debugging' prompt on the device "
                "(the host key is ~/.android/adbkey), then retry", UNAUTHORIZED)
        if entry.state in ("offline", "connecting"):
            return TransportError(
                f"device {entry.serial} is offline: reconnect it (adb reconnect / replug) or restart adbd", OFFLINE)
        return TransportError(f"device {entry.serial} is in state {entry.state!r}, not ready", OFFLINE)

    def reconnect(self) -> None:
        if self.serial and re.fullmatch(r"[\w.\-\[\]:]+:\d+", self.serial) and self.auto_connect:
            _run(self._base() + ["disconnect", self.serial], self.connect_timeout_s)
            self._adb_connect()
        self.connect()

    def close(self) -> None:
        pass

    # -- operations
    def _fail(self, what: str, res: subprocess.CompletedProcess) -> TransportError:
        text = (res.stderr + res.stdout).decode("utf-8", "replace").strip()
        lines = text.splitlines()
        errors = [l for l in lines if "error:" in l or "failed" in l.lower()]
        last = (errors or lines or [f"exit status {res.returncode}"])[-1]
        last = last.split("error: ", 1)[-1]
        return TransportError(f"{what}: {last}", classify_message(text), text)

    def raw_shell(self, command: str, timeout_s: float) -> str:
        res = _run(self._device_argv() + ["shell", command], timeout_s)
        out = res.stdout.decode("utf-8", "replace")
        if res.returncode != 0 and "__BUNDLERUN_RC=" not in out:
            raise self._fail("adb shell failed", res)
        return out

    def push(self, local: Path, remote: str, timeout_s: float) -> None:
        res = _run(self._device_argv() + ["push", argv.local_path(local, "push source"),
                                          argv.remote_path(remote, "push destination")], timeout_s)
        if res.returncode != 0:
            raise self._fail(f"push {Path(local).name} -> {remote} failed", res)

    def pull(self, remote: str, local: Path, timeout_s: float) -> None:
        local = Path(local)
        tmp = local.with_name(f".{local.name}.partial")

        res = _run(self._device_argv() + ["pull", argv.remote_path(remote, "pull source"),
                                          argv.local_path(tmp, "pull destination")], timeout_s)
        if res.returncode != 0:
            tmp.unlink(missing_ok=True)
            err = self._fail(f"pull {remote} failed", res)
            if "does not exist" in err.output or "No such file" in err.output:
                err.kind = MISSING_FILE
            raise err
        os.replace(tmp, local)

    def stat(self, remote: str, timeout_s: float) -> RemoteStat | None:
        res = shell(self, f"stat -c '%f %s' {shlex.quote(remote)} 2>/dev/null", timeout_s)
        if res.exit_status != 0 or not res.output.strip():
            return None
        match = re.fullmatch(r"\s*([0-9a-fA-F]{1,8}) ([0-9]{1,20})\s*", res.output)
        if not match:  # a garbled answer is a transport problem, never a guess (nor a ValueError)
            raise TransportError(f"stat {remote}: unexpected answer from the device: {res.output.strip()[:200]!r}",
                                 TRANSPORT, res.output)
        return RemoteStat(int(match.group(1), 16), int(match.group(2)))

    def listdir(self, remote: str, timeout_s: float) -> list[str]:
        res = shell(self, f"ls -1a {shlex.quote(remote)}", timeout_s)
        if res.exit_status != 0:
            return []
        return [n for n in res.output.splitlines() if n and n not in (".", "..")]
