"""The judging thread's cost cuts give what the longer path gave (runner/judging/: issue 35's 192-step LLM run).

- top_k_ids sorts only the entries at least as large as the k-th: the same ids as the first k of a stable
  argsort, ties (the lower id first), NaN, infinities and k at or past the vocabulary included;
- vacuity.vacuous_reason decides from the element-wise bound or the argmax rule that an all-zero output
  fails, without judging it: wherever it does, judging it gives FAIL, and its answer is the full probe's;
- a step's token figures are those its token rules judged by when the step's reference token is the
  reference's argmax, and computed afresh when it is not: equal to step_metrics either way.
Pure numpy, no target.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bundlerun.bundles.manifest import Criteria
from bundlerun.runner.judging import vacuity
from bundlerun.runner.judging.judge import JudgeContext, judge_run
from bundlerun.runner.judging.numerics import judge_output
from bundlerun.runner.judging.token_metrics import step_metrics, top_k_ids
from bundlerun.targets.base import Verdict
from tests.test_sequence_report import _sequence_bundle, _target


def _stable_top_k(row: np.ndarray, k: int) -> list[int]:
    """The definition top_k_ids keeps: the first k of a stable argsort of the negated row."""
    return np.argsort(-np.asarray(row, dtype=np.float64), kind="stable")[: max(0, k)].tolist()


def test_top_k_ids_is_the_stable_sorts_prefix_ties_included():
    rng = np.random.default_rng(35)
    rows = [np.array([1.0, 2.0, 2.0, 1.0]), np.zeros(7), np.array([-0.0, 0.0, -0.0, 0.0, 1.0]),
            np.array([3.0, np.nan, 3.0, 1.0]), np.array([np.inf, 1.0, np.inf, -np.inf, 2.0])]
    for n in (1, 2, 5, 6, 64, 512):
        rows.append(rng.integers(-3, 4, n).astype(np.float32))  # many equal values: ties at the k-th
        rows.append(rng.standard_normal(n))
    for row in rows:
        for k in (0, 1, 2, 4, 5, 6, row.size, row.size + 3):
            got = top_k_ids(row, k)
            assert got.tolist() == _stable_top_k(row, k), (row.tolist()[:12], k)
            assert got.dtype == np.argsort(row).dtype


def _full_probe(reference: np.ndarray, criteria: Criteria, dtype: str, lossy: bool) -> str | None:
    """vacuous_reason with its shortcut off: every probe judged."""
    saved = vacuity._zeros_fail
    vacuity._zeros_fail = lambda *a: False
    try:
        return vacuity.vacuous_reason(reference, criteria, dtype, lossy)
    finally:
        vacuity._zeros_fail = saved


def _criteria(rng: np.random.Generator) -> Criteria:
    pick = lambda *xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    return Criteria(atol=pick(None, 0.0, 1e-3, 0.05, 0.5, 3.0, 1e30), rtol=pick(None, 0.0, 1e-3, 0.5, 1.0, 5.0),
                    qtol=pick(None, 0.0, 1.0), scale=pick(None, 0.02), sqnr_min_db=pick(None, 0.0, 20.0),
                    cosine_min=pick(None, 0.9), argmax_match=pick(False, True), kl_max=pick(None, 1e-3, 1e9),
                    top_k_overlap_min=pick(None, 0.8))


def test_the_all_zero_shortcut_answers_as_the_full_probe():
    rng = np.random.default_rng(7)
    decided = 0
    for trial in range(600):
        shape = [(4,), (1, 16), (2, 8), (1, 512)][trial % 4]
        scale = [1e-4, 0.01, 0.05, 1.0, 100.0][int(rng.integers(5))]
        ref = (rng.standard_normal(shape) * scale).astype(np.float32)
        if trial % 5 == 0:  # the argmax at token 0: zeros agree with it
            ref.reshape(-1, ref.shape[-1])[-1, 0] = np.abs(ref).max() + 1
        if trial % 7 == 0:  # values right at an element-wise bound: |r| (1 - rtol) == atol
            ref.reshape(-1)[0] = np.float32(0.05 / (1 - 1e-3))
        if trial % 11 == 0:
            ref = rng.integers(-3, 4, shape).astype(np.int64)
        dtype = "int64" if ref.dtype == np.int64 else "float32"
        criteria, lossy = _criteria(rng), bool(trial % 3 == 0)
        as_float = ref.astype(np.float64)
        if vacuity._zeros_fail(as_float, criteria, dtype, lossy):
            decided += 1
            probe = judge_output(np.zeros_like(ref), ref, criteria, actual_dtype=dtype, expected_dtype=dtype, lossy=lossy)
            assert probe.verdict == Verdict.FAIL, (criteria, ref)
        assert vacuity.vacuous_reason(ref, criteria, dtype, lossy) == _full_probe(ref, criteria, dtype, lossy)
    assert 100 < decided < 600  # both ways taken: decided without a probe, and probed


def test_the_llm_steps_criteria_are_decided_without_a_probe(monkeypatch):
    """The 192-step bundle's criteria (atol 0.05, rtol 1e-3, argmax_match, kl_max, top-5 overlap) on logits:
    no all-zero output is judged."""
    criteria = Criteria(atol=0.05, rtol=1e-3, argmax_match=True, kl_max=1e-3, top_k_overlap_min=0.8)
    calls = []
    monkeypatch.setattr(vacuity, "judge_output", lambda *a, **k: calls.append(a) or judge_output(*a, **k))
    ref = np.random.default_rng(1).standard_normal((1, 512)).astype(np.float32)
    assert vacuity.vacuous_reason(ref, criteria, "float32") is None and calls == []
    loose = Criteria(atol=1e30)  # a vacuous one is still found, by the probe
    assert vacuity.vacuous_reason(ref, loose, "float32") is not None and len(calls) == 1


def test_a_steps_token_figures_equal_step_metrics():
    bundle, manifest, logits = _sequence_bundle(seed=3)
    wrong = (manifest.sequences[0].steps[1].reference_next + 1) % logits[1].shape[-1]
    manifest.sequences[0].steps[1].reference_next = wrong  # judged by a token that is not the argmax
    ctx = JudgeContext(manifest)
    run = _target(logits)
    judge_run(bundle, run, ctx)
    tokens = {(s.method, st.case): st.reference_next for s in manifest.sequences for st in s.steps}
    for result in run.cases:
        actual = result.outputs[0].to_array()
        ref = logits[result.case_index]
        stats = judge_output(actual, ref, manifest.output_spec("forward", 0).criteria, "float32", "float32").stats
        want = step_metrics(actual, ref, tokens[("forward", result.case_index)], stats=stats)
        assert dataclasses.asdict(ctx.step_metrics[("forward", result.case_index)]) == dataclasses.asdict(want)
    assert ctx.step_metrics[("forward", 1)].reference_token == wrong


@pytest.mark.parametrize("cast", [False, True])
def test_judge_output_hands_its_token_figures_only_for_the_output_as_given(cast):
    ref = np.array([[0.5, 2.0, -1.0, 0.25]], np.float32)
    actual = (ref + 1e-3).astype(np.float16 if cast else np.float32)
    crit = Criteria(atol=0.01, argmax_match=True, cast_float=cast)
    v = judge_output(actual, ref, crit, "float16" if cast else "float32", "float32")
    if cast:
        assert v.step is None  # judged on float32 copies: the step's own figures are computed from the output
    else:
        assert dataclasses.asdict(v.step) == dataclasses.asdict(step_metrics(actual, ref, stats=v.stats))
    assert judge_output(actual, ref, Criteria(atol=0.01), "float32", "float32").step is None
