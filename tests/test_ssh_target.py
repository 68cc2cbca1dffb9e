"""ssh://HOST/<inner URL> against a real OpenSSH server (tests/sshd_fixture.py) with the
real remote worker (this machine's own .venv bundlerun), and every fault for real:
refused key, unknown/changed/unpinned host key, connection killed on the server side
mid-run, remote bundlerun missing or another version, a full remote disk, and a slow
link (connect, setup and per-case timeouts). After each fault, nothing may be left
running on the remote side."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402
from sshd_fixture import live_processes, sshd, wait_gone  # noqa: E402,F401

from bundlerun.bundles.bpte import read_bundle  # noqa: E402
from bundlerun.bundles.errors import ConfigError, TargetError  # noqa: E402
from bundlerun._version import __version__  # noqa: E402
from bundlerun.runner.session import RunRequest, execute_run  # noqa: E402
from bundlerun.targets import open_target, parse_target_url  # noqa: E402
from bundlerun.targets.base import CaseStatus, RunOptions  # noqa: E402
from bundlerun.targets.failures import FailureKind  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlp3(bundle_cache) -> Path:
    return bundle_cache("mlp", cases=3)


def _run(url: str, bundle: Path, work: Path, progress=None, case_timeout: float = 120.0, cases=None):
    return open_target(url).run(read_bundle(bundle), bundle,
                                RunOptions(work_dir=work, case_timeout_s=case_timeout, setup_timeout_s=120.0,
                                           cases=cases, progress=progress))


def _fails(url: str, bundle: Path, work: Path) -> TargetError:
    t0 = time.monotonic()
    with pytest.raises(TargetError) as info:
        _run(url, bundle, work)
    assert time.monotonic() - t0 < 60
    return info.value


def _wrapper(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


# ---- URLs and settings -------------------------------------------------------------------------------
def test_url_parts_and_strict_settings():
    from bundlerun.targets.ssh import create, split_url

    url = parse_target_url("ssh://ci@mac.local:2222/host://xnnpack?threads=2&bundlerun=~/venv/bin/bundlerun")
    user, host, port, inner, ssh_q, inner_q = split_url(url)
    assert (user, host, port, inner) == ("ci", "mac.local", 2222, "host://xnnpack")
    assert ssh_q == {"bundlerun": "~/venv/bin/bundlerun"} and inner_q == {"threads": "2"}
    target = create(url, {"connect_timeout": "3"})
    assert target.inner == "host://xnnpack?threads=2"  # the inner target's option travels with its URL
    assert target.settings.connect_timeout == 3.0 and target.settings.bundlerun == "~/venv/bin/bundlerun"
    with pytest.raises(ConfigError, match="did you mean 'fingerprint'"):
        create(parse_target_url("ssh://h/host://xnnpack?fingerprnt=SHA256:x"), {})
    with pytest.raises(ConfigError, match="unknown setting 'threads'"):
        create(parse_target_url("ssh://h/tosa://int?threads=2"), {})  # tosa:// has no settings
    with pytest.raises(TargetError, match="no inner target"):
        create(parse_target_url("ssh://h"), {})
    with pytest.raises(TargetError, match="unknown target scheme"):
        create(parse_target_url("ssh://h/nope://x"), {})
    from bundlerun.targets import default_backend

    assert default_backend("ssh://h/mlx://cpu") == "mlx" and default_backend("ssh://h/host://portable") == "portable"


# ---- the worker itself (no ssh): its version guard and its stdin-close contract ----------------------------
def _worker(bundle: Path, work: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([str(Path(sys.executable).with_name("bundlerun")), "worker", "--target", "host://xnnpack",
                             "--work-dir", str(work), *extra, str(bundle)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


def test_worker_refuses_another_version(mlp3, tmp_path):
    proc = _worker(mlp3, tmp_path, "--expect-version", "0.0.0-other")
    out, err = proc.communicate(json.dumps({"cases": [["forward", 0]]}).encode() + b"\n", timeout=60)
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["event"] == "fatal" and events[0]["kind"] == "version-mismatch"
    assert "0.0.0-other" in events[0]["error"] and __version__ in events[0]["error"]
    assert proc.returncode == 3


def test_worker_streams_inline_outputs_and_dies_with_its_stdin(mlp3, tmp_path):
    """Case 0 comes back with its raw bytes inline; case 1 hangs in the runtime child; closing
    stdin (what a dropped session does) kills that child and the worker within seconds."""
    proc = _worker(mlp3, tmp_path / "w", "--session", "brs-unit", env={"BUNDLERUN_FAULT": "hang@forward:1"})
    proc.stdin.write(json.dumps({"cases": [["forward", 0], ["forward", 1]]}).encode() + b"\n")
    proc.stdin.flush()
    events = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        events.append(json.loads(proc.stdout.readline()))
        if events[-1]["event"] == "start" and events[-1]["case"] == 1:
            break
    kinds = [e["event"] for e in events]
    assert kinds[:4] == ["ready", "start", "done", "start"], kinds
    done = events[2]
    import base64

    out = done["outputs"][0]
    assert out["scalar_type"] == 6 and out["shape"] == [1, 10] and len(base64.b64decode(out["b64"])) == 40
    assert events[0]["version"] == __version__
    time.sleep(1.0)
    bundle_users = live_processes(str(mlp3))
    assert any("targets.workers.host" in p for p in bundle_users), bundle_users  # the runtime child is hanging
    t0 = time.monotonic()
    proc.stdin.close()
    proc.wait(timeout=30)
    assert time.monotonic() - t0 < 10
    assert b"stdin closed" in proc.stderr.read()
    assert wait_gone(str(tmp_path / "w")) == [] and not [p for p in live_processes(str(mlp3)) if "targets.workers.host" in p]


# ---- a real run over ssh ---------------------------------------------------------------------------------
def test_cli_run_over_ssh_matches_local_run(sshd, mlp3, tmp_path):
    """`bundlerun run X.bpte --target ssh://127.0.0.1:PORT/host://xnnpack` exactly as documented: key,
    known_hosts and user come from an ssh config, the remote command and workspace from bundlerun.toml."""
    ws = tmp_path / "ws"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host 127.0.0.1\n  User {sshd.user}\n  IdentityFile {sshd.user_key}\n  IdentitiesOnly yes\n"
                   f"  UserKnownHostsFile {sshd.known_hosts}\n")
    (tmp_path / "bundlerun.toml").write_text(f'[targets.ssh]\nssh_config = "{cfg}"\nbundlerun = "{sshd.bundlerun}"\n'
                                             f'workspace = "{ws}"\n')
    url = f"ssh://127.0.0.1:{sshd.port}/host://xnnpack"
    timings = {}
    for name, target in (("ssh", url), ("ssh-cached", url), ("local", "host://xnnpack")):
        t0 = time.monotonic()
        res = run_cli("run", str(mlp3), "--target", target, "--report", str(tmp_path / name), "--no-history",
                      "--quiet", cwd=tmp_path)
        timings[name] = time.monotonic() - t0
        assert res.returncode == 0, res.stderr + res.stdout
    reports = {n: json.loads((tmp_path / n / "report.json").read_text()) for n in ("ssh", "ssh-cached", "local")}
    ssh, cached, local = reports["ssh"], reports["ssh-cached"], reports["local"]
    assert ssh["summary"]["verdict"] == "PASS" and ssh["summary"]["cases"] == 3
    info = ssh["target"]["info"]
    assert info["remote_bundlerun"] == __version__ and info["inner_target"] == "host://xnnpack"
    assert info["bundle_pushed"] is True and cached["target"]["info"]["bundle_pushed"] is False  # pushed once
    assert info["remote_bundle"].startswith(str(ws / "cache"))
    assert "XnnpackBackend" in info["backends"]  # what the remote runtime registered
    # same runtime on the same machine: the judged numbers are identical to a local run
    for a, b in zip(ssh["cases"], local["cases"]):
        assert a["outputs"][0]["stats"]["error_max"] == b["outputs"][0]["stats"]["error_max"]
        assert a["outputs"][0]["stats"]["error_l2_norm"] == b["outputs"][0]["stats"]["error_l2_norm"]
    print(f"\nwall: ssh first {timings['ssh']:.2f} s, ssh cached {timings['ssh-cached']:.2f} s, "
          f"local {timings['local']:.2f} s; ssh steps {cached['target']['info']['timings']}")
    assert wait_gone(str(ws)) == []


def test_pinned_fingerprint_instead_of_known_hosts(sshd, mlp3, tmp_path):
    ws = tmp_path / "ws"
    url = sshd.url(workspace=ws, known_hosts="<none>", fingerprint=sshd.host_fingerprint, multiplex="false")
    run = _run(url, mlp3, tmp_path / "w", cases=[1])
    assert [(c.case_index, c.status) for c in run.cases] == [(1, CaseStatus.OK)]
    assert len(run.cases[0].outputs[0].data) == 40
    bad = "SHA256:" + "A" * 43
    err = _fails(sshd.url(workspace=ws, known_hosts="<none>", fingerprint=bad), mlp3, tmp_path / "w2")
    assert err.kind == FailureKind.HOST_KEY.value
    assert bad in str(err) and sshd.host_fingerprint in str(err)  # names the pinned and the offered key


# ---- faults ---------------------------------------------------------------------------------------------
def test_auth_refused(sshd, mlp3, tmp_path):
    err = _fails(sshd.url(workspace=tmp_path / "ws", identity_file=str(sshd.wrong_key)), mlp3, tmp_path / "w")
    assert err.kind == FailureKind.AUTH_REFUSED.value
    assert "refused the key" in str(err) and "Permission denied (publickey)" in str(err)
    report = execute_run(RunRequest(bundle_path=mlp3, target=sshd.url(identity_file=str(sshd.wrong_key)),
                                    report_dir=tmp_path / "r")).to_json()
    assert {c["error_kind"] for c in report["cases"]} == {"auth-refused"} and report["summary"]["exit_code"] == 2


def test_unknown_and_changed_host_key(sshd, mlp3, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    err = _fails(sshd.url(known_hosts=str(empty)), mlp3, tmp_path / "w")
    assert err.kind == FailureKind.HOST_KEY.value and "host key not verified" in str(err)
    assert "fingerprint" in str(err)  # says how to fix it
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    changed = tmp_path / "changed_known_hosts"
    pub = other.with_suffix(".pub").read_text().split()
    changed.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    err = _fails(sshd.url(known_hosts=str(changed)), mlp3, tmp_path / "w2")
    assert err.kind == FailureKind.HOST_KEY.value


def test_remote_bundlerun_missing(sshd, mlp3, tmp_path):
    err = _fails(sshd.url(workspace=tmp_path / "ws", bundlerun="/nonexistent/venv/bin/bundlerun"), mlp3, tmp_path / "w")
    assert err.kind == FailureKind.TOOL_MISSING.value
    assert "/nonexistent/venv/bin/bundlerun --version" in str(err) and "not found" in str(err)
    assert len(str(err).splitlines()) == 1


def test_remote_bundlerun_other_version(sshd, mlp3, tmp_path):
    fake = _wrapper(tmp_path / "old-bundlerun", f'[ "$1" = --version ] && echo "bundlerun, version 0.0.9" && exit 0\n'
                                               f'exec {sshd.bundlerun} "$@"\n')
    err = _fails(sshd.url(workspace=tmp_path / "ws", bundlerun=fake), mlp3, tmp_path / "w")
    assert err.kind == FailureKind.VERSION_MISMATCH.value
    assert "remote bundlerun is 0.0.9" in str(err) and f"local is {__version__}" in str(err)
    assert len(str(err).splitlines()) == 1


def _full_dir(path: Path, bundle: Path) -> str:
    """A remote workspace with no room for the bundle: a 16 KiB tmpfs (as root); otherwise the
    cache's partial file is made a link to /dev/full, whose writes fail with ENOSPC from the kernel."""
    path.mkdir(parents=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(path)], capture_output=True)
    if res.returncode == 0:
        return "tmpfs"
    from bundlerun.targets.base import safe_name  # the target's artifact name rule
    from bundlerun.targets.remote.device_cache import local_sha256

    entry = path / "cache" / local_sha256(bundle)
    entry.mkdir(parents=True)
    (entry / f".{safe_name(bundle.name)}.partial").symlink_to("/dev/full")
    return "/dev/full"


def test_remote_disk_full(sshd, mlp3, tmp_path):
    ws = tmp_path / "full"
    how = _full_dir(ws, mlp3)
    try:
        assert mlp3.stat().st_size > 16 * 1024
        err = _fails(sshd.url(workspace=ws), mlp3, tmp_path / "w")
        assert err.kind == FailureKind.DEVICE_FULL.value, (how, str(err))
        assert "No space left on device" in str(err) and "push" in str(err)
    finally:
        if how == "tmpfs":
            subprocess.run(["umount", str(ws)], check=True)


def test_connection_dropped_mid_run(sshd, mlp3, tmp_path):
    """The server side of the session is killed while case 1 runs (it hangs in the remote runtime):
    case 1 is an infrastructure ERROR, case 2 runs over a new connection, nothing is left remotely."""
    ws = tmp_path / "ws"
    url = sshd.url(workspace=ws, env="BUNDLERUN_FAULT=hang@forward:1")
    seen, result = [], {}

    def run():
        result["run"] = _run(url, mlp3, tmp_path / "w", progress=seen.append)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 180
    while not seen and time.monotonic() < deadline:
        time.sleep(0.1)
    assert seen and seen[0].case_index == 0
    hanging = []
    while not hanging and time.monotonic() < deadline:  # case 1 is in flight in the remote runtime
        hanging = [p for p in live_processes(str(ws)) if "targets.workers.host" in p]
        time.sleep(0.1)
    assert hanging
    killed = sshd.kill_sessions()
    assert killed
    thread.join(timeout=240)
    assert not thread.is_alive()
    cases = result["run"].cases
    assert [c.status for c in cases] == [CaseStatus.OK, CaseStatus.ERROR, CaseStatus.OK], [c.error for c in cases]
    assert cases[1].error_kind is FailureKind.TRANSPORT and "connection was lost" in cases[1].error
    assert "while running this case" in cases[1].error
    assert len(list((tmp_path / "w").glob("ssh-worker-*.log"))) == 2  # a second session finished the run
    assert wait_gone(str(ws)) == []


def test_connection_dropped_for_good_stops_cleanly(sshd, mlp3, tmp_path):
    """After the drop the host refuses new connections (its key is no longer accepted): the in-flight
    case is a transport ERROR, the rest are not-run naming why, the call returns promptly."""
    ws = tmp_path / "ws"
    keys = tmp_path / "keys"
    keys.mkdir()
    key = keys / "k"
    key.write_bytes(sshd.user_key.read_bytes())
    key.chmod(0o600)
    url = sshd.url(workspace=ws, env="BUNDLERUN_FAULT=hang@forward:1", identity_file=str(key))
    seen, result = [], {}
    thread = threading.Thread(target=lambda: result.update(run=_run(url, mlp3, tmp_path / "w", progress=seen.append)))
    thread.start()
    deadline = time.monotonic() + 180
    while not seen and time.monotonic() < deadline:
        time.sleep(0.1)
    while not [p for p in live_processes(str(ws)) if "targets.workers.host" in p] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert seen and live_processes(str(ws))
    key.write_bytes(sshd.wrong_key.read_bytes())  # reconnecting now fails authentication
    assert sshd.kill_sessions()
    thread.join(timeout=120)
    assert not thread.is_alive()
    cases = result["run"].cases
    assert [c.status for c in cases] == [CaseStatus.OK, CaseStatus.ERROR, CaseStatus.ERROR]
    assert cases[1].error_kind is FailureKind.TRANSPORT
    assert cases[2].error_kind is FailureKind.NOT_RUN and "could not be re-established" in cases[2].error
    assert "refused the key" in cases[2].error
    assert wait_gone(str(ws)) == []


# ---- slow links: one timeout per step ------------------------------------------------------------------
def test_connect_timeout(mlp3, tmp_path):
    """A server that accepts TCP but never says its SSH banner."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        url = f"ssh://127.0.0.1:{port}/host://xnnpack?connect_timeout=2&ssh_config=/dev/null"
        t0 = time.monotonic()
        err = _fails(url, mlp3, tmp_path / "w")
        took = time.monotonic() - t0
    assert err.kind == FailureKind.HOST_TIMEOUT.value and "timed out" in str(err)
    assert 1.5 <= took < 12, took


def test_setup_timeout_kills_the_slow_remote_start(sshd, mlp3, tmp_path):
    ws = tmp_path / "ws"
    slow = _wrapper(tmp_path / "slow-bundlerun", f'[ "$1" = --version ] && exec {sshd.bundlerun} --version\n'
                                                f'sleep 29.317\nexec {sshd.bundlerun} "$@"\n')
    t0 = time.monotonic()
    run = _run(sshd.url(workspace=ws, bundlerun=slow, setup_timeout="2"), mlp3, tmp_path / "w")
    assert time.monotonic() - t0 < 20
    assert {c.status for c in run.cases} == {CaseStatus.TIMEOUT}
    assert {c.error_kind for c in run.cases} == {FailureKind.HOST_TIMEOUT}
    assert "not ready within 2 s" in run.cases[0].error
    assert wait_gone("sleep 29.317", 10) == [] and wait_gone(str(ws)) == []


THROTTLE = """
import os, select, socket, sys, time
rate = float(sys.argv[3])  # bytes/s from the client to the server
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
while True:
    ready = select.select([0, sock], [], [])[0]
    if 0 in ready:
        data = os.read(0, 512)
        if not data:
            break
        sock.sendall(data)
        time.sleep(len(data) / rate)
    if sock in ready:
        data = sock.recv(65536)
        if not data:
            break
        os.write(1, data)
"""


def test_push_timeout_on_a_slow_link(sshd, mlp3, tmp_path):
    """A real slow uplink: the connection goes through a ProxyCommand relay that sends at most
    4 KB/s to the server (replies are not slowed), so the 34 KB bundle cannot arrive within the
    3 s push timeout while the handshake and small commands still work."""
    relay = tmp_path / "throttle.py"
    relay.write_text(THROTTLE)
    proxy = f"ProxyCommand={sys.executable} {relay} %h %p 4000"
    ws = tmp_path / "ws"
    t0 = time.monotonic()
    err = _fails(sshd.url(workspace=ws, push_timeout="3", ssh_options=proxy.replace(",", "")), mlp3, tmp_path / "w")
    took = time.monotonic() - t0
    assert err.kind == FailureKind.HOST_TIMEOUT.value, str(err)
    assert "did not finish within 3 s (push timeout)" in str(err) and str(mlp3.stat().st_size) in str(err)
    assert took < 40
    from bundlerun.targets.remote.device_cache import local_sha256

    assert not (ws / "cache" / local_sha256(mlp3) / mlp3.name).exists()  # never renamed into place
    assert wait_gone(str(ws)) == [] and wait_gone(str(relay)) == []


def test_case_timeout_on_the_link(sshd, mlp3, tmp_path):
    """The remote runtime hangs on case 1; the link waits case_timeout=4 s for its result, kills the
    session (the remote worker then kills the hung runtime) and goes on with case 2."""
    ws = tmp_path / "ws"
    url = sshd.url(workspace=ws, env="BUNDLERUN_FAULT=hang@forward:1", case_timeout="4")
    t0 = time.monotonic()
    run = _run(url, mlp3, tmp_path / "w")
    took = time.monotonic() - t0
    assert [c.status for c in run.cases] == [CaseStatus.OK, CaseStatus.TIMEOUT, CaseStatus.OK]
    assert run.cases[1].error_kind is FailureKind.HOST_TIMEOUT and "within 4 s" in run.cases[1].error
    assert took < 120
    assert wait_gone(str(ws)) == []


def test_inner_target_refusal_comes_back_as_one_clear_error(sshd, mlp3, tmp_path):
    """The remote worker cannot open the inner target (mlx://gpu needs a Mac; this 'remote' is Linux):
    its own message and kind come back for every case, nothing is left running."""
    ws = tmp_path / "ws"
    report = execute_run(RunRequest(bundle_path=mlp3, target=sshd.url("mlx://gpu", workspace=ws),
                                    report_dir=tmp_path / "r")).to_json()
    assert report["summary"]["exit_code"] == 2
    errors = {c["error"] for c in report["cases"]}
    assert len(errors) == 1 and "mlx://gpu needs a Mac" in errors.pop()
    assert {c["error_kind"] for c in report["cases"]} == {"tool-missing"}
    assert report["target"]["info"]["remote_bundlerun"] == __version__
    assert wait_gone(str(ws)) == []


def test_inner_target_config_section_travels_to_the_remote_worker(sshd, mlp3, tmp_path):
    """`[targets.host]` of the local bundlerun.toml reaches the remote host:// (checked there): a
    valid section runs, an invalid one is the remote target's own bad-config error."""
    ws = tmp_path / "ws"
    url = sshd.url("host://xnnpack", workspace=ws)  # key, known_hosts and the remote bundlerun in the URL
    (tmp_path / "bundlerun.toml").write_text("[targets.host]\nthreads = 1\n")
    ok = run_cli("run", str(mlp3), "--target", url, "--report", str(tmp_path / "ok"), "--no-history", "--quiet",
                 cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr + ok.stdout
    (tmp_path / "bundlerun.toml").write_text("[targets.host]\nthreadz = 1\n")
    bad = run_cli("run", str(mlp3), "--target", url, "--report", str(tmp_path / "bad"), "--no-history", "--quiet",
                  cwd=tmp_path)
    report = json.loads((tmp_path / "bad" / "report.json").read_text())
    assert bad.returncode == 2 and {c["error_kind"] for c in report["cases"]} == {"bad-config"}
    assert "threadz" in report["cases"][0]["error"] and "threads" in report["cases"][0]["error"]  # did-you-mean
    assert wait_gone(str(ws)) == []


def test_local_bundlerun_killed_leaves_nothing_on_either_side(sshd, mlp3, tmp_path):
    """SIGKILL of the local `bundlerun run` (no cleanup code runs) while a case hangs remotely: the
    ssh master and worker channel lose their stdin, the remote worker its session; everything ends."""
    ws = tmp_path / "ws"
    key = tmp_path / "unique_key"  # a path only this test's ssh processes carry in their argv
    key.write_bytes(sshd.user_key.read_bytes())
    key.chmod(0o600)
    url = sshd.url(workspace=ws, identity_file=str(key), env="BUNDLERUN_FAULT=hang@forward:1")
    import glob
    import shutil
    import tempfile

    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "brssh-*")))
    proc = subprocess.Popen([sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "run", str(mlp3),
                             "--target", url, "--report", str(tmp_path / "r"), "--no-history", "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not [p for p in live_processes(str(ws)) if "targets.workers.host" in p] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in live_processes(str(ws)) if "targets.workers.host" in p], "case 1 never started remotely"
    assert live_processes(str(key))  # the local ssh master and worker channel
    proc.kill()
    proc.wait()
    assert wait_gone(str(key), 20) == []
    assert wait_gone(str(ws), 20) == []
    for leftover in set(glob.glob(os.path.join(tempfile.gettempdir(), "brssh-*"))) - before:
        shutil.rmtree(leftover, ignore_errors=True)  # the killed process's control folder (it never ran close())
