"""`qemu-user://aarch64`: ExecuTorch's portable `executor_runner`, cross-built from source for
aarch64 Linux (firmware_scripts/android/build_executor_runner.sh --toolchain gnu), run here
under `qemu-aarch64`. What a phone's CPU would compute with portable kernels, without a phone
or adb: a quick cross-architecture check of numerics.

Each case runs as its own one-case bundle (the runner checks case 0 only) in its own folder;
outputs come back bit exact from `--output_file` (`output-<i>.bin`), the ETDump beside them.
The runner's contract (flags, log, exit codes) is targets/executor_runner.py. Each process
runs in its own process group under the case timeout and is always reaped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bundlerun.bundles.errors import TargetError
from bundlerun.targets import Check, TargetSpec, TargetURL, executor_runner, lazy
from bundlerun.targets.base import (
    CaseResult,
    CaseStatus,
    RunOptions,
    TargetBase,
    TargetRun,
    expected_layout,
    raw_outputs_from_files,
    safe_name,
    selected_cases,
)
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.process import kill_process_group
from bundlerun.targets.runner_cache import cached_runners, find_runner
from bundlerun.targets.settings import parse_settings

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

ARCHES = {"aarch64": "qemu-aarch64"}
RUNNER_KIND = "executor_runner"
BUILD_HINT = "build it with firmware_scripts/android/build_executor_runner.sh --toolchain gnu (or set runner)"


@dataclass
class QemuUserSettings:
    """[targets.qemu-user] / qemu-user://aarch64?KEY=VALUE"""

    runner: Path | None = None  # default: the cached aarch64 executor_runner
    qemu: str | None = None  # default: qemu-<arch> on PATH
    etdump: bool = True  # keep the runner's ETDump (it writes one whenever the event tracer is built in)
    print_output: str = "none"
    # `bundlerun debug` (targets/android/intermediates.py): bundlerun's debug runner (default: the cached
    # build_executor_runner.sh --toolchain gnu --debug-runner for this arch, built on first use)
    debug_runner: Path | None = None
    debug_buffer_bytes: int | None = None  # the debug buffer in bytes (default: --debug-buffer-mb)


def _doctor(section: dict) -> list[Check]:
    from bundlerun.targets.probes import tool_check

    rows = [tool_check("qemu-aarch64", ["--version"], "apt-get install qemu-user"),
            tool_check("aarch64-linux-gnu-g++", ["--version"], "apt-get install g++-aarch64-linux-gnu (to build the runner)")]
    runners = [r for r in cached_runners(RUNNER_KIND) if r.get("arch") == "aarch64"]
    if not runners and not section.get("runner"):
        rows.append(Check("aarch64 executor_runner", False, f"none built; {BUILD_HINT}"))
    for r in runners:
        rows.append(Check(f"aarch64 executor_runner {Path(r['dir']).name}", Path(str(r.get("binary"))).is_file(),
                          f"static={r.get('static')}, built {r.get('built_at', '?')}", r["dir"]))
    return rows


SPEC = TargetSpec(
    name="qemu-user",
    schemes=("qemu-user",),
    summary="ExecuTorch's executor_runner cross-built for aarch64 Linux, under qemu-aarch64 (portable kernels)",
    examples=("qemu-user://aarch64",),
    default_backend="portable",
    settings=QemuUserSettings,
    doctor=_doctor,
    capture=lazy("bundlerun.targets.android.intermediates:capture"),
    repeat=True,
)


def qemu_for(arch: str, configured: str | None = None) -> str:
    """The qemu user-mode emulator for `arch` (`configured` name or path, else qemu-<arch>) on PATH."""
    qemu_name = configured or ARCHES[arch]
    qemu = shutil.which(qemu_name)
    if qemu is None:
        raise TargetError(f"{qemu_name} not found on PATH (apt-get install qemu-user)")
    return qemu


def run_under_qemu(qemu: str, runner: Path, args: list[str], cwd: Path, log_path: Path,
                   timeout_s: float) -> tuple[int | None, float, str]:
    """Run `runner args` under `qemu` in `cwd`, stdout + stderr into `log_path`, in its own process
    group, bounded by `timeout_s` and always reaped: (exit status or None on timeout, seconds, log)."""
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([qemu, str(runner), *args], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ})
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            kill_process_group(proc)
    return rc, time.monotonic() - start, log_path.read_text(errors="replace")


@dataclass
class QemuUserTarget(TargetBase):
    url: str
    arch: str
    settings: QemuUserSettings

    def _binaries(self) -> tuple[str, Path]:
        qemu = qemu_for(self.arch, self.settings.qemu)
        runner = self.settings.runner or find_runner(RUNNER_KIND, "binary", arch=self.arch)
        if runner is None or not Path(runner).is_file():
            raise TargetError(f"no {self.arch} executor_runner" + (f" at {runner}" if runner else " in the build cache")
                              + f"; {BUILD_HINT}")
        return qemu, Path(runner)

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        qemu, runner = self._binaries()
        work = Path(options.work_dir) / "qemu-user"
        run = TargetRun(self.url, [], info={"qemu": qemu, "runner": str(runner), "arch": self.arch,
                                             "kernels": "portable", "timing": "emulated CPU time, not device latency"})
        executions = executor_runner.executions_for(getattr(options, "repeat", 1))
        if executions > 1:
            run.info.update(repeat=executions - 1, warmup=1, num_executions=executions)
        for method, index in selected_cases(bundle, options):
            result = self._case(bundle, method, index, qemu, runner, work, options.case_timeout_s, executions)
            run.record(result, options)
        return run

    def _case(self, bundle: Bundle, method: str, index: int, qemu: str, runner: Path, work: Path,
              timeout_s: float, executions: int = 1) -> CaseResult:
        from bundlerun.bundles.bpte import write_bundle

        folder = work / f"{safe_name(method)}-{index}"
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "out").mkdir(parents=True)
        write_bundle(bundle.single_case(method, index), folder / "model.bpte")
        etdump = "out/model.etdump" if self.settings.etdump else None
        args = executor_runner.runner_args("model.bpte", method, "out/output", print_output=self.settings.print_output,
                                           etdump=etdump, num_executions=executions)
        log_path = folder / "runner.log"
        rc, elapsed, output = run_under_qemu(qemu, runner, args, folder, log_path, timeout_s)
        verdict = executor_runner.device_verdict(output)
        base = dict(method=method, case_index=index, log_path=str(log_path), elapsed_s=elapsed, device_verdict=verdict,
                    perf=executor_runner.perf_figures(output, simulated=True))
        if rc is None:
            return CaseResult(status=CaseStatus.TIMEOUT, error=f"the runner did not finish within {timeout_s:g} s; "
                              "process group killed", error_kind=FailureKind.HOST_TIMEOUT,
                              log_excerpt=output.splitlines()[-10:], **base)
        problem = executor_runner.classify(output, rc)
        if problem:
            return CaseResult(status=problem.status, error=problem.message, error_kind=problem.kind,
                              log_excerpt=problem.evidence, **base)
        layout = expected_layout(bundle, method, index)
        files = [folder / "out" / f"output-{k}.bin" for k in range(len(layout))]
        outputs, err = raw_outputs_from_files([f for f in files if f.is_file()], layout)
        if err:
            kind = FailureKind.WRONG_OUTPUT_SIZE if "bytes, expected" in err else FailureKind.MISSING_OUTPUT
            return CaseResult(status=CaseStatus.ERROR, error=err, error_kind=kind, log_excerpt=output.splitlines()[-10:],
                              **base)
        result = CaseResult(status=CaseStatus.OK, outputs=outputs, extra={"outputs_from": "files"}, **base)
        if etdump and (folder / etdump).is_file():
            result.extra["etdump"] = str(folder / etdump)
        return result


def create(url: TargetURL, config: dict) -> QemuUserTarget:
    arch = url.rest.lower()
    if arch not in ARCHES:
        raise TargetError(f"unknown architecture {arch!r} in {url.raw}; known: "
                          + ", ".join(f"qemu-user://{a}" for a in ARCHES))
    settings = parse_settings(QemuUserSettings, {**config, **url.query}, "targets.qemu-user")
    return QemuUserTarget(url.raw, arch, settings)
