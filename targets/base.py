"""The one interface every target implements, and the records it returns.

A target deploys a bundle, runs every test case of every method, and brings
back raw outputs (dtype + shape + bytes) with logs and timings. It never judges
numerics: that is runner/'s job. It reports *how* a case ended (`CaseStatus`):
ok, error (could not run or collect), or timeout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from bundlerun.targets.failures import FailureKind

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle


class CaseStatus(str, enum.Enum):
    """How a target ended a case; the value is what the report stores (`status`)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIP = "skip"

    def __str__(self) -> str:  # the report value, also in f-strings
        return self.value


class Verdict(str, enum.Enum):
    """The verdict of an output, a case or a run (docs/report-schema.md), decided on the host by
    runner/ (a target only relays a device's own PASS/FAIL, `DeviceVerdict`). A str, so it equals,
    hashes and serialises as the report's string; the order is severity for display only."""

    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    SKIP = "SKIP"

    def __str__(self) -> str:  # the report value, also in f-strings and XML attributes
        return self.value


@dataclass
class RawTensor:
    """One output as the device produced it: ExecuTorch ScalarType code, shape, raw bytes."""

    scalar_type: int
    shape: list[int]
    data: bytes
    lossy: bool = False  # decoded from 6-decimal text (UART `Output[i][j]` lines)

    def to_array(self):
        from bundlerun.bundles.scalar_types import to_array  # start-up: not loaded by `bundlerun --help`

        return to_array(self.scalar_type, self.shape, self.data)


@dataclass
class DeviceVerdict:
    """A runner's own BundleIO verdict on test case 0 of the bundle it ran. For
    information only: its tolerances are compiled in and its rtol scales the
    actual value; bundlerun's verdict is decided on the host."""

    verdict: Verdict | None  # PASS | FAIL | None
    source: str  # which runner said it
    tolerances: dict[str, float] = field(default_factory=dict)
    status: int | None = None  # e.g. `Bundle verification failed with status 0x..`
    error_stats: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "verdict": self.verdict}
        if self.tolerances:
            out["tolerances"] = dict(self.tolerances)
        if self.status is not None:
            out["status"] = self.status
        if self.error_stats:
            out["error_stats"] = dict(self.error_stats)
        return out


class PerfKind(str, enum.Enum):
    """What a performance figure measures and on which clock (docs/report-schema.md, "perf")."""

    DEVICE_LATENCY = "device-latency"          # time measured by the runtime on the real device
    DEVICE_CYCLES = "device-cycles"            # cycle counters of the real device (CPU PMU, NPU PMU)
    DEVICE_COUNTER = "device-counter"          # other hardware event counters of the real device (bus beats, idle cycles)
    SIMULATION_TIME = "simulation-time"        # time under a simulator, emulator or interpreter: never device latency
    SIMULATION_CYCLES = "simulation-cycles"    # cycle counters of a simulator model (FVP, QEMU): not cycle accurate
    SIMULATION_COUNTER = "simulation-counter"  # event counters of a simulator model
    HOST_WALL = "host-wall"                    # the host's wall clock (process start-up, transfers included where said)
    MEMORY = "memory"                          # bytes (program size, allocator use and capacity)
    COUNT = "count"                            # inferences, delegate calls
    RATIO = "ratio"                            # percent

    def __str__(self) -> str:  # the report value, also in f-strings
        return self.value


PERF_KINDS = tuple(k.value for k in PerfKind)


@dataclass
class PerfFigure:
    """One performance figure of one case: its value, unit, what it measures (`kind`, one of
    PERF_KINDS) and where it came from. A figure a target cannot give is absent, never 0."""

    name: str  # e.g. "inference_cpu_cycles", "method_allocator_used", "execution_time"
    value: float | int  # the total over the run's inferences where the runner sums them
    unit: str  # "cycles" | "instructions" | "events" | "ms" | "s" | "bytes" | "count" | "%"
    kind: PerfKind
    source: str  # e.g. "arm_executor_runner log (arm_perf_monitor.cpp)"
    per_inference: float | None = None  # as the runner printed it, when it ran several inferences
    phase: str | None = None  # "first" (cold: the method's first execution) | "warm"
    samples: list[float] | None = None  # the individual measurements behind a median
    note: str | None = None

    def __post_init__(self) -> None:
        self.kind = PerfKind(self.kind)  # a kind given as its report string becomes the member; another fails

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "value": self.value, "unit": self.unit, "kind": self.kind,
                               "source": self.source}
        for key in ("per_inference", "phase", "samples", "note"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PerfFigure":
        missing = [k for k in ("name", "value", "unit", "kind", "source") if k not in data]
        if missing:
            raise ValueError(f"a perf figure has no {', '.join(missing)}")
        if data["kind"] not in PERF_KINDS:
            raise ValueError(f"perf kind {data['kind']!r} is not one of {', '.join(PERF_KINDS)}")
        if isinstance(data["value"], bool) or not isinstance(data["value"], (int, float)):
            raise ValueError(f"perf figure {data['name']!r} has a non-numeric value {data['value']!r}")
        known = {"name", "value", "unit", "kind", "source", "per_inference", "phase", "samples", "note"}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class CaseResult:
    """Outcome of one test case of one method on a target."""

    method: str
    case_index: int
    status: CaseStatus
    outputs: list[RawTensor] = field(default_factory=list)
    error: str | None = None  # one-line classification when status != OK
    error_kind: FailureKind | None = None  # why there are no judgeable outputs (targets.failures)
    log_excerpt: list[str] = field(default_factory=list)  # the relevant log lines
    log_path: str | None = None  # full log saved beside the report
    elapsed_s: float | None = None  # wall time of the execution itself
    device_verdict: dict[str, Any] | None = None  # DeviceVerdict.to_dict(): the runner's own BundleIO check
    extra: dict[str, Any] = field(default_factory=dict)
    perf: list[PerfFigure] = field(default_factory=list)  # what the target measured; absent = cannot give
    replays: list[list[RawTensor]] = field(default_factory=list)  # --replay N: the outputs of runs 2..N

    def __post_init__(self) -> None:
        # One closed set of failure kinds (targets.failures); older free-text kinds map onto it.
        self.error_kind = FailureKind.parse(self.error_kind)

    def add_perf(self, figures: list[PerfFigure]) -> None:
        self.perf.extend(figures)


@dataclass
class TargetRun:
    """Everything a target returns for one bundle."""

    target: str
    cases: list[CaseResult]
    info: dict[str, Any] = field(default_factory=dict)  # device/tool versions, binaries used
    logs: dict[str, str] = field(default_factory=dict)  # name -> saved log path
    setup_s: float | None = None  # deploy / load time outside the cases
    warnings: list[str] = field(default_factory=list)  # said on the console and in the report

    def record(self, result: CaseResult, options: "RunOptions") -> None:
        """Add one finished case: its log is listed and the run's progress hears of it at once
        (which is also what keeps finished cases when the user interrupts)."""
        self.cases.append(result)
        if result.log_path:
            self.logs[f"{result.method}[{result.case_index}]"] = result.log_path
        if options.progress:
            options.progress(result)


ProgressFn = Callable[[CaseResult], None]


@dataclass
class RunOptions:
    """Knobs every target understands; target-specific settings live in its config."""

    work_dir: Path  # scratch + saved logs for this run
    case_timeout_s: float = 120.0  # wall-clock bound for one case
    setup_timeout_s: float = 300.0  # bound for deploy/load
    methods: list[str] | None = None  # None = all methods in the bundle
    cases: list[int] | None = None  # None = all cases
    retries: int = 1  # transient transport faults only, never numerics
    config: dict[str, Any] = field(default_factory=dict)  # [targets.<scheme>] section + CLI flags
    progress: ProgressFn | None = None
    # `--repeat N`: N measured executions per case after one warm-up execution (excluded from the warm
    # figures). A target that honours it sets TargetRun.info["repeat"]; executor_runner lanes (adb://,
    # qemu-user://) map it to --num_executions N+1, host:// times N more run_method calls per case.
    # 1 = one execution, as before.
    repeat: int = 1
    # `--replay N` (determinism replay, runner/judging/replay.py): a target whose SPEC declares `replay=True` runs
    # each case N times in its own loop (one process or boot) and returns the N-1 later runs' outputs in
    # CaseResult.replays; for the others the runner repeats the whole run. 1 = no replay.
    replay: int = 1
    # The command's own work to do while the target's runtime starts (the judge's imports and set-up:
    # runner/session.py). A target that spawns a runtime calls it after the spawn, before waiting for the
    # runtime to load (targets/et_runner/server.py, the runtime workers' targets/workers/supervisor.py);
    # it may be called again (it runs once). A target
    # that does not call it loses nothing: the session calls it before the first result is judged.
    meanwhile: Callable[[], None] | None = None


@runtime_checkable
class Target(Protocol):
    """What runner/ calls. Implementations live one per module in targets/; what else a target can
    do (debug capture, farm device, lowering, repeat, ...) is declared in its module's SPEC."""

    url: str

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        """Run the selected cases. Must not raise for a per-case failure: return
        CaseResult(status=ERROR/TIMEOUT). Raise TargetError only when nothing at
        all can run (missing tool, unreachable device); the runner then marks
        every case ERROR with that message."""
        ...

    def close(self) -> None:
        """Release what the target holds (a connection, a reservation, a booted device). The
        session calls it once, when the command's bundles are done (SPEC.keep_open: the same
        target serves every bundle of the command), or after the bundle otherwise."""
        ...


class TargetBase:
    """A target that holds nothing between bundles: `close()` does nothing; usable as a context
    manager like every target."""

    def close(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def safe_name(name: str) -> str:
    """A method or case name made safe for a file name (bundle text is never a path)."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "method"


def selected_cases(bundle: Bundle, options: RunOptions) -> list[tuple[str, int]]:
    """(method, case index) pairs to run, in bundle order."""
    pairs = []
    for suite in bundle.method_test_suites:
        if options.methods and suite.method_name not in options.methods:
            continue
        for i in range(len(suite.test_cases)):
            if options.cases is None or i in options.cases:
                pairs.append((suite.method_name, i))
    return pairs


def expected_layout(bundle: Bundle, method: str, case_index: int) -> list[tuple[int, list[int]]]:
    """(scalar_type, shape) of each expected output: how headerless raw output
    files (out-<i>.bin, output_<i>_<j>.raw) are decoded."""
    case = bundle.suite(method).test_cases[case_index]
    return [(v.scalar_type, list(v.sizes)) for v in case.expected_outputs if v.kind == "tensor"]


def raw_outputs_from_files(
    files: list[Path], layout: list[tuple[int, list[int]]]
) -> tuple[list[RawTensor], str | None]:
    """Read headerless output files against the expected layout.

    Returns (outputs, error). A missing or wrong-size file is an error naming
    the file and both sizes; nothing is guessed.
    """
    def read(path: Path) -> tuple[str, bytes | str]:
        try:
            return Path(path).name, Path(path).read_bytes()
        except OSError as exc:
            return Path(path).name, f"cannot read output file {Path(path).name}: {exc.strerror}"

    return raw_outputs_from_bytes((read(path) for path in files), layout, len(files))


def raw_outputs_from_bytes(
    read: Iterable[tuple[str, bytes | str]], layout: list[tuple[int, list[int]]], count: int
) -> tuple[list[RawTensor], str | None]:
    """raw_outputs_from_files over `count` files as (name, bytes, or why it could not be read), taken in
    order: a served runner's, read at once because its next trigger overwrites them (et_runner/server.py)."""
    from bundlerun.bundles.scalar_types import itemsize, name  # start-up: not loaded by `bundlerun --help`

    outputs: list[RawTensor] = []
    if count < len(layout):
        return outputs, f"expected {len(layout)} output files, found {count}"
    for (code, shape), (file_name, data) in zip(layout, read):  # layout first: no file read past it
        if isinstance(data, str):
            return outputs, data
        numel = 1
        for s in shape:
            numel *= s
        want = numel * itemsize(code)
        if len(data) != want:
            return outputs, (
                f"output file {file_name} has {len(data)} bytes, expected {want} "
                f"({name(code)}{shape})"
            )
        outputs.append(RawTensor(code, list(shape), data))
    return outputs, None
