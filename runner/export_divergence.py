"""Divergence at export: the exported program already differs from the eager model.

`bundlerun debug` compares the runtime's intermediates with the *exported program's* (the
ETRecord's graph), so a model whose export differs from eager (code that takes another path while
`torch.compiler.is_exporting()`, a tracing-time constant, a dropped side effect) shows every layer
`ok` while its output fails against the eager reference the bundle holds. This module says so,
and where: the exported program is run on the case's inputs (node by node, torch.fx.Interpreter)
and the eager model with a forward hook on every submodule; each module's eager output is compared
with the value of its last node in the exported graph - the node whose `nn_module_stack` (what
ETRecord records for every node) ends the module's span - in the order the eager modules
finished, and the first module whose SQNR drops under the floor is where they part.

The floor is the output's SQNR budget (runner/debug.py `output_budget`, from its criteria), else
100 dB: bundlerun's own figure for "the same computation, float rounding apart" (eager and
exported programs run the same torch kernels; the debug tables of docs/debugging.md show
134-143 dB between them). Comparisons use ExecuTorch's ErrorStatistics formulas
(runner/compare.py).

It runs on the host, after whatever the target returned, so it is the same on every target.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DEFAULT_FLOOR_DB = 100.0


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
    from bundlerun.runner.compare import error_statistics

    if actual is None or expected is None or actual.size != expected.size:
        return None
    s = error_statistics(actual.reshape(expected.shape).astype(np.float64), expected.astype(np.float64))
    return {"sqnr": s.sqnr, "error_max": s.error_max, "error_mae": s.error_mae, "cosine": s.cosine_similarity}


def capture_eager(module: Any, inputs: tuple) -> list[tuple[str, str, np.ndarray]]:
    """(module path, class, first output) of every submodule call, in the order the calls finished."""
    import torch

    seen: list[tuple[str, str, np.ndarray]] = []
    done: set[str] = set()
    handles = []

    def hook(path: str, kind: str):
        def record(_mod: Any, _args: Any, output: Any) -> None:
            value = _numpy(output)
            if value is not None and path not in done:  # a module called twice: its first call
                done.add(path)
                seen.append((path, kind, value.copy()))
        return record

    for path, sub in module.named_modules():
        if path:
            handles.append(sub.register_forward_hook(hook(path, type(sub).__name__)))
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


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
    """module path -> its call_function nodes in graph order (from nn_module_stack)."""
    spans: dict[str, list[Any]] = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        for value in (node.meta.get("nn_module_stack") or {}).values():
            path = value[0] if isinstance(value, (tuple, list)) and value else None
            if path:
                spans.setdefault(str(path), []).append(node)
    return spans


def localize(eager: Any, exported_program: Any, inputs: tuple, floor_db: float | None = None) -> dict[str, Any]:
    """Compare eager with the exported program module by module (see the module docstring)."""
    from bundlerun.bundles.partition_control import source_line

    floor = DEFAULT_FLOOR_DB if floor_db is None else float(floor_db)
    gm = exported_program.module()
    values, out = capture_graph(gm, inputs)
    import torch

    with torch.no_grad():
        eager_out = eager(*inputs)
    spans = module_spans(gm)
    layers: list[dict[str, Any]] = []
    first = None
    for path, kind, value in capture_eager(eager, inputs):
        nodes = spans.get(path)
        if not nodes:
            layers.append({"module": path, "type": kind, "node": None, "status": "no node in the exported graph"})
            continue
        last = next((n for n in reversed(nodes) if _numpy(values.get(n.name)) is not None), None)
        stats = _stats(_numpy(values.get(last.name)) if last is not None else None, value)
        row = {"module": path, "type": kind, "node": last.name if last is not None else None, **(stats or {})}
        if stats is None:
            row["status"] = "not comparable (shape)"
        else:
            sqnr = stats["sqnr"]
            row["status"] = "ok" if (sqnr is None or sqnr >= floor or (isinstance(sqnr, float) and math.isinf(sqnr)
                                                                     and sqnr > 0)) else "diverges"
        if row["status"] == "diverges" and first is None:
            first = dict(row)
            first["nodes"] = [{"node": n.name, "op": str(getattr(n.target, "__name__", n.target)),
                               "source": source_line(n.meta.get("stack_trace"))} for n in nodes]
            first["source"] = source_line(last.meta.get("stack_trace")) if last is not None else None
            row["status"] = "FIRST DIVERGENT"
        layers.append(row)
    return {
        "compared": "eager model (forward hooks per module) vs the exported program (node values, by nn_module_stack)",
        "floor_db": floor,
        "output": _stats(_numpy(out), _numpy(eager_out)),
        "first_divergent": first,
        "layers": layers,
    }


def summary_line(found: dict[str, Any]) -> str:
    """One line: where eager and the exported program part (or that they do not)."""
    first = found.get("first_divergent")
    out = found.get("output") or {}
    tail = f"; at the output SQNR {_f(out.get('sqnr'))} dB, max error {_f(out.get('error_max'), '.3g')}" if out else ""
    if found.get("error"):
        return f"not localized: {found['error']}"
    if not first:
        return f"the exported program matches eager at every module (floor {found.get('floor_db'):g} dB){tail}"
    src = f" ({first['source']})" if first.get("source") else ""
    return (f"eager and the exported program part first at {first['module']} ({first['type']}), node {first['node']}"
            f"{src}: SQNR {_f(first.get('sqnr'))} dB < floor {found.get('floor_db'):g} dB, max error "
            f"{_f(first.get('error_max'), '.3g')}{tail}")


def print_divergence(found: dict[str, Any], console: Any) -> None:
    """The eager-vs-exported table (console), the finding and the first divergent module's nodes."""
    from rich.table import Table

    from bundlerun.runner.report.console import plain

    console.print(found.get("finding", ""), markup=False)
    layers = found.get("layers") or []
    if layers:
        table = Table(title="eager vs exported program, per module", title_justify="left")
        for col in ("module", "type", "exported node", "SQNR dB", "max err", "status"):
            table.add_column(col, justify="right" if col in ("SQNR dB", "max err") else "left")
        for row in layers:
            table.add_row(plain(row.get("module")), plain(row.get("type")), plain(row.get("node") or "—"),
                          _f(row.get("sqnr")), _f(row.get("error_max"), ".3g"), plain(row.get("status")))
        console.print(table)
    first = found.get("first_divergent") or {}
    for node in first.get("nodes") or []:
        console.print(f"  {first['module']}: node {node['node']} ({node['op']})"
                      + (f" at {node['source']}" if node.get("source") else ""), markup=False)


def _f(v: Any, fmt: str = ".1f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


# ------------------------------------------------------------------ callers


def eager_model_of(manifest: dict[str, Any] | None) -> tuple[Any, str]:
    """The bundle's eager model, reloaded from its recorded source (zoo name or factory file), or
    (None, why not)."""
    model = (manifest or {}).get("model") or {}
    source, ident = str(model.get("source") or ""), model.get("id")
    ref = None
    if source.startswith("factory:"):
        ref = source[len("factory:"):]
    elif source == "zoo" or (ident and not source):
        ref = ident
    if not ref:
        return None, f"the manifest records no model source to reload the eager model from ({source!r})"
    from bundlerun.bundles.errors import BundlerunError
    from bundlerun.bundles.model_source import resolve_model

    try:
        return resolve_model(str(ref)).module, str(ref)
    except BundlerunError as exc:
        return None, f"the eager model {ref} could not be reloaded: {exc}"


def check_debug(manifest: dict[str, Any] | None, record: Any, inputs: tuple, quantized: bool,
                runtime_output: np.ndarray | None, expected: np.ndarray, criteria: Any,
                budget_db: float | None, output_index: int) -> dict[str, Any] | None:
    """For `debug` when no layer exceeds: does the runtime output fail against eager while it matches
    the exported program? Then localize where eager and the exported program part."""
    from bundlerun.runner.compare import judge_output

    if runtime_output is None:
        return None
    exported = record.exported_program
    if quantized and record.graph_map and "eager_fp32/forward" in record.graph_map:
        exported = record.graph_map["eager_fp32/forward"]
    if exported is None:
        return None
    dtype = str(expected.dtype)
    verdict = judge_output(runtime_output.reshape(expected.shape), expected, criteria, dtype, dtype)
    if verdict.verdict == "PASS":
        return None
    import torch

    with torch.no_grad():
        ep_out = _numpy(_nth(exported.module()(*inputs), output_index))
    vs_exported = _stats(runtime_output, ep_out)
    found: dict[str, Any] = {"runtime_vs_eager": _stats(runtime_output, expected), "runtime_vs_exported": vs_exported,
                             "exported_vs_eager": _stats(ep_out, expected)}
    ep_verdict = judge_output(ep_out.reshape(expected.shape), expected, criteria, dtype, dtype) \
        if ep_out is not None and ep_out.size == expected.size else None
    if quantized or ep_verdict is None or ep_verdict.verdict == "PASS":
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
    from bundlerun.bundles.backends.common import export_model
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.errors import BundlerunError

    step = next((s for s in bisect_result.steps if s.bundle), None)
    if resolved is None or step is None:
        return None
    try:
        bundle = read_bundle(step.bundle)
        case = bundle.suite(bisect_result.method).test_cases[bisect_result.case]
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
