"""`adb+tcp://HOST:PORT` and `adb+usb://SERIAL`: the device protocol spoken directly (adb-shell).

No adb server is involved. The host key is `~/.android/adbkey` (or
`$ANDROID_USER_HOME/adbkey`), the same file the adb CLI uses, so a device that
already trusts this host does not prompt again; it is created (mode 0600) when
absent.
"""

from __future__ import annotations

import os
import select
import socket
from pathlib import Path

from bundlerun.targets.remote.transport import (
    ABSENT, NO_SPACE, OFFLINE, TIMEOUT, TRANSPORT, UNAUTHORIZED, USB, RemoteStat, TransportError, classify_message,
)


def default_key_path() -> Path:
    user_home = os.environ.get("ANDROID_USER_HOME")
    if user_home:
        return Path(user_home) / "adbkey"
    return Path(os.environ.get("HOME") or Path.home()) / ".android" / "adbkey"


def load_signer(key_path: Path | None = None):
    """The host's RSA signer; creates the key pair (0600) when missing."""
    from adb_shell.auth.keygen import keygen
    from adb_shell.auth.sign_pythonrsa import PythonRSASigner

    key_path = Path(key_path) if key_path else default_key_path()
    if not key_path.exists():
        key_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = os.umask(0o077)
        try:
            keygen(str(key_path))
        finally:
            os.umask(old)
        os.chmod(key_path, 0o600)
    try:
        return PythonRSASigner.FromRSAKeyPath(str(key_path))
    except (OSError, ValueError) as exc:
        raise TransportError(f"cannot read the adb key {key_path}: {exc}", UNAUTHORIZED) from None


def _robust_tcp_transport(host: str, port: int):
    """adb-shell's TcpTransport with two fixes: a closed socket raises at once
    (instead of spinning until the read timeout) and writes are never partial."""
    from adb_shell.exceptions import TcpTimeoutException
    from adb_shell.transport.tcp_transport import TcpTransport

    class _Transport(TcpTransport):
        def bulk_read(self, numbytes, transport_timeout_s):
            if self._connection is None:
                raise ConnectionResetError("connection to the device is closed")
            readable, _, _ = select.select([self._connection], [], [], transport_timeout_s)
            if not readable:
                raise TcpTimeoutException(f"reading from {host}:{port} timed out ({transport_timeout_s} s)")
            data = self._connection.recv(numbytes)
            if not data:
                raise ConnectionResetError(f"device {host}:{port} closed the connection")
            return data

        def bulk_write(self, data, transport_timeout_s):
            if self._connection is None:
                raise ConnectionResetError("connection to the device is closed")
            view = memoryview(data)
            while view:
                _, writable, _ = select.select([], [self._connection], [], transport_timeout_s)
                if not writable:
                    raise TcpTimeoutException(f"sending to {host}:{port} timed out ({transport_timeout_s} s)")
                sent = self._connection.send(view)
                view = view[sent:]
            return len(data)

    return _Transport(host, port)


class AdbShellTransport:
    """Shell/push/pull with adb-shell's AdbDeviceTcp or AdbDeviceUsb."""

    def __init__(self, *, host: str | None = None, port: int = 5555, usb_serial: str | None = None,
                 key_path: Path | None = None, connect_timeout_s: float = 10.0, auth_timeout_s: float = 30.0):
        self.host, self.port, self.usb_serial = host, port, usb_serial
        self.key_path = key_path
        self.connect_timeout_s, self.auth_timeout_s = connect_timeout_s, auth_timeout_s
        self.device = None
        self.description = (f"adb-shell TCP {host}:{port}" if host else f"adb-shell USB {usb_serial or '(first device)'}")

    # -- lifecycle
    def _make_device(self):
        if self.host:
            from adb_shell.adb_device import AdbDeviceTcp

            dev = AdbDeviceTcp(self.host, self.port, default_transport_timeout_s=self.connect_timeout_s)
            dev._io_manager._transport = _robust_tcp_transport(self.host, self.port)
            return dev
        try:
            from adb_shell.adb_device import AdbDeviceUsb
        except ImportError:
            AdbDeviceUsb = None
        try:
            import usb1  # noqa: F401
        except (ImportError, OSError):
            raise TransportError(
                "adb+usb needs libusb and the usb extra: pip install 'bundlerun[usb]' (adb-shell[usb], libusb1) "
                "and the system libusb-1.0; or use adb://SERIAL through the adb server", USB) from None
        if AdbDeviceUsb is None:
            raise TransportError("this adb-shell has no USB support; pip install 'adb-shell[usb]'", USB)
        try:
            return AdbDeviceUsb(serial=self.usb_serial, default_transport_timeout_s=self.connect_timeout_s)
        except Exception as exc:  # UsbDeviceNotFoundError and libusb errors
            raise TransportError(f"no USB Android device {self.usb_serial or ''} found: {exc}", ABSENT) from None

    def connect(self) -> None:
        signer = load_signer(self.key_path)
        self.device = self._make_device()
        prompted = []
        try:
            self.device.connect(rsa_keys=[signer], transport_timeout_s=self.connect_timeout_s,
                                auth_timeout_s=self.auth_timeout_s, read_timeout_s=self.connect_timeout_s,
                                auth_callback=lambda _dev: prompted.append(True))
        except (ConnectionRefusedError, socket.gaierror, OSError) as exc:
            self._drop()
            if isinstance(exc, ConnectionResetError):
                raise TransportError(f"{self.description}: the device closed the connection during the handshake", OFFLINE) from None
            text = str(exc)
            if "busy" in text.lower() or "LIBUSB_ERROR_BUSY" in text or "ACCESS" in text:
                raise TransportError(
                    f"{self.description}: the USB interface is busy; an adb server probably holds the device "
                    "(run `adb kill-server`, or use adb://SERIAL)", USB) from None
            raise TransportError(f"{self.description}: cannot connect ({exc.strerror or exc})", ABSENT) from None
        except Exception as exc:  # adb-shell timeouts and protocol errors
            self._drop()
            name = type(exc).__name__
            if "busy" in str(exc).lower():
                raise TransportError(
                    f"{self.description}: the USB interface is busy; an adb server probably holds the device "
                    "(run `adb kill-server`, or use adb://SERIAL)", USB) from None
            if prompted:
                raise TransportError(
                    f"{self.description}: device is unauthorized: accept the 'Allow USB debugging' prompt for this "
                    f"host's key ({self.key_path or default_key_path()}) and retry", UNAUTHORIZED) from None
            if "Timeout" in name or "timed out" in str(exc):
                raise TransportError(f"{self.description}: device is offline (no answer to CNXN within "
                                     f"{self.connect_timeout_s:g} s)", OFFLINE) from None
            raise TransportError(f"{self.description}: handshake failed ({name}: {exc})", TRANSPORT) from None

    def _drop(self) -> None:
        if self.device is not None:
            try:
                self.device.close()
            except Exception:
                pass
        self.device = None

    def close(self) -> None:
        self._drop()

    def reconnect(self) -> None:
        self._drop()
        self.connect()

    def _require(self):
        if self.device is None or not self.device.available:
            self.connect()
        return self.device

    def _wrap(self, what: str, exc: Exception, timeout_s: float) -> TransportError:
        """Turn an adb-shell exception into a classified error; the link is dropped
        because its packet stream is no longer in a known state."""
        self._drop()
        name = type(exc).__name__
        text = str(exc)
        if "Timeout" in name or "timed out" in text:
            return TransportError(f"{what} timed out after {timeout_s:g} s", TIMEOUT)
        return TransportError(f"{what} failed ({name}: {text})", classify_message(text))

    # -- operations
    def raw_shell(self, command: str, timeout_s: float) -> str:
        dev = self._require()
        try:
            return dev.shell(command, transport_timeout_s=timeout_s, read_timeout_s=timeout_s, timeout_s=timeout_s)
        except Exception as exc:
            raise self._wrap("adb shell", exc, timeout_s) from None

    def push(self, local: Path, remote: str, timeout_s: float) -> None:
        from adb_shell.exceptions import PushFailedError

        dev = self._require()
        try:
            dev.push(str(local), remote, transport_timeout_s=timeout_s, read_timeout_s=timeout_s)
        except PushFailedError as exc:
            reason = exc.args[0] if exc.args else b""
            reason = reason.decode("utf-8", "replace") if isinstance(reason, (bytes, bytearray)) else str(reason)
            raise TransportError(f"push {Path(local).name} -> {remote} failed: {reason}",
                                 NO_SPACE if "No space left" in reason else "device-command", reason) from None
        except Exception as exc:
            raise self._wrap(f"push {Path(local).name} -> {remote}", exc, timeout_s) from None

    def pull(self, remote: str, local: Path, timeout_s: float) -> None:
        local = Path(local)
        tmp = local.with_name(f".{local.name}.partial")
        dev = self._require()
        try:
            dev.pull(remote, str(tmp), transport_timeout_s=timeout_s, read_timeout_s=timeout_s)
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            if "Command failed" in str(exc):  # sync FAIL: the file is not there / unreadable
                raise TransportError(f"pull {remote} failed: {str(exc).split(':', 1)[-1].strip()}", "missing-file") from None
            raise self._wrap(f"pull {remote}", exc, timeout_s) from None
        os.replace(tmp, local)

    def stat(self, remote: str, timeout_s: float) -> RemoteStat | None:
        dev = self._require()
        try:
            mode, size, _mtime = dev.stat(remote, transport_timeout_s=timeout_s, read_timeout_s=timeout_s)
        except Exception as exc:
            raise self._wrap(f"stat {remote}", exc, timeout_s) from None
        if mode == 0:
            return None
        return RemoteStat(mode, size)

    def listdir(self, remote: str, timeout_s: float) -> list[str]:
        dev = self._require()
        try:
            entries = dev.list(remote, transport_timeout_s=timeout_s, read_timeout_s=timeout_s)
        except Exception as exc:
            raise self._wrap(f"list {remote}", exc, timeout_s) from None
        names = [e.filename.decode("utf-8", "replace") if isinstance(e.filename, (bytes, bytearray)) else e.filename
                 for e in entries]
        return [n for n in names if n not in (".", "..")]
