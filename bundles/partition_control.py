"""Delegate only some of the nodes a backend's partitioner takes (for `bundlerun bisect`).

Which nodes: a *unit* is one node of the exported (ATen) program - the graph torch.export traced,
whose nodes ETRecord records with their `nn_module_stack` and `stack_trace` - found from a
partition-stage node through its `from_node` provenance (its first root). A unit is every node the
edge graph has for it (an op and the pieces of its decomposition, a `getitem` of its result), plus
the quantize / dequantize nodes around it: a dequantize goes with the node that consumes it, a
quantize with the node that produced its input (PT2E's q -> dq -> op -> q pattern), so a unit left
out of the delegate runs whole on the portable kernels. Units are identified by that root name,
which stays the same in every re-lowering of the same model (partition-stage node names do not:
their counters shift when a decomposition changes).

How (one mechanism for every recipe, so the restriction means the same on each): every partitioner
handed to `to_edge_transform_and_lower` is wrapped by `RestrictedPartitioner`, which

- runs the backend's own `partition()` (its op support checks, its constraints, its grouping),
  then removes the delegation tag from the nodes of units not allowed and splits what is left of
  each of the backend's partitions into cycle-free groups (ExecuTorch's
  `generate_partitions_from_list_of_nodes`, the CapabilityBasedPartitioner the backends use);
  constant placeholders stay with the group all their users are in;
- answers `ops_to_not_decompose` with the backend's own list and a filter that lets an op the
  backend keeps whole (XNNPACK's and QNN's `aten.linear`, ...) decompose when its unit is not
  allowed: ExecuTorch's lowering refuses a preserved op left undelegated
  (exir/program/_program.py `_sanity_check_graph_for_non_decomp_ops`).

The backends' own node-level switches (QnnPartitioner's skip_node_id_set, TOSAPartitioner's
additional_checks) are keyed by partition-stage names or nodes, which do not survive into the next
re-lowering; Vulkan's operator_blocklist and XNNPACK's configs are per operator type, not per node.
The wrapper works after each backend's own decision, so it can only take nodes away from it.

The recipes are not edited: while `restricting(...)` is active, `wrap(recipe.lower)` (the
builder's hook) patches `to_edge_transform_and_lower` wherever it is bound, as bundles/etrecord.py
does, and `EdgeProgramManager.to_backend` (export_llama's Vulkan path lowers through it). A recipe that lowers in another process (qnn) hands `spec()` to it and applies it there with
`applied(spec)`; the child writes the record file named in the spec.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from bundlerun.bundles.etrecord import _roots

MECHANISM = ("RestrictedPartitioner: the backend's own partition(), then its delegation tags removed from units not "
             "allowed (by exported-program node) and the rest regrouped cycle-free (bundles/partition_control.py)")
_QDQ = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel", "dequantize_per_channel",
        "choose_qparams", "quantize_affine", "dequantize_affine")


@dataclass(frozen=True)
class Restriction:
    """Which exported-program nodes (root names) the delegate may take (None: every one its
    partitioner takes), and where the record of what it took is written (JSON: {"units": [...]})."""

    allowed: frozenset[str] | None = None
    record: str | None = None

    def to_spec(self) -> dict[str, Any]:
        return {"allowed": None if self.allowed is None else sorted(self.allowed), "record": self.record}

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> "Restriction | None":
        if not spec:
            return None
        allowed = spec.get("allowed")
        return cls(None if allowed is None else frozenset(str(a) for a in allowed), spec.get("record"))


_ACTIVE: list[Restriction] = []


@contextlib.contextmanager
def restricting(restriction: Restriction) -> Iterator[Restriction]:
    """Builds inside lower with `restriction` (through `wrap`); the build cache keys them apart."""
    _ACTIVE.append(restriction)
    try:
        yield restriction
    finally:
        _ACTIVE.pop()


def active() -> Restriction | None:
    return _ACTIVE[-1] if _ACTIVE else None


def spec() -> dict[str, Any] | None:
    """The active restriction as JSON, for a recipe whose lowering runs in another process."""
    current = active()
    return None if current is None else current.to_spec()


def cache_material() -> dict[str, Any]:
    """What the build-cache key adds under a restriction ({} otherwise: plain keys stay as they were)."""
    current = active()
    if current is None:
        return {}
    return {"partition_control": {"allowed": None if current.allowed is None else sorted(current.allowed)}}


# ------------------------------------------------------------------ units


def _root(node: Any) -> str:
    roots = _roots(node.meta.get("from_node"), [])
    return roots[0] if roots else f"~{node.name}"


def _is_qdq(node: Any) -> bool:
    return node.op == "call_function" and any(q in str(node.target) for q in _QDQ)


def _is_getitem(node: Any) -> bool:
    return node.op == "call_function" and "getitem" in str(node.target)


def unit_of(node: Any, memo: dict[Any, str]) -> str:
    """The unit a call_function node belongs to (see the module docstring)."""
    if node in memo:
        return memo[node]
    memo[node] = _root(node)  # provisional: cuts cycles
    if _is_getitem(node) and node.args and hasattr(node.args[0], "op") and node.args[0].op == "call_function":
        memo[node] = unit_of(node.args[0], memo)
    elif _is_qdq(node) and "dequantize" in str(node.target):
        users = [u for u in node.users if u.op == "call_function"]
        if users:
            memo[node] = unit_of(users[0], memo)
    elif _is_qdq(node):
        src = node.args[0] if node.args else None
        if hasattr(src, "op") and src.op == "call_function":
            memo[node] = unit_of(src, memo)
    return memo[node]


def _module(node: Any) -> tuple[str | None, list[list[str]]]:
    """The innermost eager module of a node (path and class) and the whole stack, from nn_module_stack."""
    stack = node.meta.get("nn_module_stack") or {}
    entries = []
    for value in stack.values():
        if isinstance(value, (tuple, list)) and len(value) >= 2:
            path, kind = value[0], value[1]
            kind = kind if isinstance(kind, str) else f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', kind)}"
            entries.append([str(path), kind])
    if not entries:
        return None, []
    path, kind = entries[-1]
    return f"{path} ({kind.rsplit('.', 1)[-1]})" if path else kind.rsplit(".", 1)[-1], entries


def source_line(stack_trace: str | None) -> str | None:
    """`file.py:12 in forward: x = self.conv2(x)`: the innermost frame of the model's own code
    (torch's frames skipped; the innermost frame when every frame is torch's, as in nn.Sequential)."""
    if not stack_trace:
        return None
    import re

    frames = []
    lines = stack_trace.strip().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "(.+)", line (\d+), in (\S+)', line)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].strip().startswith("File ") else ""
            frames.append((m.group(1), int(m.group(2)), m.group(3), code))
    if not frames:
        return None
    own = [f for f in frames if "/torch/" not in f[0] and "/site-packages/" not in f[0]]
    path, line, fn, code = (own or frames)[-1]
    return f"{path}:{line} in {fn}" + (f": {code}" if code else "")


def op_label(target: Any) -> str:
    """`aten.convolution.default` for an ATen or edge operator (EdgeOpOverload's __name__)."""
    name = getattr(target, "__name__", None) or str(target)
    return name if "." in name or not hasattr(target, "_schema") else str(target)


def describe_units(graph_module: Any, tags: dict[str, str]) -> list[dict[str, Any]]:
    """Every unit with a delegated node (`tags`: node name -> delegation tag), in graph order.

    In a quantized partition (it has quantize/dequantize nodes), values only cross a boundary
    quantized: two nodes joined by a direct float edge (a conv and the ReLU its quantization
    pattern fuses: conv -> relu -> q) are one unit, or a delegate would end on a value with no
    quantization parameters (the Arm backend refuses it: "No output quantization parameter")."""
    memo: dict[Any, str] = {}
    delegated = [n for n in graph_module.graph.nodes if n.op == "call_function" and n.name in tags]
    root_of = {n: unit_of(n, memo) for n in delegated}
    parent: dict[str, str] = {r: r for r in root_of.values()}

    def find(r: str) -> str:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    if any(_is_qdq(n) for n in delegated):
        for n in delegated:
            if _is_qdq(n):
                continue
            for user in n.users:
                if user in root_of and not _is_qdq(user):
                    a, b = find(root_of[n]), find(root_of[user])
                    if a != b:
                        parent[b] = a
    units: dict[str, dict[str, Any]] = {}
    for node in delegated:
        group = find(root_of[node])
        unit = units.setdefault(group, {"key": None, "index": len(units), "tag": tags[node.name], "roots": [],
                                        "nodes": [], "ops": [], "op": None, "module": None, "module_stack": [],
                                        "source": None})
        if root_of[node] not in unit["roots"]:
            unit["roots"].append(root_of[node])
        unit["nodes"].append(node.name)
        if not (_is_qdq(node) or _is_getitem(node)):
            unit["ops"].append(op_label(node.target))
            if unit["op"] is None:
                unit["op"] = op_label(node.target)
                unit["node"] = node.name
                unit["module"], unit["module_stack"] = _module(node)
                unit["source"] = source_line(node.meta.get("stack_trace"))
    by_name = {n.name: n for n in delegated}
    for unit in units.values():
        unit["key"] = unit["roots"][0]
        if unit["op"] is None:  # a unit of quantize/dequantize nodes only
            first = by_name[unit["nodes"][0]]
            unit["op"], unit["node"] = op_label(first.target), first.name
            unit["module"], unit["module_stack"] = _module(first)
            unit["source"] = source_line(first.meta.get("stack_trace"))
    return list(units.values())


# ------------------------------------------------------------------ the wrapper partitioner


@dataclass
class Record:
    """What the wrapped partitioners took: per partition() call, the units and which were kept."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def units(self) -> list[dict[str, Any]]:
        out = []
        for call in self.calls:
            for unit in call["units"]:
                out.append({**unit, "backend": call["backend"], "partitioner": call["partitioner"]})
        return out

    def to_json(self) -> dict[str, Any]:
        return {"mechanism": MECHANISM, "units": self.units()}


def _partitioner_base():
    from executorch.exir.backend.partitioner import Partitioner

    return Partitioner


def restricted(inner: Any, allowed: frozenset[str] | None, record: Record) -> Any:
    """`inner` wrapped (see the module docstring)."""
    from executorch.exir.backend.partitioner import PartitionResult

    if getattr(inner, "bundlerun_restricted", False):  # to_edge_transform_and_lower hands it on to to_backend
        return inner

    class RestrictedPartitioner(_partitioner_base()):
        bundlerun_restricted = True

        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def __getattr__(self, name: str) -> Any:  # anything else a lowering asks of the partitioner
            if name == "inner":
                raise AttributeError(name)
            return getattr(self.inner, name)

        def ops_to_not_decompose(self, ep: Any):
            ops, check = self.inner.ops_to_not_decompose(ep)
            if allowed is None:
                return ops, check

            def keep_whole(node: Any) -> bool:
                if node.op == "call_function" and _root(node) not in allowed:
                    return False  # decomposed: it will run on portable kernels
                return check(node) if check is not None else True

            return ops, keep_whole

        def partition(self, exported_program: Any):
            result = self.inner.partition(exported_program)
            gm = result.tagged_exported_program.graph_module
            tags = {n.name: n.meta["delegation_tag"] for n in gm.graph.nodes
                    if n.op == "call_function" and n.meta.get("delegation_tag") in result.partition_tags}
            units = describe_units(gm, tags)
            backend = sorted({str(s.backend_id) for s in result.partition_tags.values()})
            entry = {"partitioner": type(self.inner).__name__, "backend": ",".join(backend), "units": units}
            if allowed is None:
                for unit in units:
                    unit["delegated"] = True
                record.calls.append(entry)
                return result
            for unit in units:
                unit["delegated"] = all(r in allowed for r in unit["roots"])
            kept_nodes = {name for unit in units if unit["delegated"] for name in unit["nodes"]}
            new_tags = _regroup(gm, tags, kept_nodes, result.partition_tags)
            record.calls.append(entry)
            return PartitionResult(tagged_exported_program=result.tagged_exported_program, partition_tags=new_tags)

    return RestrictedPartitioner()


def _regroup(gm: Any, tags: dict[str, str], kept: set[str], specs: dict[str, Any]) -> dict[str, Any]:
    """Untag nodes not kept; split each of the backend's partitions into cycle-free groups of kept
    nodes; constant placeholders (and get_attr) follow their users' group. The new tag -> spec map."""
    from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import (
        generate_partitions_from_list_of_nodes,
    )
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Only(OperatorSupportBase):
        def __init__(self, names: set[str]) -> None:
            self.names = names

        def is_node_supported(self, submodules: Any, node: Any) -> bool:
            return node.name in self.names

    old_of_constant = {n: n.meta.get("delegation_tag") for n in gm.graph.nodes
                       if n.op in ("placeholder", "get_attr") and n.meta.get("delegation_tag") in specs}
    for node in gm.graph.nodes:
        if node.op != "output":
            node.meta.pop("delegation_tag", None)
    new_specs: dict[str, Any] = {}
    first_of: dict[str, str] = {}
    for tag, spec in specs.items():
        names = {name for name, t in tags.items() if t == tag and name in kept}
        if not names:
            continue
        for k, partition in enumerate(generate_partitions_from_list_of_nodes(gm, op_support=Only(names))):
            new = f"{tag}_b{k}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = new
            new_specs[new] = spec
            first_of.setdefault(tag, new)
    # A data-dependent scalar's checks (`ge`/`le`/`add` on an `item()` and their `_assert_scalar`s: no tensor,
    # no user but another check) go with the node they check: grouped apart, the delegate holding the `item()`
    # would be traced without its range, and a backend's preprocess pass that retraces it fails on `u < 0`
    # (GuardOnDataDependentSymNode: export_llama's Vulkan program, rope's slice at input_pos). A chain that is
    # checks only (an `item()` nothing but its checks reads, export_llama's per-layer input_pos checks) goes
    # with the first `item()` that is used: a group of checks alone has inputs nothing in it uses after the
    # backend drops the asserts, and the Vulkan delegate then declares fewer inputs than its call passes
    # (VulkanBackend.cpp: "Vulkan graph declares 2 inputs ... the delegate call supplied 7 arguments").
    _checks_follow_their_scalars(gm, kept)
    for tag in [t for t in new_specs if not any(n.meta.get("delegation_tag") == t for n in gm.graph.nodes)]:
        del new_specs[tag]  # a group that held only checks
    for node, old in old_of_constant.items():
        user_tags = {u.meta.get("delegation_tag") for u in node.users}
        if not node.users:
            if old in first_of:  # a consumed constant (QNN tags them): with its partition's first group
                node.meta["delegation_tag"] = first_of[old]
        elif len(user_tags) == 1 and None not in user_tags:
            node.meta["delegation_tag"] = next(iter(user_tags))
    return new_specs


def _checks_follow_their_scalars(gm: Any, kept: set[str]) -> None:
    """See `_regroup`: retag the kept nodes that only check a data-dependent scalar."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    # check-only: an assert (no value, no user), or a node every user of which is check-only
    check_only: dict[Any, bool] = {}
    for node in reversed(nodes):
        users = list(node.users)
        check_only[node] = all(check_only.get(u, False) for u in users) if users else node.meta.get("val") is None
    dead: dict[Any, bool] = {}
    for node in nodes:
        dead[node] = check_only[node] and all(dead.get(a, False) for a in node.all_input_nodes
                                              if a.op == "call_function")
    anchor = next((n.meta.get("delegation_tag") for n in nodes if "_local_scalar_dense" in str(n.target)
                   and not check_only[n] and n.meta.get("delegation_tag")), None)
    for node in nodes:
        if node.name not in kept or not check_only[node]:
            continue
        if dead[node] and anchor is not None:
            node.meta["delegation_tag"] = anchor
            continue
        source = next((a for a in node.all_input_nodes if a.op == "call_function" and a.meta.get("delegation_tag")), None)
        if source is not None:
            node.meta["delegation_tag"] = source.meta["delegation_tag"]


# ------------------------------------------------------------------ applying it to a lowering


@contextlib.contextmanager
def applied(restriction: Restriction | dict | None, write: bool = True) -> Iterator[Record | None]:
    """Inside: every `to_edge_transform_and_lower` (wherever a module bound it) wraps its
    partitioners; with `write`, the record file is written on the way out (also after a failed
    lowering)."""
    if isinstance(restriction, dict):
        restriction = Restriction.from_spec(restriction)
    if restriction is None:
        yield None
        return
    import executorch.exir as exir
    from executorch.exir.program import _program

    originals = {id(exir.to_edge_transform_and_lower), id(_program.to_edge_transform_and_lower)}
    record = Record()
    base = exir.to_edge_transform_and_lower

    def lower(*args: Any, **kwargs: Any) -> Any:
        if "partitioner" in kwargs:
            kwargs["partitioner"] = _wrap_all(kwargs["partitioner"], restriction.allowed, record)
        elif len(args) > 1:
            args = (args[0], _wrap_all(args[1], restriction.allowed, record), *args[2:])
        return base(*args, **kwargs)

    # export_llama's generic path (Vulkan's, examples/models/llama/export_llama_lib.py:1353-1495) lowers with
    # to_edge then EdgeProgramManager.to_backend(partitioner): that method is wrapped too (a partitioner
    # to_edge_transform_and_lower already wrapped passes through it unchanged)
    manager = _program.EdgeProgramManager
    base_to_backend = manager.to_backend

    def to_backend(self: Any, partitioner: Any, *args: Any, **kwargs: Any) -> Any:
        return base_to_backend(self, _wrap_all(partitioner, restriction.allowed, record), *args, **kwargs)

    patched: list[tuple[Any, Any]] = []
    for module in list(sys.modules.values()):
        value = getattr(module, "to_edge_transform_and_lower", None) if module is not None else None
        if value is not None and id(value) in originals:
            patched.append((module, value))
            setattr(module, "to_edge_transform_and_lower", lower)
    manager.to_backend = to_backend
    try:
        yield record
    finally:
        manager.to_backend = base_to_backend
        for module, value in patched:
            setattr(module, "to_edge_transform_and_lower", value)
        if write and restriction.record:
            Path(restriction.record).write_text(json.dumps(record.to_json(), default=str))


def _wrap_all(partitioners: Any, allowed: frozenset[str] | None, record: Record) -> Any:
    if partitioners is None:
        return None
    if isinstance(partitioners, dict):
        return {k: _wrap_all(v, allowed, record) for k, v in partitioners.items()}
    if isinstance(partitioners, (list, tuple)):
        return [restricted(p, allowed, record) for p in partitioners]
    return restricted(partitioners, allowed, record)


def wrap(lower: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The builder's hook: `lower` itself, or (under `restricting`) `lower` with its partitioners
    restricted; the lowering's info then says what was delegated (`partition_control`)."""
    restriction = active()
    if restriction is None:
        return lower

    def run(req: Any) -> Any:
        with applied(restriction, write=False) as record:
            result = lower(req)
        units = record.units() if record is not None else []
        if not units and restriction.record and Path(restriction.record).is_file():  # lowered in a child
            units = json.loads(Path(restriction.record).read_text()).get("units") or []
        result.info["partition_control"] = {
            "mechanism": MECHANISM,
            "allowed": "all" if restriction.allowed is None else len(restriction.allowed),
            "units": units,
        }
        return result

    return run
