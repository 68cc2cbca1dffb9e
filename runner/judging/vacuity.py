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
from bundlerun.runner.judging.numerics import judge_output

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
    probe = judge_output(np.zeros_like(ref), ref, criteria, actual_dtype=expected_dtype,
                         expected_dtype=expected_dtype, lossy=lossy)
    if probe.verdict != Verdict.PASS:
        return None
    return (f"{_shown(criteria)} would also pass an all-zero output (expected values up to "
            f"{float(np.max(np.abs(finite))):.4g}): the criteria cannot tell a working program from a broken one")
