"""The per-sequence records (`Report.sequences`, LLM bundles) of merged reports.

`bundlerun merge` (runner/report/merge.py) puts shards of one run back together and sets jobs side
by side; the sequences must follow their cases or a merged LLM report loses its per-step table.

- **shards** of one run: every shard's report lists every sequence of the manifest, a step whose
  case that shard did not run reading ERROR. Each step is taken from the report that ran its case
  (the first, if several did), and the sequence's verdict and figures (first divergence, greedy
  agreement, perplexities) are recomputed from the merged steps, as one run computes them.
- **jobs**: each job's sequences, their `method` named `JOB/METHOD` as its cases are.

Works on the reports' JSON form, as the merge does.
"""

from __future__ import annotations

from typing import Sequence

from bundlerun.runner.judging.token_metrics import StepMetrics, sequence_figures
from bundlerun.runner.report.sequences import _ORDER, SequenceRecord, StepRecord


def _ran(doc: dict) -> set[tuple[str, int]]:
    return {(str(c.get("method")), int(c.get("case", -1))) for c in doc.get("cases") or []}


def _metrics(step: StepRecord) -> StepMetrics | None:
    """What sequence_figures reads of a step, back from its record (None: the step gave no logits)."""
    if step.argmax_match is None:
        return None
    return StepMetrics(step.sqnr, step.cosine_similarity, step.error_max, step.reference_token, None,
                       step.target_token, bool(step.argmax_match), step.top_k or 0, step.top_k_overlap, step.kl,
                       step.margin, step.logprob_target, step.logprob_reference)


def rejudged(seq: SequenceRecord) -> SequenceRecord:
    """`seq` with its verdict and figures recomputed from its steps."""
    figures = sequence_figures([_metrics(s) for s in seq.steps], [s.verdict for s in seq.steps])
    seq.verdict = max((s.verdict for s in seq.steps), key=lambda v: _ORDER.index(v) if v in _ORDER else len(_ORDER),
                      default=seq.verdict)
    seq.first_divergence, seq.greedy_agreement = figures.first_divergence, figures.greedy_agreement
    seq.perplexity_target, seq.perplexity_reference = figures.perplexity_target, figures.perplexity_reference
    seq.perplexity_ratio = figures.perplexity_ratio
    return seq


def merge_shard_sequences(docs: Sequence[dict]) -> list[dict]:
    """The sequences of shards of one run, each step from the report that ran it (see the module)."""
    order: list[tuple[str, str]] = []
    found: dict[tuple[str, str], list[tuple[SequenceRecord, set[tuple[str, int]]]]] = {}
    for doc in docs:
        ran = _ran(doc)
        for data in doc.get("sequences") or []:
            seq = SequenceRecord.from_json(data)
            key = (seq.method, seq.name)
            if key not in found:
                order.append(key)
            found.setdefault(key, []).append((seq, ran))
    out = []
    for key in order:
        copies = found[key]
        merged = SequenceRecord.from_json(copies[0][0].to_json())
        for i, step in enumerate(merged.steps):
            run_here = next((s for s, ran in copies if i < len(s.steps) and (s.method, s.steps[i].case) in ran), None)
            if run_here is not None:
                merged.steps[i] = StepRecord.from_json(run_here.steps[i].to_json())
            else:
                merged.steps[i] = step
        out.append(rejudged(merged).to_json() if len(copies) > 1 else merged.to_json())
    return out


def job_sequences(doc: dict, job: str) -> list[dict]:
    """One job's sequences with `method` = `JOB/METHOD`, as the merge names its cases."""
    out = []
    for data in doc.get("sequences") or []:
        seq = dict(data)
        seq["method"] = f"{job}/{seq.get('method')}"
        out.append(seq)
    return out
