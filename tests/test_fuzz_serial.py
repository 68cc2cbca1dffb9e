"""The serial stream under attack: what a board's UART delivers, mutated, split and cut.

Real `arm_executor_runner` output (the formats in tests/test_runner_log.py) is mutated (bit flips,
truncation, NULs, invalid UTF-8, an early EOT, huge lines, repeated boots, garbage) and carried by a
real pyserial port to `targets.arm.serial_capture.capture_uart`, then through the same log parsing and
per-case classification the serial target uses (`parse_runner_log`, `case_from_session`):

- over `socket://` (a board or an FVP telnet UART): bytes sent in arbitrary pieces, then the
  board hangs up (or, for some inputs, goes silent with the socket open);
- over `loop://`: the bytes written into pyserial's loopback port, the capture ended by its deadline.

Whatever the bytes: no exception, no read past the deadline, every byte that arrived is in the
capture (and in the raw log sink) exactly once, and a stream whose outputs were lost or cut is
never an OK case. Clean runner output split anywhere gives exactly the outputs of the whole text.
"""

from __future__ import annotations

import random
import re
import socket
import threading
import time

import pytest
import serial

from bundlerun.bundles import scalar_types as st
from bundlerun.targets.et_runner.log import parse_runner_log
from bundlerun.targets.et_runner.protocol import SessionEnd, case_from_session
from bundlerun.targets.arm.serial import _ENDS
from bundlerun.targets.arm.serial_capture import capture_uart
from bundlerun.targets.arm.serial_settings import SerialSettings
from bundlerun.targets.base import CaseStatus
from tests.test_runner_log import REAL_BUS_FAULT, REAL_EARLY, REAL_HANG, REAL_TUTORIAL

N = 1000
_I = "I [executorch:arm_executor_runner.cpp:{} main()] {}\n"
QEMU_PASS = (
    _I.format(1406, "Running executor with parameter:")
    + _I.format(1299, "Model output match expected BundleIO bpte ref data.")
    + _I.format(1300, "TEST: BundleIO index[0] Test_result: PASS")
    + "Output[0][0]: (float) 0.500000\nOutput[0][1]: (float) -1.250000\n"
    + _I.format(1355, "Model run: 1")
    + _I.format(1551, "Program complete, exiting.") + "\x04"
)
DEVICE_FAIL = (  # the runner's own check failed: outputs printed, then its deliberate abort
    _I.format(1406, "Running executor with parameter:")
    + "E [executorch:arm_executor_runner.cpp:1290 verify_result()] Model output don't match expected BundleIO bpte "
      "ref data. rtol=0.010000 atol=0.010000\n"
    + _I.format(1291, "TEST: BundleIO index[0] Test_result: FAIL")
    + "Output[0][0]: (float) 0.750000\nOutput[0][1]: (float) 3.000000\n"
    + "F [executorch:arm_executor_runner.cpp:1320 main()] assert failed (model_ok == true): Problem running model\n"
)
CORPUS = [
    (QEMU_PASS, [(st.FLOAT, [2])]),
    (DEVICE_FAIL, [(st.FLOAT, [2])]),
    (REAL_TUTORIAL, [(st.INT, [5])]),
    (REAL_EARLY, [(st.FLOAT, [2])]),
    (REAL_BUS_FAULT, [(st.FLOAT, [2])]),
    (REAL_HANG, [(st.FLOAT, [2])]),
]
OUTPUT_LINE = re.compile(rb"Output\[(\d+)\]\[(\d+)\]")
UART_NOISE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f]")  # what the log parser drops inside a line


class _NoCloseNap:
    """pyserial's socket:// close() sleeps 0.3 s; the fuzz loop opens a port per input."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(_s):
        return None


@pytest.fixture(autouse=True)
def _fast_socket_close(monkeypatch):
    from serial.urlhandler import protocol_socket

    monkeypatch.setattr(protocol_socket, "time", _NoCloseNap())


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 5)):
        op = rng.randrange(9) if rng.random() < 0.9 else 6  # huge lines: 1 in ~16 mutations
        if op == 0 and b:  # bit flip
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # truncate: the board stopped mid-line
            del b[rng.randrange(len(b)):]
        elif op == 2:  # NULs, an early EOT, CRs, escapes
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.choice([b"\x00", b"\x00" * 64, b"\x04", b"\r", b"\r\r\n", b"\x1b[2J", b"\n\x04\n"])
        elif op == 3:  # invalid UTF-8 / random garbage (line noise at a wrong baud rate)
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.choice([b"\xff\xfe\xfd", b"\xc3\x28", b"\xed\xa0\x80", bytes(rng.randrange(256) for _ in range(32))])
        elif op == 4 and len(b) > 8:  # a chunk repeated (a reboot replays the banner and the run)
            i, j = sorted(rng.sample(range(len(b)), 2))
            k = rng.randrange(len(b))
            b[k:k] = b[i:j]
        elif op == 5 and b:  # a range lost (UART overrun)
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 40)]
        elif op == 6 and rng.random() < 0.4:  # a huge line, with or without its newline
            i = rng.randrange(len(b) + 1)
            b[i:i] = b"Output[0][0]: (float) " + b"9" * rng.choice((1000, 20_000, 300_000)) + rng.choice((b"\n", b""))
        elif op == 7:  # a forged verdict / completion line in the middle
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.choice([_I.format(1, "Program complete, exiting.").encode(),
                                 _I.format(2, "TEST: BundleIO index[0] Test_result: PASS").encode(),
                                 b"Output[0][7]: (float) 1.0\n", b"Output[0][0]: (float) nan\n"])
        else:  # digits changed in an output line
            m = list(re.finditer(rb"\) -?\d{1,12}\.\d{1,12}|\) \d{1,12}", bytes(b)))
            if m:
                g = rng.choice(m)
                b[g.start():g.end()] = str(rng.choice([0, -1, 1e9, 3.14159])).encode()
    return bytes(b)


def _splits(rng: random.Random, data: bytes) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 12)))) if len(data) > 1 else []
    edges = [0] + cuts + [len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:]) if b > a]


def _assert_ended(cap, i: int) -> None:
    """An OK case needs a run that ended: the capture saw the end, or (a board that went quiet
    after its last line, ended by the deadline) the log holds the completion marker."""
    if cap.status in ("finished", "aborted"):
        return
    log = parse_runner_log(cap.data)
    assert cap.status == "timeout" and (log.program_complete or log.eot_seen), (i, cap.status)


def _judge(capture, layout, port_url: str):
    """What the serial target does with a capture (targets/arm/serial.py, _attempt_on_board)."""
    log = parse_runner_log(capture.data)
    end = SessionEnd(_ENDS[capture.status], f"serial port {port_url}", None, capture.message)
    return case_from_session(log, end, "forward", 0, layout, None, "uart.log", capture.elapsed_s, {}, prefer="auto")


def _reference(text: str, layout):
    """The outputs of the whole text parsed at once, as if the run had finished normally."""
    log = parse_runner_log(text.encode())
    return case_from_session(log, SessionEnd("finished", "ref", None, None), "forward", 0, layout, None, "r.log",
                             0.0, {}, prefer="auto")


class _Board:
    """A board behind a TCP socket (what `serial+socket://` opens)."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.url = f"socket://127.0.0.1:{self.listener.getsockname()[1]}"

    def session(self, pieces: list[bytes], rng: random.Random, hang_up: bool = True):
        port = serial.serial_for_url(self.url, timeout=0.05)
        conn, _ = self.listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pauses = [rng.random() < 0.3 for _ in pieces]

        def send():
            try:
                for piece, pause in zip(pieces, pauses):
                    conn.sendall(piece)
                    if pause:
                        time.sleep(0.0005)  # let the reader see this piece on its own
            except OSError:
                pass
            finally:
                if hang_up:
                    conn.close()

        th = threading.Thread(target=send, daemon=True)
        th.start()
        return port, conn, th


@pytest.fixture(scope="module")
def board():
    b = _Board()
    yield b
    b.listener.close()


def _capture(board, pieces, rng, deadline_s, hang_up=True, settle_s=0.05):
    port, conn, th = board.session(pieces, rng, hang_up)
    sink: list[bytes] = []
    settings = SerialSettings(port_url=board.url, read_timeout_s=0.05, settle_s=settle_s)
    t0 = time.monotonic()
    try:
        cap = capture_uart(port, settings, t0 + deadline_s, sink.append)
    finally:
        took = time.monotonic() - t0
        port.close()
        th.join(5)
        conn.close()
    assert b"".join(sink) == cap.data  # the raw log file gets every byte, once
    return cap, took


def test_clean_runner_output_split_anywhere_gives_the_whole_text_outputs(board):
    rng = random.Random(0)
    for i in range(300):
        text, layout = CORPUS[i % 2]
        data = text.encode()
        cap, took = _capture(board, _splits(rng, data), rng, deadline_s=5.0)
        assert cap.status == ("finished" if i % 2 == 0 else "aborted"), (i, cap.status, cap.message)
        result = _judge(cap, layout, board.url)
        ref = _reference(text, layout)
        assert ref.status is CaseStatus.OK and result.status is CaseStatus.OK, (i, result.error)
        assert [o.data for o in result.outputs] == [o.data for o in ref.outputs]
        assert result.device_verdict == ref.device_verdict


def test_last_bytes_before_the_board_hangs_up_are_kept(board):
    """pyserial's socket read(n) drops what it gathered when the peer closes mid-read; the capture
    reads so that the runner's final lines survive an FVP/QEMU exiting right after them."""
    rng = random.Random(1)
    for i in range(50):
        data = QEMU_PASS.encode()
        cut = rng.randrange(1, len(data))
        cap, _ = _capture(board, [data[:cut]], rng, deadline_s=5.0)
        assert cap.data == data[:cut], (i, len(cap.data), cut)
        assert cap.status in ("port-lost", "finished")


@pytest.mark.parametrize("seed", [0, 1])
def test_mutated_uart_streams_never_escape_hang_or_pass_without_their_outputs(seed, board):
    rng = random.Random(seed)
    seen = {"ok": 0, "not-ok": 0}
    t_all = time.monotonic()
    for i in range(N // 2):
        text, layout = rng.choice(CORPUS)
        data = _mutate(rng, text.encode())
        if not data:
            data = b"\x00"
        stall = rng.random() < 0.03  # the board goes silent with the port open
        deadline_s = 0.3 if stall else 10.0
        try:
            cap, took = _capture(board, _splits(rng, data), rng, deadline_s, hang_up=not stall)
            result = _judge(cap, layout, board.url)
        except Exception as exc:
            raise AssertionError(f"seed {seed} input {i}: {type(exc).__name__}: {exc}") from exc
        assert took < deadline_s + 1.0, (i, took)
        assert data.startswith(cap.data), i  # bytes in order, none invented
        if cap.status == "port-lost":
            assert cap.data == data, f"input {i}: {len(data) - len(cap.data)} bytes lost before the hang-up"
        assert isinstance(result.status, CaseStatus)
        if result.status is CaseStatus.OK:
            seen["ok"] += 1
            _assert_ended(cap, i)
            (want,) = layout
            numel = want[1][0]
            printed = {(int(a), int(b)) for a, b in OUTPUT_LINE.findall(UART_NOISE.sub(b"", cap.data))}
            assert {(0, j) for j in range(numel)} <= printed, f"input {i}: OK without every Output line"
            (out,) = result.outputs
            assert len(out.data) == numel * 4
        else:
            seen["not-ok"] += 1
            assert result.error and "\n" not in result.error, (i, result.error)
    assert seen["ok"] > 0 and seen["not-ok"] > 0, seen
    assert time.monotonic() - t_all < 120


def test_loop_port_streams_end_at_the_deadline_without_escaping():
    """pyserial's loop:// port: the capture is ended by finishing or by its deadline (no hang-up)."""
    rng = random.Random(9)
    for i in range(200):
        text, layout = rng.choice(CORPUS[:3])
        data = _mutate(rng, text.encode())[:4000] or b"\n"  # loop:// holds 4096 bytes: written before reading
        port = serial.serial_for_url("loop://", timeout=0.01)
        try:
            port.write(data)
            settings = SerialSettings(port_url="loop://", read_timeout_s=0.005, settle_s=0.01)
            t0 = time.monotonic()
            cap = capture_uart(port, settings, t0 + 0.08)
            took = time.monotonic() - t0
        finally:
            port.close()
        assert took < 1.0 and data.startswith(cap.data)
        assert cap.status in ("finished", "aborted", "timeout", "no-output", "reboot")
        if cap.status == "timeout":
            assert cap.data == data
        result = _judge(cap, layout, "loop://")
        if result.status is CaseStatus.OK:
            _assert_ended(cap, i)
