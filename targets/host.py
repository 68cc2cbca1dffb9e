"""host://xnnpack and host://portable: the real ExecuTorch runtime on this machine.

The program is loaded once per bundle in a child process (targets.host_worker)
so a segfault, abort or hang of the runtime becomes a classified ERROR/TIMEOUT
for that case instead of taking the tool down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bundles.bpte import Bundle
from bundles.errors import TargetError
from targets import TargetURL
from targets.base import RunOptions, TargetRun, selected_cases
from targets.worker_process import WorkerSupervisor, python_module_command

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
        if self.variant == "portable" and bundle.manifest and bundle.manifest.get("build", {}).get("backend") not in (None, "portable"):
            info["note"] = "bundle was lowered for a delegate; host runtime runs it with the delegates it has"
        logs = {p.stem: str(p) for p in sorted(options.work_dir.glob("host-runtime-*.log"))}
        run = TargetRun(self.url, cases, info=info, logs=logs, setup_s=supervisor.setup_s)
        run.info["wall_s"] = time.perf_counter() - start
        return run


def create(url: TargetURL, config: dict) -> HostTarget:
    variant = (url.netloc or url.path.strip("/") or "xnnpack").lower()
    if variant not in VARIANTS:
        raise TargetError(f"unknown host variant {variant!r} in {url.raw}; use host://xnnpack or host://portable")
    threads = int(url.query.get("threads", config.get("threads", 0)) or 0)
    return HostTarget(url.raw, variant, threads)
