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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from bundlerun.bundles.errors import ConfigError


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

    rule: str  # verdict-flip | sqnr-drop | mae-growth | max-growth | top1-drop
    where: str  # "forward[3].out0" or "dataset digits"
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


def _index(report: dict[str, Any]) -> dict[tuple[str, int, int], tuple[dict, dict]]:
    out = {}
    for case in report.get("cases") or []:
        for o in case.get("outputs") or []:
            out[(case.get("method", "forward"), int(case.get("case", 0)), int(o.get("index", 0)))] = (case, o)
    return out


def _ref_magnitude(stats: dict[str, Any]) -> float:
    ref = stats.get("reference_stats") or {}
    vals = [abs(v) for v in (_num(ref.get("max")), _num(ref.get("min"))) if v is not None]
    return max(vals) if vals else 0.0


def find_regressions(
    baseline_report: dict[str, Any], current_report: dict[str, Any], rules: RegressionRules | None = None
) -> list[Regression]:
    """Every regression of `current_report` against `baseline_report` (JSON report dicts).

    Case-outputs present in only one run are not compared (a run over a subset
    of cases is not a regression); `comparison_notes` lists them.
    """
    rules = rules or RegressionRules()
    found: list[Regression] = []
    base_idx = _index(baseline_report)
    for key, (case, out) in _index(current_report).items():
        if key not in base_idx:
            continue
        bcase, bout = base_idx[key]
        method, ci, oi = key
        where = f"{method}[{ci}].{out.get('name') or f'out{oi}'}"
        loc = {"method": method, "case": ci, "output": oi}
        bv, cv = bout.get("verdict") or bcase.get("verdict"), out.get("verdict") or case.get("verdict")
        if rules.verdict_flip and bv == "PASS" and cv == "FAIL":
            failed = "; ".join(
                f"{f.get('criterion')} {f.get('measured')} (limit {f.get('limit')})" for f in out.get("failed") or []
            )
            found.append(
                Regression("verdict-flip", where, bv, cv, "PASS", f"{where}: PASS -> FAIL" + (f" ({failed})" if failed else ""), **loc)
            )
        bs, cs = bout.get("stats") or {}, out.get("stats") or {}
        b_sqnr, c_sqnr = _num(bs.get("sqnr")), _num(cs.get("sqnr"))
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
            b, c = _num(bs.get(stat)), _num(cs.get(stat))
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
    return found


def _dataset_regressions(base: dict[str, Any], cur: dict[str, Any], rules: RegressionRules) -> list[Regression]:
    bd, cd = base.get("dataset") or None, cur.get("dataset") or None
    if not bd or not cd or bd.get("top1") is None or cd.get("top1") is None:
        return []
    from bundlerun.runner.accuracy import paired_change

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


def comparison_notes(baseline_report: dict[str, Any], current_report: dict[str, Any]) -> list[str]:
    """Things a reader should know about the pair (not regressions)."""
    notes = []
    b_b, c_b = baseline_report.get("bundle") or {}, current_report.get("bundle") or {}
    for key in ("model", "dtype", "backend"):
        if b_b.get(key) != c_b.get(key):
            notes.append(f"{key} differs: baseline {b_b.get(key)!r}, current {c_b.get(key)!r}")
    bt = (baseline_report.get("target") or {}).get("url")
    ct = (current_report.get("target") or {}).get("url")
    if bt != ct:
        notes.append(f"target differs: baseline {bt!r}, current {ct!r}")
    b_idx, c_idx = _index(baseline_report), _index(current_report)
    only_b, only_c = set(b_idx) - set(c_idx), set(c_idx) - set(b_idx)
    if only_b:
        notes.append(f"{len(only_b)} case-output(s) only in the baseline were not compared")
    if only_c:
        notes.append(f"{len(only_c)} case-output(s) only in the current run were not compared")
    for key in set(b_idx) & set(c_idx):
        bv = b_idx[key][1].get("verdict")
        cv = c_idx[key][1].get("verdict")
        if bv == "PASS" and cv in ("ERROR", "TIMEOUT"):
            notes.append(f"{key[0]}[{key[1]}] output {key[2]}: PASS -> {cv} (infrastructure, not judged)")
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
    lines = [f"{len(regs)} regression(s): " + ", ".join(f"{rule} x{n}" for rule, n in by_rule.items())]
    lines += [f"REGRESSION {r['rule']}: {r['message']}" for r in regs[:max_lines]]
    if len(regs) > max_lines:
        lines.append(f"... {len(regs) - max_lines} more (see report.json / --json)")
    return "\n".join(lines)


def check_baseline(
    ref: str,
    current_report: dict[str, Any],
    db_path: Any = None,
    config: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """`run --baseline REF`: regressions of the current report as JSON-ready dicts.

    REF is a history run id, a run uuid (prefix), a label (newest run with it,
    other than the current one) or a report.json path. Unresolvable REF raises
    HistoryError (one line, exit code 2).
    """
    from bundlerun.runner.history import resolve_run

    current_uuid = (current_report.get("run") or {}).get("id")
    bundle = current_report.get("bundle") or {}
    prefer = {"model": bundle.get("model"), "dtype": bundle.get("dtype"), "target": (current_report.get("target") or {}).get("url")}
    baseline = resolve_run(db_path, ref, exclude_uuid=current_uuid, prefer=prefer)
    regressions = find_regressions(baseline, current_report, RegressionRules.from_config(config))
    current_report.setdefault("baseline", {}).update(
        {
            "ref": ref,
            "run_id": (baseline.get("run") or {}).get("id"),
            "history_id": (baseline.get("run") or {}).get("history_id"),
            "label": (baseline.get("run") or {}).get("label"),
            "notes": comparison_notes(baseline, current_report),
        }
    )
    return [r.to_dict() for r in regressions]
