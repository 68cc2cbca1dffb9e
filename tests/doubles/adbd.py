"""An emulated Android device: adbd's wire protocol over TCP on 127.0.0.1.

Speaks the real ADB transport protocol (24-byte little-endian headers,
CNXN/AUTH/OPEN/OKAY/WRTE/CLSE), including RSA authentication: the device sends
a 20-byte AUTH token, verifies AUTH_SIGNATURE (PKCS#1 v1.5 over the token as a
SHA-1 digest) against its authorized public keys, and accepts a new key sent
with AUTH_RSAPUBLICKEY when `accept_new_keys` is on (the user tapping "Allow").
Services: `shell:CMD` (legacy shell v1: stdout+stderr merged, no exit status;
run by the real /bin/sh with device paths mapped into the sandbox folder) and
`sync:` (STAT, LIST, SEND, RECV, DONE, DATA, QUIT). Both adb-shell and the real
`adb` server (after `adb connect 127.0.0.1:PORT`) drive it.

An arm64 device runs arm64 programs: when anything in the device shell execs an
aarch64 ELF (a pushed, cross-built ExecuTorch `executor_runner`), it runs under
`qemu-aarch64`, the way binfmt_misc would do it. A tiny LD_PRELOAD library
(compiled once with the host cc, `aarch64_exec_preload()`) wraps execve(): same
pid (so `.runner.pid` + `kill -9` reach it), same cwd, environment (the device's
LD_LIBRARY_PATH goes to the guest with qemu's -E), stdin/stdout/stderr and exit
status (a guest SIGABRT/SIGSEGV kills qemu with the same signal: 134/139).
Scripts (the Python runner double) are exec'd unchanged.

Transport contract (what a recent real adbd does, packages/modules/adb adb.cpp/sockets.cpp):
the device answers CNXN with arg0 = A_VERSION (0x01000001) and arg1 = min(host maxdata, MAX_PAYLOAD
= 1 MiB); each side uses min(its version, the peer's), and from 0x01000001 on no data checksum is
computed (data_check = 0) or verified. The banner is `device::<props>;features=<list>` with no NUL.
`delayed_ack` (on by default, `delayed_ack=False` emulates an older adbd) is used when the host's
CNXN banner (`host::features=...`) lists it: then OPEN carries the host's initial send window in
arg1 (a non-zero arg1 without the feature, or zero with it, is answered CLSE), every OKAY carries an
int32 payload (bytes acknowledged; the device grants INITIAL_DELAYED_ACK_BYTES = 32 MiB in the
OKAY answering OPEN and acknowledges host data as the service consumes it), and the device keeps
sending WRTE while its window is positive. Without the feature: one WRTE in flight per stream,
OKAY without payload. Not emulated: shell_v2, stat_v2/ls_v2, sendrecv_v2 (not advertised).

Faults (dict given to the constructor or set on `.faults` later):
  offline          read CNXN, never answer (the adb server lists it "offline")
  free_bytes       total bytes the device accepts before "No space left on device"
  cut_push_after   drop the connection after N bytes of one SEND (count: cut_push_times)
  cut_pull_after   drop the connection after N bytes of one RECV (count: cut_pull_times)
  runner           a dict the runner stand-ins read (segv, hang, missing_lib, short_output)
  corrupt_push     {"name": N, "offset": O}: flip a byte of every pushed file whose
                   device name ends with N (after the push completes; size unchanged)
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import re
import shutil
import socket
import stat as stat_mod
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bundlerun.bundles.cache_dirs import cache_dir
from bundlerun.targets.process import kill_process_group

A_CNXN, A_AUTH, A_OPEN, A_OKAY, A_CLSE, A_WRTE = (
    struct.unpack("<I", c)[0] for c in (b"CNXN", b"AUTH", b"OPEN", b"OKAY", b"CLSE", b"WRTE")
)
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3
VERSION_MIN, VERSION_SKIP_CHECKSUM = 0x01000000, 0x01000001
A_VERSION = VERSION_SKIP_CHECKSUM
MAX_PAYLOAD = 1024 * 1024
INITIAL_DELAYED_ACK_BYTES = 32 * 1024 * 1024
FEATURE_DELAYED_ACK = "delayed_ack"
SYNC_DATA_MAX = 64 * 1024
SHA1_DIGEST_INFO = bytes.fromhex("3021300906052b0e03021a05000414")
DEVICE_ROOTS = ("data", "sdcard", "system", "vendor")
FAULT_FILE = ".bundlerun_faults.json"

AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"
EM_AARCH64 = 183

_EXEC_PRELOAD_C = r"""
/* bundlerun emulated adbd: run aarch64 ELF programs under qemu-aarch64 (userspace binfmt). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*execve_fn)(const char *, char *const[], char *const[]);

static int is_aarch64_elf(const char *path) {
  unsigned char h[20];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, h, sizeof h);
  close(fd);
  return n == (ssize_t)sizeof h && h[0] == 0x7f && h[1] == 'E' && h[2] == 'L' && h[3] == 'F' &&
         h[4] == 2 && h[5] == 1 && (h[18] | (h[19] << 8)) == 183;
}

static const char *env_value(char *const envp[], const char *name) {
  size_t len = strlen(name);
  for (size_t i = 0; envp && envp[i]; i++)
    if (strncmp(envp[i], name, len) == 0 && envp[i][len] == '=') return envp[i] + len + 1;
  return NULL;
}

int execve(const char *path, char *const argv[], char *const envp[]) {
  execve_fn real = (execve_fn)dlsym(RTLD_NEXT, "execve");
  if (!is_aarch64_elf(path)) return real(path, argv, envp);
  const char *qemu = env_value(envp, "BUNDLERUN_QEMU_AARCH64");
  const char *prefix = env_value(envp, "BUNDLERUN_QEMU_LD_PREFIX");
  const char *ldpath = env_value(envp, "LD_LIBRARY_PATH");
  if (!qemu || !*qemu) {
    errno = ENOEXEC;
    return -1;
  }
  size_t argc = 0, envc = 0;
  while (argv && argv[argc]) argc++;
  while (envp && envp[envc]) envc++;
  char **nargv = calloc(argc + 10, sizeof(char *));
  char **nenvp = calloc(envc + 1, sizeof(char *));
  char *ldarg = NULL;
  if (!nargv || !nenvp) { errno = ENOMEM; return -1; }
  size_t k = 0;
  nargv[k++] = (char *)qemu;
  if (prefix && *prefix) { nargv[k++] = "-L"; nargv[k++] = (char *)prefix; }
  if (ldpath) {
    ldarg = malloc(strlen(ldpath) + 17);
    if (!ldarg) { errno = ENOMEM; return -1; }
    sprintf(ldarg, "LD_LIBRARY_PATH=%s", ldpath);
    nargv[k++] = "-E"; nargv[k++] = ldarg;
  }
  nargv[k++] = "-0"; nargv[k++] = (char *)(argc ? argv[0] : path);
  nargv[k++] = (char *)path;
  for (size_t i = 1; i < argc; i++) nargv[k++] = argv[i];
  nargv[k] = NULL;
  /* The host qemu process gets neither the preload nor the device's library path. */
  size_t m = 0;
  for (size_t i = 0; i < envc; i++) {
    if (strncmp(envp[i], "LD_PRELOAD=", 11) == 0 || strncmp(envp[i], "LD_LIBRARY_PATH=", 16) == 0) continue;
    nenvp[m++] = envp[i];
  }
  nenvp[m] = NULL;
  int rc = real(qemu, nargv, nenvp);
  int saved = errno;
  free(nargv); free(nenvp); free(ldarg);
  errno = saved;
  return rc;
}
"""


def aarch64_exec_preload() -> Path:
    """Compile (once, content-addressed) the execve wrapper that sends aarch64 ELFs to qemu-aarch64.
    Raises RuntimeError naming what is missing (cc, qemu-aarch64)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no host C compiler (cc/gcc) to build the emulated device's exec wrapper: apt-get install gcc")
    if shutil.which("qemu-aarch64") is None:
        raise RuntimeError("qemu-aarch64 is not installed (Debian package qemu-user): the emulated device cannot run arm64 programs")
    digest = hashlib.sha256(_EXEC_PRELOAD_C.encode()).hexdigest()[:16]
    out = cache_dir("doubles") / f"aarch64_exec-{digest}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(f".{os.getpid()}.c")
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    src.write_text(_EXEC_PRELOAD_C)
    try:
        res = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src), "-ldl"],
                             capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"building the exec wrapper failed: {res.stderr.strip()[:500]}")
        os.replace(tmp, out)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return out



class _Disconnect(Exception):
    pass


def decode_android_pubkey(blob: bytes) -> tuple[int, int]:
    """adbkey.pub payload (base64 of Android's RSAPublicKey struct) -> (n, e)."""
    text = blob.split(b"\0")[0].strip().split(b" ")[0]
    raw = base64.b64decode(text)
    words, _n0inv, modulus, _rr, exponent = struct.unpack("<II256s256sI", raw[:524])
    if words != 64:
        raise ValueError("only 2048-bit adb keys are supported")
    return int.from_bytes(modulus, "little"), exponent


def verify_signature(key: tuple[int, int], token: bytes, signature: bytes) -> bool:
    """RSA PKCS#1 v1.5 verification with the token taken as a SHA-1 digest (adbd's rule)."""
    n, e = key
    k = (n.bit_length() + 7) // 8
    if len(signature) != k:
        return False
    m = pow(int.from_bytes(signature, "big"), e, n).to_bytes(k, "big")
    payload = SHA1_DIGEST_INFO + token
    expected = b"\x00\x01" + b"\xff" * (k - 3 - len(payload)) + b"\x00" + payload
    return m == expected


def parse_features(banner: bytes) -> set[str]:
    """The `features=` list of a CNXN banner (`<type>:<serial>:<prop>=<v>;...`), as adbd parses it:
    nothing is stripped, so a trailing NUL stays part of the last feature."""
    text = banner.decode("utf-8", "replace")
    props = text.split(":", 2)[2] if text.count(":") >= 2 else ""
    for prop in props.split(";"):
        key, _, value = prop.partition("=")
        if key == "features":
            return set(value.split(","))
    return set()


def _checksum(data: bytes) -> int:
    return sum(data) & 0xFFFFFFFF


@dataclass
class DeviceStats:
    """What the device saw: lets tests assert on deployment behaviour."""

    connections: int = 0
    auth_prompts: int = 0  # new keys accepted by "the user"
    signatures_ok: int = 0
    pushes: list[str] = field(default_factory=list)
    pulls: list[str] = field(default_factory=list)
    shell_commands: list[str] = field(default_factory=list)
    host_versions: list[int] = field(default_factory=list)  # CNXN arg0 of each host
    delayed_ack_streams: int = 0  # streams opened with delayed ack
    largest_host_write: int = 0  # biggest WRTE payload received from a host
    live_processes: dict[int, subprocess.Popen] = field(default_factory=dict)


class _Stream:
    def __init__(self, conn: "_Connection", local_id: int, remote_id: int):
        self.conn, self.local_id, self.remote_id = conn, local_id, remote_id
        self.incoming: "queue.Queue[bytes | None]" = queue.Queue()
        self.buffer = bytearray()
        self.okay = threading.Event()
        self.window = threading.Condition()
        self.available_send_bytes: int | None = None  # delayed ack: what the host lets us send
        self.closed = threading.Event()
        self.closed_sent = False
        self.on_host_close: list = []

    # -- device -> host
    def write(self, data: bytes) -> None:
        view = memoryview(data)
        step = self.conn.max_payload
        for i in range(0, len(view), step):
            if self.closed.is_set():
                raise _Disconnect()
            part = view[i : i + step]
            if self.available_send_bytes is not None:  # delayed ack: send while the window is positive
                with self.window:
                    while self.available_send_bytes <= 0:
                        if self.closed.is_set() or self.conn.dead.is_set():
                            raise _Disconnect()
                        self.window.wait(0.2)
                    self.available_send_bytes -= len(part)
                self.conn.send(A_WRTE, self.local_id, self.remote_id, part)
                continue
            self.okay.clear()
            self.conn.send(A_WRTE, self.local_id, self.remote_id, part)
            while not self.okay.wait(0.2):
                if self.closed.is_set() or self.conn.dead.is_set():
                    raise _Disconnect()

    def ack(self, acked: int) -> None:
        with self.window:
            self.available_send_bytes += acked
            self.window.notify_all()

    def close(self) -> None:
        if not self.closed_sent:
            self.closed_sent = True
            try:
                self.conn.send(A_CLSE, self.local_id, self.remote_id)
            except OSError:
                pass
        self.closed.set()
        self.incoming.put(None)
        with self.window:
            self.window.notify_all()

    # -- host -> device
    def read_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.incoming.get()
            if chunk is None:
                raise _Disconnect()
            if self.conn.delayed_ack:  # acknowledged as the service consumes it
                self.conn.send(A_OKAY, self.local_id, self.remote_id, struct.pack("<i", len(chunk)))
            if self.buffer:
                self.buffer += chunk
            else:
                self.buffer = chunk  # a received packet is ours (bytearray): no copy
        out = self.buffer[:n]
        del self.buffer[:n]
        return out


class _Connection:
    def __init__(self, daemon: "FakeAdbd", sock: socket.socket):
        self.daemon, self.sock = daemon, sock
        self.lock = threading.Lock()
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1
        self.version = VERSION_MIN
        self.max_payload = 4096
        self.delayed_ack = False
        self.host_features: set[str] = set()
        self.dead = threading.Event()

    def send(self, cmd: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        check = _checksum(data) if self.version < VERSION_SKIP_CHECKSUM else 0
        header = struct.pack("<6I", cmd, arg0, arg1, len(data), check, cmd ^ 0xFFFFFFFF)
        with self.lock:
            if len(data) > 65536:
                self.sock.sendall(header)
                self.sock.sendall(data)
            else:
                self.sock.sendall(header + data)

    def _recv_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            count = self.sock.recv_into(view[got:])
            if not count:
                raise _Disconnect()
            got += count
        return buf

    def recv(self) -> tuple[int, int, int, bytes]:
        cmd, arg0, arg1, length, check, magic = struct.unpack("<6I", self._recv_exact(24))
        if magic != cmd ^ 0xFFFFFFFF:
            raise _Disconnect()
        if length > MAX_PAYLOAD:  # adbd drops a connection that sends an oversized packet
            raise _Disconnect()
        data = self._recv_exact(length) if length else b""
        if self.version < VERSION_SKIP_CHECKSUM and _checksum(data) != check:
            raise _Disconnect()
        return cmd, arg0, arg1, data

    def kill(self) -> None:
        self.dead.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    # -- handshake
    def handshake(self) -> bool:
        d = self.daemon
        cmd, version, maxdata, host_banner = self.recv()
        if cmd != A_CNXN:
            return False
        self.version = min(version, A_VERSION)
        self.max_payload = max(4096, min(maxdata, MAX_PAYLOAD))
        self.host_features = parse_features(host_banner)
        d.stats.host_versions.append(version)
        self.delayed_ack = d.delayed_ack and FEATURE_DELAYED_ACK in self.host_features
        if d.faults.get("offline"):
            while True:  # never answer: the host sees an offline device
                self.recv()
        if d.require_auth:
            token = os.urandom(20)
            self.send(A_AUTH, AUTH_TOKEN, 0, token)
            while True:
                cmd, kind, _, data = self.recv()
                if cmd != A_AUTH:
                    continue
                if kind == AUTH_SIGNATURE:
                    if any(verify_signature(k, token, data) for k in d.authorized_keys()):
                        d.stats.signatures_ok += 1
                        break
                    token = os.urandom(20)
                    self.send(A_AUTH, AUTH_TOKEN, 0, token)
                elif kind == AUTH_RSAPUBLICKEY:
                    if not d.accept_new_keys:
                        continue  # the prompt is never answered: "unauthorized"
                    d.add_authorized_key(data)
                    d.stats.auth_prompts += 1
                    break
        features = ["cmd"] + ([FEATURE_DELAYED_ACK] if d.delayed_ack else [])
        banner = (
            f"device::ro.product.name={d.product};ro.product.model={d.model};"
            f"ro.product.device={d.product};features={','.join(features)}"
        ).encode()
        self.send(A_CNXN, A_VERSION, self.max_payload, banner)
        return True

    def serve(self) -> None:
        try:
            if not self.handshake():
                return
            while True:
                cmd, arg0, arg1, data = self.recv()
                if cmd == A_OPEN:
                    if arg0 == 0:
                        continue
                    if self.delayed_ack != bool(arg1):  # adbd: "unexpected value of A_OPEN arg1"
                        self.send(A_CLSE, 0, arg0)
                        continue
                    local = self.next_id
                    self.next_id += 1
                    stream = _Stream(self, local, arg0)
                    self.streams[local] = stream
                    if self.delayed_ack:
                        self.daemon.stats.delayed_ack_streams += 1
                        stream.available_send_bytes = arg1
                        self.send(A_OKAY, local, arg0, struct.pack("<i", INITIAL_DELAYED_ACK_BYTES))
                    else:
                        self.send(A_OKAY, local, arg0)
                    service = data.rstrip(b"\0").decode("utf-8", "replace")
                    threading.Thread(target=self.daemon.run_service, args=(stream, service), daemon=True).start()
                elif cmd == A_WRTE:
                    stream = self.streams.get(arg1)
                    if len(data) > self.daemon.stats.largest_host_write:
                        self.daemon.stats.largest_host_write = len(data)
                    if stream is not None and not stream.closed.is_set():
                        stream.incoming.put(data)
                        if not self.delayed_ack:
                            self.send(A_OKAY, arg1, arg0)
                elif cmd == A_OKAY:
                    stream = self.streams.get(arg1)
                    if stream is None:
                        continue
                    if not self.delayed_ack:
                        stream.okay.set()
                    elif len(data) == 4:
                        stream.ack(struct.unpack("<i", data)[0])
                    elif not data:  # adbd: "delayed ack mismatch": the socket is closed
                        self.streams.pop(arg1, None)
                        for fn in stream.on_host_close:
                            fn()
                        stream.close()
                    # any other payload size: logged and ignored by adbd
                elif cmd == A_CLSE:
                    stream = self.streams.pop(arg1, None)
                    if stream is not None:
                        for fn in stream.on_host_close:
                            fn()
                        stream.close()
        except (_Disconnect, OSError, struct.error):
            pass
        finally:
            self.dead.set()
            for stream in list(self.streams.values()):
                for fn in stream.on_host_close:
                    fn()
                stream.closed.set()
                stream.incoming.put(None)
            try:
                self.sock.close()
            except OSError:
                pass


class FakeAdbd:
    """The emulated device. `root` is the sandbox folder mapped as the device's `/`."""

    def __init__(
        self,
        root: Path,
        *,
        require_auth: bool = True,
        accept_new_keys: bool = True,
        faults: dict | None = None,
        product: str = "bundlerun_emu",
        model: str = "Emulated_SoC_sm8650",
        soc: str = "SM8650",
        arm64: bool | None = None,
        delayed_ack: bool = True,
    ):
        """arm64: run pushed aarch64 ELFs under qemu-aarch64. None = when qemu-aarch64 and cc exist;
        True = required (RuntimeError naming the missing tool); False = never."""
        self.root = Path(root).resolve()
        self.exec_preload: Path | None = None
        if arm64 or arm64 is None:
            try:
                self.exec_preload = aarch64_exec_preload()
            except RuntimeError:
                if arm64:
                    raise
        self.product, self.model, self.soc = product, model, soc
        (self.root / "data" / "local" / "tmp").mkdir(parents=True, exist_ok=True)
        (self.root / "system" / "bin").mkdir(parents=True, exist_ok=True)
        self._install_logcat()
        self.require_auth = require_auth
        self.delayed_ack = delayed_ack
        self.accept_new_keys = accept_new_keys
        self.faults: dict = dict(faults or {})
        self.stats = DeviceStats()
        self._keys: list[tuple[int, int]] = []
        self._sock: socket.socket | None = None
        self._conns: list[_Connection] = []
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- faults shared with the runner stand-ins (they read this file)
    def set_faults(self, **faults) -> None:
        self.faults = dict(faults)
        (self.root / FAULT_FILE).write_text(json.dumps(faults.get("runner", {})))

    def _install_logcat(self) -> None:
        logcat = self.root / "system" / "bin" / "logcat"
        logcat.write_text(
            "#!/bin/sh\n# emulated logcat: -c clears, -d dumps the device log buffer\n"
            f'LOG="{self.root}/.logcat"\n'
            'case "$1" in -c) : > "$LOG";; *) cat "$LOG" 2>/dev/null;; esac\n'
        )
        logcat.chmod(0o755)
        getprop = self.root / "system" / "bin" / "getprop"
        getprop.write_text(
            "#!/bin/sh\n# emulated getprop: the properties bundlerun reads\n"
            'case "$1" in\n'
            f'  ro.product.model) echo "{self.model}";;\n'
            f'  ro.soc.model) echo "{self.soc}";;\n'
            '  ro.product.cpu.abi) echo arm64-v8a;;\n'
            '  ro.build.version.release) echo 14;;\n'
            '  *) echo;;\n'
            "esac\n"
        )
        getprop.chmod(0o755)

    def authorized_keys(self) -> list[tuple[int, int]]:
        return list(self._keys)

    def add_authorized_key(self, pub: bytes) -> None:
        self._keys.append(decode_android_pubkey(pub))

    # -- lifecycle
    def start(self) -> int:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        (self.root / FAULT_FILE).write_text(json.dumps(self.faults.get("runner", {})))
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()
        return self.port

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, sock)
            self._conns.append(conn)
            self.stats.connections += 1
            threading.Thread(target=conn.serve, daemon=True).start()

    def drop_connections(self) -> None:
        for conn in list(self._conns):
            conn.kill()
        self._conns.clear()

    def stop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            except OSError:
                pass
            self._sock.close()
            self._sock = None
            if self._thread is not None:
                self._thread.join(timeout=5)
        self.drop_connections()
        for proc in list(self.stats.live_processes.values()):
            kill_process_group(proc, 5.0, term_first=False)

    def __enter__(self) -> "FakeAdbd":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def live_processes(self) -> list[int]:
        return [pid for pid, p in self.stats.live_processes.items() if p.poll() is None]

    # -- path mapping
    def host_path(self, device_path: str) -> Path:
        if not device_path.startswith("/"):
            device_path = "/" + device_path
        parts = [p for p in device_path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise PermissionError("path escapes the sandbox")
        return self.root.joinpath(*parts)

    def map_command(self, command: str) -> str:
        """Map absolute device paths to the sandbox where a shell *word* begins with one
        (start of a word, or right after its opening quote), tracking quotes like sh
        does; text in the middle of a word, e.g. inside a quoted file name, is left alone."""
        root_re = re.compile(r"/(%s)(?=[/'\"\s;&|)]|$)" % "|".join(DEVICE_ROOTS))
        out, i, n = [], 0, len(command)
        state, at_start = None, True
        while i < n:
            c = command[i]
            if at_start and root_re.match(command, i):
                out.append(str(self.root))
            if state is None:
                if c in "'\"":
                    state = c
                    out.append(c)
                    i += 1
                    continue  # the word starts inside the quotes
                if c == "\\":
                    out.append(command[i : i + 2])
                    i += 2
                    at_start = False
                    continue
                at_start = c.isspace() or c in ";&|()<>=`"
            elif c == state:
                state, at_start = None, False
            else:
                at_start = False
                if state == '"' and c == "\\":
                    out.append(command[i : i + 2])
                    i += 2
                    continue
            out.append(c)
            i += 1
        return "".join(out)

    # -- services
    def run_service(self, stream: _Stream, service: str) -> None:
        try:
            if service.startswith("shell:") or service.startswith("shell,"):
                self._shell(stream, service.split(":", 1)[1])
            elif service == "sync:":
                self._sync(stream)
            else:
                pass  # unknown service: close, as adbd does
        except (_Disconnect, OSError):
            pass
        finally:
            stream.close()

    def _shell(self, stream: _Stream, command: str) -> None:
        self.stats.shell_commands.append(command)
        env = {
            "PATH": f"{self.root}/system/bin:/usr/bin:/bin",
            "HOME": str(self.root / "data" / "local" / "tmp"),
            "TMPDIR": str(self.root / "data" / "local" / "tmp"),
            "BUNDLERUN_FAKE_DEVICE_ROOT": str(self.root),
            "LANG": "C",
        }
        if self.exec_preload is not None:
            env.update(LD_PRELOAD=str(self.exec_preload), BUNDLERUN_QEMU_AARCH64=shutil.which("qemu-aarch64") or "",
                       BUNDLERUN_QEMU_LD_PREFIX=AARCH64_SYSROOT)
        proc = subprocess.Popen(
            ["/bin/sh", "-c", self.map_command(command)],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.stats.live_processes[proc.pid] = proc
        stream.on_host_close.append(lambda: kill_process_group(proc, 5.0, term_first=False))
        prefix = str(self.root).encode()
        try:
            while True:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                stream.write(chunk.replace(prefix, b""))
            proc.wait()
        finally:
            kill_process_group(proc, 5.0, term_first=False)
            proc.stdout.close()
            self.stats.live_processes.pop(proc.pid, None)

    def _sync(self, stream: _Stream) -> None:
        while True:
            ident = stream.read_exact(4)
            (length,) = struct.unpack("<I", stream.read_exact(4))
            if ident == b"QUIT":
                return
            data = stream.read_exact(length)
            path = data.decode("utf-8", "surrogateescape")
            if ident == b"STAT":
                stream.write(b"STAT" + self._stat(path))
            elif ident == b"LIST":
                self._list(stream, path)
            elif ident == b"SEND":
                self._recv_file(stream, path)
            elif ident == b"RECV":
                self._send_file(stream, path)
            else:
                stream.write(_fail(f"unknown sync command {ident!r}"))
                return

    def _stat(self, path: str) -> bytes:
        try:
            st = os.stat(self.host_path(path))
        except (OSError, PermissionError):
            return struct.pack("<III", 0, 0, 0)
        return struct.pack("<III", st.st_mode & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF, int(st.st_mtime))

    def _list(self, stream: _Stream, path: str) -> None:
        try:
            base = self.host_path(path)
            names = [".", ".."] + sorted(os.listdir(base))
        except (OSError, PermissionError):
            names, base = [], None
        for name in names:
            st = os.stat(base / name) if base is not None else None
            raw = name.encode("utf-8", "surrogateescape")
            stream.write(b"DENT" + struct.pack("<IIII", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime), len(raw)) + raw)
        stream.write(b"DONE" + struct.pack("<IIII", 0, 0, 0, 0))

    def _used_bytes(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root / "data"):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(dirpath, f))
                except OSError:
                    pass
        return total

    def _recv_file(self, stream: _Stream, spec: str) -> None:
        path, _, mode_text = spec.rpartition(",")
        mode = int(mode_text) if mode_text.isdigit() else 0o644
        self.stats.pushes.append(path)
        try:
            target = self.host_path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            fh = open(target, "wb")
        except OSError as exc:
            _drain_send(stream)
            stream.write(_fail(f"couldn't create file: {exc.strerror}"))
            return
        free = self.faults.get("free_bytes")
        if free is not None:
            free -= self._used_bytes()
        cut = self.faults.get("cut_push_after")
        received, error = 0, None
        with fh:
            while True:
                ident = stream.read_exact(4)
                (size,) = struct.unpack("<I", stream.read_exact(4))
                if ident == b"DONE":
                    break
                if ident != b"DATA":
                    stream.write(_fail("invalid data message"))
                    return
                chunk = stream.read_exact(size)
                received += size
                if cut is not None and received >= cut and self.faults.get("cut_push_times", 1) > 0:
                    self.faults["cut_push_times"] = self.faults.get("cut_push_times", 1) - 1
                    fh.write(chunk[: max(0, size - (received - cut))])
                    fh.flush()
                    stream.conn.kill()  # the cable is pulled mid-transfer
                    raise _Disconnect()
                if error is None and free is not None and received > free:
                    error = "write failed: No space left on device"
                if error is None:
                    fh.write(chunk)
        if error:
            os.unlink(target)
            stream.write(_fail(error))
            return
        os.chmod(target, stat_mod.S_IMODE(mode) or 0o644)
        corrupt = self.faults.get("corrupt_push")
        if corrupt and str(corrupt.get("name", "\0")) in path.rsplit("/", 1)[-1] and received:
            with open(target, "r+b") as fh:  # the flash / the cable flipped a byte: same size
                fh.seek(min(int(corrupt.get("offset", 0)), received - 1))
                byte = fh.read(1)
                fh.seek(-1, os.SEEK_CUR)
                fh.write(bytes([byte[0] ^ 0xFF]))
        stream.write(b"OKAY" + struct.pack("<I", 0))

    def _send_file(self, stream: _Stream, path: str) -> None:
        self.stats.pulls.append(path)
        try:
            fh = open(self.host_path(path), "rb")
        except (OSError, PermissionError) as exc:
            stream.write(_fail(f"open failed: {getattr(exc, 'strerror', None) or exc}"))
            return
        cut = self.faults.get("cut_pull_after")
        sent = 0
        # adbd's local socket reads the sync service's socket up to max_payload at a time, so
        # the 64 KiB DATA messages travel several to a WRTE when the service is ahead
        pending = bytearray()
        with fh:
            while True:
                chunk = fh.read(SYNC_DATA_MAX)
                if not chunk:
                    break
                if cut is not None and sent + len(chunk) > cut and self.faults.get("cut_pull_times", 1) > 0:
                    self.faults["cut_pull_times"] = self.faults.get("cut_pull_times", 1) - 1
                    part = chunk[: max(0, cut - sent)]
                    stream.write(bytes(pending) + b"DATA" + struct.pack("<I", len(part)) + part)
                    stream.conn.kill()
                    raise _Disconnect()
                if len(pending) + 8 + len(chunk) > stream.conn.max_payload and pending:
                    stream.write(pending)
                    pending = bytearray()
                pending += struct.pack("<4sI", b"DATA", len(chunk))
                pending += chunk
                sent += len(chunk)
        stream.write(bytes(pending) + b"DONE" + struct.pack("<I", 0))


def _fail(message: str) -> bytes:
    raw = message.encode()
    return b"FAIL" + struct.pack("<I", len(raw)) + raw


def _drain_send(stream: _Stream) -> None:
    while True:
        ident = stream.read_exact(4)
        (size,) = struct.unpack("<I", stream.read_exact(4))
        if ident == b"DONE":
            return
        stream.read_exact(size)


if __name__ == "__main__":  # manual use: python -m tests.doubles.adbd SANDBOX
    import sys

    import signal

    d = FakeAdbd(Path(sys.argv[1]), delayed_ack=not os.environ.get("BUNDLERUN_ADBD_NO_DELAYED_ACK"))
    print(d.start(), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        d.stop()
