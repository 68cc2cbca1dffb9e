"""`qemu-user://aarch64`: ExecuTorch's `executor_runner`, cross-built from source for aarch64
Linux (firmware_scripts/android/build_executor_runner.sh --toolchain gnu: portable + quantized
kernels and the XNNPACK delegate with KleidiAI), run here under `qemu-aarch64 -cpu max`. What a
phone's CPU computes - XNNPACK's aarch64 NEON / dot-product / fp16-arithmetic kernels, not the x86
ones host://xnnpack runs - without a phone or adb: a cross-architecture check of numerics.

The cases of a method run on one emulated executor_runner in `--server_mode`
(targets/et_runner/server.py): qemu and the runner start and load the program once, each case's
inputs go in as `--inputs` files (or, on bundlerun's aarch64 build, whose runner.json says
`server_testset`, each trigger names the bundled case: any input shape, and the method - an LLM's KV
cache with it - kept from case to case), its outputs come back bit exact from `--output_file`. A
program calling ExecuTorch's LLM custom ops (`llama::`) needs a runner built with them (kernels "llm"). Where a case
needs a process of its own (an ETDump, `--repeat`, printed outputs, inputs the files cannot carry,
the case a server died on, or `server=false`) it runs as its own one-case bundle (the runner checks
case 0 only) in its own folder, the ETDump beside the outputs. The runner's contract (flags, log,
exit codes) is targets/et_runner/executor_runner.py. Each process runs in its own process group
under the case timeout and is always reaped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from bundlerun.bundles.errors import TargetError
from bundlerun.bundles.program_meta import program_operators
from bundlerun.targets import Check, ElapsedClock, TargetSpec, TargetURL, lazy
from bundlerun.targets.et_runner import executor_runner, server
from bundlerun.targets.base import (
    CaseResult,
    RunOptions,
    TargetBase,
    TargetRun,
    safe_name,
)
from bundlerun.targets.process import kill_process_group, start_program, wait_exit
from bundlerun.targets.runner_cache import cached_runners, read_record, runner_binary
from bundlerun.targets.settings import parse_settings
from bundlerun.targets.base import PerfKind
from bundlerun.targets.gil_handoff import responsive_waits
from bundlerun.targets.failures import FailureKind

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
    # keep the runner's ETDump (it writes one whenever the event tracer is built in) for the report's
    # per-operator profile. Off by default: reading ETDumps imports executorch.devtools (exir, torch), which
    # cost more than the 32 runs of bench/bench_qemu_user.py, for timings that are emulation time anyway
    etdump: bool = False
    print_output: str = "none"
    # qemu's -cpu model. `max` is also qemu-aarch64's default; named so the report says which CPU ran
    # (QEMU 7.2's max: NEON, dotprod, fp16 arithmetic, i8mm, bf16, SVE; the runner's XNNPACK picks its
    # kernels from these features at run time, e.g. `cortex-a53` gives the plain-NEON ones)
    cpu: str = "max"
    # --cpu_threads of the runner (XNNPACK's threadpool). 1: numerics do not depend on it and idle
    # pthreadpool workers spin under emulation, slowing a shared host; None: the runner's default
    cpu_threads: int | None = 1
    # a method's cases on one executor_runner --server_mode process (one emulator start instead of one a case);
    # false: a process per case (each also checks its case with the runner's own BundleIO check: device_verdict)
    server: bool = True
    # `bundlerun debug` (targets/android/intermediates.py): bundlerun's debug runner (default: the cached
    # build_executor_runner.sh --toolchain gnu --debug-runner for this arch, built on first use)
    debug_runner: Path | None = None
    debug_buffer_bytes: int | None = None  # the debug buffer in bytes (default: --debug-buffer-mb)


def _doctor(section: dict) -> list[Check]:
    from bundlerun.targets.probes import tool_check  # start-up: not loaded by `bundlerun --help`

    rows = [tool_check("qemu-aarch64", ["--version"], "apt-get install qemu-user"),
            tool_check("aarch64-linux-gnu-g++", ["--version"], "apt-get install g++-aarch64-linux-gnu (to build the runner)")]
    runners = [r for r in cached_runners(RUNNER_KIND) if r.get("arch") == "aarch64"]
    if not runners and not section.get("runner"):
        rows.append(Check("aarch64 executor_runner", False, f"none built; {BUILD_HINT}"))
    for r in runners:
        delegates = ", ".join(r.get("backends") or []) or "none (portable only)"
        rows.append(Check(f"aarch64 executor_runner {Path(r['dir']).name}", Path(str(r.get("binary"))).is_file(),
                          f"delegates: {delegates}; static={r.get('static')}, built {r.get('built_at', '?')}", r["dir"]))
    if runners and not any("xnnpack" in (r.get("backends") or []) for r in runners):
        rows.append(Check("aarch64 executor_runner with XNNPACK", False, f"none built (XNNPACK bundles cannot run); "
                          f"{BUILD_HINT}"))
    return rows


def cached_runner(arch: str) -> dict | None:
    """The cached executor_runner build for `arch` to use: one with ExecuTorch's LLM custom ops and
    bundled serving (kernels "llm": it runs everything an older build runs, and llama exports), then
    the one with the most delegates (an XNNPACK build runs portable bundles too, a portable-only one
    cannot run XNNPACK bundles), then the newest."""
    runners = [r for r in cached_runners(RUNNER_KIND) if r.get("arch") == arch and Path(str(r.get("binary"))).is_file()]
    runners.sort(key=lambda r: ("llm" in (r.get("kernels") or []), len(r.get("backends") or [])),
                 reverse=True)  # stable: newest first within a tie
    return runners[0] if runners else None


def runner_meta(runner: Path) -> dict:
    """The runner.json beside a cached runner binary ({} for a runner built elsewhere)."""
    meta = read_record(Path(runner).parent)
    return meta if meta is not None and Path(str(meta.get("binary", ""))) == Path(runner) else {}


SPEC = TargetSpec(
    name="qemu-user",
    schemes=("qemu-user",),
    summary="ExecuTorch's executor_runner cross-built for aarch64 Linux (portable kernels + XNNPACK), under qemu-aarch64",
    examples=("qemu-user://aarch64",),
    default_backend="portable",
    # int8 means XNNPACK on an aarch64 CPU, as export_llama's CPU path does for llm: (bundles/llm_arch.py
    # llm_backend): bundlerun's PTQ is XNNPACKQuantizer's, made for that delegate, and the runner links it.
    # On portable the quantized program keeps its quantize/dequantize pairs around float kernels
    dtype_backends={"int8": "xnnpack"},
    settings=QemuUserSettings,
    doctor=_doctor,
    command_settings=("qemu", "runner", "debug_runner"),  # qemu-user passes a runner's syscalls to this machine
    capture=lazy("bundlerun.targets.android.intermediates:capture"),
    capture_prefix=True,  # the debug runner's --prefix_testset_idx: a sequence's earlier steps first
    elapsed=ElapsedClock("runner_case_wall_time", PerfKind.HOST_WALL,
                         "host wall clock of a case on the emulated executor_runner: one --server_mode trigger (input "
                         "files read, execute, outputs written), or where a case runs alone its whole qemu-aarch64 "
                         "process (emulator start-up, program load, execute, output files)"),
    repeat=True,
    stateful=True,  # served: one loaded method per sequence (targets/et_runner/server.py); else refused there
    prestart=True,  # its bundled server starts while the host reads the bundle (QemuUserTarget.prestart)
)


def qemu_for(arch: str, configured: str | None = None) -> str:
    """The qemu user-mode emulator for `arch` (`configured` name or path, else qemu-<arch>) on PATH."""
    qemu_name = configured or ARCHES[arch]
    qemu = shutil.which(qemu_name)
    if qemu is None:
        raise TargetError(f"{qemu_name} not found on PATH (apt-get install qemu-user)")
    return qemu


def run_under_qemu(qemu: str, runner: Path, args: list[str], cwd: Path, log_path: Path,
                   timeout_s: float, cpu: str | None = None) -> tuple[int | None, float, str]:
    """Run `runner args` under `qemu` (`-cpu cpu` when given) in `cwd`, stdout + stderr into
    `log_path`, in its own process group, bounded by `timeout_s` and always reaped: (exit status or
    None on timeout, seconds, log)."""
    start = time.monotonic()
    from bundlerun.targets import argv  # the runner is qemu's positional argument: absolute, never an option

    cpu_args = ["-cpu", argv.word(cpu, "qemu cpu")] if cpu else []
    with open(log_path, "wb") as log:
        proc = start_program([argv.program(qemu, "qemu"), *cpu_args, argv.local_path(runner, "runner"), *args],
                             "qemu-user", cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ})
        try:
            rc = wait_exit(proc, timeout_s)
        finally:
            kill_process_group(proc)
    return rc, time.monotonic() - start, log_path.read_text(errors="replace")


@dataclass
class QemuUserTarget(TargetBase):
    url: str
    arch: str
    settings: QemuUserSettings
    _prestarted: server.Prestarted | None = field(default=None, init=False, repr=False)

    def prestart(self, data: bytes, method: str, work_dir: Path) -> server.Prestarted | None:
        """TargetSpec.prestart: the bundled server of `method` spawned now on the bundle's bytes `data` (the
        host reads and verifies them meanwhile; `run` adopts it only for the bundle vouched for, else it is
        killed). None when this lane would not serve it that way: a runner without bundled serving, or a
        setting that gives each case its own process. Raises what starting it raises (no runner, no qemu)."""
        if self._prestarted is not None or server.own_process_reason(
                self.settings.server, 1, self.settings.etdump, self.settings.print_output) is not None:
            return None
        qemu, runner = self._binaries()
        if runner_meta(runner).get("server_testset") is not True:
            return None
        self._prestarted = server.prestart(data, method, self._command(qemu, runner), Path(work_dir) / "qemu-user",
                                           self._threads())
        return self._prestarted

    def _command(self, qemu: str, runner: Path) -> list[str]:
        from bundlerun.targets import argv  # start-up: not loaded by `bundlerun --help`

        cpu_args = ["-cpu", argv.word(self.settings.cpu, "qemu cpu")] if self.settings.cpu else []
        return [argv.program(qemu, "qemu"), *cpu_args, argv.local_path(runner, "runner")]

    def _threads(self) -> list[str]:
        return ["--cpu_threads", str(int(self.settings.cpu_threads))] if self.settings.cpu_threads is not None else []

    def close(self) -> None:
        """The prestarted server `run` did not adopt: killed, reaped, its folder removed."""
        prestarted, self._prestarted = self._prestarted, None
        if prestarted is not None:
            prestarted.discard()

    def _binaries(self) -> tuple[str, Path]:
        qemu = qemu_for(self.arch, self.settings.qemu)
        cached = None if self.settings.runner else cached_runner(self.arch)
        runner = self.settings.runner or (cached or {}).get("binary")
        if runner is None:
            raise TargetError(f"no {self.arch} executor_runner in the build cache; {BUILD_HINT}")
        return qemu, runner_binary(runner, f"the {self.arch}", BUILD_HINT, executable=False)

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        prestarted, self._prestarted = self._prestarted, None
        try:
            return self._run(bundle, options, prestarted)
        finally:
            if prestarted is not None:
                prestarted.discard()  # nothing when serve() adopted it

    def _run(self, bundle: Bundle, options: RunOptions, prestarted: server.Prestarted | None) -> TargetRun:
        qemu, runner = self._binaries()
        work = Path(options.work_dir) / "qemu-user"
        meta = runner_meta(runner)
        delegates = meta.get("backends") if meta else None
        run = TargetRun(self.url, [], info={
            "qemu": qemu, "cpu": self.settings.cpu, "cpu_threads": self.settings.cpu_threads, "runner": str(runner),
            "arch": self.arch, "kernels": "+".join(meta.get("kernels") or ["portable"]),
            "delegates": delegates if delegates is not None else "unknown (runner built elsewhere)",
            "timing": "emulated CPU time, not device latency"})
        if meta.get("xnnpack"):
            run.info["xnnpack"] = meta["xnnpack"]
        llm_ops = sorted(op for op in program_operators(bundle.program, "bundle") if op.startswith("llama::"))
        if llm_ops and meta and "llm" not in (meta.get("kernels") or []):
            raise TargetError(f"the program calls ExecuTorch's LLM custom ops ({', '.join(llm_ops)}), which runner "
                              f"{runner} was built without; {BUILD_HINT}", kind="unsupported")
        bundled = meta.get("server_testset") is True  # the patched server mode: a case index per trigger
        executions = executor_runner.executions_for(getattr(options, "repeat", 1))
        if executions > 1:
            run.info.update(repeat=executions - 1, warmup=1, num_executions=executions)
        command = self._command(qemu, runner)

        def serve(method: str, indices: list[int]) -> list[int]:
            nonlocal prestarted
            offered, prestarted = prestarted, None  # the first method served, if it is the one prestarted
            return server.serve(bundle, method, indices, command, work, options.case_timeout_s, executor_runner.classify,
                                "the runner", lambda r: run.record(r, options), extra_args=self._threads(),
                                bundled=bundled, meanwhile=options.meanwhile, prestarted=offered)

        with responsive_waits():  # the judge-ahead thread must not delay each step (targets/gil_handoff.py)
            self._run_cases(bundle, options, run, executions, serve, qemu, runner, work, bundled)
        if bundled:
            run.info["served_inputs"] = "bundled test case per trigger (one loaded method: mutable buffers kept)"
        return run

    def _run_cases(self, bundle: Bundle, options: RunOptions, run: TargetRun, executions: int,
                   serve: Callable[[str, list[int]], list[int]], qemu: str, runner: Path, work: Path,
                   bundled: bool) -> None:
        server.run_cases(
            bundle, options, run,
            server.own_process_reason(self.settings.server, executions, self.settings.etdump, self.settings.print_output),
            serve,
            lambda method, index: self._case(bundle, method, index, qemu, runner, work, options.case_timeout_s,
                                             executions),
            bundled=bundled)

    def _case(self, bundle: Bundle, method: str, index: int, qemu: str, runner: Path, work: Path,
              timeout_s: float, executions: int = 1) -> CaseResult:
        from bundlerun.bundles.bpte import serialize_bundle  # start-up: not loaded by `bundlerun --help`

        folder = work / f"{safe_name(method)}-{index}"
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "out").mkdir(parents=True)
        # the scratch input of one process: a plain write (write_bundle's durable, fsync'd write is for results)
        (folder / "model.bpte").write_bytes(serialize_bundle(bundle.single_case(method, index)))
        etdump = "out/model.etdump" if self.settings.etdump else None
        args = executor_runner.runner_args("model.bpte", method, "out/output", print_output=self.settings.print_output,
                                           etdump=etdump, num_executions=executions,
                                           cpu_threads=self.settings.cpu_threads)
        log_path = folder / "runner.log"
        rc, elapsed, output = run_under_qemu(qemu, runner, args, folder, log_path, timeout_s, cpu=self.settings.cpu)
        verdict = executor_runner.device_verdict(output)
        base = dict(method=method, case_index=index, log_path=str(log_path), elapsed_s=elapsed, device_verdict=verdict,
                    perf=executor_runner.perf_figures(output, simulated=True))
        return executor_runner.case_result(bundle, method, index, folder, rc, output, timeout_s,
                                           executor_runner.classify, base, etdump=etdump)


def create(url: TargetURL, config: dict) -> QemuUserTarget:
    arch = url.rest.lower()
    if arch not in ARCHES:
        raise TargetError(f"unknown architecture {arch!r} in {url.raw}; known: "
                          + ", ".join(f"qemu-user://{a}" for a in ARCHES), kind=FailureKind.BAD_CONFIG)
    settings = parse_settings(QemuUserSettings, {**config, **url.query}, "targets.qemu-user")
    return QemuUserTarget(url.raw, arch, settings)
