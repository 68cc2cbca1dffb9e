"""`bundlerun debug` on the Arm runner lanes: every intermediate output of one case from
ExecuTorch's own arm_executor_runner (examples/arm/executor_runner/arm_executor_runner.cpp,
compiled unmodified) built with the event tracer and a debug buffer.

    qemu://mps3-an547[?mode=uart]     the runner built from source by
                                      firmware_scripts/arm/build_qemu_runner.sh --etdump
                                      --ops-from BUNDLE --debug-buffer-size (--debug-buffer-mb),
                                      found in the content-addressed cache or built on first use
    fvp://PLATFORM/PROCESSOR          the FVP's configured runner (or `debug_elf`), which must
                                      have been built with ETDump (ExecuTorch's
                                      build_executor_runner.sh --etdump)
    serial+socket://, serial://       the board's runner; its ETDump block comes over the UART

`debug_elf=PATH` (`--target-opt debug_elf=PATH` or `[targets.<scheme>] debug_elf`) names the
debug runner: qemu/fvp run it in place of `runner_elf` (fvp uart: `uart_runner_elf`); serial
substitutes it as `{elf}` in its flash / launch command.

The ONE case runs through the lane's own target (targets/et_runner/protocol.py: a per-case working
directory holding a bundle whose case 0 is that case, the host wall-clock bound, the simulator's
process group always reaped). What the runner does with ET_EVENT_TRACER_ENABLED +
ET_DUMP_INTERMEDIATE_OUTPUTS (+ ET_DEBUG_BUFFER_SIZE, taken from its method pool): in semihosting
mode it writes `etdump.bin` and `debug_buffer.bin` into its cwd (the case folder) after the run and
before its BundleIO abort; in UART mode it prints them base64-encoded between `#[RUN THIS]` and
`#[END]` (decoded by targets.et_runner.log.etdump_block_files). Both are read with ExecuTorch's
Inspector (targets.intermediates.parse_etdump). When the buffer runs full, ETDumpGen's
log_evalue aborts the runner (`write_tensor_or_return_error() failed to write tensor to debug
buffer`): that is a one-line IntermediatesFailed naming the buffer size and how to rebuild it
larger, never a partial table. A runner that writes no ETDump says to build one with --etdump.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from bundlerun.bundles.errors import BundlerunError, TargetError
from bundlerun.targets.intermediates import IntermediateRun, IntermediatesFailed, IntermediatesUnsupported, parse_etdump
from bundlerun.targets.base import Verdict
from bundlerun.bundles.backends.common import quiet_framework_logs
from bundlerun.targets import parse_target_url
from bundlerun.targets.arm.fvp import _lookup, parse_variant
from bundlerun.targets.arm.qemu import debug_runner
from bundlerun.targets.base import CaseStatus, RunOptions, expected_layout, safe_name
from bundlerun.targets.et_runner.log import (DEBUG_BUFFER_FULL_RE, EtdumpBlockError, RunnerLog, debug_buffer_size,
                                             etdump_block_files, parse_runner_log)
from bundlerun.targets.et_runner.outputs import OutputDecodeError, outputs_from_etdump

GRANULARITY = ("every kernel call and every delegate call (arm_executor_runner's ETDump + debug buffer, "
               "ET_DUMP_INTERMEDIATE_OUTPUTS)")
ET_RUNNER_ETDUMP = ("ExecuTorch's backends/arm/scripts/build_executor_runner.sh --bundleio --etdump "
                    "(ET_DUMP_INTERMEDIATE_OUTPUTS)")
QEMU_SCRIPT = "firmware_scripts/arm/build_qemu_runner.sh"


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n} B = {n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n} B = {n >> 10} KiB"
    return f"{n} B"


def _fvp_config(cfg: dict[str, Any], key: str, elf: str) -> dict[str, Any]:
    """`cfg` with `key` (runner_elf / uart_runner_elf) = elf everywhere fvp's lookup could find
    another value first (per-platform tables, `<key>s` maps)."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        if k == f"{key}s":
            continue
        if isinstance(v, dict):
            v = {kk: vv for kk, vv in v.items() if kk != key}
        out[k] = v
    out[key] = elf
    return out


class _Lane:
    """What differs between qemu, fvp and serial: the config handed to the target, the folder
    the semihosting files land in, and what to tell the user."""

    def __init__(self, url: str, config: dict[str, Any], bundle_path: Path, method: str, case: int,
                 work_dir: Path, debug_buffer_mb: int):
        self.url = url
        parsed = parse_target_url(url)
        self.family = parsed.scheme.split("+", 1)[0]
        cfg = dict(config)
        debug_elf = cfg.pop("debug_elf", None)
        self.elf: Path | None = Path(str(debug_elf)).expanduser() if debug_elf else None
        if self.elf is not None and not self.elf.is_file():
            raise IntermediatesFailed(f"{url}: debug_elf {self.elf} does not exist")
        self.buffer_size: int | None = None  # known when we built the runner
        self.built = False
        self.case_dir: Path | None = None
        stem = f"{safe_name(method)}-{case}"
        if self.family == "qemu":
            self.mode = str({**cfg, **parsed.query}.get("mode") or "semihosting").lower()
            if self.elf is None:
                if debug_buffer_mb > 64:
                    raise IntermediatesFailed(
                        f"{url}: --debug-buffer-mb {debug_buffer_mb} does not fit the runner: its debug buffer comes "
                        f"out of the method pool (64 MiB + the buffer, at most 128 MiB), so at most 64")
                try:
                    elf, meta = debug_runner(bundle_path, self.mode, debug_buffer_mb << 20, work_dir)
                except BundlerunError as exc:
                    raise IntermediatesFailed(f"{url}: {exc}") from None
                self.elf, self.buffer_size, self.built = elf, int(meta.get("debug_buffer_size") or 0) or None, True
            cfg["runner_elf"] = str(self.elf)
            if self.mode == "semihosting":
                self.case_dir = work_dir / "qemu" / stem
        elif self.family == "fvp":
            merged = {**cfg, **parsed.query}
            self.mode = str(_lookup(merged, parse_variant(parsed.netloc, parsed.path), "mode")
                            or "semihosting").lower()
            if self.elf is not None:
                cfg = _fvp_config(cfg, "uart_runner_elf" if self.mode == "uart" else "runner_elf", str(self.elf))
            if self.mode == "semihosting":
                self.case_dir = work_dir / "fvp" / stem
        else:  # serial: the board runs what its flash / launch command put there
            self.mode = "uart"
            if self.elf is not None:
                cfg["elf"] = str(self.elf)
        self.config = cfg

    def rebuild_hint(self) -> str:
        if self.family == "qemu" and self.built:
            return ("rerun with a larger --debug-buffer-mb (the runner is rebuilt with it; at most 64) or debug a "
                    "case with smaller tensors")
        if self.family == "qemu":
            return (f"rebuild it larger: {QEMU_SCRIPT} --etdump --debug-buffer-size BYTES --ops-from BUNDLE "
                    "(or drop debug_elf: bundlerun debug builds one sized by --debug-buffer-mb)")
        return (f"rebuild the runner with a larger buffer: {ET_RUNNER_ETDUMP} "
                "--extra_build_flags=-DET_DEBUG_BUFFER_SIZE=BYTES")

    def etdump_hint(self) -> str:
        if self.family == "qemu":
            return (f"build one with {QEMU_SCRIPT} --etdump --ops-from BUNDLE and pass it as --target-opt "
                    "debug_elf=PATH (or leave debug_elf unset: bundlerun debug builds it)")
        where = "--target-opt debug_elf=PATH" + (" (substituted as {elf} in the flash/launch command)"
                                                  if self.family == "serial" else "")
        return f"build one with {ET_RUNNER_ETDUMP} and pass it as {where}"

    def runner_note(self) -> str:
        if self.family == "serial":
            return f"runner: the board's ({'debug_elf ' + str(self.elf) if self.elf else 'as flashed'})"
        how = (f"built by {QEMU_SCRIPT} --etdump, debug buffer {_size(self.buffer_size)}" if self.built
               else "debug_elf" if self.elf else "the target's configured runner")
        return f"runner: {self.elf or 'configured runner_elf'} ({how})"


def _quiet_inspector_imports() -> None:
    """Import torch and ExecuTorch's Inspector with their load-time chatter (torchao's optional CUDA
    kernels, pytree registrations) kept off the user's terminal, as runner/debug/localize.py does."""
    import contextlib
    import io

    quiet_framework_logs()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import torch  # noqa: F401
        from executorch.devtools import Inspector  # noqa: F401


def capture(url: str, config: dict, bundle_path: Path, method: str, case: int, work_dir: Path,
            timeout_s: float, debug_buffer_mb: int) -> IntermediateRun:
    """Run `method`[`case`] of the bundle on an Arm runner lane with every intermediate output."""
    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers on use
    from bundlerun.targets import open_target  # late: looked up at call time (tests replace it)

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    bundle_path = Path(bundle_path)
    bundle = read_bundle(bundle_path)
    lane = _Lane(url, dict(config or {}), bundle_path, method, case, work_dir, debug_buffer_mb)
    _quiet_inspector_imports()  # before the run: a UART lane decodes the ETDump block's outputs with them
    try:
        target = open_target(url, lane.config)
        run = target.run(bundle, bundle_path, RunOptions(work_dir=work_dir, case_timeout_s=timeout_s,
                                                         methods=[method], cases=[case], config={}))
    except TargetError as exc:
        raise IntermediatesFailed(f"{url}: {exc}") from None
    except BundlerunError as exc:  # a bad target option
        raise IntermediatesFailed(f"{url}: {exc}") from None
    if not run.cases:
        raise IntermediatesFailed(f"{url}: {method}[{case}] was not run")
    result = run.cases[0]
    log_path = Path(result.log_path) if result.log_path else None
    log = parse_runner_log(log_path.read_bytes()) if log_path is not None and log_path.is_file() else RunnerLog()
    where = f" (log: {log_path})" if log_path is not None else ""

    # The debug buffer ran full: ETDumpGen aborted the runner mid-method (nothing was written).
    full = next((ln.raw.strip() for ln in log.lines if DEBUG_BUFFER_FULL_RE.search(ln.raw)), None)
    if full is not None:
        size = lane.buffer_size or debug_buffer_size(log)
        raise IntermediatesFailed(
            f"{url}: the runner's debug buffer ({_size(size)}) is too small for every intermediate output of "
            f"{method}[{case}] (ETDumpGen aborted: write_tensor_or_return_error() failed to write tensor to debug "
            f"buffer); {lane.rebuild_hint()}{where}")
    no_room = next((ln.message for ln in log.lines if "ETDump: Could not allocate memory for output buffer" in ln.message
                    or "ETDump: Could not set_debug_buffer()" in ln.message), None)
    if no_room is not None:
        raise IntermediatesFailed(f"{url}: the runner could not set up its debug buffer ({no_room.strip()}): its "
                                  f"method pool cannot hold it; rebuild with a larger method pool or a smaller "
                                  f"buffer{where}")

    # The ETDump: semihosting files in the case folder, else the UART block.
    etdump_path = debug_path = None
    source = ""
    if lane.case_dir is not None and (lane.case_dir / "etdump.bin").is_file():
        etdump_path = lane.case_dir / "etdump.bin"
        debug = lane.case_dir / "debug_buffer.bin"
        debug_path = debug if debug.is_file() and debug.stat().st_size else None
        source = f"semihosting files {etdump_path} + debug_buffer.bin"
    else:
        try:
            files = etdump_block_files(log)
        except EtdumpBlockError as exc:
            raise IntermediatesFailed(f"{url}: {exc}{where}") from None
        if files is not None:
            etdump_path = work_dir / "etdump.bin"
            etdump_path.write_bytes(files[0])
            if files[1]:
                debug_path = work_dir / "debug_buffer.bin"
                debug_path.write_bytes(files[1])
            source = "the runner's '#[RUN THIS]' base64 block on the UART"
    if etdump_path is None:
        if result.status is not CaseStatus.OK:
            raise IntermediatesFailed(f"{url}: the debug run of {method}[{case}] failed before the runner wrote its "
                                      f"ETDump: {result.error}{where}")
        what = "no etdump.bin in its semihosting folder" if lane.case_dir is not None else \
            "no '#[RUN THIS]' ETDump block in its log"
        raise IntermediatesUnsupported(f"{url}: the runner wrote no ETDump ({what}): it was built without the event "
                                       f"tracer; {lane.etdump_hint()}")
    if debug_path is None:
        raise IntermediatesUnsupported(
            f"{url}: the runner's ETDump holds no debug buffer (timings only: built without "
            f"ET_DUMP_INTERMEDIATE_OUTPUTS / ET_DEBUG_BUFFER_SIZE); {lane.etdump_hint()}")

    size = lane.buffer_size or debug_buffer_size(log)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.frombuffer on the read-only debug buffer
            items, parse_notes = parse_etdump(etdump_path, debug_path, _size(size), lane.rebuild_hint())
    except Exception as exc:  # noqa: BLE001 - the Inspector's own error, in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise IntermediatesFailed(f"{url}: the runner's ETDump could not be read ({type(exc).__name__}: {first})"
                                  f"{where}") from None
    if not items:
        raise IntermediatesUnsupported(
            f"{url}: the runner's ETDump holds no intermediate outputs (built with ET_DUMP_OUTPUTS only?); "
            f"{lane.etdump_hint()}")

    notes = [lane.runner_note(), f"ETDump from {source}"]
    used = next((ln.message.strip() for ln in log.lines if ln.message.lstrip().startswith("ETDump_outputs_buffer:")),
                None)
    if used:
        notes.append(f"debug buffer use: {' '.join(used.split())}")
    verdict = (result.device_verdict or {}).get("verdict")
    if verdict == Verdict.FAIL:
        notes.append("the runner's own BundleIO check of this case failed (its compiled-in atol/rtol); it wrote the "
                     "ETDump first, then aborted as it does after a failed check")
    if result.status is not CaseStatus.OK:
        notes.append(f"the run itself reported: {result.error}")
    notes += parse_notes

    outputs: list[np.ndarray] = [t.to_array() for t in result.outputs]
    if not outputs:
        try:
            outputs = [t.to_array() for t in outputs_from_etdump(
                etdump_path.read_bytes(), debug_path.read_bytes(), expected_layout(bundle, method, case))]
            notes.append("final outputs from the ETDump's output events (bit exact)")
        except OutputDecodeError as exc:
            notes.append(f"no final outputs: {exc}")
    elif result.extra.get("outputs_from"):
        notes.append(f"final outputs from {result.extra['outputs_from']}"
                     + (" (bit exact)" if result.extra["outputs_from"] in ("files", "etdump") else ""))
    return IntermediateRun(url, method, case, GRANULARITY, items, outputs, notes)


__all__ = ["capture", "GRANULARITY"]
