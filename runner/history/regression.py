"""Baselines and regressions: is this run worse than a recorded one?

A regression is a change a reviewer must look at, judged per case-output
against the baseline's numbers, not against the tolerances (those give the
verdict). Rules, all configurable in the `[regression]` config section:

- `verdict_flip` (true): an output that PASSed now FAILs.
- `sqnr_drop_db` (3.0): SQNR fell by more than this. Values above
  `sqnr_ceiling_db` (80: float rounding noise) are clamped to it first, so
  140 dB -> 120 dB between two fp32 runs is not a regression.
- `error_growth` (2.0): error_mae or error_max grew by more than this factor,
  ignored while the current error is below `error_floor_abs` (1e-6) or below
  `error_floor_rel` (1e-4) times the reference's largest magnitude.
- `top1_drop_points` (1.0): dataset top-1 fell by more than this many
  percentage points AND the confidence interval of the change excludes zero
  (paired over the same samples when both runs carry per-sample predictions),
  so sampling noise alone never flags.

Performance figures are gated by the `[perf]` section (`PerfRules`, below): cycles, memory in use,
warm latency past its noise band; host wall time only when asked, simulation time never.

Only related runs are compared (`unrelated_reasons`): one series (runner/history/series.py: the same
target, dtype, test inputs and criteria, or, for reports without an inputs digest, the same model
id), the same methods and cases, neither run interrupted. A different program is what a
comparison is for (a new toolchain, a miscompiling backend) and is a note.
`allow_unrelated = true` (`compare --force`) compares anyway.

Every function here reads the typed report (`Report`, runner/report/model.py); `compare` and
`--baseline` get theirs from history.resolve_run.

Over 500 lines on purpose: the rules (numerics, dataset, perf) and the notes that explain them read
one index of case-outputs and one of perf figures; the terminal view is `format_regressions` here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.runner.judging.stats_records import OutputStats
from bundlerun.runner.report.model import OutputRecord, Report, format_amount
from bundlerun.runner.history.series import short_repr as _short
from bundlerun.targets.base import PerfFigure, PerfKind, Verdict
from bundlerun.runner.history.series import of_report


@dataclass
class RegressionRules:
    verdict_flip: bool = True
    sqnr_drop_db: float = 3.0
    sqnr_ceiling_db: float = 80.0
    error_growth: float = 2.0
    error_floor_abs: float = 1e-6
    error_floor_rel: float = 1e-4
    top1_drop_points: float = 1.0
    confidence: float = 0.95
    allow_unrelated: bool = False  # compare runs of different bundles/targets/dtypes (compare --force)

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> "RegressionRules":
        """Rules from the `[regression]` section (unknown keys are an error, so typos show)."""
        section = (config or {}).get("regression") or {}
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in section.items():
            if key not in known:
                raise ConfigError(f"[regression] has unknown key {key!r}; known: {', '.join(known)}")
            want = bool if known[key].type in ("bool", bool) else float
            if want is bool:
                if not isinstance(value, bool):
                    raise ConfigError(f"[regression] {key} must be true or false")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"[regression] {key} must be a non-negative number, got {value!r}")
            values[key] = want(value)
        return cls(**values)


@dataclass
class Regression:
    """One way the current run is worse than the baseline."""

    rule: str  # verdict-flip | sqnr-drop | mae-growth | max-growth | top1-drop | cycles-/memory-/latency-regression
    where: str  # "forward[3].out0", "dataset digits" or "forward.inference_cpu_cycles" (a perf figure)
    baseline: Any
    current: Any
    limit: Any
    message: str
    method: str | None = None
    case: int | None = None
    output: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _index(report: Report) -> dict[tuple[str, int, int], OutputRecord]:
    """(method, case, output index) -> the output: what two runs are paired by."""
    return {(case.method, case.case, out.index): out for case in report.cases for out in case.outputs}


def _ref_magnitude(stats: OutputStats | None) -> float:
    ref = stats.reference_stats if stats else None
    vals = [abs(v) for v in (_num(ref and ref.max), _num(ref and ref.min)) if v is not None]
    return max(vals) if vals else 0.0


def find_regressions(
    baseline_report: Report, current_report: Report, rules: RegressionRules | None = None,
    perf_rules: "PerfRules | None" = None,
) -> list[Regression]:
    """Every regression of `current_report` against `baseline_report`:
    numerics per case-output, dataset accuracy, and performance figures (`perf_rules`, the
    `[perf]` section; its defaults when None).

    Case-outputs present in only one run are not compared (a run over a subset
    of cases is not a regression); `comparison_notes` lists them.
    """
    rules = rules or RegressionRules()
    found: list[Regression] = []
    base_idx = _index(baseline_report)
    for key, out in _index(current_report).items():
        if key not in base_idx:
            continue
        bout = base_idx[key]
        method, ci, oi = key
        where = f"{method}[{ci}].{out.name or f'out{oi}'}"
        loc = {"method": method, "case": ci, "output": oi}
        bv, cv = bout.verdict, out.verdict
        if rules.verdict_flip and bv == Verdict.PASS and cv == Verdict.FAIL:
            failed = "; ".join(f"{f.criterion} {f.measured} (limit {f.limit})" for f in out.failed)
            found.append(
                Regression("verdict-flip", where, bv, cv, Verdict.PASS, f"{where}: PASS -> FAIL" + (f" ({failed})" if failed else ""), **loc)
            )
        bs, cs = bout.stats, out.stats
        b_sqnr, c_sqnr = _metric(bs, "sqnr"), _metric(cs, "sqnr")
        if b_sqnr is not None and c_sqnr is not None:
            drop = min(b_sqnr, rules.sqnr_ceiling_db) - min(c_sqnr, rules.sqnr_ceiling_db)
            if drop > rules.sqnr_drop_db:
                found.append(
                    Regression(
                        "sqnr-drop", where, b_sqnr, c_sqnr, rules.sqnr_drop_db,
                        f"{where}: SQNR {b_sqnr:.2f} dB -> {c_sqnr:.2f} dB (drop {drop:.2f} dB > {rules.sqnr_drop_db:g} dB)",
                        **loc,
                    )
                )
        floor = max(rules.error_floor_abs, rules.error_floor_rel * _ref_magnitude(cs or bs))
        for stat, rule in (("error_mae", "mae-growth"), ("error_max", "max-growth")):
            b, c = _metric(bs, stat), _metric(cs, stat)
            if b is None or c is None or c <= floor:
                continue
            if c > rules.error_growth * max(b, floor):
                ratio = c / b if b > 0 else math.inf
                found.append(
                    Regression(
                        rule, where, b, c, rules.error_growth,
                        f"{where}: {stat} {b:.3g} -> {c:.3g} (x{ratio:.3g} > x{rules.error_growth:g})",
                        **loc,
                    )
                )
    found.extend(_dataset_regressions(baseline_report, current_report, rules))
    found.extend(perf_deltas(baseline_report, current_report, perf_rules)[1])
    return found


def _dataset_regressions(base: Report, cur: Report, rules: RegressionRules) -> list[Regression]:
    bd, cd = base.dataset or None, cur.dataset or None
    if not bd or not cd or bd.get("top1") is None or cd.get("top1") is None:
        return []
    from bundlerun.runner.judging.accuracy import paired_change  # start-up: loads numpy on use

    change, low, high, how = paired_change(bd, cd, rules.confidence)
    drop_points = -change * 100
    if drop_points > rules.top1_drop_points and high < 0:
        where = f"dataset {cd.get('name') or bd.get('name')}"
        return [
            Regression(
                "top1-drop", where, bd["top1"], cd["top1"], rules.top1_drop_points,
                f"{where}: top-1 {bd['top1'] * 100:.2f}% -> {cd['top1'] * 100:.2f}% "
                f"(drop {drop_points:.2f} points, {int(rules.confidence * 100)}% CI of change "
                f"[{low * 100:+.2f}, {high * 100:+.2f}] points, {how}; limit {rules.top1_drop_points:g} points)",
            )
        ]
    return []


class UnrelatedRuns(Exception):
    """Two runs that do not measure the same thing; `reasons` says why."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("; ".join(reasons))


def _case_keys(report: Report) -> set[tuple[str, int]]:
    return {(c.method, c.case) for c in report.cases}


def _output_names(report: Report) -> dict[tuple[str, int], str]:
    return {(c.method, o.index): o.name for c in report.cases for o in c.outputs}




def unrelated_reasons(baseline_report: Report, current_report: Report) -> list[str]:
    """Why the two runs do not measure the same thing (empty: they do).

    Refused: runs of two series (runner/history/series.py: a different target, dtype, test inputs or
    criteria, a different model id unless both bundles carry the same test inputs: a retrained
    model on the same inputs is a fair comparison), an interrupted run on either side, a different
    dataset, set of methods, outputs, or cases (a run over a subset of the other's cases is fine),
    and no case-output in common. A different program is not a reason.
    """
    from bundlerun.runner.history import series  # the identity: one definition for compare, history and the HUD

    b_cases, c_cases = _case_keys(baseline_report), _case_keys(current_report)
    b_methods, c_methods = {m for m, _ in b_cases}, {m for m, _ in c_cases}
    b_series, c_series = series.of_report(baseline_report), series.of_report(current_report)
    if b_methods != c_methods and b_series.criteria != c_series.criteria:
        # a run over fewer methods: the criteria of the methods both ran are what must agree
        common = b_methods & c_methods
        b_series = replace(b_series, criteria=series.criteria_digest(baseline_report.cases, common))
        c_series = replace(c_series, criteria=series.criteria_digest(current_report.cases, common))
    reasons = series.differences(b_series, c_series)
    for side, report in (("baseline", baseline_report), ("current", current_report)):
        if report.summary.interrupted:
            reasons.append(f"the {side} run was interrupted (a partial run is no data point)")
    bd, cd = baseline_report.dataset or {}, current_report.dataset or {}
    if bd and cd and bd.get("name") != cd.get("name"):
        reasons.append(f"dataset differs (baseline {_short(bd.get('name'))}, current {_short(cd.get('name'))})")
    if b_cases and c_cases and not (b_methods <= c_methods or c_methods <= b_methods):
        reasons.append(f"methods differ (baseline {', '.join(sorted(b_methods))}; current {', '.join(sorted(c_methods))})")
    elif b_cases and c_cases and not (b_cases <= c_cases or c_cases <= b_cases):
        reasons.append(f"the runs cover different cases ({len(b_cases - c_cases)} only in the baseline, "
                       f"{len(c_cases - b_cases)} only in the current run; one must be a subset of the other)")
    b_names, c_names = _output_names(baseline_report), _output_names(current_report)
    renamed = sorted(k for k in set(b_names) & set(c_names) if b_names[k] != c_names[k])
    if renamed:
        m, i = renamed[0]
        reasons.append(f"outputs differ ({m} output {i} is {_short(b_names[(m, i)])} in the baseline, "
                       f"{_short(c_names[(m, i)])} now)")
    if not (set(_index(baseline_report)) & set(_index(current_report))) and not (bd.get("top1") is not None
                                                                                 and cd.get("top1") is not None):
        reasons.append("no case-output in common: nothing to compare")
    return reasons


def check_related(baseline_report: Report, current_report: Report,
                  rules: RegressionRules | None = None) -> None:
    """Raise UnrelatedRuns unless the runs are related or `rules.allow_unrelated` is set."""
    if rules is not None and rules.allow_unrelated:
        return
    reasons = unrelated_reasons(baseline_report, current_report)
    if reasons:
        raise UnrelatedRuns(reasons)


DELTA_METRICS = ("error_max", "sqnr", "cosine_similarity", "mismatch_count")
DELTA_LABELS = {"error_max": "max abs error", "sqnr": "SQNR dB", "cosine_similarity": "cosine",
                "mismatch_count": "mismatches"}


def _metric(stats: OutputStats | None, key: str) -> float | None:
    """A statistic by name (None when the record has no statistics or not this one): a number or None."""
    return _num(getattr(stats, key, None))


def _pair(b: float | None, c: float | None) -> dict[str, Any]:
    """{"baseline", "current", "delta"}: numbers, "inf" for an exact match's SQNR (no delta then)."""
    def js(v):
        return None if v is None else ("inf" if v == math.inf else ("-inf" if v == -math.inf else v))

    delta = None
    if b is not None and c is not None and math.isfinite(b) and math.isfinite(c):
        delta = c - b
    return {"baseline": js(b), "current": js(c), "delta": delta}


def _aggregate(values: list[float], key: str) -> float | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if key == "error_max":
        return max(vals)
    if key == "mismatch_count":
        return float(sum(vals))
    return min(vals)  # sqnr, cosine: the worst case


def metric_deltas(baseline_report: Report, current_report: Report) -> dict[str, Any]:
    """Per-output metrics side by side over the case-outputs both runs have.

    `outputs`: one entry per method x output, aggregated over the common cases (max abs
    error: the largest; SQNR and cosine: the worst; mismatches: the total), each metric as
    {"baseline", "current", "delta"} (delta = current - baseline; none when a side is
    missing or an exact match, SQNR "inf"), with the verdict counts of both runs.
    `case_outputs`: the same per case-output.
    """
    b_idx, c_idx = _index(baseline_report), _index(current_report)
    common = sorted(set(b_idx) & set(c_idx))
    per_output: dict[tuple[str, int], dict[str, Any]] = {}
    rows = []
    for key in common:
        method, ci, oi = key
        bout, cout = b_idx[key], c_idx[key]
        bs, cs = bout.stats, cout.stats
        bv, cv = bout.verdict, cout.verdict
        name = cout.name or f"out{oi}"
        rows.append({"method": method, "case": ci, "output": oi, "name": name, "verdict": {"baseline": bv, "current": cv},
                     **{m: _pair(_metric(bs, m), _metric(cs, m)) for m in DELTA_METRICS}})
        agg = per_output.setdefault((method, oi), {"method": method, "output": oi, "name": name, "cases": 0,
                                                   "b": {m: [] for m in DELTA_METRICS}, "c": {m: [] for m in DELTA_METRICS},
                                                   "bv": {}, "cv": {}})
        agg["cases"] += 1
        agg["bv"][bv] = agg["bv"].get(bv, 0) + 1
        agg["cv"][cv] = agg["cv"].get(cv, 0) + 1
        for m in DELTA_METRICS:
            agg["b"][m].append(_metric(bs, m))
            agg["c"][m].append(_metric(cs, m))
    outputs = []
    for agg in per_output.values():
        outputs.append({
            "method": agg["method"], "output": agg["output"], "name": agg["name"], "cases": agg["cases"],
            "verdicts": {"baseline": agg["bv"], "current": agg["cv"]},
            **{m: _pair(_aggregate(agg["b"][m], m), _aggregate(agg["c"][m], m)) for m in DELTA_METRICS},
        })
    return {"outputs": outputs, "case_outputs": rows}


def comparison_notes(baseline_report: Report, current_report: Report,
                     perf_rules: "PerfRules | None" = None) -> list[str]:
    """Things a reader should know about the pair (not regressions), perf figures on one side only
    and latency that could not be gated included."""
    notes = []
    b_b, c_b = baseline_report.bundle, current_report.bundle
    for key in ("model", "dtype", "backend"):
        if b_b.get(key) != c_b.get(key):
            notes.append(f"{key} differs: baseline {b_b.get(key)!r}, current {c_b.get(key)!r}")
    b_prog, c_prog = b_b.get("program_sha256"), c_b.get("program_sha256")
    if b_prog and c_prog and b_prog != c_prog:
        notes.append(f"program differs (sha256 {b_prog[:12]}... -> {c_prog[:12]}...): comparing two builds")
    elif not (b_prog and c_prog) and b_b.get("sha256") != c_b.get("sha256"):
        notes.append("bundle files differ (no program digest recorded to tell whether the program changed)")
    bt, ct = baseline_report.target.get("url"), current_report.target.get("url")
    if bt != ct:
        notes.append(f"target differs: baseline {bt!r}, current {ct!r}")
    b_idx, c_idx = _index(baseline_report), _index(current_report)
    only_b, only_c = set(b_idx) - set(c_idx), set(c_idx) - set(b_idx)
    if only_b:
        notes.append(f"{len(only_b)} case-output(s) only in the baseline were not compared")
    if only_c:
        notes.append(f"{len(only_c)} case-output(s) only in the current run were not compared")
    for key in sorted(set(b_idx) & set(c_idx)):  # in case order: a set's order changes with the hash seed
        bv, cv = b_idx[key].verdict, c_idx[key].verdict
        if bv == Verdict.PASS and cv in (Verdict.ERROR, Verdict.TIMEOUT):
            notes.append(f"{key[0]}[{key[1]}] output {key[2]}: PASS -> {cv} (infrastructure, not judged)")
    notes += perf_deltas(baseline_report, current_report, perf_rules)[2]
    return notes


def format_regressions(regressions: list[Any], max_lines: int = 12) -> str:
    """Terminal text: one line per rule with its count, then the first `max_lines` regressions.

    Accepts Regression objects or their dicts (as stored in report["regressions"]).
    """
    if not regressions:
        return "no regressions"
    regs = [r if isinstance(r, dict) else r.to_dict() for r in regressions]
    by_rule: dict[str, int] = {}
    for r in regs:
        by_rule[r["rule"]] = by_rule.get(r["rule"], 0) + 1
    from bundlerun.runner.report.safe_text import visible  # names in messages come from reports: one inert line each

    lines = [f"{len(regs)} regression(s): " + ", ".join(f"{visible(rule)} x{n}" for rule, n in by_rule.items())]
    lines += [f"REGRESSION {visible(r['rule'])}: {visible(r['message'])}" for r in regs[:max_lines]]
    if len(regs) > max_lines:
        lines.append(f"... {len(regs) - max_lines} more (see report.json / --json)")
    return "\n".join(lines)


def check_baseline(
    ref: str,
    current_report: Report,
    db_path: Any = None,
    config: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """`run --baseline REF`: regressions of the current report as JSON-ready dicts (what goes
    into `report.regressions`); what the baseline was and how it relates goes into
    `current_report.baseline`.

    REF is a history run id, a run uuid (prefix), a label (newest run with it,
    other than the current one) or a report.json path. Unresolvable REF raises
    HistoryError (one line, exit code 2).
    """
    from bundlerun.runner.history.store import resolve_run  # start-up: loads numpy on use

    ident = of_report(current_report)
    prefer = {"model": ident.model, "dtype": ident.dtype, "target": ident.target, "inputs_sha256": ident.inputs,
              "criteria_sha256": ident.criteria}
    baseline = resolve_run(db_path, ref, exclude_uuid=current_report.run.get("id"), prefer=prefer)
    rules = RegressionRules.from_config(config)
    perf_rules = PerfRules.from_config(config)
    if current_report.baseline is None:
        current_report.baseline = {}
    section = current_report.baseline
    section.update({"ref": ref, "run_id": baseline.run.get("id"), "history_id": baseline.run.get("history_id"),
                    "label": baseline.run.get("label")})
    try:
        check_related(baseline, current_report, rules)
    except UnrelatedRuns as exc:
        # Same refusal as `compare`; the run's own verdict stands, but a check that was asked
        # for and not made is not a pass: exit code 2 unless the run already failed.
        section["refused"] = str(exc)
        current_report.warnings.append(
            f"baseline {ref!r} not compared: unrelated runs: {exc} "
            "(set [regression] allow_unrelated = true to compare anyway)")
        if current_report.summary.exit_code == 0:
            current_report.summary.exit_code = 2
        return []
    regressions = find_regressions(baseline, current_report, rules, perf_rules)
    section["notes"] = comparison_notes(baseline, current_report, perf_rules)
    section["outputs"] = metric_deltas(baseline, current_report)["outputs"]
    section["perf"] = perf_deltas(baseline, current_report, perf_rules)[0]
    return [r.to_dict() for r in regressions]


# ------------------------------------------------------------------------------------------- performance
#
# Per method x figure x phase, over the cases both runs have (docs/performance.md):
# - cycle figures (unit cycles: device or simulator cycle counters; and QEMU's instruction count, unit
#   instructions): the median over the common cases
#   (per inference where both runs printed it) rising more than `cycles_regression` is a regression;
# - memory figures in use (bytes: program size, allocator use, planned buffers; never a pool's
#   capacity, which is the runner's configuration): more than `memory_regression`;
# - latency (device-latency; host-wall only with `gate_host_latency`): warm executions only (the
#   first, cold, execution is reported, never gated), pooled over the common cases' samples (each
#   case's repeated executions, `--repeat N`): the median rising more than `latency_regression` AND by
#   more than `latency_noise` x the larger spread (median absolute deviation) of the two runs, with at
#   least `latency_min_samples` samples on each side;
# - simulation-time (qemu-user, TOSA reference model, MLX walker) is never gated as latency; counts,
#   ratios and event counters are shown, not gated. A figure on one side only is a note.

PERF_RULE = {"cycles": "cycles-regression", "memory": "memory-regression", "latency": "latency-regression"}


@dataclass
class PerfRules:
    cycles_regression: float = 0.05
    memory_regression: float = 0.05
    latency_regression: float = 0.10
    latency_noise: float = 3.0
    latency_min_samples: int = 3
    gate_host_latency: bool = False
    gate_memory: bool = True
    gate_cycles: bool = True

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> "PerfRules":
        """From the `[perf]` section (validated by bundles.project_config.perf_section)."""
        from bundlerun.bundles.project_config import perf_section  # start-up: loads tomli on use

        return cls(**perf_section(config, (config or {}).get("_file")))


# Memory figures that measure the .bpte file the runner read (program + bundlerun's manifest + the
# case's test data): a manifest that grows is not a model regression. pte_program_size is the program.
_BUNDLE_FILE = ("pte_loaded_size", "input_file_allocator_used")


def _capacity(name: str) -> bool:
    """A pool's size as configured in the runner (not what the model uses)."""
    return name.endswith(("_allocator_size", "_buffer_size"))


def perf_gate(fig: PerfFigure, rules: "PerfRules") -> tuple[str | None, str | None]:
    """(gate, why not): which gate a figure goes through (cycles | memory | latency), or None with
    the reason it is shown but not gated."""
    kind, unit, name = fig.kind, fig.unit, str(fig.name)  # a report may carry a figure without a name
    if unit in ("cycles", "instructions") and kind in (PerfKind.DEVICE_CYCLES, PerfKind.SIMULATION_CYCLES, PerfKind.DEVICE_COUNTER,
                                                       PerfKind.SIMULATION_COUNTER):
        return ("cycles", None) if rules.gate_cycles else (None, "[perf] gate_cycles = false")
    if kind == PerfKind.MEMORY:
        if _capacity(name):
            return None, "a pool's capacity (runner configuration), not use"
        if name in _BUNDLE_FILE:
            return None, "the bundle file as loaded (bundlerun's manifest and test data included), not the model"
        return ("memory", None) if rules.gate_memory else (None, "[perf] gate_memory = false")
    if kind in (PerfKind.DEVICE_LATENCY, PerfKind.HOST_WALL):
        if kind == PerfKind.HOST_WALL and not rules.gate_host_latency:
            return None, "host wall time: not gated unless [perf] gate_host_latency = true"
        if fig.phase != "warm":
            return None, ("the first (cold) execution: reported, not gated" if fig.phase == "first"
                          else "not a warm per-execution figure: reported, not gated")
        return "latency", None
    if kind == PerfKind.SIMULATION_TIME:
        return None, "simulation time: never gated as latency"
    return None, f"{kind}: reported, not gated"


def _perf_index(report: Report) -> dict[tuple[str, str, str | None], dict[int, PerfFigure]]:
    """(method, figure, phase) -> {case: figure}; a NaN value is no figure."""
    out: dict[tuple[str, str, str | None], dict[int, PerfFigure]] = {}
    for case in report.cases:
        for fig in case.perf:
            if _num(fig.value) is not None:
                out.setdefault((case.method, str(fig.name), fig.phase), {})[case.case] = fig
    return out


def _median(values: list[float]) -> float:
    from statistics import median

    return float(median(values))


def _mad(values: list[float]) -> float:
    """Median absolute deviation: the spread of repeated measurements, robust to one outlier."""
    if len(values) < 2:
        return 0.0
    m = _median(values)
    return _median([abs(v - m) for v in values])


def _values(figs: list[PerfFigure], per_inference: bool) -> list[float]:
    return [float(f.per_inference if per_inference else f.value) for f in figs]


def _samples(figs: list[PerfFigure]) -> list[float]:
    """Every measurement behind the figures: a case's repeated executions, else its one value."""
    out: list[float] = []
    for f in figs:
        samples = [s for s in (f.samples or []) if _num(s) is not None]
        out += [float(s) for s in samples] if samples else [float(f.value)]
    return out


def perf_deltas(baseline_report: Report, current_report: Report,
                rules: "PerfRules | None" = None) -> tuple[list[dict[str, Any]], list[Regression], list[str]]:
    """(rows, regressions, notes): every figure both runs have side by side over their common
    cases, the regressions among them, and notes (a figure on one side only, latency not gated)."""
    rules = rules or PerfRules()
    b_idx, c_idx = _perf_index(baseline_report), _perf_index(current_report)
    rows: list[dict[str, Any]] = []
    found: list[Regression] = []
    notes: list[str] = []
    for side, here, there in (("baseline", b_idx, c_idx), ("current run", c_idx, b_idx)):
        alone = [k for k in here if k not in there]
        if not alone:
            continue
        if not there:
            notes.append(f"the {'current run' if side == 'baseline' else 'baseline'} has no perf figures: "
                         f"{len(alone)} figure(s) of the {side} not compared")
            continue
        names = [f"{k[0]}.{k[1]}" + (f" ({k[2]})" if k[2] else "")
                 + f" [{next(iter(here[k].values())).kind}]" for k in alone]
        notes.append(f"perf figure(s) only in the {side}, not compared: " + ", ".join(names))
    thin_latency: list[str] = []
    for key in [k for k in c_idx if k in b_idx]:
        method, name, phase = key
        common = sorted(set(b_idx[key]) & set(c_idx[key]))
        if not common:
            notes.append(f"perf figure {method}.{name} is in both runs but in no common case: not compared")
            continue
        bf, cf = [b_idx[key][i] for i in common], [c_idx[key][i] for i in common]
        unit, kind = cf[0].unit, cf[0].kind
        if bf[0].unit != unit or bf[0].kind != kind:
            notes.append(f"perf figure {method}.{name} changed unit or kind ({bf[0].unit} "
                         f"[{bf[0].kind}] -> {unit} [{kind}]): not compared")
            continue
        gate, why = perf_gate(cf[0], rules)
        per_inf = all(_num(f.per_inference) is not None for f in bf + cf)
        row: dict[str, Any] = {"method": method, "name": name, "phase": phase, "unit": unit, "kind": kind,
                               "cases": len(common), "per_inference": per_inf, "gate": gate}
        if gate == "latency":
            bs, cs = _samples(bf), _samples(cf)
            b, c = _median(bs), _median(cs)
            row.update({"samples": {"baseline": len(bs), "current": len(cs)},
                        "spread": {"baseline": _mad(bs), "current": _mad(cs)}})
        else:
            b, c = _median(_values(bf, per_inf)), _median(_values(cf, per_inf))
        change = (c - b) / b if b > 0 else (0.0 if c == b else math.inf)
        row.update({"baseline": b, "current": c, "delta": c - b, "change": change if math.isfinite(change) else "inf"})
        where = f"{method}.{name}" + (f" ({phase})" if phase else "")
        loc = {"method": method}
        if gate == "cycles" or gate == "memory":
            limit = rules.cycles_regression if gate == "cycles" else rules.memory_regression
            row["limit"] = limit
            if c > b and change > limit:
                rise = "from 0" if b == 0 else f"+{change * 100:.2f}%"
                found.append(Regression(
                    PERF_RULE[gate], where, b, c, limit,
                    f"{where}: {format_amount(b, unit, exact=True)} -> {format_amount(c, unit, exact=True)} ({rise} > {limit * 100:g}%) "
                    f"[{kind}]" + (", per inference" if per_inf else "") + f", median over {len(common)} case(s)",
                    **loc))
        elif gate == "latency":
            row["limit"] = rules.latency_regression
            nb, nc = row["samples"]["baseline"], row["samples"]["current"]
            if min(nb, nc) < rules.latency_min_samples:
                row["gate"], why = None, (f"{min(nb, nc)} warm sample(s) on a side, fewer than "
                                          f"[perf] latency_min_samples = {rules.latency_min_samples} (--repeat N)")
                thin_latency.append(where)
            else:
                band = rules.latency_noise * max(row["spread"]["baseline"], row["spread"]["current"])
                row["noise_band"] = band
                if c > b and change > rules.latency_regression and (c - b) > band:
                    found.append(Regression(
                        PERF_RULE[gate], where, b, c, rules.latency_regression,
                        f"{where}: median {b:.4g} -> {c:.4g} {unit} (+{change * 100:.1f}% > "
                        f"{rules.latency_regression * 100:g}%; rise {c - b:.3g} {unit} > noise band {band:.3g} {unit} "
                        f"= {rules.latency_noise:g} x MAD) [{kind}], {nb} vs {nc} warm samples", **loc))
        if why:
            row["not_gated"] = why
        rows.append(row)
    if thin_latency:
        notes.append(f"latency not gated for {', '.join(thin_latency)}: fewer than {rules.latency_min_samples} warm "
                     "samples on a side (run with --repeat N)")
    return rows, found, notes


def format_perf_deltas(rows: list[dict[str, Any]], limit: int = 20) -> list[str]:
    """Terminal lines: the gated figures first, then what changed."""
    def text(r: dict[str, Any]) -> str:
        change = r.get("change")
        ch = "new from 0" if change == "inf" else f"{change * 100:+.2f}%"
        state = f"gate {r['gate']} {r['limit'] * 100:g}%" if r.get("gate") else f"not gated: {r.get('not_gated')}"
        return (f"{r['method']}.{r['name']}" + (f" ({r['phase']})" if r.get("phase") else "")
                + f": {format_amount(r['baseline'], r['unit'], exact=True)} -> {format_amount(r['current'], r['unit'], exact=True)} ({ch}) "
                f"[{r['kind']}]; {state}")

    changed = [r for r in rows if r.get("delta")]
    shown = [r for r in changed if r.get("gate")] + [r for r in changed if not r.get("gate")]
    out = [text(r) for r in shown[:limit]]
    if len(shown) > limit:
        out.append(f"... {len(shown) - limit} more changed figures (see --json / report.json)")
    same = [r for r in rows if not r.get("delta") and r.get("gate")]
    if same:
        out.append(f"{len(same)} gated figure(s) unchanged: " + ", ".join(r["name"] for r in same[:8])
                   + (", ..." if len(same) > 8 else ""))
    return out
