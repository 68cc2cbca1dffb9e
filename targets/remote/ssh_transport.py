"""The system OpenSSH client as a Transport (targets/remote/transport.py).

Every command is the real `ssh` binary, so `~/.ssh/config`, known_hosts, the agent
and key files work as they do on the command line. Always `BatchMode=yes` (never a
prompt) and `StrictHostKeyChecking=yes` (an unknown or changed host key is an error,
never accepted silently). A pinned `fingerprint` is checked with `ssh-keyscan` +
`ssh-keygen -lf` and the matching key is written to a private known_hosts file that
this transport alone uses.

One ControlMaster connection (`ssh -o ControlMaster=yes`, a child we own; not `-M`
as well: twice means "ask") carries every command, push and the worker session:
authentication happens once, each later command costs a channel, not a handshake.
Closing the transport ends the master, which ends every remote session it carried; if
bundlerun itself is killed, the master's stdin closes and it ends too.

Remote commands run under `sh -c` whatever the login shell is (zsh on a Mac);
`sha256sum` is shimmed with `shasum -a 256` where it is absent (older macOS), so the
content-addressed device cache works unchanged. Pushes stream the file into
`cat > PATH` on the remote side (no sftp subsystem needed; a full disk is the
remote `cat`'s own "No space left on device").
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bundlerun.targets.process import kill_process_group
from bundlerun.targets.remote.transport import (
    MISSING_FILE,
    NO_SPACE,
    TIMEOUT,
    TRANSPORT,
    UNAUTHORIZED,
    RemoteStat,
    TransportError,
    check_shell,
)
from bundlerun.targets import argv

HOST_KEY = "host-key"  # transport fault kind: unknown/changed/unpinned host key
SSH_FAILED = 255  # ssh's own exit status for a connection or authentication failure

# POSIX sh prelude for every remote command: a sha256sum where only shasum exists (macOS < 14).
SHIM = 'command -v sha256sum >/dev/null 2>&1 || sha256sum() { shasum -a 256 "$@"; }\n'


def classify_ssh(text: str) -> str:
    """A transport fault kind from what the ssh client printed."""
    low = text.lower()
    if "permission denied" in low and ("publickey" in low or "password" in low or "keyboard" in low):
        return UNAUTHORIZED
    if ("host key verification failed" in low or "no " in low and "host key is known" in low
            or "remote host identification has changed" in low or "host key for" in low and "has changed" in low):
        return HOST_KEY
    if "no space left" in low:
        return NO_SPACE
    if "timed out" in low or "timeout, server" in low:
        return TIMEOUT
    return TRANSPORT


def ssh_error_line(text: str) -> str:
    """The most telling line of an ssh client failure (its last non-noise line)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    noise = ("warning: permanently added", "control socket connect", "mux_client", "debug1:")
    useful = [ln for ln in lines if not ln.lower().startswith(noise)]
    for key in ("permission denied", "host key verification failed", "remote host identification has changed",
                "no space left", "timed out", "connection refused", "could not resolve", "no route to host",
                "connection closed", "broken pipe", "connection reset"):
        for ln in useful:
            if key in ln.lower():
                return ln
    return (useful or lines or ["no message"])[-1]


def fingerprints(key_lines: list[str], algorithm: str = "sha256") -> dict[str, str]:
    """`ssh-keygen -lf` over known_hosts-style lines: fingerprint -> the line."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="brkh-") as tmp:
        for line in key_lines:
            path = Path(tmp) / "k"
            path.write_text(line + "\n")
            res = subprocess.run(["ssh-keygen", "-E", algorithm, "-lf", str(path)], capture_output=True,
                                 text=True, timeout=30)
            parts = res.stdout.split()
            if res.returncode == 0 and len(parts) >= 2:
                out[parts[1]] = line
    return out


@dataclass
class SshTransport:
    host: str
    user: str | None = None
    port: int | None = None
    identity_file: Path | None = None
    known_hosts: Path | None = None
    ssh_config: Path | None = None
    fingerprint: str = ""  # SHA256:... (or MD5:...) pins the host key instead of known_hosts
    connect_timeout_s: float = 15.0
    multiplex: bool = True
    ssh: str = "ssh"
    options: list[str] = field(default_factory=list)  # extra `-o Key=Value`
    _tmp: str | None = None
    _master: subprocess.Popen | None = None
    _pinned: Path | None = None
    connect_s: float | None = None  # time the last connect took

    def __post_init__(self) -> None:
        """Every value that reaches ssh's argv, checked (targets/argv.py): the host is also put
        after `--`, so neither can ever be read as an ssh option."""

        where = "ssh"
        self.host = argv.host(self.host, "ssh host", where)
        if self.user is not None:
            self.user = argv.user(self.user, "ssh user", where)
        if self.port is not None:
            self.port = argv.port(self.port, "ssh port", where)
        self.ssh = argv.program(self.ssh, "ssh client", where)
        self.options = [argv.word(o, "ssh option", where) for o in self.options]
        for name in ("identity_file", "known_hosts", "ssh_config"):
            if getattr(self, name) is not None:
                setattr(self, name, Path(argv.local_path(getattr(self, name), name, where)))

    @property
    def description(self) -> str:
        where = f"{self.user}@{self.host}" if self.user else self.host
        return f"ssh://{where}{f':{self.port}' if self.port else ''}"

    # ---- argv ---------------------------------------------------------------------------
    @property
    def control_path(self) -> str | None:
        return os.path.join(self._tmp, "cm") if (self._tmp and self.multiplex) else None

    def base_argv(self, master: bool = False) -> list[str]:
        argv = [self.ssh]
        if self.ssh_config:
            argv += ["-F", str(self.ssh_config)]
        argv += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                 "-o", f"ConnectTimeout={max(1, math.ceil(self.connect_timeout_s))}",
                 "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]
        if self.identity_file:
            argv += ["-i", str(self.identity_file), "-o", "IdentitiesOnly=yes"]
        known = self._pinned or self.known_hosts
        if known:
            argv += ["-o", f"UserKnownHostsFile={known}"]
            if self._pinned:
                argv += ["-o", "GlobalKnownHostsFile=/dev/null"]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.user:
            argv += ["-l", self.user]
        for opt in self.options:
            argv += ["-o", opt]
        if self.control_path:
            argv += ["-o", f"ControlPath={self.control_path}",
                     "-o", "ControlMaster=yes" if master else "ControlMaster=no", "-o", "ControlPersist=no"]
        return argv

    def command_argv(self, command: str) -> list[str]:
        """ssh argv running `command` under `sh -c` on the remote host."""
        return [*self.base_argv(), "-T", "--", self.host, "sh -c " + shlex.quote(SHIM + command)]

    # ---- connection ---------------------------------------------------------------------
    def connect(self) -> None:
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="brssh-")  # short: unix socket paths are limited
        if self.fingerprint and self._pinned is None:
            self._pin_host_key()
        start = time.monotonic()
        if not self.multiplex:
            self._probe()
        else:
            self._start_master()
        self.connect_s = time.monotonic() - start

    def _resolved(self) -> tuple[str, int]:
        """Hostname and port after ~/.ssh/config (`ssh -G`), as ssh-keyscan needs them."""
        argv = [self.ssh] + (["-F", str(self.ssh_config)] if self.ssh_config else [])
        argv += (["-p", str(self.port)] if self.port else []) + ["-G", "--", self.host]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        conf = dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)
        return conf.get("hostname", self.host), int(conf.get("port", self.port or 22))

    def _pin_host_key(self) -> None:
        want = self.fingerprint.strip().replace(" ", "+")  # '+' arrives as a space from a URL query
        algorithm, _, _ = want.partition(":")
        if algorithm.upper() not in ("SHA256", "MD5"):
            raise TransportError(f"fingerprint {self.fingerprint!r} must start with SHA256: (as `ssh-keygen -lf` "
                                 "prints it) or MD5:", HOST_KEY)
        want = algorithm.upper() + want[len(algorithm):]
        if not shutil.which("ssh-keyscan"):
            raise TransportError("ssh-keyscan is not installed (package openssh-client); it is needed to check "
                                 "the pinned fingerprint", "absent")
        hostname, port = self._resolved()

        hostname = argv.host(hostname, "host name (from `ssh -G`)", self.description)
        try:
            res = subprocess.run(["ssh-keyscan", "-T", str(max(1, math.ceil(self.connect_timeout_s))), "-p", str(port),
                                  "--", hostname], capture_output=True, text=True, timeout=self.connect_timeout_s + 10)
        except subprocess.TimeoutExpired:
            raise TransportError(f"ssh-keyscan {hostname}:{port} timed out after {self.connect_timeout_s:g} s",
                                 TIMEOUT) from None
        lines = [ln for ln in res.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
        if not lines:
            raise TransportError(f"cannot read the host key of {hostname}:{port}: "
                                 f"{ssh_error_line(res.stderr) if res.stderr.strip() else 'no key offered'}",
                                 classify_ssh(res.stderr) if res.stderr.strip() else TRANSPORT)
        offered = fingerprints(lines, algorithm.lower())
        if want not in offered:
            raise TransportError(f"host key of {hostname}:{port} does not match the pinned fingerprint {want} "
                                 f"(the host offers {', '.join(sorted(offered)) or 'no readable key'})", HOST_KEY)
        self._pinned = Path(self._tmp) / "known_hosts"
        self._pinned.write_text(offered[want] + "\n")

    def _fail(self, output: str, what: str) -> TransportError:
        kind = classify_ssh(output)
        line = ssh_error_line(output)
        if kind == UNAUTHORIZED:
            msg = f"{self.description} refused the key ({line})"
        elif kind == HOST_KEY:
            msg = (f"{self.description}: host key not verified ({line}); add it to known_hosts "
                   "(ssh-keyscan) or pin it with ?fingerprint=SHA256:...")
        elif kind == TIMEOUT:
            msg = f"{self.description}: {what} timed out ({line})"
        else:
            msg = f"{self.description}: {what} failed ({line})"
        return TransportError(msg, kind, output)

    def _probe(self) -> None:
        try:
            res = subprocess.run([*self.base_argv(), "-T", "--", self.host, "true"], stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=self.connect_timeout_s + 5)
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.description}: connecting timed out after {self.connect_timeout_s:g} s",
                                 TIMEOUT) from None
        if res.returncode != 0:
            raise self._fail(res.stderr, "connecting")

    def _start_master(self) -> None:
        err_path = Path(self._tmp) / "master.err"
        with open(err_path, "wb") as err:
            # Not -N: the master's own session is a remote `cat` reading our pipe, so if this process
            # dies without closing the transport (SIGKILL), the pipe closes, the session ends and the
            # master exits instead of lingering with an authenticated connection.
            self._master = subprocess.Popen([*self.base_argv(master=True), "-T", "--", self.host, "exec cat >/dev/null"],
                                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                                            start_new_session=True)
        deadline = time.monotonic() + self.connect_timeout_s + 5
        while True:
            if os.path.exists(self.control_path):  # the master creates its socket once authenticated
                return
            if self._master.poll() is not None:
                text = err_path.read_text(errors="replace")
                self._master = None
                raise self._fail(text, "connecting")
            if time.monotonic() > deadline:
                self._stop_master()
                raise TransportError(f"{self.description}: connecting timed out after {self.connect_timeout_s:g} s "
                                     "(no SSH session established)", TIMEOUT)
            time.sleep(0.02)

    def alive(self) -> bool:
        return not self.multiplex or (self._master is not None and self._master.poll() is None)

    def _stop_master(self) -> None:
        if self._master is not None:
            try:
                self._master.stdin.close()
            except OSError:
                pass
            kill_process_group(self._master, 2.0)
            self._master = None
        if self.control_path and os.path.exists(self.control_path):
            try:
                os.unlink(self.control_path)
            except OSError:
                pass

    def close(self) -> None:
        self._stop_master()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp, self._pinned = None, None

    def reconnect(self) -> None:
        self._stop_master()
        self.connect()

    # ---- commands -----------------------------------------------------------------------
    def run(self, command: str, timeout_s: float, stdin=None) -> subprocess.CompletedProcess:
        """`command` on the remote host: its real exit status, stdout and stderr. ssh's own
        failures (exit 255 with an ssh message) raise TransportError; a timeout kills it."""
        proc = subprocess.Popen(self.command_argv(command), stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_process_group(proc, 1.0, term_first=False)
            proc.communicate()
            raise TransportError(f"{self.description}: remote command timed out after {timeout_s:g} s: "
                                 f"{command.splitlines()[0][:120]}", TIMEOUT) from None
        res = subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(errors="replace"),
                                          err.decode(errors="replace"))
        if res.returncode == SSH_FAILED:
            raise self._fail(res.stderr, "the remote command")
        return res

    def raw_shell(self, command: str, timeout_s: float) -> str:
        res = self.run("exec 2>&1\n" + command, timeout_s)  # one stream: the exit marker stays last
        return res.stdout + res.stderr

    def popen(self, command: str, stderr) -> subprocess.Popen:
        """A long-lived remote command with pipes on stdin/stdout (the worker session)."""
        return subprocess.Popen(self.command_argv(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=stderr, start_new_session=True)

    def push(self, local: Path, remote: str, timeout_s: float) -> None:
        size = os.path.getsize(local)
        with open(local, "rb") as src:
            try:
                res = self.run(f"cat > {shlex.quote(remote)}", timeout_s, stdin=src)
            except TransportError as exc:
                if exc.kind != TIMEOUT:
                    raise
                raise TransportError(f"{self.description}: push of {Path(local).name} ({size} bytes) did not finish "
                                     f"within {timeout_s:g} s (push timeout)", TIMEOUT) from None
        if res.returncode != 0:
            text = (res.stderr or res.stdout).strip()
            kind = NO_SPACE if "no space left" in text.lower() else TRANSPORT
            raise TransportError(f"push of {Path(local).name} to {self.description}:{remote} failed: "
                                 f"{text.splitlines()[-1] if text else f'exit status {res.returncode}'}", kind, text)

    def pull(self, remote: str, local: Path, timeout_s: float) -> None:
        with open(local, "wb") as dst:
            proc = subprocess.Popen(self.command_argv(f"cat {shlex.quote(remote)}"), stdin=subprocess.DEVNULL,
                                    stdout=dst, stderr=subprocess.PIPE, start_new_session=True)
            try:
                _, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_process_group(proc, 1.0, term_first=False)
                raise TransportError(f"pull of {remote} timed out after {timeout_s:g} s", TIMEOUT) from None
        if proc.returncode != 0:
            text = err.decode(errors="replace")
            if proc.returncode == SSH_FAILED:
                raise self._fail(text, "pull")
            kind = MISSING_FILE if "no such file" in text.lower() else TRANSPORT
            raise TransportError(f"pull of {remote} failed: {ssh_error_line(text)}", kind, text)

    def stat(self, remote: str, timeout_s: float) -> RemoteStat | None:
        q = shlex.quote(remote)
        res = self.run(f"if [ -d {q} ]; then echo d; wc -c < /dev/null; elif [ -e {q} ]; then echo f; wc -c < {q}; "
                       "else echo none; fi", timeout_s)
        words = res.stdout.split()
        if not words or words[0] == "none" or len(words) < 2:
            return None
        return RemoteStat(mode=0o040755 if words[0] == "d" else 0o100644, size=int(words[1]))

    def listdir(self, remote: str, timeout_s: float) -> list[str]:
        out = check_shell(self, f"ls -1A {shlex.quote(remote)}", timeout_s, f"listing {remote}")
        return [line for line in out.splitlines() if line]


def remote_path_expr(path: str) -> str:
    """A shell word for a remote path: `~/x` becomes "$HOME"/x, the rest is quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


_VERSION = re.compile(r"version\s+(\S+)")


def parse_version(text: str) -> str | None:
    """`bundlerun, version 0.1.0` -> 0.1.0"""
    match = _VERSION.search(text)
    return match.group(1) if match else None
