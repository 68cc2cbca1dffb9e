"""`mlx://cpu` (any machine with `mlx[cpu]`) and `mlx://gpu` (a Mac, Metal): MLX bundles on MLX's own kernels.

The bundle's program is walked in Python (targets.program.walker); each `MLXBackend`
delegate payload runs through targets.program.mlx_delegate, an interpreter over
the `mlx` package that follows ExecuTorch's C++ MLXInterpreter node for node,
with constants from the program's named data. It runs in a supervised child
process (targets.worker_process), so a crash or hang is one case's ERROR/TIMEOUT.
Times are interpreter times, not device latency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import platform
from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.errors import TargetError
from bundlerun.targets import Check, ElapsedClock, TargetSpec, TargetURL, lazy
from bundlerun.targets.base import RunOptions, TargetBase, TargetRun
from bundlerun.targets.settings import check_keys
from bundlerun.targets.worker_process import run_in_worker

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

DEVICES = ("cpu", "gpu")


def _doctor(_section: dict) -> list[Check]:
    from bundlerun.targets.probes import dist_check

    rows = [dist_check("mlx", "mlx", "mlx.core", "pip install 'bundlerun[apple]' (mlx[cpu] on Linux)")]
    if platform.system() == "Linux":
        rows.append(dist_check("mlx-cpu", "mlx-cpu", None, "pip install 'mlx[cpu]'; plain mlx has no Linux library"))
    return rows


SPEC = TargetSpec(
    name="mlx",
    schemes=("mlx",),
    summary="MLX-delegated bundles on the mlx package's own kernels (cpu anywhere, gpu on a Mac)",
    examples=("mlx://cpu", "mlx://gpu"),
    default_backend="mlx",
    doctor=_doctor,
    capture=lazy("bundlerun.targets.mlx_intermediates:capture"),
    elapsed=ElapsedClock("interpreter_time", "simulation-time",
                         "program walker: MLX delegate calls and torch kernels, wall time (elapsed_s)", phased=True),
)


@dataclass
class MlxTarget(TargetBase):
    url: str
    device: str

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        from bundlerun.targets.program.walker import WalkError, read_delegates

        try:
            ids = sorted({d.backend_id for d in read_delegates(bundle.program)})
        except WalkError as exc:
            raise TargetError(f"{self.url}: {exc.message}") from None
        foreign = [i for i in ids if i != "MLXBackend"]
        if foreign:  # said once, before any process starts
            raise TargetError(f"{self.url} cannot run this bundle: it has {', '.join(foreign)} delegates; "
                              "build it with --backend mlx", kind="unsupported")
        args = [str(Path(bundle_path).resolve()), str(options.work_dir / "mlx-outputs"), "--delegates", f"mlx-{self.device}"]
        return run_in_worker(self.url, "bundlerun.targets.program.worker", args, bundle, options, "mlx-runtime",
                             {"device": self.device, "delegates": ids, "timing": "interpreter time, not device latency"}, warm=True)


def create(url: TargetURL, config: dict) -> MlxTarget:
    check_keys("targets.mlx", {**config, **url.query}, ())
    device = url.rest.lower() or "cpu"
    if device not in DEVICES:
        raise TargetError(f"unknown MLX device {device!r} in {url.raw}; use mlx://cpu or mlx://gpu")
    if device == "gpu" and platform.system() != "Darwin":
        raise TargetError("mlx://gpu needs a Mac (Metal); on this machine use mlx://cpu")
    return MlxTarget(url.raw, device)
