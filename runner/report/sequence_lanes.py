"""One LLM bundle-set across lanes: the per-step table `bundlerun compare RUN RUN [RUN...]` prints.

The same model, weights and prompts lowered for each lane by its own backend (export_llama's XNNPACK or
MLX path, QNN's static llama...) make different programs whose steps do not line up one to one:
export_llama feeds a prompt in one step, QNN's static llama one token a step. What every lane shares is
the position whose next-token logits a step returns (`start_pos + tokens - 1`), so rows are keyed by
(sequence, that position); a position only one lane judges (QNN's earlier prompt tokens) shows `–` in
the others. Each lane's figures are against its own bundle's reference (the eager model its program was
lowered from), as its own report judged them. Which reports belong together is the report's
`bundle.sequence_set` (bundles/sequence.py `sequence_set_digest`): the same model, params, weights,
seed and prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bundlerun.bundles.errors import ConfigError

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report
    from bundlerun.runner.report.sequences import StepRecord


@dataclass
class Lane:
    """One run: where it ran and what it ran."""

    target: str
    backend: str | None
    dtype: str | None
    run: str  # history id or run uuid prefix
    verdict: str
    steps_passed: int = 0
    steps: int = 0


@dataclass
class LaneRow:
    """One (sequence, position): each lane's step there, or None where that lane has no such step."""

    sequence: int
    position: int
    kind: str
    steps: list[StepRecord | None] = field(default_factory=list)


@dataclass
class LaneTable:
    lanes: list[Lane]
    rows: list[LaneRow]
    sequence_set: str

    def all_passed(self) -> bool:
        return all(lane.steps_passed == lane.steps for lane in self.lanes)

    def to_json(self) -> dict[str, Any]:
        return {"sequence_set": self.sequence_set,
                "lanes": [vars(lane) for lane in self.lanes],
                "rows": [{"sequence": r.sequence, "position": r.position, "kind": r.kind, "reference": reference_cell(r),
                          "lanes": [s.to_json() if s is not None else None for s in r.steps]} for r in self.rows]}


def is_sequence_run(report: Report) -> bool:
    return bool(report.sequences)


def lane_table(reports: list[Report], force: bool = False) -> LaneTable:
    """The per-step table of `reports`, each one lane's run of one bundle-set. Runs of different
    bundle-sets (or of reports without the fingerprint) are refused in one line unless `force`."""
    sets = [r.bundle.get("sequence_set") for r in reports]
    missing = [i for i, s in enumerate(sets) if not s]
    if missing and not force:
        raise ConfigError(f"run {missing[0] + 1} of {len(reports)} has no bundle.sequence_set (an older report, or not an LLM "
                          "bundle): cannot tell it is the same model, weights and prompts (--force lines the steps up anyway)")
    if len({s for s in sets if s}) > 1 and not force:
        first = sets[0]
        other = next(i for i, s in enumerate(sets) if s != first)
        raise ConfigError(f"runs 1 and {other + 1} are of different bundle-sets (model, params, weights or prompts differ: "
                          f"{reports[0].bundle.get('model')} vs {reports[other].bundle.get('model')}); --force compares anyway")
    lanes: list[Lane] = []
    index: dict[tuple[int, int], LaneRow] = {}
    for j, report in enumerate(reports):
        run = report.run or {}
        tag = f"#{run['history_id']}" if run.get("history_id") else str(run.get("id") or "?")[:12]
        steps = [s for seq in report.sequences for s in seq.steps]
        lanes.append(Lane(str(report.target.get("url") or report.bundle.get("built_for") or "?"),
                          report.bundle.get("backend"), report.bundle.get("dtype"), tag, str(report.summary.verdict),
                          sum(1 for s in steps if s.verdict == "PASS"), len(steps)))
        for i, seq in enumerate(report.sequences):
            for step in seq.steps:
                key = (i, step.start_pos + max(step.tokens, 1) - 1)
                row = index.get(key)
                if row is None:
                    row = index[key] = LaneRow(i, key[1], step.kind, [None] * len(reports))
                row.steps[j] = step
    for row in index.values():
        row.steps += [None] * (len(reports) - len(row.steps))
    rows = sorted(index.values(), key=lambda r: (r.sequence, r.position))
    return LaneTable(lanes, rows, str(sets[0] or "unchecked"))


def reference_cell(row: LaneRow) -> str:
    """The reference token the lanes' eager models chose at this position: one id when they agree, else
    each lane's (`500|151`: two eager models of the same weights split on a near-tie, e.g. export_llama's
    Transformer and QNN's static llama, whose linears are convolutions)."""
    refs = [str(s.reference_token) for s in row.steps if s is not None]
    return refs[0] if len(set(refs)) == 1 else "|".join(str(s.reference_token) if s is not None else "–" for s in row.steps)


def step_cell(step: StepRecord | None) -> str:
    """`135.2 dB 337->337 ✓ PASS`; `–` where the lane has no step at this position."""
    if step is None:
        return "–"
    sqnr = "–" if step.sqnr is None else ("exact" if step.sqnr == float("inf") else f"{step.sqnr:.1f} dB")
    target = "–" if step.target_token is None else str(step.target_token)
    mark = "" if step.argmax_match is None else (" ✓" if step.argmax_match else " ✗")
    return f"{sqnr} {step.reference_token}->{target}{mark} {step.verdict}"


def lane_heading(lane: Lane) -> str:
    return f"{lane.target} ({lane.backend} {lane.dtype}, {lane.run})"
