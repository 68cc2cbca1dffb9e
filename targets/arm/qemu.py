"""`qemu://mps3-an547`: ExecuTorch's own arm_executor_runner, built from source, on QEMU's
Corstone SSE-300 machine (Cortex-M55, no Ethos-U).

    qemu://mps3-an547                   semihosting runner (default): every case, outputs as files
    qemu://mps3-an547?mode=uart         UART runner: the bundle placed in DDR with -device loader,
                                        outputs from the printed lines (6 decimals, lossy) or ETDump

Same per-case protocol as `fvp://` in semihosting mode: each case gets a folder
holding a bundle whose case 0 is that case (the stock runner checks case 0
only), QEMU's cwd is that folder, and the runner writes `out-<i>.bin` there. The
log is judged by the one Arm runner protocol (targets.arm.protocol). A
wall-clock bound ends hangs; QEMU runs in its own process group, always reaped.

The runner comes from `firmware_scripts/arm/build_qemu_runner.sh` (its cache is
searched when `runner_elf` is not set).

The same UART runner also plays a board on a wire for the serial lane
(`serial+socket://` with a per-case `launch` of QEMU, UART0 as a TCP server):
docs/arm-qemu.md "The serial lane on QEMU's UART", tests/test_qemu_serial.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.errors import ConfigError, TargetError
from bundlerun.targets import Check, TargetSpec, TargetURL
from bundlerun.targets.arm.protocol import case_from_session, clear_outputs
from bundlerun.targets.arm.simulator import run_session_process, session_end
from bundlerun.targets.base import CaseResult, RunOptions, TargetRun, expected_layout, safe_name, selected_cases
from bundlerun.targets.runner_cache import cached_runners
from bundlerun.targets.settings import parse_settings

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
    qemu: str = "qemu-system-arm"  # binary name or path
    mode: str = "semihosting"  # semihosting | uart
    model_addr: str = "0x7C000000"  # uart: where -device loader places the bundle (the runner's ET_MODEL_PTE_ADDR)
    icount: bool = False  # -icount shift=0: deterministic instruction-counted time (slower)
    host_timeout_grace_s: float = 10.0  # added to --timeout for QEMU start-up
    exit_grace_s: float = 3.0  # after the log says done, how long QEMU may linger

    def validate(self) -> None:
        if self.mode not in ("semihosting", "uart"):
            raise ConfigError(f"[targets.qemu] mode must be semihosting or uart, not {self.mode!r}")
        try:
            int(self.model_addr, 16)
        except ValueError:
            raise ConfigError(f"[targets.qemu] model_addr must be a hex address, not {self.model_addr!r}") from None


def _doctor(section: dict) -> list[Check]:
    from bundlerun.targets.probes import tool_check

    rows = [tool_check(str(section.get("qemu", "qemu-system-arm")), ["--version"], "apt-get install qemu-system-arm"),
            tool_check("arm-none-eabi-gcc", ["--version"], "apt-get install gcc-arm-none-eabi (to build the runner)")]
    runners = cached_runners(RUNNER_KIND)
    if not runners and not section.get("runner_elf"):
        rows.append(Check("QEMU runner", False, f"none built; {BUILD_HINT}"))
    for r in runners:
        flags = r.get("flags", {})
        what = f"{r.get('mode')} runner, {len(r.get('ops', []))} ops" + (
            f", fault={flags['fault']}" if flags.get("fault") not in (None, "none") else "")
        rows.append(Check(f"QEMU runner {Path(r['dir']).name}", Path(str(r.get("elf"))).is_file(), what, r["dir"]))
    return rows


SPEC = TargetSpec(
    name="qemu",
    schemes=("qemu",),
    summary="ExecuTorch's arm_executor_runner built from source, on QEMU's Corstone SSE-300 (Cortex-M55)",
    examples=("qemu://mps3-an547", "qemu://mps3-an547?mode=uart"),
    default_backend="cortex-m",
    settings=QemuSettings,
    doctor=_doctor,
)


@dataclass
class QemuTarget:
    url: str
    machine: str
    settings: QemuSettings

    def _runner(self, bundle: Bundle) -> Path:
        """The configured ELF, else a cached runner of this mode, built without a test fault, whose
        operator set covers the bundle's (a runner without an op the bundle needs fails on the
        device); the largest method pool, then the newest, wins."""
        s = self.settings
        if s.runner_elf is not None:
            if not s.runner_elf.is_file():
                raise TargetError(f"runner ELF {s.runner_elf} does not exist; {BUILD_HINT}")
            return s.runner_elf
        from bundlerun.bundles.program_meta import program_operators

        needed = program_operators(bundle.program, "bundle program")
        candidates = [r for r in cached_runners(RUNNER_KIND) if r.get("mode") == s.mode
                      and r.get("flags", {}).get("fault", "none") == "none" and Path(str(r.get("elf"))).is_file()]
        if not candidates:
            raise TargetError(f"no {s.mode} runner for {self.machine} in the build cache; {BUILD_HINT}"
                              + (" --mode uart" if s.mode == "uart" else ""))
        covering = [r for r in candidates if needed <= set(r.get("ops", []))]
        if not covering:
            best = max(candidates, key=lambda r: len(needed & set(r.get("ops", []))))
            lacking = sorted(needed - set(best.get("ops", [])))
            raise TargetError(f"no cached {s.mode} runner has every operator of this bundle (the closest lacks "
                              f"{', '.join(lacking)}); build one with firmware_scripts/arm/build_qemu_runner.sh "
                              f"--ops-from BUNDLE" + (" --mode uart" if s.mode == "uart" else ""), kind="tool-missing")
        # test variants built with a small pool must not be picked over the real thing
        covering.sort(key=lambda r: (int(r.get("flags", {}).get("method_pool_size") or 0), str(r.get("built_at"))),
                      reverse=True)
        return Path(str(covering[0]["elf"]))

    def _qemu(self) -> str:
        found = shutil.which(self.settings.qemu)
        if not found:
            raise TargetError(f"{self.settings.qemu} not found on PATH (apt-get install qemu-system-arm)")
        return found

    def command(self, qemu: str, elf: Path, placed_bundle: Path | None = None) -> list[str]:
        """The QEMU command line of one session."""
        cmd = [qemu, "-M", self.machine, "-nographic", "-monitor", "none"]
        if self.settings.icount:
            cmd += ["-icount", "shift=0"]
        if placed_bundle is None:
            args = ",".join(f"arg={a}" for a in ("arm_executor_runner", "-m", BUNDLE_NAME, "-i", DUMMY_INPUT,
                                                   "-o", OUTPUT_BASENAME))
            cmd += ["-serial", "none", "-semihosting-config", f"enable=on,target=native,{args}"]
        else:
            cmd += ["-serial", "stdio", "-device", f"loader,file={placed_bundle},addr={self.settings.model_addr}"]
        return cmd + ["-kernel", str(elf)]

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        qemu, elf = self._qemu(), self._runner(bundle)
        work, logs = Path(options.work_dir) / "qemu", Path(options.work_dir) / "logs"
        work.mkdir(parents=True, exist_ok=True)
        wall = options.case_timeout_s + self.settings.host_timeout_grace_s
        run = TargetRun(self.url, [], info={"qemu": qemu, "runner_elf": str(elf), "machine": self.machine,
                                             "mode": self.settings.mode, "icount": self.settings.icount})
        for method, index in selected_cases(bundle, options):
            result = self._case(bundle, method, index, qemu, elf, work, logs, wall)
            run.record(result, options)
        return run

    def _case(self, bundle: Bundle, method: str, index: int, qemu: str, elf: Path, work: Path, logs: Path,
              wall: float) -> CaseResult:
        from bundlerun.bundles.bpte import serialize_bundle

        case_dir = work / f"{safe_name(method)}-{index}"
        case_dir.mkdir(parents=True, exist_ok=True)
        clear_outputs(case_dir, OUTPUT_BASENAME)
        (case_dir / BUNDLE_NAME).write_bytes(serialize_bundle(bundle.single_case(method, index)))
        semihosting = self.settings.mode == "semihosting"
        if semihosting:
            (case_dir / DUMMY_INPUT).write_bytes(b"\0\0\0\0")
        cmd = self.command(qemu, elf, None if semihosting else (case_dir / BUNDLE_NAME).resolve())
        log_path = logs / f"qemu-{safe_name(method)}-{index}.log"
        outcome = run_session_process(cmd, case_dir, log_path, wall, exit_grace_s=self.settings.exit_grace_s,
                                      env={**os.environ, "QEMU_AUDIO_DRV": "none"})
        return case_from_session(
            outcome.log, session_end(outcome, "QEMU", wall), method, index, expected_layout(bundle, method, index),
            case_dir if semihosting else None, log_path, outcome.elapsed_s,
            extra={"qemu_returncode": outcome.returncode}, prefer="files" if semihosting else "auto",
        )


def create(url: TargetURL, config: dict) -> QemuTarget:
    machine = url.rest.lower()
    if machine not in MACHINES:
        raise TargetError(f"unknown QEMU machine {machine!r} in {url.raw}; known: "
                          + ", ".join(f"qemu://{m} ({d})" for m, d in MACHINES.items()))
    return QemuTarget(url.raw, machine, parse_settings(QemuSettings, {**config, **url.query}, "targets.qemu"))
