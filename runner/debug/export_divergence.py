"""Divergence at export: the exported program already differs from the eager model.

`bundlerun debug` compares the runtime's intermediates with the *exported program's* (the
ETRecord's graph), so a model whose export differs from eager (code that takes another path while
`torch.compiler.is_exporting()`, a tracing-time constant, a dropped side effect) shows every layer
`ok` while its output fails against the eager reference the bundle holds. This module says so,
and where, per operation: the exported program is run on the case's inputs (node by node,
torch.fx.Interpreter) and the eager model under a dispatch mode that records every ATen op
(runner/debug/eager_ops.py); each exported node is paired with its eager op by module path
(`nn_module_stack`) and source line (`stack_trace`), and in graph order the first node whose value
parts from eager while none of its inputs does is where they part - a functional call, a tensor
method or a step of attention written inline in `forward`, not only a module. A node whose input
already diverges is `downstream`; so is a module whose input diverges (each module's input and
output are compared too, its output with the last node of its `nn_module_stack` span).

The floor is the output's SQNR budget (runner/debug/localize.py `output_budget`, from its criteria), else
100 dB: bundlerun's own figure for "the same computation, float rounding apart" (eager and
exported programs run the same torch kernels; the debug tables of docs/debugging.md show
134-143 dB between them). Comparisons use ExecuTorch's ErrorStatistics formulas
(runner/judging/numerics.py).

It runs on the host, after whatever the target returned, so it is the same on every target.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from bundlerun.bundles.manifest_records import ModelInfo
from bundlerun.targets.base import Verdict
from bundlerun.bundles.manifest import Manifest
from bundlerun.bundles.backends.common import export_model
from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.model_source import resolve_model
from bundlerun.bundles.partition_control import source_line
from bundlerun.runner.debug.eager_ops import (capture, compared_nodes, eager_key, match_nodes, node_key, node_module,
                                              node_source, op_name, traced)
from bundlerun.runner.judging.numerics import error_statistics, judge_output
from bundlerun.runner.report.console import plain

DEFAULT_FLOOR_DB = 100.0
# ops whose values are uninitialized memory or random draws (eager_ops.op_name spelling): never compared
_UNDEFINED = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "rand", "randn",
                        "rand_like", "randn_like", "randint", "randint_like", "randperm", "bernoulli", "normal",
                        "uniform", "multinomial", "exponential", "geometric", "cauchy", "log_normal", "dropout"})


def _numpy(value: Any) -> np.ndarray | None:
    import torch

    if isinstance(value, torch.Tensor):
        v = value.detach()
        return (v.float() if v.dtype == torch.bfloat16 else v).contiguous().numpy()
    if isinstance(value, (list, tuple)):
        first = next((x for x in value if isinstance(x, torch.Tensor)), None)
        return _numpy(first) if first is not None else None
    return None


def _stats(actual: np.ndarray | None, expected: np.ndarray | None) -> dict[str, Any] | None:
    if actual is None or expected is None or actual.size != expected.size:
        return None
    s = error_statistics(actual.reshape(expected.shape).astype(np.float64), expected.astype(np.float64))
    return {"sqnr": s.sqnr, "error_max": s.error_max, "error_mae": s.error_mae, "cosine": s.cosine_similarity}


def capture_graph(graph_module: Any, inputs: tuple) -> tuple[dict[str, Any], Any]:
    """Every call_function node's value, by name, and the graph's output."""
    import torch

    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n.op == "call_function":
                values[n.name] = result
            return result

    with torch.no_grad():
        out = Recorder(graph_module).run(*inputs)
    return values, out


def module_spans(graph_module: Any) -> dict[str, list[Any]]:
    """module path -> the call_function nodes of its first call, in graph order (from nn_module_stack)."""
    spans: dict[str, list[Any]] = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        stack = node.meta.get("nn_module_stack")
        for key, value in (stack.items() if isinstance(stack, dict) else ()):
            if "@" in str(key):  # a later call of the same module ("L__self___cell@1"): eager records the first
                continue
            path = value[0] if isinstance(value, (tuple, list)) and value else None
            if path:
                spans.setdefault(str(path), []).append(node)
    return spans


def _diverges(stats: dict[str, Any] | None, floor: float) -> bool | None:
    """None when not comparable; an SQNR of +inf (identical) or None (both zero) never diverges."""
    if stats is None:
        return None
    sqnr = stats.get("sqnr")
    return isinstance(sqnr, (int, float)) and not (math.isinf(sqnr) and sqnr > 0) and sqnr < floor


def _source(node: Any) -> str | None:
    trace = node.meta.get("stack_trace")
    return source_line(trace) if isinstance(trace, str) else None


def _at(row: dict[str, Any]) -> str:
    """"linear (l1, model.py:30)": a node, its module and line, for a bound."""
    line = row.get("line")
    return f"{row['node']} ({row.get('module') or 'forward'}" + (f", {line[0]}:{line[1]})" if line else ")")


def compare_ops(nodes: list[Any], values: dict[str, Any], run: Any, floor: float) -> list[dict[str, Any]]:
    """One row per exported ATen node, in graph order: its eager op, SQNR and status. A node whose own
    value diverges while none of its inputs does (through nodes not compared) is where a divergence
    starts ("diverges"); one with a diverging input is "downstream"."""

    matches = match_nodes(nodes, values, run)
    tainted: set[str] = set()
    rows = []
    compared = {n.name for n in nodes}
    for n in (nodes[0].graph.nodes if nodes else ()):
        if n.name not in compared:  # getitem and the like: a diverging input passes through
            if any(a.name in tainted for a in n.all_input_nodes):
                tainted.add(n.name)
            continue
        m = matches[n.name]
        path, kind = node_module(n)
        eager_op = run.ops[m.eager].op if m.eager is not None else None
        stats = _stats(_numpy(values.get(n.name)), _numpy(run.ops[m.eager].value)) if m.eager is not None else None
        row = {"node": n.name, "op": str(n.target), "eager_op": eager_op, "eager_index": m.eager, "match": m.how,
               "module": path, "type": kind,
               "line": list(node_source(n) or []) or None, "source": _source(n),
               **(stats or {})}
        upstream = any(a.name in tainted for a in n.all_input_nodes)
        if op_name(n.target) in _UNDEFINED:  # values no two runs share: nothing to compare
            stats = None
            for key in ("sqnr", "error_max", "error_mae", "cosine"):
                row.pop(key, None)
        bad = _diverges(stats, floor)
        if bad is None:
            row["status"] = (m.how if m.eager is None else "not compared (uninitialized or random)"
                             if op_name(n.target) in _UNDEFINED else "not comparable (shape)")
        else:
            row["status"] = ("downstream" if upstream else "diverges") if bad else "ok"
        if bad or (bad is None and upstream):
            tainted.add(n.name)
        rows.append(row)
    return rows


def _first_divergent(rows: list[dict[str, Any]], nodes: list[Any], run: Any = None) -> dict[str, Any] | None:
    """The first row that diverges on its own, with the exported-only nodes feeding it, the eager ops the
    exported program has no node for that ran just before it, and, when its place is not certain
    (matched by shape or order, or an input not compared), the bound around it."""
    k = next((i for i, r in enumerate(rows) if r["status"] == "diverges"), None)
    if k is None:
        return None
    rows[k]["status"] = "FIRST DIVERGENT"
    first = dict(rows[k])
    by_name = {r["node"]: r for r in rows}
    node = nodes[k]
    seen, todo, only, uncompared = set(), list(node.all_input_nodes), [], []
    while todo:  # back through the inputs that were not compared
        a = todo.pop()
        r = by_name.get(a.name)
        if a.name in seen or a.op != "call_function" or (r and r["status"] in ("ok", "diverges", "downstream")):
            continue
        seen.add(a.name)
        if r is not None:  # (a getitem and the like has no row: walked through)
            (only if r["status"] == "exported only" else uncompared).append(r)
        todo += a.all_input_nodes
    first["exported_only_inputs"] = [{"node": r["node"], "op": r["op"], "source": r["source"]} for r in only]
    last_ok = next((r for r in reversed(rows[:k]) if r["status"] == "ok"), None)
    first["eager_only_before"] = _eager_only(run, nodes, rows[:k], first.get("eager_index")) if run else []
    doubt = [f"matched to eager by {first['match']} only"] if first["match"] in ("shape", "order") else []
    doubt += [f"input {r['node']} ({r['status']}) not compared" for r in uncompared]
    extra = first["eager_only_before"]
    if extra:
        doubt.append(f"eager ran {len(extra)} op(s) in between that the exported program has no node for ("
                     + ", ".join(f"{_op(o['op'])} at {o['line'][0]}:{o['line'][1]}" if o.get("line") else _op(o["op"])
                                 for o in extra[:3]) + (", ..." if len(extra) > 3 else "") + ")")
    first["bound"] = None
    if doubt:
        first["bound"] = f"between {_at(last_ok) if last_ok else 'the inputs'} and {_at(first)}: {'; '.join(doubt)}"
    first["downstream_modules"] = []
    return first


def _eager_only(run: Any, nodes: list[Any], before: list[dict[str, Any]], until: int | None) -> list[dict[str, Any]]:
    """Eager ops on a (module, line) where the exported program has no node, run after the last eager op
    paired before the first divergence and before its own: code that ran only in eager, right there."""

    if until is None or not traced(nodes):
        return []
    exported = {node_key(n) for n in nodes}
    since = max((r["eager_index"] for r in before if r.get("eager_index") is not None), default=-1)
    return [{"op": op.op, "module": op.module, "line": list(op.source) if op.source else None}
            for op in run.ops[since + 1:until] if eager_key(op, True) not in exported]


def compare_modules(run: Any, values: dict[str, Any], graph_module: Any, floor: float) -> list[dict[str, Any]]:
    """Each eager submodule call's input and output against the exported graph: the output with the value
    of the module's last node (by `nn_module_stack`), the input with the first value entering its span."""
    spans = module_spans(graph_module)
    rows = []
    for call in run.modules:
        nodes = spans.get(call.path)
        row: dict[str, Any] = {"module": call.path, "type": call.kind}
        if not nodes:
            rows.append({**row, "node": None, "status": "no node in the exported graph"})
            continue
        last = next((n for n in reversed(nodes) if _numpy(values.get(n.name)) is not None), None)
        inside = {n.name for n in nodes}
        entering = [a for n in nodes for a in n.all_input_nodes if a.name not in inside and a.op != "get_attr"]
        want = _numpy(call.input)
        source = next((a for a in entering if want is not None and a.name in values
                       and getattr(_numpy(values[a.name]), "shape", None) == want.shape), None)
        placeholder = next((a for a in entering if a.op == "placeholder"), None) if source is None else None
        got_in = _numpy(values.get(source.name)) if source is not None else None
        out = _stats(_numpy(values.get(last.name)) if last is not None else None, _numpy(call.output))
        inp = _stats(got_in, want) if source is not None else (
            {"sqnr": math.inf, "error_max": 0.0} if placeholder is not None else None)  # the model's own input
        row.update({"node": last.name if last is not None else None, "input_node": source.name if source else None,
                    "input_sqnr": (inp or {}).get("sqnr"), "input_error_max": (inp or {}).get("error_max"),
                    **(out or {})})
        if _diverges(inp, floor):
            row["status"] = "downstream"
        elif out is None:
            row["status"] = "not comparable (shape)"
        else:
            row["status"] = "diverges" if _diverges(out, floor) else "ok"
        rows.append(row)
    return rows


def localize(eager: Any, exported_program: Any, inputs: tuple, floor_db: float | None = None) -> dict[str, Any]:
    """Compare eager with the exported program per operation and per module (see the module docstring)."""

    floor = DEFAULT_FLOOR_DB if floor_db is None else float(floor_db)
    gm = exported_program.module()
    values, out = capture_graph(gm, inputs)
    run = capture(eager, inputs)
    nodes = compared_nodes(gm)
    ops = compare_ops(nodes, values, run, floor)
    layers = compare_modules(run, values, gm, floor)
    first = _first_divergent(ops, nodes, run)
    if first is not None:
        for row in layers:
            if row["module"] == first["module"] and row["status"] == "diverges":
                row["status"] = "FIRST DIVERGENT"
        first["downstream_modules"] = [r["module"] for r in layers if r["status"] == "downstream"]
    else:  # no operation diverges: a diverging module none of whose operations could be compared, if any
        spans = module_spans(gm)
        compared = {r["node"] for r in ops if r["status"] in ("ok", "downstream", "diverges")}
        row = next((r for r in layers if r["status"] == "diverges"
                    and not any(n.name in compared for n in spans.get(r["module"], []))), None)
        if row is not None:
            row["status"] = "FIRST DIVERGENT"
            first = {**row, "op": None, "match": "module",
                     "bound": f"inside {row['module']}: no operation of it could be matched to eager"}
    return {
        "compared": ("eager model (every ATen operation, and each submodule's input and output) vs the exported "
                     "program (node values; matched by source line and nn_module_stack)"),
        "floor_db": floor,
        "output": _stats(_numpy(out), _numpy(run.output)),
        "first_divergent": first,
        "operations": ops,
        "layers": layers,
        "notes": run.notes,
    }


def _op(name: Any) -> str:
    """"aten.native_layer_norm.default" -> "native_layer_norm"."""
    text = str(name or "")
    return text[len("aten."):].rsplit(".", 1)[0] if text.startswith("aten.") else text


def summary_line(found: dict[str, Any]) -> str:
    """One line: where eager and the exported program part (or that they do not)."""
    first = found.get("first_divergent")
    out = found.get("output") or {}
    tail = f"; at the output SQNR {_f(out.get('sqnr'))} dB, max error {_f(out.get('error_max'), '.3g')}" if out else ""
    if found.get("error"):
        return f"not localized: {found['error']}"
    if not first:
        return f"the exported program matches eager at every operation (floor {_f(found.get('floor_db'))} dB){tail}"
    where = (f"{first['module']} ({first['type']})" if first.get("module")
             else f"the model's own forward ({first['type']})")
    what = (f"operation {_op(first['op'])} (node {first['node']}, eager {_op(first.get('eager_op')) or '—'}) in "
            if first.get("op") else "")
    src = f" at {first['source']}" if first.get("source") else ""
    down = first.get("downstream_modules") or []
    return (f"eager and the exported program part first at {what}{where}{src}: SQNR {_f(first.get('sqnr'))} dB < floor "
            f"{_f(found.get('floor_db'))} dB, max error {_f(first.get('error_max'), '.3g')}"
            + (f"; downstream of it: {', '.join(down[:6])}" + (f" and {len(down) - 6} more" if len(down) > 6 else "")
               if down else "")
            + (f"; place bounded {first['bound']}" if first.get("bound") else "") + tail)


def divergence_tables(found: dict[str, Any], context: int = 6) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the operations around the first divergence and of the modules: the tables
    the console, summary.md and report.html show (report.json has every operation)."""
    tables = []
    ops = found.get("operations") or []
    k = next((i for i, r in enumerate(ops) if r.get("status") == "FIRST DIVERGENT"), None)
    if ops:
        lo, hi = ((max(0, k - context), min(len(ops), k + context + 1)) if k is not None
                  else (0, min(len(ops), 2 * context)))
        rows = [[str(r["node"]), _op(r["op"]), _op(r.get("eager_op")) or "—", str(r.get("module") or "(forward)"),
                 f"{r['line'][0]}:{r['line'][1]}" if r.get("line") else "—", _f(r.get("sqnr")),
                 _f(r.get("error_max"), ".3g"), str(r["status"])] for r in ops[lo:hi]]
        tables.append((f"eager vs exported program, per operation ({hi - lo} of {len(ops)}; all in report.json)",
                       ["node", "exported op", "eager op", "module", "source", "SQNR dB", "max err", "status"], rows))
    layers = found.get("layers") or []
    if layers:
        rows = [[str(r.get("module")), str(r.get("type")), str(r.get("node") or "—"), _f(r.get("input_sqnr")),
                 _f(r.get("sqnr")), _f(r.get("error_max"), ".3g"), str(r.get("status"))] for r in layers]
        tables.append(("eager vs exported program, per module (input and output)",
                       ["module", "type", "exported node", "input SQNR", "output SQNR", "max err", "status"], rows))
    return tables


def divergence_lines(found: dict[str, Any]) -> list[str]:
    """What feeds the first divergence that eager or the export lacks, the bound, the runtime row, notes."""
    first = found.get("first_divergent") or {}
    lines = [f"input {n['node']} ({_op(n['op'])}) exists only in the exported program"
             + (f": {n['source']}" if n.get("source") else "") for n in first.get("exported_only_inputs") or []]
    extra = first.get("eager_only_before") or []
    for op in extra[:5]:  # the rest are in report.json
        line = op.get("line")
        place = f", {line[0]}:{line[1]}" if line else ""
        lines.append(f"eager ran {_op(op['op'])} ({op['module'] or 'forward'}{place}) just before it; the exported "
                     "program has no node for that line")
    if len(extra) > 5:
        lines.append(f"... and {len(extra) - 5} more eager op(s) with no exported node (report.json)")
    if first.get("bound"):
        lines.append(f"place bounded {first['bound']}")
    at = found.get("runtime_row")
    if at:
        lines.append(f"on the target, row {at['row']} (instruction {at['instruction']}, {at['runtime_op']}) computes "
                     f"{first.get('node')}: it matches the exported program")
    return lines + [f"note: {n}" for n in found.get("notes") or []]


def print_divergence(found: dict[str, Any], console: Any, context: int = 6) -> None:
    """The finding, the operations around the first divergence, the per-module table (console)."""
    from rich.table import Table

    console.print(found.get("finding", ""), markup=False)
    numeric = {"SQNR dB", "max err", "input SQNR", "output SQNR"}
    for title, head, rows in divergence_tables(found, context):
        table = Table(title=title, title_justify="left")
        for col in head:
            table.add_column(col, justify="right" if col in numeric else "left")
        for row in rows:
            table.add_row(*[plain(c) for c in row])
        console.print(table)
    from bundlerun.runner.report.safe_text import visible  # names and source lines come from the ETRecord

    for line in divergence_lines(found):
        console.print(visible(f"  {line}"), markup=False)


def _f(v: Any, fmt: str = ".1f") -> str:
    if v is None:
        return "—"
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


# ------------------------------------------------------------------ callers


def eager_model_of(manifest: Manifest | None) -> tuple[Any, str]:
    """The bundle's eager model, reloaded from its recorded source (zoo name or factory file), or
    (None, why not)."""
    model = manifest.model if manifest else ModelInfo()
    source, ident = str(model.source or ""), model.id
    ref = None
    if source.startswith("factory:"):
        ref = source[len("factory:"):]
    elif source == "zoo" or (ident and not source):
        ref = ident
    if not ref:
        return None, f"the manifest records no model source to reload the eager model from ({source!r})"

    try:
        return resolve_model(str(ref)).module, str(ref)
    except BundlerunError as exc:
        return None, f"the eager model {ref} could not be reloaded: {exc}"


def check_debug(manifest: Manifest | None, record: Any, inputs: tuple, quantized: bool,
                runtime_output: np.ndarray | None, expected: np.ndarray, criteria: Any,
                budget_db: float | None, output_index: int) -> dict[str, Any] | None:
    """For `debug` when no layer exceeds: does the runtime output fail against eager while it matches
    the exported program? Then localize where eager and the exported program part."""

    if runtime_output is None:
        return None
    exported = record.exported_program
    if quantized and record.graph_map and "eager_fp32/forward" in record.graph_map:
        exported = record.graph_map["eager_fp32/forward"]
    if exported is None:
        return None
    dtype = str(expected.dtype)
    verdict = judge_output(runtime_output.reshape(expected.shape), expected, criteria, dtype, dtype)
    if verdict.verdict == Verdict.PASS:
        return None
    import torch

    with torch.no_grad():
        ep_out = _numpy(_nth(exported.module()(*inputs), output_index))
    vs_exported = _stats(runtime_output, ep_out)
    found: dict[str, Any] = {"runtime_vs_eager": _stats(runtime_output, expected), "runtime_vs_exported": vs_exported,
                             "exported_vs_eager": _stats(ep_out, expected)}
    ep_verdict = judge_output(ep_out.reshape(expected.shape), expected, criteria, dtype, dtype) \
        if ep_out is not None and ep_out.size == expected.size else None
    if quantized or ep_verdict is None or ep_verdict.verdict == Verdict.PASS:
        return None  # the exported program meets the criteria: the gap is the runtime's (or quantization's)
    found["finding"] = ("the runtime matches the exported program, but the output fails against eager: the exported "
                        "program already differs from the eager model (divergence at export, not at run time)")
    eager, ref = eager_model_of(manifest)
    if eager is None:
        found["error"] = ref
        return found
    found.update(localize(eager, exported, inputs, budget_db))
    found["eager_model"] = ref
    return found


def _nth(result: Any, index: int) -> Any:
    import torch

    flat: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            flat.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(result)
    return flat[index] if index < len(flat) else None


def check_model(resolved: Any, bisect_result: Any, report_dir: Any) -> dict[str, Any] | None:
    """For `bisect` when the case fails with nothing delegated: export the model as the recipes do
    and localize where it parts from eager on the case's inputs (None when it does not)."""
    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers on use

    step = next((s for s in bisect_result.steps if s.bundle), None)
    if resolved is None or step is None:
        return None
    try:
        bundle = read_bundle(step.bundle)
        # no case chosen (the run failed before bisect picked its first diverging step): case 0, as before
        index = bisect_result.case if bisect_result.case is not None else 0
        case = bundle.suite(bisect_result.method).test_cases[index]
        import torch

        inputs = tuple(torch.from_numpy(np.ascontiguousarray(v.to_array()).copy()).float()
                       if v.kind == "tensor" and v.to_array().dtype.kind == "f" else
                       (torch.from_numpy(np.ascontiguousarray(v.to_array()).copy()) if v.kind == "tensor" else v.scalar)
                       for v in case.inputs)
        exported = export_model(resolved.module, inputs)
        found = localize(resolved.module, exported, inputs)
    except (BundlerunError, KeyError, IndexError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return found if found.get("first_divergent") else None
