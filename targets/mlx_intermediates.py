"""`bundlerun debug` on mlx://cpu and mlx://gpu: every MLX instruction's outputs.

Always on bundlerun's MLX interpreter, whatever `runtime` says: ExecuTorch's C++ MLX delegate
(the mlx://cpu default, targets/mlx_runner.py) has no event-tracer calls in backends/mlx/runtime,
so its ETDump holds the delegate call alone; the interpreter, held to the same outputs as the
C++ delegate (tests/test_mlx_cpp_delegate.py), yields every instruction's tensors.

The bundle's program is walked in Python (targets/program/walker.py) in a child
process (targets/workers/debug.py, mode `mlx`), so a crash or hang of the mlx
package kills only that child. The MLX delegate (targets/program/mlx_delegate.py)
records, after each instruction of its main chain, the tensors the instruction
wrote (`capture_inner`); the walker's observer turns them into one "delegate-op"
row per instruction, followed by the delegate call's own row, plus one row per
kernel call outside the delegate.

Mapping back to the eager graph (runner/debug/localize.py): an MLX payload carries no names
or debug handles for its instructions, so `build --etrecord` records which FX node
each instruction was emitted for (bundles/etrecord.py, `<stem>.delegates.json`).
"""

from __future__ import annotations

import platform
from pathlib import Path

from bundlerun.bundles.errors import TargetError
from bundlerun.targets.intermediates import IntermediateRun, IntermediatesUnsupported, run_worker
from bundlerun.targets.mlx import MlxSettings
from bundlerun.targets.program.walker import WalkError, read_delegates
from bundlerun.targets.settings import parse_settings

GRANULARITY = ("every kernel call, every MLX delegate call and every MLX instruction of its main chain (program "
               "walker; the mlx package's own kernels)")


def capture(url: str, config: dict, bundle_path: Path, method: str, case: int, work_dir: Path, timeout_s: float,
            debug_buffer_mb: int) -> IntermediateRun:
    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers on use

    device = (url.partition("://")[2].split("?", 1)[0] or "cpu").lower()
    if device not in ("cpu", "gpu"):
        raise TargetError(f"unknown MLX device {device!r} in {url}; use mlx://cpu or mlx://gpu")
    if device == "gpu" and platform.system() != "Darwin":
        raise TargetError("mlx://gpu needs a Mac (Metal); on this machine use mlx://cpu")

    # the mlx:// target's settings; `runtime` does not apply: only the interpreter sees inside the payload
    parse_settings(MlxSettings, dict(config), "targets.mlx")
    try:
        ids = sorted({d.backend_id for d in read_delegates(read_bundle(bundle_path).program)})
    except WalkError as exc:
        raise TargetError(f"{url}: {exc.message}") from None
    foreign = [i for i in ids if i != "MLXBackend"]
    if foreign:
        raise IntermediatesUnsupported(f"{url}: cannot return intermediate outputs of this bundle: it has "
                                       f"{', '.join(foreign)} delegates (build it with --backend mlx)")
    return run_worker(url, "mlx", bundle_path, method, case, work_dir, timeout_s, debug_buffer_mb, GRANULARITY,
                      ("--device", device))


__all__ = ["capture", "GRANULARITY"]
