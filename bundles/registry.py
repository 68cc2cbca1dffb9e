"""The tolerance registry: data (TOML) -> resolved Criteria with a trail per number.

Built-in numbers live in `bundles/data/tolerances.toml` (DESIGN §5); a project's
`[tolerances]` section (bundlerun.toml / pyproject `[tool.bundlerun]`) is merged
over them as a second *layer*. Resolution walks the chain from the least to the
most specific level and lets every matching entry set (or unset) criteria, so a
criterion's trail lists every entry that set it, in order, **winning entry last**:

    global default < backend default < backend + dtype tier (else global tier)
    < backend + variant + dtype tier < op rule < model + target override
    < adjustments (host arch, input distribution) < explicit override

Within one level the built-in layer comes first and the project layer after it,
so the project wins. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import os
import platform
try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - 3.10 needs the tomli backport
    import tomli as tomllib  # type: ignore[no-redef]
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.manifest import Criteria

SCHEMA = "bundlerun.tolerances/1"
BUILTIN_PATH = Path(__file__).with_name("data") / "tolerances.toml"
ENV_PATH = "BUNDLERUN_TOLERANCES"  # replaces the built-in data file (tests, experiments)

CRITERIA = ("atol", "rtol", "qtol", "sqnr_min_db", "cosine_min", "rel_frobenius_max")
CEILINGS = frozenset({"atol", "rtol", "qtol", "rel_frobenius_max"})  # looser = larger
FLOORS = frozenset({"sqnr_min_db", "cosine_min"})  # looser = smaller
BASE_DTYPES = ("fp32", "fp16", "bf16", "int8", "int16")
QUANTIZED_DTYPES = ("int8", "int16")
TIERS = BASE_DTYPES + tuple(f"{d}.vs-float" for d in QUANTIZED_DTYPES)
REFERENCES = ("eager-fp32", "quantized")
INTEGER_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})

LEVELS = (
    "global default",
    "backend default",
    "backend + dtype tier",
    "backend + variant + dtype tier",
    "op rule",
    "model + target override",
    "adjustment",
    "explicit override",
)

# --------------------------------------------------------------------------- schema

_ENTRY_KEYS = set(CRITERIA) | {"exact", "unset", "mode", "note"}
_TOP_KEYS = {"schema", "global", "backends", "op_rules", "model_overrides", "adjustments", "override"}
_GLOBAL_KEYS = {"default", "tiers"}
_BACKEND_KEYS = {"default", "tiers", "variants", "note", "firmware", "integer_outputs_exact", "default_variant"}
_VARIANT_KEYS = {"targets", "default", "tiers", "note"}
_OP_RULE_KEYS = _ENTRY_KEYS | {"name", "backends", "variants", "dtypes", "ops", "quantization", "rule", "eps"}
_MODEL_KEYS = _ENTRY_KEYS | {"models", "backend", "variants", "dtypes", "methods", "outputs"}
_ADJUST_KEYS = {"name", "backends", "variants", "dtypes", "host_arch", "distributions", "atol_scale", "rtol_scale", "note"}
_OVERRIDE_KEYS = _ENTRY_KEYS | {"methods", "outputs"}
_RULES = ("fp16-eps",)


def _fail(where: str, message: str) -> None:
    raise ConfigError(f"{where}: {message}")


def suggest(word: str, choices: Any) -> str:
    """' (did you mean 'x'?)' for a typo or an abbreviation, else ''."""
    names = [str(c) for c in choices]
    close = difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    if not close and len(str(word)) >= 3:
        close = [n for n in names if n.startswith(str(word))][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


_suggest = suggest


def _check_keys(where: str, table: Any, allowed: set[str]) -> None:
    if not isinstance(table, dict):
        _fail(where, f"expected a table, got {type(table).__name__}")
    for key in table:
        if key not in allowed:
            _fail(where, f"unknown key {key!r}{_suggest(key, sorted(allowed))}; allowed: {', '.join(sorted(allowed))}")


def check_number(where: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(where, f"{key} must be a number, got {value!r}")
    if not math.isfinite(value):
        _fail(where, f"{key} must be finite, got {value!r}")
    if value < 0:
        _fail(where, f"{key} must not be negative, got {value!r}")
    if key == "cosine_min" and value > 1:
        _fail(where, f"cosine_min must be at most 1, got {value!r}")


def _check_list(where: str, key: str, value: Any, choices: Any = None) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(where, f"{key} must be a list of strings, got {value!r}")
    if choices is not None:
        for v in value:
            if v != "*" and v not in choices:
                _fail(where, f"unknown {key[:-1] if key.endswith('s') else key} {v!r} in {key}{_suggest(v, choices)}")


def _check_entry(where: str, entry: dict, allowed: set[str]) -> None:
    _check_keys(where, entry, allowed)
    for key in CRITERIA:
        if key in entry:
            check_number(where, key, entry[key])
    if "exact" in entry and not isinstance(entry["exact"], bool):
        _fail(where, f"exact must be true or false, got {entry['exact']!r}")
    if "unset" in entry:
        _check_list(where, "unset", entry["unset"], CRITERIA)
    if "mode" in entry and entry["mode"] not in ("set", "loosen"):
        _fail(where, f"mode must be 'set' or 'loosen', got {entry['mode']!r}{_suggest(entry['mode'], ['set', 'loosen'])}")
    if "note" in entry and not isinstance(entry["note"], str):
        _fail(where, "note must be a string")


def _check_tiers(where: str, tiers: Any) -> None:
    if not isinstance(tiers, dict):
        _fail(where, "expected a table of dtype tiers")
    for tier, entry in tiers.items():
        if tier not in TIERS:
            _fail(where, f"unknown dtype tier {tier!r}{_suggest(tier, TIERS)}; known: {', '.join(TIERS)}")
        _check_entry(f"{where}.{_q(tier)}", entry, _ENTRY_KEYS)


def _q(key: str) -> str:
    return f'"{key}"' if "." in key else key


def validate(data: dict, file: str, known_backends: set[str] | None = None, known_variants: dict[str, set[str]] | None = None) -> None:
    """Raise ConfigError (one line, with a close-match suggestion) on any problem.

    `known_backends` restricts backend names (a project layer may only tune the
    backends bundlerun knows); None accepts the names the data itself declares.
    """
    _check_keys(file, data, _TOP_KEYS)
    if "schema" in data and data["schema"] != SCHEMA:
        _fail(file, f"unsupported schema {data['schema']!r}; expected {SCHEMA!r}")
    backends_data = data.get("backends", {})
    if not isinstance(backends_data, dict):
        _fail(f"{file}: backends", "expected a table")
    backends = set(known_backends) if known_backends is not None else set(backends_data)
    variants = {b: set(v) for b, v in (known_variants or {}).items()}
    for name, b in backends_data.items():
        variants.setdefault(name, set()).update((b or {}).get("variants", {}) if isinstance(b, dict) else ())

    g = data.get("global", {})
    _check_keys(f"{file}: global", g, _GLOBAL_KEYS)
    if "default" in g:
        _check_entry(f"{file}: global.default", g["default"], _ENTRY_KEYS)
    if "tiers" in g:
        _check_tiers(f"{file}: global.tiers", g["tiers"])

    for name, b in backends_data.items():
        where = f"{file}: backends.{name}"
        if name not in backends:
            _fail(where, f"unknown backend {name!r}{_suggest(name, backends)}; known: {', '.join(sorted(backends))}")
        _check_keys(where, b, _BACKEND_KEYS)
        if "default" in b:
            _check_entry(f"{where}.default", b["default"], _ENTRY_KEYS)
        if "tiers" in b:
            _check_tiers(f"{where}.tiers", b["tiers"])
        if "firmware" in b:
            _check_keys(f"{where}.firmware", b["firmware"], {"atol", "rtol"})
            for k, v in b["firmware"].items():
                check_number(f"{where}.firmware", k, v)
        if "integer_outputs_exact" in b and not isinstance(b["integer_outputs_exact"], bool):
            _fail(where, "integer_outputs_exact must be true or false")
        if "default_variant" in b and b["default_variant"] not in variants.get(name, set()):
            dv = b["default_variant"]
            _fail(where, f"default_variant {dv!r} is not a declared variant{_suggest(dv, variants.get(name, ()))}")
        for vname, v in b.get("variants", {}).items():
            vwhere = f"{where}.variants.{vname}"
            _check_keys(vwhere, v, _VARIANT_KEYS)
            if "targets" in v:
                _check_list(vwhere, "targets", v["targets"])
            if "default" in v:
                _check_entry(f"{vwhere}.default", v["default"], _ENTRY_KEYS)
            if "tiers" in v:
                _check_tiers(f"{vwhere}.tiers", v["tiers"])

    all_variants = set().union(*variants.values()) if variants else set()
    for i, rule in enumerate(_list_of_tables(file, data, "op_rules")):
        where = f"{file}: op_rules[{i}]" + (f" ({rule['name']})" if isinstance(rule, dict) and "name" in rule else "")
        _check_entry(where, rule, _OP_RULE_KEYS)
        if "ops" not in rule:
            _fail(where, "an op rule needs ops = [...] (aten base names, or '*')")
        _check_list(where, "ops", rule["ops"])
        _check_list(where, "backends", rule.get("backends", ["*"]), backends)
        _check_list(where, "dtypes", rule.get("dtypes", ["*"]), TIERS)
        _check_list(where, "variants", rule.get("variants", ["*"]), all_variants)
        if "quantization" in rule and not isinstance(rule["quantization"], str):
            _fail(where, "quantization must be a string (matched as a substring)")
        if "rule" in rule:
            if rule["rule"] not in _RULES:
                _fail(where, f"unknown rule {rule['rule']!r}{_suggest(rule['rule'], _RULES)}; known: {', '.join(_RULES)}")
            if "eps" not in rule:
                _fail(where, "rule 'fp16-eps' needs eps")
        if "eps" in rule:
            check_number(where, "eps", rule["eps"])

    for i, mo in enumerate(_list_of_tables(file, data, "model_overrides")):
        where = f"{file}: model_overrides[{i}]"
        _check_entry(where, mo, _MODEL_KEYS)
        if "models" not in mo:
            _fail(where, "a model override needs models = [...]")
        _check_list(where, "models", mo["models"])
        if "backend" in mo and mo["backend"] != "*" and mo["backend"] not in backends:
            _fail(where, f"unknown backend {mo['backend']!r}{_suggest(mo['backend'], backends)}")
        _check_list(where, "variants", mo.get("variants", ["*"]), variants.get(mo.get("backend"), all_variants))
        _check_list(where, "dtypes", mo.get("dtypes", ["*"]), TIERS)
        _check_list(where, "methods", mo.get("methods", ["*"]))
        _check_list(where, "outputs", mo.get("outputs", ["*"]))

    for i, adj in enumerate(_list_of_tables(file, data, "adjustments")):
        where = f"{file}: adjustments[{i}]"
        _check_keys(where, adj, _ADJUST_KEYS)
        _check_list(where, "backends", adj.get("backends", ["*"]), backends)
        _check_list(where, "variants", adj.get("variants", ["*"]), all_variants)
        _check_list(where, "dtypes", adj.get("dtypes", ["*"]), TIERS)
        _check_list(where, "host_arch", adj.get("host_arch", ["*"]))
        _check_list(where, "distributions", adj.get("distributions", ["*"]))
        for k in ("atol_scale", "rtol_scale"):
            if k in adj:
                check_number(where, k, adj[k])
        if not any(k in adj for k in ("atol_scale", "rtol_scale")):
            _fail(where, "an adjustment needs atol_scale and/or rtol_scale")

    if "override" in data:
        _check_entry(f"{file}: override", data["override"], _OVERRIDE_KEYS)
        _check_list(f"{file}: override", "methods", data["override"].get("methods", ["*"]))
        _check_list(f"{file}: override", "outputs", data["override"].get("outputs", ["*"]))


def _list_of_tables(file: str, data: dict, key: str) -> list[dict]:
    value = data.get(key, [])
    if not isinstance(value, list):
        _fail(f"{file}: {key}", f"expected an array of tables ([[{key}]])")
    return value


# --------------------------------------------------------------------------- helpers


def tier_for(dtype: str, reference: str = "eager-fp32") -> str:
    """Dtype tier key: a quantized build judged against eager fp32 is `int8.vs-float`."""
    if dtype in QUANTIZED_DTYPES and reference != "quantized":
        return f"{dtype}.vs-float"
    return dtype


def normalize_op(name: str) -> str:
    """`aten.convolution.default`, `aten::conv2d`, `torch.ops.aten.gelu.default` -> base name."""
    text = str(name).replace("::", ".")
    if "__ops_aten_" in text:  # edge dialect repr: executorch_exir_dialects_edge__ops_aten_gelu_default
        text = text.split("__ops_aten_", 1)[1].rsplit("_", 1)[0]
    parts = [p for p in text.split(".") if p]
    while parts and parts[0] in ("torch", "ops", "aten", "edge", "quantized_decomposed"):
        parts = parts[1:]
    return parts[0] if parts else text


def normalize_model(name: str | None) -> str:
    return (name or "").strip().lower().replace("-", "_")


def _match(value: str | None, allowed: list[str] | None) -> bool:
    if allowed is None or "*" in allowed:
        return True
    return value is not None and value in allowed


def _looser(key: str, new: float, old: float) -> bool:
    return new > old if key in CEILINGS else new < old


def _output_matches(selectors: list[str] | None, name: str, index: int) -> bool:
    if selectors is None or "*" in selectors:
        return True
    return any(s in (name, f"out{index}", str(index)) for s in selectors)


# --------------------------------------------------------------------------- records


@dataclass
class Step:
    """One registry entry that matched during resolution (what `explain` prints)."""

    level: str
    source: str  # e.g. "backends.xnnpack.tiers.int8"
    file: str | None
    values: dict[str, Any]  # what the entry asks for (None = unset)
    applied: dict[str, Any] = field(default_factory=dict)  # what it actually changed
    skipped: dict[str, str] = field(default_factory=dict)  # criterion -> why not applied


@dataclass
class Resolution:
    criteria: Criteria
    steps: list[Step]
    tier: str
    variant: str | None
    host_arch: str


@dataclass
class Layer:
    file: str
    data: dict
    label: str  # "built-in" | "project"


# --------------------------------------------------------------------------- registry


class Registry:
    """Ordered layers of tolerance data (built-in first, project overlays after)."""

    def __init__(self, layers: list[Layer]):
        self.layers = layers

    # -- loading -------------------------------------------------------------

    @classmethod
    def builtin(cls, path: str | Path | None = None) -> "Registry":
        """The built-in data (or `path`, or $BUNDLERUN_TOLERANCES when set)."""
        path = Path(path or os.environ.get(ENV_PATH) or BUILTIN_PATH)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read tolerance registry {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        validate(data, str(path))
        return cls([Layer(str(path), data, "built-in")])

    def with_overlay(self, data: dict, file: str, label: str = "project") -> "Registry":
        """A new registry with `data` (a project's [tolerances] section) merged over this one."""
        self.validate_overlay(data, file)
        return Registry(self.layers + [Layer(file, data, label)])

    def validate_overlay(self, data: dict, file: str) -> None:
        validate(data, file, known_backends=set(self.backends()), known_variants={b: set(self.variants(b)) for b in self.backends()})

    # -- queries -------------------------------------------------------------

    def backends(self) -> list[str]:
        names: list[str] = []
        for layer in self.layers:
            for name in layer.data.get("backends", {}):
                if name not in names:
                    names.append(name)
        return names

    def _backend_tables(self, backend: str) -> list[tuple[Layer, dict]]:
        return [(l, l.data["backends"][backend]) for l in self.layers if backend in l.data.get("backends", {})]

    def variants(self, backend: str) -> list[str]:
        names: list[str] = []
        for _, b in self._backend_tables(backend):
            for v in b.get("variants", {}):
                if v not in names:
                    names.append(v)
        return names

    def backend_setting(self, backend: str, key: str, default: Any = None) -> Any:
        value = default
        for _, b in self._backend_tables(backend):
            if key in b:
                value = b[key]
        return value

    def firmware_tolerances(self, backend: str) -> dict[str, float]:
        """Compile-time ET_ATOL/ET_RTOL the backend's device firmware is usually built with."""
        return dict(self.backend_setting(backend, "firmware", {}) or {})

    def variant_for(self, backend: str, target: str | None) -> str | None:
        """Target variant from a variant name or a target URL (fnmatch on `targets`)."""
        target = (target or "").strip()
        known = self.variants(backend)
        if target in known:
            return target
        low = target.lower()
        for _, b in self._backend_tables(backend):
            for name, v in b.get("variants", {}).items():
                if any(fnmatch.fnmatch(low, p.lower()) for p in v.get("targets", [])):
                    return name
        return self.backend_setting(backend, "default_variant")

    # -- resolution ----------------------------------------------------------

    def resolve(self, ctx: Any, overrides: dict[str, Any] | None = None) -> Resolution:
        """Criteria for one output (ToleranceContext) with every step recorded."""
        if ctx.backend not in self.backends():
            raise ConfigError(f"unknown backend {ctx.backend!r}{_suggest(ctx.backend, self.backends())}; known: {', '.join(self.backends())}")
        if ctx.dtype not in BASE_DTYPES:
            raise ConfigError(f"unknown dtype {ctx.dtype!r}{_suggest(ctx.dtype, BASE_DTYPES)}; known: {', '.join(BASE_DTYPES)}")
        if ctx.reference not in REFERENCES:
            raise ConfigError(f"unknown reference {ctx.reference!r}{_suggest(ctx.reference, REFERENCES)}; known: {', '.join(REFERENCES)}")
        tier = tier_for(ctx.dtype, ctx.reference)
        variant = getattr(ctx, "variant", None) or self.variant_for(ctx.backend, ctx.target)
        if variant is not None and variant not in self.variants(ctx.backend):
            raise ConfigError(f"unknown {ctx.backend} variant {variant!r}{_suggest(variant, self.variants(ctx.backend))}")
        host_arch = (ctx.host_arch or platform.machine()).lower()
        r = _Resolver(self, ctx, tier, variant, host_arch)
        return r.run(overrides or {})


class _Resolver:
    """One resolution: applies entries level by level and keeps the trail."""

    def __init__(self, reg: Registry, ctx: Any, tier: str, variant: str | None, host_arch: str):
        self.reg, self.ctx, self.tier, self.variant, self.host_arch = reg, ctx, tier, variant, host_arch
        self.values: dict[str, float | None] = {k: None for k in CRITERIA}
        self.trail: dict[str, list[dict[str, Any]]] = {}
        self.steps: list[Step] = []
        self.exact = False

    # -- primitives ----------------------------------------------------------

    def _record(self, key: str, value: Any, source: str, file: str | None) -> None:
        self.trail.setdefault(key, []).append({"value": value, "source": source, "file": file})

    def apply(self, level: str, path: str, file: str | None, entry: dict, label: str | None = None) -> Step:
        source = f"{level}: {label or path}"
        mode = entry.get("mode", "set")
        values = {k: entry[k] for k in CRITERIA if k in entry}
        for k in entry.get("unset", []):
            values[k] = None
        if "exact" in entry:
            values["exact"] = entry["exact"]
        step = Step(level, path, file, values)
        for key in entry.get("unset", []):
            step.applied[key] = None
            if key == "exact":
                self.exact = False
            else:
                self.values[key] = None
            self._record(key, None, f"{source} (unset)", file)
        for key in CRITERIA:
            if key not in entry:
                continue
            new, old = float(entry[key]), self.values[key]
            if mode == "loosen" and old is None:
                step.skipped[key] = "already unconstrained"
                continue
            if mode == "loosen" and not _looser(key, new, old):
                step.skipped[key] = f"not looser than {old:g}"
                continue
            self.values[key] = new
            step.applied[key] = new
            self._record(key, new, source + (" (loosen)" if mode == "loosen" else ""), file)
        if "exact" in entry:
            self.exact = bool(entry["exact"])
            step.applied["exact"] = self.exact
            self._record("exact", self.exact, source, file)
        self.steps.append(step)
        return step

    # -- levels --------------------------------------------------------------

    def run(self, overrides: dict[str, Any]) -> Resolution:
        ctx = self.ctx
        criteria = Criteria(scale=ctx.scale, zero_point=ctx.zero_point)
        if ctx.output_dtype == "bool":
            criteria.exact = True
            criteria.trail = {"exact": [{"value": True, "source": "bool outputs are exact", "file": None}]}
            return Resolution(criteria, [], self.tier, self.variant, self.host_arch)

        b = ctx.backend
        for layer in self.reg.layers:
            g = layer.data.get("global", {})
            if "default" in g:
                self.apply("global default", "global.default", layer.file, g["default"])
        for layer, bt in self.reg._backend_tables(b):
            if "default" in bt:
                self.apply("backend default", f"backends.{b}.default", layer.file, bt["default"])
        tier_tables = [(l, bt["tiers"][self.tier]) for l, bt in self.reg._backend_tables(b) if self.tier in bt.get("tiers", {})]
        if tier_tables:
            for layer in self.reg.layers:  # shown by `explain`: a backend's tier entry replaces the global one
                entry = layer.data.get("global", {}).get("tiers", {}).get(self.tier)
                if entry is not None:
                    values = {k: entry[k] for k in CRITERIA if k in entry} | {k: None for k in entry.get("unset", [])}
                    self.steps.append(Step("backend + dtype tier", f"global.tiers.{_q(self.tier)}", layer.file, values,
                                           skipped={k: f"replaced by backends.{b}.tiers.{_q(self.tier)}" for k in values}))
            for layer, entry in tier_tables:
                self.apply("backend + dtype tier", f"backends.{b}.tiers.{_q(self.tier)}", layer.file, entry)
        else:
            for layer in self.reg.layers:
                entry = layer.data.get("global", {}).get("tiers", {}).get(self.tier)
                if entry is not None:
                    self.apply("backend + dtype tier", f"global.tiers.{_q(self.tier)}", layer.file, entry,
                               label=f"global.tiers.{_q(self.tier)} ({b} has no {self.tier} entry)")
        if self.variant:
            for layer, bt in self.reg._backend_tables(b):
                v = bt.get("variants", {}).get(self.variant, {})
                if "default" in v:
                    self.apply("backend + variant + dtype tier", f"backends.{b}.variants.{self.variant}.default", layer.file, v["default"])
                if self.tier in v.get("tiers", {}):
                    self.apply("backend + variant + dtype tier", f"backends.{b}.variants.{self.variant}.tiers.{_q(self.tier)}",
                               layer.file, v["tiers"][self.tier])
        self._op_rules()
        self._model_overrides()
        self._adjustments()
        self._explicit(overrides)
        return self._finish(criteria)

    def _op_rules(self) -> None:
        ctx = self.ctx
        ops = {normalize_op(o) for o in (ctx.ops or [])}
        quant = (getattr(ctx, "quantization", None) or "").lower()
        for layer in self.reg.layers:
            for i, rule in enumerate(layer.data.get("op_rules", [])):
                if not (_match(ctx.backend, rule.get("backends")) and _match(self.tier, rule.get("dtypes"))
                        and _match(self.variant, rule.get("variants"))):
                    continue
                wanted = set(rule["ops"])
                if "*" not in wanted and not (ops & wanted):
                    continue
                if "quantization" in rule and rule["quantization"].lower() not in quant:
                    continue
                name = rule.get("name", f"op_rules[{i}]")
                entry = dict(rule)
                if rule.get("rule") == "fp16-eps":
                    entry.update(self._fp16_eps(rule["eps"]))
                self.apply("op rule", f"op_rules[{i}] {name}", layer.file, entry)

    def _fp16_eps(self, eps: float) -> dict[str, float]:
        """XNNPACK fp16 rule: allowed = max(2*eps, |ref|*6*eps); atol = max of that; rtol = 6*eps."""
        import numpy as np

        peak = 0.0
        expected = self.ctx.expected
        if expected is not None:
            arr = np.asarray(expected)
            if self.ctx.output_dtype == "bfloat16" and arr.dtype == np.uint16:
                arr = (arr.astype(np.uint32) << 16).view(np.float32)
            arr = np.abs(arr.astype(np.float64, copy=False))
            arr = arr[np.isfinite(arr)]
            if arr.size:
                peak = float(arr.max())
        return {"atol": max(2 * eps, peak * 6 * eps), "rtol": 6 * eps}

    def _model_overrides(self) -> None:
        ctx = self.ctx
        model = normalize_model(ctx.model)
        if not model:
            return
        for layer in self.reg.layers:
            for i, mo in enumerate(layer.data.get("model_overrides", [])):
                if model not in {normalize_model(m) for m in mo["models"]}:
                    continue
                if mo.get("backend", "*") not in ("*", ctx.backend):
                    continue
                if not (_match(self.variant, mo.get("variants")) and _match(self.tier, mo.get("dtypes"))
                        and _match(ctx.method, mo.get("methods"))
                        and _output_matches(mo.get("outputs"), ctx.output_name, ctx.output_index)):
                    continue
                label = f"model_overrides[{i}] {mo['models'][0]} on {mo.get('backend', '*')}"
                if mo.get("variants"):
                    label += "/" + ",".join(mo["variants"])
                self.apply("model + target override", label, layer.file, mo)

    def _adjustments(self) -> None:
        ctx = self.ctx
        dist = str(ctx.input_distribution or "").split("(")[0]
        for layer in self.reg.layers:
            for i, adj in enumerate(layer.data.get("adjustments", [])):
                if not (_match(ctx.backend, adj.get("backends")) and _match(self.variant, adj.get("variants"))
                        and _match(self.tier, adj.get("dtypes")) and _match(self.host_arch, adj.get("host_arch"))
                        and _match(dist, adj.get("distributions"))):
                    continue
                name = adj.get("name", f"adjustments[{i}]")
                step = Step("adjustment", f"adjustments[{i}] {name}", layer.file, {})
                for key, scale_key in (("atol", "atol_scale"), ("rtol", "rtol_scale")):
                    if scale_key not in adj:
                        continue
                    step.values[key] = f"x{adj[scale_key]:g}"
                    if self.values[key] is None:
                        step.skipped[key] = "not set"
                        continue
                    new = self.values[key] * float(adj[scale_key])
                    self.values[key] = new
                    step.applied[key] = new
                    self._record(key, new, f"adjustment: {name} ({key} x{adj[scale_key]:g})", layer.file)
                self.steps.append(step)

    def _explicit(self, overrides: dict[str, Any]) -> None:
        ctx = self.ctx
        for layer in self.reg.layers:
            ov = layer.data.get("override")
            if ov and _match(ctx.method, ov.get("methods")) and _output_matches(ov.get("outputs"), ctx.output_name, ctx.output_index):
                self.apply("explicit override", "override", layer.file, ov, label=f"override ({layer.label} config)")
        entry = explicit_entry(overrides, ctx.method, ctx.output_name, ctx.output_index)
        if entry:
            self.apply("explicit override", "override (CLI)", None, entry, label="override (CLI)")

    def _finish(self, criteria: Criteria) -> Resolution:
        ctx = self.ctx
        for key in CRITERIA:
            setattr(criteria, key, self.values[key])
        criteria.exact = self.exact
        is_int = ctx.output_dtype in INTEGER_DTYPES
        if is_int:
            # Integer outputs are judged in their own units: qtol counts integer steps.
            criteria.scale = 1.0
            self._record("scale", 1.0, f"integer output ({ctx.output_dtype}): qtol counts integer steps"
                         + (f"; graph scale {ctx.scale:g}" if ctx.scale is not None else ""), None)
            if self.reg.backend_setting(ctx.backend, "integer_outputs_exact", False) and not self.exact:
                criteria.exact = True
                layer = [l for l, b in self.reg._backend_tables(ctx.backend) if "integer_outputs_exact" in b][-1]
                self._record("exact", True, f"backend default: backends.{ctx.backend}.integer_outputs_exact", layer.file)
        elif ctx.scale is not None:
            self._record("scale", ctx.scale, "output quantization parameters from the lowered graph", None)
        elif criteria.qtol:
            # A float output without a quantization scale has no step to count.
            criteria.qtol = None
            self._record("qtol", None, "no quantization scale for this float output: qtol not applicable", None)
        if ctx.zero_point is not None:
            self._record("zero_point", ctx.zero_point, "output quantization parameters from the lowered graph", None)
        criteria.trail = self.trail
        return Resolution(criteria, self.steps, self.tier, self.variant, self.host_arch)


def explicit_entry(overrides: dict[str, Any] | None, method: str, output_name: str, output_index: int) -> dict[str, Any]:
    """Criteria from an explicit override dict that apply to one output.

    Keys are a criterion (`atol`) or a selector path (`out0.atol`, `forward.out1.qtol`,
    `*.sqnr_min_db`); values None unset the criterion. Unknown criteria raise ConfigError.
    """
    entry: dict[str, Any] = {}
    unset: list[str] = []
    for raw_key, value in (overrides or {}).items():
        parts = str(raw_key).split(".")
        key = parts[-1]
        sel = parts[:-1]
        if key not in CRITERIA and key != "exact":
            raise ConfigError(f"unknown criterion {key!r} in override {raw_key!r}{_suggest(key, CRITERIA + ('exact',))}")
        if len(sel) > 2:
            raise ConfigError(f"override {raw_key!r}: expected [method.]output.criterion")
        sel_method = sel[0] if len(sel) == 2 else "*"
        sel_output = sel[-1] if sel else "*"
        if sel_method not in ("*", method) or not _output_matches([sel_output], output_name, output_index):
            continue
        if value is None:
            unset.append(key)
        elif key == "exact":
            if not isinstance(value, bool):
                raise ConfigError(f"override {raw_key!r}: exact must be true or false, got {value!r}")
            entry[key] = value
        else:
            check_number(f"override {raw_key!r}", key, value)
            entry[key] = value
    if unset:
        entry["unset"] = unset
    return entry


# --------------------------------------------------------------------------- defaults

_CACHE: dict[tuple, Registry] = {}


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return -1.0


def project_registry(project: dict | None) -> Registry:
    """Built-in data + the [tolerances] of an already-loaded project config (the run session's),
    so one command resolves with one config file."""
    base = Registry.builtin(Path(os.environ.get(ENV_PATH) or BUILTIN_PATH))
    section = (project or {}).get("tolerances")
    return base.with_overlay(section, str((project or {}).get("_file", "project config"))) if section else base


def default_registry(project: bool = True) -> Registry:
    """Built-in data (honouring $BUNDLERUN_TOLERANCES) + the project's [tolerances], if any."""
    base_path = Path(os.environ.get(ENV_PATH) or BUILTIN_PATH)
    key: tuple = (str(base_path), _mtime(base_path))
    overlay: tuple[dict, str] | None = None
    if project:
        from bundlerun.bundles.project_config import find_config_files, load_project_config

        files = find_config_files()
        key += tuple((str(f), _mtime(f)) for f in files)
        if files:
            cfg = load_project_config(validate_tolerances=False)
            section = cfg.get("tolerances")
            if section:
                overlay = (section, str(cfg.get("_file", files[0])))
    if key not in _CACHE:
        reg = Registry.builtin(base_path)
        if overlay:
            reg = reg.with_overlay(*overlay)
        _CACHE.clear()
        _CACHE[key] = reg
    return _CACHE[key]
