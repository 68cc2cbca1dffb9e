"""tosa://int and tosa://fp: the bundle's program on the TOSA reference model.

The program itself is executed (targets.program.walker walks its execution plan):
kernel calls outside the delegate run on torch's reference ops, `TOSABackend`
delegate calls run their TOSA flatbuffer on `tosa_reference_model`. It runs in
a child process (targets.workers.program under targets.workers.supervisor's supervisor),
so a crash or hang of the reference model is one case's ERROR/TIMEOUT.

A program lowered for Ethos-U carries a Vela command stream instead of a TOSA
graph; that cannot run here, and the target says so before starting anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.errors import TargetError
from bundlerun.targets import Check, ElapsedClock, TargetSpec, TargetURL, parse_target_url
from bundlerun.targets.settings import check_keys
from bundlerun.targets.base import RunOptions, TargetBase, TargetRun
from bundlerun.targets.workers.supervisor import run_in_worker
from bundlerun.targets.base import PerfKind
from bundlerun.targets.failures import FailureKind

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle

PROFILES = {"int": "TOSA-1.0+INT", "fp": "TOSA-1.0+FP"}
RUNNABLE_BACKENDS = ("TOSABackend",)


@dataclass
class TosaTarget(TargetBase):
    url: str
    profile: str  # "int" | "fp"

    def preflight(self, bundle: Bundle) -> dict:
        """Refuse programs whose delegates the reference model cannot execute."""
        from bundlerun.targets.program.walker import WalkError, read_delegates  # start-up: not loaded by `bundlerun --help`

        try:
            delegates = read_delegates(bundle.program)
        except WalkError as exc:
            raise TargetError(f"{self.url}: {exc.message}") from None
        ids = sorted({d.backend_id for d in delegates})
        if "EthosUBackend" in ids:
            raise TargetError(
                f"{self.url} cannot run this bundle: it was lowered for Ethos-U (EthosUBackend carries a Vela "
                "command stream, not a TOSA graph); rebuild it with --target tosa://int to run it on the TOSA "
                "reference model, or run it on its fvp:// target", kind=FailureKind.UNSUPPORTED
            )
        # Other backends (XNNPACK, ...) are reported per case by the worker as
        # error_kind "missing-backend", naming the backend.
        specs = sorted({d.compile_specs.get("tosa_spec", b"").decode() for d in delegates} - {""})
        info: dict = {"tosa_specs": specs, "delegate_count": len(delegates)}
        want = PROFILES[self.profile]
        mismatched = [s for s in specs if not s.startswith(want)]
        foreign = [i for i in ids if i not in RUNNABLE_BACKENDS]
        if foreign:
            info["unsupported_backends"] = foreign
        if mismatched:
            info["note"] = f"bundle was lowered for {', '.join(mismatched)}, run on {self.url} ({want})"
        if not delegates:
            info["note"] = "program has no TOSA delegate: every op runs on torch reference kernels"
        return info

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        info = {"profile": PROFILES[self.profile], **self.preflight(bundle)}
        args = [str(Path(bundle_path).resolve()), str(options.work_dir / "tosa-outputs")]
        if getattr(options, "replay", 1) > 1:  # --replay N: each case N times in the walker
            args += ["--replay", str(options.replay)]
        return run_in_worker(self.url, "bundlerun.targets.workers.program", args, bundle, options, "tosa-runtime", info, warm=True)


def _doctor(_section: dict) -> list[Check]:
    from bundlerun.targets.probes import dist_check  # start-up: not loaded by `bundlerun --help`

    return [dist_check("tosa-tools", "tosa-tools", "tosa_reference_model", "pip install 'bundlerun[arm]'")]


def _capture(url: str, config: dict, bundle_path: Path, method: str, case: int, work_dir: Path, timeout_s: float,
             debug_buffer_mb: int):
    """`bundlerun debug`: the program walker with an observer; the reference model runs each TOSA
    payload once with every operator's output made a graph output (targets/program/tosa_delegate.py)."""
    from bundlerun.targets.intermediates import run_worker  # start-up: not loaded by `bundlerun --help`

    create(parse_target_url(url), config)
    return run_worker(url, "tosa", bundle_path, method, case, work_dir, timeout_s, debug_buffer_mb,
                      "every kernel call, every TOSA delegate call and every TOSA operator inside it (program "
                      "walker; the reference model run once with every operator's output as a graph output)")


def _lowering(url: TargetURL) -> dict:
    """tosa://int -> the TOSA-1.0+INT profile (TOSAQuantizer + TOSAPartitioner), tosa://fp -> +FP."""
    profile = url.rest.lower()
    if profile not in PROFILES:
        raise TargetError(f"unknown TOSA target {url.raw!r}; use tosa://int or tosa://fp", kind=FailureKind.BAD_CONFIG)
    return {"arm": "tosa", "integer": profile == "int", "tosa_spec": PROFILES[profile]}


SPEC = TargetSpec(
    name="tosa",
    schemes=("tosa",),
    summary="the bundle's own program, TOSA delegate payloads on the TOSA reference model (tosa-tools)",
    examples=("tosa://int", "tosa://fp"),
    default_backend="arm",
    doctor=_doctor,
    replay=True,  # --replay: the program walker runs each case N times in one process
    capture=_capture,
    lowering=_lowering,
    elapsed=ElapsedClock("interpreter_time", PerfKind.SIMULATION_TIME,
                         "program walker: TOSA reference model delegate calls and torch kernels, wall time (elapsed_s)",
                         phased=True),
)


def create(url: TargetURL, config: dict) -> TosaTarget:
    check_keys("targets.tosa", {**config, **url.query}, ())
    profile = url.rest.lower()
    if profile not in PROFILES:
        raise TargetError(f"unknown TOSA profile {profile!r} in {url.raw}; use tosa://int or tosa://fp",
                          kind=FailureKind.BAD_CONFIG)
    return TosaTarget(url.raw, profile)
