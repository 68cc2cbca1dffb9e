"""Issue 26 item 4: no argument injection into ssh, adb, the serial flash tools, QEMU or a farm plan.

`ssh://-oProxyCommand=touch pwned/host://xnnpack` once made the system ssh run `touch pwned` on
this machine. Every test here runs the real `bundlerun` in a fresh process next to a real OpenSSH
server (tests/sshd_fixture.py: Debian's sshd on a loopback port), with the real ssh client on
PATH, so an injected ProxyCommand *would* run; its marker file must never appear, and no process
the test started may be left behind. No doubles.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402
from sshd_fixture import live_processes, sshd, wait_gone  # noqa: E402,F401

from bundlerun.targets import argv  # noqa: E402

MARK = "pwned"


@pytest.fixture(scope="module")
def mlp(bundle_cache) -> Path:
    return bundle_cache("mlp", cases=2)


def _inert(tmp_path: Path, r) -> None:
    assert not (tmp_path / MARK).exists(), "the injected command ran"
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert wait_gone(MARK, timeout=5) == []  # no ssh (or ProxyCommand) of this test left running


def test_control_a_real_ssh_runs_a_proxycommand(sshd, tmp_path):
    """The premise, with the real client: an argv word starting with -o is an option to ssh."""
    import subprocess

    subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"-oProxyCommand=touch {MARK}",
                    "-p", str(sshd.port), "127.0.0.1", "true"], cwd=tmp_path, capture_output=True, timeout=60)
    assert (tmp_path / MARK).exists()


@pytest.mark.parametrize("netloc", [
    f"-oProxyCommand=touch {MARK}",                          # the URL
    f"-oProxyCommand=touch {MARK}@127.0.0.1:{{port}}",       # as the user: ssh -l takes it, still refused
    f"127.0.0.1:{{port}}@-oProxyCommand=touch {MARK}",
    "-F",                                                    # any option, not only -o
])
def test_hostile_ssh_url_runs_nothing(sshd, mlp, tmp_path, netloc):
    url = f"ssh://{netloc.format(port=sshd.port)}/host://xnnpack"
    r = run_cli("run", str(mlp), "--target", url, "--report", str(tmp_path / "r"), "--no-history", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    # a URL that names no usable target is refused before any case runs: one line, no report folder
    assert "starts with '-'" in r.stderr or "not a" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists() and "Traceback" not in r.stderr
    _inert(tmp_path, r)


def test_a_real_ssh_run_still_works(sshd, mlp, tmp_path):
    """The checks do not stop the legitimate URL (user, host, port, options from the query)."""
    r = run_cli("run", str(mlp), "--target", sshd.url(workspace=tmp_path / "ws"), "--report", str(tmp_path / "r"),
                "--no-history", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert wait_gone(str(tmp_path / "ws")) == []


def _plan(tmp_path: Path, mlp: Path, targets: str, extra: str = "") -> Path:
    plan = tmp_path / "plan.toml"
    plan.write_text(f'bundles = ["{mlp}"]\nretries = 0\ntargets = {targets}\n{extra}')
    return plan


@pytest.mark.parametrize("targets, extra, needle", [
    ('["ssh://-oProxyCommand=touch pwned/host://xnnpack"]', "", "starts with '-'"),
    ('["ssh://127.0.0.1:{port}/host://xnnpack?ssh_options=ProxyCommand=touch%20pwned"]', "", "'ssh_options'"),
    ('[{{url = "ssh://127.0.0.1:{port}/host://xnnpack", options = {{ssh_options = ["ProxyCommand=touch pwned"]}}}}]',
     "", "'ssh_options'"),
    ('[{{url = "ssh://127.0.0.1:{port}/host://xnnpack", options = {{ssh = "sh"}}}}]', "", "'ssh'"),
    ('[{{url = "ssh://127.0.0.1:{port}/host://xnnpack", options = {{ssh_config = "evil_config"}}}}]', "",
     "'ssh_config'"),
    ('["ssh://127.0.0.1:{port}/serial:///dev/null?flash=touch%20pwned"]', "", "'flash'"),  # an inner URL's query
    ('["pool:p"]', '[pools.p]\ndevices = ["serial:///dev/null"]\noptions = {{launch = "touch pwned"}}\n', "'launch'"),
    ('[{{url = "fvp://corstone-300/ethos-u55-128", options = {{"corstone-300" = {{fvp_path = "/bin/sh"}}}}}}]', "",
     "'corstone-300.fvp_path'"),
    ('["adb://SERIAL?adb_path=/bin/sh"]', "", "'adb_path'"),
    ('["adb://-H/"]', "", "starts with '-'"),
])
def test_a_farm_plan_names_no_program(sshd, mlp, tmp_path, targets, extra, needle):
    evil = tmp_path / "evil_config"
    evil.write_text(f"Host *\n  ProxyCommand touch {tmp_path / MARK}\n")
    plan = _plan(tmp_path, mlp, targets.format(port=sshd.port), extra.format())
    for args in (("--dry-run",), ("--report", str(tmp_path / "farm"), "--no-history")):
        r = run_cli("farm", str(plan), *args, cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        lines = [line for line in r.stderr.splitlines() if needle in line]
        assert len(lines) == 1 and lines[0].startswith("bundlerun: error: ") and str(plan) in lines[0], r.stderr
        _inert(tmp_path, r)


def test_adb_serial_and_flash_values_are_never_options(mlp, tmp_path):
    """adb://-... and a substituted flash value starting with '-' are refused before any tool runs."""
    r = run_cli("run", str(mlp), "--target", "adb://-a", "--report", str(tmp_path / "a"), "--no-history")
    assert r.returncode == 2 and "starts with '-'" in r.stdout + r.stderr, r.stdout + r.stderr
    flash = f"touch {tmp_path / MARK} {{target}}"
    r = run_cli("run", str(mlp), "--target", "serial+socket://127.0.0.1:9?reset=none", "--target-opt",
                f"flash={flash}", "--target-opt", "target=--recursive", "--report", str(tmp_path / "s"),
                "--no-history", "--timeout", "5", "--setup-timeout", "5")
    assert r.returncode == 2, r.stdout + r.stderr
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    assert "target '--recursive' starts with '-'" in report["cases"][0]["error"], report["cases"][0]
    _inert(tmp_path, r)


@pytest.mark.parametrize("check, value", [
    (argv.host, "-oProxyCommand=x"), (argv.host, "a b"), (argv.host, "h\n"), (argv.host, ""),
    (argv.user, "-l"), (argv.user, "a;b"), (argv.serial, "--"), (argv.serial, "a b"),
    (argv.word, "-x"), (argv.word, "ok\x1b[2J"), (argv.port, "0"), (argv.port, "99999"), (argv.port, "2e2"),
    (argv.program, "-c"), (argv.remote_path, "-rf"), (argv.option_value, "a\nb"),
])
def test_the_shared_checks_refuse_with_one_line(check, value):
    from bundlerun.bundles.errors import TargetError

    with pytest.raises(TargetError) as err:
        check(value, "value", "where")
    assert "\n" not in str(err.value) and str(err.value).startswith("where: ")


def test_the_shared_checks_keep_real_values():
    assert argv.host("mac.local") == "mac.local" and argv.host("fe80::1%eth0") == "fe80::1%eth0"
    assert argv.user("ci.bot@corp") == "ci.bot@corp" and argv.serial("[fe80::1]:5555") == "[fe80::1]:5555"
    assert argv.local_path("-odd-name.bpte").startswith("/")  # a positional file can never be an option
    assert argv.qemu_opt("/x,file=/etc/passwd") == "/x,,file=/etc/passwd"  # QEMU's own escape of a comma
    assert live_processes(MARK) == []
