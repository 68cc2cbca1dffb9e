"""labgrid:// against a real labgrid lab on loopback.

Real: labgrid-coordinator (gRPC), labgrid-exporter exporting pty serial ports through its real
ser2net (RFC 2217), labgrid-client for the lab admin's and other users' side, the serial
target over RFC 2217, bundlerun's CLI. The device behind the pty is the emulated board of
tests/doubles/board.py (ExecuTorch's host runtime printing arm_executor_runner's log).

labgrid itself is only in .venv-labgrid (scripts/setup.sh): bundlerun reaches it through
targets/labgrid_agent.py run by that venv's interpreter, and this process never imports it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bundlerun.bundles.bpte import read_bundle
from bundlerun.bundles.errors import ConfigError, TargetError
from bundlerun.targets import open_target, target_specs
from bundlerun.targets.base import CaseStatus, RunOptions
from bundlerun.targets.failures import FailureKind
from doubles.board import BoardProcess
from labgrid_fixture import LABGRID_PYTHON, Lab, SparePty, free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundle(bundle_cache):
    return bundle_cache("mlp", cases=2, target="host://portable")


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    with BoardProcess(tmp_path_factory.mktemp("lg-board")) as b:
        yield b


@pytest.fixture(scope="module")
def lab(tmp_path_factory, board):
    spare = SparePty()
    adb_port = free_port()  # nothing listens there: a phone that is off
    lab = Lab(tmp_path_factory.mktemp("lab"), {"grp1": board.port, "grp2": spare.name}, adb_port)
    try:
        with lab:
            lab.add_place("board1", "grp1", "pool=ci,soc=an547")
            lab.add_place("board2", "grp2", "pool=ci,soc=an547")
            lab.add_place("phone1", "phone", "kind=phone")
            yield lab
    finally:
        spare.close()


@pytest.fixture(autouse=True)
def _all_free(request):
    """Every test starts and ends with a free lab (an assertion of its own: nothing leaks)."""
    if "lab" not in request.fixturenames:
        yield
        return
    lab = request.getfixturevalue("lab")
    for place, holder in lab.holders().items():
        if holder:
            lab.client("-p", place, "release", "--kick")
    yield
    assert lab.holders() == {"board1": None, "board2": None, "phone1": None}


def board_opts(board) -> dict:
    return {"reset": "command", "reset_command": "reset\\n", "flash": board.flash_command()}


def run_target(url: str, config: dict, bundle_path: Path, work: Path, **opts):
    target = open_target(url, config)
    options = RunOptions(work_dir=work, **{"case_timeout_s": 30.0, "retries": 0, "config": config, **opts})
    return target.run(read_bundle(bundle_path), bundle_path, options)


def agents_with(mark: str) -> list[str]:
    """Command lines of live processes whose environment carries BUNDLERUN_TEST_MARK=mark."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if f"BUNDLERUN_TEST_MARK={mark}".encode() not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            out.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return out


def cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from bundlerun.runner.cli import main; main()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "BUNDLERUN_HISTORY": "off", **(env or {})}, **kw)


def test_registered_and_parsed():
    spec = target_specs()["labgrid"]
    assert spec.name == "labgrid" and spec.backend_for  # declared like every target
    t = open_target("labgrid://board1/rfc2217://?reset=none&coordinator=10.1.2.3:5&wait_s=2", {"baud": "9600"})
    assert (t.place, t.inner, t.settings.coordinator, t.settings.wait_s) == ("board1", "rfc2217://", "10.1.2.3:5", 2.0)
    assert t.inner_config == {"reset": "none", "baud": "9600"}  # everything else goes to the inner target
    pool = open_target("labgrid://?tag=pool=ci,soc=an547", {})
    assert (pool.place, pool.settings.tag) == ("", "pool=ci,soc=an547")
    for bad, why in (("labgrid://", "no place"), ("labgrid://b/?tag=a=1", "not both"),
                     ("labgrid://b/qemu://", "has no host"), ("labgrid://b/labgrid://c/", "inside labgrid"),
                     ("labgrid://b/nothing", "not a URL"), ("labgrid://?tag=novalue", "KEY=VALUE")):
        with pytest.raises(ConfigError, match=why):
            open_target(bad, {})


def test_cli_acquires_runs_and_releases(lab, board, bundle, tmp_path):
    board.configure(fault="none")
    opts = [a for k, v in board_opts(board).items() for a in ("--target-opt", f"{k}={v}")]
    # The coordinator comes from $LG_COORDINATOR here (the other tests put it in the URL).
    mark = f"cli-{os.getpid()}-{time.monotonic_ns()}"
    proc = cli("run", str(bundle), "--target", "labgrid://board1/", *opts, "--report", str(tmp_path / "rep"),
               "--timeout", "60", env={"LG_COORDINATOR": lab.address, "BUNDLERUN_TEST_MARK": mark})
    seen_holder = None
    while proc.poll() is None and seen_holder is None:  # while it runs, labgrid says the place is held by us
        seen_holder = lab.holder("board1")
        time.sleep(0.5)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert seen_holder and seen_holder.endswith("/" + os.environ.get("LG_USERNAME", __import__("getpass").getuser()))
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert [c["verdict"] for c in report["cases"]] == ["PASS", "PASS"]
    info = report["target"]["info"]["labgrid"]
    assert info["place"] == "board1" and info["acquired_by_us"] and info["released"] is True
    # labgrid ran in the agent, by .venv-labgrid's interpreter (no labgrid-client on PATH here), now gone
    assert info["labgrid_python"] == str(LABGRID_PYTHON)
    assert agents_with(mark) == []
    # The inner target really was the exporter's ser2net for the board's pty.
    port = info["inner_target"].rsplit(":", 1)[1]
    assert info["inner_target"].startswith("rfc2217://127.0.0.1:")
    assert f"started ser2net for {board.port} on port {port}" in lab.log("exporter.log")
    assert lab.holder("board1") is None
    deadline = time.monotonic() + 10  # the exporter stops its ser2net once the place is released
    while lab.ser2net_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lab.ser2net_running() == []


def test_released_after_a_timeout(lab, board, bundle, tmp_path):
    board.configure(fault="hang")
    try:
        cfg = {**board_opts(board), "coordinator": lab.address}
        run = run_target("labgrid://board1/", cfg, bundle, tmp_path, case_timeout_s=3.0)
    finally:
        board.configure(fault="none")
    assert [c.status for c in run.cases] == [CaseStatus.TIMEOUT, CaseStatus.TIMEOUT]
    assert run.cases[0].error_kind is FailureKind.HOST_TIMEOUT
    assert run.info["labgrid"]["released"] is True
    assert lab.holder("board1") is None


def test_released_when_the_inner_target_fails(lab, board, bundle, tmp_path):
    # An inner option that is invalid raises inside the run, after the place was acquired.
    with pytest.raises(ConfigError, match="reset='bogus'"):
        run_target("labgrid://board1/", {**board_opts(board), "reset": "bogus", "coordinator": lab.address},
                   bundle, tmp_path)
    assert lab.holder("board1") is None
    # A network ADB phone that does not answer: the inner adb+tcp target fails, the place is freed.
    failed = None
    try:
        run = run_target(f"labgrid://phone1/?coordinator={lab.address}", {"connect_timeout_s": "3"}, bundle, tmp_path)
        failed = run.cases[0]
        assert run.info["labgrid"]["inner_target"].startswith("adb+tcp://127.0.0.1:")
        assert failed.status is CaseStatus.ERROR
    except TargetError as exc:
        failed = exc
    assert "127.0.0.1" in str(getattr(failed, "error", failed))
    assert lab.holder("phone1") is None


def test_busy_place_is_a_device_busy_error(lab, board, bundle, tmp_path):
    lab.client("-p", "board1", "acquire", user="alice", check=True)
    try:
        t0 = time.monotonic()
        with pytest.raises(TargetError) as exc:
            run_target(f"labgrid://board1/?coordinator={lab.address}", board_opts(board), bundle, tmp_path)
        assert exc.value.kind == FailureKind.DEVICE_BUSY.value == "device-busy"
        assert "board1" in str(exc.value) and "/alice" in str(exc.value)
        assert time.monotonic() - t0 < 15
        assert lab.holder("board1").endswith("/alice")  # never kicked
        # Losing the race (taken between our look and our request): the coordinator's refusal is Busy too.
        from bundlerun.targets.labgrid import Busy, Coordinator

        with Coordinator(lab.address, 10) as c:
            with pytest.raises(Busy, match="Place board1 is already acquired"):
                c.acquire("board1")
        # Through the CLI: every case ERROR device-busy, exit code 2 (infrastructure)
        proc = cli("run", str(bundle), "--target", f"labgrid://board1/?coordinator={lab.address}",
                   "--report", str(tmp_path / "rep"))
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, out + err
        report = json.loads((tmp_path / "rep" / "report.json").read_text())
        assert {c["error_kind"] for c in report["cases"]} == {"device-busy"}
    finally:
        lab.client("-p", "board1", "release", user="alice", check=True)


def test_pool_by_tag_skips_busy_places_and_waits(lab, board, bundle, tmp_path):
    lab.client("-p", "board2", "acquire", user="alice", check=True)
    try:
        t = open_target(f"labgrid://?tag=pool=ci&coordinator={lab.address}", {})
        name, ours = t.acquire()
        assert (name, ours) == ("board1", True)
        assert lab.holder("board1") and not lab.holder("board1").endswith("/alice")
        # Both places of the pool busy now: device-busy naming both holders.
        with pytest.raises(TargetError) as exc:
            t.acquire()
        assert exc.value.kind == "device-busy"
        assert "board2 is acquired by" in str(exc.value) and "/alice" in str(exc.value)
        t.release("board1")
        assert lab.holder("board1") is None
        # With wait_s, a place freed by its holder meanwhile is taken.
        lab.client("-p", "board1", "acquire", user="bob", check=True)
        threading.Timer(2.0, lambda: lab.client("-p", "board1", "release", user="bob")).start()
        waiting = open_target(f"labgrid://?tag=pool=ci&wait_s=20&poll_s=0.5&coordinator={lab.address}", {})
        t0 = time.monotonic()
        assert waiting.acquire() == ("board1", True)
        assert 1.5 < time.monotonic() - t0 < 20
        waiting.release("board1")
    finally:
        lab.client("-p", "board2", "release", user="alice")
    with pytest.raises(TargetError, match="no labgrid place .* has the tags nope=1"):
        open_target(f"labgrid://?tag=nope=1&coordinator={lab.address}", {}).acquire()


def test_acquire_false_uses_my_own_acquisition(lab, board, bundle, tmp_path):
    board.configure(fault="none")
    with pytest.raises(TargetError, match="acquire=false, but no place you hold"):
        run_target(f"labgrid://board1/?acquire=false&coordinator={lab.address}", board_opts(board), bundle, tmp_path)
    lab.client("-p", "board1", "acquire", check=True)  # as this user, on this host
    try:
        run = run_target(f"labgrid://board1/?acquire=false&coordinator={lab.address}", board_opts(board), bundle,
                         tmp_path)
        assert [c.status for c in run.cases] == [CaseStatus.OK, CaseStatus.OK]
        assert run.info["labgrid"]["acquired_by_us"] is False
        assert lab.holder("board1")  # still mine: bundlerun did not acquire it, so it does not release it
    finally:
        lab.client("-p", "board1", "release", check=True)


def test_unknown_place_and_unreachable_coordinator(lab, tmp_path):
    with pytest.raises(TargetError, match="has no place 'nosuch' \\(places: board1, board2, phone1\\)"):
        open_target(f"labgrid://nosuch/?coordinator={lab.address}", {}).acquire()
    dead = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(TargetError) as exc:
        open_target(f"labgrid://board1/?coordinator={dead}&coordinator_timeout_s=5", {}).acquire()
    assert exc.value.kind == "transport"
    assert f"cannot reach the labgrid coordinator at {dead}" in str(exc.value)
    assert time.monotonic() - t0 < 10


def test_ctrl_c_releases_the_place(lab, board, bundle, tmp_path):
    board.configure(fault="hang")
    try:
        opts = [a for k, v in board_opts(board).items() for a in ("--target-opt", f"{k}={v}")]
        mark = f"ctrlc-{os.getpid()}-{time.monotonic_ns()}"
        proc = cli("run", str(bundle), "--target", f"labgrid://board1/?coordinator={lab.address}", *opts,
                   "--report", str(tmp_path / "rep"), "--timeout", "120", env={"BUNDLERUN_TEST_MARK": mark},
                   start_new_session=True)
        deadline = time.monotonic() + 90
        uart = tmp_path / "rep" / "work" / "serial" / "forward-case0.uart.log"
        while not uart.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert uart.exists(), proc.communicate()
        assert lab.holder("board1")
        # the labgrid agent runs in a session of its own: the terminal's Ctrl-C does not reach it
        assert any("labgrid_agent.py serve" in a for a in agents_with(mark)), agents_with(mark)
        time.sleep(1.0)  # inside the hung case
        os.killpg(proc.pid, signal.SIGINT)  # a Ctrl-C reaches the terminal's whole process group
        out, err = proc.communicate(timeout=60)
    finally:
        board.configure(fault="none")
    assert proc.returncode == 130, out + err
    assert lab.holder("board1") is None  # released through the agent after the Ctrl-C
    assert agents_with(mark) == []  # and the agent reaped
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["summary"]["interrupted"] is True


def test_qemu_uart_board_behind_a_labgrid_exporter(qemu_runner, bundle_cache, tmp_path):
    """The place's serial port is a pty whose other end is ExecuTorch's arm_executor_runner on
    qemu-system-arm: real firmware behind the real exporter's ser2net, judged by the CLI."""
    from labgrid_fixture import QemuBoard

    elf = qemu_runner("--mode", "uart") / "arm_executor_runner.elf"
    arm_bundle = bundle_cache("mlp", "fp32", backend="portable", cases=2, target="qemu://mps3-an547")
    with QemuBoard(tmp_path / "qemu-board", elf) as qemu, \
            Lab(tmp_path / "lab", {"uart0": qemu.port}, free_port()) as lab:
        lab.add_place("m55", "uart0", "soc=an547")
        proc = cli("run", str(arm_bundle), "--target", f"labgrid://?tag=soc=an547&coordinator={lab.address}",
                   "--target-opt", "reset=command", "--target-opt", "reset_command=reset\\n",
                   "--target-opt", f"flash={qemu.flash_command()}", "--report", str(tmp_path / "rep"),
                   "--timeout", "60")
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out + err
        report = json.loads((tmp_path / "rep" / "report.json").read_text())
        assert [c["verdict"] for c in report["cases"]] == ["PASS", "PASS"]
        info = report["target"]["info"]["labgrid"]
        assert info["place"] == "m55" and info["released"] is True and info["inner_target"].startswith("rfc2217://")
        uart = (tmp_path / "rep" / "work" / "serial" / "forward-case1.uart.log").read_bytes()
        assert b"Program complete, exiting." in uart or b"\x04" in uart
        assert b"Output[0][0]" in uart  # printed by the real runner, through QEMU's UART, ser2net, RFC 2217
        assert lab.holders() == {"m55": None}
    ps = subprocess.run(["ps", "-ww", "-eo", "args="], capture_output=True, text=True).stdout
    assert str(tmp_path / "qemu-board") not in ps  # no QEMU of this test left running


# ---- the process boundary: labgrid only in .venv-labgrid, reached through the agent -------------
AGENT = REPO / "targets" / "labgrid_agent.py"


def agent(*args: str, timeout: float = 60) -> tuple[dict, int, float]:
    """One-shot `<labgrid python> labgrid_agent.py ARGS`: (its JSON answer, exit code, seconds)."""
    t0 = time.monotonic()
    res = subprocess.run([str(LABGRID_PYTHON), str(AGENT), *args], capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL, cwd="/")
    took = time.monotonic() - t0
    lines = res.stdout.splitlines()
    assert len(lines) == 1, res.stdout + res.stderr  # exactly one JSON object on stdout
    return json.loads(lines[0]), res.returncode, took


def test_this_process_never_imports_labgrid(lab):
    import importlib.util

    from bundlerun.targets.labgrid import Coordinator

    with Coordinator(lab.address, 10) as c:
        assert "board1" in c.places()
    assert "labgrid" not in sys.modules and importlib.util.find_spec("labgrid") is None
    # and the agent's venv cannot import bundlerun: the agent stands on labgrid and the stdlib alone
    res = subprocess.run([str(LABGRID_PYTHON), "-c", "import bundlerun"], capture_output=True, text=True, timeout=60,
                         cwd="/")  # (not the repository, whose bundlerun/ folder a `-c` would find)
    assert res.returncode != 0 and "No module named 'bundlerun'" in res.stderr


def test_agent_script_one_shot_commands(lab):
    places, rc, t_places = agent("places", "--coordinator", lab.address)
    assert rc == 0 and places["ok"], places
    board1 = places["result"]["places"]["board1"]
    assert board1["tags"] == {"pool": "ci", "soc": "an547"} and board1["acquired"] is None
    me = places["result"]["me"]
    got, rc, t_acquire = agent("acquire", "board1", "--coordinator", lab.address)
    try:
        assert rc == 0 and got["result"]["acquired"] == me == lab.holder("board1"), got
        again, rc, _ = agent("acquire", "board1", "--coordinator", lab.address)
        assert rc == 1 and again["kind"] == "busy" and "already acquired" in again["error"], again
        res, rc, t_resolve = agent("resolve", "board1", "--coordinator", lab.address)
        assert rc == 0, res
        (serial,) = res["result"]["resources"]
        assert serial["cls"] == "NetworkSerialPort" and serial["avail"] is True
        assert serial["params"]["host"] == "127.0.0.1" and int(serial["params"]["port"]) > 0
        assert int(serial["params"]["speed"]) == 115200
    finally:
        rel, rc, t_release = agent("release", "board1", "--coordinator", lab.address)
    assert rc == 0 and rel["result"]["released"] is True and lab.holder("board1") is None, rel
    # someone else's place: release refuses (kind not-ours), --if-ours leaves it alone
    lab.client("-p", "board2", "acquire", user="alice", check=True)
    try:
        rel, rc, _ = agent("release", "board2", "--coordinator", lab.address)
        assert rc == 1 and rel["kind"] == "not-ours" and rel["error"].endswith("/alice"), rel
        rel, rc, _ = agent("release", "board2", "--if-ours", "--coordinator", lab.address)
        assert rc == 0 and rel["result"] == {"place": "board2", "released": False, "acquired": lab.holder("board2")}
    finally:
        lab.client("-p", "board2", "release", user="alice", check=True)
    dead, rc, _ = agent("places", "--coordinator", f"127.0.0.1:{free_port()}", "--timeout", "5")
    assert rc == 1 and dead["kind"] == "unreachable", dead
    print(f"one-shot agent calls: places {t_places:.2f}s acquire {t_acquire:.2f}s resolve {t_resolve:.2f}s "
          f"release {t_release:.2f}s")


def test_one_agent_per_run_answers_every_call(lab):
    from bundlerun.targets.labgrid import Coordinator

    t0 = time.monotonic()
    with Coordinator(lab.address, 10) as c:
        started = time.monotonic() - t0
        pid = c.agent.proc.pid
        t1 = time.monotonic()
        for _ in range(5):
            assert set(c.places()) == {"board1", "board2", "phone1"}
        per_call = (time.monotonic() - t1) / 5
        c.acquire("board1")
        try:
            assert lab.holder("board1") == c.me
            (name, cls, entry), = c.resources("board1")  # the exported RawSerialPort, as the exporter's ser2net
            assert (name, cls, entry.avail, entry.params["host"]) == ("RawSerialPort", "NetworkSerialPort", True,
                                                                      "127.0.0.1")
        finally:
            assert c.release("board1") is True
        assert lab.holder("board1") is None
        assert c.agent.proc.pid == pid  # the same process all along
    assert not Path(f"/proc/{pid}").exists()  # reaped on exit
    print(f"agent start-up {started:.2f}s, then {per_call * 1000:.0f} ms per call")


def test_interpreter_discovery(tmp_path, monkeypatch):
    from bundlerun.targets import labgrid as lg

    monkeypatch.delenv("BUNDLERUN_LABGRID_PYTHON", raising=False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    # nothing on PATH: the repository's .venv-labgrid
    assert lg.find_labgrid_python() == (str(LABGRID_PYTHON), "the repository's .venv-labgrid")
    # labgrid-client on PATH (a user's own labgrid install): the interpreter of its shebang
    client = bindir / "labgrid-client"
    client.write_text(f"#!{LABGRID_PYTHON}\nimport sys\n")
    client.chmod(0o755)
    assert lg.find_labgrid_python() == (str(LABGRID_PYTHON), f"shebang of {client}")
    # pip's form for interpreter paths too long for a shebang
    client.write_text(f"#!/bin/sh\n'''exec' \"{sys.executable}\" \"$0\" \"$@\"\n' '''\nimport sys\n")
    client.chmod(0o755)
    assert lg.find_labgrid_python()[0] == sys.executable
    # $BUNDLERUN_LABGRID_PYTHON over PATH, python= over both
    monkeypatch.setenv("BUNDLERUN_LABGRID_PYTHON", str(LABGRID_PYTHON))
    assert lg.find_labgrid_python() == (str(LABGRID_PYTHON), "$BUNDLERUN_LABGRID_PYTHON")
    assert lg.find_labgrid_python(sys.executable) == (sys.executable, "python=")
    with pytest.raises(TargetError, match="does not exist") as exc:
        lg.find_labgrid_python(str(tmp_path / "nope" / "python"))
    assert exc.value.kind == "tool-missing"
    # nothing anywhere: tool-missing naming what to install
    monkeypatch.delenv("BUNDLERUN_LABGRID_PYTHON")
    client.unlink()
    monkeypatch.setattr(lg, "REPO_VENV_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(TargetError) as exc:
        lg.find_labgrid_python()
    assert exc.value.kind == "tool-missing" and "scripts/setup.sh" in str(exc.value)
    assert "labgrid==26.0.1" in str(exc.value) and "BUNDLERUN_LABGRID_PYTHON" in str(exc.value)


def test_an_interpreter_without_labgrid_is_tool_missing(bundle, tmp_path, monkeypatch):
    # bundlerun's own interpreter has no labgrid: the agent says so, the run fails tool-missing
    monkeypatch.setenv("BUNDLERUN_LABGRID_PYTHON", sys.executable)
    with pytest.raises(TargetError) as exc:
        run_target("labgrid://board1/?coordinator=127.0.0.1:9", {}, bundle, tmp_path)
    assert exc.value.kind == "tool-missing" and "labgrid is not importable by" in str(exc.value)


def test_an_agent_that_does_not_answer_is_killed(tmp_path, monkeypatch):
    from bundlerun.targets import labgrid as lg

    mark = f"hang-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("BUNDLERUN_TEST_MARK", mark)
    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nsleep 300\n")
    silent.chmod(0o755)
    monkeypatch.setattr(lg, "AGENT_START_TIMEOUT_S", 1.5)
    t0 = time.monotonic()
    with pytest.raises(TargetError, match="did not answer starting within 1.5s") as exc:
        lg.Coordinator("127.0.0.1:9", 1, python=str(silent)).__enter__()
    assert exc.value.kind == "transport" and time.monotonic() - t0 < 10
    assert agents_with(mark) == []  # the agent and its child killed and reaped
    # one that starts but never answers a request: bounded by coordinator_timeout_s + the slack
    mute = tmp_path / "mute-python"
    mute.write_text('#!/bin/sh\necho \'{"ok": true, "hello": {"me": "h/u", "labgrid": "0", "python": "x"}}\'\n'
                    "sleep 300\n")
    mute.chmod(0o755)
    monkeypatch.setattr(lg, "AGENT_SLACK_S", 1.0)
    t0 = time.monotonic()
    with lg.Coordinator("127.0.0.1:9", 1, python=str(mute)) as c:
        with pytest.raises(TargetError, match="did not answer to places within") as exc:
            c.places()
    assert exc.value.kind == "transport" and time.monotonic() - t0 < 10
    assert agents_with(mark) == []
