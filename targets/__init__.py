"""Targets, named by URL (like pyserial's serial_for_url).

    host://xnnpack  host://portable            targets.host
    tosa://int      tosa://fp                  targets.tosa
    fvp://corstone-300/ethos-u55-128 ...       targets.fvp
    serial:///dev/ttyACM0?baud=115200          targets.serial_port
    serial+socket://HOST:PORT, rfc2217://...   targets.serial_port
    adb://SERIAL  adb+tcp://HOST:PORT  adb+usb://SERIAL   targets.android

Each module exposes `create(url: TargetURL, config: dict) -> Target`. Modules are
imported only when their scheme is used, so the CLI stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from bundles.errors import TargetError

SCHEMES: dict[str, str] = {
    "host": "targets.host",
    "tosa": "targets.tosa",
    "fvp": "targets.fvp",
    "serial": "targets.serial_port",
    "serial+socket": "targets.serial_port",
    "rfc2217": "targets.serial_port",
    "adb": "targets.android",
    "adb+tcp": "targets.android",
    "adb+usb": "targets.android",
    "apple": "targets.apple",
}

DEFAULT_TARGET = "host://xnnpack"


@dataclass(frozen=True)
class TargetURL:
    """A parsed target URL. `netloc`+`path` keep their raw form; `query` is flattened."""

    raw: str
    scheme: str
    netloc: str
    path: str
    query: dict[str, str] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.scheme.split("+")[0]


def parse_target_url(url: str) -> TargetURL:
    if "://" not in url:
        raise TargetError(
            f"target {url!r} is not a URL; expected e.g. host://xnnpack, tosa://int, "
            "fvp://corstone-300/ethos-u55-128, serial:///dev/ttyACM0, adb://SERIAL"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise TargetError(f"unknown target scheme {scheme!r} in {url!r}; known: {', '.join(sorted(SCHEMES))}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return TargetURL(raw=url, scheme=scheme, netloc=parts.netloc, path=parts.path, query=query)


def open_target(url: str, config: dict | None = None):
    """Instantiate the target for `url` with its config section."""
    parsed = parse_target_url(url)
    module_name = SCHEMES[parsed.scheme]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise TargetError(f"target scheme {parsed.scheme!r} is not available in this build of bundlerun") from None
        raise
    return module.create(parsed, dict(config or {}))
