"""The ETRecord a bundle's debugger needs, written beside the bundle (`build --etrecord`).

An ETRecord (executorch.devtools) holds the graphs the program came from - the
exported (ATen) program, the edge dialect program before partitioning, the
instruction -> debug handle map and the delegate map of the emitted program -
which is what maps a runtime intermediate output back to an operator of the
eager graph. `bundlerun debug` reads it (runner/debug/localize.py).

How it is recorded without touching the lowering recipes: every recipe calls
`executorch.exir.to_edge_transform_and_lower` (imported at call time); while
`recording(True, recipe.lower)` runs, that name is wrapped to pass
`generate_etrecord=True`, and the ExecutorchProgramManager it returns then
carries the ETRecord (`get_etrecord()`). Builds run one at a time in a process,
so the wrapper never leaks into another build. A recipe that does not go
through `to_edge_transform_and_lower` (the Cortex-M recipe uses `to_edge`)
records none: the build says so.

Extra in the file: for quantized builds the fp32 eager model, exported, under
graph_map["eager_fp32/forward"] (the exported program of an int8 build is the
fake-quantized graph, i.e. the quantized reference; the debugger wants both),
and the representative inputs (case 0; `debug` replaces them with the case it
drills into).

The manifest's `build.etrecord` records {"path" (file name, beside the bundle),
"sha256", "bytes", "debug_handles", "graphs"} and, when the lowering had delegates
whose inside can be mapped, "delegate_graphs" {"path", "sha256", "graphs"}.

Delegate graphs (`<stem>.delegates.json`, beside the ETRecord): what a delegate's
payload does not say but `debug` needs to map the operators inside it back to the
eager graph. Recorded while the lowering runs (same wrapper, same lifetime):

- Arm TOSA pipeline (TOSABackend; Ethos-U and VGF preprocess through it): the FX
  graph `ArmPassManager.transform_to_backend_pipeline` hands to the TOSA
  serializer. Its node names are the TOSA tensor names (the serializer names every
  operator's output tensor after its node, e.g. `tosa_conv2d_default_1`); each node
  keeps the edge graph's `debug_handle` and `from_node` provenance, and its
  quantization parameters. Per node: op, debug handle, provenance roots, dtype,
  shape, the layout permutation from the eager tensor to the TOSA tensor, and for
  integer tensors the scale / zero point that dequantizes it (derived from the
  folded q/dq parameters: an int32 accumulator has input scale x weight scale, a
  RESCALE output input scale / its scale factor, ...).
- MLX (MLXBackend): `MLXProgramBuilder` emits instructions per FX node; per
  instruction (chain, index): op, the node it was emitted for, its debug handle.
- For both, `absorbed`: edge nodes the backend folded into a neighbour (a ReLU or a
  quantize/dequantize fused into the convolution before it): their debug handle ->
  the handle of the group that now computes their value.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.fileio import file_sha256
from bundlerun.bundles.manifest_records import BuildInfo, EtrecordInfo
from bundlerun.bundles.manifest import Manifest
from bundlerun.bundles.backends.common import export_model

SUFFIX = ".etrecord"
DELEGATES_SUFFIX = ".delegates.json"
DELEGATES_SCHEMA = "bundlerun.delegate-graphs/1"
FP32_GRAPH = "eager_fp32"  # graph_map key prefix of the fp32 eager export (quantized builds)


def etrecord_path_for(bundle_path: str | Path) -> Path:
    """Where the ETRecord of `bundle_path` lives: beside it, same stem, `.etrecord`."""
    p = Path(bundle_path)
    return p.with_name(p.stem + SUFFIX)


def delegate_graphs_path_for(bundle_path: str | Path) -> Path:
    """Where the delegate graphs of `bundle_path` live: beside it, same stem, `.delegates.json`."""
    p = Path(bundle_path)
    return p.with_name(p.stem + DELEGATES_SUFFIX)


def recording(enabled: bool, lower: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`lower` itself, or `lower` run with ETRecord generation turned on (and the delegate
    graphs recorded, see the module docstring)."""
    if not enabled:
        return lower

    def run(req: Any) -> Any:
        import executorch.exir as exir

        original = exir.to_edge_transform_and_lower
        collector = DelegateGraphs()

        def with_etrecord(*args: Any, **kwargs: Any) -> Any:
            kwargs["generate_etrecord"] = True
            with collector.hooks():
                return original(*args, **kwargs)

        exir.to_edge_transform_and_lower = with_etrecord
        try:
            result = lower(req)
        finally:
            exir.to_edge_transform_and_lower = original
        try:
            result._bundlerun_delegate_graphs = collector
        except AttributeError:  # a result type without a __dict__: no delegate graphs
            pass
        return result

    return run


# ------------------------------------------------------------------ delegate graphs


def _handle(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], int):
        return value[0]
    return None


def _roots(sources: Any, out: list[str]) -> list[str]:
    """The eager (first traced) node names a node's `from_node` provenance ends at."""
    for src in sources or []:
        parents = getattr(src, "from_node", None)
        if parents:
            _roots(parents, out)
        elif getattr(src, "name", None) and src.name not in out:
            out.append(src.name)
    return out


def _snapshot(graph_module: Any) -> list[dict[str, Any]]:
    """The call_function nodes of a graph before a backend rewrites it: name, debug handle, inputs."""
    nodes = []
    for n in graph_module.graph.nodes:
        if n.op == "call_function":
            nodes.append({"name": n.name, "handle": _handle(n.meta.get("debug_handle")),
                          "inputs": [a.name for a in n.all_input_nodes]})
    return nodes


def absorbed_handles(before: list[dict[str, Any]], present: set[int]) -> dict[str, int]:
    """Debug handles of the edge graph that the backend graph no longer has, folded into the group
    that computes their value: for each group handle, the furthest downstream such handle along the
    first-input chain (conv -> relu -> quantize: the conv's group now yields the quantized relu)."""
    by_name = {n["name"]: n for n in before}
    best: dict[int, tuple[int, int]] = {}
    for order, node in enumerate(before):
        h = node["handle"]
        if h is None or h in present:
            continue
        cur, hops = node, 0
        while hops < len(before):
            hops += 1
            src = next((by_name[i] for i in cur["inputs"] if i in by_name), None)
            if src is None:
                break
            if src["handle"] in present:
                g = src["handle"]
                if g not in best or best[g][0] < order:
                    best[g] = (order, h)
                break
            cur = src
    return {str(g): h for g, (_o, h) in best.items()}


_ACCUMULATING = ("CONV2D", "DEPTHWISE_CONV2D", "CONV3D", "TRANSPOSE_CONV2D", "MATMUL", "MUL")
_SCALE_KEEPING = ("TRANSPOSE", "RESHAPE", "MAX_POOL2D", "SLICE", "CONCAT", "PAD", "TILE", "REVERSE", "GATHER",
                  "IDENTITY", "CLAMP", "ADD", "SUB", "REDUCE_MAX", "REDUCE_MIN", "RESIZE", "SELECT")


def _per_channel(scale: Any) -> Any:
    """A list of per-channel scales, or one float when they are all the same."""
    if isinstance(scale, (list, tuple)):
        vals = [float(x) for x in scale]
        if vals and all(abs(v - vals[0]) <= 1e-6 * abs(vals[0]) for v in vals):
            return vals[0]
        return vals
    return float(scale)


def _times(a: Any, b: Any) -> Any:
    if isinstance(a, list) or isinstance(b, list):
        n = len(a) if isinstance(a, list) else len(b)
        av = a if isinstance(a, list) else [a] * n
        bv = b if isinstance(b, list) else [b] * n
        return _per_channel([x * y for x, y in zip(av, bv)])
    return float(a) * float(b)


def _over(a: Any, b: Any) -> Any:
    if isinstance(b, (list, tuple)):
        return _times(a, [1.0 / float(x) if float(x) else float("inf") for x in b])
    return _times(a, 1.0 / float(b) if float(b) else float("inf"))


def _arm_graph(graph_module: Any, before: list[dict[str, Any]]) -> dict[str, Any]:
    """What debug needs of the Arm backend graph whose nodes the TOSA serializer turns into operators."""
    import torch

    nodes: dict[str, dict[str, Any]] = {}
    order: list[Any] = []
    layout: dict[str, list[int]] = {}
    quant: dict[str, tuple[Any, Any]] = {}  # name -> (scale, zero point) of integer tensors

    def op_of(n: Any) -> str:
        name = getattr(n.target, "__name__", str(n.target))
        return name[: -len(".default")] if name.endswith(".default") else name

    def val_of(n: Any) -> Any:
        v = n.meta.get("val")
        return v if isinstance(v, torch.Tensor) else None

    def is_int(v: Any) -> bool:
        return v is not None and not v.dtype.is_floating_point and v.dtype != torch.bool

    for n in graph_module.graph.nodes:
        v = val_of(n)
        rank = v.dim() if v is not None else 0
        if n.op == "placeholder":
            layout[n.name] = list(range(rank))
            continue
        if n.op != "call_function":
            continue
        op = op_of(n)
        short = op.split(".", 1)[-1]
        args = [a for a in n.args if isinstance(a, torch.fx.Node)]
        if short == "TRANSPOSE" and args and isinstance(n.args[1], (list, tuple)):
            src = layout.get(args[0].name) or list(range(len(n.args[1])))
            perm = [int(p) for p in n.args[1]]
            layout[n.name] = [src[p] for p in perm] if len(src) == len(perm) else perm
        elif short in ("RESHAPE", "VIEW"):
            layout[n.name] = list(range(rank))
        else:
            same = next((a for a in args if val_of(a) is not None and val_of(a).dim() == rank), None)
            layout[n.name] = list(layout.get(same.name, range(rank))) if same is not None else list(range(rank))
        if is_int(v):
            iq = n.meta.get("input_qparams") or {}
            oq = n.meta.get("output_qparams") or {}
            got = None
            if short in _ACCUMULATING and v.dtype in (torch.int32, torch.int64) and 0 in iq and 1 in iq:
                got = (_times(_per_channel(iq[0].scale), _per_channel(iq[1].scale)), 0)
            elif short == "RESCALE" and args and args[0].name in quant and len(n.args) >= 5:
                got = (_over(quant[args[0].name][0], n.args[2]), n.args[4])
            elif 0 in oq and oq[0].dtype == v.dtype:
                got = (_per_channel(oq[0].scale), oq[0].zp)
            elif short in _SCALE_KEEPING and args and args[0].name in quant:
                got = quant[args[0].name]
            if got is not None:
                quant[n.name] = got
        order.append(n)
    # backward: a tensor whose scale no producer rule gave takes the one its consumer expects
    for _ in range(3):
        for n in reversed(order + [p for p in graph_module.graph.nodes if p.op == "placeholder"]):
            v = val_of(n)
            if n.name in quant or not is_int(v):
                continue
            for user in n.users:
                iq = user.meta.get("input_qparams") or {}
                for i, a in enumerate(user.args):
                    if a is n and i in iq and iq[i].dtype == v.dtype:
                        quant[n.name] = (_per_channel(iq[i].scale), iq[i].zp)
                        break
                if n.name not in quant and op_of(user).split(".", 1)[-1] in _SCALE_KEEPING and user.name in quant \
                        and user.args and user.args[0] is n:
                    quant[n.name] = quant[user.name]
                if n.name in quant:
                    break
    for n in order:
        v = val_of(n)
        entry: dict[str, Any] = {"op": op_of(n), "debug_handle": _handle(n.meta.get("debug_handle")),
                                 "roots": _roots(n.meta.get("from_node"), [])}
        if v is not None:
            entry["dtype"] = str(v.dtype).replace("torch.", "")
            entry["shape"] = [int(s) for s in v.shape]
            if layout.get(n.name) and layout[n.name] != list(range(v.dim())):
                entry["layout"] = layout[n.name]
        if n.name in quant:
            scale, zp = quant[n.name]
            entry["scale"] = scale
            entry["zero_point"] = int(zp) if not isinstance(zp, (list, tuple)) else [int(z) for z in zp]
        nodes[n.name] = entry
    present = {e["debug_handle"] for e in nodes.values() if e["debug_handle"] is not None}
    return {"backend": "TOSABackend", "pipeline": "arm", "nodes": nodes, "absorbed": absorbed_handles(before, present)}


def mlx_ops_digest(chains: list[list[str]]) -> str:
    """Identifies an MLX graph by its instruction ops, chain by chain (op names without 'Node')."""
    text = ";".join(",".join(op[:-4] if op.endswith("Node") else op for op in chain) for chain in chains)
    return hashlib.sha1(text.encode()).hexdigest()


class DelegateGraphs:
    """Collects the delegate graphs of one lowering (see the module docstring)."""

    def __init__(self) -> None:
        self.graphs: list[dict[str, Any]] = []
        self.errors: list[str] = []

    @contextmanager
    def hooks(self) -> Iterator[None]:
        undo: list[Callable[[], None]] = []
        try:
            self._hook_arm(undo)
            self._hook_mlx(undo)
            yield
        finally:
            for restore in reversed(undo):
                restore()

    def _hook_arm(self, undo: list[Callable[[], None]]) -> None:
        if "executorch.backends.arm" not in sys.modules:  # not an Arm lowering
            return
        try:
            from executorch.backends.arm._passes import ArmPassManager
        except Exception as exc:  # noqa: BLE001 - debug then says the graphs are missing and why
            self.errors.append(f"Arm pass manager not importable: {type(exc).__name__}: {exc}")
            return
        original = ArmPassManager.transform_to_backend_pipeline
        own = "transform_to_backend_pipeline" in ArmPassManager.__dict__
        collector = self

        def transform_to_backend_pipeline(pm: Any, *args: Any, **kwargs: Any) -> Any:
            gm_in = kwargs.get("graph_module", args[1] if len(args) > 1 else None)
            before = _snapshot(gm_in) if gm_in is not None else []
            graph_module = original(pm, *args, **kwargs)
            try:
                collector.graphs.append(_arm_graph(graph_module, before))
            except Exception as exc:  # noqa: BLE001 - never fail a build over debug info
                collector.errors.append(f"Arm backend graph not recorded: {type(exc).__name__}: {exc}")
            return graph_module

        ArmPassManager.transform_to_backend_pipeline = transform_to_backend_pipeline
        undo.append(lambda: setattr(ArmPassManager, "transform_to_backend_pipeline", original) if own
                    else delattr(ArmPassManager, "transform_to_backend_pipeline"))

    def _hook_mlx(self, undo: list[Callable[[], None]]) -> None:
        if "executorch.backends.mlx.builder.program_builder" not in sys.modules:  # not an MLX lowering
            return
        from executorch.backends.mlx.builder.program_builder import MLXProgramBuilder

        originals = {k: getattr(MLXProgramBuilder, k) for k in ("emit", "_mark_supported", "build")}
        own = {k for k in originals if k in MLXProgramBuilder.__dict__}
        collector = self

        def emit(builder: Any, op: Any) -> None:
            originals["emit"](builder, op)
            chain = builder._current_chain
            builder.__dict__.setdefault("_bundlerun_pending", []).append(
                (chain, len(builder._chains[chain]) - 1, type(op).__name__))

        def mark_supported(builder: Any, n: Any, *args: Any, **kwargs: Any) -> Any:
            pending = builder.__dict__.pop("_bundlerun_pending", [])
            if pending and not getattr(builder, "_check_only", False):
                builder.__dict__.setdefault("_bundlerun_emitted", []).append(
                    (n.name, _handle(n.meta.get("debug_handle")), _roots(n.meta.get("from_node"), []), pending))
            return originals["_mark_supported"](builder, n, *args, **kwargs)

        def build(builder: Any) -> Any:
            fresh = builder._mlx_graph is None
            before = _snapshot(builder.ep.graph_module) if fresh else []
            graph = originals["build"](builder)
            if fresh:
                try:
                    collector.graphs.append(_mlx_graph(builder, before))
                except Exception as exc:  # noqa: BLE001
                    collector.errors.append(f"MLX instruction map not recorded: {type(exc).__name__}: {exc}")
            return graph

        MLXProgramBuilder.emit = emit
        MLXProgramBuilder._mark_supported = mark_supported
        MLXProgramBuilder.build = build

        def restore() -> None:
            for k, v in originals.items():
                if k in own:
                    setattr(MLXProgramBuilder, k, v)
                else:
                    delattr(MLXProgramBuilder, k)

        undo.append(restore)


def _mlx_graph(builder: Any, before: list[dict[str, Any]]) -> dict[str, Any]:
    chains = [[type(ins.op).__name__ for ins in chain] for chain in builder._chains]
    instructions = []
    for node, handle, roots, emitted in builder.__dict__.get("_bundlerun_emitted", []):
        for chain, index, op in emitted:
            instructions.append({"chain": chain, "index": index, "op": op[:-4] if op.endswith("Node") else op,
                                 "node": node, "debug_handle": handle, "roots": roots})
    instructions.sort(key=lambda i: (i["chain"], i["index"]))
    present = {i["debug_handle"] for i in instructions if i["debug_handle"] is not None}
    return {"backend": "MLXBackend", "digest": mlx_ops_digest(chains), "instructions": instructions,
            "absorbed": absorbed_handles(before, present)}


def _write_delegate_graphs(collector: DelegateGraphs | None, bundle_path: str | Path) -> dict[str, Any]:
    """Write `<stem>.delegates.json` when the lowering recorded any; the manifest's entry for it."""
    path = delegate_graphs_path_for(bundle_path)
    if collector is None or not (collector.graphs or collector.errors):
        path.unlink(missing_ok=True)  # a stale one from an earlier build must not be picked up
        return {}
    body = {"schema": DELEGATES_SCHEMA, "graphs": collector.graphs, "errors": collector.errors}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(body, separators=(",", ":"), allow_nan=False))
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001
        tmp.unlink(missing_ok=True)
        raise BuildError(f"cannot write the delegate graphs {path}: {type(exc).__name__}: {exc}") from None
    return {"delegate_graphs": {"path": path.name, "sha256": file_sha256(path), "graphs": len(collector.graphs),
                                "backends": sorted({g["backend"] for g in collector.graphs})}}


def manifest_entry(enabled: bool, lowering: Any, fp32_module: Any, example_inputs: tuple,
                   bundle_path: str | Path) -> dict[str, Any]:
    """Write the ETRecord beside `bundle_path`; {"etrecord": {...}} for the manifest's build
    section ({} when not enabled)."""
    if not enabled:
        return {}
    get = getattr(lowering.program, "get_etrecord", None)
    try:
        record = get() if get is not None else None
    except RuntimeError:
        record = None
    if record is None:
        raise BuildError("this backend's lowering does not go through to_edge_transform_and_lower, so no ETRecord "
                         "could be recorded; build without --etrecord")
    graphs = ["exported_program", "edge_dialect_exported_program"]
    if lowering.quantized_reference is not None:  # keep the float model beside the fake-quantized graph
        record.add_extra_export_modules({FP32_GRAPH: export_model(fp32_module, tuple(example_inputs))})
        graphs.append(f"{FP32_GRAPH}/forward")
    record.update_representative_inputs([tuple(example_inputs)])
    path = etrecord_path_for(bundle_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        record.save(str(tmp))
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        tmp.unlink(missing_ok=True)
        raise BuildError(f"cannot write the ETRecord {path}: {type(exc).__name__}: {exc}") from None
    handles = record._debug_handle_map or {}
    return {"etrecord": {
        "path": path.name,
        "sha256": file_sha256(path),
        "bytes": path.stat().st_size,
        "debug_handles": sum(len(m) for m in handles.values() if isinstance(m, dict)),
        "graphs": graphs,
        **_write_delegate_graphs(getattr(lowering, "_bundlerun_delegate_graphs", None), bundle_path),
    }}


class EtrecordMissing(Exception):
    """The bundle has no usable ETRecord; the message says how to rebuild with one."""


def rebuild_hint(manifest: Manifest | None, bundle_path: str | Path) -> str:
    build = manifest.build if manifest else BuildInfo()
    model = (manifest.model.id if manifest else None) or "MODEL"
    parts = [f"bundlerun build {model}"]
    for flag, value in (("--target", build.target), ("--backend", build.backend), ("--dtype", build.dtype),
                        ("--cases", build.cases), ("--seed", build.seed), ("--reference", build.reference)):
        if value is not None:
            parts.append(f"{flag} {value}")
    parts += ["--etrecord", "-o", str(bundle_path)]
    return " ".join(parts)


def locate(manifest: Manifest | None, bundle_path: str | Path) -> Path:
    """The bundle's ETRecord, checked against the sha256 its manifest records.
    Raises EtrecordMissing naming the rebuild command otherwise."""
    entry = manifest.build.etrecord if manifest else None
    hint = rebuild_hint(manifest, bundle_path)
    if not isinstance(entry, EtrecordInfo) or not entry.path:
        raise EtrecordMissing(f"{bundle_path} was built without an ETRecord, which debug needs to map runtime "
                              f"intermediates to the eager graph; rebuild with it: {hint}")
    path = Path(bundle_path).parent / Path(str(entry.path)).name
    if not path.is_file():
        raise EtrecordMissing(f"the ETRecord {path} recorded by {bundle_path} is missing; rebuild with: {hint}")
    got = file_sha256(path)
    if entry.sha256 and got != entry.sha256:
        raise EtrecordMissing(f"the ETRecord {path} does not belong to {bundle_path} (sha256 {got[:16]}..., the "
                              f"manifest records {str(entry.sha256)[:16]}...); rebuild with: {hint}")
    return path


def load_delegate_graphs(manifest: Manifest | None, bundle_path: str | Path) -> tuple[dict | None, str]:
    """(the bundle's delegate graphs, "") or (None, why they are not there) - checked against the
    sha256 the manifest records."""
    recorded = manifest.build.etrecord if manifest else None
    entry = recorded.delegate_graphs if isinstance(recorded, EtrecordInfo) else None
    if not isinstance(entry, dict) or not entry.get("path"):
        return None, ("the bundle records no delegate graphs (built before bundlerun recorded them, or the lowering "
                      f"had none); rebuild with: {rebuild_hint(manifest, bundle_path)}")
    path = Path(bundle_path).parent / Path(str(entry["path"])).name
    if not path.is_file():
        return None, f"the delegate graphs {path} recorded by {bundle_path} are missing"
    if entry.get("sha256") and file_sha256(path) != entry["sha256"]:
        return None, f"the delegate graphs {path} do not belong to {bundle_path} (sha256 differs from the manifest's)"
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"cannot read the delegate graphs {path}: {exc}"
    if body.get("schema") != DELEGATES_SCHEMA:
        return None, f"{path} has schema {body.get('schema')!r}, not {DELEGATES_SCHEMA}"
    return body, ""
