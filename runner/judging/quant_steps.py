"""Errors of quantized outputs in quantization steps, as the report views print them.

runner/judging/numerics.py `quantization_steps` puts `error_max_steps` / `error_mae_steps` (the error over the
output's quantization scale) into a quantized output's stats; these helpers add them next to the
absolute value: `0.0123 (1.6 steps)`. Outputs without a scale print as before."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the record type only: report views import this without the statistics' numpy
    from bundlerun.runner.judging.stats_records import OutputStats


def steps(stats: OutputStats | None, key: str) -> float | None:
    """`error_max` -> stats.error_max_steps (None when the output has no quantization step)."""
    value = getattr(stats, f"{key}_steps", None)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def suffix(stats: OutputStats | None, key: str, word: str = "steps") -> str:
    """` (1.6 steps)` for a quantized output's `key` (error_max / error_mae), else ``."""
    value = steps(stats, key)
    return "" if value is None else f" ({value:.3g} {word})"
