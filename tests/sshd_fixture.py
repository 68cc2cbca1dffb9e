"""A real OpenSSH server for the ssh:// tests: Debian's /usr/sbin/sshd on a free loopback
port, started as the current user with a throwaway host key and user key.

    from tests.sshd_fixture import sshd  # noqa: F401  (a session fixture)

No skip: without openssh-server the fixture FAILS and says which package to install.
The remote side of every test is this machine itself, so the remote bundlerun is the
.venv's own (`Sshd.bundlerun`).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bundlerun-test", "-f", str(path)],
                   check=True, capture_output=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rfind(")") + 2:].split()[0]
    except OSError:
        return "gone"


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rfind(")") + 2:].split()[1])
    except OSError:
        return -1


def live_processes(needle: str) -> list[str]:
    """Running (not zombie) processes whose command line contains `needle`."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            cmd = _cmdline(int(name))
            if needle in cmd and _state(int(name)) not in ("Z", "X", "gone"):
                out.append(f"{name}: {cmd.strip()}")
    return out


def wait_gone(needle: str, timeout: float = 15.0) -> list[str]:
    """Wait until no live process mentions `needle`; returns what is still there."""
    deadline = time.monotonic() + timeout
    while True:
        left = live_processes(needle)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@dataclass
class Sshd:
    root: Path
    port: int
    user: str
    host_key: Path
    user_key: Path
    wrong_key: Path
    known_hosts: Path
    ssh_config: Path  # an empty client config: the tests do not depend on ~/.ssh/config
    proc: subprocess.Popen
    log: Path
    bundlerun: str = str(Path(sys.executable).with_name("bundlerun"))

    @property
    def host_fingerprint(self) -> str:
        out = subprocess.run(["ssh-keygen", "-lf", str(self.host_key) + ".pub"], capture_output=True, text=True,
                             check=True).stdout
        return out.split()[1]

    def url(self, inner: str = "host://xnnpack", workspace: Path | None = None, **opts: str) -> str:
        """ssh://user@127.0.0.1:PORT/INNER?identity_file=...&known_hosts=...&bundlerun=...(&opts)."""
        query = {"identity_file": str(self.user_key), "known_hosts": str(self.known_hosts),
                 "ssh_config": str(self.ssh_config), "bundlerun": self.bundlerun}
        if workspace is not None:
            query["workspace"] = str(workspace)
        query.update({k: str(v) for k, v in opts.items() if v is not None})
        query = {k: v for k, v in query.items() if v != "<none>"}
        q = "&".join(f"{k}={quote(v, safe='/:,=~')}" for k, v in query.items())
        return f"ssh://{self.user}@127.0.0.1:{self.port}/{inner}?{q}"

    def session_pids(self) -> list[int]:
        """The per-connection server processes (`sshd: USER@notty` and their monitors): the
        server side of every open SSH session."""
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid == self.proc.pid or _state(pid) in ("Z", "X", "gone"):
                continue
            if _cmdline(pid).startswith("sshd:") and self._below_listener(pid):
                out.append(pid)
        return out

    def _below_listener(self, pid: int) -> bool:
        for _ in range(10):
            pid = _ppid(pid)
            if pid == self.proc.pid:
                return True
            if pid <= 1:
                return False
        return False

    def kill_sessions(self) -> list[int]:
        """SIGKILL the server side of every open session (what a dropped link looks like to the client)."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids


def start_sshd(root: Path) -> Sshd:
    if not os.path.exists(SSHD):
        pytest.fail(f"{SSHD} not found: the ssh:// tests need a real OpenSSH server "
                    "(apt-get install openssh-server openssh-client; scripts/setup.sh installs it)")
    for tool in ("ssh", "ssh-keygen", "ssh-keyscan"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} not found: apt-get install openssh-client")
    root.mkdir(parents=True, exist_ok=True)
    host_key, user_key, wrong_key = root / "host_ed25519", root / "user_ed25519", root / "wrong_ed25519"
    for key in (host_key, user_key, wrong_key):
        _keygen(key)
    (root / "authorized_keys").write_text((user_key.with_suffix(".pub")).read_text())
    user = getpass.getuser()
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir sshd needs as root
    port = free_port()
    config = root / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", "StrictModes no", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        f"PidFile {root / 'sshd.pid'}", f"AllowUsers {user}", "PermitRootLogin prohibit-password",
        "MaxSessions 50", "MaxStartups 50:30:100", "LogLevel INFO", "",
    ]))
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.fail(f"sshd rejected the test config: {check.stderr.strip()}")
    log = root / "sshd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 15
    while "Server listening" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"sshd did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    pub = host_key.with_suffix(".pub").read_text().split()
    known = root / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
    ssh_config = root / "ssh_config"
    ssh_config.write_text("")
    return Sshd(root, port, user, host_key, user_key, wrong_key, known, ssh_config, proc, log)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.kill_sessions()
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
