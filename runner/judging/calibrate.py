"""Calibration for `bundlerun tolerance suggest`: observed errors -> headroom + proposals.

For every output it gathers (actual, expected) pairs over all cases of all the
given runs, measures what each criterion would need to just pass (keeping the
other current criteria as they are), reports the headroom of the current
criteria, and proposes values with a safety margin:

    atol/rtol/qtol: margin x needed (qtol rounded up to whole steps)
    rel_frobenius_max: margin x worst
    sqnr_min_db: worst - 20*log10(margin)  (the error amplitude may grow by margin)
    cosine_min: 1 - margin x (1 - worst)
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundlerun.bundles.manifest import Criteria, Manifest
from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.errors import BundlerunError
from bundlerun.runner.judging.numerics import error_statistics
from bundlerun.runner.report.safe_text import visible


@dataclass
class OutputObservations:
    method: str
    index: int
    name: str
    criteria: Criteria
    pairs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (actual, expected) float64


@dataclass
class Observations:
    manifest: Manifest | None
    outputs: dict[tuple[str, int], OutputObservations]
    runs: int


@dataclass
class Proposal:
    method: str
    output: str
    cases: int
    rows: list[dict[str, Any]]  # criterion, current, measured, headroom, proposed

    def proposed(self) -> dict[str, float]:
        return {r["criterion"]: r["proposed"] for r in self.rows if r["proposed"] is not None}

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "output": self.output, "cases": self.cases, "rows": self.rows}


def _float(code: int, array: np.ndarray) -> np.ndarray:
    return st.to_float_array(code, array).astype(np.float64)


def collect_from_run_dirs(run_dirs: list[Path], bundle_path: Path | None = None) -> Observations:
    from bundlerun.runner.judging.judge import load_context  # start-up: loads flatbuffers on use
    from bundlerun.runner.history.saved_run import load_saved_run  # start-up: loads flatbuffers on use

    outputs: dict[tuple[str, int], OutputObservations] = {}
    manifest = None
    for directory in run_dirs:
        saved = load_saved_run(directory, bundle_path)
        ctx = load_context(saved.bundle)
        manifest = manifest or ctx.manifest
        for case in saved.run.cases:
            expected = saved.bundle.suite(case.method).test_cases[case.case_index].expected_outputs
            for j, raw in enumerate(case.outputs):
                if j >= len(expected) or expected[j].kind != "tensor":
                    continue
                name, criteria = ctx.criteria(case.method, j)
                obs = outputs.setdefault((case.method, j), OutputObservations(case.method, j, name, criteria))
                actual = _float(raw.scalar_type, raw.to_array())
                ref = _float(expected[j].scalar_type, expected[j].to_array())
                if actual.shape == ref.shape:
                    obs.pairs.append((actual, ref))
    if not any(o.pairs for o in outputs.values()):
        raise BundlerunError("no successful case with saved outputs in the given runs")
    return Observations(manifest, outputs, len(run_dirs))


def run_and_collect(bundle_path: Path, target: str, case_timeout: float = 120.0, session=None) -> Observations:
    """Run the bundle now through the session's run machinery (its [targets] config included,
    no history record), then read it back."""
    from bundlerun.runner.session import RunRequest, Session  # start-up: loads flatbuffers on use

    session = session or Session.load()
    with tempfile.TemporaryDirectory(prefix="bundlerun-suggest-") as tmp:
        Session(project=session.project, target_opts=session.target_opts, no_history=True).run(
            RunRequest(bundle_path=Path(bundle_path), target=target, report_dir=Path(tmp),
                       case_timeout_s=case_timeout, save_outputs=True))
        return collect_from_run_dirs([Path(tmp)], Path(bundle_path))


def _round_up(x: float) -> float:
    if x <= 0 or not math.isfinite(x):
        return max(x, 0.0)
    digits = 3 - int(math.floor(math.log10(x))) - 1
    factor = 10.0 ** digits
    return math.ceil(x * factor - 1e-9) / factor


def _round_down(x: float) -> float:
    if x <= 0 or not math.isfinite(x):
        return x
    digits = 3 - int(math.floor(math.log10(abs(x)))) - 1
    factor = 10.0 ** digits
    return math.floor(x * factor + 1e-9) / factor


def measure(obs: OutputObservations) -> dict[str, float]:
    """What each criterion needs to just pass, over every case (others held at current values)."""

    c = obs.criteria
    atol, rtol = c.atol or 0.0, c.rtol or 0.0
    qstep = c.scale if c.scale is not None else 1.0
    qterm = (c.qtol or 0.0) * qstep
    atol_eff = atol + qterm
    need = {"atol": 0.0, "rtol": 0.0, "qtol": 0.0, "ratio": 0.0, "max_abs": 0.0}
    worst = {"sqnr_min_db": math.inf, "cosine_min": 1.0, "rel_frobenius_max": 0.0}
    for actual, ref in obs.pairs:
        finite = np.isfinite(actual) & np.isfinite(ref)
        diff = np.abs(actual - ref)[finite]
        r = np.abs(ref)[finite]
        if diff.size:
            need["max_abs"] = max(need["max_abs"], float(diff.max()))
            need["atol"] = max(need["atol"], float((diff - rtol * r - qterm).max()))
            need["qtol"] = max(need["qtol"], float((diff - atol - rtol * r).max()) / qstep)
            nz = r > 0
            if nz.any():
                need["rtol"] = max(need["rtol"], float(((diff[nz] - atol_eff) / r[nz]).max()))
            allowed = atol_eff + rtol * r
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(allowed > 0, diff / np.where(allowed > 0, allowed, 1), np.where(diff > 0, np.inf, 0.0))
            need["ratio"] = max(need["ratio"], float(ratio.max()))
        stats = error_statistics(actual, ref, elementwise=False)
        sqnr = stats.sqnr_actual if c.sqnr_reference == "actual" else stats.sqnr  # as the criterion measures it
        if sqnr is not None:
            worst["sqnr_min_db"] = min(worst["sqnr_min_db"], sqnr)
        if stats.cosine_similarity is not None:
            worst["cosine_min"] = min(worst["cosine_min"], stats.cosine_similarity)
        if stats.relative_frobenius is not None:
            worst["rel_frobenius_max"] = max(worst["rel_frobenius_max"], stats.relative_frobenius)
    return {**need, **worst}


def _headroom(key: str, current: float | None, m: dict[str, float]) -> float | None:
    if current is None:
        return None
    if key in ("atol", "rtol", "qtol"):
        return m["ratio"]
    if key == "rel_frobenius_max":
        return m[key] / current if current > 0 else (0.0 if m[key] == 0 else math.inf)
    if key == "sqnr_min_db":
        measured = m[key]
        if measured == math.inf:
            return 0.0
        return current / measured if measured > 0 else math.inf
    if key == "cosine_min":
        gap_limit, gap = 1.0 - current, 1.0 - m[key]
        return gap / gap_limit if gap_limit > 0 else (0.0 if gap <= 0 else math.inf)
    return None


def _propose(key: str, m: dict[str, float], margin: float) -> float | None:
    if key == "atol":
        return _round_up(max(m["atol"], 0.0) * margin)
    if key == "rtol":
        return _round_up(max(m["rtol"], 0.0) * margin)
    if key == "qtol":
        return float(math.ceil(max(m["qtol"], 0.0) * margin - 1e-9))
    if key == "rel_frobenius_max":
        return _round_up(m[key] * margin)
    if key == "sqnr_min_db":
        if not math.isfinite(m[key]):
            return None  # exact outputs: no error to calibrate a floor from
        return _round_down(m[key] - 20 * math.log10(margin))
    if key == "cosine_min":
        return _round_down(1.0 - margin * (1.0 - m[key]))
    return None


ELEMENTWISE = ("atol", "rtol", "qtol")


def default_keys(c: Criteria) -> list[str]:
    """Criteria to propose when none are named: the signal criteria already set, plus ONE
    element-wise knob (qtol for a quantized output that has one, else atol): each proposal
    holds the other criteria at their current values, so only one bound may move at a time."""
    keys = [k for k in ("sqnr_min_db", "cosine_min", "rel_frobenius_max") if getattr(c, k) is not None]
    if c.elementwise:
        keys.insert(0, "qtol" if c.qtol is not None and c.scale is not None else "atol")
    return keys


def propose(obs: Observations, margin: float, wanted: list[str] | None = None) -> list[Proposal]:
    from bundlerun.bundles.registry import CRITERIA  # start-up: loads tomli on use

    proposals = []
    for (method, index), o in sorted(obs.outputs.items()):
        if not o.pairs:
            continue
        m = measure(o)
        current = {k: getattr(o.criteria, k) for k in CRITERIA}
        keys = list(wanted) if wanted else default_keys(o.criteria)
        rows = []
        for key in CRITERIA:
            if current[key] is None and key not in keys:
                continue
            measured = m[key] if key in ("sqnr_min_db", "cosine_min", "rel_frobenius_max") else max(m[key], 0.0)
            rows.append({
                "criterion": key,
                "current": current[key],
                "measured": measured,
                "headroom": _headroom(key, current[key], m),
                "proposed": _propose(key, m, margin) if key in keys and not o.criteria.exact else None,
            })
        rows.append({"criterion": "max |a-r|", "current": None, "measured": m["max_abs"], "headroom": None, "proposed": None})
        proposals.append(Proposal(method, o.name, len(o.pairs), rows))
    return proposals


def _toml_value(key: str, v: float) -> str:
    if key == "qtol":
        return str(int(v))
    return repr(float(v))


def toml_block(obs: Observations, proposals: list[Proposal], margin: float) -> str:
    """Ready-to-paste bundlerun.toml text: one model override per output."""
    from bundlerun.bundles.registry import Registry, tier_for  # start-up: loads tomli on use

    lines = [f"# bundlerun tolerance suggest --margin {margin:g}: {obs.runs} run(s)",
             "# paste into bundlerun.toml (in pyproject.toml: [[tool.bundlerun.tolerances.model_overrides]])"]
    m = obs.manifest
    for p in proposals:
        values = p.proposed()
        if not values:
            lines.append(f"# {visible(p.method)}.{visible(p.output)}: nothing to propose")  # a comment stays one line
            continue
        lines.append("")
        max_abs = next((r["measured"] for r in p.rows if r["criterion"] == "max |a-r|"), None)
        if max_abs == 0:
            lines.append(f"# {visible(p.method)}.{visible(p.output)}: no error observed in {p.cases} case(s); a margin "
                         "cannot scale zero")
        if m is not None and m.model.id and m.build.backend:
            backend = m.build.backend
            lines.append("[[tolerances.model_overrides]]")
            lines.append(f"models = [{_q(m.model.id)}]")
            lines.append(f"backend = {_q(backend)}")
            try:
                variant = Registry.builtin().variant_for(backend, m.build.target)
            except Exception:  # noqa: BLE001 - an unknown backend only loses the variant line
                variant = None
            if variant:
                lines.append(f"variants = [{_q(variant)}]")
            if m.build.dtype:
                lines.append(f"dtypes = [{_q(tier_for(m.build.dtype, m.build.reference or 'eager-fp32'))}]")
            lines.append(f"methods = [{_q(p.method)}]")
            lines.append(f"outputs = [{_q(p.output)}]")
        else:
            lines.append("[tolerances.override]  # bundle without manifest: applies to every build")
            lines.append(f"outputs = [{_q(p.output)}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(key, value)}")
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    """A TOML basic string. Names come from the bundle: a newline or control character is escaped,
    so a hostile output name cannot end the string and add lines to the config it is pasted into."""
    out = []
    for ch in str(text):
        if ch in '"\\':
            out.append("\\" + ch)
        elif not ch.isprintable() or ch in "\u2028\u2029":
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
