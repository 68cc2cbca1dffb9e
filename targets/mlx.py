"""`mlx://cpu` (Linux x86_64 with `mlx[cpu]`) and `mlx://gpu` (a Mac, Metal): MLX bundles on MLX's own kernels.

Two runtimes, chosen by the `runtime` setting:

* `delegate` (the default on Linux x86_64 for mlx://cpu): ExecuTorch's own C++ MLX delegate
  (backends/mlx/runtime) in ExecuTorch's executor_runner, built from the pinned sources against
  the mlx wheel's libmlx.so by firmware_scripts/mlx/build_mlx_runner.sh (targets/mlx_runner.py).
  A missing runner is an error naming the build command, never a silent fallback.
* `interpreter` (mlx://gpu, and any other machine): bundlerun's Python re-implementation of that
  interpreter over the `mlx` package (targets.program.mlx_delegate), walking the program in
  Python (targets.program.walker) in a supervised child process. It stays for what the C++
  delegate cannot do: every MLX instruction's outputs for `bundlerun debug` (the delegate has no
  event-tracer calls), and Metal through mlx://gpu. tests/test_mlx_cpp_delegate.py holds the two
  to the same outputs on every zoo model and dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import platform
from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.errors import TargetError
from bundlerun.targets import Check, ElapsedClock, TargetSpec, TargetURL, lazy
from bundlerun.targets.base import RunOptions, TargetBase, TargetRun
from bundlerun.targets.settings import parse_settings
from bundlerun.targets.workers.supervisor import run_in_worker
from bundlerun.targets.base import PerfKind
from bundlerun.targets.failures import FailureKind

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

DEVICES = ("cpu", "gpu")
RUNTIMES = ("auto", "delegate", "interpreter")


@dataclass
class MlxSettings:
    """[targets.mlx] / mlx://cpu?KEY=VALUE"""

    # delegate: ExecuTorch's C++ MLX delegate in executor_runner; interpreter: bundlerun's Python MLX
    # interpreter; auto: delegate for mlx://cpu on Linux x86_64 (where build_mlx_runner.sh builds it),
    # interpreter elsewhere (mlx://gpu, a Mac: there host:// runs the C++ delegate of the macOS wheel)
    runtime: str = "auto"
    runner: Path | None = None  # delegate: default the cached build_mlx_runner.sh executor_runner
    etdump: bool = False  # delegate: keep the runner's ETDump (delegate-call level: MLX logs no inner events)
    print_output: str = "none"  # delegate: executor_runner --print_output
    # delegate: a method's cases on one executor_runner --server_mode process; false: a process per case
    # (each also checks its case with the runner's own BundleIO check: the report's device_verdict)
    server: bool = True

    def validate(self) -> None:
        if self.runtime not in RUNTIMES:
            raise TargetError(f"[targets.mlx] runtime must be one of {', '.join(RUNTIMES)}, not {self.runtime!r}",
                              kind=FailureKind.BAD_CONFIG)
        if self.print_output not in ("none", "summary", "all"):
            raise TargetError(f"[targets.mlx] print_output must be none, summary or all, not {self.print_output!r}",
                              kind=FailureKind.BAD_CONFIG)


def delegate_host() -> bool:
    """Where build_mlx_runner.sh builds the C++ delegate's runner."""
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


def runtime_for(device: str, settings: MlxSettings) -> str:
    if settings.runtime != "auto":
        return settings.runtime
    return "delegate" if device == "cpu" and delegate_host() else "interpreter"


def _doctor(section: dict) -> list[Check]:
    from bundlerun.targets.mlx_runner import BUILD_COMMAND, cached_mlx_runners  # start-up: not loaded by `bundlerun --help`
    from bundlerun.targets.probes import dist_check  # start-up: not loaded by `bundlerun --help`

    rows = [dist_check("mlx", "mlx", "mlx.core", "pip install 'bundlerun[apple]' (mlx[cpu] on Linux)")]
    if platform.system() == "Linux":
        rows.append(dist_check("mlx-cpu", "mlx-cpu", None, "pip install 'mlx[cpu]'; plain mlx has no Linux library"))
    settings = parse_settings(MlxSettings, section, "targets.mlx")
    if runtime_for("cpu", settings) != "delegate":
        rows.append(Check("MLX C++ delegate runner", None, f"mlx://cpu runs bundlerun's interpreter here (runtime="
                          f"{settings.runtime}); the runner is built for Linux x86_64"))
        return rows
    if settings.runner is not None:
        rows.append(Check("MLX C++ delegate runner", settings.runner.is_file(), "runner setting", str(settings.runner)))
        return rows
    runners = cached_mlx_runners()
    if not runners:
        rows.append(Check("MLX C++ delegate runner", False, f"none built; mlx://cpu needs it: {BUILD_COMMAND}"))
    for r in runners:
        rows.append(Check(f"MLX C++ delegate runner {Path(r['dir']).name}", r["ready"],
                          r["detail"] if r["ready"] else f"{r['detail']}; rebuild: {BUILD_COMMAND} --rebuild", r["dir"]))
    return rows


SPEC = TargetSpec(
    name="mlx",
    schemes=("mlx",),
    summary="MLX-delegated bundles on the mlx package's own kernels (cpu anywhere, gpu on a Mac)",
    examples=("mlx://cpu", "mlx://gpu", "mlx://cpu?runtime=interpreter"),
    default_backend="mlx",
    settings=MlxSettings,
    doctor=_doctor,
    command_settings=("runner",),  # a host executor_runner binary
    capture=lazy("bundlerun.targets.mlx_intermediates:capture"),
    elapsed=ElapsedClock("runner_case_wall_time", PerfKind.HOST_WALL,
                         "host wall clock of a case on executor_runner: one --server_mode trigger (input files read, "
                         "execute, outputs written), or where a case runs alone its whole process (libmlx load, program "
                         "load, MLX init, execute, output files); runtime=interpreter: interpreter wall time of the case"),
    repeat=True,
    # delegate: a runner built with the server-testset patch serves a method's cases on one loaded method in
    # suite order (targets/et_runner/server.py, bundled serving), so an LLM's KV cache carries from step to
    # step; a lane that would run a fresh method per case (server=false, --repeat, etdump, or an older runner
    # whose --inputs files cannot carry a prompt and a decode step) refuses a sequence there. interpreter:
    # runtime=interpreter refuses a sequence (its walker binds inputs at their upper-bound sizes only).
    stateful=True,
)


@dataclass
class MlxTarget(TargetBase):
    url: str
    device: str
    settings: MlxSettings
    runtime: str

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        from bundlerun.targets.program.walker import WalkError, read_delegates  # start-up: not loaded by `bundlerun --help`

        try:
            ids = sorted({d.backend_id for d in read_delegates(bundle.program)})
        except WalkError as exc:
            raise TargetError(f"{self.url}: {exc.message}") from None
        foreign = [i for i in ids if i != "MLXBackend"]
        if foreign:  # said once, before any process starts
            raise TargetError(f"{self.url} cannot run this bundle: it has {', '.join(foreign)} delegates; "
                              "build it with --backend mlx", kind=FailureKind.UNSUPPORTED)
        if self.runtime == "delegate":
            from bundlerun.targets import mlx_runner  # start-up: not loaded by `bundlerun --help`

            runner = mlx_runner.resolve_runner(self.settings.runner)
            return mlx_runner.run_bundle(self.url, bundle, options, runner, etdump=self.settings.etdump,
                                         print_output=self.settings.print_output, served=self.settings.server)
        from bundlerun.targets.et_runner.server import stateful_methods  # start-up: not loaded by `bundlerun --help`

        if stateful_methods(bundle):
            raise TargetError(f"{self.url}: this bundle's sequences carry a KV cache from step to step, and runtime="
                              "interpreter binds inputs only at their upper-bound sizes (a prompt and a decode step differ): "
                              "refused (run it on mlx://cpu, the C++ delegate's served runner)", kind=FailureKind.BAD_CONFIG)
        args = [str(Path(bundle_path).resolve()), str(options.work_dir / "mlx-outputs"), "--delegates", f"mlx-{self.device}"]
        return run_in_worker(self.url, "bundlerun.targets.workers.program", args, bundle, options, "mlx-runtime",
                             {"device": self.device, "delegates": ids, "timing": "interpreter time, not device latency"}, warm=True)


def create(url: TargetURL, config: dict) -> MlxTarget:
    settings = parse_settings(MlxSettings, {**config, **url.query}, "targets.mlx")
    device = url.rest.lower() or "cpu"
    if device not in DEVICES:
        raise TargetError(f"unknown MLX device {device!r} in {url.raw}; use mlx://cpu or mlx://gpu", kind=FailureKind.BAD_CONFIG)
    if device == "gpu" and platform.system() != "Darwin":
        raise TargetError("mlx://gpu needs a Mac (Metal); on this machine use mlx://cpu")
    runtime = runtime_for(device, settings)
    if runtime == "delegate" and (device != "cpu" or not delegate_host()):
        raise TargetError(f"{url.raw}: runtime=delegate is ExecuTorch's C++ MLX delegate built for mlx://cpu on Linux "
                          "x86_64; on a Mac host:// runs it (the macOS wheel registers MLXBackend)", kind=FailureKind.BAD_CONFIG)
    return MlxTarget(url.raw, device, settings, runtime)
