"""The serial lane end to end: flash, reset, capture, parse, over a pty and socket://.

The board is `tests/doubles/board.py`: ExecuTorch's host runtime behind a pty
(or TCP) printing arm_executor_runner's log. Nothing else is faked: pyserial
opens the pty slave / socket, the flash step is a real external command, the
ETDump is written by ExecuTorch's ETDump writer and read by its deserializer.
"""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from bundlerun.bundles.errors import ConfigError
from bundlerun.targets import open_target, parse_target_url
from bundlerun.targets.base import CaseStatus
from bundlerun.targets.et_runner.outputs import LOSSY_ROUNDING_ATOL
from bundlerun.targets.arm.serial_settings import settings_from
from doubles.board import BoardProcess, firmware_outputs
from serial_helpers import case_bytes, child_pids, open_fds, run_serial


@pytest.fixture(scope="module")
def zoo_bundle(bundle_cache):
    return bundle_cache("tiny-cnn", cases=3)


@pytest.fixture(scope="module")
def oracle(zoo_bundle):
    """Per case: what the board's runtime computes (the bit-exact expectation)."""
    return {i: firmware_outputs(case_bytes(zoo_bundle, "forward", i)) for i in range(3)}


@pytest.fixture(scope="module")
def pty_board(tmp_path_factory):
    with BoardProcess(tmp_path_factory.mktemp("board-pty")) as board:
        yield board


@pytest.fixture(scope="module")
def tcp_board(tmp_path_factory):
    with BoardProcess(tmp_path_factory.mktemp("board-tcp"), tcp=True) as board:
        yield board


def _check_exact(run, oracle):
    for case in run.cases:
        assert case.status == CaseStatus.OK, (case.error_kind, case.error, case.log_excerpt)
        assert case.extra["outputs_from"] == "etdump"
        ref = oracle[case.case_index]
        assert len(case.outputs) == len(ref)
        for raw, arr in zip(case.outputs, ref):
            assert raw.lossy is False
            assert raw.data == np.ascontiguousarray(arr).tobytes()


def test_pty_validates_every_case_at_full_precision(pty_board, zoo_bundle, oracle, tmp_path):
    pty_board.configure(fault="none")
    fds_before = open_fds()
    kids_before = child_pids({pty_board.proc.pid})
    run = run_serial(pty_board.url, pty_board.target_config(), zoo_bundle, tmp_path)
    assert [(c.method, c.case_index) for c in run.cases] == [("forward", 0), ("forward", 1), ("forward", 2)]
    _check_exact(run, oracle)
    # Different cases really ran different inputs (one-case bundles flashed per case).
    assert run.cases[0].outputs[0].data != run.cases[1].outputs[0].data
    for case in run.cases:
        assert case.device_verdict["verdict"] == "PASS"
        assert set(case.device_verdict["error_stats"]) >= {"max_absolute_error", "mean_absolute_error"}
        raw = open(case.log_path, "rb").read()
        assert b"Program complete, exiting." in raw and b"#[RUN THIS]" in raw
        assert case.elapsed_s is not None and case.elapsed_s < 30
        assert (tmp_path / "serial" / f"forward-case{case.case_index}.bpte").exists()
    assert run.info["per_case_flash"] is True
    # Port closed, flash processes reaped.
    assert open_fds() - fds_before == set()
    assert child_pids({pty_board.proc.pid}) - kids_before == set()


def test_socket_path_validates(tcp_board, zoo_bundle, oracle, tmp_path):
    tcp_board.configure(fault="none")
    fds_before = open_fds()
    run = run_serial(tcp_board.url, tcp_board.target_config(), zoo_bundle, tmp_path, cases=[0, 2])
    assert tcp_board.url.startswith("serial+socket://127.0.0.1:")
    assert [c.case_index for c in run.cases] == [0, 2]
    _check_exact(run, oracle)
    assert run.info["port"].startswith("socket://")
    assert open_fds() - fds_before == set()


def test_printed_outputs_are_marked_lossy(pty_board, zoo_bundle, oracle, tmp_path):
    pty_board.configure(fault="none", etdump=False)
    run = run_serial(pty_board.url, pty_board.target_config(), zoo_bundle, tmp_path, cases=[1])
    (case,) = run.cases
    assert case.status == CaseStatus.OK, case.error
    assert case.extra["outputs_from"] == "printed"
    ref = oracle[1]
    for raw, arr in zip(case.outputs, ref):
        assert raw.lossy is True
        err = np.abs(raw.to_array().astype(np.float64) - arr.astype(np.float64)).max()
        assert 0 < err <= LOSSY_ROUNDING_ATOL  # 6 decimals lose something, never more than the bound


def test_forced_printed_mode_ignores_etdump(pty_board, zoo_bundle, tmp_path):
    pty_board.configure(fault="none")
    run = run_serial(pty_board.url, pty_board.target_config(outputs="printed"), zoo_bundle, tmp_path, cases=[0])
    assert run.cases[0].status == CaseStatus.OK
    assert all(o.lossy for o in run.cases[0].outputs)


def test_device_fail_verdict_is_information_not_error(pty_board, zoo_bundle, oracle, tmp_path):
    """Firmware built with a too-tight ET_ATOL aborts after its FAIL; the host still judges."""
    pty_board.configure(fault="none", atol=-1.0, rtol=0.0)
    run = run_serial(
        pty_board.url, pty_board.target_config(settle_s=0.5), zoo_bundle, tmp_path, cases=[0]
    )
    (case,) = run.cases
    assert case.status == CaseStatus.OK, (case.error_kind, case.error)
    assert case.device_verdict["verdict"] == "FAIL"
    assert case.device_verdict["tolerances"]["atol"] == -1.0
    assert case.extra["capture_status"] == "aborted"
    _check_exact(run, oracle)


def test_without_per_case_flash_only_case0_runs(pty_board, zoo_bundle, tmp_path):
    """The stock runner checks case 0 of what it holds; other cases are skipped, not faked."""
    pty_board.configure(fault="none")
    (pty_board.state / "flash.bpte").write_bytes(case_bytes(zoo_bundle, "forward", 0))
    cfg = pty_board.target_config()
    del cfg["flash"]
    run = run_serial(pty_board.url, cfg, zoo_bundle, tmp_path)
    assert [c.status for c in run.cases] == [CaseStatus.OK, CaseStatus.SKIP, CaseStatus.SKIP]
    assert "{case_bundle}" in run.cases[1].error


def test_flash_failures_are_classified(pty_board, zoo_bundle, tmp_path):
    pty_board.configure(fault="none")
    run = run_serial(pty_board.url, pty_board.target_config(flash="false {case_bundle}"), zoo_bundle, tmp_path, cases=[0])
    assert run.cases[0].status == CaseStatus.ERROR and run.cases[0].error_kind == "tool-failed"
    assert "exited with 1" in run.cases[0].error
    run = run_serial(
        pty_board.url, pty_board.target_config(flash="no-such-flasher-xyz {case_bundle}"), zoo_bundle, tmp_path, cases=[0]
    )
    assert run.cases[0].error_kind == "tool-failed" and "not found" in run.cases[0].error
    run = run_serial(
        pty_board.url,
        pty_board.target_config(flash="sh -c 'sleep 30' {case_bundle}", flash_timeout_s=0.5),
        zoo_bundle,
        tmp_path,
        cases=[0],
    )
    assert run.cases[0].error_kind == "tool-failed" and run.cases[0].extra["transport_fault"] == "flash-timeout"


def test_url_and_config_parsing():
    s = settings_from(parse_target_url("serial:///dev/ttyACM0?baud=921600&reset=rts"), {"flash": "pyocd load {elf}"})
    assert (s.port_url, s.baudrate, s.reset, s.flash) == ("/dev/ttyACM0", 921600, "rts", "pyocd load {elf}")
    s = settings_from(parse_target_url("serial+socket://127.0.0.1:5000"), {})
    assert (s.port_url, s.reset) == ("socket://127.0.0.1:5000", "none")
    s = settings_from(parse_target_url("rfc2217://lab-host:7000"), {})
    assert s.port_url == "rfc2217://lab-host:7000" and s.reset == "dtr"
    s = settings_from(parse_target_url("serial://x?port=loop://"), {})
    assert s.port_url == "loop://"
    for url, cfg in [
        ("serial:///dev/ttyACM0?reset=command", {}),
        ("serial:///dev/ttyACM0?reset=bounce", {}),
        ("serial:///dev/ttyACM0?baud=fast", {}),
        ("serial:///dev/ttyACM0?reset=exec", {}),
    ]:
        with pytest.raises(ConfigError):
            open_target(url, cfg)


@pytest.mark.parametrize("reset", ["none", "dtr", "rts", "dtr+rts", "command"])
def test_silent_port_is_a_timeout_over_loop_url(reset, tmp_path, zoo_bundle):
    """pyserial's loop:// echoes only what we send: no runner ever answers."""
    cfg = {"reset": reset, "reset_command": "reset\\n", "reset_pulse_s": 0.01}
    run = run_serial("serial://x?port=loop://", cfg, zoo_bundle, tmp_path, cases=[0], case_timeout_s=0.5)
    (case,) = run.cases
    assert case.status == CaseStatus.TIMEOUT
    if reset == "command":  # our own echo: bytes, but no runner line -> the baud-rate hint
        assert case.error_kind == "host-timeout" and "baud" in case.error
        assert open(case.log_path, "rb").read() == b"reset\n"
    else:
        assert case.error_kind == "host-timeout"


def test_probe_reset_and_single_flash(pty_board, zoo_bundle, oracle, tmp_path):
    """reset = "exec" (a probe tool) and a flash command without {case_bundle}: case 0 only."""
    pty_board.configure(fault="none")
    cfg = {
        "reset": "exec",
        "reset_exec": pty_board.reset_command(),
        "flash": pty_board.flash_command().replace("{case_bundle}", "{bundle}"),
    }
    run = run_serial(pty_board.url, cfg, zoo_bundle, tmp_path)
    assert [c.status for c in run.cases] == [CaseStatus.OK, CaseStatus.SKIP, CaseStatus.SKIP]
    assert run.cases[1].error_kind == "unsupported"
    _check_exact(type(run)(run.target, run.cases[:1]), oracle)
    assert run.info["per_case_flash"] is False and "flash" in run.logs
    assert (tmp_path / "serial" / "forward-case0.reset.log").read_text().startswith("$ ")


def test_cli_run_judges_serial_outputs(pty_board, zoo_bundle, tmp_path, cli):
    """`bundlerun run --target serial://...` end to end: exit 0, every output judged PASS."""
    import json

    pty_board.configure(fault="none")
    report = tmp_path / "report"
    res = cli(
        "run", str(zoo_bundle), "--report", str(report), "--target", pty_board.url, "--no-history", "--quiet",
        "--timeout", "30",
        "--target-opt", "reset=command", "--target-opt", "reset_command=reset\\n",
        "--target-opt", f"flash={pty_board.flash_command()}",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((report / "report.json").read_text())
    assert len(data["cases"]) == 3
    for case in data["cases"]:
        assert case["status"] == "ok" and case["device_verdict"]["verdict"] == "PASS"
        assert case["outputs"] and all(o["verdict"] == "PASS" for o in case["outputs"])


def _pty_serial_class(on_dtr_pulse):
    import serial

    class PtyWithoutModemLines(serial.Serial):
        """A pty has no modem-control lines (a USB-serial adapter does): RTS/BREAK
        requests from RFC 2217 clients are dropped, CTS/DSR read idle, and a DTR
        pulse (asserted, then released) is wired to the board's reset, as on many
        dev boards."""

        _dtr_was = None

        def _update_dtr_state(self):
            if self._dtr_was and not self._dtr_state:
                on_dtr_pulse()
            self._dtr_was = self._dtr_state

        def _update_rts_state(self):
            pass

        def _update_break_state(self):
            pass

        cts = dsr = ri = cd = property(lambda self: False)

    return PtyWithoutModemLines


def _PtyWithoutModemLines(device, on_dtr_pulse, **kw):
    return _pty_serial_class(on_dtr_pulse)(device, **kw)


class Rfc2217Bridge:
    """pyserial's own RFC 2217 server side (`serial.rfc2217.PortManager`) in front of
    the board's pty, one client at a time, like `examples/rfc2217_server.py`."""

    def __init__(self, device: str, on_dtr_pulse=lambda: None):
        self.device = device
        self.on_dtr_pulse = on_dtr_pulse
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        import serial
        import serial.rfc2217

        self.server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except (socket.timeout, OSError):
                continue
            ser = _PtyWithoutModemLines(self.device, self.on_dtr_pulse, timeout=0.05)
            lock = threading.Lock()

            class Conn:
                def write(self, data):
                    with lock:
                        conn.sendall(data)

            manager = serial.rfc2217.PortManager(ser, Conn())
            alive = threading.Event()
            alive.set()

            def pump():
                while alive.is_set():
                    try:
                        data = ser.read(ser.in_waiting or 1)
                        if data:
                            Conn().write(b"".join(manager.escape(data)))
                    except (OSError, serial.SerialException):
                        break

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                conn.settimeout(0.2)
                while not self.stop.is_set():
                    try:
                        data = conn.recv(1024)
                    except socket.timeout:
                        continue
                    if not data:
                        break
                    ser.write(b"".join(manager.filter(data)))
            except OSError as exc:
                self.error = exc
            finally:
                alive.clear()
                reader.join(timeout=2)
                ser.close()
                conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        self.server.close()


def test_rfc2217_path_validates(pty_board, zoo_bundle, oracle, tmp_path):
    """rfc2217:// through pyserial's RFC 2217 client and server; reset by a DTR pulse over the wire."""
    pty_board.configure(fault="none")
    pulses = []

    def dtr_reset():  # the bridge's DTR line drives the board's reset pin
        pulses.append(1)
        (pty_board.state / "reset-request").touch()

    bridge = Rfc2217Bridge(pty_board.port, dtr_reset)
    try:
        url = f"rfc2217://127.0.0.1:{bridge.port}"
        cfg = pty_board.target_config()
        del cfg["reset"]  # rfc2217 defaults to a DTR pulse
        run = run_serial(url, cfg, zoo_bundle, tmp_path, cases=[1, 2])
    finally:
        bridge.close()
    assert run.info["port"] == url and run.info["reset"] == "dtr"
    assert len(pulses) == 2
    _check_exact(run, oracle)
