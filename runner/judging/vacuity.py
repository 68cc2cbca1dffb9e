"""Criteria that cannot fail are no check: such an output is an ERROR, never a PASS.

The manifest schema refuses NaN, infinite, negative and all-null criteria, and a bound that
overflows to infinity (`qtol * scale`, `atol + qtol * scale`). A finite criterion can still be so
loose that it checks nothing: `atol = 1e30`, `rtol = 5`, `sqnr_min_db = 0`, a
`rel_frobenius_max` of 1 or more, or a bound that overflows on this case's values. The rule
(bundlerun's own, chosen because it is exact and needs no magic number): **an output's criteria
are vacuous for a case when an all-zero output would pass every one of them** while the expected
output is not all zeros. An all-zero output is what a broken program (an unwritten buffer, a
runtime that ran nothing) returns, and it carries no information about the reference; a check
that accepts it cannot tell a working program from a broken one.

It is decided per case by the judge itself (`judge_output` on zeros), so every criterion and rule
the judge knows is taken into account. Only a verdict that would have been PASS changes: a FAIL
stays a FAIL (the output is wrong even by the loose criteria). The output becomes ERROR with the
failed criterion `vacuous`, the case error `bad-bundle`, and a report warning, so every format
(console, JSON, JUnit, Markdown, HTML, GitHub annotations) shows it and the exit code is 2.
An exact, boolean or top-1 criterion is never vacuous: it cannot be loosened by a number.
"""

from __future__ import annotations

import numpy as np

from bundlerun.bundles.manifest import CRITERIA_FIELDS, Criteria
from bundlerun.bundles.manifest_schema import RULE_NUMBERS
from bundlerun.targets.base import Verdict
from bundlerun.runner.judging.numerics import elementwise_bound, judge_output
from bundlerun.runner.judging.token_metrics import _last_row

CRITERION = "vacuous"


def _shown(criteria: Criteria) -> str:
    parts = [f"{k} {getattr(criteria, k):g}" for k in (*CRITERIA_FIELDS, *RULE_NUMBERS)
             if isinstance(getattr(criteria, k, None), (int, float)) and not isinstance(getattr(criteria, k), bool)]
    if criteria.qtol and criteria.scale is not None:
        parts.append(f"scale {criteria.scale:g}")
    return ", ".join(parts) or "its criteria"


def vacuous_reason(reference: np.ndarray, criteria: Criteria, expected_dtype: str, lossy: bool = False) -> str | None:
    """Why `criteria` would also pass an all-zero output for this reference, or None."""

    if criteria.exact or getattr(criteria, "top1", False) or expected_dtype == "bool":
        return None
    ref = np.asarray(reference)
    if ref.size == 0:
        return None
    try:
        as_float = ref.astype(np.float64)
    except (TypeError, ValueError):
        return None
    finite = as_float[np.isfinite(as_float)]
    if finite.size == 0 or not np.any(finite != 0):
        return None  # the reference is all zeros (or not finite): zeros are the right answer
    if finite.size == as_float.size and _zeros_fail(as_float, criteria, expected_dtype, lossy):
        return None
    probe = judge_output(np.zeros_like(ref), ref, criteria, actual_dtype=expected_dtype,
                         expected_dtype=expected_dtype, lossy=lossy)
    if probe.verdict != Verdict.PASS:
        return None
    return (f"{_shown(criteria)} would also pass an all-zero output (expected values up to "
            f"{float(np.max(np.abs(finite))):.4g}): the criteria cannot tell a working program from a broken one")


def _zeros_fail(as_float: np.ndarray, criteria: Criteria, expected_dtype: str, lossy: bool) -> bool:
    """True when the all-zero probe is sure to FAIL, decided without judging it: the element-wise bound
    or the argmax rule alone fails it, computed as judge_output computes them for a finite reference
    (`as_float`: the reference in float64, every value finite). False: the probe must be judged.

    Why: a served LLM run judged the probe for every step (a full judge_output with its statistics
    and token figures: a third of the judging thread's CPU, 61 of 182 ms over 192 steps at load 2);
    a correct step's criteria are rarely loose enough to pass zeros, and one of these two rules
    already says so. Exact, not a heuristic: where either is True the probe's verdict is FAIL."""
    if criteria.elementwise:
        # error_stats._stream with actual = 0.0: e = 0 - r, |e| = |r|, excess = |r| * -rtol + |e| (or |e|),
        # a mismatch is excess > atol; any mismatch fails the output (numerics.judge_output)
        atol, rtol, _ = elementwise_bound(criteria, expected_dtype, lossy)
        ae = np.abs(as_float)
        big = float(ae.max())
        # past 2**20 elements a sum that overflows sends error_statistics to its other formula: not decided here
        if as_float.size <= (1 << 20) or (big < 1e150 and big * big * as_float.size < 1e300):
            excess = np.abs(as_float) * -rtol + ae if rtol else ae
            if bool(np.any(excess > atol)):
                return True
    if criteria.argmax_match:
        # token_metrics.token_checks with no reference token: the zeros' argmax is token 0, the
        # reference's is the argmax of its last row (finite here); they differ -> argmax_match fails
        return int(np.argmax(_last_row(as_float))) != 0
    return False
