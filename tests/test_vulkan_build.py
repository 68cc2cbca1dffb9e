"""The Vulkan lane's build: firmware_scripts/vulkan/ (trixie's glslc unpacked privately, the x86_64
executor_runner + debug runner with the Vulkan delegate in the content-addressed runner cache). The real
tools and the real cached build; no double."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.test_vulkan_lane import BUILD_SCRIPT, vulkan_runner  # noqa: F401 - the fixture
from bundlerun.targets.runner_cache import read_record

HERE = BUILD_SCRIPT.parent


def _dry(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    src = tmp_path / "et"
    (src / "runtime").mkdir(parents=True, exist_ok=True)
    (src / "CMakeLists.txt").write_text("")
    env = {**os.environ, "BUNDLERUN_CACHE": str(tmp_path / "cache")}
    return subprocess.run(["bash", str(BUILD_SCRIPT), "--executorch-src", str(src), "--dry-run", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_dry_run_prints_the_configure_and_both_targets(tmp_path):
    res = _dry(tmp_path)
    assert res.returncode == 0, res.stderr
    cmake = next(ln for ln in res.stdout.splitlines() if ln.startswith("cmake -S")).split()
    for flag in ("-DEXECUTORCH_BUILD_VULKAN=ON", "-DEXECUTORCH_ENABLE_BUNDLE_IO=ON", "-DEXECUTORCH_ENABLE_EVENT_TRACER=ON",
                 "-DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON", "-DEXECUTORCH_PAL_DEFAULT=posix"):
        assert flag in cmake, flag
    inject = [w.split("=", 1)[1] for w in cmake if w.startswith("-DCMAKE_PROJECT_executorch_INCLUDE=")]
    assert [Path(p).resolve() for p in inject] == [HERE.parent / "android" / "debug_runner" / "inject.cmake"]
    assert any(w.startswith("-DGLSLC_PATH=") and w.endswith("glslc-trixie/bin/glslc") for w in cmake)
    assert "--target executor_runner bundlerun_debug_runner -j 2" in res.stdout
    assert "executor_runner.cpp patched with" in res.stdout and "executor_runner-server-testset.patch" in res.stdout
    assert res.stdout.strip().splitlines()[-1].startswith(str(tmp_path / "cache" / "runners"))
    assert not (tmp_path / "cache" / "runners").exists()  # a dry run builds nothing


def test_bad_options_are_one_line(tmp_path):
    for args, said in ((["--jobs", "0"], "--jobs must be a positive integer"), (["--bogus"], "unknown option --bogus"),
                       (["--glslc"], "--glslc needs a value")):
        res = subprocess.run(["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and said in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_cached_only_without_a_build_exits_3(tmp_path):
    (tmp_path / "et" / "runtime").mkdir(parents=True)
    (tmp_path / "et" / "CMakeLists.txt").write_text("")
    env = {**os.environ, "BUNDLERUN_CACHE": str(tmp_path / "cache")}
    res = subprocess.run(["bash", str(BUILD_SCRIPT), "--executorch-src", str(tmp_path / "et"), "--cached-only"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 3 and "no cached Vulkan executor_runner" in res.stderr


def test_private_glslc_is_trixies_and_the_system_apt_is_untouched():
    res = subprocess.run(["bash", str(HERE / "fetch_glslc.sh")], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    folder = Path(res.stdout.strip().splitlines()[-1])
    version = subprocess.run([str(folder / "glslc"), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert "shaderc 2025" in version and "glslang 15" in version, version  # Debian 12's is glslang 11.13
    packages = (folder.parent / "packages.txt").read_text().split("\n")
    assert {p.split()[0] for p in packages if p} == {"glslc", "libshaderc1", "libc6", "libstdc++6", "libgcc-s1"}
    assert all(len(p.split()[2]) == 64 for p in packages if p)  # each .deb's sha256 is recorded
    assert not [f for f in os.listdir("/var/lib/apt/lists") if "trixie" in f]  # never in the system's lists
    status = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "libc6"], capture_output=True, text=True).stdout
    assert status.startswith("2.36"), status  # the system's libc is still Debian 12's


def test_cached_runner_is_described_by_runner_json(vulkan_runner):
    meta = read_record(vulkan_runner)
    assert meta["kind"] == "executor_runner" and meta["arch"] == "x86_64" and meta["backends"] == ["vulkan"]
    assert meta["kernels"] == ["portable", "quantized"] and meta["bundle_io"] and meta["etdump"]
    # bundlerun's server-mode patch: a trigger names the bundled test case (an LLM's steps on one method)
    assert meta["server_testset"] is True and meta["patches"] == ["executor_runner-server-testset"]
    assert b"Loading bundled test set" in Path(meta["binary"]).read_bytes()  # the patched runner's log line
    assert "glslang 15" in meta["glslc"]["version"] and meta["static"] is False
    for key in ("binary", "debug_runner"):
        binary = Path(meta[key])
        head = binary.read_bytes()[:20]
        assert head[:4] == b"\x7fELF" and head[18] == 62  # EM_X86_64
    # the delegate loads libvulkan.so.1 itself (volk): the binary does not need it at link time
    needed = subprocess.run(["objdump", "-p", meta["binary"]], capture_output=True, text=True).stdout
    assert "libvulkan" not in needed
    assert meta["build_seconds"] > 0 and "load_average" in meta


def test_second_call_returns_the_cached_folder_at_once(vulkan_runner):
    res = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and Path(res.stdout.strip().splitlines()[-1]) == vulkan_runner
    assert "building" not in res.stderr
