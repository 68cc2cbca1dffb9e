"""Criteria and their numbers as people read them: HTML, Markdown, JUnit and the console.

One formatter for every view, so a quantization scale prints `scale=0.001906`, never
`scale=0.001906464691273868`. The JSON report keeps every number at full precision; this is
display only.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

from bundlerun.bundles.manifest import Criteria
from bundlerun.runner.judging.failed_criterion import FailedCriterion

# bundlerun's own choice: 4 significant digits tell any two limits a bundle sets apart
# (tolerances are powers of ten or a scale times a small integer) and stay short in a table cell.
SIGNIFICANT_DIGITS = 4

# Criteria that are floors (the measured value must be at least the limit); every other is a ceiling.
FLOORS = ("sqnr_min_db", "cosine_min", "top_k_overlap_min")


def number(value: Any, against: Any = None) -> str:
    """A criterion's number for people: floats to 4 significant digits, everything else as is.
    More digits only where 4 would mislead: a fraction rounded onto a whole number (a cosine floor
    0.99999 is not `1`), or a measured value printed the same as the limit it is compared with
    (`against`: 59.99995 < 60 must not read `60 < 60`)."""
    if not isinstance(value, float):
        return "–" if value is None else str(value)
    other = against if isinstance(against, float) and against != value else None
    for digits in range(SIGNIFICANT_DIGITS, 16):
        text = f"{value:.{digits}g}"
        if not math.isfinite(value) or value.is_integer():
            return text
        shown = float(text)
        if not shown.is_integer() and (other is None or text != f"{other:.{digits}g}"):
            return text
    return repr(value)


def criteria_items(criteria: Criteria | Mapping[str, Any] | None, keys: Iterable[str] | None = None) -> list[str]:
    """`name=value` for every criterion that is set (in `keys` when given; not None, False or 0),
    numbers shortened."""
    crit = criteria.to_dict() if isinstance(criteria, Criteria) else dict(criteria or {})
    wanted = list(keys) if keys is not None else list(crit)
    return [f"{k}={number(crit[k])}" for k in wanted if k in crit and k != "trail" and crit[k] not in (None, False)]


def is_floor(criterion: Any) -> bool:
    name = str(criterion or "")
    return name in FLOORS or name.endswith("_min") or name.endswith("_min_db")


def failed_text(failed: FailedCriterion, escape: Callable[[Any], str] = str) -> str:
    """`sqnr_min_db 45.35 < 48` for floors, `elementwise 0.2 > 0.002` for ceilings; `escape` makes
    the name and numbers safe for the view (they come from a report file)."""
    op = "<" if is_floor(failed.criterion) else ">"
    measured, limit = failed.measured, failed.limit
    return (f"{escape(failed.criterion)} {escape(number(measured, limit))} {op} "
            f"{escape(number(limit, measured))}")


def short_name(criterion: Any) -> str:
    """The criterion's name without its unit and direction: `sqnr_min_db` -> `sqnr`, for a HUD cell."""
    name = str(criterion or "?")
    for tail in ("_min_db", "_min", "_max"):
        if name.endswith(tail):
            return name[: -len(tail)]
    return name
