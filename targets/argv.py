"""Every value bundlerun puts into another program's argv, checked in one place.

Target URLs, farm plans, configs and device listings are data; the tools they reach (ssh, adb,
labgrid, QEMU, qemu-user, an FVP, a flash or reset command, fuser) read an argument that starts
with `-` as an option. `ssh://-oProxyCommand=touch${IFS}x/host://xnnpack` once made ssh run a
local command. So a value that lands in an argv goes through one of these first:

- `host`, `user`, `port`, `serial`: a network host, a login name, a TCP port, a device serial:
  a strict character set, never a leading `-`;
- `word`: any other single argument (a place name, a pyOCD target): no leading `-`, no control
  characters (a newline could start a second line of a tool's config);
- `option_value`: the value of an option that takes one (`-a ELF`): no control characters;
- `local_path`: a file on this machine, made absolute (an absolute path cannot look like an
  option);
- `remote_path`: a path on a device or remote host: no leading `-`, no control characters;
- `qemu_opt`: a value inside QEMU's `key=value,key=value` options (commas doubled, as QEMU
  escapes them), so a path cannot add an option of its own.

Where the tool supports it, `--` also ends the options before positional arguments (ssh,
ssh-keyscan, lsof). Each failure is a one-line TargetError of kind `bad-config` naming the value
and where it came from.
"""

from __future__ import annotations

import os
import re

from bundlerun.bundles.errors import TargetError
from bundlerun.targets.failures import FailureKind

_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})\Z")  # DNS name, ssh config alias or IPv4
_IPV6 = re.compile(r"[0-9A-Fa-f:.]{2,45}(?:%[A-Za-z0-9_.-]{1,32})?\Z")  # literal (brackets removed), zone id
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}\Z")  # POSIX portable names, plus @ (domain logins)
_SERIAL = re.compile(r"[A-Za-z0-9_.:\[\]%@-]{1,128}\Z")  # adb serials: usb ids, emulator-5554, host:port, [v6]:port
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _fail(value: object, what: str, where: str, why: str) -> TargetError:
    shown = repr(value)  # repr escapes every non-printable character (controls, bidi, separators)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    prefix = f"{where}: " if where else ""
    return TargetError(f"{prefix}{what} {shown} {why}", kind=FailureKind.BAD_CONFIG)


def _text(value: object, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(value, what, where, "is not text")
    if _CONTROL.search(value):
        raise _fail(value, what, where, "contains a control character")
    return value


def word(value: object, what: str, where: str = "", empty: bool = False) -> str:
    """One argument of another program: text, no control characters, not an option (`-...`)."""
    text = _text(value, what, where)
    if not text and not empty:
        raise _fail(value, what, where, "is empty")
    if text.startswith("-"):
        raise _fail(value, what, where, "starts with '-': a program would read it as an option")
    return text


def host(value: object, what: str = "host", where: str = "") -> str:
    """A host name, ssh config alias, IPv4 or (bracket-less) IPv6 literal."""
    text = word(value, what, where)
    if not (_HOST.match(text) or (":" in text and _IPV6.match(text))):
        raise _fail(value, what, where, "is not a host name or address (letters, digits, '.', '-', '_'; "
                                        "or an IPv6 literal)")
    return text


def user(value: object, what: str = "user", where: str = "") -> str:
    text = word(value, what, where)
    if not _USER.match(text):
        raise _fail(value, what, where, "is not a user name (letters, digits, '.', '_', '-', '@')")
    return text


def port(value: object, what: str = "port", where: str = "") -> int:
    try:
        number = int(str(value), 10)
    except ValueError:
        raise _fail(value, what, where, "is not a number") from None
    if not 1 <= number <= 65535:
        raise _fail(value, what, where, "is not a TCP port (1..65535)")
    return number


def serial(value: object, what: str = "device serial", where: str = "") -> str:
    """An adb serial (`R58M...`, `emulator-5554`, `10.0.0.7:5555`, `[fe80::1]:5555`)."""
    text = word(value, what, where)
    if not _SERIAL.match(text):
        raise _fail(value, what, where, "is not a device serial (letters, digits and . : _ - [ ] % @)")
    return text


def option_value(value: object, what: str = "value", where: str = "") -> str:
    """The value of an option that takes one (`-i FILE`, `-a ELF`): the option consumes it whatever it
    starts with, so only text without control characters is required."""
    return _text(os.fspath(value) if isinstance(value, os.PathLike) else value, what, where)


def local_path(value: object, what: str = "path", where: str = "") -> str:
    """A file on this machine as an absolute path: never read as an option, whatever it is called."""
    text = _text(os.fspath(value) if isinstance(value, os.PathLike) else value, what, where)
    if not text:
        raise _fail(value, what, where, "is empty")
    return os.path.abspath(os.path.expanduser(text))


def remote_path(value: object, what: str = "remote path", where: str = "") -> str:
    """A path on a device or a remote host (quoted for its shell by the caller): not an option."""
    return word(value, what, where)


def qemu_opt(value: object, what: str = "value", where: str = "") -> str:
    """A value inside a QEMU `key=value,...` option: commas doubled (QEMU's escape), no controls."""
    return _text(os.fspath(value) if isinstance(value, os.PathLike) else value, what, where).replace(",", ",,")


def program(value: object, what: str = "program", where: str = "") -> str:
    """The program to run (argv[0]): a name looked up on PATH or a path; not an option."""
    return word(os.fspath(value) if isinstance(value, os.PathLike) else value, what, where)
