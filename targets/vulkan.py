"""`vulkan://lavapipe`: ExecuTorch's executor_runner with the Vulkan delegate, built from source for
this host (firmware_scripts/vulkan/build_vulkan_runner.sh), on a Vulkan driver chosen by its ICD json.

The driver is a setting, `vulkan://lavapipe?icd=PATH` (default: Debian's lavapipe,
/usr/share/vulkan/icd.d/lvp_icd.x86_64.json), so a second driver build is validated against the first
by changing that one setting (firmware_scripts/vulkan/fetch_lavapipe_backports.sh unpacks one). The
runner sees ONLY that driver: VK_ICD_FILENAMES names it, the loader's other driver variables are
dropped and Mesa's implicit device-select layer is off. Which device and driver actually ran (name,
Mesa version, Vulkan version) is read from the driver itself before the run (`probe_driver`) and
goes into the report's target info (asked once per driver file version: the answer is kept in the
bundlerun cache, vulkan_probes/).

The cases of a method run on one executor_runner in `--server_mode` (targets/et_runner/server.py):
the driver, the program and the delegate's compute graph are set up once, each case's inputs go in
as `--inputs` files (or, on a runner whose runner.json says `server_testset`, each trigger names the
bundled case: any input shape, and the method - an LLM's KV cache with it - kept from case to case),
its outputs come back bit exact from `--output_file`. So an LLM bundle's sequences (export_llama's
Vulkan program: the whole forward one Vulkan delegate, its KV cache updated inside it by the delegate's
llama::update_cache) run every step in order on one loaded method; a runner without that patch, or a
setting that runs a case per process, refuses them in one line. Where a case needs a process
of its own (an ETDump, `--repeat`, printed outputs, inputs the files cannot carry, or the case a server
died on) it runs as its own one-case bundle (the runner loads and checks case 0 only) in its own folder,
exactly the executor_runner contract of targets/et_runner/executor_runner.py (shared with adb:// and
qemu-user://), the ETDump beside the outputs. Each process runs in its own process group under the case
timeout and is always reaped. Mesa's shader cache lives in the bundlerun cache (`shader_cache`), so
shaders compile once per driver, not once per process.

`bundlerun debug` runs bundlerun's debug runner, built with the same Vulkan libraries, and reads its
ETDump + debug buffer (targets/android/intermediates.py): every portable kernel call and every Vulkan
delegate call (a delegate's inside is not visible: the Vulkan delegate logs no intermediate outputs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bundlerun.bundles.cache_dirs import cache_dir
from bundlerun.bundles.errors import ConfigError, TargetError
from bundlerun.bundles.fileio import atomic_write_text
from bundlerun.bundles.limits import MAX_RECORD_BYTES
from bundlerun.bundles.safe_read import UnsafeFileError, load_json_bounded
from bundlerun.targets import Check, ElapsedClock, TargetSpec, TargetURL
from bundlerun.targets.et_runner import executor_runner, server
from bundlerun.targets.gil_handoff import responsive_waits
from bundlerun.targets.et_runner.log import parse_runner_log
from bundlerun.targets.et_runner.protocol import Failure
from bundlerun.targets.base import (
    CaseResult,
    RunOptions,
    TargetBase,
    TargetRun,
    safe_name,
)
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.process import kill_process_group, start_program, wait_exit
from bundlerun.targets.runner_cache import cached_runners, find_runner, read_record, runner_binary
from bundlerun.targets.settings import parse_settings
from bundlerun.targets.base import PerfKind
from bundlerun.bundles.errors import BundlerunError
from bundlerun.targets import parse_target_url

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

DRIVERS = {"lavapipe": Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")}  # Debian's mesa-vulkan-drivers
BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "firmware_scripts" / "vulkan" / "build_vulkan_runner.sh"
BUILD_HINT = "build it with bash firmware_scripts/vulkan/build_vulkan_runner.sh (scripts/setup.sh does), or set runner=PATH"
RUNNER_FLAGS = {"arch": "x86_64", "backends": ["vulkan"]}
# the loader's other ways to add or pick drivers: dropped, so the `icd` setting is the only driver
_LOADER_VARS = ("VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES", "VK_ICD_FILENAMES", "VK_LOADER_DRIVERS_SELECT",
                "VK_LOADER_DRIVERS_DISABLE", "MESA_VK_DEVICE_SELECT")
_NOT_AVAILABLE = "Backend VulkanBackend is not available"  # runtime/executor/method.cpp:93, is_available() false


@dataclass
class VulkanSettings:
    """[targets.vulkan] / vulkan://lavapipe?KEY=VALUE"""

    icd: Path | None = None  # the Vulkan driver's ICD json (default: /usr/share/vulkan/icd.d/lvp_icd.x86_64.json)
    runner: Path | None = None  # default: the cached build_vulkan_runner.sh executor_runner
    debug_runner: Path | None = None  # `bundlerun debug`; default: the one built beside the runner
    shader_cache: Path | None = None  # MESA_SHADER_CACHE_DIR (default: <bundlerun cache>/mesa_shader_cache)
    # keep the runner's ETDump per case (the report then gets per-operator / per-delegate-call times,
    # runner/report/profile.py; reading it imports executorch.devtools, ~7 s here, hence off unless asked)
    etdump: bool = False
    print_output: str = "none"
    num_executions: int = 1  # --num_executions without --repeat
    # a method's cases on one executor_runner --server_mode process; false: a process per case (each also
    # checks its case with the runner's own BundleIO check: the report's device_verdict)
    server: bool = True
    debug_buffer_bytes: int | None = None  # `bundlerun debug`: the debug buffer (default: --debug-buffer-mb)

    def validate(self) -> None:
        if self.print_output not in ("none", "summary", "all"):
            raise ConfigError(f"[targets.vulkan] print_output must be none, summary or all, not {self.print_output!r}")


# ------------------------------------------------------------------ the driver


def icd_library(icd: Path) -> tuple[str | None, str]:
    """(the driver library an ICD json names, "" or why the json is unusable). The json is read with
    bundles/safe_read.py's bounds: a regular file (not a FIFO or a device) of at most 4 MiB."""
    if not os.path.exists(icd):
        return None, f"the Vulkan ICD {icd} does not exist"
    try:
        data = load_json_bounded(icd, MAX_RECORD_BYTES)
    except UnsafeFileError as exc:
        return None, f"the Vulkan ICD is not usable: {exc}"
    table = data.get("ICD") if isinstance(data, dict) else None
    lib = table.get("library_path") if isinstance(table, dict) else None
    if not isinstance(lib, str) or not lib or "\0" in lib:
        return None, f"the Vulkan ICD {icd} is not an ICD json: it names no ICD.library_path"
    if "/" in lib and not os.path.isabs(lib):  # the loader reads relative paths from the json's folder
        lib = str((Path(icd).parent / lib).resolve())
    return lib, ""


def runner_env(icd: Path, shader_cache: Path) -> dict[str, str]:
    """The runner's environment: this ICD as the only driver, Mesa's shader cache where we say."""
    env = {k: v for k, v in os.environ.items() if k not in _LOADER_VARS}
    env.update(VK_ICD_FILENAMES=str(icd), NODEVICE_SELECT="1", MESA_SHADER_CACHE_DIR=str(shader_cache))
    return env


_PROBES: dict[str, dict[str, Any]] = {}


def _probe_key(icd: Path) -> str | None:
    """The driver file version a probe answers for: the ICD json and the library it names, each by
    resolved path, size and mtime (a rebuilt or replaced driver is probed again); None when unreadable."""
    import hashlib

    lib, why = icd_library(icd)
    parts = []
    for path in (str(icd), None if why else lib):
        if path is None:
            return None
        try:
            real = os.path.realpath(path)
            st = os.stat(real)
        except OSError:
            if path == lib and "/" not in path:  # a bare soname: the loader's search path, not a file we can stat
                parts.append(path)
                continue
            return None
        parts.append(f"{real}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def probe_driver(icd: Path, timeout_s: float = 60.0) -> dict[str, Any]:
    """What the driver behind `icd` says it is: {"devices": [{name, driver_name, driver_info, api, type}]}
    or {"error": ...}. Asked through the Vulkan loader in a child process (the loader reads
    VK_ICD_FILENAMES once per process), once per ICD file and driver library version: a successful answer
    is kept in the bundlerun cache (vulkan_probes/), since creating a lavapipe instance costs ~0.4 s of
    every run (bench/bench_vulkan_llm.py); an error is never kept, so a broken driver is asked every time."""
    key = _probe_key(Path(icd))
    if key is None:
        if not os.path.exists(icd):
            return {"error": f"the Vulkan ICD {icd} does not exist"}
        return _ask_driver(Path(icd), timeout_s)
    if key in _PROBES:
        return _PROBES[key]
    stored = cache_dir("vulkan_probes") / f"{key}.json"
    try:
        result = load_json_bounded(stored, MAX_RECORD_BYTES)
        if not _probe_answer(result):
            raise ValueError("not a probe answer")
    except (OSError, ValueError, UnsafeFileError):
        result = _ask_driver(Path(icd), timeout_s)
        if "error" not in result:
            try:
                atomic_write_text(stored, json.dumps(result))
            except OSError:
                pass  # an unwritable cache only costs the next run another probe
    _PROBES[key] = result
    return result


def _probe_answer(data: Any) -> bool:
    """A stored probe is used only when it has the shape the child prints (else it is asked again)."""
    return (isinstance(data, dict) and set(data) == {"devices"} and isinstance(data["devices"], list)
            and bool(data["devices"]) and all(isinstance(d, dict) and all(isinstance(v, str) for v in d.values())
                                               for d in data["devices"]))


def _ask_driver(icd: Path, timeout_s: float) -> dict[str, Any]:
    env = runner_env(icd, default_shader_cache())
    try:
        proc = subprocess.run([sys.executable, "-c", "from bundlerun.targets.vulkan import _probe_child; _probe_child()"],
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              stdin=subprocess.DEVNULL, start_new_session=True)
        lines = proc.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else {
            "error": f"the driver probe died (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"}
    except subprocess.TimeoutExpired:
        return {"error": f"the driver did not answer within {timeout_s:g} s"}
    except ValueError:
        return {"error": f"the driver probe printed no JSON: {proc.stdout.strip()[-200:]}"}


def _probe_child() -> None:
    """(child process) vkCreateInstance + every physical device's properties and driver properties."""
    import ctypes

    c = ctypes
    try:
        vk = c.CDLL("libvulkan.so.1")
    except OSError as exc:
        print(json.dumps({"error": f"the Vulkan loader libvulkan.so.1 is missing ({exc}; apt-get install libvulkan1)"}))
        return

    class AppInfo(c.Structure):
        _fields_ = [("sType", c.c_uint32), ("pNext", c.c_void_p), ("pApplicationName", c.c_char_p),
                    ("applicationVersion", c.c_uint32), ("pEngineName", c.c_char_p), ("engineVersion", c.c_uint32),
                    ("apiVersion", c.c_uint32)]

    class InstanceInfo(c.Structure):
        _fields_ = [("sType", c.c_uint32), ("pNext", c.c_void_p), ("flags", c.c_uint32),
                    ("pApplicationInfo", c.POINTER(AppInfo)), ("enabledLayerCount", c.c_uint32),
                    ("ppEnabledLayerNames", c.c_void_p), ("enabledExtensionCount", c.c_uint32),
                    ("ppEnabledExtensionNames", c.c_void_p)]

    app = AppInfo(0, None, b"bundlerun", 1, b"bundlerun", 1, (1 << 22) | (1 << 12))  # Vulkan 1.1
    info = InstanceInfo(1, None, 0, c.pointer(app), 0, None, 0, None)
    inst = c.c_void_p()
    rc = vk.vkCreateInstance(c.byref(info), None, c.byref(inst))
    if rc != 0:
        why = {-9: "VK_ERROR_INCOMPATIBLE_DRIVER: no usable driver", -3: "VK_ERROR_INITIALIZATION_FAILED"}.get(rc, "")
        print(json.dumps({"error": f"vkCreateInstance returned {rc} {why}".strip()}))
        return
    count = c.c_uint32()
    vk.vkEnumeratePhysicalDevices(inst, c.byref(count), None)
    devices = (c.c_void_p * count.value)()
    vk.vkEnumeratePhysicalDevices(inst, c.byref(count), devices)
    found = []
    for dev in devices:
        driver = c.create_string_buffer(1024)  # VkPhysicalDeviceDriverProperties (536 B)
        c.memmove(driver, c.byref(c.c_uint32(1000196000)), 4)
        props2 = c.create_string_buffer(4096)  # VkPhysicalDeviceProperties2: sType, pNext, properties at 16
        c.memmove(props2, c.byref(c.c_uint32(1000059001)), 4)
        c.memmove(c.addressof(props2) + 8, c.byref(c.c_void_p(c.addressof(driver))), 8)
        vk.vkGetPhysicalDeviceProperties2(c.c_void_p(dev), props2)
        raw = props2.raw
        api, _drv, _vendor, _device, kind = (int.from_bytes(raw[16 + 4 * i:20 + 4 * i], "little") for i in range(5))
        name = raw[36:36 + 256].split(b"\0")[0].decode(errors="replace")
        found.append({"name": name, "driver_name": driver.raw[20:276].split(b"\0")[0].decode(errors="replace"),
                      "driver_info": driver.raw[276:532].split(b"\0")[0].decode(errors="replace"),
                      "api": f"{api >> 22}.{(api >> 12) & 0x3FF}.{api & 0xFFF}",
                      "type": {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}.get(kind, kind)})
    vk.vkDestroyInstance(inst, None)
    print(json.dumps({"devices": found} if found else {"error": "the driver loaded but reports no Vulkan device"}))


def default_shader_cache() -> Path:
    return cache_dir("mesa_shader_cache")


def shader_cache_dir(settings: VulkanSettings) -> Path:
    """Mesa's shader cache folder, created: the setting (the user's config or --target-opt only: a
    farm plan cannot set it) or the bundlerun cache's. A path that is not a folder is one ConfigError."""
    folder = Path(os.path.abspath(settings.shader_cache or default_shader_cache()))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"[targets.vulkan] shader_cache {folder}: cannot create the folder ({exc.strerror or exc})"
                          ) from None
    return folder


def driver_summary(probe: dict[str, Any]) -> str:
    if "error" in probe:
        return probe["error"]
    return "; ".join(f"{d['name']} ({d['driver_name']} {d['driver_info']}, Vulkan {d['api']}, {d['type']})"
                     for d in probe["devices"])


# ------------------------------------------------------------------ declaration


def _doctor(section: dict) -> list[Check]:
    settings = parse_settings(VulkanSettings, section, "targets.vulkan")
    icd = settings.icd or DRIVERS["lavapipe"]
    lib, why = icd_library(icd)
    rows = []
    if why:
        rows.append(Check("Vulkan ICD", False, f"{why} (apt-get install mesa-vulkan-drivers for lavapipe)", str(icd)))
    else:
        probe = probe_driver(icd)
        rows.append(Check("Vulkan driver", "error" not in probe, driver_summary(probe), f"{icd} -> {lib}"))
    if settings.runner is not None:
        rows.append(Check("Vulkan executor_runner", settings.runner.is_file(), "runner setting", str(settings.runner)))
        return rows
    runners = [r for r in cached_runners("executor_runner") if r.get("arch") == "x86_64" and "vulkan" in r.get("backends", [])]
    if not runners:
        rows.append(Check("Vulkan executor_runner", False, f"none built; {BUILD_HINT}"))
    for r in runners:
        rows.append(Check(f"Vulkan executor_runner {Path(r['dir']).name}", Path(str(r.get("binary"))).is_file(),
                          f"glslc {r.get('glslc', {}).get('version', '?')[:40]}, built in {r.get('build_seconds', '?')} s "
                          f"at {r.get('built_at', '?')}", r["dir"]))
    return rows


SPEC = TargetSpec(
    name="vulkan",
    schemes=("vulkan",),
    summary="ExecuTorch's executor_runner with the Vulkan delegate on a Vulkan driver (lavapipe; icd=PATH for another)",
    examples=("vulkan://lavapipe", "vulkan://lavapipe?icd=/path/to/lvp_icd.json"),
    default_backend="vulkan",
    settings=VulkanSettings,
    doctor=_doctor,
    command_settings=("icd", "runner", "debug_runner"),  # the ICD json names a driver library loaded here
    folder_settings=("shader_cache",),  # created and written by Mesa: a plan cannot place it (docs/security.md)
    capture=lambda *args: capture(*args),  # `capture` is defined at the end of this module
    elapsed=ElapsedClock("runner_case_wall_time", PerfKind.HOST_WALL,
                         "host wall clock of a case on executor_runner: one --server_mode trigger (input files read, "
                         "execute, outputs written), or where a case runs alone its whole process (Vulkan instance and "
                         "device creation, program load, execution, output files)"),
    repeat=True,
    # an LLM's sequence: every step on one served method (a runner with `server_testset`); else refused there
    stateful=True,
)


# ------------------------------------------------------------------ running


def run_runner(runner: Path, args: list[str], cwd: Path, env: dict[str, str], log_path: Path,
               timeout_s: float) -> tuple[int | None, float, str]:
    """Run the runner in `cwd`, stdout + stderr into `log_path`, in its own process group, bounded by
    `timeout_s` and always reaped: (exit status or None on timeout, seconds, log text)."""
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = start_program([str(runner), *args], "the Vulkan runner binary", cwd=cwd, stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        try:
            rc = wait_exit(proc, timeout_s)  # a pidfd: Popen.wait(timeout) polls every 50 ms, 2 s in a 32-case run
        finally:
            kill_process_group(proc, term_first=False)
    return rc, time.monotonic() - start, log_path.read_text(errors="replace")


# An uncaught C++ exception: the Vulkan delegate reports most load and execute problems with VK_THROW /
# VK_CHECK_COND (vkcompute::vkapi::Error), which nothing between it and the runner catches, so the
# runner ends in std::terminate -> SIGABRT with this on stderr instead of an ExecuTorch Error.
_UNCAUGHT_RE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'\s*\n\s*what\(\):\s*(?P<what>[^\n]*)")
_RAISED_AT_RE = re.compile(r"^Exception raised from (?P<fn>\S+) at (?P<file>\S+?):(?P<line>\d+): ")
# backends/vulkan/runtime/VulkanBackend.cpp:643-658: the payload's header, identifier and flatbuffer checks
_CORRUPT_DELEGATE_RE = re.compile(r"VkGraph FlatBuffer verification failed|VulkanDelegateHeader may be corrupt"
                                  r"|Vulkan Delegate Serialization Format version identifier")


# backends/vulkan/runtime/VulkanBackend.cpp:480: the partitioner delegated an op the runtime does not register
_VK_MISSING_OP_RE = re.compile(r"VulkanBackend\.cpp:\d+\].*Missing operator: (?P<op>\S+)")


def _uncaught(output: str) -> tuple[str, str] | None:
    """(exception type, "fn (file:line): message") of an uncaught C++ exception, or None."""
    m = _UNCAUGHT_RE.search(output)
    if not m:
        return None
    what = m.group("what").strip()
    at = _RAISED_AT_RE.match(what)
    if at:
        what = f"{at.group('fn')} ({Path(at.group('file')).name}:{at.group('line')}): {what[at.end():]}"
    return m.group("type"), what


def classify(output: str, exit_status: int | None, icd: Path, probe: dict[str, Any]) -> Failure | None:
    """executor_runner.classify, plus what only this lane's log says: the delegate is in the runner but
    the driver gave it no device (runtime/executor/method.cpp's `is not available`), a corrupt Vulkan
    payload, and the Vulkan runtime's uncaught exceptions (an unsupported dtype among them)."""
    if exit_status == 0:
        return None
    log = parse_runner_log(output)
    evidence = log.excerpt() or [ln.raw for ln in log.lines[-10:]]
    if _NOT_AVAILABLE in output:
        lib, why = icd_library(icd)
        said = driver_summary(probe) if probe else ""
        return Failure(FailureKind.TOOL_MISSING,
                       f"no usable Vulkan driver: the runner's VulkanBackend found no device through the ICD {icd}"
                       + (f" (library {lib})" if lib else f" ({why})") + (f"; the driver says: {said}" if said else ""),
                       evidence)
    thrown = _uncaught(output)
    if thrown is not None:
        kind_name, what = thrown
        lines = evidence + [ln for ln in output.splitlines() if "terminate called" in ln or "what():" in ln]
        if "VkDataType" in what or "ScalarType" in what or "dtype" in what.lower():
            return Failure(FailureKind.UNSUPPORTED, f"the Vulkan runtime does not support a dtype of this program: "
                           f"{what} (an uncaught {kind_name}: the runner aborted)", lines)
        return Failure(FailureKind.RUNNER_ABORT, f"the Vulkan runtime threw {kind_name}, which nothing caught: {what} "
                       "(the runner aborted)", lines)
    m = _VK_MISSING_OP_RE.search(output)
    if m:
        return Failure(FailureKind.MISSING_OPERATOR, f"the Vulkan delegate of this runner has no {m.group('op')} (the "
                       "program's Vulkan graph uses it: the partitioner that lowered it delegates an op this runtime "
                       "does not implement); the runner aborted", evidence)
    m = _CORRUPT_DELEGATE_RE.search(output)
    if m:
        line = next((ln.raw.strip() for ln in log.lines if m.group(0) in ln.raw), m.group(0))
        return Failure(FailureKind.BAD_BUNDLE, f"the program's Vulkan payload is corrupt: {line}", evidence)
    return executor_runner.classify(output, exit_status)


@dataclass
class VulkanTarget(TargetBase):
    url: str
    driver: str
    settings: VulkanSettings

    @property
    def icd(self) -> Path:
        return self.settings.icd or DRIVERS[self.driver]

    def runner(self) -> Path:
        # a build with bundled serving first (it runs everything an older build runs, and LLM sequences)
        runner = self.settings.runner or find_runner("executor_runner", "binary", server_testset=True, **RUNNER_FLAGS) \
            or find_runner("executor_runner", "binary", **RUNNER_FLAGS)
        if runner is None:
            raise TargetError(f"no Vulkan executor_runner in the build cache; {BUILD_HINT}")
        return runner_binary(runner, "the Vulkan", BUILD_HINT)

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        runner = self.runner()
        lib, why = icd_library(self.icd)
        if why:
            raise TargetError(f"{why}; lavapipe: apt-get install mesa-vulkan-drivers; another driver: icd=PATH")
        probe = probe_driver(self.icd)
        shader_cache = shader_cache_dir(self.settings)
        env = runner_env(self.icd, shader_cache)
        work = Path(options.work_dir) / "vulkan"
        run = TargetRun(self.url, [], info={"runner": str(runner), "icd": str(self.icd), "driver_library": lib,
                                             "driver": probe, "shader_cache": str(shader_cache),
                                             "timing": "lavapipe runs the GPU's work on this CPU: not GPU latency"})
        if "error" in probe:
            run.warnings.append(f"the Vulkan driver probe failed: {probe['error']} (ICD {self.icd})")
        executions = executor_runner.executions_for(getattr(options, "repeat", 1), self.settings.num_executions)
        if executions > 1:
            run.info.update(repeat=executions - 1, warmup=1, num_executions=executions)
        # the patched server mode (a case index per trigger) for bundles whose sequences carry state; every
        # other bundle is served as before, its inputs as --inputs files (the zoo's tested path)
        stateful = bool(server.stateful_methods(bundle))
        bundled = stateful and runner_meta(runner).get("server_testset") is True
        if stateful and not bundled:
            raise TargetError(f"this bundle's sequences carry a KV cache from step to step and the Vulkan runner {runner} "
                              "cannot serve them on one loaded method (built without bundled serving, "
                              "executor_runner-server-testset.patch); rebuild it with bash firmware_scripts/vulkan/"
                              "build_vulkan_runner.sh", kind="bad-config")
        with responsive_waits():  # the judge-ahead thread must not delay each step (targets/gil_handoff.py)
            server.run_cases(
                bundle, options, run,
                server.own_process_reason(self.settings.server, executions, self.settings.etdump,
                                          self.settings.print_output),
                lambda method, indices: server.serve(bundle, method, indices, [str(runner)], work, options.case_timeout_s,
                                                     lambda out, code: classify(out, code, self.icd, probe),
                                                     "the Vulkan runner", lambda r: run.record(r, options), env=env,
                                                     bundled=bundled, meanwhile=options.meanwhile),
                lambda method, index: self._case(bundle, method, index, runner, env, probe, work, options.case_timeout_s,
                                                 executions),
                bundled=bundled)
        if bundled:
            run.info["served_inputs"] = "bundled test case per trigger (one loaded method: mutable buffers kept)"
        return run

    def _case(self, bundle: Bundle, method: str, index: int, runner: Path, env: dict[str, str], probe: dict,
              work: Path, timeout_s: float, executions: int) -> CaseResult:
        from bundlerun.bundles.bpte import serialize_bundle  # start-up: not loaded by `bundlerun --help`

        folder = work / f"{safe_name(method)}-{index}"
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "out").mkdir(parents=True)
        # the scratch input of one process: a plain write (write_bundle's durable, fsync'd write is for results)
        (folder / "model.bpte").write_bytes(serialize_bundle(bundle.single_case(method, index)))
        etdump = "out/model.etdump" if self.settings.etdump else None
        args = executor_runner.runner_args("model.bpte", method, "out/output", print_output=self.settings.print_output,
                                           etdump=etdump, num_executions=executions)
        log_path = folder / "runner.log"
        rc, elapsed, output = run_runner(runner, args, folder, env, log_path, timeout_s)
        base = dict(method=method, case_index=index, log_path=str(log_path), elapsed_s=elapsed,
                    device_verdict=executor_runner.device_verdict(output),
                    perf=executor_runner.perf_figures(output, simulated=True))
        return executor_runner.case_result(bundle, method, index, folder, rc, output, timeout_s,
                                           lambda out, code: classify(out, code, self.icd, probe), base,
                                           "the Vulkan runner", etdump)


def runner_meta(runner: Path) -> dict:
    """The runner.json beside a cached runner binary ({} for a runner built elsewhere: no bundled serving)."""
    meta = read_record(Path(runner).parent)
    return meta if meta is not None and Path(str(meta.get("binary", ""))) == Path(runner) else {}


def create(url: TargetURL, config: dict) -> VulkanTarget:
    driver = url.rest.lower()
    if driver not in DRIVERS:
        raise TargetError(f"unknown Vulkan driver {driver!r} in {url.raw}; known: "
                          + ", ".join(f"vulkan://{d}" for d in DRIVERS) + " (another driver build: ?icd=PATH)",
                          kind=FailureKind.BAD_CONFIG)
    settings = parse_settings(VulkanSettings, {**config, **url.query}, "targets.vulkan")
    return VulkanTarget(url.raw, driver, settings)


# ------------------------------------------------------------------ bundlerun debug


def capture(url: str, config: dict, bundle_path: Path, method: str, case: int, work_dir: Path, timeout_s: float,
            debug_buffer_mb: int):
    """Every intermediate output of `method`[`case`] on this driver: bundlerun's debug runner (built with
    the same Vulkan libraries as the runner, firmware_scripts/android/debug_runner/) with an ETDump and
    a debug buffer; read like the aarch64 lanes' (targets/android/intermediates.py)."""
    from bundlerun.bundles.bpte import read_bundle  # start-up: not loaded by `bundlerun --help`
    from bundlerun.targets.android import intermediates as dbg  # start-up: not loaded by `bundlerun --help`
    from bundlerun.targets.intermediates import IntermediatesFailed  # start-up: not loaded by `bundlerun --help`

    work_dir, bundle_path = Path(work_dir), Path(bundle_path)
    try:
        target = create(parse_target_url(url), dict(config or {}))
        bundle = read_bundle(bundle_path)
    except BundlerunError as exc:
        raise IntermediatesFailed(f"{url}: {exc}") from None
    try:
        cases = len(bundle.suite(method).test_cases)
    except KeyError:
        raise IntermediatesFailed(f"{url}: the bundle has no method {method!r}") from None
    if not 0 <= case < cases:
        raise IntermediatesFailed(f"{url}: {method} has cases 0-{cases - 1}, not {case}")
    s = target.settings
    size = dbg._buffer_size(s.debug_buffer_bytes, debug_buffer_mb, url)
    runner = s.debug_runner or find_runner("executor_runner", "debug_runner", **RUNNER_FLAGS)
    hint = BUILD_HINT.replace('set runner', 'set debug_runner')
    if runner is None:
        raise IntermediatesFailed(f"{url}: no Vulkan debug runner; {hint}")
    try:
        runner = runner_binary(runner, "the Vulkan debug", hint)
    except BundlerunError as exc:
        raise IntermediatesFailed(f"{url}: {exc}") from None
    lib, why = icd_library(target.icd)
    if why:
        raise IntermediatesFailed(f"{url}: {why}")
    probe = probe_driver(target.icd)
    try:
        shader_cache = shader_cache_dir(s)
    except BundlerunError as exc:
        raise IntermediatesFailed(f"{url}: {exc}") from None
    folder = work_dir / "vulkan" / f"{safe_name(method)}-{case}"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / dbg.OUT).mkdir(parents=True)
    log = folder / "runner.log"
    args = dbg.debug_runner_args(method, case, size, model=str(bundle_path.resolve()))
    rc, elapsed, output = run_runner(Path(runner), args, folder, runner_env(target.icd, shader_cache), log, timeout_s)
    if rc not in (None, 0) and _NOT_AVAILABLE in output:
        raise IntermediatesFailed(f"{url}: {classify(output, rc, target.icd, probe).message} (log: {log})")
    desc = "bundlerun's debug runner (Vulkan)"
    dbg._check_run(url, method, case, output, rc, timeout_s, size, desc, log)
    notes = [f"runner: {runner} on {driver_summary(probe)} (ICD {target.icd}), debug buffer {dbg._size(size)}, "
             f"{elapsed:.1f} s", "inside a Vulkan delegate call nothing is visible: the delegate logs no "
             "intermediate outputs, so each call's outputs are one item"]
    return dbg._result(url, bundle, method, case, folder / dbg.OUT, size, desc, notes)
