"""Execute an ExecuTorch program (`.pte`) in Python, one instruction at a time.

Why: the TOSA reference model runs only the delegated TOSA graph; everything
around it (quantize/dequantize at the edges, ops the partitioner left out) is
ordinary kernel calls in the execution plan. Walking the plan ourselves runs
the *program as built* - values table, chains, KernelCall / DelegateCall /
MoveCall / JumpFalseCall / FreeCall - with torch's reference ops for kernels
and a pluggable runner per delegate backend id.

Tensors are kept in logical (contiguous, NCHW) form. A value's `dim_order` says
how its bytes are laid out in memory; that matters only where raw memory
crosses a boundary: constant buffers, and delegate inputs/outputs (a delegate
sees memory, so its inputs are permuted into their dim order and its outputs
are read back from it).

Nothing here imports torch or executorch at module level; everything heavy is
imported by `load_program`, which runs in the worker child.

Over 500 lines on purpose: one interpreter (the instruction loop, its value store and the kernel
dispatch share one state); the delegates it calls are their own modules here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from bundlerun.bundles import scalar_types as st
from bundlerun.targets.failures import FailureKind
from bundlerun.bundles.scalar_types import code_from_numpy

MAX_INSTRUCTIONS = 10_000_000  # bound a runaway JumpFalse loop


class WalkError(Exception):
    """A case could not be executed; `kind` is the CaseResult.error_kind."""

    def __init__(self, kind: "FailureKind | str", message: str):
        super().__init__(message)
        self.kind = FailureKind.parse(kind).value  # the closed set: a kind outside it is a bug, raised here
        self.message = message


@dataclass
class DelegateInvocation:
    """What a delegate runner receives: its payload and the memory-layout inputs."""

    backend_id: str
    payload: bytes
    compile_specs: dict[str, bytes]
    inputs: list[np.ndarray]  # physical (dim-order) layout, program dtypes
    output_layouts: list[tuple[list[int], list[int], int]]  # (sizes, dim_order, scalar_type) per output
    named_data: dict[str, bytes] = field(default_factory=dict)  # the program's named data (e.g. MLX constants)


@dataclass
class InnerOutput:
    """One operator / instruction inside a delegate call and its output arrays (`bundlerun debug`).

    A runner that can look inside its payload has `capture_inner` (set it True to record) and
    `last_inner` (the list of the last call's InnerOutputs, in execution order)."""

    index: int  # operator / instruction index inside the payload
    op: str  # "tosa.CONV2D", "mlx.Addmm"
    name: str  # the output tensor's name (TOSA) or slot ("chain 0 #5", MLX)
    outputs: list[np.ndarray]
    info: dict[str, Any] = field(default_factory=dict)


class DelegateRunner(Protocol):
    """Executes one backend's delegate payloads (e.g. TOSA graphs on the reference model)."""

    def num_outputs(self, payload: bytes) -> int:
        """How many outputs the payload produces (DelegateCall args = inputs then outputs)."""
        ...

    def __call__(self, call: DelegateInvocation) -> list[np.ndarray]:
        """One numpy array per output, in physical (dim-order) layout."""
        ...


@dataclass
class LoadedProgram:
    """A deserialized program plus the lookups the walker needs."""

    program: Any  # executorch.exir.schema.Program
    method_names: list[str]
    delegate_ids: list[str] = field(default_factory=list)
    named_data: dict[str, bytes] = field(default_factory=dict)  # key -> bytes, from the program's named data segments

    def plan(self, method: str):
        for plan in self.program.execution_plan:
            if plan.name == method:
                return plan
        raise WalkError("bad-bundle", f"program has no method {method!r}; it has {', '.join(self.method_names)}")


def load_program(pte: bytes) -> LoadedProgram:
    """Deserialize a `.pte` (segments restored inline) for walking."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    _register_operator_libraries()

    try:
        pte_file = deserialize_pte_binary(bytes(pte))
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad program
        raise WalkError("bad-bundle", f"cannot deserialize the program: {exc}") from None
    program = pte_file.program
    ids = sorted({d.id for plan in program.execution_plan for d in plan.delegates})
    return LoadedProgram(program, [p.name for p in program.execution_plan], ids, _named_data(pte_file))


def _named_data(pte_file) -> dict[str, bytes]:
    """The program's named data (delegate constants such as MLX weights) as key -> bytes."""
    store = getattr(pte_file, "named_data", None)
    if store is None:
        return {}
    return {key: bytes(store.buffers[entry.buffer_index]) for key, entry in store.pte_data.items()}


def _register_operator_libraries() -> None:
    """Make the ops a program may name resolvable under torch.ops."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - quantized_decomposed functional ops
    import executorch.exir  # noqa: F401 - dim_order_ops, executorch_prim, edge ops

    try:  # quantized_decomposed::*.out schemas (ExecuTorch's quantized AOT library)
        import executorch.kernels.quantized  # noqa: F401
    except Exception:  # noqa: BLE001 - functional overloads still cover the common ops
        pass


@dataclass
class DelegateSummary:
    """One delegate of one method, read without torch (pre-flight checks)."""

    method: str
    backend_id: str
    compile_specs: dict[str, bytes]


def read_delegates(pte: bytes) -> list[DelegateSummary]:
    """Delegates of every method, straight from the Program flatbuffer (program.fbs).

    Torch-free, so a target can refuse a bundle it cannot run before starting a
    worker. Slots: Program.execution_plan=1; ExecutionPlan.name=0, delegates=7;
    BackendDelegate.id=0, compile_specs=2; CompileSpec.key=0, value=1.
    """
    from flatbuffers import encode, packer
    from flatbuffers.table import Table

    buf = bytes(pte)
    if len(buf) < 8 or buf[4:6] != b"ET":
        raise WalkError("bad-bundle", "not an ExecuTorch program (missing ET file identifier)")

    def vector(tab: Table, slot: int) -> list[Table]:
        off = tab.Offset(4 + 2 * slot)
        if not off:
            return []
        start = tab.Vector(off)
        return [Table(tab.Bytes, tab.Indirect(start + 4 * i)) for i in range(tab.VectorLen(off))]

    def string(tab: Table, slot: int) -> str:
        off = tab.Offset(4 + 2 * slot)
        return tab.String(off + tab.Pos).decode("utf-8", "replace") if off else ""

    def raw(tab: Table, slot: int) -> bytes:
        off = tab.Offset(4 + 2 * slot)
        if not off:
            return b""
        start = tab.Vector(off)
        return bytes(tab.Bytes[start : start + tab.VectorLen(off)])

    try:
        root = Table(buf, encode.Get(packer.uoffset, buf, 0))
        out = []
        for plan in vector(root, 1):
            method = string(plan, 0)
            for delegate in vector(plan, 7):
                specs = {string(c, 0): raw(c, 1) for c in vector(delegate, 2)}
                out.append(DelegateSummary(method, string(delegate, 0), specs))
        return out
    except (IndexError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise WalkError("bad-bundle", f"cannot read the program's delegates: {exc}") from None


# --------------------------------------------------------------------------- dtypes



def _dtype_name(code: int) -> str:
    try:
        return st.name(code)
    except Exception:  # noqa: BLE001 - an unknown code is named by its number
        return str(code)


def torch_dtype(code: int):
    try:
        return st.torch_dtype(code)
    except KeyError:
        raise WalkError("missing-operator", f"unsupported ExecuTorch scalar type code {int(code)}") from None


def tensor_to_numpy(t) -> np.ndarray:
    """Torch tensor -> numpy (bfloat16 as raw uint16 words, like bundles.scalar_types)."""
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy()
    return t.numpy()


def numpy_to_tensor(a: np.ndarray, code: int):
    import torch

    a = np.ascontiguousarray(a)
    if int(code) == 15:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _to_physical(t, dim_order: Sequence[int]):
    if list(dim_order) and list(dim_order) != list(range(t.dim())):
        return t.permute(list(dim_order)).contiguous()
    return t.contiguous()


def _from_physical(flat, sizes: Sequence[int], dim_order: Sequence[int]):
    order = list(dim_order) if dim_order else list(range(len(sizes)))
    physical_shape = [int(sizes[d]) for d in order]
    t = flat.reshape(physical_shape)
    if order != list(range(len(sizes))):
        inverse = [order.index(i) for i in range(len(order))]
        t = t.permute(inverse).contiguous()
    return t


# --------------------------------------------------------------------------- kernels


@dataclass
class _Kernel:
    """How one operator of the plan is executed with torch."""

    name: str  # "ns::op.overload" as in the program
    op: Any  # the torch OpOverload that is called
    schema: Any  # the schema of the program's operator (decides arg binding)
    out_names: list[str]  # out arguments of the program's operator (empty: functional op)
    functional: bool  # True: call `op` without the out args and copy into them


def _resolve_kernel(name: str, overload: str) -> _Kernel:
    import torch

    full = f"{name}.{overload}" if overload else name
    if "::" not in name:
        raise WalkError("missing-operator", f"operator {full} has no namespace")
    ns, op_name = name.split("::", 1)
    try:
        packet = getattr(getattr(torch.ops, ns), op_name)
        op = getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        raise WalkError("missing-operator", f"operator {full} has no torch reference implementation") from None
    schema = op._schema
    out_names = [a.name for a in schema.arguments if a.is_out]
    if not out_names:
        return _Kernel(full, op, schema, [], functional=False)
    # Prefer the functional overload (torch's reference op) with the same non-out arguments.
    wanted = [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]
    for other in dict.fromkeys(["default", *packet.overloads()]):
        if other == overload or not hasattr(packet, other):
            continue
        candidate = getattr(packet, other)
        cs = candidate._schema
        if any(a.is_out for a in cs.arguments) or cs.is_mutable:
            continue
        if [(a.name, str(a.type)) for a in cs.arguments] == wanted and len(cs.returns) == len(out_names):
            return _Kernel(full, candidate, schema, out_names, functional=True)
    return _Kernel(full, op, schema, out_names, functional=False)


# --------------------------------------------------------------------------- the walker


class _Frame:
    """The values table of one method execution, over the program's planned memory.

    Like the runtime, every memory-planned tensor is a view into its arena
    (`non_const_buffer_sizes`, at its allocation offset). This matters: ExecuTorch
    removes view_copy ops by giving the view the *same* memory as its source, so
    only shared memory makes a reshape after e.g. a mean visible to the next op.
    Results are copied into the planned memory, never rebound.
    """

    def __init__(self, loaded: LoadedProgram, plan):
        import torch

        self.loaded = loaded
        self.plan = plan
        sizes = list(plan.non_const_buffer_sizes or [])
        self.arenas = {m: torch.zeros(int(n), dtype=torch.uint8) for m, n in enumerate(sizes) if m > 0}
        self.values: list[Any] = [None] * len(plan.values)
        self._init_values()

    def _init_values(self) -> None:
        from executorch.exir import schema as S

        program = self.loaded.program
        for i, ev in enumerate(self.plan.values):
            v = ev.val
            if isinstance(v, S.Tensor):
                self.values[i] = self._init_tensor(v, program)
            elif isinstance(v, S.Int):
                self.values[i] = int(v.int_val)
            elif isinstance(v, S.Bool):
                self.values[i] = bool(v.bool_val)
            elif isinstance(v, S.Double):
                self.values[i] = float(v.double_val)  # may be the text 'inf' / '-inf' / 'nan'
            elif isinstance(v, S.String):
                self.values[i] = v.string_val
            elif isinstance(v, S.Null):
                self.values[i] = None
            elif isinstance(v, (S.DoubleList, S.BoolList)):
                self.values[i] = list(v.items)
            # IntList / TensorList / OptionalTensorList hold value indices: resolved on use.

    def _planned_view(self, v, sizes: list[int]):
        """A logical-shape view of tensor `v`'s planned memory."""
        import torch

        info = v.allocation_info
        arena = self.arenas.get(int(info.memory_id))
        if arena is None:
            raise WalkError("bad-bundle", f"tensor planned in memory arena {info.memory_id}, which the plan does not size")
        dtype = torch_dtype(v.scalar_type)
        itemsize = torch.empty((), dtype=dtype).element_size()
        offset = int(info.memory_offset_low) + (int(info.memory_offset_high) << 32)
        end = offset + int(np.prod(sizes, dtype=np.int64)) * itemsize
        if end > arena.numel():
            raise WalkError("bad-bundle", f"tensor at offset {offset} runs past planned arena {info.memory_id}")
        flat = arena[offset:end]
        flat = flat.view(dtype) if offset % itemsize == 0 else flat.clone().view(dtype)
        order = [int(d) for d in v.dim_order] or list(range(len(sizes)))
        view = flat.view([int(sizes[d]) for d in order])
        if order != list(range(len(sizes))):
            view = view.permute([order.index(k) for k in range(len(order))])
        return view

    def _init_tensor(self, v, program):
        import torch

        dtype = torch_dtype(v.scalar_type)
        sizes = [int(s) for s in v.sizes]
        constant = None
        if v.data_buffer_idx > 0:
            info = v.extra_tensor_info
            if info is not None and int(info.location) == 1:  # EXTERNAL: weights in a .ptd
                raise WalkError("missing-operator", "program keeps constant tensors in an external data file (.ptd)")
            storage = program.constant_buffer[v.data_buffer_idx].storage
            numel = int(np.prod(sizes, dtype=np.int64))
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            flat = torch.frombuffer(bytearray(bytes(storage[:nbytes])), dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
            constant = _from_physical(flat, sizes, v.dim_order)
        if v.allocation_info is None:
            return constant if constant is not None else torch.zeros(sizes, dtype=dtype)
        view = self._planned_view(v, sizes)
        if constant is not None:  # a mutable buffer: planned memory starts with its initial data
            view.copy_(constant)
        return view

    def _is_planned(self, index: int) -> bool:
        from executorch.exir import schema as S

        v = self.plan.values[index].val
        return isinstance(v, S.Tensor) and v.allocation_info is not None

    def get(self, index: int, type_hint: Any = None) -> Any:
        from executorch.exir import schema as S

        v = self.plan.values[index].val
        if isinstance(v, S.IntList):
            return [self.values[j] for j in v.items]
        if isinstance(v, S.TensorList):
            return [self.values[j] for j in v.items]
        if isinstance(v, S.OptionalTensorList):
            return [None if j < 0 else self.values[j] for j in v.items]
        return self.values[index]

    def set(self, index: int, value: Any) -> None:
        """Store a result: into planned memory for planned tensors, into the item
        slots for a TensorList, as a Python value otherwise."""
        import torch
        from executorch.exir import schema as S

        v = self.plan.values[index].val
        if isinstance(v, (S.TensorList, S.OptionalTensorList)):
            items = list(value)
            if len(items) != len(v.items):
                raise WalkError("bad-bundle", f"value {index}: {len(items)} tensors for a list of {len(v.items)}")
            for j, item in zip(v.items, items):
                if j >= 0:
                    self.set(j, item)
            return
        current = self.values[index]
        if value is current:
            return
        if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
            value = value.to(current.dtype)
            if not self._is_planned(index):
                self.values[index] = value
                return
            if tuple(value.shape) != tuple(current.shape):  # dynamic shape: same memory, new shape
                current = self._planned_view(v, list(value.shape))
                self.values[index] = current
            if value.untyped_storage().data_ptr() == current.untyped_storage().data_ptr():
                value = value.clone()  # a view of the same arena: copy_ may not overlap
            current.copy_(value)
        elif isinstance(value, torch.Tensor) and value.dim() == 0 and not isinstance(current, torch.Tensor):
            self.values[index] = value.item()
        else:
            self.values[index] = value

    def tensor_spec(self, index: int):
        from executorch.exir import schema as S

        v = self.plan.values[index].val
        if not isinstance(v, S.Tensor):
            raise WalkError("bad-bundle", f"value {index} is a {type(v).__name__}, expected a tensor")
        return v


def _convert_arg(value: Any, arg_type: Any) -> Any:
    """Program EValues carry ScalarType/MemoryFormat/Layout/Device as ints; torch wants objects."""
    import torch

    type_str = str(arg_type).rstrip("?")
    if value is None:
        return None
    if type_str == "ScalarType" and isinstance(value, int):
        return torch_dtype(value)
    if type_str == "MemoryFormat" and isinstance(value, int):
        return [torch.contiguous_format, torch.preserve_format, torch.channels_last, torch.channels_last_3d][value]
    if type_str == "Layout" and isinstance(value, int):
        return torch.strided
    if type_str == "Device":
        return torch.device("cpu")
    return value


def _fresh_like(value: Any) -> Any:
    """A contiguous tensor (or list of them) shaped like an out argument."""
    import torch

    if isinstance(value, (list, tuple)):
        return [_fresh_like(v) for v in value]
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype)
    return value


class ProgramWalker:
    """Runs methods of a loaded program; kernels via torch, delegates via `delegate_runners`."""

    def __init__(self, loaded: LoadedProgram, delegate_runners: dict[str, DelegateRunner]):
        self.loaded = loaded
        self.delegate_runners = delegate_runners
        self._kernels: dict[tuple[str, int], _Kernel] = {}
        # observer(method, chain_index, instruction_index, instruction, frame) after every KernelCall and
        # DelegateCall: how `bundlerun debug` collects intermediates (targets/intermediates.py)
        self.observer: Any = None

    # -- public -----------------------------------------------------------------------

    def check_supported(self, method: str) -> None:
        """Raise WalkError naming the first operator or backend this walker cannot run."""
        plan = self.loaded.plan(method)
        for d in plan.delegates:
            if d.id not in self.delegate_runners:
                raise WalkError(
                    "missing-backend",
                    f"delegate backend {d.id} cannot run here (supported: {', '.join(sorted(self.delegate_runners))})",
                )
        for i in range(len(plan.operators)):
            self._kernel(method, plan, i)

    def run(self, method: str, inputs: Sequence[Any]) -> list[tuple[int, np.ndarray]]:
        """Execute `method` on `inputs` (numpy arrays / scalars, program dtypes).

        Returns (scalar_type, array) per output, in the program's output dtypes.
        """
        import torch

        plan = self.loaded.plan(method)
        self.check_supported(method)
        frame = _Frame(self.loaded, plan)
        if len(inputs) != len(plan.inputs):
            raise WalkError("bad-bundle", f"method {method!r} takes {len(plan.inputs)} inputs, the case has {len(inputs)}")
        for pos, (index, value) in enumerate(zip(plan.inputs, inputs)):
            self._set_input(frame, pos, index, value)
        with torch.no_grad():
            for chain in plan.chains:
                self._run_chain(method, frame, chain)
        outputs = []
        for index in plan.outputs:
            value = frame.values[index]
            if isinstance(value, torch.Tensor):
                spec = frame.tensor_spec(index)
                code = int(spec.scalar_type)
                outputs.append((code, tensor_to_numpy(value.to(torch_dtype(code)))))
            elif isinstance(value, bool):
                outputs.append((11, np.array(value)))
            elif isinstance(value, int):
                outputs.append((4, np.array(value, dtype=np.int64)))
            elif isinstance(value, float):
                outputs.append((7, np.array(value, dtype=np.float64)))
            else:
                raise WalkError("missing-operator", f"output value {index} of type {type(value).__name__} is not supported")
        return outputs

    # -- internals ----------------------------------------------------------------------

    def _set_input(self, frame: _Frame, pos: int, index: int, value: Any) -> None:
        from executorch.exir import schema as S

        spec = frame.plan.values[index].val
        if isinstance(spec, S.Tensor):
            arr = np.asarray(value)
            code = int(spec.scalar_type)
            want = [int(s) for s in spec.sizes]
            if list(arr.shape) != want:
                raise WalkError("bad-bundle", f"input {pos} has shape {list(arr.shape)}, the program expects {want}")

            got = 15 if code == 15 and arr.dtype == np.uint16 else code_from_numpy(arr.dtype)
            if got != code:
                raise WalkError(
                    "bad-bundle",
                    f"input {pos} has dtype {_dtype_name(got)}, the program expects {_dtype_name(code)}",
                )
            frame.set(index, numpy_to_tensor(arr, code))
        else:
            frame.values[index] = value.item() if isinstance(value, np.ndarray) else value

    def _kernel(self, method: str, plan, op_index: int) -> _Kernel:
        key = (method, op_index)
        if key not in self._kernels:
            op = plan.operators[op_index]
            self._kernels[key] = _resolve_kernel(op.name, op.overload)
        return self._kernels[key]

    def _run_chain(self, method: str, frame: _Frame, chain) -> None:
        from executorch.exir import schema as S

        pc = 0
        steps = 0
        instructions = chain.instructions
        while pc < len(instructions):
            steps += 1
            if steps > MAX_INSTRUCTIONS:
                raise WalkError("bad-bundle", f"more than {MAX_INSTRUCTIONS} instructions executed (endless loop?)")
            ins = instructions[pc].instr_args
            if isinstance(ins, S.KernelCall):
                self._kernel_call(method, frame, ins)
            elif isinstance(ins, S.DelegateCall):
                self._delegate_call(frame, ins)
            elif isinstance(ins, S.MoveCall):
                frame.values[ins.move_to] = frame.get(ins.move_from)  # EValue copy: aliases, as in the runtime
            elif isinstance(ins, S.JumpFalseCall):
                cond = frame.get(ins.cond_value_index)
                if hasattr(cond, "item"):
                    cond = bool(cond.item())
                if not cond:
                    pc = ins.destination_instruction
                    continue
            elif isinstance(ins, S.FreeCall):
                pass  # memory is managed by Python; freeing changes no result
            else:
                raise WalkError("missing-operator", f"instruction {type(ins).__name__} is not supported")
            if self.observer is not None and isinstance(ins, (S.KernelCall, S.DelegateCall)):
                self.observer(method, self.loaded.plan(method).chains.index(chain), pc, ins, frame)
            pc += 1

    def _kernel_call(self, method: str, frame: _Frame, call) -> None:
        kernel = self._kernel(method, frame.plan, call.op_index)
        schema_args = kernel.schema.arguments
        n = len(schema_args)
        if len(call.args) < n:
            raise WalkError("bad-bundle", f"{kernel.name}: {len(call.args)} arguments, schema needs {n}")
        positional: list[Any] = []
        keyword: dict[str, Any] = {}
        out_indices: list[int] = []
        fresh_outs: list[Any] = []
        for arg, index in zip(schema_args, call.args[:n]):
            if arg.is_out:
                out_indices.append(index)
                if kernel.functional:
                    continue
                value = _fresh_like(frame.get(index))  # written, then copied into planned memory
                fresh_outs.append(value)
            else:
                value = _convert_arg(frame.get(index), arg.type)
            if arg.kwarg_only:
                keyword[arg.name] = value
            else:
                positional.append(value)
        ret_indices = list(call.args[n:])
        try:
            result = kernel.op(*positional, **keyword)
        except WalkError:
            raise
        except Exception as exc:  # noqa: BLE001 - a kernel failure is this case's error
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if isinstance(exc, NotImplementedError) or "Could not run" in msg:
                raise WalkError("missing-operator", f"operator {kernel.name} has no CPU kernel in torch: {msg}") from None
            raise WalkError("runner-error", f"{kernel.name} failed: {msg}") from None
        targets = out_indices if kernel.out_names else ret_indices
        if kernel.out_names and not kernel.functional:
            results = fresh_outs  # the out-variant wrote into fresh tensors
        else:
            results = list(result) if isinstance(result, (tuple, list)) and len(targets) != 1 else [result]
            if len(results) != len(targets):
                raise WalkError("bad-bundle", f"{kernel.name}: {len(results)} results for {len(targets)} outputs")
        for index, value in zip(targets, results):
            frame.set(index, value)
        if kernel.out_names:
            self._alias_returns(frame, out_indices, ret_indices)

    @staticmethod
    def _alias_returns(frame: _Frame, out_indices: list[int], ret_indices: list[int]) -> None:
        """The return slots of an out-variant call are its out args: one value per
        out, or a single list value holding all of them (multi-output ops)."""
        outs = [frame.get(i) for i in out_indices]
        if len(ret_indices) == 1 and len(out_indices) > 1:
            if ret_indices[0] not in out_indices:
                frame.set(ret_indices[0], outs)
            return
        for ret, out in zip(ret_indices, out_indices):
            if ret != out:
                frame.set(ret, frame.get(out))

    def _delegate_call(self, frame: _Frame, call) -> None:
        import torch

        program = self.loaded.program
        delegate = frame.plan.delegates[call.delegate_index]
        runner = self.delegate_runners.get(delegate.id)
        if runner is None:
            raise WalkError("missing-backend", f"delegate backend {delegate.id} cannot run here")
        ref = delegate.processed
        if int(ref.location) != 0:  # restored segments are inline after deserialize_pte_binary
            raise WalkError("bad-bundle", f"delegate {delegate.id} payload is not inline")
        payload = bytes(program.backend_delegate_data[ref.index].data)
        specs = {c.key: bytes(c.value) for c in delegate.compile_specs}
        n_out = runner.num_outputs(payload)
        if n_out > len(call.args):
            raise WalkError("bad-bundle", f"{delegate.id} payload has {n_out} outputs but the call passes {len(call.args)} values")
        in_idx, out_idx = list(call.args[: len(call.args) - n_out]), list(call.args[len(call.args) - n_out :])
        inputs = []
        for index in in_idx:
            value = frame.get(index)
            if isinstance(value, torch.Tensor):
                spec = frame.tensor_spec(index)
                inputs.append(tensor_to_numpy(_to_physical(value, spec.dim_order)))
            else:
                inputs.append(np.asarray(value))
        layouts = []
        for index in out_idx:
            spec = frame.tensor_spec(index)
            layouts.append(([int(s) for s in spec.sizes], [int(d) for d in spec.dim_order], int(spec.scalar_type)))
        outputs = runner(DelegateInvocation(delegate.id, payload, specs, inputs, layouts, self.loaded.named_data))
        if len(outputs) != len(out_idx):
            raise WalkError("runner-error", f"{delegate.id} returned {len(outputs)} outputs, the program expects {len(out_idx)}")
        for index, array, (sizes, dim_order, code) in zip(out_idx, outputs, layouts):
            want = int(np.prod(sizes, dtype=np.int64))
            if array.size != want:
                raise WalkError("runner-error", f"{delegate.id} output has {array.size} elements, the program expects {want} ({sizes})")
            flat = numpy_to_tensor(np.asarray(array).reshape(-1), code)
            frame.set(index, _from_physical(flat.to(torch_dtype(code)), sizes, dim_order))
