"""What an embedded ExecuTorch program declares about its methods' inputs and outputs.

Read straight from the program flatbuffer (`program.fbs`, identifier ET12) with
the bounds-checked reader, so every reader of a bundle, on any target and
without torch, can check the bundle's expected outputs against the program the
same way the host runtime's `method_meta` does: a scalar or missing expected
value where the program returns a tensor is a broken bundle, not a SKIP. The inputs
tell a lane whether a case's inputs can be fed as raw files (executor_runner's
`--inputs`, which copies bytes into tensors of the declared meta) instead of through BundleIO.
"""

from __future__ import annotations

from dataclasses import dataclass

from bundlerun.bundles.flatbuf import FlatReader, FlatTable

PROGRAM_IDENTIFIER = b"ET12"
# KernelTypes union of program.fbs (NONE = 0).
_KERNEL_TYPES = {1: "null", 2: "int", 3: "bool", 4: "double", 5: "tensor", 6: "string", 7: "int_list",
                 8: "double_list", 9: "bool_list", 10: "tensor_list", 11: "optional_tensor_list"}
_TENSOR = 5
STATIC = 0  # TensorShapeDynamism


@dataclass
class DeclaredOutput:
    """One input or output of a method: its kind, and for tensors dtype code, sizes, dim order and
    whether the sizes are static."""

    kind: str
    scalar_type: int | None = None
    sizes: list[int] | None = None
    static: bool = True
    dim_order: list[int] | None = None


# ExecutionPlan slots of program.fbs: inputs = 3, outputs = 4 (vectors of indices into values = 2).
_INPUTS, _OUTPUTS = 3, 4


def method_outputs(program: bytes, source: str) -> dict[str, list[DeclaredOutput]] | None:
    """Declared outputs per method name; None when the program is not an ET12 flatbuffer
    (a future program format is left to the runtime rather than rejected here)."""
    return _method_values(program, source, _OUTPUTS, "output")


def method_inputs(program: bytes, source: str) -> dict[str, list[DeclaredOutput]] | None:
    """Declared inputs per method name, as method_outputs."""
    return _method_values(program, source, _INPUTS, "input")


def input_dim_orders(program: bytes, method: str = "forward") -> list[list[int] | None]:
    """Per input of `method`, the dim order the program declares for it when that is not contiguous
    (e.g. (0, 2, 3, 1) for the cortex-m recipe's channels_last image inputs); None otherwise. A
    bundled input must hold its bytes in that order: the runtime copies them without looking at it
    (runtime/executor/method.cpp:1250). Every other recipe exports contiguous inputs."""
    orders: list[list[int] | None] = []
    for d in (method_inputs(program, "lowered program") or {}).get(method) or []:
        order = list(d.dim_order or [])
        contiguous = d.kind != "tensor" or not order or order == list(range(len(order)))
        orders.append(None if contiguous else order)
    return orders


def _method_values(program: bytes, source: str, slot: int, what: str) -> dict[str, list[DeclaredOutput]] | None:
    if bytes(program[4:8]) != PROGRAM_IDENTIFIER:
        return None
    reader = FlatReader(program, source, "embedded ExecuTorch program")
    root = reader.root("program")
    methods: dict[str, list[DeclaredOutput]] = {}
    for i, plan in enumerate(root.tables(1, "execution plan")):
        name = plan.string(0, f"execution plan {i} name", 4096) or ""
        start, count = plan.vector(2, 4, f"method {name!r} values")
        values = []
        for k, index in enumerate(plan.scalars(slot, "i32", f"method {name!r} {what}s")):
            if not 0 <= index < count:
                raise reader.fail(f"method {name!r} {what} {k} refers to value {index} of {count}")
            value = FlatTable.at(reader, reader.indirect(start + 4 * index, "value"), f"method {name!r} value {index}")
            values.append(_declared(value, what))
        methods[name] = values
    return methods


def _declared(value: FlatTable, what: str) -> DeclaredOutput:
    kind = int(value.scalar(0, "u8", 0))
    if kind != _TENSOR:
        return DeclaredOutput(_KERNEL_TYPES.get(kind, f"type {kind}"))
    tensor = value.table(1, f"{what} tensor")
    if tensor is None:
        raise value.reader.fail(f"an {what} tensor has no content")
    return DeclaredOutput(
        kind="tensor",
        scalar_type=int(tensor.scalar(0, "i8", 0)),
        sizes=[int(s) for s in tensor.scalars(2, "i32", f"{what} tensor sizes")],
        static=int(tensor.scalar(8, "i8", STATIC)) == STATIC,
        dim_order=[int(d) for d in tensor.scalars(3, "u8", f"{what} tensor dim order")],
    )


def program_operators(program: bytes, source: str = "program") -> set[str]:
    """Every operator the program's methods call ("aten::add.out"), as a runner registers them:
    what a selective runner build must contain. Empty for a non-ET12 program."""
    if bytes(program[4:8]) != PROGRAM_IDENTIFIER:
        return set()
    reader = FlatReader(program, source, "embedded ExecuTorch program")
    names: set[str] = set()
    for i, plan in enumerate(reader.root("program").tables(1, "execution plan")):
        for k, op in enumerate(plan.tables(6, f"execution plan {i} operators")):
            name = op.string(0, f"operator {k} name", 4096) or ""
            overload = op.string(1, f"operator {k} overload", 4096) or ""
            names.add(f"{name}.{overload}" if overload else name)
    return names


# ExecutionPlan slot 8 of program.fbs: non_const_buffer_sizes ([int64]; entry 0 is reserved).
_NON_CONST_BUFFER_SIZES = 8


def planned_buffer_sizes(program: bytes, source: str = "program") -> dict[str, list[int]]:
    """Per method, the sizes of its memory-planned buffers (mem_id 1, 2, ...), as a runner allocates
    them before loading the method (program.fbs: "non_const_buffer_sizes[0]" is reserved, so it is
    dropped). Empty for a non-ET12 program."""
    if bytes(program[4:8]) != PROGRAM_IDENTIFIER:
        return {}
    reader = FlatReader(program, source, "embedded ExecuTorch program")
    sizes: dict[str, list[int]] = {}
    for i, plan in enumerate(reader.root("program").tables(1, "execution plan")):
        name = plan.string(0, f"execution plan {i} name", 4096) or ""
        values = plan.scalars(_NON_CONST_BUFFER_SIZES, "i64", f"method {name!r} planned buffer sizes")
        if any(v < 0 for v in values):
            raise reader.fail(f"method {name!r} declares a negative planned buffer size")
        sizes[name] = [int(v) for v in values[1:]]
    return sizes
