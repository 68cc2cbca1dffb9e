"""`bundlerun debug`: from a failing output to the first layer that went wrong.

1. The case: `--case`, else the worst failing case of the newest recorded run of this
   exact bundle file (history, read only), else case 0.
2. The target runs that case with every intermediate output (targets/intermediates.py).
3. Each runtime intermediate is mapped to the eager graph through the bundle's ETRecord
   (bundles/etrecord.py) the way ExecuTorch's Inspector does it: instruction id ->
   debug handles (the ETRecord's debug handle map), overlapping handles merged
   (`merge_runtime_overlapping_debug_handles`), the reference graph run on the case's
   inputs with `IntermediateOutputCapturer`, runtime and AOT outputs paired by
   `map_runtime_aot_intermediate_outputs` (executorch.devtools.inspector). The
   reference graph is the ETRecord's exported (ATen) program when debug handles
   propagate back to it, else its edge dialect program - as `calculate_numeric_gap`.
4. Every pair gets our ErrorStatistics (runner/judging/numerics.py): SQNR, max error, cosine.
   Columns: `fp32` (vs the float eager model) and, for quantized builds, `quantized`
   (vs the fake-quantized reference = the exported program of an int8 build) plus
   `quant_vs_fp32` (what quantization alone costs at that layer). The fp32 graph of a
   quantized build is matched by node name (PT2E keeps them); a conv whose batch norm
   quantization folded away is compared with that batch norm's output.
5. Budget: the chosen output's SQNR budget - its `sqnr_min_db` if set, else the SQNR
   its atol/rtol allow at the output's RMS: 20*log10(rms / (atol + rtol*rms)). Noise
   adds up along the graph, so compared row k of N gets floor(k) = budget +
   10*log10(N/k) dB (an equal share of the error power per layer). The first row under
   its floor, in the column the bundle's reference names (fp32 for eager-fp32, quantized
   for a quantized reference), is the first bad layer. Attribution (quantized builds):
   `lowering` when the runtime already misses the quantized reference there,
   `quantization` when it matches the quantized reference but both miss fp32.
6. A runtime operator with no eager counterpart is a row with status `unmatched`
   (never dropped); one folded into a later instruction's debug handle says which.
7. Operators inside a delegate call (kind "delegate-op": TOSA operators on tosa://,
   MLX instructions on mlx://) are mapped through the delegate graphs `build
   --etrecord` recorded (bundles/etrecord.py, `<stem>.delegates.json`): a TOSA tensor
   is named after the Arm backend's FX node that produced it (`tosa_conv2d_default_1`,
   a node of the graph after the Arm passes - not in the ETRecord, which is why it is
   recorded), and that node keeps the edge graph's debug handle; an MLX instruction
   is mapped by (chain, index) to the FX node it was emitted for. Per debug handle,
   the last operator of the call carrying it holds the group's value and is compared
   with the reference graph's output for that handle - or for the handle of the
   furthest node the backend folded into the group (a ReLU, a quantize after a conv:
   `absorbed`); integer tensors are dequantized with the scale / zero point recorded
   per tensor (an int32 accumulator: input x weight scale; a RESCALE output: input
   scale / its factor) and channels-last tensors transposed back. A convolution
   before its RESCALE is compared too (its accumulator is the conv's output); other
   operators inside a group (layout transposes, the pieces of a decomposition) are
   `unmatched` rows that say where their group is compared.

Over 500 lines on purpose: the steps above are one search (reference capture, handle matching,
delegate mapping, first divergence) over the same few records; split by step they would pass
them all around. The report formats of `debug` are runner/debug/localize_report.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bundlerun.bundles.manifest_records import BuildInfo
from bundlerun.bundles.errors import BundlerunError
from bundlerun.targets.base import Verdict
from bundlerun.bundles.manifest import Manifest
from bundlerun.bundles.backends.common import quiet_framework_logs
from bundlerun.bundles.etrecord import EtrecordMissing, FP32_GRAPH, load_delegate_graphs, locate
from bundlerun.bundles.fileio import file_sha256
from bundlerun.bundles.sequence import first_failing_step, from_manifest, sequence_prefix
from bundlerun.runner.debug.export_divergence import capture_graph, check_debug
from bundlerun.runner.judging.numerics import _clean, error_statistics
from bundlerun.targets.intermediates import IntermediatesUnsupported, capture, supports_capture, unsupported_message
from bundlerun.targets.workers.host import _register_kernels

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

_QDQ = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel", "dequantize_per_channel",
        "choose_qparams")


class DebugError(BundlerunError):
    """debug could not run (no ETRecord, no such case, target cannot dump intermediates)."""


@dataclass
class Column:
    sqnr: float | None = None
    error_max: float | None = None
    error_mae: float | None = None
    cosine: float | None = None

    @classmethod
    def of(cls, actual: np.ndarray | None, expected: np.ndarray | None) -> "Column | None":
        if actual is None or expected is None:
            return None
        a, r = np.asarray(actual), np.asarray(expected)
        if a.shape != r.shape:
            if a.size != r.size:
                return None
            a = a.reshape(r.shape)
        if a.dtype.kind in "iub" or r.dtype.kind in "iub":
            a, r = a.astype(np.float64), r.astype(np.float64)
        s = error_statistics(a, r)
        return cls(s.sqnr, s.error_max, s.error_mae, s.cosine_similarity)


@dataclass
class LayerRow:
    index: int
    instruction: int | None
    kind: str
    runtime_op: str
    status: str  # "matched" | "unmatched"
    aot_ops: list[str] = field(default_factory=list)
    debug_handles: list[int] = field(default_factory=list)
    shape: list[int] = field(default_factory=list)
    dtype: str | None = None
    fp32: Column | None = None
    quantized: Column | None = None
    quant_vs_fp32: Column | None = None
    floor_db: float | None = None
    exceeds: bool = False
    attribution: str | None = None
    note: str | None = None
    delegate_op: int | None = None  # kind "delegate-op": operator / instruction index inside the delegate payload
    tensor: str | None = None  # kind "delegate-op": its output tensor (TOSA) or slot (MLX)
    compared_at: int | None = None  # a step inside a delegate group: the row where the group's value is compared
    module: str | None = None  # innermost eager module of its eager op(s) (nn_module_stack), e.g. layers.1.feed_forward.w2

    def judged(self, column: str) -> Column | None:
        return getattr(self, column)


@dataclass
class DebugResult:
    bundle: str
    target: str
    method: str
    case: int
    case_source: str
    output: str
    granularity: str
    reference_graph: str
    judged_column: str
    budget_db: float | None
    budget_source: str
    rows: list[LayerRow]
    first_bad: int | None  # index into rows
    output_stats: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    model: str | None = None
    dtype: str | None = None
    backend: str | None = None
    export_divergence: dict[str, Any] | None = None  # runner/debug/export_divergence.py: eager vs the exported program

    @property
    def first_bad_row(self) -> LayerRow | None:
        return None if self.first_bad is None else self.rows[self.first_bad]

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["first_bad_layer"] = None
        if self.first_bad_row is not None:
            r = self.first_bad_row
            body["first_bad_layer"] = {"row": r.index, "instruction": r.instruction, "delegate_op": r.delegate_op,
                                       "runtime_op": r.runtime_op, "aot_ops": r.aot_ops, "attribution": r.attribution,
                                       "module": r.module}
        body["unmatched"] = sum(1 for r in self.rows if r.status == "unmatched")
        return {"schema": "bundlerun.debug/1", **_clean(body)}


# ------------------------------------------------------------------ choosing the case


def default_case(bundle_path: Path, history_db: Any, method: str, output: str | None) -> tuple[int, str]:
    """(case, where it came from): the worst failing case of the newest run of this bundle file."""

    from bundlerun.runner.history import store as history  # start-up: loads sqlalchemy on use

    if history_db is None or not history.exists(history_db):
        return 0, "case 0 (no history database to find the last run's worst case)"
    sha = file_sha256(bundle_path)
    run_id = history.newest_run_of_bundle(history_db, sha)
    if run_id is None:
        return 0, "case 0 (this bundle has no recorded run)"
    report = history.load_report(history_db, run_id)
    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers on use

    sequences = from_manifest(read_bundle(bundle_path).manifest)
    if sequences:  # a sequence: its first diverging step (later steps inherit the damage through the cache)
        failing = {c.case for c in report.cases if c.method == method
                   and any(o.verdict == Verdict.FAIL and (output is None or o.name == output) for o in c.outputs)}
        first = first_failing_step(sequences, method, failing)
        if first is not None:
            return first, f"first diverging step of its sequence in run #{run_id}"
    worst = worst_failing_case(report, method, output)
    if worst is None:
        return 0, f"case 0 (run #{run_id} of this bundle has no failing case)"
    return worst, f"worst failing case of run #{run_id}"


def worst_failing_case(report: "Report", method: str = "forward", output: str | None = None) -> int | None:
    """The failing case of `report` with the lowest SQNR (then the largest max error), or None."""
    worst: tuple[tuple, int] | None = None
    for case in report.cases:
        if case.method != method:
            continue
        for out in case.outputs:
            if output is not None and out.name != output:
                continue
            if out.verdict != Verdict.FAIL:
                continue
            sqnr = out.stats.sqnr if out.stats else None
            sqnr = sqnr if isinstance(sqnr, (int, float)) else math.inf
            err = out.stats.error_max if out.stats else None
            err = err if isinstance(err, (int, float)) else 0.0
            key = (sqnr, -err)
            if worst is None or key < worst[0]:
                worst = (key, case.case)
    return None if worst is None else worst[1]


# ------------------------------------------------------------------ budget


def output_budget(manifest: Manifest | None, method: str, output: str, expected: np.ndarray) -> tuple[float | None, str]:
    """The output's error budget as an SQNR in dB: the strictest of what its criteria allow -
    sqnr_min_db itself; rel_frobenius_max f: -20*log10(f); cosine_min c: -10*log10(2*(1-c)) (small
    errors); atol/rtol (+ qtol steps): 20*log10(rms / (atol + rtol*rms)) at the expected output's rms."""
    outs = manifest.methods[method].outputs if manifest and method in manifest.methods else []
    spec = next((o for o in outs if o.name == output), None)
    crit = spec.criteria.to_dict() if spec else {"atol": 1e-3, "rtol": 1e-3}
    num = lambda k: crit.get(k) if isinstance(crit.get(k), (int, float)) else None  # noqa: E731
    found: list[tuple[float, str]] = []
    if num("sqnr_min_db") is not None:
        found.append((float(crit["sqnr_min_db"]), f"sqnr_min_db={crit['sqnr_min_db']:g}"))
    if num("rel_frobenius_max") is not None and crit["rel_frobenius_max"] > 0:
        found.append((-20 * math.log10(crit["rel_frobenius_max"]), f"rel_frobenius_max={crit['rel_frobenius_max']:g}"))
    if num("cosine_min") is not None and crit["cosine_min"] < 1:
        found.append((-10 * math.log10(2 * (1 - crit["cosine_min"])), f"cosine_min={crit['cosine_min']:g}"))
    atol = (num("atol") or 0.0) + (num("qtol") or 0.0) * (num("scale") or 0.0)
    rtol = num("rtol") or 0.0
    rms = float(np.sqrt(np.mean(np.square(expected.astype(np.float64))))) if expected.size else 0.0
    if rms > 0 and atol + rtol * rms > 0:
        found.append((20 * math.log10(rms / (atol + rtol * rms)), f"atol={atol:g} rtol={rtol:g} at rms {rms:.3g}"))
    if not found:
        return None, f"{output}: no SQNR budget (its criteria set no error bound this can split)"
    budget, source = max(found)
    return budget, f"{output} {source} (strictest of: {', '.join(f'{t} -> {b:.1f} dB' for b, t in found)})"


# ------------------------------------------------------------------ mapping


def _to_torch(a: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a).copy())


def _to_numpy(v: Any) -> np.ndarray | None:
    import torch

    if isinstance(v, torch.Tensor):
        v = v.detach()
        if v.dtype == torch.bfloat16:
            v = v.float()
        return v.contiguous().numpy()
    if isinstance(v, (list, tuple)):
        first = next((x for x in v if isinstance(x, torch.Tensor)), None)
        return _to_numpy(first) if first is not None else None
    if isinstance(v, (int, float, bool)):
        return np.asarray(v)
    return None


def _reference_graph(record) -> tuple[Any, str]:
    from executorch.devtools.inspector._inspector_utils import propagate_back_debug_handle

    try:
        if record.exported_program is not None and propagate_back_debug_handle(
                record.exported_program, record.export_graph_id, record.edge_dialect_program):
            return record.exported_program.module(), "exported_program"
    except Exception:  # noqa: BLE001 - fall back like Inspector does
        pass
    return record.edge_dialect_program.module(), "edge_dialect_exported_program"


def _capture_by_name(graph_module, inputs: tuple) -> dict[str, Any]:
    """Every call_function node's output of `graph_module` on `inputs`, by node name."""

    return capture_graph(graph_module, inputs)[0]


def _fp32_counterpart(fp32_gm, name: str) -> str | None:
    """The fp32 graph node that holds what node `name` of the quantized graph computes."""
    nodes = {n.name: n for n in fp32_gm.graph.nodes}
    node = nodes.get(name)
    if node is None:
        return None
    users = list(node.users)
    if len(users) == 1 and "batch_norm" in str(users[0].target):  # folded into the conv by PT2E
        return users[0].name
    return name


def _fill_columns(row: "LayerRow", actual: Any, reference: Any, names: list[str], quantized: bool, fp32_gm: Any,
                  fp32_values: dict[str, Any]) -> None:
    """A matched row's columns: vs the reference graph's value (the quantized reference of an int8
    build, whose fp32 counterpart adds the fp32 and quantization-alone columns), else fp32."""
    if not quantized:
        row.fp32 = Column.of(actual, reference)
        return
    row.quantized = Column.of(actual, reference)
    main = _main_op(names)
    fp32_name = _fp32_counterpart(fp32_gm, main) if (fp32_gm is not None and main) else None
    fp32_ref = _to_numpy(fp32_values.get(fp32_name)) if fp32_name else None
    row.fp32 = Column.of(actual, fp32_ref)
    row.quant_vs_fp32 = Column.of(reference, fp32_ref)
    if fp32_name and fp32_name != main:
        row.note = "; ".join(filter(None, [row.note, f"fp32 counterpart: {fp32_name} (folded into {main} by "
                                                     "quantization)"]))


def _main_op(aot_ops: list[str]) -> str | None:
    """The compute node of a fused group: the last one that is not a quantize/dequantize."""
    for name in reversed(aot_ops):
        if not any(q in name for q in _QDQ):
            return name
    return None


def _program_ops(program: bytes, method: str) -> dict[tuple[int, int], str]:
    """(chain, instruction) -> operator name ("aten::convolution.out", "delegate:XnnpackBackend")."""
    from executorch.exir import schema as S
    from executorch.exir._serialize._program import deserialize_pte_binary

    prog = deserialize_pte_binary(bytes(program)).program
    plan = next(p for p in prog.execution_plan if p.name == method)
    names = {}
    for c, chain in enumerate(plan.chains):
        for i, ins in enumerate(chain.instructions):
            a = ins.instr_args
            if isinstance(a, S.KernelCall):
                op = plan.operators[a.op_index]
                names[(c, i)] = f"{op.name}.{op.overload}" if op.overload else op.name
            elif isinstance(a, S.DelegateCall):
                names[(c, i)] = f"delegate:{plan.delegates[a.delegate_index].id}"
    return names


# a convolution's output inside its group (before the RESCALE that requantizes it) is the eager conv's value
_COMPLETE_STEPS = ("tosa.CONV2D", "tosa.DEPTHWISE_CONV2D", "tosa.CONV3D", "tosa.TRANSPOSE_CONV2D")


def _squeezed(shape) -> tuple:
    return tuple(int(d) for d in shape if int(d) != 1)


def _delegate_value(array: np.ndarray, node: dict) -> tuple[np.ndarray | None, str | None]:
    """A delegate operator's output in the eager graph's terms: dequantized with the scale / zero point
    recorded for its tensor, channels-last transposed back. (value, None) or (None, why not)."""
    a = np.asarray(array)
    if a.dtype.kind in "iu" and "scale" in node:
        scale = np.asarray(node["scale"], dtype=np.float64)
        zp = np.asarray(node.get("zero_point", 0), dtype=np.float64)
        if scale.ndim and a.ndim and scale.shape[0] != a.shape[-1]:
            return None, f"its {scale.shape[0]} per-channel scales do not fit its shape {list(a.shape)}"
        a = ((a.astype(np.float64) - zp) * scale).astype(np.float32)
    elif a.dtype.kind in "iu" and str(node.get("op", "")).startswith("tosa."):
        return None, (f"no quantization scale is known for this {a.dtype} tensor (the Arm backend graph gives "
                      "none), so it cannot be compared with the float eager graph")
    perm = node.get("layout")
    if perm and len(perm) == a.ndim:
        a = np.ascontiguousarray(a.transpose(np.argsort(perm)))
    return a, None


def _find_delegate_graph(graphs: dict | None, reason: str, items: list) -> tuple[dict | None, str]:
    """The recorded graph of one delegate call's operators, or (None, why none fits)."""
    if graphs is None:
        return None, reason
    backend = items[0].info.get("backend")
    candidates = [g for g in graphs.get("graphs") or [] if g.get("backend") == backend]
    errors = "; ".join(graphs.get("errors") or [])
    if not candidates:
        return None, (f"the build recorded no {backend} graph" + (f" ({errors})" if errors else ""))
    if backend == "MLXBackend":
        digest = items[0].info.get("digest")
        found = next((g for g in candidates if g.get("digest") == digest), None)
        return (found, "") if found else (None, "no recorded MLX instruction map has this payload's instructions "
                                                "(another build's delegate graphs?)")
    names = [i.name for i in items]
    best = max(candidates, key=lambda g: sum(1 for n in names if n in (g.get("nodes") or {})))
    if not any(n in (best.get("nodes") or {}) for n in names):
        return None, "none of this delegate's TOSA tensors is in the recorded Arm backend graphs (another build's?)"
    return best, ""


def _delegate_node(graph: dict, item) -> dict | None:
    if graph.get("backend") == "MLXBackend":
        chain = item.info.get("chain", 0)
        return next((dict(i, op=f"mlx.{i['op']}") for i in graph.get("instructions") or []
                     if i["chain"] == chain and i["index"] == item.delegate_op), None)
    nodes = graph.get("nodes") or {}
    if item.name in nodes:
        return dict(nodes[item.name], node=item.name)
    # an extra tensor the serializer derived from a node's name (e.g. "<node>_<suffix>"): the longest such node
    prefix = max((n for n in nodes if item.name and item.name.startswith(n + "_")), key=len, default=None)
    return dict(nodes[prefix], node=prefix) if prefix else None


def compare_delegate_ops(pairs: list, graphs: dict | None, reason: str, ref_gm, case_inputs: tuple, aot: dict,
                         aot_names: dict, quantized: bool, fp32_gm, fp32_values: dict) -> None:
    """Map and compare the rows of operators inside delegate calls (module docstring, item 7)."""
    by_call: dict[tuple[int, int], list] = {}
    for row, item in pairs:
        by_call.setdefault((item.chain, item.instruction), []).append((row, item))
    ref_values: dict[str, Any] | None = None
    for members in by_call.values():
        graph, why = _find_delegate_graph(graphs, reason, [item for _r, item in members])
        nodes = [(row, item, _delegate_node(graph, item) if graph else None) for row, item in members]
        last: dict[int, LayerRow] = {}
        for row, _item, node in nodes:
            if node is not None and node.get("debug_handle") is not None:
                last[int(node["debug_handle"])] = row
        absorbed = {int(k): int(v) for k, v in ((graph or {}).get("absorbed") or {}).items()}
        for row, item, node in nodes:
            if node is None:
                row.note = why or (f"{item.name or row.runtime_op} is not in the recorded "
                                   f"{item.info.get('backend', 'delegate')} graph")
                continue
            where = node.get("node") or item.name
            h = node.get("debug_handle")
            if h is None:
                row.note = f"{where} carries no debug handle back to the eager graph"
                continue
            h = int(h)
            row.debug_handles = [h]
            if not item.outputs:
                row.note = "this instruction writes no tensor (value-slot arithmetic or control flow)"
                continue
            roots = [r for r in node.get("roots") or []]
            keeper = last[h]
            if keeper is row:
                key = absorbed.get(h, h)
                reference = aot.get((key,))
                names = list(aot_names.get((key,), []))
                if key != h:
                    row.note = (f"the backend folded {', '.join(names) or f'debug handle {key}'} into this group: "
                                "compared with its output")
            elif row.runtime_op in _COMPLETE_STEPS and roots:
                if ref_values is None:
                    ref_values = _capture_by_name(ref_gm, tuple(case_inputs))
                reference = ref_values.get(roots[0])
                names = [roots[0]]
            else:
                row.compared_at = keeper.index
                row.note = (f"a step inside the group of {', '.join(roots) or where} (backend node {where}): no eager "
                            f"node holds this value; the group's output is compared at row {keeper.index} "
                            f"({keeper.runtime_op})")
                continue
            if reference is None:
                row.note = f"the reference graph has no value for {', '.join(names) or f'debug handle {h}'}"
                continue
            actual, problem = _delegate_value(item.outputs[0], node)
            if actual is None:
                row.note = problem
                continue
            expected = _to_numpy(reference)
            if expected is not None and expected.dtype.kind in "iu" and "scale" in node and np.ndim(node["scale"]) == 0:
                # the reference graph's quantize node: its integer output, in the same quantization as this tensor
                expected = ((expected.astype(np.float64) - float(node.get("zero_point", 0))) * float(node["scale"])
                            ).astype(np.float32)
            if expected is None or _squeezed(actual.shape) != _squeezed(expected.shape):
                row.note = (f"its value {list(actual.shape)} does not line up with the eager value "
                            f"{list(expected.shape) if expected is not None else '(none)'} of "
                            f"{', '.join(names) or h}")
                continue
            actual = actual.reshape(expected.shape)
            row.status = "matched"
            row.aot_ops = [r for r in roots if r not in names] + names
            row.shape, row.dtype = list(actual.shape), str(actual.dtype)
            _fill_columns(row, actual, expected, names, quantized, fp32_gm, fp32_values)


def _module_of(graph_module: Any, names: list[str]) -> str | None:
    """The innermost module path (nn_module_stack) of the last of `names` that has one: which layer of the
    eager model a row computes (an LLM's ops are all `linear_N`; the module says `layers.1.feed_forward.w2`)."""
    nodes = {n.name: n for n in graph_module.graph.nodes}
    for name in reversed(names):
        stack = getattr(nodes.get(name), "meta", {}).get("nn_module_stack")
        if isinstance(stack, dict) and stack:
            value = list(stack.values())[-1]
            path = value[0] if isinstance(value, (tuple, list)) and value else None
            if path:
                return str(path)
    return None


def _replay(graph_module: Any, prefix_inputs: list[tuple]) -> None:
    """Run a stateful sequence's earlier steps through the reference graph first: its buffers (the KV
    cache) then hold what the target's did when it ran the captured step."""
    import torch

    for step in prefix_inputs:
        torch.fx.Interpreter(graph_module).run(*step)


def compare_layers(run, record, case_inputs: tuple, method: str, quantized: bool, delegate_graphs: dict | None = None,
                   delegate_graphs_reason: str = "", prefix_inputs: list[tuple] | None = None,
                   ) -> tuple[list[LayerRow], str]:
    """One row per runtime intermediate, in execution order, with its comparison columns. `prefix_inputs`:
    the earlier steps of a stateful sequence, replayed through the reference graph(s) before the case."""
    import torch
    from executorch.devtools.inspector._inspector_utils import (
        get_aot_debug_handle_to_op_name_mapping,
        map_runtime_aot_intermediate_outputs,
        merge_runtime_overlapping_debug_handles,
    )
    from executorch.devtools.inspector._intermediate_output_capturer import IntermediateOutputCapturer

    ref_gm, ref_name = _reference_graph(record)
    with torch.no_grad():
        _replay(ref_gm, prefix_inputs or [])
        aot = IntermediateOutputCapturer(ref_gm).run_and_capture([tuple(case_inputs)])
    aot_names = get_aot_debug_handle_to_op_name_mapping(ref_gm)

    handle_map = (record._debug_handle_map or {}).get(method) or {}
    rows: list[LayerRow] = []
    runtime: dict[tuple, tuple[int, Any, int]] = {}
    by_handles: dict[tuple, int] = {}
    inner: list[tuple[LayerRow, Any]] = []  # operators inside delegate calls: mapped by compare_delegate_ops
    for item in run.intermediates:
        first = item.outputs[0] if item.outputs else None
        row = LayerRow(len(rows), item.instruction, item.kind, item.op, "unmatched",
                       shape=list(first.shape) if first is not None else [],
                       dtype=str(first.dtype) if first is not None else None)
        rows.append(row)
        if item.kind == "delegate-op":
            row.delegate_op, row.tensor = item.delegate_op, item.name
            inner.append((row, item))
            continue
        handles = handle_map.get(item.instruction, handle_map.get(str(item.instruction)))
        if handles is None or not item.outputs:
            row.note = ("no debug handle for this instruction in the ETRecord" if handles is None
                        else "the target returned no output for it")
            continue
        key = (handles,) if isinstance(handles, int) else tuple(int(h) for h in handles)
        row.debug_handles = list(key)
        value = [_to_torch(a) for a in item.outputs]
        if key in runtime and runtime[key][0] > item.instruction:
            continue
        outs_map = (record._instruction_id_to_num_outs_map or {}).get(method) or {}
        num = outs_map.get(item.instruction, 1)
        runtime[key] = (item.instruction, value, num if isinstance(num, int) else len(num))  # as Inspector's events
        by_handles[key] = row.index
    merged = merge_runtime_overlapping_debug_handles(runtime)
    # which row each merged runtime key is (the highest instruction of the merged group)
    merged_row: dict[tuple, int] = {}
    for mkey, (instr, _v, _n) in merged.items():
        merged_row[mkey] = next(r.index for r in rows if r.instruction == instr and r.debug_handles
                                and r.kind != "delegate-op" and set(r.debug_handles) <= set(mkey))
    mapping = map_runtime_aot_intermediate_outputs(aot, {k: (v[1], v[2]) for k, v in merged.items()})

    fp32_values: dict[str, Any] = {}
    fp32_gm = None
    if quantized and record.graph_map and f"{FP32_GRAPH}/forward" in record.graph_map:
        fp32_gm = record.graph_map[f"{FP32_GRAPH}/forward"].module()
        _replay(fp32_gm, prefix_inputs or [])
        fp32_values = _capture_by_name(fp32_gm, tuple(case_inputs))

    for (aot_key, aot_value), (rt_key, rt_value) in mapping.items():
        index = merged_row.get(tuple(rt_key))
        if index is None:
            continue
        row = rows[index]
        names: list[str] = []
        for h in aot_key:
            names += aot_names.get((h,), [])
        row.status = "matched"
        row.aot_ops = names or [f"debug handle {h}" for h in aot_key]
        actual, reference = _to_numpy(rt_value), _to_numpy(aot_value)
        if actual is not None:  # the value compared (a delegate call's event may log its inputs too)
            row.shape, row.dtype = list(actual.shape), str(actual.dtype)
        _fill_columns(row, actual, reference, names, quantized, fp32_gm, fp32_values)
        row.module = _module_of(ref_gm, names)
    if inner:
        compare_delegate_ops(inner, delegate_graphs, delegate_graphs_reason, ref_gm, case_inputs, aot, aot_names,
                             quantized, fp32_gm, fp32_values)
    # rows whose debug handles were merged into another instruction's group were compared there
    for row in rows:
        if row.kind == "delegate-op":
            continue
        if row.status == "unmatched" and row.debug_handles and row.note is None:
            group = next((k for k in merged_row if set(row.debug_handles) <= set(k)), None)
            keeper = rows[merged_row[group]] if group is not None else None
            if keeper is not None and keeper is not row:
                row.note = (f"its debug handles overlap instruction {keeper.instruction} ({keeper.runtime_op}), "
                            f"merged as the Inspector does and compared there" + ("" if keeper.status == "matched"
                                                                                 else " (which is unmatched too)"))
                if row.kind == "delegate" and keeper.status == "matched":
                    keeper.note = "; ".join(filter(None, [keeper.note, f"covers {row.runtime_op} (instruction "
                                                          f"{row.instruction}): its outputs are compared here"]))
            else:
                row.note = "no operator of the eager graph produces this value"
    return rows, ref_name


def judge_rows(rows: list[LayerRow], column: str, budget: float | None, quantized: bool) -> int | None:
    """Set each compared row's floor and verdict; the index of the first bad row."""
    judged = [r for r in rows if r.status == "matched" and r.judged(column) is not None
              and r.judged(column).sqnr is not None and r.dtype not in ("int8", "uint8", "int16", "int32", "int64")]
    n = len(judged)
    first = None
    for k, row in enumerate(judged, start=1):
        if budget is None:
            continue
        row.floor_db = budget + 10 * math.log10(n / k)
        sqnr = row.judged(column).sqnr
        row.exceeds = sqnr < row.floor_db
        if quantized and row.quantized is not None and row.quantized.sqnr is not None:
            lowering_bad = row.quantized.sqnr < row.floor_db
            if row.exceeds or lowering_bad:
                row.attribution = "lowering" if lowering_bad else "quantization"
        if row.exceeds and first is None:
            first = row.index
    return first


# ------------------------------------------------------------------ the command's core


def debug_bundle(bundle_path: Path, target: str, case: int | None = None, output: str | None = None,
                 method: str = "forward", work_dir: Path | None = None, history_db: Path | None = None,
                 timeout_s: float = 600.0, debug_buffer_mb: int = 64,
                 target_config: dict[str, Any] | None = None) -> DebugResult:
    """Run one case with every intermediate output and name the first layer over its budget. The target's
    dumps (tens of MB a case) go to `work_dir`, kept; without one, to a temporary folder removed on return:
    the result holds what was read from them, never their paths."""
    import tempfile

    if work_dir is not None:
        return _debug_bundle(bundle_path, target, case, output, method, Path(work_dir), history_db, timeout_s,
                             debug_buffer_mb, target_config)
    with tempfile.TemporaryDirectory(prefix="bundlerun-debug-") as tmp:
        return _debug_bundle(bundle_path, target, case, output, method, Path(tmp), history_db, timeout_s,
                             debug_buffer_mb, target_config)


def _debug_bundle(bundle_path: Path, target: str, case: int | None, output: str | None, method: str, work: Path,
                  history_db: Path | None, timeout_s: float, debug_buffer_mb: int,
                  target_config: dict[str, Any] | None) -> DebugResult:
    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers on use

    bundle_path = Path(bundle_path)
    bundle = read_bundle(bundle_path)
    manifest = bundle.manifest

    if not supports_capture(target):  # say so (and point to `bisect`) before asking for an ETRecord
        raise IntermediatesUnsupported(unsupported_message(target))
    try:
        et_path = locate(manifest, bundle_path)
    except EtrecordMissing as exc:
        raise DebugError(str(exc)) from None
    try:
        suite = bundle.suite(method)
    except KeyError:
        raise DebugError(f"{bundle_path} has no method {method!r}") from None
    out_specs = manifest.methods[method].outputs if manifest and method in manifest.methods else []
    out_names = [o.name for o in out_specs] or [f"out{j}" for j in range(len(suite.test_cases[0].expected_outputs))]
    if output is not None and output not in out_names:
        raise DebugError(f"{bundle_path} has no output {output!r}; it has {', '.join(out_names)}")
    if case is None:
        case, case_source = default_case(bundle_path, history_db, method, output)
    else:
        case_source = "--case"
    if not 0 <= case < len(suite.test_cases):
        raise DebugError(f"{bundle_path} has cases 0-{len(suite.test_cases) - 1}, not {case}")
    output = output or out_names[0]
    j = out_names.index(output)

    sequence, prefix = sequence_prefix(from_manifest(manifest), method, case)
    if any(not 0 <= k < len(suite.test_cases) for k in prefix):  # the manifest names cases the suite lacks
        raise DebugError(f"{bundle_path}: sequence {sequence.name if sequence else '?'!r} names cases the method's "
                         f"suite does not hold (it has {len(suite.test_cases)})")
    run = capture(target, bundle_path, method, case, work, timeout_s, debug_buffer_mb, target_config, tuple(prefix))

    quiet_framework_logs()
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import torch  # torchao prints about optional CUDA kernels while it loads
        from executorch.devtools.etrecord import parse_etrecord

    _register_kernels(bundle.program)  # llama::update_cache in the reference graph needs its schema (mutation)
    record = parse_etrecord(str(et_path))
    def case_inputs(k: int) -> tuple:
        return tuple(_to_torch(v.to_array()) if v.kind == "tensor" else v.scalar for v in suite.test_cases[k].inputs)

    test_case = suite.test_cases[case]
    inputs = case_inputs(case)
    build = manifest.build if manifest else BuildInfo()
    described = build.quantization  # export_llama's builds say "none (fp32)" (bundles/llm_build.py)
    quantized = (bool(described) and not str(described).startswith("none")) or build.dtype in ("int8", "int16")
    names = _program_ops(bundle.program, method)
    for item in run.intermediates:
        if item.kind != "delegate-op":  # an operator inside a delegate keeps its own name ("tosa.CONV2D")
            item.op = names.get((item.chain, item.instruction), item.op)
    graphs, graphs_reason = None, ""
    if any(item.kind == "delegate-op" for item in run.intermediates):
        graphs, graphs_reason = load_delegate_graphs(manifest, bundle_path)
    with torch.no_grad():
        rows, ref_name = compare_layers(run, record, inputs, method, quantized, graphs, graphs_reason,
                                        [case_inputs(k) for k in prefix])

    expected = test_case.expected_outputs[j].to_array()
    budget, budget_source = output_budget(manifest, method, output, expected)
    column = "quantized" if (quantized and build.reference == "quantized") else "fp32"
    first = judge_rows(rows, column, budget, quantized)

    actual = run.outputs[j] if j < len(run.outputs) else None
    out_stats = error_statistics(actual.astype(np.float64), expected.astype(np.float64)).to_dict() \
        if actual is not None and actual.shape == expected.shape else {}
    notes = list(run.notes)
    if sequence is not None:
        step = len(prefix)
        notes.append(f"case {case} is step {step} of stateful sequence {sequence.name!r} ({sequence.steps[step].kind} at "
                     f"position {sequence.steps[step].start_pos}): its {step} earlier step(s) ran first on the target's "
                     "loaded method and through the reference graph, so both compare this step on the same KV cache")
    ops = [r for r in rows if r.kind == "delegate-op"]
    if ops:
        steps = sum(1 for r in ops if r.compared_at is not None)
        unmatched = sum(1 for r in ops if r.status == "unmatched" and r.compared_at is None)
        notes.append(f"{len(ops)} operator(s) inside delegate calls: {len(ops) - steps - unmatched} compared, {steps} "
                     f"step(s) of a group compared at its last operator, {unmatched} unmatched"
                     + (f" ({graphs_reason})" if graphs is None and graphs_reason else ""))
    if quantized and not any(r.fp32 for r in rows):
        notes.append("no fp32 column: the ETRecord holds no fp32 graph (rebuild with --etrecord)")
    return DebugResult(
        bundle=str(bundle_path), target=target, method=method, case=case, case_source=case_source, output=output,
        granularity=run.granularity, reference_graph=ref_name, judged_column=column, budget_db=budget,
        budget_source=budget_source, rows=rows, first_bad=first, output_stats=out_stats, notes=notes,
        model=manifest.model.id if manifest else None, dtype=build.dtype, backend=build.backend,
        export_divergence=None if sequence is not None else  # (per forward call on a fresh model: not for a step)
        _runtime_row(rows, _export_divergence(first, manifest, record, inputs, quantized, actual, expected, method, j,
                                              budget)),
    )


def _runtime_row(rows: list[LayerRow], found: dict[str, Any] | None) -> dict[str, Any] | None:
    """The runtime row that computes the exported node where eager and the export part: it is marked with a note
    and named in `found["runtime_row"]` (rows matched by debug handle carry the reference graph's node names)."""
    node = ((found or {}).get("first_divergent") or {}).get("node")
    row = next((r for r in rows if node and node in r.aot_ops), None)
    if row is not None:
        found["runtime_row"] = {"row": row.index, "instruction": row.instruction, "runtime_op": row.runtime_op}
        row.note = "; ".join(filter(None, [row.note, f"computes {node}, where the exported program first parts from "
                                                     "eager (runner/debug/export_divergence.py); it matches the export"]))
    return found


def _export_divergence(first: int | None, manifest: Manifest | None, record: Any, inputs: tuple, quantized: bool,
                       actual: np.ndarray | None, expected: np.ndarray, method: str, j: int,
                       budget: float | None) -> dict[str, Any] | None:
    """No layer exceeds but the output fails against eager: is the exported program already off?"""
    if first is not None or actual is None:
        return None

    spec = manifest.output_spec(method, j) if manifest else None
    if spec is None:
        return None
    import torch

    with torch.no_grad():
        return check_debug(manifest, record, inputs, quantized, actual, expected, spec.criteria, budget, j)
