"""The records of an output's error statistics (no numpy: runner/report/model.py reads them, and
the CLI must start without numpy); computed by error_stats.py."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names in order, made once per class: dataclasses.fields() makes its tuple anew
    on every call, and a report's to_json of a 192-step LLM run called it ~1,000 times (this module's
    records and runner/report/model.py's)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


@dataclass
class TensorStats:
    # Defaults only for reports read with a partial record (runner/report/kept_shape.py); computed ones set all.
    shape: list[int] = field(default_factory=list)
    numel: int | None = None
    median: float | None = None
    mean: float | None = None
    max: float | None = None
    min: float | None = None


@dataclass
class OutputStats:
    # Defaults (all None) only when read from a report that has none (suite imports): computed ones set them.
    reference_stats: TensorStats = field(default_factory=TensorStats)
    actual_stats: TensorStats = field(default_factory=TensorStats)
    error_l2_norm: float | None = None
    error_mae: float | None = None
    error_max: float | None = None
    error_msd: float | None = None
    sqnr: float | None = None  # 20*log10(||reference|| / ||actual - reference||): the SQNR every view shows
    cosine_similarity: float | None = None
    relative_frobenius: float | None = None
    psnr: float | None = None
    mismatch_count: int | None = None
    mismatch_fraction: float | None = None
    worst_index: list[int] | None = None
    worst_actual: float | None = None
    worst_expected: float | None = None
    worst_allowed: float | None = None
    nan_actual: int = 0
    inf_actual: int = 0
    nan_expected: int = 0
    inf_expected: int = 0
    nonfinite_mismatch: int = 0  # positions where NaN/Inf of actual and expected disagree
    error_max_steps: float | None = None  # quantized outputs: error_max / the output's quantization scale
    error_mae_steps: float | None = None  # quantized outputs: error_mae / the output's quantization scale
    sqnr_actual: float | None = None  # ErrorStatistics' sqnr: 20*log10(||actual|| / ||actual - reference||)

    def to_dict(self) -> dict[str, Any]:
        # what _clean(asdict(self)) gives, in one direct pass: asdict's generic deep copy was most of the
        # 0.05-0.07 s the 192 outputs of a 192-step LLM run spent here (judged, then written)
        return _plain(self)

    def json_safe(self) -> "OutputStats":
        """A copy holding non-finite floats as the report's strings "inf"/"-inf"/"nan": what a report
        record holds, so a fresh report and one read from report.json read the same."""
        d = self.to_dict()
        return OutputStats(**{**d, **{k: TensorStats(**d[k]) for k in ("reference_stats", "actual_stats")}})


def _plain(obj: Any) -> Any:
    """`_clean(asdict(obj))` for these records: dataclasses as dicts of their fields, lists and dicts
    copied, non-finite floats as strings; anything else deep-copied as asdict does."""
    kind = type(obj)  # the exact types first: one dict lookup each, no isinstance cascade
    if kind is float:
        return obj if obj - obj == 0.0 else _clean(obj)  # finite (inf - inf and nan - nan are nan)
    if obj is None or kind is int or kind is str or kind is bool:
        return obj
    if kind is OutputStats or kind is TensorStats:
        return {name: _plain(getattr(obj, name)) for name in field_names(kind)}
    if kind is list:
        return [_plain(v) for v in obj]
    if isinstance(obj, (str, int, bool)):
        return obj
    if isinstance(obj, float):
        return _clean(obj)
    if isinstance(obj, (TensorStats, OutputStats)):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return _clean(asdict_value(obj))


def asdict_value(obj: Any) -> Any:
    """What asdict makes of a field value that is not one of this module's records."""
    return asdict(_Box(obj))["value"]


@dataclass
class _Box:
    value: Any


def _clean(obj: Any) -> Any:
    """JSON-safe: inf/nan floats become strings 'inf'/'-inf'/'nan'."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj
