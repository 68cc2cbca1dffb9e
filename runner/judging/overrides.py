"""`--override` for `run` and `judge`: re-judge with criteria the user states.

Syntax: `[method.]output.criterion=value` (or `criterion=value` for every output):
`out0.atol=0.05`, `forward.out1.qtol=2`, `*.sqnr_min_db=25`, `out0.rtol=none` (unset),
`out2.exact=true`. `output` is an output name, `outN` or the index; `*` matches all.
Each applied value is appended to the criterion's trail with source
"override (CLI)", so the report shows both the embedded number and the override.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.manifest import CRITERIA_FIELDS, Criteria, Manifest

SOURCE = "override (CLI)"
KEYS = tuple(CRITERIA_FIELDS) + ("exact", "top_k")
_NONE = ("none", "null", "off", "unset")


@dataclass
class Override:
    text: str
    method: str  # "*" or a method name
    output: str  # "*", an output name, "outN" or "N"
    key: str
    value: float | bool | int | None  # None unsets the criterion

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def matches(self, method: str, name: str, index: int) -> bool:
        return self.method in ("*", method) and self.output in ("*", name, f"out{index}", str(index))


def parse_override(text: str) -> Override:
    """One `--override` string -> Override; a one-line ConfigError when malformed."""
    from bundlerun.bundles.registry import check_number, suggest  # start-up: loads tomli on use

    lhs, sep, rhs = str(text).partition("=")
    lhs, rhs = lhs.strip(), rhs.strip()
    if not sep or not lhs or not rhs:
        raise ConfigError(f"override {text!r}: expected [method.]output.criterion=value, e.g. out0.atol=0.05")
    parts = lhs.split(".")
    if len(parts) > 3 or not all(parts):
        raise ConfigError(f"override {text!r}: expected [method.]output.criterion=value")
    key = parts[-1]
    if key not in KEYS:
        hint = suggest(key, KEYS)
        raise ConfigError(f"override {text!r}: unknown criterion {key!r}{hint}; known: {', '.join(KEYS)}")
    method = parts[0] if len(parts) == 3 else "*"
    output = parts[-2] if len(parts) >= 2 else "*"
    value: float | bool | int | None
    if rhs.lower() in _NONE:
        value = None
    elif key == "top_k":
        from bundlerun.bundles.registry import top_k_value  # start-up: loads tomli on use

        value = top_k_value(rhs, f"override {text!r}")
    elif key == "exact":
        if rhs.lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"override {text!r}: exact takes true or false, got {rhs!r}")
        value = rhs.lower() in ("true", "1")
    else:
        try:
            value = float(rhs)
        except ValueError:
            raise ConfigError(f"override {text!r}: {key} must be a number (or 'none'), got {rhs!r}") from None
        check_number(f"override {text!r}", key, value)
    return Override(str(text), method, output, key, value)


def parse_overrides(texts: list[str] | tuple[str, ...] | None) -> list[Override]:
    return [parse_override(t) for t in (texts or [])]


def set_criterion(criteria: Criteria, ov: Override) -> None:
    """Apply one override to one Criteria, recording it in the trail (winning entry last)."""
    if ov.key == "exact":
        criteria.exact = bool(ov.value)
    else:
        setattr(criteria, ov.key, ov.value)
    criteria.trail.setdefault(ov.key, []).append({"value": ov.value, "source": SOURCE, "file": None})


def apply_to_manifest(manifest: Manifest, overrides: list[Override]) -> list[dict[str, Any]]:
    """Apply overrides in order to the manifest's criteria (in place).

    Returns the report's `overrides` records. An override matching no output is
    an error: a typo must not silently leave the verdict unchanged.
    """
    outputs = [(m.name, i, o) for m in manifest.methods.values() for i, o in enumerate(m.outputs)]
    for ov in overrides:
        hit = [o for (mname, i, o) in outputs if ov.matches(mname, o.name, i)]
        if not hit:
            known = ", ".join(f"{m}.{o.name}" for m, _, o in outputs) or "none"
            raise ConfigError(f"override {ov.text!r} matches no output; outputs: {known}")
        for spec in hit:
            set_criterion(spec.criteria, ov)
    return [ov.to_dict() for ov in overrides]


def apply_overrides(ctx: Any, bundle: Any, overrides: list[str] | list[Override]) -> list[dict[str, Any]]:
    """Apply `--override` strings (or parsed Overrides) to a runner.judging.judge.JudgeContext.

    With a manifest the embedded criteria are changed (trail records the override);
    without one, per-output criteria start from the judge's fallback default.
    Returns the report's `overrides` records.
    """
    parsed = [o if isinstance(o, Override) else parse_override(o) for o in (overrides or [])]
    if not parsed:
        return []
    if ctx.manifest is not None:
        return apply_to_manifest(ctx.manifest, parsed)
    from bundlerun.runner.judging.judge import default_criteria  # start-up: loads flatbuffers, numpy on use

    slots = []
    for suite in bundle.method_test_suites:
        count = len(suite.test_cases[0].expected_outputs) if suite.test_cases else 0
        slots += [(suite.method_name, j) for j in range(count)]
    for ov in parsed:
        hit = [s for s in slots if ov.matches(s[0], f"out{s[1]}", s[1])]
        if not hit:
            known = ", ".join(f"{m}.out{j}" for m, j in slots) or "none"
            raise ConfigError(f"override {ov.text!r} matches no output; outputs: {known}")
        for slot in hit:
            criteria = ctx.criteria_override.setdefault(slot, default_criteria())
            set_criterion(criteria, ov)
    return [ov.to_dict() for ov in parsed]


def as_build_overrides(overrides: list[Override]) -> dict[str, Any]:
    """The `overrides` dict `resolve_criteria` takes (selector keys), for `build --override`."""
    out: dict[str, Any] = {}
    for ov in overrides:
        sel = [] if ov.output == "*" and ov.method == "*" else ([ov.method] if ov.method != "*" else []) + [ov.output]
        out[".".join(sel + [ov.key])] = ov.value
    return out
