"""host://xnnpack and host://portable: the real ExecuTorch runtime on this machine.

The program is loaded once per bundle in a child process (targets.workers.host)
so a segfault, abort or hang of the runtime becomes a classified ERROR/TIMEOUT
for that case instead of taking the tool down. Within a command (a Session), that
child is a warm worker reused across bundles: torch and the pybindings are
imported once, each bundle is loaded on request (targets.workers.supervisor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.errors import TargetError
from bundlerun.targets import Check, ElapsedClock, TargetSpec, TargetURL, parse_target_url
from bundlerun.targets.base import RunOptions, TargetBase, TargetRun
from bundlerun.targets.settings import did_you_mean, parse_settings
from bundlerun.targets.workers.supervisor import run_in_worker
from bundlerun.targets.base import PerfKind
from bundlerun.targets.failures import FailureKind

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

VARIANTS = ("xnnpack", "portable")


@dataclass
class HostTarget(TargetBase):
    url: str
    variant: str
    threads: int = 0

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        args = [str(Path(bundle_path).resolve()), str(options.work_dir / "host-outputs")]
        if self.threads:
            args += ["--threads", str(self.threads)]
        info = {"runtime": "executorch pybindings", "variant": self.variant}
        if options.repeat > 1:  # one warm-up execution per case (its outputs are judged) + N timed ones
            args += ["--repeat", str(options.repeat)]
            info.update(repeat=options.repeat, warmup=1)
        if getattr(options, "replay", 1) > 1:  # --replay N: each case N times in the loaded program
            args += ["--replay", str(options.replay)]
        warnings = []
        built = bundle.manifest.build.backend if bundle.manifest else None
        if self.variant == "portable" and built not in (None, "portable"):
            warnings.append(f"{self.url}: this bundle was lowered for {built}; the runtime runs its {built} "
                            "delegate, not portable kernels (build with --backend portable to test those)")
        return run_in_worker(self.url, "bundlerun.targets.workers.host", args, bundle, options, "host-runtime",
                             info, warnings, warm=True)


@dataclass
class HostSettings:
    """[targets.host] / host://VARIANT?threads=N"""

    threads: int = 0  # runtime threads (0: the runtime's default)


def _doctor(_section: dict) -> list[Check]:
    from bundlerun.targets.probes import dist_check  # start-up: not loaded by `bundlerun --help`

    return [dist_check("executorch", "executorch"), dist_check("torch", "torch")]


def _capture(url: str, config: dict, bundle_path: Path, method: str, case: int, work_dir: Path, timeout_s: float,
             debug_buffer_mb: int, prefix: tuple[int, ...] = ()):
    """`bundlerun debug`: the real runtime loaded with ETDump and a debug buffer (targets/workers/debug.py);
    `prefix` cases run first on the same loaded method."""
    from bundlerun.targets.intermediates import run_worker  # start-up: not loaded by `bundlerun --help`

    create(parse_target_url(url), config)  # the URL and its settings are checked as for a run
    return run_worker(url, "host", bundle_path, method, case, work_dir, timeout_s, debug_buffer_mb,
                      "every kernel call and every delegate call (runtime ETDump + debug buffer)", prefix=prefix)


SPEC = TargetSpec(
    name="host",
    schemes=("host",),
    summary="the ExecuTorch runtime (pybindings) on this machine, in a supervised child process",
    examples=("host://xnnpack", "host://portable"),
    default_backend=lambda url: "portable" if url.rest.lower().startswith("portable") else "xnnpack",
    settings=HostSettings,
    doctor=_doctor,
    capture=_capture,
    capture_prefix=True,
    elapsed=ElapsedClock("execution_wall_time", PerfKind.HOST_WALL,
                         "host worker: wall time of the program's run_method (elapsed_s)", phased=True),
    repeat=True,
    replay=True,  # --replay: the host worker runs each case N times in one loaded program
    stateful=True,  # one loaded module per bundle, cases in suite order (targets/workers/host.py)
    io_state=True,  # the worker threads an io-state KV cache (targets/workers/io_state.py)
)


def create(url: TargetURL, config: dict) -> HostTarget:
    variant = (url.rest or "xnnpack").lower()
    if variant not in VARIANTS:
        raise TargetError(f"unknown host variant {variant!r} in {url.raw}{did_you_mean(variant, VARIANTS)}; "
                          "use host://xnnpack or host://portable", kind=FailureKind.BAD_CONFIG)
    settings = parse_settings(HostSettings, {**config, **url.query}, "targets.host")
    return HostTarget(url.raw, variant, settings.threads)
