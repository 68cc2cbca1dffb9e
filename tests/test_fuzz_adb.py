"""The ADB packet layer under attack: what a device sends back, mutated, never escapes or hangs.

bundlerun's direct transport (`adb+tcp://`, `targets/android/adb_direct.py`: adb-shell's
transport with our handshake, packet checks and sync push/pull) is fed the bytes a real session
with the emulated adbd (tests/doubles/adbd.py) sent, recorded by a proxy and then mutated: bit
flips, truncation, dropped/duplicated/swapped packets, corrupted header fields (command, ids,
length, magic) and corrupted sync messages inside the payloads. Each mutated stream is replayed to
the real client code through a socket pair. Whatever the bytes, an operation ends in its result or
a `TransportError` (a `TargetError` with a kind), never another exception, within its timeout;
a stream cut short never yields a short file or a wrong exit status. Also fuzzed: the exit-status
marker of shell output (`targets/remote/transport.parse_marker`), `adb devices -l` parsing and the
adb CLI transport's handling of what `adb` prints (`targets/android/adb_cli.py`).

The first tests pin the handshake contract (protocol version, max payload, delayed ack) against
the emulated device, which answers as a real adbd does.
"""

from __future__ import annotations

import os
import random
import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from doubles.adbd import FakeAdbd
from bundlerun.bundles.errors import TargetError
from bundlerun.targets.android import adb_cli
from bundlerun.targets.android import adb_direct
from bundlerun.targets.android.adb_direct import AdbShellTransport
from bundlerun.targets.remote import transport as tr

N = 1000
CMDS = [struct.unpack("<I", c)[0] for c in (b"CNXN", b"AUTH", b"OPEN", b"OKAY", b"CLSE", b"WRTE", b"SYNC")]
FIXED_NONCE = "0123abcd"


# ---------------------------------------------------------------- the handshake contract


def _connect(device, **kw) -> AdbShellTransport:
    t = AdbShellTransport(host="127.0.0.1", port=device.port, connect_timeout_s=5, auth_timeout_s=5, **kw)
    t.connect()
    return t


def test_handshake_negotiates_what_a_real_adb_host_does(device, home, tmp_path):
    t = _connect(device)
    try:
        got = t.negotiated
        assert got["version"] == 0x01000001 and got["max_payload"] == 1024 * 1024
        assert got["delayed_ack"] is True and "delayed_ack" in got["features"]
        assert device.stats.host_versions[-1] == 0x01000001
        payload = os.urandom(3 * 1024 * 1024 + 17)
        (tmp_path / "up.bin").write_bytes(payload)
        t.push(tmp_path / "up.bin", "/data/local/tmp/big.bin", 30)
        assert (device.root / "data/local/tmp/big.bin").read_bytes() == payload
        t.pull("/data/local/tmp/big.bin", tmp_path / "down.bin", 30)
        assert (tmp_path / "down.bin").read_bytes() == payload
        # 1 MiB packets, streamed under the delayed-ack window (the stock client sends 64 KiB at a time)
        assert device.stats.largest_host_write > 512 * 1024
        assert device.stats.delayed_ack_streams >= 2
        assert tr.shell(t, "echo ok", 10).output.strip() == "ok"
    finally:
        t.close()


def test_device_without_delayed_ack_gets_one_write_in_flight(tmp_path, home):
    d = FakeAdbd(tmp_path / "dev", delayed_ack=False)
    d.start()
    try:
        t = _connect(d)
        assert t.negotiated["delayed_ack"] is False and "delayed_ack" not in t.negotiated["features"]
        payload = os.urandom(2 * 1024 * 1024 + 5)
        (tmp_path / "up.bin").write_bytes(payload)
        t.push(tmp_path / "up.bin", "/data/local/tmp/x.bin", 30)
        t.pull("/data/local/tmp/x.bin", tmp_path / "down.bin", 30)
        assert (tmp_path / "down.bin").read_bytes() == payload
        assert d.stats.delayed_ack_streams == 0
        t.close()
    finally:
        d.stop()


def test_stock_adb_shell_client_still_gets_checksums_and_no_delayed_ack(device, home, tmp_path):
    """A host offering 0x01000000 without features (adb-shell's own handshake) keeps the old rules."""
    from adb_shell.adb_device import AdbDeviceTcp

    signer = adb_direct.load_signer()
    dev = AdbDeviceTcp("127.0.0.1", device.port, default_transport_timeout_s=5)
    dev.connect(rsa_keys=[signer], auth_timeout_s=5, read_timeout_s=5)
    try:
        (tmp_path / "f").write_bytes(b"abc" * 1000)
        dev.push(str(tmp_path / "f"), "/data/local/tmp/f", read_timeout_s=5)  # adb-shell checks every checksum
        assert dev.shell("cat /data/local/tmp/f", read_timeout_s=5) == "abc" * 1000
    finally:
        dev.close()
    assert device.stats.host_versions[-1] == 0x01000000 and device.stats.delayed_ack_streams == 0


def test_double_closes_an_open_whose_window_contradicts_the_features(device, home):
    """adbd: OPEN arg1 must be non-zero exactly when delayed ack is on; otherwise CLSE(0, id)."""
    t = _connect(device)
    try:
        dev = t.device
        io = dev._io_manager
        assert io.delayed_ack
        io.delayed_ack = False  # make our client send OPEN with arg1 = 0 on a delayed-ack link
        with pytest.raises(Exception) as err:
            dev._open(b"shell:echo x", 2, 2, None)
        assert "refused" in str(err.value)
    finally:
        t.close()


def test_banner_features_parse_like_adbd():
    assert adb_direct.banner_features(b"device::ro.product.name=x;features=cmd,delayed_ack") == {"cmd", "delayed_ack"}
    assert adb_direct.banner_features(b"device::features=shell_v2\0") == {"shell_v2"}
    assert adb_direct.banner_features(b"device::ro.x=1") == frozenset()
    assert adb_direct.banner_features(b"\xff\xfe") == frozenset()


# ---------------------------------------------------------------- recording real sessions


class _Recorder:
    """A TCP proxy in front of the emulated adbd that keeps what the device sent."""

    def __init__(self, device_port: int):
        self.device_port = device_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]

    def record(self, session) -> bytes:
        received = bytearray()
        done = threading.Event()

        def serve():
            host, _ = self.listener.accept()
            dev = socket.create_connection(("127.0.0.1", self.device_port))

            def pump(src, dst, keep):
                try:
                    while True:
                        chunk = src.recv(65536)
                        if not chunk:
                            break
                        if keep is not None:
                            keep += chunk
                        dst.sendall(chunk)
                except OSError:
                    pass
                finally:
                    for s in (src, dst):
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass

            a = threading.Thread(target=pump, args=(host, dev, None))
            b = threading.Thread(target=pump, args=(dev, host, received))
            a.start()
            b.start()
            a.join(20)
            b.join(20)
            host.close()
            dev.close()
            done.set()

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        t = AdbShellTransport(host="127.0.0.1", port=self.port, connect_timeout_s=5, auth_timeout_s=5)
        try:
            t.connect()
            expected = session(t)
        finally:
            t.close()
        assert done.wait(20)
        return bytes(received), expected


PULL_SIZE = 70_000  # two sync DATA messages and a bit


def _sessions(tmp: Path) -> dict:
    src = tmp / "push.bin"
    src.write_bytes(bytes(range(256)) * 12)

    def pull(t):
        out = tmp / "pulled.bin"
        t.pull("/data/local/tmp/pull.bin", out, 5)
        return out.read_bytes()

    return {
        "connect": lambda t: None,
        "shell": lambda t: tr.shell(t, "echo hello; echo wörld >&2; exit 3", 5),
        "push": lambda t: t.push(src, "/data/local/tmp/push.bin", 5),
        "pull": pull,
        "stat": lambda t: t.stat("/data/local/tmp/pull.bin", 5),
        "list": lambda t: sorted(t.listdir("/data/local/tmp", 5)),
    }


def _failing_sessions(tmp: Path) -> dict:
    src = tmp / "push.bin"
    return {
        "pull-missing": lambda t: t.pull("/data/local/tmp/nope.bin", tmp / "x.bin", 5),
        "push-nospace": lambda t: t.push(src, "/data/local/tmp/full.bin", 5),
    }


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory):
    """{(kind, delayed_ack): (device bytes, expected result or TransportError kind)}."""
    tmp = tmp_path_factory.mktemp("adbrec")
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(tmp / "home")
    mp = pytest.MonkeyPatch()
    mp.setattr(tr.secrets, "token_hex", lambda n=4: FIXED_NONCE)
    out = {}
    try:
        for delayed in (True, False):
            for auth in (True, False):
                d = FakeAdbd(tmp / f"dev-{delayed}-{auth}", require_auth=auth, delayed_ack=delayed, arm64=False)
                d.start()
                (d.root / "data/local/tmp/pull.bin").write_bytes(os.urandom(PULL_SIZE))
                rec = _Recorder(d.port)
                try:
                    if auth:  # the handshake with AUTH; operations are recorded without it (signing is slow)
                        out[("connect", delayed)] = rec.record(lambda t: None)
                        continue
                    for kind, fn in _sessions(tmp).items():
                        if kind != "connect":
                            out[(kind, delayed)] = rec.record(fn)
                    d.faults = {"free_bytes": 100}
                    for kind, fn in _failing_sessions(tmp).items():
                        def expect_error(t, fn=fn):
                            with pytest.raises(tr.TransportError) as err:
                                fn(t)
                            return err.value.kind
                        out[(kind, delayed)] = rec.record(expect_error)
                finally:
                    rec.listener.close()
                    d.stop()
    finally:
        mp.undo()
        if old_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old_home
    return out


# ---------------------------------------------------------------- replaying mutated streams


class _Replay:
    """Serve a byte stream as 'the device' through a socket pair; the client code is the real one."""

    def __init__(self, monkeypatch, tmp: Path):
        self.tmp = tmp
        self.current: socket.socket | None = None
        from adb_shell.transport import tcp_transport

        monkeypatch.setattr(tcp_transport.socket, "create_connection", self._create_connection)
        monkeypatch.setattr(tr.secrets, "token_hex", lambda n=4: FIXED_NONCE)

    def _create_connection(self, address, timeout=None, *a, **kw):
        assert self.current is not None, "unexpected second connection"
        sock, self.current = self.current, None
        return sock

    def run(self, kind: str, data: bytes, timeout_s: float = 2.0, stall: bool = False):
        host_end, dev_end = socket.socketpair()
        for s in (host_end, dev_end):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        dev_end.sendall(data)
        if not stall:
            dev_end.shutdown(socket.SHUT_WR)  # the device hangs up after its last byte
        self.current = host_end
        t = AdbShellTransport(host="fuzz.invalid", port=5555, connect_timeout_s=timeout_s, auth_timeout_s=timeout_s)
        t0 = time.monotonic()
        try:
            t.connect()
            result = self._op(kind, t, timeout_s)
            return "ok", result, time.monotonic() - t0
        except tr.TransportError as exc:
            assert isinstance(exc, TargetError) and exc.kind and str(exc)
            return "error", exc, time.monotonic() - t0
        finally:
            t.close()
            dev_end.close()
            host_end.close()
            self.current = None

    def _op(self, kind: str, t: AdbShellTransport, timeout_s: float):
        src = self.tmp / "push.bin"
        if not src.exists():
            src.write_bytes(bytes(range(256)) * 12)
        if kind == "connect":
            return None
        if kind == "shell":
            return tr.shell(t, "echo hello; echo wörld >&2; exit 3", timeout_s)
        if kind in ("push", "push-nospace"):
            return t.push(src, "/data/local/tmp/push.bin" if kind == "push" else "/data/local/tmp/full.bin", timeout_s)
        if kind in ("pull", "pull-missing"):
            out = self.tmp / "pulled.bin"
            out.unlink(missing_ok=True)
            t.pull("/data/local/tmp/pull.bin" if kind == "pull" else "/data/local/tmp/nope.bin", out, timeout_s)
            assert not (self.tmp / ".pulled.bin.partial").exists()
            return out.read_bytes()
        if kind == "stat":
            return t.stat("/data/local/tmp/pull.bin", timeout_s)
        if kind == "list":
            return sorted(t.listdir("/data/local/tmp", timeout_s))
        raise AssertionError(kind)


def _packets(data: bytes) -> list[tuple[bytearray, bytearray]]:
    out, i = [], 0
    while i + 24 <= len(data):
        length = struct.unpack_from("<I", data, i + 12)[0]
        out.append((bytearray(data[i : i + 24]), bytearray(data[i + 24 : i + 24 + length])))
        i += 24 + length
    assert i == len(data), "the recording is not a clean packet stream"
    return out


def _join(packets) -> bytes:
    return b"".join(bytes(h) + bytes(p) for h, p in packets)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    packets = _packets(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(12)
        if not packets:
            break
        k = rng.randrange(len(packets))
        header, payload = packets[k]
        if op == 0:  # a command swapped for another (valid or not)
            cmd = rng.choice(CMDS + [rng.getrandbits(32)])
            struct.pack_into("<I", header, 0, cmd)
            if rng.random() < 0.7:
                struct.pack_into("<I", header, 20, cmd ^ 0xFFFFFFFF)
        elif op == 1:  # stream ids
            struct.pack_into("<I", header, rng.choice((4, 8)), rng.choice((0, 1, 2, 3, 0xFFFFFFFF, rng.getrandbits(32))))
        elif op == 2:  # length field lies (payload unchanged)
            old = struct.unpack_from("<I", header, 12)[0]
            lie = rng.choice((0, max(0, old - 1), old + 1, old * 2, 0xFFFFFFFF, 1 << 20, (1 << 20) + 1,
                              rng.getrandbits(32)))
            struct.pack_into("<I", header, 12, lie & 0xFFFFFFFF)  # a field already mutated to 2^32-1 wraps
        elif op == 3:  # magic
            struct.pack_into("<I", header, 20, rng.getrandbits(32))
        elif op == 4:  # drop a packet
            del packets[k]
        elif op == 5:  # duplicate a packet
            packets.insert(k, (bytearray(header), bytearray(payload)))
        elif op == 6 and len(packets) > 1:  # swap two packets
            j = rng.randrange(len(packets))
            packets[k], packets[j] = packets[j], packets[k]
        elif op == 7 and payload:  # sync message header inside a payload (ident / size)
            spots = [m.start() for m in re.finditer(rb"DATA|DONE|OKAY|FAIL|DENT|STAT", bytes(payload))]
            i = rng.choice(spots) if spots else rng.randrange(len(payload))
            if rng.random() < 0.5 and i + 8 <= len(payload):
                struct.pack_into("<I", payload, i + 4, rng.choice((0, 1, 65535, 65536, 65537, 0xFFFFFFFF,
                                                                  rng.getrandbits(32))))
            else:
                payload[i : i + 4] = rng.choice((b"DATA", b"DONE", b"OKAY", b"FAIL", b"QUIT", b"\0\0\0\0",
                                                 os.urandom(4)))
        elif op == 8 and payload:  # payload bytes (the header's length stays true)
            for _ in range(rng.randint(1, 8)):
                payload[rng.randrange(len(payload))] = rng.randrange(256)
        elif op == 9:  # a garbage packet (valid header, random body) or raw garbage
            body = os.urandom(rng.randrange(0, 64))
            if rng.random() < 0.5:
                cmd = rng.choice(CMDS)
                packets.insert(k, (bytearray(struct.pack("<6I", cmd, rng.getrandbits(32), rng.choice((0, 1, 2)),
                                                           len(body), 0, cmd ^ 0xFFFFFFFF)), bytearray(body)))
            else:
                packets.insert(k, (bytearray(body[:24].ljust(24, b"\0")), bytearray()))
        elif op == 10:  # OKAY / WRTE payload sizes (delayed-ack acks are 4 bytes)
            cmd = struct.unpack_from("<I", header, 0)[0]
            if cmd in (CMDS[3], CMDS[5]):
                payload[:] = os.urandom(rng.choice((0, 1, 3, 5, 8)))
                struct.pack_into("<I", header, 12, len(payload))
        else:  # bit flips anywhere
            raw = bytearray(_join(packets))
            for _ in range(rng.randint(1, 4)):
                if raw:
                    i = rng.randrange(len(raw))
                    raw[i] ^= 1 << rng.randrange(8)
            return bytes(raw)
    raw = _join(packets)
    if rng.random() < 0.25 and raw:  # and sometimes cut short too
        raw = raw[: rng.randrange(len(raw))]
    return raw


OK_KINDS = ("connect", "shell", "push", "pull", "stat", "list")
FAIL_KINDS = ("pull-missing", "push-nospace")


def test_replayed_recordings_reproduce_the_real_sessions(transcripts, monkeypatch, tmp_path, home):
    """The harness is honest: every unmutated recording replays to the result the real session had."""
    replay = _Replay(monkeypatch, tmp_path)
    for (kind, delayed), (data, expected) in transcripts.items():
        outcome, result, _ = replay.run(kind, data)
        if kind in FAIL_KINDS:
            assert outcome == "error" and result.kind == expected, (kind, delayed, result)
        else:
            assert outcome == "ok", (kind, delayed, result)
            assert result == expected, (kind, delayed)
    assert transcripts[("shell", True)][1].exit_status == 3
    assert len(transcripts[("pull", True)][1]) == PULL_SIZE


@pytest.mark.parametrize("seed", [0, 1])
def test_mutated_device_streams_end_in_a_result_or_a_transport_error(seed, transcripts, monkeypatch, tmp_path, home):
    rng = random.Random(seed)
    replay = _Replay(monkeypatch, tmp_path)
    keys = sorted(transcripts, key=str)
    counts = {"ok": 0, "error": 0}
    slowest = 0.0
    t_start = time.monotonic()
    for i in range(N):
        kind, delayed = key = keys[i % len(keys)]
        data, expected = transcripts[key]
        mutated = _mutate(rng, data)
        try:
            outcome, result, took = replay.run(kind, mutated, timeout_s=2.0)
        except Exception as exc:  # anything but TransportError is a bug
            raise AssertionError(f"seed {seed} input {i} ({kind}, delayed_ack={delayed}): "
                                 f"{type(exc).__name__}: {exc}") from exc
        counts[outcome] += 1
        slowest = max(slowest, took)
        assert took < 4.0, f"input {i} ({kind}) took {took:.1f} s"
        if outcome == "ok":
            if kind in FAIL_KINDS:
                raise AssertionError(f"input {i}: a failed {kind} turned into success")
            if kind == "pull":
                assert len(result) == PULL_SIZE, f"input {i}: pull 'succeeded' with {len(result)} bytes"
            if kind == "shell":
                assert isinstance(result, tr.ShellResult) and isinstance(result.exit_status, int)
            if kind == "stat":
                assert result is None or isinstance(result, tr.RemoteStat)
            if kind == "list":
                assert all(isinstance(n, str) for n in result)
    assert counts["error"] > N // 2 and counts["ok"] > 0, counts  # both outcomes are reached
    assert time.monotonic() - t_start < 120


@pytest.mark.parametrize("seed", [2])
def test_a_stream_cut_short_never_passes_with_partial_data(seed, transcripts, monkeypatch, tmp_path, home):
    """Truncation only: the result is exactly the real one, or an error; never a short file,
    a lost exit status or half a listing."""
    rng = random.Random(seed)
    replay = _Replay(monkeypatch, tmp_path)
    keys = [k for k in sorted(transcripts, key=str) if k[0] in OK_KINDS and k[0] != "connect"]
    ok = 0
    for i in range(N):
        kind, delayed = key = keys[i % len(keys)]
        data, expected = transcripts[key]
        cut = data[: rng.randrange(len(data))]
        outcome, result, _ = replay.run(kind, cut, timeout_s=2.0)
        if outcome == "ok":
            ok += 1
            assert result == expected, f"input {i}: {kind} cut at {len(cut)}/{len(data)} gave a different result"
        else:
            assert result.kind in (tr.TRANSPORT, tr.OFFLINE, tr.TIMEOUT, "missing-file", "device-command"), result.kind
    # a cut inside the closing CLSE exchange may still deliver the whole result; most cuts cannot
    assert ok < N // 4


def test_garbage_instead_of_a_device_is_an_error(monkeypatch, tmp_path, home):
    rng = random.Random(5)
    replay = _Replay(monkeypatch, tmp_path)
    for i in range(N):
        garbage = os.urandom(rng.randrange(0, 200))
        if rng.random() < 0.5:  # a believable header in front
            cmd = rng.choice(CMDS)
            garbage = struct.pack("<6I", cmd, rng.getrandbits(32), rng.getrandbits(32), rng.randrange(0, 300),
                                  0, cmd ^ 0xFFFFFFFF) + garbage
        outcome, result, took = replay.run(rng.choice(OK_KINDS[1:]), garbage, timeout_s=1.0)
        assert outcome == "error", f"input {i}: garbage gave a result"
        assert took < 3.0


def test_stalled_and_chattering_devices_are_bounded(transcripts, monkeypatch, tmp_path, home):
    """No read waits forever: a device that goes silent mid-stream (socket left open) ends in
    TIMEOUT within the operation's timeout."""
    rng = random.Random(11)
    replay = _Replay(monkeypatch, tmp_path)
    keys = sorted(transcripts, key=str)
    for i in range(12):
        kind, delayed = key = keys[i % len(keys)]
        data, _ = transcripts[key]
        cut = data[: rng.randrange(len(data))]
        outcome, result, took = replay.run(kind, cut, timeout_s=0.25, stall=True)
        assert outcome == "error" and took < 2.5, (i, kind, outcome, took)


def test_device_that_never_stops_talking_is_cut_by_the_deadline(monkeypatch, tmp_path, home, transcripts):
    """A device streaming packets forever (here: shell output, one WRTE every 20 ms, and packets
    for streams that do not exist) cannot hold an operation past its timeout."""
    data, _ = transcripts[("shell", False)]
    packets = _packets(data)
    head = _join(packets[:2])  # CNXN, OKAY to OPEN
    local, remote = struct.unpack_from("<II", packets[1][0], 4)
    replay = _Replay(monkeypatch, tmp_path)
    host_end, dev_end = socket.socketpair()
    dev_end.sendall(head)
    stop = threading.Event()

    def chatter():
        n = 0
        while not stop.is_set():
            n += 1
            body = b"x" * 10
            ids = (local, remote) if n % 2 else (77, 99)
            pkt = struct.pack("<6I", CMDS[5], ids[0], ids[1], len(body), 0, CMDS[5] ^ 0xFFFFFFFF) + body
            try:
                dev_end.sendall(pkt)
                while True:  # read the client's acknowledgements so its writes never block
                    dev_end.setblocking(False)
                    if not dev_end.recv(65536):
                        break
            except BlockingIOError:
                pass
            except OSError:
                return
            finally:
                dev_end.setblocking(True)
            time.sleep(0.02)

    th = threading.Thread(target=chatter, daemon=True)
    th.start()
    replay.current = host_end
    t = AdbShellTransport(host="fuzz.invalid", port=5555, connect_timeout_s=1, auth_timeout_s=1)
    try:
        t.connect()
        t0 = time.monotonic()
        with pytest.raises(tr.TransportError) as err:
            tr.shell(t, "echo hello; echo wörld >&2; exit 3", 1.0)
        assert err.value.kind == tr.TIMEOUT and time.monotonic() - t0 < 3.0
    finally:
        stop.set()
        th.join(5)
        t.close()
        dev_end.close()


# ---------------------------------------------------------------- shell output and the adb CLI


def _text_mutate(rng: random.Random, text: str) -> str:
    b = bytearray(text.encode("utf-8", "surrogatepass"))
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            del b[rng.randrange(len(b)):]
        elif op == 2:
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.choice([b"\r", b"\n", b"\0", b"\r\n", tr.MARKER.encode(), b"\xff\xfe", b"99999999999999999999",
                                 os.urandom(6)])
        elif op == 3 and b:
            i = rng.randrange(len(b))
            del b[i : i + rng.randint(1, 12)]
        else:
            b += rng.choice([b"\n", b"x" * 1000, b"\r\n", ("\n" + tr.MARKER + "0:" + "f" * 8).encode()])
    return b.decode("utf-8", "replace")


def test_exit_status_marker_is_never_forged_or_lost(monkeypatch):
    rng = random.Random(3)
    ok = 0
    for i in range(2 * N):
        nonce = f"{rng.getrandbits(32):08x}"
        status = rng.choice([0, 1, 2, 127, 134, 255])
        body = rng.choice(["", "hello\n", "a\r\nb\r\n", "no newline", "x" * 5000 + "\n",
                           f"{tr.MARKER}0:deadbeef\n"])  # the command printing a marker with another nonce
        end = rng.choice(["\n", "\r\n", ""])
        text = f"{body}{tr.MARKER}{status}:{nonce}{end}"
        # intact: the status comes back exactly
        got = tr.parse_marker(text, nonce)
        assert got.exit_status == status and got.output.rstrip("\r\n") == body.rstrip("\r\n")
        mutated = _text_mutate(rng, text)
        try:
            res = tr.parse_marker(mutated, nonce)
        except tr.TransportError as exc:
            assert exc.kind == tr.TRANSPORT and exc.output == mutated
            continue
        ok += 1
        # success only with this nonce's marker ending the output
        assert re.search(re.escape(tr.MARKER) + r"\d+:" + nonce + r"\r?\n?\Z", mutated)
        assert res.exit_status == int(re.findall(re.escape(tr.MARKER) + r"(\d+):" + nonce, mutated)[-1])
    assert ok > 0


def test_adb_devices_output_parses_or_is_skipped():
    rng = random.Random(4)
    real = ("List of devices attached\n"
            "emulator-5554          device product:sdk_gphone64 model:sdk_gphone64_x86_64 device:emu64xa transport_id:1\n"
            "127.0.0.1:5555         offline transport_id:2\n"
            "R58N12ABCDE            unauthorized usb:1-1 transport_id:3\n"
            "* daemon started successfully\n")
    assert [e.state for e in adb_cli.parse_devices(real)] == ["device", "offline", "unauthorized"]
    for _ in range(N):
        entries = adb_cli.parse_devices(_text_mutate(rng, real))
        for e in entries:
            assert isinstance(e.serial, str) and e.serial and isinstance(e.state, str) and isinstance(e.info, dict)


def test_adb_cli_transport_turns_any_output_into_a_result_or_an_error(monkeypatch, tmp_path):
    """What the adb binary prints (stdout/stderr/exit status) mutated: the CLI transport's shell,
    stat, listdir, push, pull and devices end in a result or a TransportError."""
    rng = random.Random(6)
    outputs = {
        "shell": lambda nonce: (f"hello\n{tr.MARKER}0:{nonce}\n", ""),
        "stat": lambda nonce: (f"81a4 1234\n{tr.MARKER}0:{nonce}\n", ""),
        "listdir": lambda nonce: (f".\n..\na.bin\nb c.bin\n{tr.MARKER}0:{nonce}\n", ""),
        "push": lambda nonce: ("/tmp/x: 1 file pushed, 0 skipped. 12.3 MB/s (4 bytes in 0.001s)\n", ""),
        "pull": lambda nonce: ("/data/x: 1 file pulled, 0 skipped.\n", "adb: error: failed to stat remote object"),
        "devices": lambda nonce: ("List of devices attached\nemulator-5554 device product:x\n", ""),
    }
    state = {}

    def fake_run(argv, timeout_s, env=None):
        m = re.search(r"echo " + re.escape(tr.MARKER) + r"\$\?:([0-9a-f]+)", argv[-1])
        out, err = outputs[state["op"]](m.group(1) if m else "")
        if rng.random() < 0.8:
            out = _text_mutate(rng, out)
        if rng.random() < 0.3:
            err = _text_mutate(rng, err or "adb: error: device offline")
        rc = rng.choice([0, 0, 0, 1, 255])
        if state["op"] == "pull" and rc == 0:
            Path(argv[-1]).write_bytes(b"data")
        return subprocess.CompletedProcess(argv, rc, out.encode("utf-8", "surrogateescape"),
                                           err.encode("utf-8", "surrogateescape"))

    monkeypatch.setattr(adb_cli, "_run", fake_run)
    monkeypatch.setattr(adb_cli.shutil, "which", lambda name: "/usr/bin/adb")
    t = adb_cli.AdbCliTransport("emulator-5554", adb_path="/usr/bin/adb")
    ops = {
        "shell": lambda: tr.shell(t, "echo hello", 5),
        "stat": lambda: t.stat("/data/local/tmp/x", 5),
        "listdir": lambda: t.listdir("/data/local/tmp", 5),
        "push": lambda: t.push(tmp_path / "x", "/data/local/tmp/x", 5),
        "pull": lambda: t.pull("/data/local/tmp/x", tmp_path / "y", 5),
        "devices": lambda: t.devices(5),
    }
    results = {"ok": 0, "error": 0}
    for i in range(N):
        state["op"] = op = rng.choice(sorted(ops))
        try:
            got = ops[op]()
        except tr.TransportError as exc:
            assert exc.kind and str(exc)
            results["error"] += 1
            continue
        except Exception as exc:
            raise AssertionError(f"input {i} ({op}): {type(exc).__name__}: {exc}") from exc
        results["ok"] += 1
        if op == "stat":
            assert got is None or (isinstance(got, tr.RemoteStat) and got.size >= 0 and got.mode >= 0)
        if op == "listdir":
            assert all(isinstance(n, str) and n not in (".", "..") for n in got)
    assert results["ok"] and results["error"]
