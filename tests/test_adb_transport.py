"""Both transports against the emulated adbd: auth, shell exit status, sync, quoting, faults."""

from __future__ import annotations

import os
import stat
import time

import pytest

from doubles.adbd import FakeAdbd
from doubles.android_env import PrivateAdbServer, adb_available
from bundlerun.targets.remote import transport as tr
from bundlerun.targets.android.adb_cli import AdbCliTransport, parse_devices
from bundlerun.targets.android.adb_direct import AdbShellTransport, default_key_path

NASTY = "/data/local/tmp/we ird'; touch /data/local/tmp/INJECTED; echo \"x"






@pytest.fixture
def tcp(device, home):
    t = AdbShellTransport(host="127.0.0.1", port=device.port, connect_timeout_s=5, auth_timeout_s=5)
    t.connect()
    yield t
    t.close()


@pytest.fixture(scope="module")
def adb_server(tmp_path_factory):
    if not adb_available():
        pytest.skip("the adb binary is not installed")
    server = PrivateAdbServer(tmp_path_factory.mktemp("adbhome")).start()
    yield server
    server.stop()


def test_key_created_0600_and_reused_without_new_prompt(device, home):
    t = AdbShellTransport(host="127.0.0.1", port=device.port, connect_timeout_s=5, auth_timeout_s=5)
    t.connect()
    key = home / ".android" / "adbkey"
    assert key.exists() and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert device.stats.auth_prompts == 1
    t.close()
    t2 = AdbShellTransport(host="127.0.0.1", port=device.port, connect_timeout_s=5, auth_timeout_s=5)
    t2.connect()  # signature over the token is verified: no second prompt
    assert device.stats.auth_prompts == 1 and device.stats.signatures_ok == 1
    t2.close()


def test_android_user_home_is_honoured(device, tmp_path, monkeypatch):
    monkeypatch.setenv("ANDROID_USER_HOME", str(tmp_path / "auh"))
    assert default_key_path() == tmp_path / "auh" / "adbkey"
    t = AdbShellTransport(host="127.0.0.1", port=device.port, connect_timeout_s=5, auth_timeout_s=5)
    t.connect()
    t.close()
    assert (tmp_path / "auh" / "adbkey").exists()


def test_unknown_key_is_unauthorized(tmp_path, home):
    d = FakeAdbd(tmp_path / "dev", accept_new_keys=False)
    d.start()
    try:
        t = AdbShellTransport(host="127.0.0.1", port=d.port, connect_timeout_s=3, auth_timeout_s=1)
        with pytest.raises(tr.TransportError) as err:
            t.connect()
        assert err.value.kind == tr.UNAUTHORIZED and "Allow USB debugging" in str(err.value)
    finally:
        d.stop()


def test_offline_and_absent_are_classified(tmp_path, home):
    d = FakeAdbd(tmp_path / "dev", faults={"offline": True})
    d.start()
    try:
        t = AdbShellTransport(host="127.0.0.1", port=d.port, connect_timeout_s=1, auth_timeout_s=1)
        with pytest.raises(tr.TransportError) as err:
            t.connect()
        assert err.value.kind == tr.OFFLINE
    finally:
        d.stop()
    t = AdbShellTransport(host="127.0.0.1", port=d.port, connect_timeout_s=1)
    with pytest.raises(tr.TransportError) as err:
        t.connect()
    assert err.value.kind == tr.ABSENT and "cannot connect" in str(err.value)


def test_exit_status_and_output_over_adb_shell(tcp):
    res = tr.shell(tcp, "echo out; echo err 1>&2; exit 3", 10)
    assert res.exit_status == 3
    assert "out" in res.output and "err" in res.output and "__BUNDLERUN_RC" not in res.output
    res = tr.shell(tcp, "printf no-newline", 10)
    assert res.exit_status == 0 and res.output.strip() == "no-newline"


def test_forged_marker_in_output_is_not_taken(tcp):
    res = tr.shell(tcp, "echo __BUNDLERUN_RC=0:deadbeef; exit 7", 10)
    assert res.exit_status == 7


def test_missing_marker_is_a_transport_error():
    with pytest.raises(tr.TransportError) as err:
        tr.parse_marker("partial output", "abcd1234")
    assert err.value.transient


def test_sync_roundtrip_and_quoting(tcp, device, tmp_path):
    payload = os.urandom(300_000)
    src = tmp_path / "src.bin"
    src.write_bytes(payload)
    tr.mkdir(tcp, NASTY, 10)
    remote = NASTY + "/file name;$(id).bin"
    tcp.push(src, remote, 30)
    assert tcp.stat(remote, 10).size == len(payload)
    assert "file name;$(id).bin" in tcp.listdir(NASTY, 10)
    dst = tmp_path / "dst.bin"
    tcp.pull(remote, dst, 30)
    assert dst.read_bytes() == payload
    tr.remove(tcp, NASTY, 10)
    assert tcp.stat(remote, 10) is None
    assert not (device.root / "data/local/tmp/INJECTED").exists()


def test_no_space_gives_the_device_message(tcp, device, tmp_path):
    device.faults["free_bytes"] = 10_000
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(50_000))
    with pytest.raises(tr.TransportError) as err:
        tcp.push(src, "/data/local/tmp/big.bin", 30)
    assert err.value.kind == tr.NO_SPACE and "No space left on device" in str(err.value)
    assert not err.value.transient


def test_push_cut_mid_transfer_is_transient(tcp, device, tmp_path):
    device.faults.update(cut_push_after=100_000, cut_push_times=1)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(400_000))
    t0 = time.monotonic()
    with pytest.raises(tr.TransportError) as err:
        tcp.push(src, "/data/local/tmp/big.bin", 30)
    assert err.value.transient and time.monotonic() - t0 < 10
    tcp.reconnect()
    tcp.push(src, "/data/local/tmp/big.bin", 30)
    assert tcp.stat("/data/local/tmp/big.bin", 10).size == 400_000


def test_pull_cut_mid_transfer_leaves_no_partial_file(tcp, device, tmp_path):
    (device.root / "data/local/tmp/out.bin").write_bytes(os.urandom(300_000))
    device.faults.update(cut_pull_after=70_000, cut_pull_times=1)
    dst = tmp_path / "out.bin"
    with pytest.raises(tr.TransportError) as err:
        tcp.pull("/data/local/tmp/out.bin", dst, 30)
    assert err.value.transient and not dst.exists()


def test_shell_timeout_kills_the_device_process(tcp, device):
    with pytest.raises(tr.TransportError) as err:
        tr.shell(tcp, "sleep 30", 1.0)
    assert err.value.kind == tr.TIMEOUT
    deadline = time.monotonic() + 5
    while device.live_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert device.live_processes() == []


def test_usb_without_libusb_is_a_clear_error(home):
    try:
        import usb1  # noqa: F401
        pytest.skip("libusb1 is installed here")
    except ImportError:
        pass
    t = AdbShellTransport(usb_serial="ABC123")
    with pytest.raises(tr.TransportError) as err:
        t.connect()
    assert err.value.kind == tr.USB and "bundlerun[usb]" in str(err.value)


def test_parse_devices_states():
    text = ("List of devices attached\nemulator-5554\tdevice product:sdk model:Pixel transport_id:1\n"
            "R58M\tunauthorized usb:1-1 transport_id:2\n10.0.0.2:5555\toffline\n\n")
    entries = parse_devices(text)
    assert [(e.serial, e.state) for e in entries] == [
        ("emulator-5554", "device"), ("R58M", "unauthorized"), ("10.0.0.2:5555", "offline")]
    assert entries[0].info["model"] == "Pixel"


# -- the real adb CLI through a private adb server

def test_adb_cli_shell_push_pull_and_quoting(adb_server, tmp_path, monkeypatch):
    d = FakeAdbd(tmp_path / "dev")
    d.start()
    try:
        serial = adb_server.connect(d.port)
        assert adb_server.state(serial) == "device"
        t = AdbCliTransport(serial, server_port=adb_server.port, connect_timeout_s=10)
        t.connect()
        res = tr.shell(t, "echo hi; exit 5", 10)
        assert res.exit_status == 5 and res.output.strip() == "hi"
        payload = os.urandom(200_000)
        (tmp_path / "a").write_bytes(payload)
        tr.mkdir(t, NASTY, 10)
        remote = NASTY + "/x y'z.bin"
        t.push(tmp_path / "a", remote, 30)
        assert t.stat(remote, 10).size == len(payload)
        assert "x y'z.bin" in t.listdir(NASTY, 10)
        t.pull(remote, tmp_path / "b", 30)
        assert (tmp_path / "b").read_bytes() == payload
        assert not (d.root / "data/local/tmp/INJECTED").exists()
        monkeypatch.setenv("ANDROID_SERIAL", serial)
        t2 = AdbCliTransport(None, server_port=adb_server.port)
        assert t2.serial == serial
    finally:
        adb_server.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()


def test_adb_cli_states_unauthorized_offline_absent(adb_server, tmp_path):
    locked = FakeAdbd(tmp_path / "locked", accept_new_keys=False)
    dead = FakeAdbd(tmp_path / "dead", faults={"offline": True})
    locked.start()
    dead.start()
    try:
        for dev, kind in ((locked, tr.UNAUTHORIZED), (dead, tr.OFFLINE)):
            serial = f"127.0.0.1:{dev.port}"
            t = AdbCliTransport(serial, server_port=adb_server.port, connect_timeout_s=3)
            with pytest.raises(tr.TransportError) as err:
                t.connect()
            assert err.value.kind == kind, str(err.value)
        t = AdbCliTransport("NOSUCHDEVICE", server_port=adb_server.port, connect_timeout_s=2)
        with pytest.raises(tr.TransportError) as err:
            t.connect()
        assert err.value.kind == tr.ABSENT and "not attached" in str(err.value)
    finally:
        for dev in (locked, dead):
            adb_server.adb("disconnect", f"127.0.0.1:{dev.port}")
            dev.stop()


def test_devices_command_lists_states(adb_server, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from bundlerun.runner.commands.devices import command

    d = FakeAdbd(tmp_path / "dev")
    d.start()
    try:
        serial = adb_server.connect(d.port)
        res = CliRunner().invoke(command, ["-P", str(adb_server.port), "--json"])
        assert res.exit_code == 0, res.output
        import json

        entries = {e["serial"]: e for e in json.loads(res.output)}
        assert entries[serial]["state"] == "device" and entries[serial]["model"] == "Emulated_SoC_sm8650"
    finally:
        adb_server.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()
