"""Shared pieces for the Android tests: a private adb server, runner "binaries", a QNN SDK tree.

The adb server runs on its own port with a temporary HOME, so tests never touch
the user's keys or server; `stop()` kills it and checks it is gone.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from bundlerun.targets.runner_cache import read_record


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateAdbServer:
    def __init__(self, home: Path):
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.env = dict(os.environ, HOME=str(self.home), ANDROID_USER_HOME=str(self.home / ".android"),
                        ANDROID_SDK_HOME=str(self.home), ANDROID_ADB_SERVER_PORT=str(self.port))
        self.env.pop("ANDROID_SERIAL", None)

    def adb(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["adb", "-P", str(self.port), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def start(self) -> "PrivateAdbServer":
        res = self.adb("start-server")
        if res.returncode != 0:
            raise RuntimeError(f"adb start-server failed: {res.stderr}")
        return self

    def connect(self, port: int, timeout: float = 20) -> str:
        serial = f"127.0.0.1:{port}"
        self.adb("connect", serial)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state(serial) == "device":
                return serial
            time.sleep(0.2)
        return serial

    def state(self, serial: str) -> str | None:
        for line in self.adb("devices").stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == serial:
                return parts[1]
        return None

    def stop(self) -> None:
        self.adb("kill-server")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.1)


def adb_available() -> bool:
    return shutil.which("adb") is not None


def runner_binaries(folder: Path) -> dict[str, Path]:
    from doubles.android_runner import make_runner_binary

    folder.mkdir(parents=True, exist_ok=True)
    return {
        "executor-runner": make_runner_binary(folder / "executor_runner", "executor-runner"),
        "qnn-executor-runner": make_runner_binary(folder / "qnn_executor_runner", "qnn-executor-runner"),
    }


def fake_qnn_sdk(root: Path, arch: str = "75") -> Path:
    """A QNN SDK tree with placeholder libraries (the real SDK cannot be installed here)."""
    android = root / "lib" / "aarch64-android"
    android.mkdir(parents=True, exist_ok=True)
    for name in ("libQnnHtp.so", "libQnnSystem.so", f"libQnnHtpV{arch}Stub.so", "libQnnHtpPrepare.so"):
        (android / name).write_bytes(b"\x7fELF placeholder " + name.encode())
    skel = root / "lib" / f"hexagon-v{arch}" / "unsigned"
    skel.mkdir(parents=True, exist_ok=True)
    (skel / f"libQnnHtpV{arch}Skel.so").write_bytes(b"\x7fELF hexagon placeholder")
    return root


# -- the real ExecuTorch executor_runner (built from source by firmware_scripts/android) --------

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "firmware_scripts" / "android" / "build_executor_runner.sh"


def real_executor_runner(arch: str = "aarch64") -> Path:
    """The folder (runner.json + executor_runner) of the real runner scripts/setup.sh builds.

    Raises RuntimeError with the reason and the command to build it when it is not in the
    cache: tests that need it must fail, not skip (a missing toolchain is a setup bug)."""

    override = os.environ.get(f"BUNDLERUN_{arch.upper()}_RUNNER_DIR")  # a runner folder built elsewhere
    if override:
        folder = Path(override)
    else:
        cmd = ["bash", str(BUILD_SCRIPT), "--toolchain", "gnu", "--arch", arch, "--cached-only"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"the real {arch} executor_runner is not built: {res.stderr.strip()} "
                               f"(build it: bash {BUILD_SCRIPT} --toolchain gnu --arch {arch})")
        folder = Path(res.stdout.strip().splitlines()[-1])
    if not (folder / "runner.json").is_file():
        raise RuntimeError(f"{folder} holds no runner.json (made by {BUILD_SCRIPT.name} --toolchain gnu)")
    meta = read_record(folder)
    if meta.get("kind") != "executor_runner" or not Path(meta["binary"]).is_file():
        raise RuntimeError(f"{folder}/runner.json does not describe a built executor_runner")
    return folder
