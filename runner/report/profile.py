"""Operator profiles from ETDump (issue 17, item 2): per-operator and per-delegate-call time.

The executor_runner lanes write an ETDump per case when asked (`--target-opt etdump=true`: the
runner's `--etdump_path`); the case's `extra.etdump` names the file. ExecuTorch's ETDump holds one
profile event per operator call (`native_call_<op>`, plus an `OPERATOR_CALL` wrapper around it),
per delegate call (`DELEGATE_CALL`, and the delegate's own events named by its debug id) and one
`Method::execute` per execution, with start and end ticks. The posix PAL's ticks are nanoseconds,
which is also what ExecuTorch's Inspector assumes by default (`source_time_scale="ns"`): times here
are in ms, like Inspector's `perf_data`. It reads the file with ExecuTorch's own
`deserialize_from_etdump_flatcc` (what the Inspector uses underneath).

With several executions (`--repeat N`: one warm-up + N), the first is the warm-up and each
operator's time is the median over the others (`phase: warm`); with one, that execution
(`phase: first`). A method's profile is the median over its cases of each operator's time.
"""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING, Any, Iterable
from bundlerun.targets.base import PerfKind

if TYPE_CHECKING:
    from bundlerun.runner.report.model import CaseRecord

SOURCE = "ETDump profile events (executorch.devtools deserialize_from_etdump_flatcc), ns ticks"
_SKIP = {"OPERATOR_CALL", "Method::init", "Program::load_method", "Method::execute"}


def _executions(etdump_obj) -> list[dict[str, Any]]:
    """Per execution: {"total": ms of Method::execute, "ops": [(name, ms), ...]} in call order."""
    runs: list[dict[str, Any]] = []
    for run in etdump_obj.run_data or []:
        current: list[tuple[str, float]] = []
        total = None
        for event in run.events or []:
            pe = getattr(event, "profile_event", None)
            if pe is None or pe.start_time is None or pe.end_time is None:
                continue
            ms = (int(pe.end_time) - int(pe.start_time)) / 1e6
            name = pe.name or (f"delegate:{pe.delegate_debug_id_str}" if pe.delegate_debug_id_str else
                               (f"delegate:{pe.delegate_debug_id_int}" if (pe.delegate_debug_id_int or -1) >= 0 else None))
            if name is None:
                continue
            if name == "Method::execute":
                total = ms
                runs.append({"total": total, "ops": current})
                current = []
            elif name not in _SKIP:
                current.append((name.removeprefix("native_call_"), ms))
    return runs


def case_profile(path: str) -> dict[str, Any] | None:
    """One case's operator times from its ETDump, or None when it cannot be read."""
    try:
        from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

        with open(path, "rb") as fh:
            runs = _executions(deserialize_from_etdump_flatcc(fh.read()))
    except Exception:  # noqa: BLE001 - a profile is extra information: unreadable means absent
        return None
    if not runs:
        return None
    measured = runs[1:] if len(runs) > 1 else runs
    per_op: dict[str, list[float]] = {}
    calls: dict[str, int] = {}
    for run in measured:
        totals: dict[str, float] = {}
        for name, ms in run["ops"]:
            totals[name] = totals.get(name, 0.0) + ms
        for name, ms in totals.items():
            per_op.setdefault(name, []).append(ms)
    for name, _ in measured[0]["ops"]:
        calls[name] = calls.get(name, 0) + 1
    return {"executions": len(runs), "phase": "warm" if len(runs) > 1 else "first",
            "total": median(r["total"] for r in measured),
            "operators": {name: median(v) for name, v in per_op.items()}, "calls": calls}


def method_profiles(cases: Iterable["CaseRecord"], kind_of=None) -> list[dict[str, Any]]:
    """The report's `perf.profile`: per method, each operator's median time over the cases that
    carry an ETDump, largest first. `cases`: report case records (their `extra.etdump`)."""
    by_method: dict[str, list[tuple[CaseRecord, dict[str, Any]]]] = {}
    for case in cases:
        path = case.extra.get("etdump")
        if not path:
            continue
        prof = case_profile(path)
        if prof is not None:
            by_method.setdefault(case.method, []).append((case, prof))
    out = []
    for method, items in by_method.items():
        names: dict[str, list[float]] = {}
        for _, prof in items:
            for name, ms in prof["operators"].items():
                names.setdefault(name, []).append(ms)
        calls = items[0][1]["calls"]
        kinds = [f.kind for c, _ in items for f in c.perf if f.name in ("execution_time", "execution_time_total")]
        ops = sorted(({"name": n, "calls": calls.get(n, 1), "time": median(v)} for n, v in names.items()),
                     key=lambda o: -o["time"])
        out.append({"method": method, "cases": len(items), "executions": items[0][1]["executions"],
                    "phase": items[0][1]["phase"], "unit": "ms",
                    "kind": kinds[0] if kinds else (kind_of or PerfKind.DEVICE_LATENCY),
                    "total": median(p["total"] for _, p in items), "source": SOURCE, "operators": ops,
                    "note": ("median over the warm executions (the first excluded), then over the cases"
                             if items[0][1]["phase"] == "warm" else "one execution per case, cold")})
    return out
