"""`bundlerun debug` on `qemu-user://aarch64` and on Android (`adb://`, `adb+tcp://`, `adb+usb://`):
every intermediate output of one case from a real ExecuTorch runtime built from source.

ExecuTorch's stock executor_runner sets no debug buffer (its `--etdump_path` ETDump holds timings
only), so these lanes run **bundlerun's debug runner** (firmware_scripts/android/debug_runner/,
built by `build_executor_runner.sh --toolchain gnu|ndk --debug-runner` against the same ExecuTorch
libraries as the executor_runner). Its command line mirrors qnn_executor_runner's debug flags:

    debug_runner --model_path model.bpte --method_name M --testset_idx CASE
                 --etdump_path outputs/etdump.etdp --dump_intermediate_outputs
                 --debug_output_path outputs/debug_output.bin --debug_buffer_size BYTES
                 --output_folder_path outputs

and writes the ETDump, the used bytes of the debug buffer and `outputs/output_0_<i>.raw` (the raw
bytes of tensor output i; dtype and shape come from the bundle). With the adb profile
`qnn-executor-runner` the device runs Qualcomm's qnn_executor_runner with its own flags
(`--dump_intermediate_outputs --debug_output_path --etdump_path --debug_buffer_size`, plain .pte +
input_list.txt): the same files come back, the same code reads them.

    qemu-user://aarch64   the debug runner runs here under qemu-aarch64 (targets/qemu_user.py's
                          helpers), in work_dir/qemu-user/<method>-<case>/
    adb://, adb+tcp://    the bundle and the runner go through the target's own transport and
                          content-addressed device cache (targets/android/), the runner runs in a
                          per-case device folder <workspace>/debug/<method>-<case>, the ETDump +
                          debug buffer + outputs are pulled back; the folder is removed always

Runner: `debug_runner=PATH` (`--target-opt` or `[targets.adb]` / `[targets.qemu-user]`; on a real
Android device an NDK build: `build_executor_runner.sh --executorch DIR --debug-runner`), else the
cached gnu build for the arch (qemu-user) or the device's ABI (`ro.product.cpu.abi`), built on
first use. The debug buffer is `--debug-buffer-mb` (or `debug_buffer_bytes=N`). When it is too
small the debug runner finishes the method counting what it would need and exits 3 with
`bundlerun debug buffer overflow: ... need N bytes`; qnn_executor_runner's ETDumpGen aborts with
`write_tensor_or_return_error() failed to write tensor to debug buffer`: both are one-line
IntermediatesFailed naming the size and saying to pass a larger --debug-buffer-mb.
"""

from __future__ import annotations

import math
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from bundlerun.bundles.errors import BundlerunError
from bundlerun.targets.intermediates import IntermediateRun, IntermediatesFailed, keep_last_run, parse_etdump
from bundlerun.targets.remote.transport import MISSING_FILE
from bundlerun.bundles.fileio import atomic_write_bytes
from bundlerun.targets import parse_target_url
from bundlerun.targets.android import profiles
from bundlerun.targets.base import raw_outputs_from_files, safe_name
from bundlerun.targets.et_runner import executor_runner
from bundlerun.targets.qemu_user import ARCHES, QemuUserSettings, qemu_for, run_under_qemu
from bundlerun.targets.remote.device_cache import Artifact, DeviceCache
from bundlerun.targets.remote.transport import TransportError, check_shell
from bundlerun.targets.runner_cache import find_runner, read_record, run_build
from bundlerun.targets.settings import parse_settings

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "firmware_scripts" / "android" / "build_executor_runner.sh"
RUNNER_KIND = "debug_runner"
GRANULARITY = ("every kernel call and every delegate call (the device runtime's ETDump + debug buffer: "
               "{runner})")
OUT = "outputs"
ETDUMP = f"{OUT}/etdump.etdp"
DEBUG_OUTPUT = f"{OUT}/debug_output.bin"
MAX_BUFFER = 2**31 - 1  # --debug_buffer_size is an int32 flag in both runners
LARGER = "pass a larger --debug-buffer-mb"
ABI_ARCH = {"arm64-v8a": "aarch64", "x86_64": "x86_64"}

# debug_runner.cpp, when the buffer ran full (it finishes the method counting, then exits 3)
_OVERFLOW_RE = re.compile(r"bundlerun debug buffer overflow: --debug_buffer_size (?P<size>\d+) bytes is too small; "
                          r"the intermediate outputs of this case need (?P<need>\d+) bytes")
# ExecuTorch's ETDumpGen / BufferDataSink (qnn_executor_runner): abort at the first tensor that does not fit
_STOCK_FULL_RE = re.compile(r"failed to write tensor to debug buffer|Ran out of space to store intermediate outputs")


def _size(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n} B = {n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n} B = {n >> 10} KiB"
    return f"{n} B"


def debug_runner_args(method: str, case: int, buffer_size: int, model: str = "model.bpte",
                      prefix: tuple[int, ...] = ()) -> list[str]:
    """bundlerun's debug runner: one bundled case (--testset_idx) with ETDump + debug buffer, after the
    cases of `prefix` (--prefix_testset_idx: a sequence's earlier steps) on the same loaded method."""
    args = ["--model_path", model, "--method_name", method, "--testset_idx", str(int(case))]
    if prefix:
        args += ["--prefix_testset_idx", ",".join(str(int(c)) for c in prefix)]
    return args + ["--etdump_path", ETDUMP, "--dump_intermediate_outputs", "--debug_output_path", DEBUG_OUTPUT,
                   "--debug_buffer_size", str(int(buffer_size)), "--output_folder_path", OUT]


PREFIX_FLAG = "--prefix_testset_idx"
_UNKNOWN_FLAG_RE = re.compile(r"unknown command line flag '?prefix_testset_idx")


def _check_prefix_support(url: str, runner: Path, prefix: tuple[int, ...]) -> None:
    """A cached debug runner says its flags in runner.json: one built before --prefix_testset_idx existed
    is refused in one line (a decode step on a fresh cache is not the step that failed)."""
    if not prefix:
        return
    meta = read_record(Path(runner).parent) or {}
    flags = (meta.get("cli") or {}).get("flags") if meta.get("kind") == RUNNER_KIND else None
    if flags is not None and PREFIX_FLAG not in flags:
        raise IntermediatesFailed(f"{url}: the debug runner {runner} cannot replay a sequence's earlier steps (its "
                                  f"runner.json lists no {PREFIX_FLAG}); rebuild it: firmware_scripts/android/"
                                  "build_executor_runner.sh --toolchain gnu --debug-runner")


def qnn_debug_args(method_index: int, buffer_size: int) -> list[str]:
    """qnn_executor_runner's own debug flags on top of its usual command line (one inference)."""

    args = profiles.qnn_runner_args(method_index, ETDUMP)
    return args + ["--dump_intermediate_outputs", "--debug_output_path", DEBUG_OUTPUT,
                   "--debug_buffer_size", str(int(buffer_size))]


def cached_debug_runner(arch: str, log_dir: Path, build: bool = True, timeout_s: float = 7200.0) -> Path:
    """The debug runner built from ExecuTorch's sources for `arch` (content-addressed cache, matching
    the current debug_runner sources): found by `build_executor_runner.sh --debug-runner --cached-only`,
    else built now (minutes: the ExecuTorch libraries are compiled once per cache key). Without the
    script (an installed wheel) the newest cached build of that arch is used."""

    if not BUILD_SCRIPT.is_file():
        found = find_runner(RUNNER_KIND, "binary", arch=arch)
        if found is None:
            raise IntermediatesFailed(f"no {arch} debug runner in the build cache and no {BUILD_SCRIPT.name} to build "
                                      "one: build it with firmware_scripts/android/build_executor_runner.sh --toolchain "
                                      f"gnu --arch {arch} --debug-runner, or set debug_runner=PATH")
        return found
    base = ["bash", str(BUILD_SCRIPT), "--toolchain", "gnu", "--arch", arch, "--debug-runner"]
    probe = subprocess.run(base + ["--cached-only"], capture_output=True, text=True, timeout=300)
    if probe.returncode == 0:
        return _runner_binary(Path(probe.stdout.strip().splitlines()[-1]))
    if probe.returncode != 3 or not build:
        reason = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
        raise IntermediatesFailed(f"no {arch} debug runner: {reason} (build it: {' '.join(base[1:])})")

    log = log_dir / f"build_debug_runner-{arch}.log"
    cmd = base + ["--jobs", "2"]
    print(f"bundlerun debug: building the {arch} debug runner from ExecuTorch's sources ({' '.join(cmd[1:])}); "
          f"log: {log}", file=sys.stderr, flush=True)
    folder, why = run_build(cmd, log, timeout_s, "build_executor_runner.sh")
    if folder is None:
        raise IntermediatesFailed(f"building the {arch} debug runner failed: {why} (log: {log})")
    return _runner_binary(folder)


def _runner_binary(folder: Path) -> Path:
    meta = read_record(folder) or {}
    binary = Path(str(meta.get("binary", "")))
    if meta.get("kind") != RUNNER_KIND or not binary.is_file():
        raise IntermediatesFailed(f"{folder}/runner.json does not describe a built debug runner")
    return binary


def _buffer_size(configured: int | None, debug_buffer_mb: int, url: str) -> int:
    size = int(configured) if configured is not None else int(debug_buffer_mb) << 20
    if not 1 <= size <= MAX_BUFFER:
        raise IntermediatesFailed(f"{url}: the debug buffer must be 1 B..{MAX_BUFFER} B (an int32 runner flag), "
                                  f"not {size} B")
    return size


def _check_run(url: str, method: str, case: int, output: str, exit_status: int | None, timeout_s: float,
               buffer_size: int, runner: str, log: Path) -> None:
    """IntermediatesFailed, one line, when the run produced no usable ETDump + outputs."""

    where = f" (log: {log})"
    if _UNKNOWN_FLAG_RE.search(output):  # a debug_runner=PATH built before the flag existed
        raise IntermediatesFailed(f"{url}: {runner} does not know {PREFIX_FLAG} (built before it existed), so it "
                                  "cannot replay a sequence's earlier steps; rebuild it from firmware_scripts/android/"
                                  f"debug_runner{where}")
    if exit_status is None:
        raise IntermediatesFailed(f"{url}: {runner} did not finish {method}[{case}] within {timeout_s:g} s; it was "
                                  f"killed{where}")
    m = _OVERFLOW_RE.search(output)
    if m:
        need = int(m.group("need"))
        raise IntermediatesFailed(
            f"{url}: the debug buffer ({_size(buffer_size)}) is too small for every intermediate output of "
            f"{method}[{case}]: they need {need} B; {LARGER} (at least {max(1, math.ceil(need / (1 << 20)))}){where}")
    if _STOCK_FULL_RE.search(output):
        raise IntermediatesFailed(
            f"{url}: the debug buffer ({_size(buffer_size)}) is too small for every intermediate output of "
            f"{method}[{case}] (ETDumpGen aborted: write_tensor_or_return_error() failed to write tensor to debug "
            f"buffer); {LARGER}{where}")
    problem = executor_runner.classify(output, exit_status)
    if problem is not None:
        raise IntermediatesFailed(f"{url}: {runner} failed on {method}[{case}]: {problem.message}{where}")


def _read_outputs(bundle, method: str, case: int, folder: Path) -> list[np.ndarray]:
    expected = bundle.suite(method).test_cases[case].expected_outputs
    slots = [k for k, v in enumerate(expected) if v.kind == "tensor"]
    layout = [(expected[k].scalar_type, list(expected[k].sizes)) for k in slots]
    raws, err = raw_outputs_from_files([folder / f"output_0_{k}.raw" for k in slots], layout)
    if err:
        raise IntermediatesFailed(f"{method}[{case}]: {err}")
    return [r.to_array() for r in raws]


def _result(url: str, bundle, method: str, case: int, folder: Path, buffer_size: int, runner: str,
            notes: list[str], prefix: tuple[int, ...] = ()) -> IntermediateRun:
    etdump, debug = folder / "etdump.etdp", folder / "debug_output.bin"
    if not etdump.is_file():
        raise IntermediatesFailed(f"{url}: {runner} wrote no ETDump for {method}[{case}]")
    if prefix:  # one ETDump run per executed case: keep the captured step's (the Inspector merges runs)
        keep_last_run(etdump)
        notes = [f"replayed {len(prefix)} earlier step(s) of the sequence (cases {', '.join(map(str, prefix))}) on "
                 f"the same loaded method before case {case}", *notes]
    try:
        outputs = _read_outputs(bundle, method, case, folder)
    except IntermediatesFailed as exc:
        raise IntermediatesFailed(f"{url}: {exc}") from None
    import warnings

    with warnings.catch_warnings():  # torch.frombuffer on the read-only buffer the Inspector slices
        warnings.simplefilter("ignore", UserWarning)
        items, parse_notes = parse_etdump(etdump, debug if debug.is_file() else None, _size(buffer_size), LARGER)
    if not items:
        raise IntermediatesFailed(f"{url}: the ETDump of {method}[{case}] holds no operator outputs ({runner}: was it "
                                  "run with --dump_intermediate_outputs and a debug buffer?)")
    return IntermediateRun(url, method, case, GRANULARITY.format(runner=runner), items, outputs,
                           notes + parse_notes)


# ------------------------------------------------------------------ qemu-user://


def _capture_qemu_user(url: str, config: dict, bundle, bundle_path: Path, method: str, case: int, work_dir: Path,
                       timeout_s: float, debug_buffer_mb: int, prefix: tuple[int, ...] = ()) -> IntermediateRun:
    parsed = parse_target_url(url)
    arch = parsed.rest.lower()
    if arch not in ARCHES:
        raise IntermediatesFailed(f"{url}: unknown architecture {arch!r}; known: "
                                  + ", ".join(f"qemu-user://{a}" for a in ARCHES))
    settings = parse_settings(QemuUserSettings, {**config, **parsed.query}, "targets.qemu-user")
    size = _buffer_size(settings.debug_buffer_bytes, debug_buffer_mb, url)
    qemu = qemu_for(arch, settings.qemu)
    if settings.debug_runner is not None:
        runner = Path(settings.debug_runner)
        if not runner.is_file():
            raise IntermediatesFailed(f"{url}: debug_runner {runner} does not exist (build one with "
                                      f"firmware_scripts/android/build_executor_runner.sh --toolchain gnu --arch {arch} "
                                      "--debug-runner, or leave debug_runner unset: bundlerun debug builds it)")
        how = "debug_runner"
    else:
        runner, how = cached_debug_runner(arch, work_dir), "built from ExecuTorch's sources"
    _check_prefix_support(url, runner, prefix)
    folder = work_dir / "qemu-user" / f"{safe_name(method)}-{case}"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / OUT).mkdir(parents=True)
    args = debug_runner_args(method, case, size, model=str(Path(bundle_path).resolve()), prefix=prefix)
    log = folder / "runner.log"
    rc, elapsed, output = run_under_qemu(qemu, runner, args, folder, log, timeout_s, cpu=settings.cpu)
    desc = f"the {arch} debug runner"
    _check_run(url, method, case, output, rc, timeout_s, size, desc, log)
    notes = [f"runner: bundlerun's debug runner {runner} ({how}), {arch} under {qemu}, debug buffer {_size(size)}, "
             f"{elapsed:.1f} s"]
    return _result(url, bundle, method, case, folder / OUT, size, "bundlerun's debug runner under qemu-user", notes,
                   prefix)


# ------------------------------------------------------------------ adb://, adb+tcp://, adb+usb://


def _device_arch(target) -> tuple[str, str | None]:
    """(arch of the gnu debug runner to push, a note when it had to be assumed)."""
    abi = target._device_prop("ro.product.cpu.abi")
    if abi is None:
        return "aarch64", "the device reports no ro.product.cpu.abi: assumed arm64-v8a"
    arch = ABI_ARCH.get(abi.strip())
    if arch is None:
        raise IntermediatesFailed(f"{target.url}: no gnu debug runner for the device ABI {abi} (only "
                                  f"{', '.join(ABI_ARCH)}): build one with the NDK (firmware_scripts/android/"
                                  "build_executor_runner.sh --executorch DIR --debug-runner) and set debug_runner=PATH")
    return arch, None


def _capture_adb(url: str, config: dict, bundle, bundle_path: Path, method: str, case: int, work_dir: Path,
                 timeout_s: float, debug_buffer_mb: int, prefix: tuple[int, ...] = ()) -> IntermediateRun:
    from bundlerun.targets import open_target  # late: looked up at call time (tests replace it)
    from bundlerun.targets.android.target import _Budget, _safe  # start-up: loads flatbuffers on use

    target = open_target(url, config)
    c = target.cfg
    size = _buffer_size(c.debug_buffer_bytes, debug_buffer_mb, url)
    qnn = c.profile == "qnn-executor-runner"
    if qnn and prefix:  # one inference per qnn_executor_runner call: no way to keep the method across steps
        raise IntermediatesFailed(f"{url}: the qnn-executor-runner profile runs one inference per process and cannot "
                                  f"replay the {len(prefix)} earlier step(s) of case {case}'s sequence first; a decode "
                                  "step on a fresh KV cache is not the step that failed")
    if c.debug_runner is not None and not Path(c.debug_runner).is_file():
        raise IntermediatesFailed(f"{url}: debug_runner {c.debug_runner} does not exist (build one for the device: "
                                  "firmware_scripts/android/build_executor_runner.sh --executorch DIR --debug-runner "
                                  "with the NDK, or --toolchain gnu --debug-runner; or leave debug_runner unset)")
    retries = c.retries if c.retries is not None else 1
    local = work_dir / "android" / f"{_safe(method)}-{case}"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    run_dir = posixpath.join(c.workspace, "debug", f"{_safe(method)}-{case}")
    cache = DeviceCache(target.transport, c.workspace, c.command_timeout_s, c.transfer_timeout_s)
    budget = _Budget(retries)
    notes: list[str] = []
    stage = "connecting"
    created = False
    try:
        target._with_retries(retries, target.transport.connect)
        stage = "deploying the runner and the bundle"
        if qnn:
            htp = profiles.resolve_htp_arch(c, None if (c.htp_arch or c.soc_model) else target._device_prop("ro.soc.model"))
            if c.debug_runner is not None:
                c.runner = c.debug_runner
            arts = target._base_artifacts("qnn_executor_runner", profiles.qnn_libraries(c, htp))
            name = "qnn_executor_runner"
            atomic_write_bytes(local / "model.pte", bytes(bundle.program))
            arts.append(Artifact(local / "model.pte", "model.pte"))
            files = []
            for j, value in enumerate(bundle.suite(method).test_cases[case].inputs):
                if value.kind == "tensor":
                    atomic_write_bytes(local / f"input_0_{j}.raw", bytes(value.data))
                    arts.append(Artifact(local / f"input_0_{j}.raw", f"input_0_{j}.raw"))
                    files.append(f"input_0_{j}.raw")
            atomic_write_bytes(local / "input_list.txt", (" ".join(files) + "\n").encode())
            arts.append(Artifact(local / "input_list.txt", "input_list.txt"))
            methods = [s.method_name for s in bundle.method_test_suites]
            args = qnn_debug_args(methods.index(method), size)
            env = {"LD_LIBRARY_PATH": ".", "ADSP_LIBRARY_PATH": ".", **c.env}
            runner_desc = f"qnn_executor_runner {c.runner} (HTP v{htp})"
            desc = "qnn_executor_runner --dump_intermediate_outputs"
        else:
            if c.debug_runner is not None:
                runner, how = Path(c.debug_runner), "debug_runner"
            else:
                arch, assumed = _device_arch(target)
                if assumed:
                    notes.append(assumed)
                runner, how = cached_debug_runner(arch, work_dir), f"{arch}, built from ExecuTorch's sources"
            _check_prefix_support(url, runner, prefix)
            name = "debug_runner"
            arts = [Artifact(runner, name)] + [Artifact(Path(p), Path(p).name) for p in c.libraries]
            arts.append(Artifact(Path(bundle_path), "model.bpte"))
            args = debug_runner_args(method, case, size, prefix=prefix)
            env = {"LD_LIBRARY_PATH": ".", **c.env}
            runner_desc = f"bundlerun's debug runner {runner} ({how})"
            desc = "bundlerun's debug runner"
        paths = target._with_retries(retries, lambda: cache.ensure(arts))
        stage = "preparing the device folder"
        created = True
        cache.prepare_run_dir(run_dir, paths, [OUT])
        stage = "running the case"
        target._logcat("-c")
        ex = target._exec(profiles.runner_command(run_dir, name, args, env), timeout_s, run_dir)
        logcat = target._logcat("-d")
        log = Path(target._save_log(local / "runner.log", ex, logcat))
        _check_run(url, method, case, ex.output + "\n" + (logcat or ""), None if ex.timed_out else ex.exit_status,
                   timeout_s, size, desc, log)
        stage = "pulling the ETDump, the debug buffer and the outputs"
        expected = bundle.suite(method).test_cases[case].expected_outputs
        wanted = [posixpath.basename(ETDUMP), posixpath.basename(DEBUG_OUTPUT)]
        wanted += [f"output_0_{k}.raw" for k, v in enumerate(expected) if v.kind == "tensor"]
        for fname in wanted:
            try:
                target._pull(posixpath.join(run_dir, OUT, fname), local / fname, budget)
            except TransportError as exc:
                if exc.kind != MISSING_FILE:
                    raise
                raise IntermediatesFailed(f"{url}: {desc} wrote no {OUT}/{fname} for {method}[{case}] (log: {log})") \
                    from None
        notes.append(f"runner: {runner_desc} on {target.transport.description}, device folder {run_dir} (removed), "
                     f"debug buffer {_size(size)}, {ex.elapsed_s:.1f} s")
        try:
            cache.prune(int(c.cache_max_mb * 1024 * 1024), cache.used)
        except TransportError:
            pass  # housekeeping only
    except BaseException as exc:
        cleaned = _remove_run_dir(target, run_dir) if created else None
        target.transport.close()
        where = ("" if cleaned is None else f"; device folder {run_dir} removed" if cleaned
                 else f"; the device folder {run_dir} could not be removed")
        if isinstance(exc, TransportError):
            raise IntermediatesFailed(f"{url}: lost the device while {stage}: {exc}{where}") from None
        if isinstance(exc, IntermediatesFailed):
            raise IntermediatesFailed(f"{exc}{where}") from None
        if isinstance(exc, BundlerunError):
            raise IntermediatesFailed(f"{url}: {exc}{where}") from None
        raise
    if not _remove_run_dir(target, run_dir):
        notes.append(f"the device folder {run_dir} could not be removed")
    target.transport.close()
    return _result(url, bundle, method, case, local, size, desc, notes, prefix)


def _remove_run_dir(target, run_dir: str) -> bool:
    """The per-case device folder goes whatever happened; after a cut link, on a fresh connection."""
    import shlex

    for attempt in range(2):
        try:
            if attempt:
                target.transport.reconnect()
            check_shell(target.transport, f"rm -rf {shlex.quote(run_dir)}", target.cfg.command_timeout_s,
                        "removing the debug run folder")
            return True
        except TransportError:
            continue
    return False


# ------------------------------------------------------------------ entry point


def capture(url: str, config: dict, bundle_path: Path, method: str, case: int, work_dir: Path,
            timeout_s: float, debug_buffer_mb: int, prefix: tuple[int, ...] = ()) -> IntermediateRun:
    """Run `method`[`case`] of the bundle with every intermediate output on qemu-user:// or adb://, after
    the cases of `prefix` (a stateful sequence's earlier steps) on the same loaded method."""
    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers on use

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    bundle_path = Path(bundle_path)
    bundle = read_bundle(bundle_path)
    try:
        suite = bundle.suite(method)
    except KeyError:
        raise IntermediatesFailed(f"{url}: the bundle has no method {method!r}") from None
    if not 0 <= case < len(suite.test_cases):
        raise IntermediatesFailed(f"{url}: {method} has cases 0-{len(suite.test_cases) - 1}, not {case}")
    prefix = tuple(int(c) for c in prefix)
    if any(not 0 <= c < len(suite.test_cases) for c in prefix):
        raise IntermediatesFailed(f"{url}: the prefix names cases {method} does not have (0-{len(suite.test_cases) - 1})")
    try:
        family = parse_target_url(url).family
        lane = _capture_qemu_user if family == "qemu-user" else _capture_adb
        return lane(url, dict(config or {}), bundle, bundle_path, method, case, work_dir, timeout_s, debug_buffer_mb,
                    prefix)
    except IntermediatesFailed:
        raise
    except BundlerunError as exc:  # a bad option, a missing tool
        raise IntermediatesFailed(f"{url}: {exc}") from None


__all__ = ["capture", "cached_debug_runner", "debug_runner_args", "qnn_debug_args"]
