"""The report's per-sequence records of an LLM bundle: `Report.sequences` (docs/report-schema.md).

One `SequenceRecord` per `SequenceSpec` of the manifest (bundles/sequence.py), one `StepRecord`
per step with its case's verdict and token figures (runner/judging/token_metrics.py), plus the sequence's
figures: first diverging step, greedy agreement length and the perplexity of the teacher-forced
continuation under the target and the eager reference. Typed in memory; JSON only in
`to_json`/`from_json` (non-finite numbers as "inf"/"-inf"/"nan", as every report number).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

from bundlerun.runner.judging.numerics import _clean
from bundlerun.runner.judging.stats_records import asdict_value
from bundlerun.runner.judging.token_metrics import StepMetrics, sequence_figures
from bundlerun.targets.base import Verdict

_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _number(value: Any) -> float | None:
    if value is None:
        return None
    return _SPECIAL[value] if isinstance(value, str) else float(value)


@dataclass
class StepRecord:
    """One step: which case it is, what it fed, its verdict and token figures (None: no logits)."""

    step: int
    case: int
    kind: str  # prompt | decode
    start_pos: int
    tokens: int  # how many tokens the step fed
    verdict: str  # the case's verdict
    reference_token: int
    target_token: int | None = None
    argmax_match: bool | None = None
    sqnr: float | None = None
    cosine_similarity: float | None = None
    error_max: float | None = None
    top_k: int | None = None
    top_k_overlap: float | None = None
    kl: float | None = None
    margin: float | None = None
    logprob_target: float | None = None
    logprob_reference: float | None = None
    # --replay N on a stateful sequence: did the step's logits change between whole-sequence executions
    # (runner/judging/replay.py `step_replay`): {"runs", "distinct", "spread", "changed"}; None: not replayed
    replay: dict[str, Any] | None = None

    _NUMBERS = ("sqnr", "cosine_similarity", "error_max", "top_k_overlap", "kl", "margin", "logprob_target",
                "logprob_reference")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StepRecord":
        kw: dict[str, Any] = {f.name: data.get(f.name) for f in fields(cls) if f.name in data}
        for key in cls._NUMBERS:
            kw[key] = _number(kw.get(key))
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        out = _fields_json(self, _STEP_FIELDS)
        if self.replay is None:  # records of runs without --replay stay as they were
            del out["replay"]
        return out


@dataclass
class SequenceRecord:
    """One sequence of the manifest, judged."""

    name: str
    method: str
    mode: str  # teacher-forced | greedy
    stateful: bool
    verdict: str  # PASS when every step passed; else the worst step verdict
    steps: list[StepRecord] = field(default_factory=list)
    first_divergence: int | None = None  # step index; None: every step agreed and passed
    greedy_agreement: int = 0  # leading steps whose target token is the reference token
    perplexity_target: float | None = None
    perplexity_reference: float | None = None
    perplexity_ratio: float | None = None
    prompt_text: str | None = None
    # state "io" (bundles/sequence.py): who carried the KV cache from a step's outputs to the next step's
    # inputs, e.g. "threaded by bundlerun: 4/4 later steps ran on the cache the target's earlier steps returned"
    state: str | None = None
    # --replay N: the lane (and its driver) the sequence was replayed on and how many steps' logits changed
    replay: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SequenceRecord":
        kw: dict[str, Any] = {f.name: data.get(f.name) for f in fields(cls) if f.name in data}
        kw["steps"] = [StepRecord.from_json(s) for s in data.get("steps") or []]
        for key in ("perplexity_target", "perplexity_reference", "perplexity_ratio"):
            kw[key] = _number(kw.get(key))
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        out = _fields_json(self, _SEQUENCE_FIELDS, steps=[s.to_json() for s in self.steps])
        if self.prompt_text is None:
            del out["prompt_text"]
        if self.state is None:  # program-state sequences: their records stay as they were
            del out["state"]
        if self.replay is None:
            del out["replay"]
        return out


_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))
_SEQUENCE_FIELDS = tuple(f.name for f in fields(SequenceRecord))


def _fields_json(record: Any, names: tuple[str, ...], **given: Any) -> dict[str, Any]:
    """`_clean(asdict(record))` in one pass over its fields (`given`: fields whose JSON the caller made):
    plain values as they are, non-finite floats as strings, anything else (a replay dict) copied as
    asdict copies it. asdict's generic deep copy of every step, made twice for a sequence's steps, was
    0.06 of the 0.2 s report.json of a 192-step LLM run took to build (cProfile, load 2)."""
    out: dict[str, Any] = {}
    for name in names:
        if name in given:
            out[name] = given[name]
            continue
        value = getattr(record, name)
        if value is None or isinstance(value, (str, int)):  # deepcopy keeps these (bool, str enums included)
            out[name] = value
        elif isinstance(value, float):
            out[name] = _clean(value)
        else:
            out[name] = _clean(asdict_value(value))
    return out


_ORDER = (Verdict.PASS, Verdict.SKIP, Verdict.FAIL, Verdict.TIMEOUT, Verdict.ERROR)  # worse to the right, as the summary reads them


def sequence_records(specs: Sequence[Any], verdicts: dict[tuple[str, int], str],
                     metrics: dict[tuple[str, int], StepMetrics],
                     threaded: dict[tuple[str, int], int] | None = None) -> list[SequenceRecord]:
    """The records of the manifest's sequences (`SequenceSpec`s), from each step case's verdict
    and token figures. A step whose case is absent from the run (not selected, never reached)
    is ERROR: a sequence is judged whole or shows where it stopped. `threaded`: the cases the lane
    ran on a KV cache it threaded from an earlier case's outputs (the worker's `kv_state_from_case`)."""
    records = []
    for spec in specs:
        steps: list[StepRecord] = []
        step_metrics: list[StepMetrics | None] = []
        for i, st in enumerate(spec.steps):
            key = (spec.method, st.case)
            m = metrics.get(key)
            step_metrics.append(m)
            rec = StepRecord(i, st.case, st.kind, st.start_pos, len(st.tokens), verdicts.get(key, Verdict.ERROR),
                             st.reference_next)
            if m is not None:
                rec.target_token, rec.argmax_match = m.target_token, m.argmax_match
                rec.sqnr, rec.cosine_similarity, rec.error_max = m.sqnr, m.cosine_similarity, m.error_max
                rec.top_k, rec.top_k_overlap, rec.kl, rec.margin = m.top_k, m.top_k_overlap, m.kl, m.margin
                rec.logprob_target, rec.logprob_reference = m.logprob_target, m.logprob_reference
            steps.append(rec)
        figures = sequence_figures(step_metrics, [s.verdict for s in steps])
        worst = max((s.verdict for s in steps), key=lambda v: _ORDER.index(v) if v in _ORDER else len(_ORDER),
                    default=Verdict.PASS)
        records.append(SequenceRecord(
            spec.name, spec.method, spec.mode, spec.stateful, worst, steps, figures.first_divergence,
            figures.greedy_agreement, figures.perplexity_target, figures.perplexity_reference,
            figures.perplexity_ratio, spec.prompt_text, _state_note(spec, threaded or {})))
    return records


def _state_note(spec: Any, threaded: dict[tuple[str, int], int]) -> str | None:
    """What carried an io-state sequence's KV cache: bundlerun, on how many of its later steps."""
    if getattr(spec, "state", "program") != "io":
        return None
    later = [st.case for st in spec.steps[1:]]
    done = sum(1 for c in later if (spec.method, c) in threaded)
    return (f"KV cache threaded by bundlerun: {done}/{len(later)} later steps ran on the cache the target's "
            "earlier steps returned (build.llm.kv_io)")


# ---------------------------------------------------------------- display (every report format)

STEP_COLUMNS = ("step", "kind", "pos", "SQNR dB", "cosine", "argmax ref->tgt", "top-k overlap", "KL", "margin",
                "verdict")
REPLAY_COLUMN = "replay"  # before the verdict, which every view keeps last
MAX_STEPS_SHOWN = 200  # rows of one sequence's table in a view (bundlerun's: a 64-step bench sequence fits whole)


def _g(value: Any, fmt: str = "{:.4g}") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return fmt.format(value)


def columns(seq: SequenceRecord) -> tuple[str, ...]:
    """The step table's columns for `seq`: STEP_COLUMNS, with `replay` before the verdict when it was replayed."""
    if any(s.replay for s in seq.steps):
        return (*STEP_COLUMNS[:-1], REPLAY_COLUMN, STEP_COLUMNS[-1])
    return STEP_COLUMNS


def replay_cell(entry: dict[str, Any] | None) -> str:
    """`same x3` or `changed: 2 distinct in 3, spread 1.2e-06`; `–` when the step was not replayed."""
    if not entry:
        return "–"
    if not entry.get("changed"):
        return f"same x{entry.get('runs')}"
    return f"changed: {entry.get('distinct')} distinct in {entry.get('runs')}, spread {_g(entry.get('spread'), '{:.3g}')}"


def step_cells(step: StepRecord, with_replay: bool = False) -> list[str]:
    """One step as the text cells of STEP_COLUMNS (`columns(seq)` with `with_replay`); each view escapes them."""
    target = "–" if step.target_token is None else str(step.target_token)
    mark = "" if step.argmax_match is None else (" ✓" if step.argmax_match else " ✗")
    overlap = "–" if step.top_k_overlap is None else f"{step.top_k_overlap:.2f} (k={step.top_k})"
    cells = [str(step.step), step.kind, str(step.start_pos), _g(step.sqnr, "{:.1f}"), _g(step.cosine_similarity, "{:.6f}"),
             f"{step.reference_token}->{target}{mark}", overlap, _g(step.kl, "{:.3g}"), _g(step.margin, "{:+.3g}")]
    return cells + ([replay_cell(step.replay)] if with_replay else []) + [step.verdict]


def headline(seq: SequenceRecord) -> str:
    """`seq0 (teacher-forced, stateful, 6 steps): FAIL; first divergence at step 4 (case 4); greedy
    agreement 4/6; perplexity 12.3 under the target vs 12.1 eager (x1.017)`."""
    n = len(seq.steps)
    parts = [f"{seq.name} ({seq.mode}, {'stateful' if seq.stateful else 'stateless'}, {n} steps): {seq.verdict}"]
    if seq.first_divergence is None:
        parts.append("no divergence")
    else:
        case = seq.steps[seq.first_divergence].case if seq.first_divergence < n else "?"
        parts.append(f"first divergence at step {seq.first_divergence} (case {case})")
    parts.append(f"greedy agreement {seq.greedy_agreement}/{n}")
    if seq.state:
        parts.append(seq.state)
    if seq.replay:
        parts.append(seq.replay)
    if seq.perplexity_target is not None and seq.perplexity_reference is not None:
        ratio = f" (x{seq.perplexity_ratio:.3f})" if seq.perplexity_ratio is not None else ""
        parts.append(f"perplexity {_g(seq.perplexity_target)} under the target vs {_g(seq.perplexity_reference)} "
                     f"eager{ratio}")
    return "; ".join(parts)


def text_lines(seq: SequenceRecord) -> list[str]:
    """The headline and a fixed-width per-step table: plain text views (JUnit's system-out)."""
    cols = columns(seq)
    rows = [list(cols)] + [step_cells(s, len(cols) > len(STEP_COLUMNS)) for s in seq.steps[:MAX_STEPS_SHOWN]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [headline(seq)] + ["  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if len(seq.steps) > MAX_STEPS_SHOWN:
        lines.append(f"... {len(seq.steps) - MAX_STEPS_SHOWN} more steps in report.json")
    return lines


def figures(seq: SequenceRecord) -> dict[str, Any]:
    """The per-sequence figures a run keeps (JUnit properties, history metrics): None when not known."""
    return {"steps": len(seq.steps), "first_divergence": seq.first_divergence,
            "greedy_agreement": seq.greedy_agreement, "perplexity_target": seq.perplexity_target,
            "perplexity_reference": seq.perplexity_reference, "perplexity_ratio": seq.perplexity_ratio}


def step_sqnr(seq: SequenceRecord) -> tuple[float | None, float | None]:
    """(worst, median) SQNR in dB over the steps that have logits; None when none has. An exact
    step is +inf: it counts as the best, so the worst is finite unless every step matched exactly."""
    values = sorted(float(s.sqnr) for s in seq.steps if s.sqnr is not None and not math.isnan(float(s.sqnr)))
    if not values:
        return None, None
    n = len(values)
    mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return values[0], mid


# The figures a run records in the history per sequence (runner/history/schema.py, table
# sequence_figures) and the names `bundlerun trend MODEL --metric NAME` draws them by: the median over
# the run's sequences with the min..max band (runner/history/store.py, sequence_trend). A sequence that
# never diverged reads its step count as its first divergence (agreement through the end), so that
# figure is higher-is-better throughout.
TREND_FIGURES = {
    "sequence_first_divergence": ("first_divergence", "steps"),
    "sequence_greedy_agreement": ("greedy_agreement", "steps"),
    "sequence_perplexity_ratio": ("perplexity_ratio", "ratio"),
    "sequence_perplexity_target": ("perplexity_target", "perplexity"),
    "sequence_perplexity_reference": ("perplexity_reference", "perplexity"),
    "sequence_sqnr_worst": ("sqnr_worst", "dB"),
    "sequence_sqnr_median": ("sqnr_median", "dB"),
    "sequence_steps": ("steps", "steps"),
}


def _finite_or_inf(value: Any) -> float | None:
    """A figure as the history stores it: NaN (no answer) is NULL; +-inf is kept (both databases take it)."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def history_rows(run_id: int, report: Any) -> list[dict[str, Any]]:
    """The sequence_figures rows of a report: one per sequence, keyed (run_id, method, sequence_index)."""
    rows = []
    for i, seq in enumerate(report.sequences):
        worst, median = step_sqnr(seq)
        rows.append({"run_id": run_id, "method": seq.method, "sequence_index": i, "name": seq.name,
                     "verdict": seq.verdict, "steps": len(seq.steps), "first_divergence": seq.first_divergence,
                     "greedy_agreement": seq.greedy_agreement,
                     "perplexity_target": _finite_or_inf(seq.perplexity_target),
                     "perplexity_reference": _finite_or_inf(seq.perplexity_reference),
                     "perplexity_ratio": _finite_or_inf(seq.perplexity_ratio),
                     "sqnr_worst": _finite_or_inf(worst), "sqnr_median": _finite_or_inf(median)})
    return rows
