"""Token-level figures of an LLM's logits, per step and per sequence (numpy only; issue 35).

A step's output is the last token's logits `[1, vocab]` (LLM_CONTRACT: output 0 of `forward`);
larger outputs are read as rows of the last axis and the step's figures come from the last row
(the last token). Besides the element-wise statistics every output gets (runner/judging/numerics.py
`error_statistics`, ExecuTorch's ErrorStatistics names), a step has:

- argmax agreement: the target's greedy token against the reference token. argmax takes the
  first of equal maxima, as torch.argmax does, which ExecuTorch's greedy decode calls
  (examples/models/llama/runner/generation.py:46).
- top-k overlap: the share of the reference's k most likely tokens that are among the target's
  (k = 5: bundlerun's own, the usual "top-5"; ties broken by the lower token id).
- KL(reference || target) of the two softmax distributions, in nats.
- margin: the reference token's log-probability under the target minus the best other token's.
  Log-softmax shifts every logit by the same amount, so this is also the logit gap. Positive:
  the target still picks the reference token, by that much; negative: it flipped, by that much.
- the log-probability of the reference token under the target and under the reference, from
  which a sequence's perplexity of the teacher-forced continuation is computed.

Log-softmax is computed in float64 after subtracting the row's maximum, so logits of 1e30 do
not overflow. Logits holding NaN or +-Inf have no distribution: those figures are None and the
step does not agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from bundlerun.runner.judging.error_stats import OutputStats, error_statistics
from bundlerun.runner.judging.failed_criterion import FailedCriterion
from bundlerun.targets.base import Verdict

TOP_K = 5  # bundlerun's own: the top-5 of classification accuracy, applied to next-token candidates
PICK_MAX = 16  # bundlerun's own: up to this k, k argmax passes beat one selection (measured on 32,000 logits)


@dataclass
class StepMetrics:
    """One step's token-level figures (None where the logits do not give one)."""

    sqnr: float | None  # OutputStats.sqnr: 20*log10(||reference|| / ||target - reference||)
    cosine_similarity: float | None
    error_max: float | None
    reference_token: int  # the token the step is judged by (the manifest's reference_next)
    reference_argmax: int | None  # the reference logits' own argmax (None: non-finite logits)
    target_token: int | None  # the target logits' argmax (None: non-finite logits)
    argmax_match: bool
    top_k: int
    top_k_overlap: float | None
    kl: float | None  # KL(reference || target), nats
    margin: float | None  # log p_t(reference token) - max over other tokens of log p_t; None: vocab of 1
    logprob_target: float | None  # log p_t(reference token)
    logprob_reference: float | None  # log p_r(reference token)


def _last_row(logits: Any) -> np.ndarray:
    arr = np.asarray(logits, dtype=np.float64)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return arr.reshape(-1, arr.shape[-1])[-1] if arr.size else arr.reshape(-1)


def log_softmax(row: np.ndarray) -> np.ndarray | None:
    """Numerically stable log-softmax of one row in float64; None for an empty or non-finite row."""
    row = np.asarray(row, dtype=np.float64)
    if row.size == 0 or not np.all(np.isfinite(row)):
        return None
    shifted = row - row.max()
    return shifted - math.log(float(np.exp(shifted).sum()))


def top_k_ids(row: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries' ids, largest first, ties broken by the lower id: the first k of a stable
    argsort of the negated row. For a few ids (k <= PICK_MAX) each is the argmax of what is left
    (argmax takes the first of equal maxima, the lower id, as the stable sort does): k passes of a
    vectorised argmax instead of a selection, 0.5 -> 0.03 ms on 32,000 logits. Otherwise only the entries
    at least as large as the k-th largest are sorted (np.partition finds it), in id order, so equal
    ones keep the lower id first as in the full sort."""
    row = np.asarray(row)
    k = max(0, k)
    if k == 0 or k >= row.size or not np.isfinite(row).all():  # NaN does not order: the full sort's rules
        return np.argsort(-np.asarray(row, dtype=np.float64), kind="stable")[:k]
    if k <= PICK_MAX:
        left = np.array(row, dtype=np.float64)  # a copy; -inf marks a taken id (every value left is finite)
        ids = np.empty(k, dtype=np.intp)
        for i in range(k):
            ids[i] = j = int(np.argmax(left))
            left[j] = -np.inf
        return ids
    neg = -np.asarray(row, dtype=np.float64)
    kth = np.partition(neg, k - 1)[k - 1]
    candidates = np.flatnonzero(neg <= kth)  # every entry above the k-th and all equal to it, in id order
    return candidates[np.argsort(neg[candidates], kind="stable")][:k]


def kl_divergence(lp_reference: np.ndarray, lp_target: np.ndarray) -> float:
    """KL(p || q) = sum p * (log p - log q) over the tokens with p > 0 (0 * log 0 = 0)."""
    p = np.exp(lp_reference)
    if np.isfinite(lp_reference).all() and np.isfinite(lp_target).all():  # a p that underflows to 0 adds 0
        value = float(np.einsum("i,i->", p.reshape(-1), (lp_reference - lp_target).reshape(-1)))
    else:
        keep = p > 0
        value = float(np.sum(p[keep] * (lp_reference[keep] - lp_target[keep])))
    return max(value, 0.0)  # rounding can give -1e-17 for equal distributions; KL is never negative


def margin(lp_target: np.ndarray, token: int) -> float | None:
    """log p_t(token) minus the largest log p_t of any other token; None with no other token."""
    if lp_target.size < 2 or not 0 <= token < lp_target.size:
        return None
    others = np.delete(lp_target, token)
    return float(lp_target[token] - others.max())


def step_metrics(target: Any, reference: Any, reference_token: int | None = None, k: int = TOP_K,
                 stats: OutputStats | None = None) -> StepMetrics:
    """The figures of one step. `reference_token`: the teacher-forced token (default: the
    reference logits' argmax); `stats`: the output's ErrorStatistics when already computed."""
    stats = stats if stats is not None else error_statistics(np.asarray(target), np.asarray(reference))
    t_row, r_row = _last_row(target), _last_row(reference)
    lp_t, lp_r = log_softmax(t_row), log_softmax(r_row)
    r_arg = int(np.argmax(r_row)) if lp_r is not None else None
    t_arg = int(np.argmax(t_row)) if lp_t is not None else None
    token = int(reference_token) if reference_token is not None else (r_arg if r_arg is not None else -1)
    same_vocab = t_row.shape == r_row.shape
    k = min(k, r_row.size)
    overlap = kl = None
    if lp_t is not None and lp_r is not None and same_vocab and k > 0:
        overlap = len(set(top_k_ids(r_row, k).tolist()) & set(top_k_ids(t_row, k).tolist())) / k
        kl = kl_divergence(lp_r, lp_t)
    in_t = lp_t is not None and 0 <= token < lp_t.size
    in_r = lp_r is not None and 0 <= token < lp_r.size
    return StepMetrics(
        sqnr=stats.sqnr, cosine_similarity=stats.cosine_similarity, error_max=stats.error_max,
        reference_token=token, reference_argmax=r_arg, target_token=t_arg,
        argmax_match=t_arg is not None and t_arg == token, top_k=k, top_k_overlap=overlap, kl=kl,
        margin=margin(lp_t, token) if in_t and lp_t is not None else None,
        logprob_target=float(lp_t[token]) if in_t and lp_t is not None else None,
        logprob_reference=float(lp_r[token]) if in_r and lp_r is not None else None,
    )


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def token_checks(target: Any, reference: Any, argmax_match: bool, kl_max: float | None,
                 top_k_overlap_min: float | None, reference_token: int | None = None,
                 stats: OutputStats | None = None) -> list[FailedCriterion]:
    """The token-level criteria of one output, each failing as its own named criterion with a
    one-line message: `argmax: expected token 17 -> got 212, margin -0.8`."""
    return token_verdict(target, reference, argmax_match, kl_max, top_k_overlap_min, reference_token, stats)[0]


def token_verdict(target: Any, reference: Any, argmax_match: bool, kl_max: float | None,
                  top_k_overlap_min: float | None, reference_token: int | None = None,
                  stats: OutputStats | None = None) -> tuple[list[FailedCriterion], StepMetrics | None]:
    """`token_checks` and the step figures it judged by (None when no token rule is set): a step's
    judging (runner/judging/judge.py) reuses them when its reference token is the one they used."""
    if not argmax_match and kl_max is None and top_k_overlap_min is None:
        return [], None
    m = step_metrics(target, reference, reference_token, stats=stats)
    failed: list[FailedCriterion] = []
    if argmax_match and not m.argmax_match:
        got = "non-finite logits" if m.target_token is None else f"token {m.target_token}"
        failed.append(FailedCriterion(
            "argmax_match", m.target_token, m.reference_token,
            f"argmax: expected token {m.reference_token} -> got {got}"
            + (f", margin {_fmt(m.margin)}" if m.margin is not None else "")))
    if kl_max is not None and not (m.kl is not None and m.kl <= kl_max):
        failed.append(FailedCriterion("kl_max", m.kl, kl_max,
                                      f"KL(reference || target) {_fmt(m.kl)} nats > ceiling {_fmt(kl_max)}"
                                      if m.kl is not None else "KL not computable (non-finite logits)"))
    if top_k_overlap_min is not None and not (m.top_k_overlap is not None and m.top_k_overlap >= top_k_overlap_min):
        failed.append(FailedCriterion(
            "top_k_overlap_min", m.top_k_overlap, top_k_overlap_min,
            f"top-{m.top_k} overlap {_fmt(m.top_k_overlap)} < floor {_fmt(top_k_overlap_min)}"
            if m.top_k_overlap is not None else f"top-{m.top_k} overlap not computable (non-finite logits)"))
    return failed, m


@dataclass
class SequenceFigures:
    """One sequence over its steps (index = position in SequenceSpec.steps)."""

    steps: int
    first_divergence: int | None  # first step whose argmax differs or that did not PASS; None: none did
    greedy_agreement: int  # leading steps whose target argmax is the reference token
    perplexity_target: float | None  # exp(mean -log p_t(reference token)); None unless every step has one
    perplexity_reference: float | None  # the same under the eager reference
    perplexity_ratio: float | None  # target / reference: 1.0 = no loss


def perplexity(logprobs: Sequence[float | None]) -> float | None:
    """exp of the mean negative log-likelihood (examples/models/llama/eval_llama_lib.py:439 `torch.exp(torch.cat(nlls).mean())`);
    None for no steps or a step without a figure."""
    if not logprobs or any(lp is None or not math.isfinite(lp) for lp in logprobs):
        return None
    mean_nll = -sum(float(lp) for lp in logprobs if lp is not None) / len(logprobs)
    return math.exp(mean_nll) if mean_nll < 709 else math.inf  # exp overflows float64 past ~709.78


def sequence_figures(metrics: Sequence[StepMetrics | None], verdicts: Iterable[str]) -> SequenceFigures:
    """First divergence, greedy agreement length and perplexities of one sequence's steps.
    `metrics[i]` is None when step i gave no logits (an error, a skip)."""
    verdicts = list(verdicts)
    first = next((i for i, (m, v) in enumerate(zip(metrics, verdicts))
                  if m is None or not m.argmax_match or v != Verdict.PASS), None)
    agree = next((i for i, m in enumerate(metrics) if m is None or not m.argmax_match), len(metrics))
    ppl_t = perplexity([m.logprob_target if m else None for m in metrics])
    ppl_r = perplexity([m.logprob_reference if m else None for m in metrics])
    ratio = None
    if ppl_t is not None and ppl_r is not None and ppl_r > 0 and math.isfinite(ppl_r):
        ratio = ppl_t / ppl_r
    return SequenceFigures(len(metrics), first, agree, ppl_t, ppl_r, ratio)
