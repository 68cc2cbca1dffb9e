"""host://xnnpack and host://portable: the real ExecuTorch runtime on this machine.

The program is loaded once per bundle in a child process (targets.host_worker)
so a segfault, abort or hang of the runtime becomes a classified ERROR/TIMEOUT
for that case instead of taking the tool down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import time
from dataclasses import dataclass
from pathlib import Path

from bundles.errors import TargetError
from targets import Check, TargetSpec, TargetURL
from targets.base import RunOptions, TargetRun, selected_cases
from targets.settings import parse_settings
from targets.worker_process import WorkerSupervisor, python_module_command

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundles.bpte import Bundle

VARIANTS = ("xnnpack", "portable")


@dataclass
class HostTarget:
    url: str
    variant: str
    threads: int = 0

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        pairs = selected_cases(bundle, options)
        args = [str(Path(bundle_path).resolve()), str(options.work_dir / "host-outputs")]
        if self.threads:
            args += ["--threads", str(self.threads)]
        supervisor = WorkerSupervisor(python_module_command("targets.host_worker", *args), options, "host-runtime")
        start = time.perf_counter()
        cases = supervisor.run(pairs)
        info = {"runtime": "executorch pybindings", "variant": self.variant, **supervisor.info}
        warnings = []
        built = (bundle.manifest or {}).get("build", {}).get("backend")
        if self.variant == "portable" and built not in (None, "portable"):
            warnings.append(f"{self.url}: this bundle was lowered for {built}; the runtime runs its {built} "
                            "delegate, not portable kernels (build with --backend portable to test those)")
        logs = {p.stem: str(p) for p in sorted(options.work_dir.glob("host-runtime-*.log"))}
        run = TargetRun(self.url, cases, info=info, logs=logs, setup_s=supervisor.setup_s, warnings=warnings)
        run.info["wall_s"] = time.perf_counter() - start
        return run


@dataclass
class HostSettings:
    """[targets.host] / host://VARIANT?threads=N"""

    threads: int = 0  # runtime threads (0: the runtime's default)


def _doctor(_section: dict) -> list[Check]:
    from targets.probes import dist_check

    return [dist_check("executorch", "executorch"), dist_check("torch", "torch")]


SPEC = TargetSpec(
    name="host",
    schemes=("host",),
    summary="the ExecuTorch runtime (pybindings) on this machine, in a supervised child process",
    examples=("host://xnnpack", "host://portable"),
    default_backend=lambda url: "portable" if url.rest.lower().startswith("portable") else "xnnpack",
    settings=HostSettings,
    doctor=_doctor,
)


def create(url: TargetURL, config: dict) -> HostTarget:
    variant = (url.rest or "xnnpack").lower()
    if variant not in VARIANTS:
        raise TargetError(f"unknown host variant {variant!r} in {url.raw}; use host://xnnpack or host://portable")
    settings = parse_settings(HostSettings, {**config, **url.query}, "targets.host")
    return HostTarget(url.raw, variant, settings.threads)
