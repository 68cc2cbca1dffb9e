"""Android over ADB: `adb://SERIAL` (adb server, real adb CLI), `adb+tcp://HOST:PORT`
and `adb+usb://SERIAL` (device protocol directly, adb-shell).

Importing this package is cheap; transports import adb-shell lazily.
"""

from __future__ import annotations

from bundlerun.bundles.errors import TargetError
from bundlerun.targets import Check, TargetSpec, TargetURL, lazy
from bundlerun.targets.android.config import AndroidTargetConfig


def _doctor(_section: dict) -> list[Check]:
    from bundlerun.targets.probes import dist_check, tool_check  # start-up: not loaded by `bundlerun --help`

    return [tool_check("adb", ["version"], "adb:// targets; adb+tcp:// works without it"),
            dist_check("adb-shell", "adb-shell", "adb_shell", "adb+tcp:// and adb+usb:// targets")]


SPEC = TargetSpec(
    name="adb",
    schemes=("adb", "adb+tcp", "adb+usb"),
    summary="an Android device through the adb server (adb://) or directly with adb-shell",
    examples=("adb://SERIAL", "adb+tcp://HOST:5555", "adb+usb://SERIAL"),
    default_backend="xnnpack",
    settings=AndroidTargetConfig,
    doctor=_doctor,
    # the local adb binary; programs, libraries and environment run on the device
    command_settings=("adb_path", "runner", "libraries", "env", "qnn_sdk_root", "qnn_backend_lib", "debug_runner"),
    capture=lazy("bundlerun.targets.android.intermediates:capture"),
    capture_prefix=True,  # the debug runner's --prefix_testset_idx (not the qnn-executor-runner profile)
    device_key=lambda url: _device_key(url),
    lowering=lambda url: _lowering(url),
    repeat=True,
)


def _lowering(url: TargetURL) -> dict:
    """What a recipe compiles for on this phone: its Qualcomm SoC when the URL names it
    (`adb://SERIAL?soc=SM8550`, read by the qnn recipe as qnn://htp-sim?soc= is), else nothing (the
    recipe's own default)."""
    soc = (url.query.get("soc") or url.query.get("soc_model") or "").strip().upper()
    return {"soc": soc} if soc else {}


def _device_key(url: TargetURL) -> str | None:
    """One phone runs one job at a time: adb:SERIAL (adb:HOST:PORT over TCP); a Ray node holding it
    is started with `--resources '{"adb:SERIAL": 1}'`."""
    where = (url.netloc + url.path).strip("/")
    return f"adb:{where}" if where else None


def make_transport(url, cfg: AndroidTargetConfig):
    """The transport a target URL names."""
    if url.scheme == "adb":
        from bundlerun.targets.android.adb_cli import AdbCliTransport  # start-up: not loaded by `bundlerun --help`

        serial = (url.netloc + url.path).strip("/") or None
        return AdbCliTransport(serial, adb_path=cfg.adb_path, server_host=cfg.server_host, server_port=cfg.server_port,
                               auto_connect=cfg.auto_connect, connect_timeout_s=cfg.connect_timeout_s)
    from bundlerun.targets.android.adb_direct import AdbShellTransport  # start-up: not loaded by `bundlerun --help`

    if url.scheme == "adb+tcp":
        host, _, port = url.netloc.rpartition(":") if ":" in url.netloc else (url.netloc, "", "5555")
        if not host:
            raise TargetError(f"{url.raw}: expected adb+tcp://HOST:PORT")
        try:
            port_no = int(port or 5555)
        except ValueError:
            raise TargetError(f"{url.raw}: port {port!r} is not a number") from None
        return AdbShellTransport(host=host.strip("[]"), port=port_no, key_path=cfg.key_path,
                                 connect_timeout_s=cfg.connect_timeout_s, auth_timeout_s=cfg.auth_timeout_s)
    if url.scheme == "adb+usb":
        serial = (url.netloc + url.path).strip("/") or None
        return AdbShellTransport(usb_serial=serial, key_path=cfg.key_path,
                                 connect_timeout_s=cfg.connect_timeout_s, auth_timeout_s=cfg.auth_timeout_s)
    raise TargetError(f"{url.raw}: not an Android target URL")


def create(url, config: dict):
    """Entry point used by targets.open_target."""
    from bundlerun.targets.android.target import AndroidTarget  # start-up: not loaded by `bundlerun --help`

    cfg = AndroidTargetConfig.from_dict(config, url.query)
    return AndroidTarget(url.raw, make_transport(url, cfg), cfg)
