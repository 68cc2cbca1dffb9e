"""Token-level figures (runner/judging/token_metrics.py) against values computed by hand: pure numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bundlerun.runner.judging.token_metrics import (StepMetrics, kl_divergence, log_softmax, perplexity, sequence_figures,
                                            step_metrics, token_checks, top_k_ids)


def _z() -> float:
    return math.e ** 2 + math.e + 1 + math.e ** -1


def test_swapped_top_two_by_hand():
    ref = np.array([[2.0, 1.0, 0.0, -1.0]], np.float32)
    tgt = np.array([[1.0, 2.0, 0.0, -1.0]], np.float32)
    m = step_metrics(tgt, ref)
    z = _z()
    p0, p1 = math.e ** 2 / z, math.e / z
    assert (m.reference_token, m.reference_argmax, m.target_token, m.argmax_match) == (0, 0, 1, False)
    assert m.margin == pytest.approx(-1.0)
    assert m.top_k == 4 and m.top_k_overlap == 1.0  # vocab 4 < k 5: the whole vocab, same set
    assert m.kl == pytest.approx((p0 - p1) * 1.0, rel=1e-12)  # p and q swap p0 <-> p1: (p0 - p1)(log p0 - log p1)
    assert m.logprob_target == pytest.approx(1 - math.log(z))
    assert m.logprob_reference == pytest.approx(2 - math.log(z))
    # ErrorStatistics figures come from runner/judging/numerics.py: ||e|| = sqrt(2), ||r|| = sqrt(6)
    assert m.error_max == pytest.approx(1.0)
    assert m.sqnr == pytest.approx(20 * math.log10(math.sqrt(6) / math.sqrt(2)))
    assert m.cosine_similarity == pytest.approx(5 / 6)


def test_sqnr_margin_small_vocab():
    m = step_metrics(np.array([[3.0, 4.5]]), np.array([[3.0, 4.0]]))
    assert m.sqnr == pytest.approx(20.0)  # ||r|| 5, ||e|| 0.5
    assert m.argmax_match and m.margin == pytest.approx(1.5)
    assert m.top_k == 2 and m.top_k_overlap == 1.0


def test_top_k_overlap_partial():
    ref = np.arange(10, dtype=np.float64)[::-1].copy()  # top-5: 0..4
    tgt = ref.copy()
    tgt[[3, 4]] = -5  # 3 and 4 leave the target's top-5; 5 and 6 come in
    m = step_metrics(tgt[None], ref[None])
    assert m.top_k == 5 and m.top_k_overlap == pytest.approx(3 / 5)
    assert m.argmax_match and m.margin == pytest.approx(1.0)


def test_equal_logits_ties():
    flat = np.zeros((1, 3))
    m = step_metrics(flat, flat)
    assert m.target_token == 0 and m.argmax_match  # first of equal maxima, as torch.argmax
    assert m.margin == 0.0 and m.kl == 0.0 and m.top_k_overlap == 1.0
    assert m.logprob_target == pytest.approx(-math.log(3))
    assert list(top_k_ids(np.array([1.0, 2.0, 2.0, 1.0]), 3)) == [1, 2, 0]
    # a tie in the target that the lower id wins flips the token with margin exactly 0
    tied = step_metrics(np.array([[5.0, 5.0]]), np.array([[0.0, 1.0]]))
    assert tied.target_token == 0 and not tied.argmax_match and tied.margin == 0.0


def test_vocab_of_one():
    m = step_metrics(np.array([[7.0]]), np.array([[3.0]]))
    assert m.argmax_match and m.margin is None  # no runner-up
    assert m.kl == 0.0 and m.top_k == 1 and m.top_k_overlap == 1.0
    assert m.logprob_target == 0.0 and m.logprob_reference == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_target_has_no_distribution(bad):
    tgt = np.array([[1.0, bad, 0.0]])
    m = step_metrics(tgt, np.array([[1.0, 2.0, 0.0]]))
    assert m.target_token is None and not m.argmax_match
    assert m.kl is None and m.top_k_overlap is None and m.margin is None and m.logprob_target is None
    assert m.logprob_reference is not None and m.reference_token == 1
    failed = token_checks(tgt, np.array([[1.0, 2.0, 0.0]]), True, 1.0, 0.5)
    assert [f.criterion for f in failed] == ["argmax_match", "kl_max", "top_k_overlap_min"]
    assert "non-finite logits" in failed[0].detail


def test_huge_logits_are_stable():
    ref = np.array([[1e30, 0.0, -1e30]])
    same = step_metrics(ref, ref)
    assert same.kl == 0.0 and same.logprob_target == 0.0 and same.margin == pytest.approx(1e30)
    flipped = step_metrics(np.array([[0.0, 1e30, -1e30]]), ref)
    assert flipped.kl == pytest.approx(1e30) and math.isfinite(flipped.kl)
    assert flipped.margin == pytest.approx(-1e30) and flipped.target_token == 1
    lp = log_softmax(np.array([1000.0, 1000.0]))
    assert lp is not None and np.allclose(lp, [-math.log(2)] * 2)


def test_kl_ignores_zero_probability_terms_and_is_never_negative():
    lp_p = np.array([0.0, -np.inf])  # p = [1, 0]
    assert kl_divergence(lp_p, np.array([math.log(0.5)] * 2)) == pytest.approx(math.log(2))
    x = log_softmax(np.array([0.1, 0.2, 0.3]))
    assert x is not None and kl_divergence(x, x) == 0.0


def test_teacher_forced_token_is_judged_not_the_reference_argmax():
    m = step_metrics(np.array([[0.0, 3.0, 1.0]]), np.array([[0.0, 3.0, 1.0]]), reference_token=2)
    assert m.reference_token == 2 and m.reference_argmax == 1 and not m.argmax_match
    assert m.margin == pytest.approx(-2.0)
    out_of_range = step_metrics(np.array([[0.0, 1.0]]), np.array([[0.0, 1.0]]), reference_token=9)
    assert out_of_range.margin is None and out_of_range.logprob_target is None and not out_of_range.argmax_match


def test_last_row_of_full_logits():
    ref = np.array([[[0.0, 1.0], [1.0, 0.0]]])  # [1, S=2, vocab]: the last token's row decides
    m = step_metrics(ref, ref)
    assert m.reference_token == 0 and m.argmax_match


def test_token_checks_messages():
    failed = token_checks(np.array([[0.0, 1.0, 0.2]]), np.array([[1.0, 0.0, 0.2]]), True, 1e-3, 1.0)
    by = {f.criterion: f for f in failed}
    assert by["argmax_match"].detail == "argmax: expected token 0 -> got token 1, margin -1"
    assert by["argmax_match"].measured == 1 and by["argmax_match"].limit == 0
    assert by["kl_max"].measured > 1e-3 and "nats > ceiling 0.001" in by["kl_max"].detail
    assert "top_k_overlap_min" not in by  # the same 3 tokens: overlap 1.0
    assert token_checks(np.array([[0.0, 1.0]]), np.array([[0.0, 1.0]]), True, 0.0, 1.0) == []
    assert token_checks(np.array([[0.0, 1.0]]), np.array([[1.0, 0.0]]), False, None, None) == []


def _m(match: bool, lp_t: float | None = -1.0, lp_r: float | None = -1.0) -> StepMetrics:
    return StepMetrics(40.0, 1.0, 0.0, 1, 1, 1 if match else 2, match, 5, 1.0, 0.0, 1.0, lp_t, lp_r)


def test_sequence_figures():
    f = sequence_figures([_m(True), _m(True), _m(False), _m(True)], ["PASS"] * 4)
    assert (f.steps, f.first_divergence, f.greedy_agreement) == (4, 2, 2)
    crit = sequence_figures([_m(True), _m(True), _m(True)], ["PASS", "FAIL", "PASS"])
    assert crit.first_divergence == 1 and crit.greedy_agreement == 3  # criteria fail; tokens still agree
    clean = sequence_figures([_m(True)] * 3, ["PASS"] * 3)
    assert clean.first_divergence is None and clean.greedy_agreement == 3
    missing = sequence_figures([_m(True), None, _m(True)], ["PASS", "ERROR", "PASS"])
    assert missing.first_divergence == 1 and missing.greedy_agreement == 1 and missing.perplexity_target is None


def test_perplexity_by_hand():
    f = sequence_figures([_m(True, -1.0, -0.5), _m(True, -2.0, -0.5), _m(True, -3.0, -0.5)], ["PASS"] * 3)
    assert f.perplexity_target == pytest.approx(math.exp(2.0))
    assert f.perplexity_reference == pytest.approx(math.exp(0.5))
    assert f.perplexity_ratio == pytest.approx(math.exp(1.5))
    assert perplexity([]) is None and perplexity([-1.0, None]) is None
    assert perplexity([-1e6]) == math.inf
