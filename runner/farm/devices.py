"""Which physical device a target URL occupies.

A device runs one job at a time wherever its host is: the local executor keeps a lock per
device key, the Ray executor asks for the Ray custom resource of the same name (`ray start
--resources '{"adb:SERIAL": 1}'` on the node the phone is plugged into).

    adb://SERIAL, adb+usb://SERIAL          adb:SERIAL
    adb+tcp://HOST:PORT                     adb:HOST:PORT
    serial:///dev/ttyACM0, serial+socket:// board:/dev/ttyACM0, board:HOST:PORT
    labgrid://PLACE                         board:PLACE
    ssh://HOST/<inner URL>                  the inner URL's device, if any
    host://, tosa://, fvp://, qemu://, ...  none: a CPU job (simulators and the host)

A target module registered from elsewhere (`BUNDLERUN_TARGETS`, an entry point) may define
`farm_device(url: TargetURL) -> str | None`; a plan may also name the resource of a device
explicitly (`{url = "...", resource = "board:lab-3"}`).
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

_ADB = ("adb", "adb+usb", "adb+tcp")
_BOARD = ("serial", "serial+socket", "labgrid")


def device_key(url: str) -> str | None:
    """The device resource `url` occupies, or None for a CPU job."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    scheme = scheme.lower()
    if scheme == "ssh":
        host, _, inner = rest.partition("/")
        return device_key(inner) if "://" in inner else None
    parts = urlsplit(url)
    where = (parts.netloc + parts.path).strip("/") if scheme != "serial" else parts.path or parts.netloc
    if scheme in _ADB:
        return f"adb:{where}" if where else None
    if scheme in _BOARD:
        return f"board:{where}" if where else None
    try:
        from bundlerun.targets import spec_for

        module = importlib.import_module(spec_for(url).module)
    except Exception:  # noqa: BLE001 - an unknown scheme is reported by the run itself
        return None
    hook = getattr(module, "farm_device", None)
    if callable(hook):
        from bundlerun.targets import parse_target_url

        return hook(parse_target_url(url))
    return None
