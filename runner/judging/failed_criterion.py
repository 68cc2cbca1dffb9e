"""The record of one criterion an output failed: what was measured against which limit.

Its own module so that the statistics (numerics.py) and the backends' rules (rules.py), which both
produce it, import it from below instead of from each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class FailedCriterion:
    # Defaults only for report entries read with some fields absent (docs/report-schema.md: both optional).
    criterion: str = ""
    measured: Any = None
    limit: Any = None
    detail: str = ""
