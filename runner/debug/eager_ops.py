"""Eager intermediates per ATen operation, matched to the exported program's nodes.

A comparison per `nn.Module` cannot see what a model computes in its own `forward` with functional
calls and tensor methods (layer norms, activations, inline attention): the blame lands on the next
module. Here the eager model runs under a `TorchDispatchMode` that records every ATen operation's
first output together with where it ran: the innermost module (its path, as `nn_module_stack`
names it) and the innermost frame of the model's own code (torch's frames skipped, the frames the
exported program's `stack_trace` holds). Module inputs and outputs are recorded by hooks in the same
run.

Eager dispatch sees ATen after CompositeImplicit decomposition (`layer_norm` -> `native_layer_norm`,
`linear` -> `t` + `addmm`), the exported program (before `run_decompositions`) the ops as written.
`match_nodes` therefore pairs within (module path, source line): an exported node with the next
eager op of the same op name (`native_`/leading `_` dropped), else with the last op of its shape in the next
Python-level torch call (the ops one call dispatches - same frame and bytecode offset - are its
decomposition: `decomposed`; `shape`, uncertain, when calls before it were passed over). Nodes
with no frame of model code (an `nn.Sequential` of torch modules) are placed the same way among the
module's ops that have none either, and in a graph with no stack traces at all among all the
module's ops (`order` when the module has several such nodes). A node
whose line ran no eager op in that module is `exported only` (code that ran only while exporting).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

# bundlerun's own bound on the eager values kept for one comparison (host memory), not ExecuTorch's.
MAX_RECORDED_BYTES = 2 << 30

Source = tuple[str, int, str]  # (file name, line, function)


@dataclass
class EagerOp:
    index: int
    op: str  # "aten.native_layer_norm.default"
    module: str  # innermost module's path; "" = the model's own forward
    source: Source | None
    value: Any  # first tensor output (a copy), or None
    call: int = 0  # the Python-level torch call it belongs to: ops of one call are its decomposition


@dataclass
class ModuleCall:
    path: str
    kind: str
    input: Any  # first tensor argument (a copy)
    output: Any  # first tensor output (a copy)


@dataclass
class EagerRun:
    ops: list[EagerOp]
    modules: list[ModuleCall]  # in the order the calls finished, first call of each path
    output: Any
    notes: list[str] = field(default_factory=list)


@dataclass
class NodeMatch:
    eager: int | None  # index into EagerRun.ops
    how: str  # "op" | "decomposed" | "shape" | "order" | "exported only" | "no eager value"


def _framework(path: str) -> bool:
    """torch's own frames (the rule of bundles/partition_control.py source_line)."""
    return "/torch/" in path.replace("\\", "/")


def _machinery(path: str) -> bool:
    """Frames of torch's dispatch and dynamo wrappers around a dispatch mode (not the model's calls)."""
    p = path.replace("\\", "/")
    return any(part in p for part in ("/torch/_dynamo/", "/torch/utils/_python_dispatch", "/torch/_ops.py",
                                      "/torch/_compile.py"))


def _short(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _first_tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return next((v for v in (_first_tensor(x) for x in value) if v is not None), None)
    if isinstance(value, dict):
        return _first_tensor(list(value.values()))
    return None


def _copy(value: Any) -> Any:
    t = _first_tensor(value)
    return None if t is None else t.detach().clone()


def capture(module: Any, inputs: tuple, max_bytes: int = MAX_RECORDED_BYTES) -> EagerRun:
    """Run `module` eagerly on `inputs`, recording every ATen op and every submodule call."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[EagerOp] = []
    calls: dict[str, ModuleCall] = {}
    finished: list[str] = []
    stack: list[str] = [""]
    state: dict[str, Any] = {"paused": False, "bytes": 0, "full": False, "hooks": 0, "call": 0, "last": None}
    run_code = capture.__code__

    def where(frame: Any) -> tuple[Source | None, tuple]:
        """The op's source (as `node_source` reads a stack trace) and the Python call it came from."""
        while frame is not None and _machinery(frame.f_code.co_filename):  # the dispatch mode's own wrappers
            frame = frame.f_back
        if frame is None:
            return None, ()
        call = (id(frame), frame.f_lasti, state["hooks"])  # one torch call: its decomposition shares these
        while frame is not None and frame.f_code is not run_code:  # the frames between the model and here
            name = frame.f_code.co_filename
            if not _framework(name):
                return (_short(name), frame.f_lineno, frame.f_code.co_name), call
            frame = frame.f_back
        return None, call  # only torch's frames (an nn.Sequential of torch modules): placed by module alone

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not state["paused"]:
                value = None if state["full"] else _copy(out)
                if value is not None:
                    state["bytes"] += value.numel() * value.element_size()
                    if state["bytes"] > max_bytes:
                        state["full"], value = True, None
                source, call = where(sys._getframe(1))
                if call != state["last"]:
                    state["last"], state["call"] = call, state["call"] + 1
                ops.append(EagerOp(len(ops), str(func), stack[-1], source, value, state["call"]))
            return out

    def pre(path: str, kind: str):
        def hook(_mod: Any, args: Any) -> None:
            stack.append(path)
            state["hooks"] += 1  # a module call starts: no op before and after it is one torch call
            if path not in calls:
                state["paused"] = True
                try:
                    calls[path] = ModuleCall(path, kind, _copy(args), None)
                finally:
                    state["paused"] = False
        return hook

    def post(path: str):
        def hook(_mod: Any, _args: Any, output: Any) -> None:
            state["hooks"] += 1
            if stack[-1] == path:
                stack.pop()
            call = calls.get(path)
            if call is not None and call.output is None and path not in finished:
                state["paused"] = True
                try:
                    call.output = _copy(output)
                finally:
                    state["paused"] = False
                finished.append(path)
        return hook

    handles = []
    for path, sub in module.named_modules():
        if path:
            handles.append(sub.register_forward_pre_hook(pre(path, type(sub).__name__)))
            handles.append(sub.register_forward_hook(post(path)))
    try:
        with torch.no_grad(), Recorder():
            output = module(*inputs)
    finally:
        for h in handles:
            h.remove()
    notes = []
    if state["full"]:
        notes.append(f"eager values past {max_bytes >> 20} MiB were not kept (bundlerun's bound on host memory): "
                     "later operations are not compared")
    return EagerRun(ops, [calls[p] for p in finished if calls[p].output is not None], output, notes)


# ------------------------------------------------------------------ the exported side


def node_source(node: Any) -> Source | None:
    """(file name, line, function) of the node's innermost frame of model code (its `stack_trace`)."""
    import re

    trace = node.meta.get("stack_trace")
    frames = re.findall(r'File "(.+?)", line (\d+), in (\S+)', trace if isinstance(trace, str) else "")
    if not frames:
        return None
    own = [f for f in frames if not _framework(f[0])]
    if not own:  # torch's frames only: which of them a trace keeps differs from eager's, so none is used
        return None
    path, line, fn = own[-1]
    return _short(path), int(line), fn


def node_module(node: Any) -> tuple[str, str]:
    """(path, class name) of the innermost module the node ran in ("" = the model's own forward)."""
    stack = node.meta.get("nn_module_stack")
    entry = list(stack.values())[-1] if isinstance(stack, dict) and stack else None
    if not isinstance(entry, (tuple, list)) or len(entry) < 2:  # what ETRecord records, else nothing to go by
        return "", ""
    path, kind = entry[0], entry[1]
    kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    return str(path or ""), kind.rsplit(".", 1)[-1]


def op_name(target: Any) -> str:
    """"layer_norm" for aten.layer_norm.default and "native_layer_norm" alike: the name both sides share
    (`native_`, leading `_`, `unsafe_`, an in-place `_` suffix dropped)."""
    name = str(target).split("::")[-1]
    name = name[len("aten."):] if name.startswith("aten.") else name
    name = name.split(".")[0].lstrip("_")
    for prefix in ("native_", "unsafe_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.rstrip("_")


def _shape(value: Any) -> tuple | None:
    t = _first_tensor(value)
    return None if t is None else tuple(t.shape)


def compared_nodes(graph_module: Any) -> list[Any]:
    """The exported graph's ATen call nodes, in graph order (getitem and assertions left out)."""
    return [n for n in graph_module.graph.nodes if n.op == "call_function" and hasattr(n.target, "_schema")
            and not str(n.target).startswith("aten._assert")]


def traced(nodes: list[Any]) -> bool:
    """Whether the graph carries stack traces; without (stripped, an old ETRecord) ops are placed by module alone."""
    return any(isinstance(n.meta.get("stack_trace"), str) and n.meta["stack_trace"] for n in nodes)


def eager_key(op: EagerOp, with_source: bool) -> tuple:
    """The (module, source line) group an eager op is matched in; `node_key` is the exported side's."""
    return op.module, op.source if with_source else None


def node_key(node: Any) -> tuple:
    return node_module(node)[0], node_source(node)


def match_nodes(nodes: list[Any], values: dict[str, Any], run: EagerRun) -> dict[str, NodeMatch]:
    """node name -> its eager op (see the module docstring)."""
    eager: dict[tuple, list[EagerOp]] = {}
    with_source = traced(nodes)
    for op in run.ops:
        eager.setdefault(eager_key(op, with_source), []).append(op)
    groups: dict[tuple, list[Any]] = {}
    for n in nodes:
        groups.setdefault(node_key(n), []).append(n)
    found: dict[str, NodeMatch] = {}
    for (module, source), group in groups.items():
        ops = eager.get((module, source)) or []
        if not ops:
            for n in group:
                found[n.name] = NodeMatch(None, "exported only" if source else "no eager value")
            continue
        p = 0
        for i, n in enumerate(group):
            j = _same_op(ops, p, n, values)
            how = "op"
            if j is None:  # a decomposition: the last op of the node's shape in the next torch call that has one
                after = next((k for k in (_same_op(ops, p, m, values) for m in group[i + 1:]) if k is not None),
                             len(ops))
                j, skipped = _decomposed(ops, p, after, _shape(values.get(n.name)))
                how = "shape" if skipped else "decomposed"  # uncertain when calls before it were passed over
            if j is None:
                found[n.name] = NodeMatch(None, "no eager value")
                continue
            # no source line: placed by its order among the module's ops - certain only when it is the only one
            found[n.name] = NodeMatch(ops[j].index, "order" if source is None and len(group) > 1 else how)
            p = j + 1
            if how != "op":  # past the rest of the call it was decomposed into
                while p < len(ops) and ops[p].call == ops[j].call:
                    p += 1
    return found


def _decomposed(ops: list[EagerOp], start: int, end: int, shape: tuple | None) -> tuple[int | None, bool]:
    """(the last op of `shape` in the first torch call of ops[start:end] that has one, whether calls with no
    such op were passed over)."""
    if shape is None:
        return None, False
    for k in range(start, end):
        if _shape(ops[k].value) == shape:
            call = ops[k].call
            last = max(m for m in range(k, len(ops)) if ops[m].call == call and _shape(ops[m].value) == shape)
            return last, ops[start].call != call
    return None, False


def _same_op(ops: list[EagerOp], start: int, node: Any, values: dict[str, Any]) -> int | None:
    name, shape = op_name(node.target), _shape(values.get(node.name))
    for k in range(start, len(ops)):
        if op_name(ops[k].op) == name and (shape is None or _shape(ops[k].value) in (shape, None)):
            return k
    return None
