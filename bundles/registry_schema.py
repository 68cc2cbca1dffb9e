"""The tolerance registry's data schema: names, strict validation, origins (provenance).

Split from bundles/registry.py (resolution) because the schema is what data authors
and `bundlerun tolerance audit` need on their own. Every entry of the built-in data
says where its numbers come from:

    origin = "backends/xnnpack/test/ops/test_conv1d.py:146-147"        # every value of the entry
    origin = ["backends/x.py:10", "backends/test/harness/tester.py:323"]  # values found across these
    origin = { atol = "backends/x.py:146", qtol = "backends/test/harness/tester.py:323" }  # per key
    origin = "bundlerun"  +  reason = "one line: why bundlerun has its own number here"

A citation is `path:line[-line]` in ExecuTorch at the pinned commit (bundles/et_source.py),
optionally followed by ` (numpy.allclose default)` when the value is a library default the
cited call relies on, or ` (bool)` when the cited line passes a boolean as the number
(`qtol=bool(quant_config)`: 1 when quantized). tests/test_registry_provenance.py re-reads each cited range and checks
that it holds the value (RULE_EVIDENCE for rules that are not numbers).
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.manifest_schema import RULE_CHOICES, RULE_DEFAULTS, RULE_INTEGERS, RULE_NUMBERS

SCHEMA = "bundlerun.tolerances/1"
CRITERIA = ("atol", "rtol", "qtol", "sqnr_min_db", "cosine_min", "rel_frobenius_max")
# every number an entry may set (mse_max: NXP's MSE ceiling; kl_max, top_k_overlap_min: LLM token rules)
NUMERIC = CRITERIA + RULE_NUMBERS
RULES = tuple(k for k in RULE_DEFAULTS if k not in RULE_NUMBERS)  # nan, sqnr_reference, sqnr_strict, top1, ...
CEILINGS = frozenset({"atol", "rtol", "qtol", "rel_frobenius_max", "mse_max", "kl_max"})  # looser = larger
FLOORS = frozenset({"sqnr_min_db", "cosine_min", "top_k_overlap_min"})  # looser = smaller
BASE_DTYPES = ("fp32", "fp16", "bf16", "int8", "int16")
QUANTIZED_DTYPES = ("int8", "int16")
TIERS = BASE_DTYPES + tuple(f"{d}.vs-float" for d in QUANTIZED_DTYPES)
# eager-dtype: the eager model run in the build's own float dtype (fp16 / bf16), as MLX's tests do
REFERENCES = ("eager-fp32", "eager-dtype", "quantized")
INTEGER_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})
BUNDLERUN = "bundlerun"

# Library defaults a cited call may rely on (`np.allclose(a, b, atol=1)` -> rtol 1e-5).
LIBRARY_DEFAULTS = {
    "numpy.allclose": {"rtol": 1e-5, "atol": 1e-8},
    "torch.allclose": {"rtol": 1e-5, "atol": 1e-8},
    "torch.isclose": {"rtol": 1e-5, "atol": 1e-8},
}

# What a cited line range must show for a rule value (regex, case-insensitive; "!" prefix: must not).
RULE_EVIDENCE: dict[tuple[str, Any], tuple[str, ...]] = {
    ("nan", "match"): (r"equal_nan\s*=\s*True",),
    ("nan", "fail"): (r"allclose|isclose", r"!equal_nan\s*=\s*True"),
    ("sqnr_reference", "reference"): (r"compute_error\s*\(|=\s*expected\.float\(\)[\s\S]*signal\s*=\s*b\.norm\(\)",),
    ("sqnr_reference", "actual"): (r"compute_sqnr|ErrorStatistics|sqnr",),
    ("sqnr_strict", True): (r"[^>=<!]>[^>=]|assertGreater\(",),
    ("sqnr_strict", False): (r">=|GreaterEqual",),
    ("top1", True): (r"argmax",),
    ("argmax_match", True): (r"argmax", r"assertEqual\("),  # greedy tokens taken by argmax, then compared
    ("cast_float", True): (r"\.float\(\)|float32",),
    ("arm_analysis", True): (r"compare_rel_frobenius_and_cosine_similarity",),
    ("reference_nonzero", True): (r"np\.any\(|count_nonzero",),
}
UNSET_EVIDENCE = (r"[=,(]\s*None\b", r"not used")  # a cited unset: `frobenius_threshold=None`, `atol=0,  # Not used`

_CITE = re.compile(r"^(?P<path>(backends|examples)/[\w./-]+\.\w+):(?P<lo>\d+)(?:-(?P<hi>\d+))?"
                   r"(?:\s+\((?:(?P<lib>[\w.]+) default|(?P<bool>bool))\))?$")

_ENTRY_KEYS = set(NUMERIC) | set(RULES) | {"exact", "unset", "mode", "note", "origin", "reason", "merged"}
_TOP_KEYS = {"schema", "source", "global", "backends", "op_rules", "model_overrides", "adjustments", "override"}
_GLOBAL_KEYS = {"default", "tiers", "variants"}
_BACKEND_KEYS = {"default", "tiers", "variants", "note", "firmware", "integer_outputs_exact", "default_variant",
                 "origin", "reason", "lowering"}
_VARIANT_KEYS = {"targets", "default", "tiers", "note", "backends"}
_OP_RULE_KEYS = _ENTRY_KEYS | {"name", "backends", "variants", "dtypes", "ops", "quantization", "rule", "eps"}
_MODEL_KEYS = _ENTRY_KEYS | {"models", "backend", "variants", "dtypes", "methods", "outputs", "quantization", "when"}
# `when`: a condition the source states (ExecuTorch's `atol=6.5e-2 if common.is_aarch64_host() else 6e-2`),
# kept as a condition of the entry instead of merged into one number
_WHEN_KEYS = {"host_arch", "not_host_arch"}
_ADJUST_KEYS = {"name", "backends", "variants", "dtypes", "host_arch", "distributions", "atol_scale", "rtol_scale",
                "note", "origin", "reason"}
_OVERRIDE_KEYS = _ENTRY_KEYS | {"methods", "outputs"}
_RULE_NAMES = ("fp16-eps",)
_SOURCE_KEYS = {"executorch"}


def _fail(where: str, message: str) -> None:
    raise ConfigError(f"{where}: {message}")


def suggest(word: str, choices: Any) -> str:
    """' (did you mean 'x'?)' for a typo or an abbreviation, else ''."""
    names = [str(c) for c in choices]
    close = difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    if not close and len(str(word)) >= 3:
        close = [n for n in names if n.startswith(str(word))][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(where: str, table: Any, allowed: set[str]) -> None:
    if not isinstance(table, dict):
        _fail(where, f"expected a table, got {type(table).__name__}")
    for key in table:
        if key not in allowed:
            _fail(where, f"unknown key {key!r}{suggest(key, sorted(allowed))}; allowed: {', '.join(sorted(allowed))}")


def check_number(where: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(where, f"{key} must be a number, got {value!r}")
    if not math.isfinite(value):
        _fail(where, f"{key} must be finite, got {value!r}")
    if value < 0:
        _fail(where, f"{key} must not be negative, got {value!r}")
    if key in ("cosine_min", "top_k_overlap_min") and value > 1:
        _fail(where, f"{key} must be at most 1, got {value!r}")


def check_list(where: str, key: str, value: Any, choices: Any = None) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(where, f"{key} must be a list of strings, got {value!r}")
    if choices is not None:
        for v in value:
            if v != "*" and v not in choices:
                _fail(where, f"unknown {key[:-1] if key.endswith('s') else key} {v!r} in {key}{suggest(v, choices)}")


# --------------------------------------------------------------------------- origins


def parse_citation(text: str) -> tuple[str, int, int, str | None] | None:
    """`backends/x.py:12-14 (numpy.allclose default)` -> (path, 12, 14, "numpy.allclose"); None if not one."""
    m = _CITE.match(str(text).strip())
    if not m:
        return None
    lo, hi = int(m["lo"]), int(m["hi"] or m["lo"])
    if hi < lo:
        return None
    return m["path"], lo, hi, m["lib"] or m["bool"]


def entry_values(entry: dict) -> dict[str, Any]:
    """Every value an entry states: criteria, rules, eps, adjustment scales; unset keys map to None."""
    out = {k: entry[k] for k in (*NUMERIC, *RULES, "exact", "eps", "atol_scale", "rtol_scale") if k in entry}
    for k in entry.get("unset", []):
        out[k] = None
    return out


def origins_of(entry: dict) -> dict[str, list[str]]:
    """key -> the origin strings that apply to it ("bundlerun" or citations)."""
    origin = entry.get("origin")
    keys = list(entry_values(entry))
    if origin is None:
        return {}
    if isinstance(origin, str):
        return {k: [origin] for k in keys}
    if isinstance(origin, list):
        return {k: list(origin) for k in keys}
    out: dict[str, list[str]] = {}
    for k, v in origin.items():
        out[k] = [v] if isinstance(v, str) else list(v)
    return out


def origin_text(entry: dict, key: str, commit: str | None) -> str | None:
    """The trail's `origin` of one key: 'executorch@cff6f4dd:path:lines' or 'bundlerun: reason'."""
    cites = origins_of(entry).get(key)
    if not cites:
        return None
    if cites == [BUNDLERUN]:
        return f"bundlerun: {entry.get('reason', '')}".rstrip(": ")
    tag = f"executorch@{commit[:8]}" if commit else "executorch"
    return "; ".join(f"{tag}:{c}" if c != BUNDLERUN else f"bundlerun: {entry.get('reason', '')}" for c in cites)


def parse_merged(text: str) -> tuple[str, str, float | None] | None:
    """`backends/x.py:12 qtol=0` -> (citation, "qtol", 0.0): a tighter value another test of the
    same key states (the entry keeps the loosest; `merged` lists the rest, cited)."""
    cite, _, kv = str(text).rpartition(" ")
    key, sep, raw = kv.partition("=")
    if not sep or parse_citation(cite) is None or key not in NUMERIC:
        return None
    if raw == "None":
        return cite, key, None
    try:
        return cite, key, float(raw)
    except ValueError:
        return None


def is_bundlerun(entry: dict, key: str) -> bool:
    return origins_of(entry).get(key) == [BUNDLERUN]


def _check_origin(where: str, entry: dict, required: bool) -> None:
    if "origin" not in entry:
        if required and entry_values(entry):
            _fail(where, "no origin: cite the ExecuTorch line (origin = \"backends/...py:L-L\") or say "
                         "origin = \"bundlerun\" with a reason")
        return
    origin = entry["origin"]
    values = entry_values(entry)
    if isinstance(origin, dict):
        for k, v in origin.items():
            if k not in values:
                _fail(where, f"origin.{k}: the entry sets no {k!r}" + suggest(k, values))
            cites = [v] if isinstance(v, str) else v
            _check_cites(f"{where}: origin.{k}", cites)
        missing = [k for k in values if k not in origin]
        if missing and required:
            _fail(where, f"no origin for {', '.join(missing)}")
        cites_all = [c for v in origin.values() for c in ([v] if isinstance(v, str) else v)]
    else:
        cites_all = [origin] if isinstance(origin, str) else origin
        _check_cites(f"{where}: origin", cites_all)
    if BUNDLERUN in cites_all:
        reason = entry.get("reason")
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason:
            _fail(where, "origin \"bundlerun\" needs reason = \"one line: why\"")


def _check_cites(where: str, cites: Any) -> None:
    if not isinstance(cites, list) or not cites or not all(isinstance(c, str) for c in cites):
        _fail(where, f"expected a citation or a list of citations, got {cites!r}")
    for c in cites:
        if c == BUNDLERUN:
            continue
        parsed = parse_citation(c)
        if parsed is None:
            _fail(where, f"{c!r} is not 'backends/...py:LINE[-LINE]' nor 'bundlerun'")
        if parsed[3] not in (None, "bool") and parsed[3] not in LIBRARY_DEFAULTS:
            _fail(where, f"{c!r}: unknown library default {parsed[3]!r}{suggest(parsed[3], LIBRARY_DEFAULTS)}")


# --------------------------------------------------------------------------- validation


def check_entry(where: str, entry: dict, allowed: set[str], require_origin: bool = False) -> None:
    check_keys(where, entry, allowed)
    for key in NUMERIC:
        if key in entry:
            check_number(where, key, entry[key])
    for key in RULES:
        if key in entry:
            default = RULE_DEFAULTS[key]
            if key in RULE_INTEGERS:
                lo, hi = RULE_INTEGERS[key]
                if isinstance(entry[key], bool) or not isinstance(entry[key], int) or not lo <= entry[key] <= hi:
                    _fail(where, f"{key} must be a whole number from {lo} to {hi}, got {entry[key]!r}")
            elif isinstance(default, bool):
                if not isinstance(entry[key], bool):
                    _fail(where, f"{key} must be true or false, got {entry[key]!r}")
            elif entry[key] not in RULE_CHOICES[key]:
                _fail(where, f"{key} must be one of {', '.join(RULE_CHOICES[key])}, got {entry[key]!r}"
                      + suggest(entry[key], RULE_CHOICES[key]))
    if "exact" in entry and not isinstance(entry["exact"], bool):
        _fail(where, f"exact must be true or false, got {entry['exact']!r}")
    if "unset" in entry:
        check_list(where, "unset", entry["unset"], NUMERIC)
    if "mode" in entry and entry["mode"] not in ("set", "loosen"):
        _fail(where, f"mode must be 'set' or 'loosen', got {entry['mode']!r}{suggest(entry['mode'], ['set', 'loosen'])}")
    for key in ("note", "reason"):
        if key in entry and not isinstance(entry[key], str):
            _fail(where, f"{key} must be a string")
    if "origin" in entry or require_origin:
        _check_origin(where, entry, require_origin)
    if "merged" in entry:
        if not isinstance(entry["merged"], list) or any(parse_merged(m) is None for m in entry["merged"]):
            _fail(where, "merged must list 'backends/...py:LINE key=value' strings")


def _check_tiers(where: str, tiers: Any, require_origin: bool) -> None:
    if not isinstance(tiers, dict):
        _fail(where, "expected a table of dtype tiers")
    for tier, entry in tiers.items():
        if tier not in TIERS:
            _fail(where, f"unknown dtype tier {tier!r}{suggest(tier, TIERS)}; known: {', '.join(TIERS)}")
        check_entry(f"{where}.{quote(tier)}", entry, _ENTRY_KEYS, require_origin)


def quote(key: str) -> str:
    return f'"{key}"' if "." in key else key


def _list_of_tables(file: str, data: dict, key: str) -> list[dict]:
    value = data.get(key, [])
    if not isinstance(value, list):
        _fail(f"{file}: {key}", f"expected an array of tables ([[{key}]])")
    return value


def _check_variant(vwhere: str, v: Any, require_origin: bool, backends: set[str] | None = None) -> None:
    check_keys(vwhere, v, _VARIANT_KEYS)
    if "targets" in v:
        check_list(vwhere, "targets", v["targets"])
    if "backends" in v:
        check_list(vwhere, "backends", v["backends"], backends)
    if "default" in v:
        check_entry(f"{vwhere}.default", v["default"], _ENTRY_KEYS, require_origin)
    if "tiers" in v:
        _check_tiers(f"{vwhere}.tiers", v["tiers"], require_origin)


def validate(data: dict, file: str, known_backends: set[str] | None = None,
             known_variants: dict[str, set[str]] | None = None, require_origin: bool = False) -> None:
    """Raise ConfigError (one line, with a close-match suggestion) on any problem.

    `known_backends` restricts backend names (a project layer may only tune the backends
    bundlerun knows); None accepts the names the data itself declares. `require_origin`
    (the built-in data): every entry that states a value must say where it comes from.
    """
    check_keys(file, data, _TOP_KEYS)
    if "schema" in data and data["schema"] != SCHEMA:
        _fail(file, f"unsupported schema {data['schema']!r}; expected {SCHEMA!r}")
    if "source" in data:
        check_keys(f"{file}: source", data["source"], _SOURCE_KEYS)
        commit = data["source"].get("executorch")
        if commit is not None and not re.fullmatch(r"[0-9a-f]{40}", str(commit)):
            _fail(f"{file}: source.executorch", f"expected a 40-digit commit, got {commit!r}")
    backends_data = data.get("backends", {})
    if not isinstance(backends_data, dict):
        _fail(f"{file}: backends", "expected a table")
    backends = set(known_backends) if known_backends is not None else set(backends_data)
    variants = {b: set(v) for b, v in (known_variants or {}).items()}
    for name, b in backends_data.items():
        variants.setdefault(name, set()).update((b or {}).get("variants", {}) if isinstance(b, dict) else ())

    g = data.get("global", {})
    check_keys(f"{file}: global", g, _GLOBAL_KEYS)
    if "default" in g:
        check_entry(f"{file}: global.default", g["default"], _ENTRY_KEYS, require_origin)
    if "tiers" in g:
        _check_tiers(f"{file}: global.tiers", g["tiers"], require_origin)
    global_variants = set(g.get("variants", {}))
    for vname, v in g.get("variants", {}).items():
        _check_variant(f"{file}: global.variants.{vname}", v, require_origin, backends)
    for name in variants:
        variants[name] |= global_variants

    for name, b in backends_data.items():
        where = f"{file}: backends.{name}"
        if name not in backends:
            _fail(where, f"unknown backend {name!r}{suggest(name, backends)}; known: {', '.join(sorted(backends))}")
        check_keys(where, b, _BACKEND_KEYS)
        if "default" in b:
            check_entry(f"{where}.default", b["default"], _ENTRY_KEYS, require_origin)
        if "tiers" in b:
            _check_tiers(f"{where}.tiers", b["tiers"], require_origin)
        if "firmware" in b:
            check_keys(f"{where}.firmware", b["firmware"], {"atol", "rtol"})
            for k, v in b["firmware"].items():
                check_number(f"{where}.firmware", k, v)
            if require_origin:
                _check_origin(where, {"origin": b.get("origin"), "reason": b.get("reason"), **b["firmware"]}, True)
        for key in ("note", "lowering"):
            if key in b and not isinstance(b[key], str):
                _fail(where, f"{key} must be a string")
        if "integer_outputs_exact" in b and not isinstance(b["integer_outputs_exact"], bool):
            _fail(where, "integer_outputs_exact must be true or false")
        if "default_variant" in b and b["default_variant"] not in variants.get(name, set()):
            dv = b["default_variant"]
            _fail(where, f"default_variant {dv!r} is not a declared variant{suggest(dv, variants.get(name, ()))}")
        for vname, v in b.get("variants", {}).items():
            _check_variant(f"{where}.variants.{vname}", v, require_origin)

    all_variants = set().union(*variants.values()) if variants else set()
    all_variants |= global_variants
    for i, rule in enumerate(_list_of_tables(file, data, "op_rules")):
        where = f"{file}: op_rules[{i}]" + (f" ({rule['name']})" if isinstance(rule, dict) and "name" in rule else "")
        check_entry(where, rule, _OP_RULE_KEYS, require_origin)
        if "ops" not in rule:
            _fail(where, "an op rule needs ops = [...] (aten base names, or '*')")
        check_list(where, "ops", rule["ops"])
        check_list(where, "backends", rule.get("backends", ["*"]), backends)
        check_list(where, "dtypes", rule.get("dtypes", ["*"]), TIERS)
        check_list(where, "variants", rule.get("variants", ["*"]), all_variants)
        if "quantization" in rule and not isinstance(rule["quantization"], str):
            _fail(where, "quantization must be a string (matched as a substring)")
        if "rule" in rule:
            if rule["rule"] not in _RULE_NAMES:
                _fail(where, f"unknown rule {rule['rule']!r}{suggest(rule['rule'], _RULE_NAMES)}; known: {', '.join(_RULE_NAMES)}")
            if "eps" not in rule:
                _fail(where, "rule 'fp16-eps' needs eps")
        if "eps" in rule:
            check_number(where, "eps", rule["eps"])

    for i, mo in enumerate(_list_of_tables(file, data, "model_overrides")):
        where = f"{file}: model_overrides[{i}]" + (f" ({mo['models'][0]})" if isinstance(mo, dict) and mo.get("models") else "")
        check_entry(where, mo, _MODEL_KEYS, require_origin)
        if "models" not in mo:
            _fail(where, "a model override needs models = [...]")
        check_list(where, "models", mo["models"])
        if "backend" in mo and mo["backend"] != "*" and mo["backend"] not in backends:
            _fail(where, f"unknown backend {mo['backend']!r}{suggest(mo['backend'], backends)}")
        check_list(where, "variants", mo.get("variants", ["*"]), variants.get(mo.get("backend"), all_variants))
        check_list(where, "dtypes", mo.get("dtypes", ["*"]), TIERS)
        check_list(where, "methods", mo.get("methods", ["*"]))
        check_list(where, "outputs", mo.get("outputs", ["*"]))
        if "when" in mo:
            if not isinstance(mo["when"], dict) or not mo["when"]:
                _fail(where, "when must be a table such as { host_arch = [\"aarch64\", \"arm64\"] }")
            check_keys(f"{where}.when", mo["when"], _WHEN_KEYS)
            check_list(f"{where}.when", "host_arch", mo["when"].get("host_arch", ["*"]))
            check_list(f"{where}.when", "not_host_arch", mo["when"].get("not_host_arch", []))

    for i, adj in enumerate(_list_of_tables(file, data, "adjustments")):
        where = f"{file}: adjustments[{i}]"
        check_keys(where, adj, _ADJUST_KEYS)
        check_list(where, "backends", adj.get("backends", ["*"]), backends)
        check_list(where, "variants", adj.get("variants", ["*"]), all_variants)
        check_list(where, "dtypes", adj.get("dtypes", ["*"]), TIERS)
        check_list(where, "host_arch", adj.get("host_arch", ["*"]))
        check_list(where, "distributions", adj.get("distributions", ["*"]))
        for k in ("atol_scale", "rtol_scale"):
            if k in adj:
                check_number(where, k, adj[k])
        if not any(k in adj for k in ("atol_scale", "rtol_scale")):
            _fail(where, "an adjustment needs atol_scale and/or rtol_scale")
        if "origin" in adj or require_origin:
            _check_origin(where, adj, require_origin)

    if "override" in data:
        check_entry(f"{file}: override", data["override"], _OVERRIDE_KEYS)
        check_list(f"{file}: override", "methods", data["override"].get("methods", ["*"]))
        check_list(f"{file}: override", "outputs", data["override"].get("outputs", ["*"]))
