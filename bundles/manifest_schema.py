"""Strict validation of the manifest JSON embedded in a bundle: the one check every
reader goes through (`Manifest.from_dict` and `bundles.bpte.read_bundle` call it).

A manifest decides the verdict, so anything that could loosen a check is an
error, not a default: NaN/Inf/null/negative tolerances, a string where a number
goes, an unknown (misspelled) key, an output with no criterion at all. Nesting
depth, string lengths and node counts are bounded so a hostile file cannot make
a reader recurse or stall. Errors are one line: file, key path, problem.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from bundlerun.bundles.errors import ManifestError
from bundlerun.bundles.sequence import MAX_KV_LINKS, STATES

MANIFEST_SCHEMA = "bundlerun.manifest/1"
CRITERIA_FIELDS = ("atol", "rtol", "qtol", "sqnr_min_db", "cosine_min", "rel_frobenius_max")
# Rules from backends' own tests (docs/tolerances.md "Rules"): optional, and absent = the default,
# which is how every bundle made before them is judged.
RULE_DEFAULTS: dict[str, object] = {"mse_max": None, "top1": False, "top_k": None, "nan": "match",
                                    "sqnr_reference": "actual",
                                    "sqnr_strict": False, "cast_float": False, "arm_analysis": False,
                                    "reference_nonzero": False,
                                    # token-level rules of LLM logits (runner/judging/token_metrics.py)
                                    "argmax_match": False, "kl_max": None, "top_k_overlap_min": None}
RULE_FIELDS = tuple(RULE_DEFAULTS)
RULE_NUMBERS = ("mse_max", "kl_max", "top_k_overlap_min")  # rules that hold a limit (a number or null)
RULE_CHOICES = {"nan": ("match", "fail"), "sqnr_reference": ("actual", "reference")}
RULE_INTEGERS = {"top_k": (1, 2**31 - 1)}  # rules that hold a whole number: (lowest, highest)

MAX_DEPTH = 32  # the real manifest nests 7 deep
MAX_NODES = 2_000_000
MAX_NAME = 1024  # model id, method/output/input names, dtypes, backend, target
MAX_TEXT = 65536  # descriptions, trail sources, file paths, free-form strings
MAX_DIMS = 16
MAX_DIM = 2**31 - 1

_TOP_KEYS = ("schema", "model", "build", "versions", "methods", "dataset", "created", "extra", "integrity",
             "sequences")
_MODEL_KEYS = ("id", "source", "description", "weights")
_BUILD_KEYS = ("backend", "target", "dtype", "quantization", "reference", "inputs", "seed", "cases",
               "lowering", "ops", "overrides", "cache_key", "etrecord", "llm", "input_source", "input_structure",
               "dynamic_shapes")
_BUILD_INPUT_KEYS = ("shape", "dtype", "distribution", "distribution_from")
_METHOD_KEYS = ("name", "inputs", "outputs")
_TENSOR_KEYS = ("name", "dtype", "shape", "dynamic")
_OUTPUT_KEYS = ("name", "dtype", "shape", "criteria", "quantized", "dynamic")
_DYNAMIC_KEYS = ("dims", "cases")  # build.dynamic_shapes (bundles/dynamic_shapes.py)
_DYNAMIC_DIM_KEYS = ("input", "dim", "name", "min", "max")
_DYNAMIC_POINTS = ("min", "typical", "max")
MAX_DYNAMIC_DIMS = 1024  # bundlerun's own bound: far above any model's dynamic dims, small for a reader
_CRITERIA_KEYS = (*CRITERIA_FIELDS, "scale", "zero_point", "exact", *RULE_FIELDS, "trail")
_TRAIL_KEYS = ("value", "source", "file", "origin")  # origin: ExecuTorch path:lines, or "bundlerun: why"
_INTEGRITY_KEYS = ("algorithm", "program", "cases", "manifest")
_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool", "bfloat16",
           "uint16", "uint32", "uint64")
# LLM sequences (bundles/sequence.py, docs/llm.md). Bounds are bundlerun's own: far above any
# bundle it builds (a few prompts of up to max_seq_len - 1 tokens plus their decode steps), small
# enough that a hostile manifest cannot make a reader build millions of records.
MAX_SEQUENCES = 1024
MAX_STEPS = 100_000  # steps of one sequence: at most one per test case (limits.MAX_CASES)
MAX_TOKENS = 1 << 20  # token ids fed at one step
MAX_TOKEN_ID = 2**31 - 1  # an int32 vocabulary index
_SEQUENCE_KEYS = ("name", "method", "stateful", "mode", "steps", "prompt_text", "state")
_STEP_KEYS = ("case", "kind", "start_pos", "tokens", "reference_next")
_LLM_KEYS = ("arch", "size", "params", "dtype", "quantization", "max_seq_len", "dynamic_shape", "use_kv_cache",
             "weights", "tokenizer", "export_s", "model_class", "reference", "kv_io", "kv_update", "exporter")
_KV_LINK_KEYS = ("output", "input", "axis")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


class _Checker:
    """Raises one ManifestError naming the source and the key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> ManifestError:
        where = f"{path}: " if path else ""
        return ManifestError(f"{self.source}: invalid bundlerun manifest: {where}{problem}")

    def table(self, path: str, obj: Any, allowed: Iterable[str], required: Iterable[str] = ()) -> dict:
        allowed = tuple(allowed)
        if not isinstance(obj, dict):
            raise self.fail(path, f"expected an object, got {_kind(obj)}")
        for key in obj:
            if key not in allowed:
                import difflib  # only for a typo's hint

                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(path, f"unknown key {_short(key)}{hint}; known: {', '.join(allowed)}")
        for key in required:
            if key not in obj:
                raise self.fail(path, f"missing key {key!r}")
        return obj

    def text(self, path: str, value: Any, limit: int = MAX_NAME, optional: bool = False) -> None:
        if value is None and optional:
            return
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, got {_kind(value)}")
        if len(value) > limit:
            raise self.fail(path, f"string of {len(value)} characters (at most {limit})")

    def integer(self, path: str, value: Any, lo: int, hi: int, optional: bool = False) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, got {_kind(value)}")
        if not lo <= value <= hi:
            raise self.fail(path, f"{value} is outside [{lo}, {hi}]")

    def number(self, path: str, value: Any, optional: bool = True, positive: bool = False,
               at_most: float | None = None) -> None:
        """A finite non-negative number (or null when optional): what every tolerance must be."""
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"expected a finite number, got {_kind(value)}")
        if not math.isfinite(value):
            raise self.fail(path, f"{value!r} is not a finite number")
        if value < 0 or (positive and value == 0):
            raise self.fail(path, f"{value!r} must be {'> 0' if positive else '>= 0'}")
        if at_most is not None and value > at_most:
            raise self.fail(path, f"{value!r} must be <= {at_most}")

    def shape(self, path: str, value: Any) -> None:
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list of sizes, got {_kind(value)}")
        if len(value) > MAX_DIMS:
            raise self.fail(path, f"{len(value)} dimensions (at most {MAX_DIMS})")
        for i, size in enumerate(value):
            self.integer(f"{path}[{i}]", size, 0, MAX_DIM)

    def dtype(self, path: str, value: Any) -> None:
        self.text(path, value)
        if value not in _DTYPES:
            import difflib  # only for a typo's hint

            close = difflib.get_close_matches(value, _DTYPES, n=1)
            raise self.fail(path, f"unknown dtype {_short(value)}" + (f" (did you mean {close[0]!r}?)" if close else ""))


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    shown = "" if isinstance(value, (dict, list)) else f" {_short(value)}"
    return names.get(type(value), type(value).__name__) + shown


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_bounds(data: Any, source: str) -> None:
    """Depth, size and finiteness of the whole JSON tree, walked without recursion."""
    chk = _Checker(source)
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    nodes = 0
    while stack:
        value, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise chk.fail("", f"more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise chk.fail(path, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                if len(key) > MAX_NAME:
                    raise chk.fail(path, f"key of {len(key)} characters (at most {MAX_NAME})")
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            if len(value) > MAX_TEXT:
                raise chk.fail(path, f"string of {len(value)} characters (at most {MAX_TEXT})")
        elif isinstance(value, float) and not math.isfinite(value):
            raise chk.fail(path, f"{value!r} is not a finite number")


def validate_manifest(data: Any, source: str = "bundle") -> None:
    """Raise ManifestError (one line) unless `data` is a well-formed bundlerun manifest."""
    chk = _Checker(source)
    if not isinstance(data, dict):
        raise chk.fail("", f"expected a JSON object, got {_kind(data)}")
    check_bounds(data, source)
    schema = data.get("schema")
    if schema != MANIFEST_SCHEMA:
        if isinstance(schema, str) and schema.startswith("bundlerun.manifest/"):
            raise chk.fail("schema", f"{_short(schema)} is not supported (this bundlerun reads {MANIFEST_SCHEMA})")
        raise chk.fail("schema", f"expected {MANIFEST_SCHEMA!r}, got {_kind(schema)}")
    chk.table("", data, _TOP_KEYS, required=("schema", "model", "methods"))
    _model(chk, data["model"])
    if "build" in data:
        _build(chk, data["build"])
    versions = data.get("versions", {})
    if not isinstance(versions, dict):
        raise chk.fail("versions", f"expected an object, got {_kind(versions)}")
    for key, value in versions.items():
        chk.text(f"versions.{key}", value)
    chk.text("created", data.get("created", ""), MAX_NAME)
    if data.get("dataset") is not None:
        _dataset(chk, data["dataset"])
    if "extra" in data and not isinstance(data["extra"], dict):
        raise chk.fail("extra", f"expected an object, got {_kind(data['extra'])}")
    methods = data["methods"]
    if not isinstance(methods, dict) or not methods:
        raise chk.fail("methods", "expected an object with at least one method")
    for name, method in methods.items():
        _method(chk, f"methods.{name}", name, method)
    if data.get("integrity") is not None:
        _integrity(chk, data["integrity"])
    if "sequences" in data:
        llm = (data.get("build") or {}).get("llm")
        _sequences(chk, data["sequences"], methods, (data.get("build") or {}).get("cases"),
                   bool(isinstance(llm, dict) and llm.get("kv_io")))


def _model(chk: _Checker, model: Any) -> None:
    chk.table("model", model, _MODEL_KEYS, required=("id",))
    chk.text("model.id", model["id"])
    chk.text("model.source", model.get("source"), MAX_TEXT, optional=True)
    chk.text("model.description", model.get("description"), MAX_TEXT, optional=True)
    if "weights" in model:  # et: sources: {"kind": "seeded-random" | "state-dict", ...}
        weights = chk.table("model.weights", model["weights"], ("kind", "seed", "how", "file", "sha256"),
                            required=("kind",))
        for key in ("kind", "how", "file", "sha256"):
            chk.text(f"model.weights.{key}", weights.get(key), MAX_TEXT, optional=True)
        chk.integer("model.weights.seed", weights.get("seed"), 0, 2**64 - 1, optional=True)


def _build(chk: _Checker, build: Any) -> None:
    chk.table("build", build, _BUILD_KEYS)
    for key in ("backend", "target", "dtype", "reference", "cache_key"):
        chk.text(f"build.{key}", build.get(key), optional=True)
    chk.text("build.quantization", build.get("quantization"), MAX_TEXT, optional=True)
    chk.integer("build.seed", build.get("seed"), -(2**63), 2**64 - 1, optional=True)
    chk.integer("build.cases", build.get("cases"), 0, MAX_DIM, optional=True)
    for i, spec in enumerate(build.get("inputs") or []):
        chk.table(f"build.inputs[{i}]", spec, _BUILD_INPUT_KEYS)
        if "shape" in spec:
            chk.shape(f"build.inputs[{i}].shape", spec["shape"])
    if not isinstance(build.get("inputs", []), list):
        raise chk.fail("build.inputs", f"expected a list, got {_kind(build['inputs'])}")
    chk.text("build.input_structure", build.get("input_structure"), MAX_TEXT, optional=True)
    if "input_source" in build:
        _input_source(chk, build["input_source"])
    if "etrecord" in build:
        _etrecord(chk, build["etrecord"])
    ops = build.get("ops", [])
    if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
        raise chk.fail("build.ops", "expected a list of operator names")
    for key in ("lowering", "overrides"):
        if key in build and not isinstance(build[key], dict):
            raise chk.fail(f"build.{key}", f"expected an object, got {_kind(build[key])}")
    if "llm" in build:
        _llm(chk, build["llm"])
    if "dynamic_shapes" in build:
        _dynamic(chk, build["dynamic_shapes"])


def _texts(chk: _Checker, path: str, value: Any, limit: int = MAX_TEXT) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise chk.fail(path, f"expected a list of strings, got {_kind(value)}")
    for i, item in enumerate(value):
        chk.text(f"{path}[{i}]", item, limit)


def _integers(chk: _Checker, path: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise chk.fail(path, f"expected a list of integers, got {_kind(value)}")
    for i, item in enumerate(value):
        chk.integer(f"{path}[{i}]", item, -(2**63), 2**64 - 1)


def _input_source(chk: _Checker, source: Any) -> None:
    """build.input_source: where real inputs came from (bundles/real_inputs.py); shown by inspect and
    the reports. The keys known here are type-checked; a key another version adds is kept as read."""
    if not isinstance(source, dict):
        raise chk.fail("build.input_source", f"expected an object, got {_kind(source)}")
    for key in ("kind", "from", "resize", "normalize"):
        chk.text(f"build.input_source.{key}", source.get(key), MAX_TEXT, optional=True)
    _texts(chk, "build.input_source.files", source.get("files"))
    _integers(chk, "build.input_source.indices", source.get("indices"))
    _integers(chk, "build.input_source.labels", source.get("labels"))


def _etrecord(chk: _Checker, entry: Any) -> None:
    """build.etrecord: the ETRecord beside the bundle (bundles/etrecord.py); its sha256 is checked
    against the file before `bundlerun debug` uses it."""
    if not isinstance(entry, dict):
        raise chk.fail("build.etrecord", f"expected an object, got {_kind(entry)}")
    chk.text("build.etrecord.path", entry.get("path"), MAX_TEXT, optional=True)
    chk.text("build.etrecord.sha256", entry.get("sha256"), optional=True)
    chk.integer("build.etrecord.bytes", entry.get("bytes"), 0, 2**63 - 1, optional=True)
    chk.integer("build.etrecord.debug_handles", entry.get("debug_handles"), 0, 2**63 - 1, optional=True)
    _texts(chk, "build.etrecord.graphs", entry.get("graphs"))
    if entry.get("delegate_graphs") is not None and not isinstance(entry["delegate_graphs"], dict):
        raise chk.fail("build.etrecord.delegate_graphs", f"expected an object, got {_kind(entry['delegate_graphs'])}")


def _dynamic(chk: _Checker, dyn: Any) -> None:
    """build.dynamic_shapes: the declared dynamic dims and which point each case tests (shown)."""
    chk.table("build.dynamic_shapes", dyn, _DYNAMIC_KEYS, required=_DYNAMIC_KEYS)
    for key, limit in (("dims", MAX_DYNAMIC_DIMS), ("cases", MAX_STEPS)):
        if not isinstance(dyn[key], list) or len(dyn[key]) > limit:
            raise chk.fail(f"build.dynamic_shapes.{key}", f"expected a list of at most {limit} entries")
    for i, dim in enumerate(dyn["dims"]):
        where = f"build.dynamic_shapes.dims[{i}]"
        chk.table(where, dim, _DYNAMIC_DIM_KEYS, required=_DYNAMIC_DIM_KEYS)
        chk.text(f"{where}.name", dim["name"])
        for key in ("input", "dim", "min", "max"):
            chk.integer(f"{where}.{key}", dim[key], 0, MAX_DIM)
    for i, point in enumerate(dyn["cases"]):
        if point not in _DYNAMIC_POINTS:
            raise chk.fail(f"build.dynamic_shapes.cases[{i}]", f"{_short(point)} is not one of {', '.join(_DYNAMIC_POINTS)}")


def _llm(chk: _Checker, llm: Any) -> None:
    """build.llm: the LLM export config (bundles/llm_build.py); shown, never used to judge."""
    chk.table("build.llm", llm, _LLM_KEYS, required=("arch", "dtype", "max_seq_len", "weights"))
    for key in ("arch", "size", "dtype", "model_class", "reference"):
        chk.text(f"build.llm.{key}", llm.get(key), optional=True)
    for key in ("quantization", "weights", "tokenizer"):
        chk.text(f"build.llm.{key}", llm.get(key), MAX_TEXT, optional=True)
    chk.integer("build.llm.max_seq_len", llm["max_seq_len"], 2, MAX_DIM)
    for key in ("dynamic_shape", "use_kv_cache"):
        if key in llm and not isinstance(llm[key], bool):
            raise chk.fail(f"build.llm.{key}", f"expected a boolean, got {_kind(llm[key])}")
    if "params" in llm and not isinstance(llm["params"], dict):
        raise chk.fail("build.llm.params", f"expected an object, got {_kind(llm['params'])}")
    chk.number("build.llm.export_s", llm.get("export_s"))
    for key in ("kv_update", "exporter"):
        chk.text(f"build.llm.{key}", llm.get(key), MAX_TEXT, optional=True)
    if "kv_io" in llm:
        _kv_io(chk, llm["kv_io"])


def _kv_io(chk: _Checker, links: Any) -> None:
    """build.llm.kv_io: which output of a step feeds which input of the next (bundles/sequence.py KvLink);
    whether they exist and fit is checked against the cases when the bundle is read (bundles/consistency.py)."""
    if not isinstance(links, list) or not links:
        raise chk.fail("build.llm.kv_io", f"expected a non-empty list, got {_kind(links)}")
    if len(links) > MAX_KV_LINKS:
        raise chk.fail("build.llm.kv_io", f"{len(links)} links (at most {MAX_KV_LINKS})")
    for n, link in enumerate(links):
        where = f"build.llm.kv_io[{n}]"
        chk.table(where, link, _KV_LINK_KEYS, required=_KV_LINK_KEYS)
        for key in _KV_LINK_KEYS:
            chk.integer(f"{where}.{key}", link[key], 0, MAX_DIM)


def _sequences(chk: _Checker, sequences: Any, methods: dict, cases: Any, io_links: bool = False) -> None:
    """Top-level `sequences` (bundles/sequence.py): written only when non-empty."""
    if not isinstance(sequences, list) or not sequences:
        raise chk.fail("sequences", f"expected a non-empty list, got {_kind(sequences)}")
    if len(sequences) > MAX_SEQUENCES:
        raise chk.fail("sequences", f"{len(sequences)} sequences (at most {MAX_SEQUENCES})")
    limit = cases - 1 if isinstance(cases, int) and not isinstance(cases, bool) else MAX_STEPS - 1
    names: set[str] = set()
    used: set[tuple[str, int]] = set()
    for i, seq in enumerate(sequences):
        where = f"sequences[{i}]"
        chk.table(where, seq, _SEQUENCE_KEYS, required=_SEQUENCE_KEYS[:5])
        chk.text(f"{where}.name", seq["name"])
        if seq["name"] in names:
            raise chk.fail(f"{where}.name", f"{_short(seq['name'])} names two sequences")
        names.add(seq["name"])
        chk.text(f"{where}.method", seq["method"])
        if seq["method"] not in methods:
            raise chk.fail(f"{where}.method", f"{_short(seq['method'])} is not a method of the manifest")
        if not isinstance(seq["stateful"], bool):
            raise chk.fail(f"{where}.stateful", f"expected a boolean, got {_kind(seq['stateful'])}")
        if seq["mode"] not in ("teacher-forced", "greedy"):
            raise chk.fail(f"{where}.mode", f"expected teacher-forced or greedy, got {_kind(seq['mode'])}")
        chk.text(f"{where}.prompt_text", seq.get("prompt_text"), MAX_TEXT, optional=True)
        if "state" in seq and seq["state"] not in STATES:
            raise chk.fail(f"{where}.state", f"expected {' or '.join(STATES)}, got {_kind(seq['state'])}")
        if seq.get("state") == "io" and not io_links:
            raise chk.fail(f"{where}.state", "a sequence whose state is its inputs and outputs needs build.llm.kv_io")
        steps = seq["steps"]
        if not isinstance(steps, list) or not steps:
            raise chk.fail(f"{where}.steps", f"expected a non-empty list, got {_kind(steps)}")
        if len(steps) > MAX_STEPS:
            raise chk.fail(f"{where}.steps", f"{len(steps)} steps (at most {MAX_STEPS})")
        last = -1
        for k, step in enumerate(steps):
            at = f"{where}.steps[{k}]"
            chk.table(at, step, _STEP_KEYS, required=_STEP_KEYS)
            chk.integer(f"{at}.case", step["case"], 0, limit)
            if step["case"] <= last:
                raise chk.fail(f"{at}.case", f"{step['case']} does not follow case {last}: steps run in suite order")
            last = step["case"]
            if (seq["method"], step["case"]) in used:
                raise chk.fail(f"{at}.case", f"case {step['case']} belongs to two sequences")
            used.add((seq["method"], step["case"]))
            if step["kind"] not in ("prompt", "decode"):
                raise chk.fail(f"{at}.kind", f"expected prompt or decode, got {_kind(step['kind'])}")
            if k == 0 and step["kind"] != "prompt":
                raise chk.fail(f"{at}.kind", "a sequence starts with a prompt")
            chk.integer(f"{at}.start_pos", step["start_pos"], 0, MAX_DIM)
            tokens = step["tokens"]
            if not isinstance(tokens, list) or not tokens:
                raise chk.fail(f"{at}.tokens", f"expected a non-empty list of token ids, got {_kind(tokens)}")
            if len(tokens) > MAX_TOKENS:
                raise chk.fail(f"{at}.tokens", f"{len(tokens)} tokens (at most {MAX_TOKENS})")
            if step["kind"] == "decode" and len(tokens) != 1:
                raise chk.fail(f"{at}.tokens", f"a decode step feeds one token, not {len(tokens)}")
            for t, token in enumerate(tokens):
                chk.integer(f"{at}.tokens[{t}]", token, 0, MAX_TOKEN_ID)
            chk.integer(f"{at}.reference_next", step["reference_next"], 0, MAX_TOKEN_ID)


def _dataset(chk: _Checker, dataset: Any) -> None:
    if not isinstance(dataset, dict):
        raise chk.fail("dataset", f"expected an object or null, got {_kind(dataset)}")
    chk.text("dataset.name", dataset.get("name"), optional=True)
    labels = dataset.get("labels")
    if labels is not None:
        if not isinstance(labels, list):
            raise chk.fail("dataset.labels", f"expected a list, got {_kind(labels)}")
        for i, label in enumerate(labels):
            chk.integer(f"dataset.labels[{i}]", label, -(2**63), 2**63 - 1)
    chk.integer("dataset.num_classes", dataset.get("num_classes"), 1, MAX_DIM, optional=True)


def _method(chk: _Checker, path: str, name: str, method: Any) -> None:
    chk.text(path, name)
    chk.table(path, method, _METHOD_KEYS, required=("name", "outputs"))
    if method["name"] != name:
        raise chk.fail(f"{path}.name", f"{_short(method['name'])} differs from its key {name!r}")
    for key in ("inputs", "outputs"):
        if not isinstance(method.get(key, []), list):
            raise chk.fail(f"{path}.{key}", f"expected a list, got {_kind(method[key])}")
    for i, spec in enumerate(method.get("inputs", [])):
        chk.table(f"{path}.inputs[{i}]", spec, _TENSOR_KEYS, required=("name", "dtype", "shape"))
        _tensor(chk, f"{path}.inputs[{i}]", spec)
    if not method["outputs"]:
        raise chk.fail(f"{path}.outputs", "no outputs: nothing would be judged")
    for i, spec in enumerate(method["outputs"]):
        where = f"{path}.outputs[{i}]"
        chk.table(where, spec, _OUTPUT_KEYS, required=("name", "dtype", "shape", "criteria"))
        _tensor(chk, where, spec)
        if not isinstance(spec.get("quantized", False), bool):
            raise chk.fail(f"{where}.quantized", f"expected a boolean, got {_kind(spec['quantized'])}")
        _criteria(chk, f"{where}.criteria", spec["criteria"])


def _tensor(chk: _Checker, path: str, spec: dict) -> None:
    chk.text(f"{path}.name", spec["name"])
    chk.dtype(f"{path}.dtype", spec["dtype"])
    chk.shape(f"{path}.shape", spec["shape"])
    dynamic = spec.get("dynamic", [])
    if not isinstance(dynamic, list) or len(dynamic) > len(spec["shape"]):
        raise chk.fail(f"{path}.dynamic", "expected a list of dimension indices of its shape")
    for i, dim in enumerate(dynamic):
        chk.integer(f"{path}.dynamic[{i}]", dim, 0, len(spec["shape"]) - 1)


def _criteria(chk: _Checker, path: str, crit: Any) -> None:
    chk.table(path, crit, _CRITERIA_KEYS)
    for key in CRITERIA_FIELDS:
        chk.number(f"{path}.{key}", crit.get(key), at_most=1.0 if key == "cosine_min" else None)
    chk.number(f"{path}.scale", crit.get("scale"), positive=True)
    if crit.get("qtol"):  # finite numbers whose bound is not: |a - r| <= inf would pass anything
        bound = (crit.get("atol") or 0.0) + crit["qtol"] * (crit.get("scale") or 1.0)
        if not math.isfinite(bound):
            raise chk.fail(path, "atol + qtol * scale overflows to infinity: the element-wise check would pass anything")
    chk.integer(f"{path}.zero_point", crit.get("zero_point"), -(2**31), 2**32 - 1, optional=True)
    if not isinstance(crit.get("exact", False), bool):
        raise chk.fail(f"{path}.exact", f"expected a boolean, got {_kind(crit['exact'])}")
    for key in RULE_NUMBERS:
        chk.number(f"{path}.{key}", crit.get(key), at_most=1.0 if key == "top_k_overlap_min" else None)
    for key, default in RULE_DEFAULTS.items():
        if key in RULE_NUMBERS or key not in crit:
            continue
        value = crit[key]
        if key in RULE_INTEGERS:
            chk.integer(f"{path}.{key}", value, *RULE_INTEGERS[key], optional=True)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise chk.fail(f"{path}.{key}", f"expected a boolean, got {_kind(value)}")
        elif value not in RULE_CHOICES[key]:
            raise chk.fail(f"{path}.{key}", f"expected one of {', '.join(RULE_CHOICES[key])}, got {_kind(value)}")
    if not crit.get("exact") and not crit.get("top1") and not crit.get("argmax_match") and crit.get("top_k") is None \
            and all(crit.get(k) is None for k in (*CRITERIA_FIELDS, *RULE_NUMBERS)):
        raise chk.fail(path, "no criterion is set (" + ", ".join(CRITERIA_FIELDS)
                       + " are all null and exact is false): the output would pass unchecked")
    trail = crit.get("trail", {})
    chk.table(f"{path}.trail", trail, _CRITERIA_KEYS[:-1])
    for key, entries in trail.items():
        if not isinstance(entries, list):
            raise chk.fail(f"{path}.trail.{key}", f"expected a list, got {_kind(entries)}")
        for i, entry in enumerate(entries):
            where = f"{path}.trail.{key}[{i}]"
            chk.table(where, entry, _TRAIL_KEYS, required=("value", "source"))
            value = entry["value"]
            rule_text = key in RULE_CHOICES and isinstance(value, str) and value in RULE_CHOICES[key]
            if value is not None and not rule_text and not isinstance(value, (bool, int, float)):
                raise chk.fail(f"{where}.value", f"expected a number, boolean or null, got {_kind(entry['value'])}")
            chk.text(f"{where}.source", entry["source"], MAX_TEXT)
            chk.text(f"{where}.file", entry.get("file"), MAX_TEXT, optional=True)
            chk.text(f"{where}.origin", entry.get("origin"), MAX_TEXT, optional=True)


def _integrity(chk: _Checker, integrity: Any) -> None:
    chk.table("integrity", integrity, _INTEGRITY_KEYS, required=_INTEGRITY_KEYS)
    if integrity["algorithm"] != "sha256":
        raise chk.fail("integrity.algorithm", f"{_short(integrity['algorithm'])} is not supported (sha256)")
    for key in ("program", "manifest"):
        _digest(chk, f"integrity.{key}", integrity[key])
    cases = integrity["cases"]
    if not isinstance(cases, dict):
        raise chk.fail("integrity.cases", f"expected an object, got {_kind(cases)}")
    for method, digests in cases.items():
        if not isinstance(digests, list):
            raise chk.fail(f"integrity.cases.{method}", f"expected a list, got {_kind(digests)}")
        for i, digest in enumerate(digests):
            _digest(chk, f"integrity.cases.{method}[{i}]", digest)


def _digest(chk: _Checker, path: str, value: Any) -> None:
    if not isinstance(value, str) or not _HEX64.match(value):
        raise chk.fail(path, f"expected a lowercase hex sha256, got {_kind(value)}")
