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
        for k in (0, 1, 2, 4, 5, 6, 16, 17, row.size, row.size + 3):  # up to PICK_MAX by argmax passes
            got = top_k_ids(row, k)
            assert got.tolist() == _stable_top_k(row, k), (row.tolist()[:12], k)
            assert got.dtype == np.argsort(row).dtype


def test_the_lower_median_by_bracket_is_the_selections():
    """error_stats._lower_median samples a bracket from BRACKET_MIN elements on (an LLM step's logits): the
    element np.partition selects, for sorted, constant, tied, periodic and heavy-tailed data around the sizes
    where the bracket starts, and when the sample misses (then np.partition itself)."""
    from bundlerun.runner.judging.error_stats import BRACKET_MIN, _lower_median

    rng = np.random.default_rng(13)
    for n in (BRACKET_MIN - 1, BRACKET_MIN, BRACKET_MIN + 1, 32000, 32001, 128256):
        for data in (rng.standard_normal(n).astype(np.float32), np.arange(n, dtype=np.float64),
                     np.full(n, 2.5, np.float32), rng.integers(-2, 3, n).astype(np.float32),
                     np.tile(np.arange(16, dtype=np.float32), n // 16 + 1)[:n],
                     rng.standard_cauchy(n), np.concatenate([np.zeros(n // 2), np.full(n - n // 2, 1e30)])):
            assert _lower_median(data) == float(np.partition(data, (n - 1) // 2)[(n - 1) // 2]), (n, data[:5])


def test_kl_of_finite_rows_is_the_masked_sums():
    """kl_divergence's one dot product over finite log-probabilities: the masked sum it replaced (to 1e-12),
    tokens whose p underflows to 0 included; an -inf log-probability still takes the masked path."""
    from bundlerun.runner.judging.token_metrics import kl_divergence, log_softmax

    rng = np.random.default_rng(5)
    for scale in (1e-3, 1.0, 40.0, 800.0):  # 800: most of p underflows to exactly 0
        r = log_softmax(rng.standard_normal(32000) * scale)
        t = log_softmax(rng.standard_normal(32000) * scale)
        assert r is not None and t is not None
        p = np.exp(r)
        keep = p > 0
        want = max(float(np.sum(p[keep] * (r[keep] - t[keep]))), 0.0)
        assert kl_divergence(r, t) == pytest.approx(want, rel=1e-12, abs=1e-15)
    r = np.array([np.log(0.5), np.log(0.5), -np.inf])
    assert kl_divergence(r, np.log(np.array([0.25, 0.5, 0.25]))) == pytest.approx(0.5 * np.log(2))


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


def test_sequence_records_write_what_asdict_wrote():
    """SequenceRecord/StepRecord.to_json without asdict: the dict `_clean(asdict(...))` gave, key order included."""
    from dataclasses import asdict

    from bundlerun.runner.judging.numerics import _clean
    from bundlerun.runner.report.sequences import SequenceRecord, StepRecord

    def old_step(s: StepRecord) -> dict:
        out = _clean(asdict(s))
        if s.replay is None:
            del out["replay"]
        return out

    def old_sequence(q: SequenceRecord) -> dict:
        out = _clean(asdict(q))
        out["steps"] = [old_step(s) for s in q.steps]
        for key in ("prompt_text", "state", "replay"):
            if getattr(q, key) is None:
                del out[key]
        return out

    steps = [StepRecord(0, 4, "prompt", 0, 3, Verdict.PASS, 17, 17, True, float("inf"), 1.0, 0.0, 5, 1.0, 0.0, 2.5,
                        -0.1, -0.1),
             StepRecord(1, 5, "decode", 3, 1, "FAIL", 2, None, None, float("nan"), None, None, None, None, None,
                        float("-inf"), None, None, replay={"runs": 3, "distinct": 2, "spread": [0.5, float("inf")]}),
             StepRecord(2, 6, "decode", 4, 1, Verdict.ERROR, 3, np.int64(4), np.bool_(False), np.float64(41.5))]
    for seq in (SequenceRecord("s", "forward", "teacher-forced", True, "FAIL", steps, 1, 1, 2.0, float("inf"), None),
                SequenceRecord("t", "forward", "greedy", False, Verdict.PASS, steps[:2], None, 0, None, None, None,
                               prompt_text="a <b>", state="io", replay="host")):
        new = seq.to_json()
        assert new == old_sequence(seq) and list(new) == list(old_sequence(seq))
        assert [list(s) for s in new["steps"]] == [list(old_step(s)) for s in seq.steps]
        if seq.name == "t":  # numpy scalars (in "s") are no JSON for either
            assert json_text(new) == json_text(old_sequence(seq))
    replayed = steps[1].to_json()
    assert replayed["replay"] is not steps[1].replay and replayed["replay"]["spread"] == [0.5, "inf"]


def json_text(obj: object) -> str:
    import json

    return json.dumps(obj, indent=2)


def test_quiet_run_does_not_load_rich_before_the_target():
    """`run --quiet` draws no bar: rich is not imported on the way to the target (a fresh interpreter, the
    session a stand-in that returns what it was given), and the run request carries no callbacks."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from bundlerun.runner import cli\n"
        "class Session:\n"
        "    def run(self, req, bundle=None, amend=None):\n"
        "        return (req.progress, req.on_start, 'rich' in sys.modules)\n"
        "print(cli._do_run(Session(), Path('b.bpte'), Path('r'), 'qemu-user://aarch64', 30, 60, False, (), None,"
        " quiet=True))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(None, None, False)"


def test_sequence_svg_escape_is_saxutils_escape():
    from xml.sax.saxutils import escape as sax_escape

    from bundlerun.runner.writers.sequence_svg import escape

    for text in ("", "a & b", "<b>&amp;</b>", "&&<<>>", "x > y < z", "'\"\u00e9\u2603\x00", "&lt;"):
        assert escape(text) == sax_escape(text)
