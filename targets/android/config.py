"""`[targets.adb]` settings (bundlerun.toml or CLI flags) as one typed record."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.limits import MAX_REPEAT, MAX_TIMEOUT_S
from bundlerun.targets.settings import check_keys

PROFILES = ("executor-runner", "qnn-executor-runner")
WORKSPACE_ROOT = "/data/local/tmp/"

# Snapdragon SoC model -> Hexagon HTP architecture (QNN's libQnnHtpV<arch>*)
SOC_HTP_ARCH = {
    "SM8350": "68", "SM8450": "69", "SM8475": "69", "SM8550": "73", "SM8650": "75", "SM8750": "79",
    "SA8295": "68", "SSG2115P": "73", "SXR2230P": "69",
}


@dataclass
class AndroidTargetConfig:
    """Where the runner comes from, how it is run, and how patient to be."""

    runner: Path | None = None  # host path of executor_runner / qnn_executor_runner
    profile: str = "executor-runner"
    libraries: list[Path] = field(default_factory=list)  # extra .so pushed beside the runner
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the runner
    workspace: str = "/data/local/tmp/bundlerun"
    connect_timeout_s: float = 20.0
    auth_timeout_s: float = 30.0
    transfer_timeout_s: float = 300.0
    command_timeout_s: float = 60.0  # housekeeping shell commands
    cache_max_mb: float = 2048.0  # device cache bound; least recently used entries go first
    retries: int | None = None  # None: RunOptions.retries
    cpu_threads: int | None = None
    num_executions: int = 1
    print_output: str | None = None  # --print_output none|summary|all; omitted by default (older runners lack it)
    bundleio_rtol: float = 0.01
    bundleio_atol: float = 0.01
    etdump: bool = False
    logcat: bool = False  # also save `logcat -d` around each run (runners built with the Android PAL)
    adb_path: str | None = None
    server_host: str | None = None
    server_port: int | None = None
    auto_connect: bool = True  # `adb connect HOST:PORT` when an adb:// serial looks like one
    key_path: Path | None = None  # adb+tcp/usb: host key (default ~/.android/adbkey)
    # qnn-executor-runner
    qnn_sdk_root: Path | None = None
    htp_arch: str | None = None  # e.g. "75"; else from soc_model / ro.soc.model
    soc_model: str | None = None
    qnn_backend_lib: Path | None = None  # libqnn_executorch_backend.so from the ExecuTorch build
    # `bundlerun debug` (targets/android/intermediates.py)
    debug_runner: Path | None = None  # bundlerun's debug runner for the device (NDK build); default: the
    #                                  cached gnu build for the device's ABI (built on first use)
    debug_buffer_bytes: int | None = None  # the debug buffer in bytes (default: --debug-buffer-mb)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], query: dict[str, str] | None = None) -> "AndroidTargetConfig":
        raw = {k.replace("-", "_"): v for k, v in dict(raw or {}).items()}
        query = dict(query or {})
        if "host" in query:
            raw.setdefault("server_host", query.pop("host"))
        if "port" in query:
            raw.setdefault("server_port", query.pop("port"))
        if "soc" in query:  # adb://SERIAL?soc=SM8550: the SoC builds for this URL compile for (SPEC.lowering)
            raw.setdefault("soc_model", query.pop("soc"))
        for k, v in query.items():
            raw.setdefault(k.replace("-", "_"), v)

        check_keys("targets.adb", raw, (f.name for f in fields(cls)))
        cfg = cls()
        for key, value in raw.items():
            setattr(cfg, key, _coerce(key, value, getattr(cls(), key)))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        import math

        for name in ("connect_timeout_s", "auth_timeout_s", "transfer_timeout_s", "command_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):  # inf/nan overflow timers
                raise ConfigError(f"[targets.adb] {name} = {value!r}: give seconds in (0, {MAX_TIMEOUT_S:g}]")
        if not (math.isfinite(self.cache_max_mb) and self.cache_max_mb >= 0):
            raise ConfigError(f"[targets.adb] cache_max_mb = {self.cache_max_mb!r}: give a finite size in MB")
        if not 1 <= self.num_executions <= MAX_REPEAT:
            raise ConfigError(f"[targets.adb] num_executions = {self.num_executions}: give 1 to {MAX_REPEAT}")
        if self.profile not in PROFILES:
            raise ConfigError(f"[targets.adb] profile {self.profile!r} is unknown; use one of {', '.join(PROFILES)}")
        ws = posixpath.normpath(self.workspace)
        if not ws.startswith(WORKSPACE_ROOT) or ".." in ws.split("/"):
            raise ConfigError(f"[targets.adb] workspace {self.workspace!r} must be a folder under {WORKSPACE_ROOT}")
        self.workspace = ws
        if self.print_output not in (None, "none", "summary", "all"):
            raise ConfigError("[targets.adb] print_output must be none, summary or all")
        if self.qnn_sdk_root is None and os.environ.get("QNN_SDK_ROOT"):
            self.qnn_sdk_root = Path(os.environ["QNN_SDK_ROOT"])


def _coerce(key: str, value: Any, default: Any) -> Any:
    try:
        if key in ("runner", "key_path", "qnn_sdk_root", "qnn_backend_lib", "debug_runner"):
            return Path(os.path.expanduser(str(value))) if value not in (None, "") else None
        if key == "libraries":
            items = value.split(",") if isinstance(value, str) else list(value)
            return [Path(os.path.expanduser(str(p))) for p in items if str(p)]
        if key == "env":
            if isinstance(value, str):
                return dict(item.split("=", 1) for item in value.split(",") if item)
            return {str(k): str(v) for k, v in dict(value).items()}
        if isinstance(default, bool):
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
        if key in ("server_port", "cpu_threads", "retries", "num_executions", "debug_buffer_bytes"):
            return None if value in (None, "") else int(value)
        if isinstance(default, float):
            return float(value)
        return None if value is None else str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[targets.adb] {key} = {value!r} is not valid ({exc})") from None
