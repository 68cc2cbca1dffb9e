"""Every UART fault ends as a classified result with the capture saved and the port closed.

Faults come from the board double (`tests/doubles/board.py`): line noise and
non-UTF-8 bytes, CR/LF mixes, lines split across reads, a runner that never
finishes, a mid-run reboot, a USB unplug (the device node disappears), a port
held by another process, and a firmware hard fault.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from bundlerun.targets.base import CaseStatus
from doubles.board import BoardProcess, firmware_outputs
from serial_helpers import case_bytes, child_pids, open_fds, run_serial


@pytest.fixture(scope="module")
def zoo_bundle(bundle_cache):
    return bundle_cache("tiny-cnn", cases=3)


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    with BoardProcess(tmp_path_factory.mktemp("board")) as b:
        yield b


@pytest.fixture
def no_leaks(board):
    fds = open_fds()
    kids = child_pids({board.proc.pid})
    yield
    assert open_fds() - fds == set(), "a port or log file was left open"
    assert child_pids({board.proc.pid}) - kids == set(), "a flash/reset process was left running"


@pytest.mark.parametrize("fault", ["garbage", "crlf", "split"])
def test_noisy_uart_still_gives_exact_outputs(fault, board, zoo_bundle, tmp_path, no_leaks):
    board.configure(fault=fault, seed=3)
    run = run_serial(board.url, board.target_config(), zoo_bundle, tmp_path, cases=[1])
    (case,) = run.cases
    assert case.status == CaseStatus.OK, (case.error_kind, case.error)
    ref = firmware_outputs(case_bytes(zoo_bundle, "forward", 1))
    assert [o.data for o in case.outputs] == [np.ascontiguousarray(a).tobytes() for a in ref]
    raw = open(case.log_path, "rb").read()
    if fault == "garbage":
        with pytest.raises(UnicodeDecodeError):
            raw.decode("utf-8")
    if fault == "crlf":
        assert b"\r\n" in raw and raw.replace(b"\r\n", b"").count(b"\n") > 0


def test_runner_that_never_finishes_is_a_timeout(board, zoo_bundle, tmp_path, no_leaks):
    board.configure(fault="hang")
    t0 = time.monotonic()
    run = run_serial(board.url, board.target_config(), zoo_bundle, tmp_path, cases=[0], case_timeout_s=2.0)
    took = time.monotonic() - t0
    (case,) = run.cases
    assert case.status == CaseStatus.TIMEOUT and case.error_kind == "host-timeout"
    assert 2.0 <= case.elapsed_s < 3.0 and took < 15
    raw = open(case.log_path, "rb").read()
    assert b"Model run: 1" in raw and b"Program complete" not in raw
    assert case.log_excerpt


def test_reboot_mid_run_is_an_error(board, zoo_bundle, tmp_path, no_leaks):
    board.configure(fault="reboot")
    run = run_serial(board.url, board.target_config(), zoo_bundle, tmp_path, cases=[2])
    (case,) = run.cases
    assert case.status == CaseStatus.ERROR and case.error_kind == "reboot"
    assert case.outputs == []
    raw = open(case.log_path, "rb").read()
    assert raw.count(b"PTE @ ") == 2


def test_hard_fault_is_an_error(board, zoo_bundle, tmp_path, no_leaks):
    broken = tmp_path / "broken.bpte"
    broken.write_bytes(b"\x00\x00\x00\x00BP08" + bytes(200))
    board.configure(fault="none")
    cfg = board.target_config(flash=f"cp {broken} {board.state / 'flash.bpte'}", settle_s=0.3)
    run = run_serial(board.url, cfg, zoo_bundle, tmp_path, cases=[0])
    (case,) = run.cases
    assert case.status == CaseStatus.ERROR and case.error_kind == "hard-fault"
    assert "Hard fault" in case.error
    assert any("Hard fault" in ln for ln in case.log_excerpt)


def test_port_held_by_another_process_is_port_busy(board, zoo_bundle, tmp_path, no_leaks):
    board.configure(fault="none")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import serial, sys, time; p = serial.Serial(sys.argv[1], exclusive=True); "
            "print('held', flush=True); time.sleep(60)",
            board.port,
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"held"
        run = run_serial(board.url, board.target_config(), zoo_bundle, tmp_path, cases=[0, 1])
        for case in run.cases:
            assert case.status == CaseStatus.ERROR and case.error_kind == "transport" and case.extra["transport_fault"] == "port-busy"
            assert f"pid {holder.pid}" in case.error
            assert case.log_path is None
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # Released: the same board answers again.
    run = run_serial(board.url, board.target_config(), zoo_bundle, tmp_path, cases=[0])
    assert run.cases[0].status == CaseStatus.OK


def test_unplugged_board_is_port_lost(zoo_bundle, tmp_path):
    """USB unplug mid-run, on a pty and on socket:// (both boards boot in parallel)."""
    boards = [BoardProcess(tmp_path / "pty"), BoardProcess(tmp_path / "tcp", tcp=True)]
    try:
        for b in boards:
            b.start()
        for b in boards:
            b.wait_ready()
            b.configure(fault="unplug")
        for b in boards:
            fds = open_fds()
            kids = child_pids({x.proc.pid for x in boards})
            run = run_serial(b.url, b.target_config(), zoo_bundle, tmp_path / f"work-{b.tcp}", cases=[0, 1], retries=1)
            first, second = run.cases
            assert first.status == CaseStatus.ERROR
            # The retry finds the device gone; the first attempt's port-lost stays on record.
            faults = [e["transport_fault"] for e in first.extra.get("earlier_attempts", [])] + [first.extra["transport_fault"]]
            assert first.error_kind == "transport"
            assert faults[0] == "port-lost" and faults[-1] in ("port-lost", "port-missing")
            saved = open(first.log_path, "rb").read()
            assert b"PTE @ " in saved and b"Program complete" not in saved
            assert second.status == CaseStatus.ERROR and second.extra["transport_fault"] == "port-missing"
            b.proc.wait(timeout=10)  # the board went away by itself
            assert open_fds() - fds == set()
            assert child_pids({x.proc.pid for x in boards}) - kids == set()
    finally:
        for b in boards:
            b.close()


def test_capture_stop_rules_over_loop_port():
    """capture_uart on pyserial's loop:// (what is written is read back): the stop rules."""
    import serial

    from bundlerun.targets.arm.serial_capture import capture_uart
    from bundlerun.targets.arm.serial_settings import SerialSettings

    def cap(payload: bytes, timeout: float = 5.0, **kw):
        port = serial.serial_for_url("loop://", timeout=0.05)
        try:
            port.write(payload)
            return capture_uart(port, SerialSettings(port_url="loop://", **kw), time.monotonic() + timeout)
        finally:
            port.close()

    line = "I [executorch:arm_executor_runner.cpp:{} main()] {}\r\n".format
    semihost_boot = (line(1, "Running executor with parameter:") + line(2, "PTE @ 0x7 [----BP08]")).encode()
    done = line(3, "Program complete, exiting.").encode()
    # One semihosting boot prints both start markers: not a reboot.
    assert cap(semihost_boot + done).status == "finished"
    assert cap(semihost_boot + semihost_boot + done).status == "reboot"
    # EOT alone ends a UART-only run; the bytes after it are not waited for.
    assert cap(semihost_boot + b"\x04").status == "finished"
    # A fatal line, then silence for settle_s: the capture stops early.
    c = cap(semihost_boot + line(4, "Hard fault").encode().replace(b"I [", b"F ["), settle_s=0.3)
    assert c.status == "aborted" and c.elapsed_s < 2
    # Unfinished: bounded by the deadline.
    c = cap(semihost_boot, timeout=0.5)
    assert c.status == "timeout" and 0.5 <= c.elapsed_s < 1.5
