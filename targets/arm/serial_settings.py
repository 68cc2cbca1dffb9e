"""The serial lane's settings: one strict dataclass from `[targets.serial]` and the URL query.

Kept apart from the port, the board's commands and the capture because every one of them reads
these fields (tests build `SerialSettings` directly too), while none of them needs to know how
a URL or a TOML section becomes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.targets.settings import check_keys

RESET_MODES = ("none", "dtr", "rts", "dtr+rts", "command", "exec")


@dataclass
class SerialSettings:
    """Everything the serial lane needs; from the target config and the URL query."""

    port_url: str  # what pyserial opens: /dev/ttyACM0, socket://h:p, rfc2217://h:p, loop://
    baudrate: int = 115200
    reset: str = "dtr"  # none | dtr | rts | dtr+rts | command | exec
    reset_command: str | None = None  # bytes written for reset=command (\n, \r, \xNN escapes)
    reset_exec: str | None = None  # external command for reset=exec, e.g. "pyocd reset -t {target}"
    reset_pulse_s: float = 0.1
    flash: str | None = None  # external command template; {case_bundle} makes it per case
    flash_timeout_s: float = 180.0
    target: str | None = None  # substituted as {target} (e.g. a pyOCD target name)
    elf: str | None = None  # substituted as {elf}
    debug_elf: str | None = None  # `bundlerun debug`: a runner built with --etdump, used as {elf} (targets/arm/intermediates.py)
    read_timeout_s: float = 0.1  # bound of every single read
    settle_s: float = 1.0  # quiet time after an abort/fatal line before the capture stops
    boot_timeout_s: float | None = None  # no byte at all after reset within this -> TIMEOUT
    exclusive: bool = True
    outputs: str = "auto"  # auto (ETDump, else printed) | etdump | printed
    # The board as a process bundlerun owns: an emulator exposing its UART (QEMU
    # `-serial tcp:...,server=on,wait=on`), a serial bridge, a probe server. Started in its own
    # process group before the port is opened, stopped (group SIGTERM, then SIGKILL) after:
    # per case when it mentions {case_bundle}, else once for the whole run.
    launch: str | None = None
    connect_timeout_s: float | None = None  # keep retrying the port open; default 10 s with launch, else one try


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def settings_from(url, config: dict[str, Any]) -> SerialSettings:
    """Merge config (the [targets.serial] section) with the URL query (wins)."""
    merged: dict[str, Any] = dict(config or {})
    merged.update(url.query)
    scheme = url.scheme
    if "port" in merged:
        port_url = str(merged.pop("port"))
    elif scheme == "serial":
        port_url = (url.netloc + url.path) if url.netloc else url.path
    elif scheme == "serial+socket":
        port_url = f"socket://{url.netloc}"
    elif scheme == "rfc2217":
        port_url = f"rfc2217://{url.netloc}"
    else:  # pragma: no cover - the scheme map only routes the three above here
        raise ConfigError(f"serial target cannot handle scheme {scheme!r}")
    if not port_url:
        raise ConfigError(f"{url.raw}: no serial port given (e.g. serial:///dev/ttyACM0)")
    default_reset = "none" if scheme == "serial+socket" else "dtr"
    known = {f for f in SerialSettings.__dataclass_fields__ if f != "port_url"}
    aliases = {"baud": "baudrate"}
    kwargs: dict[str, Any] = {}

    check_keys("targets.serial", [aliases.get(k, k) for k in merged], [*known, *aliases])
    for key, value in merged.items():
        kwargs[aliases.get(key, key)] = value
    try:
        s = SerialSettings(port_url=port_url, **kwargs)
        s.baudrate = int(s.baudrate)
        for name in ("reset_pulse_s", "flash_timeout_s", "read_timeout_s", "settle_s"):
            setattr(s, name, float(getattr(s, name)))
        if s.boot_timeout_s is not None:
            s.boot_timeout_s = float(s.boot_timeout_s)
        s.connect_timeout_s = (10.0 if s.launch else 0.0) if s.connect_timeout_s is None else float(s.connect_timeout_s)
        s.exclusive = _truthy(s.exclusive)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{url.raw}: bad serial setting ({exc})") from None
    if "reset" not in kwargs:
        s.reset = default_reset
    s.reset = str(s.reset).lower()
    if s.reset not in RESET_MODES:
        raise ConfigError(f"{url.raw}: reset={s.reset!r}; expected one of {', '.join(RESET_MODES)}")
    if s.reset == "command" and not s.reset_command:
        raise ConfigError(f"{url.raw}: reset=command needs reset_command (the text the firmware resets on)")
    if s.reset == "exec" and not s.reset_exec:
        raise ConfigError(f"{url.raw}: reset=exec needs reset_exec (e.g. 'pyocd reset -t <target>')")
    if s.outputs not in ("auto", "etdump", "printed"):
        raise ConfigError(f"{url.raw}: outputs={s.outputs!r}; expected auto, etdump or printed")
    if not (0 < s.read_timeout_s <= 5):
        raise ConfigError(f"{url.raw}: read_timeout_s must be in (0, 5]")
    if not (0 <= s.connect_timeout_s <= 600):
        raise ConfigError(f"{url.raw}: connect_timeout_s must be in [0, 600]")
    if s.launch is not None and not str(s.launch).strip():
        raise ConfigError(f"{url.raw}: launch is empty")
    return s


def unescape(text: str) -> bytes:
    """'reset\\n' / '\\x12' as written in a TOML config -> bytes."""
    return text.encode("latin-1", errors="strict").decode("unicode_escape").encode("latin-1")
