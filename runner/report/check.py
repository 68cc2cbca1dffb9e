"""The strict check every report.json goes through before anything reads it (`Report.from_json`).

A report comes back from disk, from the history database, from another CI job's artifact (merge,
compare, --baseline, judge): it is data, possibly truncated, edited or hostile. The readers after
this one format numbers, index lists, hash values and compare strings, so every field they use
has its type checked here, with its path: `cases[3].outputs[0].stats.error_max: expected a
number, "inf", "-inf", "nan" or null, got a string 'abc'`. Unknown keys are kept (reports gain
fields within a schema version); known ones must have their documented type
(docs/report-schema.md). Sizes are bounded too, so a 10^9-element list is an error, not a stall.

Walks are iterative or bounded by the schema's own depth, so deeply nested input cannot recurse.
"""

from __future__ import annotations

import numbers
import re
from typing import Any, Callable, Iterable

from bundlerun.runner.judging.outcome import EXIT_CODES, VERDICTS
from bundlerun.runner.report.safe_text import visible
from bundlerun.targets.base import Verdict

MAX_ITEMS = 10_000_000  # cases, outputs, list entries of one report
MAX_TEXT = 1 << 20  # characters of one string (log lines and error texts included)
MAX_INDEX = 2**31 - 1
STATUSES = ("ok", "error", "timeout", "skip")
SPECIAL = ("inf", "-inf", "nan")  # how the writer stores non-finite numbers
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


class ReportCheckError(ValueError):
    """One problem, with the path of the field: turned into a ReportError by the caller."""


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    shown = "" if isinstance(value, (dict, list)) else f" {value!r}"[:60]
    return names.get(type(value), type(value).__name__) + shown


def _fail(path: str, want: str, value: Any) -> ReportCheckError:
    return ReportCheckError(visible(f"{path}: expected {want}, got {_kind(value)}"))


def obj(value: Any, path: str, optional: bool = True) -> dict:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, "an object" + (" or null" if optional else ""), value)
    return value


def lst(value: Any, path: str, optional: bool = True) -> list:
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise _fail(path, "a list" + (" or null" if optional else ""), value)
    if len(value) > MAX_ITEMS:
        raise ReportCheckError(f"{path}: {len(value)} entries (at most {MAX_ITEMS})")
    return value


def text(value: Any, path: str, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise _fail(path, "a string" + (" or null" if optional else ""), value)
    if len(value) > MAX_TEXT:
        raise ReportCheckError(f"{path}: a string of {len(value)} characters (at most {MAX_TEXT})")


def integer(value: Any, path: str, lo: int = 0, hi: int = 2**63 - 1, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, "an integer" + (" or null" if optional else ""), value)
    if not lo <= value <= hi:
        raise ReportCheckError(f"{path}: {value} is outside [{lo}, {hi}]")


def number(value: Any, path: str, optional: bool = True) -> None:
    """A number (non-finite ones written as "inf"/"-inf"/"nan"), or null."""
    if value is None and optional:
        return
    if isinstance(value, str) and value in SPECIAL:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(path, 'a number, "inf", "-inf", "nan"' + (" or null" if optional else ""), value)
    if isinstance(value, int) and abs(value) > _FLOAT_MAX:  # readers compute in floats: 10**400 cannot be one
        raise ReportCheckError(f"{path}: {str(value)[:20]}... is too large for a number")


_FLOAT_MAX = 1.7976931348623157e308


def real(value: Any, path: str, specials: tuple = (), optional: bool = True) -> None:
    """A real number (or one of `specials`, or null) where a writer formats it without a check."""
    if value is None and optional or (isinstance(value, str) and value in specials):
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or isinstance(value, str):
        shown = ", ".join(f'"{s}"' for s in specials)
        raise _fail(path, "a number" + (f", {shown}" if shown else "") + (" or null" if optional else ""), value)
    if isinstance(value, int) and abs(value) > _FLOAT_MAX:
        raise ReportCheckError(f"{path}: {str(value)[:20]}... is too large for a number")


def boolean(value: Any, path: str, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, bool):
        raise _fail(path, "true or false" + (" or null" if optional else ""), value)


def choice(value: Any, path: str, choices: tuple, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (str, int)) or isinstance(value, bool) or value not in choices:
        raise _fail(path, "one of " + ", ".join(map(str, choices)), value)


def strings(value: Any, path: str) -> None:
    for i, item in enumerate(lst(value, path)):
        text(item, f"{path}[{i}]", optional=False)


def shape(value: Any, path: str, optional: bool = True) -> None:
    if value is None and optional:
        return
    items = lst(value, path, optional=False)
    if len(items) > 64:
        raise ReportCheckError(f"{path}: {len(items)} dimensions")
    for i, size in enumerate(items):
        integer(size, f"{path}[{i}]", 0, MAX_INDEX, optional=False)


def fields(data: dict, path: str, spec: dict[str, Callable[[Any, str], None]]) -> None:
    """Check each present key of `data` named in `spec`. A value the table's optional scalar checks take
    as it is skips the call and its path (the path is only read when a check fails): most of a report's
    fields, and most of check_report's time (192-step LLM report: 11.5 -> 6 ms)."""
    for key, check in spec.items():
        if key in data:
            value = data[key]
            fast = _PASSES.get(check)
            if fast is not None and fast(value):
                continue
            check(value, f"{path}.{key}" if path else key)


_opt_text = lambda v, p: text(v, p)  # noqa: E731 - table entries below
_opt_num = lambda v, p: number(v, p)  # noqa: E731
_opt_int = lambda v, p: integer(v, p)  # noqa: E731
_opt_bool = lambda v, p: boolean(v, p)  # noqa: E731
_opt_obj = lambda v, p: obj(v, p) and None  # noqa: E731
# values each of those checks passes, told without calling it (anything else goes to the check itself)
_PASSES: dict[Callable[[Any, str], None], Callable[[Any], bool]] = {
    _opt_text: lambda v: v is None or (type(v) is str and len(v) <= MAX_TEXT),
    _opt_num: lambda v: v is None or type(v) is float,
    _opt_int: lambda v: v is None or (type(v) is int and 0 <= v <= 2**63 - 1),
    _opt_bool: lambda v: v is None or type(v) is bool,
}


def _opt_record(value: Any, path: str) -> None:
    """An optional JSON object (a step's --replay record)."""
    obj(value, path)


def _sha(value: Any, path: str) -> None:
    text(value, path)
    if isinstance(value, str) and not _HEX64.match(value):
        raise _fail(path, "a lowercase hex sha256", value)


def _tensor_stats(value: Any, path: str) -> None:
    fields(obj(value, path), path, {"shape": shape, "numel": _opt_int, "median": _opt_num, "mean": _opt_num,
                                   "max": _opt_num, "min": _opt_num})


_STATS = {"reference_stats": _tensor_stats, "actual_stats": _tensor_stats, "worst_index": shape,
          "mismatch_count": _opt_int, **{k: _opt_num for k in (
              "error_l2_norm", "error_mae", "error_max", "error_msd", "sqnr", "sqnr_actual", "cosine_similarity",
              "relative_frobenius", "psnr", "mismatch_fraction", "worst_actual", "worst_expected", "worst_allowed",
              "mse")}, **{k: _opt_int for k in ("nan_actual", "inf_actual", "nan_expected", "inf_expected")}}


_TRAIL_ENTRY = {"source": _opt_text, "file": _opt_text, "origin": _opt_text}
_text_passes = _PASSES[_opt_text]


def _criteria(value: Any, path: str) -> None:
    crit = obj(value, path)
    for key, item in crit.items():
        if key == "trail":
            where = f"{path}.{key}"
            for name, entries in obj(item, where).items():
                if type(entries) is list and len(entries) <= MAX_ITEMS and all(
                        type(e) is dict and all(_text_passes(e.get(k)) for k in _TRAIL_ENTRY) for e in entries):
                    continue  # what the loop below passes, without its paths
                for i, entry in enumerate(lst(entries, f"{where}.{name}")):
                    fields(obj(entry, f"{where}.{name}[{i}]"), f"{where}.{name}[{i}]", _TRAIL_ENTRY)
        elif not (item is None or type(item) in (float, int, bool, str) or isinstance(item, numbers.Real)):
            raise _fail(f"{path}.{key}", "a number, boolean, string or null", item)


def _failed(value: Any, path: str) -> None:
    for i, entry in enumerate(lst(value, path)):
        where = f"{path}[{i}]"
        fields(obj(entry, where, optional=False), where, {"criterion": _opt_text, "detail": _opt_text})


def _output(value: Any, path: str) -> None:
    out = obj(value, path, optional=False)
    for key in ("index", "name", "verdict"):
        if key not in out:
            raise ReportCheckError(f"{path}: no {key!r}")
    integer(out["index"], f"{path}.index", 0, MAX_INDEX, optional=False)
    text(out["name"], f"{path}.name", optional=False)
    choice(out["verdict"], f"{path}.verdict", VERDICTS)
    fields(out, path, _OUTPUT)


def _io(value: Any, path: str) -> None:
    fields(obj(value, path), path, {"dtype": _opt_text, "shape": shape})


def _stats(value: Any, path: str) -> None:
    fields(obj(value, path), path, _STATS)


_OUTPUT = {"criteria": _criteria, "failed": _failed, "expected": _io, "actual": _io, "lossy": _opt_bool,
           "note": _opt_text, "stats": _stats}


def _figures(value: Any, path: str) -> None:
    for i, fig in enumerate(lst(value, path)):
        where = f"{path}[{i}]"
        fields(obj(fig, where, optional=False), where, {
            "name": _opt_text, "unit": _opt_text, "kind": _opt_text, "source": _opt_text, "phase": _opt_text,
            "note": _opt_text, "value": lambda v, p: real(v, p), "per_inference": lambda v, p: real(v, p),
            "samples": _numbers, "spread": _opt_num})


def _profile(value: Any, path: str) -> None:
    for i, entry in enumerate(lst(value, path)):
        where = f"{path}[{i}]"
        fields(obj(entry, where, optional=False), where, {
            "method": _opt_text, "phase": _opt_text, "unit": _opt_text, "kind": _opt_text, "source": _opt_text,
            "note": _opt_text, "cases": _opt_int, "executions": _opt_int, "total": _opt_num,
            "operators": lambda v, p: [fields(obj(o, f"{p}[{k}]", optional=False), f"{p}[{k}]", {
                "name": _opt_text, "calls": _opt_int, "time": _opt_num}) for k, o in enumerate(lst(v, p))]})


def _case(value: Any, path: str) -> None:
    case = obj(value, path, optional=False)
    for key in ("method", "case", "status", "verdict"):
        if key not in case:
            raise ReportCheckError(f"{path}: no {key!r}")
    text(case["method"], f"{path}.method", optional=False)
    integer(case["case"], f"{path}.case", 0, MAX_INDEX, optional=False)
    choice(case["status"], f"{path}.status", STATUSES)
    choice(case["verdict"], f"{path}.verdict", VERDICTS)
    fields(case, path, {"elapsed_s": _opt_num, "error": _opt_text, "error_kind": _opt_text, "log_path": _opt_text,
                        "log_excerpt": strings, "device_verdict": _opt_obj, "extra": _opt_obj,
                        "perf": _figures})
    outputs = lst(case.get("outputs"), f"{path}.outputs")
    for i, out in enumerate(outputs):
        _output(out, f"{path}.outputs[{i}]")
    bad = [o["verdict"] for o in outputs if o["verdict"] not in (Verdict.PASS, Verdict.SKIP)]
    if case["verdict"] == Verdict.PASS and (bad or case["status"] != "ok"):
        # the judge never writes this: a case passes only when it ran and every output passed
        raise ReportCheckError(f"{path}.verdict: PASS, but " + (f"an output is {bad[0]}" if bad else
                                                               f"its status is {case['status']}"))
    if case["verdict"] == "FAIL" and outputs and "FAIL" not in bad:
        raise ReportCheckError(f"{path}.verdict: FAIL, but no output failed")  # a FAIL needs a failing output


def _summary(value: Any, path: str) -> None:
    s = obj(value, path, optional=False)
    for key in ("verdict", "exit_code", "counts"):
        if key not in s:
            raise ReportCheckError(f"{path}: no {key!r}")
    choice(s["verdict"], f"{path}.verdict", VERDICTS)
    choice(s["exit_code"], f"{path}.exit_code", EXIT_CODES)
    for key, count in obj(s["counts"], f"{path}.counts", optional=False).items():
        choice(key, f"{path}.counts (key)", VERDICTS)
        integer(count, f"{path}.counts.{key}", 0, optional=False)
    fields(s, path, {"cases": _opt_int, "outputs": _opt_int, "interrupted": _opt_bool})


def _shard(value: Any, path: str) -> None:
    rec = obj(value, path)
    fields(rec, path, {"spec": _opt_text, "axis": _opt_text, "key": _opt_text, "assignment": _opt_text,
                       "index": lambda v, p: integer(v, p, 1), "count": lambda v, p: integer(v, p, 1),
                       "keys": strings, "universe": strings})


def _regressions(value: Any, path: str) -> None:
    for i, reg in enumerate(lst(value, path)):
        where = f"{path}[{i}]"
        fields(obj(reg, where, optional=False), where, {"rule": _opt_text, "message": _opt_text, "where": _opt_text})


def _numbers(value: Any, path: str) -> None:
    for i, item in enumerate(lst(value, path)):
        real(item, f"{path}[{i}]", optional=False)


def _load(value: Any, path: str) -> None:
    fields(obj(value, path), path, {"before": _numbers, "after": _numbers, "cpus": _opt_int})


def _pair(value: Any, path: str) -> None:
    inf = lambda v, p: real(v, p, ("inf", "-inf"))  # noqa: E731 - an exact match's SQNR
    fields(obj(value, path), path, {"baseline": inf, "current": inf, "delta": lambda v, p: real(v, p)})


def _baseline(value: Any, path: str) -> None:
    """The --baseline section (docs/report-schema.md): its deltas are formatted by every writer."""
    base = obj(value, path)
    fields(base, path, {"ref": _opt_text, "run_id": _opt_text, "label": _opt_text, "refused": _opt_text,
                        "history_id": _opt_int, "notes": strings})
    for i, row in enumerate(lst(base.get("outputs"), f"{path}.outputs")):
        where = f"{path}.outputs[{i}]"
        fields(obj(row, where, optional=False), where, {
            "method": _opt_text, "output": _opt_int, "name": _opt_text, "cases": _opt_int, "verdicts": _opt_obj,
            **{k: _pair for k in ("error_max", "sqnr", "cosine_similarity", "mismatch_count")}})
    for i, row in enumerate(lst(base.get("perf"), f"{path}.perf")):
        where = f"{path}.perf[{i}]"
        fields(obj(row, where, optional=False), where, {
            **{k: _opt_text for k in ("method", "name", "phase", "unit", "kind", "gate", "not_gated")},
            **{k: _opt_num for k in ("baseline", "current", "noise_band")},
            "delta": lambda v, p: real(v, p), "limit": lambda v, p: real(v, p),
            "change": lambda v, p: real(v, p, ("inf",)), "cases": _opt_int,
            "samples": lambda v, p: fields(obj(v, p), p, {"baseline": _opt_int, "current": _opt_int}),
            "spread": lambda v, p: fields(obj(v, p), p, {"baseline": _opt_num, "current": _opt_num})})


def _jobs(value: Any, path: str) -> None:
    for i, job in enumerate(lst(value, path)):
        where = f"{path}[{i}]"
        fields(obj(job, where, optional=False), where, {
            "name": _opt_text, "run_id": _opt_text, "bundle": _opt_text, "model": _opt_text, "dtype": _opt_text,
            "backend": _opt_text, "sha256": _opt_text, "target": _opt_text, "shard": _opt_text,
            "missing": _opt_bool, "summary": _opt_obj})


def _farm(value: Any, path: str) -> None:
    farm = obj(value, path)
    for i, job in enumerate(lst(farm.get("jobs"), f"{path}.jobs")):
        where = f"{path}.jobs[{i}]"
        fields(obj(job, where, optional=False), where, {
            "job": _opt_text, "group": _opt_text, "bundle": _opt_text, "verdict": _opt_text, "report": _opt_text,
            "exit_code": _opt_int, "flaky": _opt_bool,
            "attempts": lambda v, p: [fields(obj(a, f"{p}[{k}]", optional=False), f"{p}[{k}]", {
                "url": _opt_text, "device": _opt_text, "verdict": _opt_text, "exit_code": _opt_int,
                "attempt": _opt_int, "error_kinds": strings, "elapsed_s": _opt_num, "submitted_unix": _opt_num})
                for k, a in enumerate(lst(v, p))]})
    for i, dev in enumerate(lst(farm.get("devices"), f"{path}.devices")):
        where = f"{path}.devices[{i}]"
        fields(obj(dev, where, optional=False), where, {
            "url": _opt_text, "resource": _opt_text, "attempts": _opt_int, "infra_failures": _opt_int,
            "numerical_failures": _opt_int, "passed": _opt_int, "infra_rate": _opt_num})
    fields(farm, path, {"id": _opt_text, "plan": _opt_text, "makespan_s": _opt_num, "executor": _opt_obj,
                        "flaky_jobs": strings, "flaky_devices": strings, "started_unix": _opt_num})
    obj(farm.get("results"), f"{path}.results")


def _dataset(value: Any, path: str) -> None:
    ds = obj(value, path)
    fields(ds, path, {"name": _opt_text, "ci_method": _opt_text, "calibration": _opt_text,
                      "discordant": _opt_obj, "confusion": _opt_obj,
                      **{k: lambda v, p: [number(x, f"{p}[{i}]", optional=False) for i, x in enumerate(lst(v, p))]
                         for k in ("top1_diff_ci", "top5_diff_ci", "top1_ci", "reference_top1_ci", "agreement_ci")},
                      **{k: lambda v, p: [integer(x, f"{p}[{i}]", -(2**63), 2**63 - 1, optional=False)
                                          for i, x in enumerate(lst(v, p))]
                         for k in ("labels", "predictions", "reference_predictions")},
                      "labels_sha": _opt_text, "top5_diff": _opt_num,
                      **{k: _opt_num for k in ("top1", "top5", "reference_top1", "reference_top5", "top1_diff",
                                               "agreement", "confidence")},
                      **{k: _opt_int for k in ("evaluated", "errored", "num_classes", "samples")}})


def _required(data: dict, path: str, spec: dict[str, Callable[[Any, str], None]]) -> None:
    """Every key of `spec` present (and checked), for records built with required fields."""
    for key in spec:
        if key not in data:
            raise ReportCheckError(f"{path}: no {key!r}")
    fields(data, path, spec)


_STEP_REQUIRED: dict[str, Callable[[Any, str], None]] = {
    "step": lambda v, p: integer(v, p, 0, MAX_INDEX, optional=False),
    "case": lambda v, p: integer(v, p, 0, MAX_INDEX, optional=False),
    "kind": lambda v, p: text(v, p, optional=False),
    "start_pos": lambda v, p: integer(v, p, 0, MAX_INDEX, optional=False),
    "tokens": lambda v, p: integer(v, p, 0, MAX_INDEX, optional=False),
    "verdict": lambda v, p: choice(v, p, VERDICTS),
    "reference_token": lambda v, p: integer(v, p, -1, MAX_INDEX, optional=False),
}
_STEP = {"target_token": lambda v, p: integer(v, p, 0, MAX_INDEX), "argmax_match": _opt_bool, "replay": _opt_record,
         "top_k": lambda v, p: integer(v, p, 0, MAX_INDEX),
         **{k: _opt_num for k in ("sqnr", "cosine_similarity", "error_max", "top_k_overlap", "kl", "margin",
                                  "logprob_target", "logprob_reference")}}
_SEQUENCE_REQUIRED: dict[str, Callable[[Any, str], None]] = {
    "name": lambda v, p: text(v, p, optional=False), "method": lambda v, p: text(v, p, optional=False),
    "mode": lambda v, p: text(v, p, optional=False), "stateful": lambda v, p: boolean(v, p, optional=False),
    "verdict": lambda v, p: choice(v, p, VERDICTS),
}
_SEQUENCE = {"first_divergence": lambda v, p: integer(v, p, 0, MAX_INDEX),
             "greedy_agreement": lambda v, p: integer(v, p, 0, MAX_INDEX, optional=False),
             "prompt_text": _opt_text, "state": _opt_text, "replay": _opt_text,
             **{k: _opt_num for k in ("perplexity_target", "perplexity_reference", "perplexity_ratio")}}


def _sequences(value: Any, path: str) -> None:
    """`sequences`: LLM bundles' per-sequence records (runner/report/sequences.py)."""
    for i, seq in enumerate(lst(value, path)):
        where = f"{path}[{i}]"
        seq = obj(seq, where, optional=False)
        _required(seq, where, _SEQUENCE_REQUIRED)
        fields(seq, where, _SEQUENCE)
        for j, step in enumerate(lst(seq.get("steps"), f"{where}.steps")):
            at = f"{where}.steps[{j}]"
            step = obj(step, at, optional=False)
            _required(step, at, _STEP_REQUIRED)
            fields(step, at, _STEP)


_TOP = {
    "tool": lambda v, p: fields(obj(v, p), p, {"name": _opt_text, "version": _opt_text}),
    "run": lambda v, p: fields(obj(v, p), p, {"id": _opt_text, "label": _opt_text, "started": _opt_text,
                                              "finished": _opt_text, "duration_s": _opt_num, "command": strings,
                                              "host": _opt_obj, "history_id": _opt_int}),
    "bundle": lambda v, p: fields(obj(v, p), p, {
        **{k: _opt_text for k in ("path", "model", "backend", "dtype", "built_for", "reference", "quantization")},
        "sha256": _sha, "program_sha256": _sha, "inputs_sha256": _sha, "criteria_sha256": _sha,
        "size": _opt_int, "has_manifest": _opt_bool,
        "seed": lambda v2, p2: integer(v2, p2, -(2**63)), "versions": _opt_obj, "models": strings,
        "inputs_used": strings, "sequence_set": _sha}),
    "target": lambda v, p: fields(obj(v, p), p, {"url": _opt_text, "info": _opt_obj, "logs": _opt_obj,
                                                 "setup_s": _opt_num, "targets": strings}),
    "overrides": lambda v, p: [obj(o, f"{p}[{i}]", optional=False) for i, o in enumerate(lst(v, p))],
    "warnings": strings,
    "summary": _summary,
    "dataset": _dataset,
    "perf": lambda v, p: fields(obj(v, p), p, {"load": _load, "repeat": _opt_int, "warmup": _opt_int,
                                               "notes": strings, "profile": _profile,
                                               "summary": lambda v2, p2: lst(v2, p2) and None}),
    "regressions": _regressions,
    "baseline": _baseline,
    "files": lambda v, p: [text(x, f"{p}.{k}", optional=False) for k, x in obj(v, p).items()],
    "outputs_file": _opt_text,
    "outputs_sha256": _sha,
    "judged": _opt_obj,
    "shard": _shard,
    "sequences": _sequences,
    "merged": _opt_obj,
    "jobs": _jobs,
    "farm": _farm,
}


class CaseChecker:
    """check_report's part on the cases, one case at a time (a farm's merged report streams its
    cases from disk, runner/report/record.py): each case's types, then no PASS summary over a
    failing case."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary
        self.seen = 0
        self.failing: str | None = None

    def check(self, case: Any) -> None:
        _case(case, f"cases[{self.seen}]")
        self.seen += 1
        if self.failing is None and case["verdict"] in ("FAIL", "ERROR", "TIMEOUT"):
            self.failing = case["verdict"]

    def done(self) -> None:
        summary = self.summary
        if self.failing and (summary["verdict"] == Verdict.PASS or summary["exit_code"] == 0):
            # a PASS summary over a failing case is no report bundlerun writes (edited or corrupted)
            raise ReportCheckError(f"summary: verdict {summary['verdict']}, exit code {summary['exit_code']}, but a "
                                   f"case is {self.failing}")


def check_cases(cases: Iterable[Any], summary: dict[str, Any]) -> None:
    checker = CaseChecker(summary)
    for case in cases:
        checker.check(case)
    checker.done()


def check_report(data: Any) -> None:
    """Raise ReportCheckError (one line, with the field's path) unless `data` has the types
    every reader of a report relies on."""
    report = obj(data, "the report", optional=False)
    if "summary" not in report:
        raise ReportCheckError("summary: missing")
    fields(report, "", _TOP)
    check_cases(lst(report.get("cases"), "cases"), report["summary"])
