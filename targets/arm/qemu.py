"""`qemu://mps3-an547`: ExecuTorch's own arm_executor_runner, built from source, on QEMU's
Corstone SSE-300 machine (Cortex-M55, no Ethos-U).

    qemu://mps3-an547                   semihosting runner (default): every case, outputs as files
    qemu://mps3-an547?mode=uart         UART runner: the bundle placed in DDR with -device loader,
                                        outputs from the printed lines (6 decimals, lossy) or ETDump

Same per-case protocol as `fvp://` in semihosting mode: each case gets a folder
holding a bundle whose case 0 is that case (the stock runner checks case 0
only), QEMU's cwd is that folder, and the runner writes `out-<i>.bin` there. The
log is judged by the one Arm runner protocol (targets.et_runner.protocol). A
wall-clock bound ends hangs; QEMU runs in its own process group, always reaped.

The runner comes from `firmware_scripts/arm/build_qemu_runner.sh` (its cache is
searched when `runner_elf` is not set). Runners built with `--etdump` (the event
tracer and a debug buffer, for `bundlerun debug`) are never picked for a run: they
are found or built by `debug_runner` (targets/arm/intermediates.py), or given as
`debug_elf`.

The same UART runner also plays a board on a wire for the serial lane
(`serial+socket://` with a per-case `launch` of QEMU, UART0 as a TCP server):
docs/arm-qemu.md "The serial lane on QEMU's UART", tests/test_qemu_serial.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bundlerun.bundles.errors import ConfigError, TargetError
from bundlerun.targets import Check, TargetSpec, TargetURL, lazy
from bundlerun.targets.arm import memory_fit, qemu_plugin
from bundlerun.targets.et_runner.protocol import case_from_session, clear_outputs
from bundlerun.targets.arm.simulator import run_session_process, session_end
from bundlerun.targets.base import CaseResult, RunOptions, TargetBase, TargetRun, expected_layout, safe_name, selected_cases
from bundlerun.targets.runner_cache import cached_runners, read_record, run_build
from bundlerun.targets.settings import parse_settings
from bundlerun.targets.failures import FailureKind
from bundlerun.bundles.program_meta import program_operators
from bundlerun.targets.arm.fvp import platform_lowering
from bundlerun.bundles.program_meta import planned_buffer_sizes

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

MACHINES = {"mps3-an547": "Corstone SSE-300, Cortex-M55 (no Ethos-U)"}
BUNDLE_NAME = "model.bpte"
DUMMY_INPUT = "dummy.bin"
OUTPUT_BASENAME = "out"
RUNNER_KIND = "arm-qemu"
BUILD_HINT = "build one with firmware_scripts/arm/build_qemu_runner.sh (or set [targets.qemu] runner_elf)"


@dataclass
class QemuSettings:
    """[targets.qemu] / qemu://mps3-an547?KEY=VALUE"""

    runner_elf: Path | None = None  # default: the newest matching runner in the build cache
    debug_elf: Path | None = None  # `bundlerun debug`: a runner built with --etdump (default: found or built)
    qemu: str = "qemu-system-arm"  # binary name or path
    mode: str = "semihosting"  # semihosting | uart
    model_addr: str = "0x7C000000"  # uart: where -device loader places the bundle (the runner's ET_MODEL_PTE_ADDR)
    icount: bool = False  # -icount shift=0: deterministic instruction-counted time (slower)
    insn_count: bool = True  # load bundlerun's TCG plugin (build_qemu_plugin.sh) for the session_instructions figure
    host_timeout_grace_s: float = 10.0  # added to --timeout for QEMU start-up
    exit_grace_s: float = 3.0  # after the log says done, how long QEMU may linger
    memory_check: bool = True  # refuse a bundle too big for the runner's pools before QEMU starts (memory_fit.py)

    def validate(self) -> None:
        if self.mode not in ("semihosting", "uart"):
            raise ConfigError(f"[targets.qemu] mode must be semihosting or uart, not {self.mode!r}")
        try:
            int(self.model_addr, 16)
        except ValueError:
            raise ConfigError(f"[targets.qemu] model_addr must be a hex address, not {self.model_addr!r}") from None


def _doctor(section: dict) -> list[Check]:
    from bundlerun.targets.probes import tool_check  # start-up: not loaded by `bundlerun --help`

    rows = [tool_check(str(section.get("qemu", "qemu-system-arm")), ["--version"], "apt-get install qemu-system-arm"),
            tool_check("arm-none-eabi-gcc", ["--version"], "apt-get install gcc-arm-none-eabi (to build the runner)")]
    runners = cached_runners(RUNNER_KIND)
    if not runners and not section.get("runner_elf"):
        rows.append(Check("QEMU runner", False, f"none built; {BUILD_HINT}"))
    for r in runners:
        flags = r.get("flags", {})
        what = f"{r.get('mode')} runner, {len(r.get('ops', []))} ops" + (
            f", fault={flags['fault']}" if flags.get("fault") not in (None, "none") else "") + (
            f", etdump (debug buffer {r.get('debug_buffer_size')} B: bundlerun debug only)" if is_etdump_runner(r) else "")
        rows.append(Check(f"QEMU runner {Path(r['dir']).name}", Path(str(r.get("elf"))).is_file(), what, r["dir"]))
    qemu = shutil.which(str(section.get("qemu", "qemu-system-arm")))
    plugin = qemu_plugin.find_plugin(qemu) if qemu else None
    rows.append(Check("QEMU instruction-count plugin", True if plugin else None,  # optional: a perf figure
                      "built for this QEMU (session_instructions)" if plugin else
                      f"none for this QEMU: {qemu_plugin.BUILD_HINT} (session_instructions stays absent)",
                      str(plugin.parent) if plugin else ""))
    return rows


SPEC = TargetSpec(
    name="qemu",
    schemes=("qemu",),
    summary="ExecuTorch's arm_executor_runner built from source, on QEMU's Corstone SSE-300 (Cortex-M55)",
    examples=("qemu://mps3-an547", "qemu://mps3-an547?mode=uart"),
    default_backend="cortex-m",
    settings=QemuSettings,
    doctor=_doctor,
    # QEMU itself, and firmware it runs with semihosting (which opens and writes files on this machine)
    command_settings=("qemu", "runner_elf", "debug_elf"),
    capture=lazy("bundlerun.targets.arm.intermediates:capture"),
    lowering=lambda url: _lowering(url),
)

# QEMU system machines that are a Corstone platform's CPU side (board, core): mps3-an547 is
# Corstone-300's SSE-300 with a Cortex-M55 and no NPU.
QEMU_MACHINES = {"mps3-an547": ("corstone-300", "cortex-m55")}


def _lowering(url: TargetURL) -> dict:
    machine = url.rest.lower()
    if machine not in QEMU_MACHINES:
        raise TargetError(f"unknown QEMU machine {machine!r} in {url.raw!r}; known: {', '.join(QEMU_MACHINES)}",
                          kind=FailureKind.BAD_CONFIG)
    return platform_lowering(url.raw, *QEMU_MACHINES[machine])


@dataclass
class QemuTarget(TargetBase):
    url: str
    machine: str
    settings: QemuSettings
    _plugin: Path | None = field(default=None, init=False, repr=False)  # the instruction-count plugin of this run

    def _runner(self, bundle: Bundle) -> Path:
        """The configured ELF, else a cached runner of this mode, built without a test fault, whose
        operator set covers the bundle's (a runner without an op the bundle needs fails on the
        device); the largest method pool, then the newest, wins."""
        s = self.settings
        if s.runner_elf is not None:
            if not s.runner_elf.is_file():
                raise TargetError(f"runner ELF {s.runner_elf} does not exist; {BUILD_HINT}")
            return s.runner_elf

        needed = program_operators(bundle.program, "bundle program")
        record, lacking = pick_cached_runner(needed, s.mode)
        if record is None and lacking is None:
            raise TargetError(f"no {s.mode} runner for {self.machine} in the build cache; {BUILD_HINT}"
                              + (" --mode uart" if s.mode == "uart" else ""))
        if record is None:
            raise TargetError(f"no cached {s.mode} runner has every operator of this bundle (the closest lacks "
                              f"{', '.join(lacking or [])}); build one with firmware_scripts/arm/build_qemu_runner.sh "
                              f"--ops-from BUNDLE" + (" --mode uart" if s.mode == "uart" else ""), kind=FailureKind.TOOL_MISSING)
        return Path(str(record["elf"]))

    def _qemu(self) -> str:
        found = shutil.which(self.settings.qemu)
        if not found:
            raise TargetError(f"{self.settings.qemu} not found on PATH (apt-get install qemu-system-arm)")
        return found

    def command(self, qemu: str, elf: Path, placed_bundle: Path | None = None,
                plugin_log: Path | None = None) -> list[str]:
        """The QEMU command line of one session (`plugin_log`: load the instruction-count plugin).
        Paths are absolute and commas inside QEMU's key=value options escaped (targets/argv.py)."""
        from bundlerun.targets import argv  # start-up: not loaded by `bundlerun --help`

        cmd = [argv.program(qemu, "qemu", self.url), "-M", self.machine, "-nographic", "-monitor", "none"]
        if self.settings.icount:
            cmd += ["-icount", "shift=0"]
        if plugin_log is not None and self._plugin is not None:
            cmd += qemu_plugin.plugin_args(self._plugin, plugin_log)
        if placed_bundle is None:
            args = ",".join(f"arg={a}" for a in ("arm_executor_runner", "-m", BUNDLE_NAME, "-i", DUMMY_INPUT,
                                                   "-o", OUTPUT_BASENAME))
            cmd += ["-serial", "none", "-semihosting-config", f"enable=on,target=native,{args}"]
        else:
            bundle_opt = argv.qemu_opt(argv.local_path(placed_bundle, "bundle", self.url))
            cmd += ["-serial", "stdio", "-device", f"loader,file={bundle_opt},addr={int(self.settings.model_addr, 16):#x}"]
        return cmd + ["-kernel", argv.local_path(elf, "runner ELF", self.url)]

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        qemu, elf = self._qemu(), self._runner(bundle)
        work, logs = Path(options.work_dir) / "qemu", Path(options.work_dir) / "logs"
        work.mkdir(parents=True, exist_ok=True)
        wall = options.case_timeout_s + self.settings.host_timeout_grace_s
        self._plugin = qemu_plugin.find_plugin(qemu) if self.settings.insn_count else None
        run = TargetRun(self.url, [], info={"qemu": qemu, "runner_elf": str(elf), "machine": self.machine,
                                             "mode": self.settings.mode, "icount": self.settings.icount,
                                             "insn_count_plugin": str(self._plugin) if self._plugin else None})
        if self.settings.insn_count and self._plugin is None:
            run.info["insn_count_note"] = (f"no instruction-count plugin built for this QEMU: run "
                                           f"{qemu_plugin.BUILD_HINT} (session_instructions is absent)")
        memory = memory_fit.runner_memory(elf)
        run.info["runner_memory"] = memory.describe() if memory else "not read (no pool symbols in the runner ELF)"
        if self.settings.memory_check and memory is not None:
            self._refuse_misfit(bundle, memory, selected_cases(bundle, options))
        for method, index in selected_cases(bundle, options):
            result = self._case(bundle, method, index, qemu, elf, work, logs, wall)
            if result.error_kind == FailureKind.ALLOCATION_FAILURE and memory is not None and result.error:
                result.error += f"; the runner's pools: {memory.describe()}"
            run.record(result, options)
        return run

    def _refuse_misfit(self, bundle: Bundle, memory: memory_fit.RunnerMemory, cases: list[tuple[str, int]]) -> None:
        """Raise (every case ERROR allocation-failure, exit 2, no QEMU started) when the planned
        buffers or the largest case's bundle cannot fit the runner's pools."""
        from bundlerun.bundles.bpte import serialize_bundle  # start-up: not loaded by `bundlerun --help`

        planned = planned_buffer_sizes(bundle.program, "bundle program")
        model = str(bundle.manifest.model.id) if bundle.manifest is not None else "the bundle's program"

        def case_bytes(mc: tuple[str, int]) -> int:
            case = bundle.suite(mc[0]).test_cases[mc[1]]
            return sum(len(v.data or b"") for v in case.inputs + case.expected_outputs)

        largest = max(cases, key=case_bytes, default=None)  # each case's bundle holds the whole program
        size = len(serialize_bundle(bundle.single_case(*largest))) if largest else len(bundle.program)
        misfit = memory_fit.check_fit(memory, planned, size, self.settings.mode, model)
        if misfit is not None:
            raise TargetError(misfit.message, kind=FailureKind.ALLOCATION_FAILURE)

    def _case(self, bundle: Bundle, method: str, index: int, qemu: str, elf: Path, work: Path, logs: Path,
              wall: float) -> CaseResult:
        from bundlerun.bundles.bpte import serialize_bundle  # start-up: not loaded by `bundlerun --help`

        case_dir = work / f"{safe_name(method)}-{index}"
        case_dir.mkdir(parents=True, exist_ok=True)
        clear_outputs(case_dir, OUTPUT_BASENAME)
        (case_dir / BUNDLE_NAME).write_bytes(serialize_bundle(bundle.single_case(method, index)))
        semihosting = self.settings.mode == "semihosting"
        if semihosting:
            (case_dir / DUMMY_INPUT).write_bytes(b"\0\0\0\0")
        log_path = logs / f"qemu-{safe_name(method)}-{index}.log"
        logs.mkdir(parents=True, exist_ok=True)
        plugin_log = (logs / f"qemu-{safe_name(method)}-{index}.insn.log").resolve()  # QEMU's cwd is the case dir
        plugin_log.unlink(missing_ok=True)
        cmd = self.command(qemu, elf, None if semihosting else (case_dir / BUNDLE_NAME).resolve(), plugin_log)
        outcome = run_session_process(cmd, case_dir, log_path, wall, exit_grace_s=self.settings.exit_grace_s,
                                      env={**os.environ, "QEMU_AUDIO_DRV": "none"})
        result = case_from_session(
            outcome.log, session_end(outcome, "QEMU", wall), method, index, expected_layout(bundle, method, index),
            case_dir if semihosting else None, log_path, outcome.elapsed_s,
            extra={"qemu_returncode": outcome.returncode}, prefer="files" if semihosting else "auto",
        )
        insns = qemu_plugin.read_count(plugin_log) if self._plugin is not None else None
        if insns is not None:  # QEMU exited by itself (a killed session wrote no count: absent, not 0)
            result.add_perf([insns])
        return result


def is_etdump_runner(record: dict) -> bool:
    """A runner.json of a build with --etdump (event tracer + debug buffer)."""
    flags = record.get("flags") if isinstance(record.get("flags"), dict) else {}
    return bool(record.get("etdump") or flags.get("etdump"))


def pick_cached_runner(needed: set[str], mode: str, etdump: bool = False,
                       debug_buffer_size: int | None = None) -> tuple[dict | None, list[str] | None]:
    """(runner.json record, None) of the best cached runner of `mode` built without a test fault whose
    operator set covers `needed`; (None, ops the closest one lacks) when none covers them; (None,
    None) when there is no candidate at all. `etdump`: only --etdump runners (with exactly this
    debug buffer size when given), else only runners without it. The largest method pool, then the
    newest, wins (test variants built with a small pool must not be picked over the real thing)."""
    candidates = []
    for r in cached_runners(RUNNER_KIND):
        flags = r.get("flags") if isinstance(r.get("flags"), dict) else {}
        if r.get("mode") != mode or flags.get("fault", "none") != "none" or not Path(str(r.get("elf"))).is_file():
            continue
        if is_etdump_runner(r) != etdump:
            continue
        if etdump and debug_buffer_size is not None and int(r.get("debug_buffer_size") or 0) != debug_buffer_size:
            continue
        candidates.append(r)
    if not candidates:
        return None, None
    covering = [r for r in candidates if needed <= set(r.get("ops", []))]
    if not covering:
        best = max(candidates, key=lambda r: len(needed & set(r.get("ops", []))))
        return None, sorted(needed - set(best.get("ops", [])))
    covering.sort(key=lambda r: (int(r.get("flags", {}).get("method_pool_size") or 0), str(r.get("built_at"))),
                  reverse=True)
    return covering[0], None


BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "firmware_scripts" / "arm" / "build_qemu_runner.sh"
MAX_DEBUG_BUFFER = 64 << 20  # the script's default 64 MiB method pool grows by the buffer, up to 128 MiB


def debug_runner(bundle_path: Path, mode: str, debug_buffer_size: int, log_dir: Path,
                 timeout_s: float = 3600.0) -> tuple[Path, dict]:
    """(ELF, runner.json) of a runner built with `--etdump --debug-buffer-size N` whose operators
    cover the bundle's: from the build cache, else built now with
    `build_qemu_runner.sh --etdump --ops-from BUNDLE` (content-addressed; the first build of the
    ETDump library tree takes minutes, later variants seconds). Its stderr goes to a log in
    `log_dir`; a failed build is a TargetError naming the script's own one-line reason."""
    import sys

    from bundlerun.bundles.bpte import read_bundle  # start-up: not loaded by `bundlerun --help`

    if not 16 <= debug_buffer_size <= MAX_DEBUG_BUFFER:
        raise ConfigError(f"qemu://: the debug buffer must be 16 B..{MAX_DEBUG_BUFFER >> 20} MiB (it comes out of the "
                          f"runner's method pool, at most 128 MiB), not {debug_buffer_size} B")
    needed = program_operators(read_bundle(bundle_path).program, "bundle program")
    record, _ = pick_cached_runner(needed, mode, etdump=True, debug_buffer_size=debug_buffer_size)
    if record is not None:
        return Path(str(record["elf"])), record
    if not BUILD_SCRIPT.is_file():
        raise TargetError(f"no cached --etdump runner covers this bundle and {BUILD_SCRIPT} is not there to build one",
                          kind=FailureKind.TOOL_MISSING)
    log = log_dir / "build_qemu_runner.log"
    cmd = ["bash", str(BUILD_SCRIPT), "--etdump", "--debug-buffer-size", str(debug_buffer_size), "--mode", mode,
           "--ops-from", str(Path(bundle_path).resolve())]
    print(f"qemu://: building the ETDump runner ({' '.join(cmd[1:])}); log: {log}", file=sys.stderr, flush=True)
    folder, why = run_build(cmd, log, timeout_s, "build_qemu_runner.sh")
    if folder is None:
        raise TargetError(f"building the ETDump runner failed: {why} (log: {log})", kind=FailureKind.TOOL_FAILED)
    meta = read_record(folder)
    if meta is None or not Path(str(meta.get("elf"))).is_file():
        raise TargetError(f"{folder}/runner.json does not describe a built ETDump runner", kind=FailureKind.TOOL_FAILED)
    return Path(str(meta["elf"])), meta


def create(url: TargetURL, config: dict) -> QemuTarget:
    machine = url.rest.lower()
    if machine not in MACHINES:
        raise TargetError(f"unknown QEMU machine {machine!r} in {url.raw}; known: "
                          + ", ".join(f"qemu://{m} ({d})" for m, d in MACHINES.items()), kind=FailureKind.BAD_CONFIG)
    return QemuTarget(url.raw, machine, parse_settings(QemuSettings, {**config, **url.query}, "targets.qemu"))
