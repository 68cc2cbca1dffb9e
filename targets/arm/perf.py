"""Performance figures from the log of ExecuTorch's Arm `arm_executor_runner` (FVP, QEMU, a board).

What the runner prints, read from `examples/arm/executor_runner/arm_perf_monitor.cpp` and
`arm_executor_runner.cpp` (older releases' wording too, where it differed):

* Ethos-U builds only (`StopMeasurements`): `NPU Inferences : N`, `NPU delegations: N (x per
  inference)`, `ethos-u : cycle_cnt : N cycles (...)`, `Operator(s) total: N CPU cycles (...)`,
  `Inference runtime: N CPU cycles total (...)`, `Inference CPU ratio: x %` / `Inference NPU ratio:
  x %` (`?.??` when the CPU cycle counter reads 0), `cpu_wait_for_npu_cntr : N CPU cycles (...)`,
  `ethosu_pmu_cycle_cntr : N (...)`, `ethosu_pmu_cntr<i> : N (...)` and the
  `Ethos-U PMU Events:[...]` line naming counter i. A runner without Ethos-U (QEMU's
  mps3-an547, a Cortex-M only build) prints none of these: those figures are then absent.
* Every build (`runner_init`, `log_mem_status`): `PTE Model data loaded. Size: N bytes.`,
  `Setup Method allocator pool. Size: N bytes.`, `Setting up planned buffer with mem_id=I, size N.`,
  `model_pte_program_size: N bytes.`, `model_pte_loaded_size: N bytes.`, the `X_used: U / T free: F`
  lines (input file, method allocator, planned fast pool, ETDump buffer; older runners: temp
  allocator), `method_allocator_planned|loaded|input|executor: N bytes`, `temp_allocator: N` (its
  capacity: the runner prints size(), not use), `Starting running N inferences...`.

All CPU cycle figures come from the Cortex-M PMU cycle counter (`ARM_PMU_Get_CCNTR`); when it reads
0 (no PMU) the runner prints `?.??` ratios and bundlerun drops every CPU cycle figure: a figure a
target cannot give is absent, not zero. On a simulator the counts are the model's (the FVP is not
cycle accurate, as the runner's own NOTE line says); their `kind` says so.
"""

from __future__ import annotations

import math
import re
from typing import Iterable

from bundlerun.targets.et_runner.log import LogLine, RunnerLog, parse_runner_log
from bundlerun.targets.base import PerfFigure
from bundlerun.targets.base import PerfKind

SIMULATORS = ("FVP", "QEMU")  # SessionEnd.tool values that mean "not a real device"
_PER = r"(?:\s*\((?P<per>[-+0-9.eEnaif]+) per inference\))?"
_CYCLE_RES = (  # (name, regex) for CPU cycle counters
    ("ethosu_backend_cpu_cycles", re.compile(r"^ethos-u : cycle_cnt : (?P<v>\d+) cycles" + _PER)),
    ("operators_cpu_cycles", re.compile(r"^Operator\(s\) total: (?P<v>\d+) CPU cycles" + _PER)),
    ("inference_cpu_cycles", re.compile(r"^Inference runtime: (?P<v>\d+) CPU cycles total" + _PER)),
    ("cpu_wait_for_npu_cycles", re.compile(r"^cpu_wait_for_npu_cntr : (?P<v>\d+) CPU cycles" + _PER)),
)
_NPU_CYCLES_RE = re.compile(r"^ethosu_pmu_cycle_cntr :\s*(?P<v>\d+)" + _PER)
_NPU_CNTR_RE = re.compile(r"^ethosu_pmu_cntr(?P<i>\d+) :\s*(?P<v>\d+)" + _PER)
_NPU_EVENTS_RE = re.compile(r"^Ethos-U PMU Events:\s*\[(?P<events>[^\]]*)\]")
_RATIO_RE = re.compile(r"^Inference (?P<unit>CPU|NPU) ratio: (?P<v>[0-9.]+|\?\.\?\?)\s*%?")
_NPU_INFERENCES_RE = re.compile(r"^NPU Inferences : (?P<v>\d+)")
_DELEGATIONS_RE = re.compile(r"^NPU delegations: (?P<v>\d+)" + _PER)
_STARTING_RE = re.compile(r"^Starting running (?P<v>\d+) inferences")
_PTE_LOADED_RE = re.compile(r"^(?:PTE Model data loaded|Model PTE file loaded)\. Size: (?P<v>\d+) bytes")
_POOL_RE = re.compile(r"^Setup (?P<what>Method allocator|planned FAST_MEMORY_REGION) pool\. Size: (?P<v>\d+) bytes")
# current: `with mem_id=1, size N` (mem_id = id + 1); older: `planned buffer 0, size N`; portable runner:
# `Setting up CPU planned buffer 0, size N.`
PLANNED_BUFFER_RE = re.compile(
    r"^Setting up (?:CPU )?planned buffer (?:with mem_id=(?P<mem_id>\d+)|(?P<id>\d+)), size (?P<v>\d+)")
_USED_OF_RE = re.compile(r"^(?P<name>[A-Za-z_]+?)(?:_used)?:\s+(?P<used>\d+) / (?P<total>\d+)\s+free:")
_BYTES_RE = re.compile(r"^(?P<name>model_pte_program_size|model_pte_loaded_size|method_allocator_planned|"
                       r"method_allocator_loaded|method_allocator_input|method_allocator_executor|planned_fast_used):"
                       r"\s+(?P<v>\d+) bytes(?P<rest>.*)$")
_TEMP_RE = re.compile(r"^temp_allocator:\s+(?P<v>\d+)\s*$")
_BYTES_NAMES = {"model_pte_program_size": "pte_program_size", "model_pte_loaded_size": "pte_loaded_size",
                "planned_fast_used": "planned_fast_allocator_used"}
_POOL_NAMES = {"Method allocator": "method_allocator_size", "planned FAST_MEMORY_REGION": "planned_fast_allocator_size"}
_CPU_CYCLE_NAMES = {name for name, _ in _CYCLE_RES}


def _per(m: re.Match) -> float | None:
    text = m.groupdict().get("per")
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def planned_buffer(msg: str) -> tuple[int, int] | None:
    """(buffer id counted from 0, bytes) from a planned-buffer set-up line, else None."""
    m = PLANNED_BUFFER_RE.match(msg)
    if m is None:
        return None
    index = int(m.group("mem_id")) - 1 if m.group("mem_id") is not None else int(m.group("id"))
    return index, int(m.group("v"))


def _event_unit(event: str) -> str:
    if event.endswith(("_IDLE", "_ACTIVE")):
        return "cycles"
    return "beats" if "BEAT" in event else "events"


def arm_runner_figures(log: RunnerLog | Iterable[LogLine] | str | bytes, simulated: bool) -> list[PerfFigure]:
    """Every performance figure the Arm runner printed in one session, in the order it printed
    them (a figure printed twice keeps its last value). `simulated`: the session ran on an FVP or
    QEMU, so cycle and counter figures are the simulator's, not a device's."""
    if isinstance(log, (str, bytes)):
        log = parse_runner_log(log)
    lines = log.lines if isinstance(log, RunnerLog) else list(log)
    cycles_kind = PerfKind.SIMULATION_CYCLES if simulated else PerfKind.DEVICE_CYCLES
    counter_kind = PerfKind.SIMULATION_COUNTER if simulated else PerfKind.DEVICE_COUNTER
    cycles_note = "simulator model: not cycle accurate" if simulated else None
    found: dict[str, PerfFigure] = {}
    npu_counters: dict[int, tuple[int, float | None, str]] = {}
    events: list[str] = []
    cpu_counter_dead = False
    npu_inferences: PerfFigure | None = None

    def put(fig: PerfFigure) -> None:
        found.pop(fig.name, None)  # re-insert: order of the last print
        found[fig.name] = fig

    for ln in lines:
        if ln.level is None:
            continue
        msg = ln.message.strip()
        src = f"arm_executor_runner log ({ln.file})" if ln.file else "arm_executor_runner log"
        for name, regex in _CYCLE_RES:
            m = regex.match(msg)
            if m:
                put(PerfFigure(name, int(m.group("v")), "cycles", cycles_kind, src, _per(m), note=cycles_note))
                break
        else:
            if m := _NPU_CYCLES_RE.match(msg):
                put(PerfFigure("npu_active_cycles", int(m.group("v")), "cycles", cycles_kind, src, _per(m),
                               note="Ethos-U PMU cycle counter (NPU active to idle)"))
            elif m := _NPU_CNTR_RE.match(msg):
                npu_counters[int(m.group("i"))] = (int(m.group("v")), _per(m), src)
            elif m := _NPU_EVENTS_RE.match(msg):
                events = [e.strip() for e in m.group("events").split(",") if e.strip()]
            elif m := _RATIO_RE.match(msg):
                if m.group("v") == "?.??":
                    cpu_counter_dead = True
                else:
                    put(PerfFigure(f"inference_{m.group('unit').lower()}_ratio", float(m.group("v")), "%", PerfKind.RATIO, src))
            elif m := _NPU_INFERENCES_RE.match(msg):
                npu_inferences = PerfFigure("inferences", int(m.group("v")), "count", PerfKind.COUNT, src)
            elif m := _DELEGATIONS_RE.match(msg):
                put(PerfFigure("npu_delegations", int(m.group("v")), "count", PerfKind.COUNT, src, _per(m)))
            elif m := _STARTING_RE.match(msg):
                put(PerfFigure("inferences", int(m.group("v")), "count", PerfKind.COUNT, src))
            elif m := _PTE_LOADED_RE.match(msg):
                put(PerfFigure("pte_program_size", int(m.group("v")), "bytes", PerfKind.MEMORY, src))
            elif m := _POOL_RE.match(msg):
                put(PerfFigure(_POOL_NAMES[m.group("what")], int(m.group("v")), "bytes", PerfKind.MEMORY, src))
            elif pb := planned_buffer(msg):
                put(PerfFigure(f"planned_buffer{pb[0]}_size", pb[1], "bytes", PerfKind.MEMORY, src))
            elif m := _USED_OF_RE.match(msg):
                base = m.group("name").lower()
                put(PerfFigure(f"{base}_used", int(m.group("used")), "bytes", PerfKind.MEMORY, src))
                put(PerfFigure(f"{base}_size", int(m.group("total")), "bytes", PerfKind.MEMORY, src))
            elif m := _BYTES_RE.match(msg):
                note = "the runner says the size is unknown (bundle not baked into the ELF)" if "unknown" in m.group("rest") else None
                put(PerfFigure(_BYTES_NAMES.get(m.group("name"), m.group("name")), int(m.group("v")), "bytes", PerfKind.MEMORY,
                               src, note=note))
            elif m := _TEMP_RE.match(msg):
                put(PerfFigure("temp_allocator_size", int(m.group("v")), "bytes", PerfKind.MEMORY, src,
                               note="capacity of the temp pool (the runner prints its size, not its use)"))
    if npu_inferences is not None:  # the count StopMeasurements() divided by: what actually ran
        put(npu_inferences)
    for i, (value, per, src) in sorted(npu_counters.items()):
        event = events[i] if i < len(events) else None
        name = f"npu_pmu_{event.lower().removeprefix('ethosu_pmu_')}" if event else f"npu_pmu_cntr{i}"
        put(PerfFigure(name, value, _event_unit(event) if event else "events", counter_kind, src, per,
                       note=f"Ethos-U PMU counter {i}" + (f": {event}" if event else " (event not printed)")))
    if cpu_counter_dead:  # the CPU cycle counter read 0: the runner cannot give CPU cycles
        for name in _CPU_CYCLE_NAMES:
            found.pop(name, None)
    return list(found.values())
