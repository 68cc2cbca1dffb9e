"""The tolerance registry: data (TOML) -> resolved Criteria with a trail per number.

Built-in numbers live in `bundles/data/tolerances.toml` (global entries, the shared
harness, the cross-backend suite) and `bundles/data/tolerances.<backend>.toml` (one per
backend); every number cites the ExecuTorch line it comes from (bundles/registry_schema.py)
or says it is bundlerun's own. A project's `[tolerances]` section (bundlerun.toml /
pyproject `[tool.bundlerun]`) is merged over them as a further *layer*. Resolution walks
the chain from the least to the most specific level and lets every matching entry set (or
unset) criteria, so a criterion's trail lists every entry that set it, in order, **winning
entry last**:

    global default < backend default < backend + dtype tier (else global tier)
    < backend + variant + dtype tier < op rule < model + target override
    < adjustments (host arch, input distribution) < explicit override

Within one level the built-in layers come first and the project layer after it, so the
project wins. One rule keeps bundlerun honest: a value of bundlerun's own never replaces an
ExecuTorch value stated for the same backend and dtype tier, op or model (`_protected`).
Nothing here imports torch. (Over 500 lines: loading, the entry walk the audit shares, and the
resolver's levels, which share one resolution state; the schema lives in registry_schema.py.)
"""

from __future__ import annotations

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
from bundlerun.bundles.registry_schema import (  # noqa: F401  (re-exported: the registry's public names)
    BASE_DTYPES, BUNDLERUN, CEILINGS, CRITERIA, FLOORS, INTEGER_DTYPES, NUMERIC, QUANTIZED_DTYPES, REFERENCES,
    RULES, SCHEMA, TIERS, check_number, entry_values, is_bundlerun, origin_text, origins_of, parse_citation,
    parse_merged,
    quote as _q, suggest, validate,
)
from bundlerun.bundles.manifest_schema import RULE_INTEGERS

BUILTIN_DIR = Path(__file__).with_name("data")
BUILTIN_PATH = BUILTIN_DIR / "tolerances.toml"  # the global file; per-backend files sit beside it
ENV_PATH = "BUNDLERUN_TOLERANCES"  # a data file or folder replacing the built-in data (tests, experiments)

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

_suggest = suggest


def data_files(path: str | Path) -> list[Path]:
    """The data files of a registry location: a file alone, or a folder's tolerances.toml
    followed by its tolerances.<backend>.toml files (sorted)."""
    path = Path(path)
    if path.is_dir():
        main = path / "tolerances.toml"
        files = ([main] if main.is_file() else []) + sorted(path.glob("tolerances.*.toml"))
        if not files:
            raise ConfigError(f"{path}: no tolerances.toml or tolerances.<backend>.toml in this folder")
        return files
    return [path]


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


def _model_matches(model: str, pattern: str) -> bool:
    """A model override's `models` entry: a name, or a pattern with `*` (`llm:*`: every LLM bundle)."""
    wanted = normalize_model(pattern)
    return fnmatch.fnmatchcase(model, wanted) if "*" in wanted else model == wanted


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
    origins: dict[str, str] = field(default_factory=dict)  # criterion -> "executorch@...:path:lines" | "bundlerun: why"
    note: str | None = None
    merged: list[str] = field(default_factory=list)  # tighter values other tests of the same key state


@dataclass
class Resolution:
    criteria: Criteria
    steps: list[Step]
    tier: str
    variant: str | None
    host_arch: str
    commit: str | None = None  # the ExecuTorch commit the built-in citations refer to


@dataclass
class Layer:
    file: str
    data: dict
    label: str  # "built-in" | "project"


_QDQ = ("quantize", "dequantize", "choose_qparams")


def _model_ops(ops: list[str] | None) -> set[str]:
    """The ops that make a model what it is: quantize/dequantize nodes are the scheme, not the model."""
    return {normalize_op(o) for o in (ops or []) if not any(q in str(o) for q in _QDQ)}


# --------------------------------------------------------------------------- registry


# How a trail names a data file shipped with bundlerun: by its place in the package.
BUILTIN_NAME = "bundlerun/bundles/data/"

# An integer output without quantization parameters (an argmax, an index, a count) is judged
# exactly unless a user's config or the CLI declares a tolerance for it (these keys, or exact).
_INTEGER_TOLERANCE_KEYS = frozenset({"atol", "rtol", "qtol", "exact"})
INTEGER_EXACT_ORIGIN = (
    "bundlerun: integer outputs are judged exactly. ExecuTorch's Tester compares a bool output with torch.equal "
    "and every other output with torch.allclose(atol=1e-3, rtol=1e-3) (backends/test/harness/tester.py:440-459), "
    "which for class ids below 999 means exact; the float tiers' SQNR and cosine floors would pass a wrong id")


def _shown(file: Path) -> str:
    """A data file shipped with bundlerun as `bundlerun/bundles/data/NAME`, the same in every checkout and
    install (a bundle's criteria trail, and with it the build cache's key, must not depend on where
    bundlerun lives); any other file as given."""
    try:
        return BUILTIN_NAME + file.resolve().relative_to(BUILTIN_DIR.resolve()).as_posix()
    except ValueError:
        return str(file)


class Registry:
    """Ordered layers of tolerance data (built-in files first, project overlays after)."""

    def __init__(self, layers: list[Layer]):
        self.layers = layers

    # -- loading -------------------------------------------------------------

    @classmethod
    def builtin(cls, path: str | Path | None = None) -> "Registry":
        """The built-in data (or `path`: a data file or folder, or $BUNDLERUN_TOLERANCES when set)."""
        path = Path(path or os.environ.get(ENV_PATH) or BUILTIN_DIR)
        layers = []
        for file in data_files(path):
            try:
                with open(file, "rb") as fh:
                    data = tomllib.load(fh)
            except OSError as exc:
                raise ConfigError(f"cannot read tolerance registry {file}: {exc.strerror}") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{file}: invalid TOML: {exc}") from None
            layers.append(Layer(_shown(Path(file)), data, "built-in"))
        reg = cls(layers)
        backends = set(reg.backends())
        variants = {b: set(reg.variants(b)) for b in backends}
        for layer in layers:
            validate(layer.data, layer.file, backends, variants, require_origin=path.is_dir())
        return reg

    def with_overlay(self, data: dict, file: str, label: str = "project") -> "Registry":
        """A new registry with `data` (a project's [tolerances] section) merged over this one."""
        self.validate_overlay(data, file)
        return Registry(self.layers + [Layer(file, data, label)])

    def validate_overlay(self, data: dict, file: str) -> None:
        validate(data, file, known_backends=set(self.backends()), known_variants={b: set(self.variants(b)) for b in self.backends()})

    # -- queries -------------------------------------------------------------

    @property
    def commit(self) -> str | None:
        """The ExecuTorch commit the built-in citations refer to ([source] executorch = ...)."""
        for layer in self.layers:
            commit = layer.data.get("source", {}).get("executorch")
            if commit:
                return commit
        return None

    def backends(self) -> list[str]:
        names: list[str] = []
        for layer in self.layers:
            for name in layer.data.get("backends", {}):
                if name not in names:
                    names.append(name)
        return names

    def _backend_tables(self, backend: str) -> list[tuple[Layer, dict]]:
        return [(l, l.data["backends"][backend]) for l in self.layers if backend in l.data.get("backends", {})]

    def _global_variants(self, backend: str) -> list[tuple[Layer, str, dict]]:
        """Variants declared once for several backends ([global.variants.suite]: the cross-backend suite)."""
        out = []
        for layer in self.layers:
            for name, v in layer.data.get("global", {}).get("variants", {}).items():
                if _match(backend, v.get("backends")):
                    out.append((layer, name, v))
        return out

    def variants(self, backend: str) -> list[str]:
        names: list[str] = []
        for _, b in self._backend_tables(backend):
            for v in b.get("variants", {}):
                if v not in names:
                    names.append(v)
        for _, name, _v in self._global_variants(backend):
            if name not in names:
                names.append(name)
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
        for _, name, v in self._global_variants(backend):
            if any(fnmatch.fnmatch(low, p.lower()) for p in v.get("targets", [])):
                return name
        return self.backend_setting(backend, "default_variant")

    def citations(self) -> list[tuple[str, str]]:
        """(citation, where) of every origin in the built-in layers (for `tolerance audit`)."""
        out: list[tuple[str, str]] = []
        for layer in self.layers:
            if layer.label != "built-in":
                continue
            for where, entry in iter_entries(layer.data):
                for key, cites in origins_of(entry).items():
                    out.extend((c, f"{layer.file}: {where}.{key}") for c in cites if c != BUNDLERUN)
                for m in entry.get("merged", []):
                    cite, key, _ = parse_merged(m)
                    out.append((cite, f"{layer.file}: {where}.merged.{key}"))
        return out

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


def iter_entries(data: dict):
    """(where, entry) of every entry of one data file that can state values."""
    g = data.get("global", {})
    if "default" in g:
        yield "global.default", g["default"]
    for tier, e in g.get("tiers", {}).items():
        yield f"global.tiers.{_q(tier)}", e
    for vname, v in g.get("variants", {}).items():
        if "default" in v:
            yield f"global.variants.{vname}.default", v["default"]
        for tier, e in v.get("tiers", {}).items():
            yield f"global.variants.{vname}.tiers.{_q(tier)}", e
    for name, b in data.get("backends", {}).items():
        if "origin" in b:
            yield f"backends.{name}", {k: b[k] for k in ("origin", "reason") if k in b} | dict(b.get("firmware", {}))
        if "default" in b:
            yield f"backends.{name}.default", b["default"]
        for tier, e in b.get("tiers", {}).items():
            yield f"backends.{name}.tiers.{_q(tier)}", e
        for vname, v in b.get("variants", {}).items():
            if "default" in v:
                yield f"backends.{name}.variants.{vname}.default", v["default"]
            for tier, e in v.get("tiers", {}).items():
                yield f"backends.{name}.variants.{vname}.tiers.{_q(tier)}", e
    for i, e in enumerate(data.get("op_rules", [])):
        yield f"op_rules[{i}] {e.get('name', '')}".rstrip(), e
    for i, e in enumerate(data.get("model_overrides", [])):
        yield f"model_overrides[{i}] {(e.get('models') or [''])[0]}".rstrip(), e
    for i, e in enumerate(data.get("adjustments", [])):
        yield f"adjustments[{i}] {e.get('name', '')}".rstrip(), e


class _Resolver:
    """One resolution: applies entries level by level and keeps the trail."""

    def __init__(self, reg: Registry, ctx: Any, tier: str, variant: str | None, host_arch: str):
        self.reg, self.ctx, self.tier, self.variant, self.host_arch = reg, ctx, tier, variant, host_arch
        self.values: dict[str, Any] = {k: None for k in NUMERIC}
        self.rules: dict[str, Any] = {k: Criteria.__dataclass_fields__[k].default for k in RULES}
        self.trail: dict[str, list[dict[str, Any]]] = {}
        self.steps: list[Step] = []
        self.exact = False
        self.user_asked: set[str] = set()  # elementwise criteria a user's config or the CLI set for this output
        self.commit = reg.commit
        # criterion -> (origin kind, protected, trail source) of the value that currently wins
        self.winner: dict[str, tuple[str, bool, str]] = {}

    # -- primitives ----------------------------------------------------------

    def _record(self, key: str, value: Any, source: str, file: str | None, origin: str | None = None) -> None:
        item: dict[str, Any] = {"value": value, "source": source, "file": file}
        if origin:
            item["origin"] = origin
        self.trail.setdefault(key, []).append(item)

    def _kind(self, layer_label: str, entry: dict, key: str) -> str:
        if layer_label != "built-in":
            return "user"
        return "bundlerun" if is_bundlerun(entry, key) else "executorch"

    def apply(self, level: str, path: str, layer: Layer | None, entry: dict, label: str | None = None,
              protected: bool = False, combine: set[str] | None = None, note: str | None = None) -> Step:
        """Apply one entry. `protected`: its ExecuTorch values may not be replaced by bundlerun's own.
        `combine`: criteria an earlier op rule of this resolution set (several ops: the loosest applies)."""
        file = layer.file if layer else None
        source = f"{level}: {label or path}"
        mode = entry.get("mode", "set")
        values = entry_values(entry)
        values.pop("eps", None)
        step = Step(level, path, file, values, note=note or entry.get("note"), merged=list(entry.get("merged", [])))
        layer_label = layer.label if layer else "cli"
        for key in values:
            origin = origin_text(entry, key if key in origins_of(entry) else "eps", self.commit) if layer_label == "built-in" else None
            if origin:
                step.origins[key] = origin
        for key in [*entry.get("unset", []), *[k for k in NUMERIC if k in entry], *[k for k in RULES if k in entry],
                    *(["exact"] if "exact" in entry else [])]:
            unset = key in entry.get("unset", []) and key not in entry
            new = None if unset else entry[key]
            kind = self._kind(layer_label, entry, key)
            win = self.winner.get(key)
            if kind == "bundlerun" and win and win[0] == "executorch" and win[1]:
                step.skipped[key] = f"ExecuTorch's value ({win[2]}) stands: bundlerun's own never replaces it"
                continue
            if key in NUMERIC and not unset:
                new = float(new)
                old = self.values[key]
                loosen = mode == "loosen" or (combine is not None and key in combine)
                if loosen and old is None:
                    step.skipped[key] = "already unconstrained" + (" by an earlier op rule" if mode != "loosen" else "")
                    continue
                if loosen and not _looser(key, new, old):
                    step.skipped[key] = f"not looser than {old:g}" + (" (several ops: the loosest applies)"
                                                                      if mode != "loosen" else "")
                    continue
                self.values[key] = new
            elif key in NUMERIC:
                self.values[key] = None
            elif key in RULES:
                self.rules[key] = Criteria.__dataclass_fields__[key].default if unset else new
            elif key == "exact":
                self.exact = False if unset else bool(new)
            step.applied[key] = self.values.get(key) if key in NUMERIC else (
                self.rules[key] if key in RULES else self.exact)
            if combine is not None:
                combine.add(key)
            if kind == "user" and key in _INTEGER_TOLERANCE_KEYS:
                self.user_asked.add(key)
            suffix = " (unset)" if unset else (" (loosen)" if mode == "loosen" else "")
            self._record(key, step.applied[key], source + suffix, file, step.origins.get(key))
            self.winner[key] = (kind, protected, step.origins.get(key) or source)
        self.steps.append(step)
        return step

    # -- levels --------------------------------------------------------------

    def run(self, overrides: dict[str, Any]) -> Resolution:
        ctx = self.ctx
        criteria = Criteria(scale=ctx.scale, zero_point=ctx.zero_point)
        if ctx.output_dtype == "bool":
            criteria.exact = True
            criteria.trail = {"exact": [{"value": True, "source": "bool outputs are exact", "file": None}]}
            return Resolution(criteria, [], self.tier, self.variant, self.host_arch, self.commit)

        b = ctx.backend
        for layer in self.reg.layers:
            g = layer.data.get("global", {})
            if "default" in g:
                self.apply("global default", "global.default", layer, g["default"])
        for layer, bt in self.reg._backend_tables(b):
            if "default" in bt:
                self.apply("backend default", f"backends.{b}.default", layer, bt["default"])
        tier_tables = [(l, bt["tiers"][self.tier]) for l, bt in self.reg._backend_tables(b) if self.tier in bt.get("tiers", {})]
        if tier_tables:
            for layer in self.reg.layers:  # shown by `explain`: a backend's tier entry replaces the global one
                entry = layer.data.get("global", {}).get("tiers", {}).get(self.tier)
                if entry is not None:
                    values = entry_values(entry)
                    self.steps.append(Step("backend + dtype tier", f"global.tiers.{_q(self.tier)}", layer.file, values,
                                           skipped={k: f"replaced by backends.{b}.tiers.{_q(self.tier)}" for k in values}))
            for layer, entry in tier_tables:
                self.apply("backend + dtype tier", f"backends.{b}.tiers.{_q(self.tier)}", layer, entry, protected=True)
        else:
            for layer in self.reg.layers:
                entry = layer.data.get("global", {}).get("tiers", {}).get(self.tier)
                if entry is not None:
                    self.apply("backend + dtype tier", f"global.tiers.{_q(self.tier)}", layer, entry,
                               label=f"global.tiers.{_q(self.tier)} ({b} has no {self.tier} entry)")
        if self.variant:
            tables = [(l, f"backends.{b}.variants.{self.variant}", bt["variants"][self.variant])
                      for l, bt in self.reg._backend_tables(b) if self.variant in bt.get("variants", {})]
            if not tables:
                tables = [(l, f"global.variants.{name}", v) for l, name, v in self.reg._global_variants(b)
                          if name == self.variant]
            for layer, where, v in tables:
                if "default" in v:
                    self.apply("backend + variant + dtype tier", f"{where}.default", layer, v["default"], protected=True)
                if self.tier in v.get("tiers", {}):
                    self.apply("backend + variant + dtype tier", f"{where}.tiers.{_q(self.tier)}", layer,
                               v["tiers"][self.tier], protected=True)
        self._op_rules()
        self._model_overrides()
        self._adjustments()
        self._explicit(overrides)
        return self._finish(criteria)

    def _op_rules(self) -> None:
        """Matching op rules: those that set values first (several ops: for each criterion the
        loosest of them), then the loosen-only ones, each group in file order."""
        ctx = self.ctx
        ops = {normalize_op(o) for o in (ctx.ops or [])}
        model_ops = _model_ops(ctx.ops)
        quant = (getattr(ctx, "quantization", None) or "").lower()
        matched: list[tuple[Layer, int, dict]] = []
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
                matched.append((layer, i, rule))
        combine: set[str] = set()
        for loosen_group in (False, True):
            for layer, i, rule in matched:
                if (rule.get("mode") == "loosen") != loosen_group:
                    continue
                name = rule.get("name", f"op_rules[{i}]")
                entry = dict(rule)
                if rule.get("rule") == "fp16-eps":
                    entry.update(self._fp16_eps(rule["eps"]))
                wanted = set(rule["ops"])
                exact = "*" not in wanted and bool(model_ops) and model_ops <= wanted
                note = None if exact or "*" in wanted else (
                    f"the model has other ops too ({', '.join(sorted(model_ops - wanted)[:6])}): "
                    "ExecuTorch tests this op alone")
                self.apply("op rule", f"op_rules[{i}] {name}", layer, entry, protected=exact,
                           combine=None if loosen_group else combine, note=note)

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
                if not any(_model_matches(model, m) for m in mo["models"]):
                    continue
                if mo.get("backend", "*") not in ("*", ctx.backend):
                    continue
                quant = (getattr(ctx, "quantization", None) or "").lower()
                if "quantization" in mo and mo["quantization"].lower() not in quant:
                    continue
                when = mo.get("when") or {}
                if not (_match(self.variant, mo.get("variants")) and _match(self.tier, mo.get("dtypes"))
                        and _match(ctx.method, mo.get("methods"))
                        and _output_matches(mo.get("outputs"), ctx.output_name, ctx.output_index)
                        and _match(self.host_arch, when.get("host_arch"))
                        and self.host_arch not in when.get("not_host_arch", ())):
                    continue
                label = f"model_overrides[{i}] {mo['models'][0]} on {mo.get('backend', '*')}"
                if mo.get("variants"):
                    label += "/" + ",".join(mo["variants"])
                if when:
                    label += " when " + ", ".join(f"{k.removeprefix('not_')} {'not in' if k.startswith('not_') else 'in'} "
                                                  f"{'|'.join(v)}" for k, v in sorted(when.items()))
                self.apply("model + target override", label, layer, mo, protected=True)

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
                    origin = origin_text(adj, scale_key, self.commit) if layer.label == "built-in" else None
                    if origin:
                        step.origins[key] = origin
                    if self.values[key] is None:
                        step.skipped[key] = "not set"
                        continue
                    new = self.values[key] * float(adj[scale_key])
                    self.values[key] = new
                    step.applied[key] = new
                    self._record(key, new, f"adjustment: {name} ({key} x{adj[scale_key]:g})", layer.file, origin)
                self.steps.append(step)

    def _integer_exact(self, criteria: Criteria, dtype: str) -> None:
        """An integer output that carries no quantization parameters holds class ids, indices or
        counts: every element must be equal, and the float criteria a dtype tier set for the
        model's float outputs (SQNR, cosine, Frobenius, MSE, atol/rtol/qtol) are dropped, since
        they would pass a wrong class id that happens to be close to the right one."""
        dropped = [k for k in NUMERIC if getattr(criteria, k) is not None]
        for key in dropped:
            setattr(criteria, key, None)
            self._record(key, None, f"integer output ({dtype}) judged exactly: {key} does not apply",
                         None, INTEGER_EXACT_ORIGIN)
        criteria.exact = True
        self._record("exact", True, f"integer output ({dtype}) without quantization parameters: "
                     "every element must be equal (class ids, indices, counts)", None, INTEGER_EXACT_ORIGIN)
        self.steps.append(Step("integer output", "exact", None, {"exact": True},
                               applied={"exact": True, **{k: None for k in dropped}},
                               origins={"exact": INTEGER_EXACT_ORIGIN},
                               note="a declared tolerance for it (an override of atol/rtol/qtol or exact = false "
                                    "for this output) is kept instead"))

    def _explicit(self, overrides: dict[str, Any]) -> None:
        ctx = self.ctx
        for layer in self.reg.layers:
            ov = layer.data.get("override")
            if ov and _match(ctx.method, ov.get("methods")) and _output_matches(ov.get("outputs"), ctx.output_name, ctx.output_index):
                self.apply("explicit override", "override", layer, ov, label=f"override ({layer.label} config)")
        entry = explicit_entry(overrides, ctx.method, ctx.output_name, ctx.output_index)
        if entry:
            self.apply("explicit override", "override (CLI)", None, entry, label="override (CLI)")

    def _finish(self, criteria: Criteria) -> Resolution:
        ctx = self.ctx
        for key in NUMERIC:
            setattr(criteria, key, self.values[key])
        for key in RULES:
            setattr(criteria, key, self.rules[key])
        criteria.exact = self.exact
        is_int = ctx.output_dtype in INTEGER_DTYPES
        if ctx.reference_dtype in INTEGER_DTYPES and not is_int and not self.exact and not self.user_asked:
            # The model returns integers (class ids) that the lowered program returns as floats
            # (e.g. an add on an argmax that the quantizer annotated): the values must still be equal.
            self._integer_exact(criteria, ctx.reference_dtype)
        elif is_int:
            # Integer outputs are judged in their own units: qtol counts integer steps.
            criteria.scale = 1.0
            self._record("scale", 1.0, f"integer output ({ctx.output_dtype}): qtol counts integer steps"
                         + (f"; graph scale {ctx.scale:g}" if ctx.scale is not None else ""), None)
            if self.reg.backend_setting(ctx.backend, "integer_outputs_exact", False) and not self.exact:
                criteria.exact = True
                layer, table = [(l, b) for l, b in self.reg._backend_tables(ctx.backend) if "integer_outputs_exact" in b][-1]
                origin = origin_text(table | {"integer_outputs_exact": True}, "integer_outputs_exact", self.commit) \
                    if isinstance(table.get("origin"), str) else None
                self._record("exact", True, f"backend default: backends.{ctx.backend}.integer_outputs_exact",
                             layer.file, origin)
            elif ctx.scale is None and not self.exact and not self.user_asked:
                self._integer_exact(criteria, ctx.output_dtype)
        elif ctx.scale is not None:
            self._record("scale", ctx.scale, "output quantization parameters from the lowered graph", None)
        elif criteria.qtol:
            # A float output without a quantization scale has no step to count.
            criteria.qtol = None
            self._record("qtol", None, "no quantization scale for this float output: qtol not applicable", None)
        if ctx.zero_point is not None:
            self._record("zero_point", ctx.zero_point, "output quantization parameters from the lowered graph", None)
        criteria.trail = self.trail
        return Resolution(criteria, self.steps, self.tier, self.variant, self.host_arch, self.commit)


def top_k_value(value: Any, what: str) -> int:
    """top_k as given (a CLI string or a number): a whole number >= 1, else one ConfigError line."""

    lo, hi = RULE_INTEGERS["top_k"]
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{what}: top_k must be a whole number, got {value[:40]!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or not lo <= value <= hi:
        raise ConfigError(f"{what}: top_k must be a whole number from {lo} to {hi}, got {value!r}")
    return int(value)


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
        if key not in CRITERIA and key not in ("exact", "top_k"):
            raise ConfigError(f"unknown criterion {key!r} in override {raw_key!r}"
                              f"{_suggest(key, CRITERIA + ('exact', 'top_k'))}")
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
        elif key == "top_k":
            entry[key] = top_k_value(value, f"override {raw_key!r}")
        else:
            check_number(f"override {raw_key!r}", key, value)
            entry[key] = value
    if unset:
        entry["unset"] = unset
    return entry


# --------------------------------------------------------------------------- defaults

def project_registry(project: dict | None) -> Registry:
    """Built-in data + the [tolerances] of an already-loaded project config (the run session's),
    so one command resolves with one config file."""
    base = Registry.builtin(Path(os.environ.get(ENV_PATH) or BUILTIN_DIR))
    section = (project or {}).get("tolerances")
    return base.with_overlay(section, str((project or {}).get("_file", "project config"))) if section else base
