"""The backend test suite's golden artifacts -> `.bpte` bundles, replayable on any target.

With `GOLDEN_ARTIFACTS_DIR` set, the suite writes per flow (suite/conftest.py TestRunner:
`<dir>/<flow>/`) and per test (runner.py run_test: `<test name without test_>[_<subtest>]`):

- `<name>_input.bin`, or `<name>_input_<i>.bin` when the model takes several inputs
  (harness/tester.py _dump_golden_artifacts): each tensor input's raw bytes in the tensor's
  *dim order* (`t.permute(t.dim_order()).contiguous()`);
- `<name>_expected_output.bin` / `<name>_expected_output_<i>.bin`: the reference's raw bytes,
  `.contiguous()`: logical (row-major) order;
- `<name>.pte`, only after a passing comparison and only for flows that serialize (runner.py:
  "Dump .pte after successful comparison"; the arm_tosa_* flows have supports_serialize=False).

The files carry no dtype or shape: those are read from the program (its `forward` plan's
input and output tensors). An input the program takes in another dim order (channels-last) is
read in that order and stored in it again (bundles/bpte.py BundledValue.from_array). Every bad golden (missing file, wrong size, a .pte that is not a program)
is one line naming the file; the others are imported.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.flatbuf import FlatReader, FlatTable
from bundlerun.bundles.limits import MAX_PROGRAM_BYTES
from bundlerun.bundles.manifest_schema import MAX_DIMS
from bundlerun.bundles.safe_read import read_bounded, walk_files
from bundlerun.bundles.program_meta import PROGRAM_IDENTIFIER

_TENSOR = 5  # KernelTypes.Tensor (program.fbs)
_ARTIFACT = re.compile(r"^(?P<name>.+?)_(?P<kind>input|expected_output)(?:_(?P<index>\d+))?\.bin$")


class GoldenError(BundlerunError):
    """One golden cannot be imported; the message names the file."""


@dataclass
class PlanTensor:
    """An input or output of the program's method: its kind, and for tensors dtype, sizes, dim order."""

    kind: str
    scalar_type: int | None = None
    sizes: list[int] = field(default_factory=list)
    dim_order: list[int] = field(default_factory=list)
    static: bool = True

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * st.itemsize(self.scalar_type)

    def describe(self) -> str:
        order = "" if self.dim_order == list(range(len(self.sizes))) else f" in dim order {tuple(self.dim_order)}"
        return f"{st.name(self.scalar_type)}{self.sizes}{order}"


def plan_values(program: bytes, source: str, method: str = "forward") -> tuple[list[PlanTensor], list[PlanTensor]]:
    """(inputs, outputs) of `method`, read from the program flatbuffer (program.fbs:
    ExecutionPlan.values=2, inputs=3, outputs=4; Tensor.scalar_type=0, sizes=2, dim_order=3,
    shape_dynamism=8). GoldenError when it is not an ExecuTorch program."""
    if len(program) < 8 or bytes(program[4:8]) != PROGRAM_IDENTIFIER:
        raise GoldenError(f"{source}: not an ExecuTorch program (file identifier {bytes(program[4:8])!r}, "
                          f"expected {PROGRAM_IDENTIFIER!r})")
    try:
        reader = FlatReader(program, source, "ExecuTorch program")
        for i, plan in enumerate(reader.root("program").tables(1, "execution plan")):
            if (plan.string(0, f"execution plan {i} name", 4096) or "") != method:
                continue
            start, count = plan.vector(2, 4, f"method {method!r} values")

            def read(slot: int, what: str) -> list[PlanTensor]:
                out = []
                for k, index in enumerate(plan.scalars(slot, "i32", f"method {method!r} {what}s")):
                    if not 0 <= index < count:
                        raise reader.fail(f"method {method!r} {what} {k} refers to value {index} of {count}")
                    value = FlatTable.at(reader, reader.indirect(start + 4 * index, "value"), f"{what} {k}")
                    out.append(_tensor(value))
                return out

            return read(3, "input"), read(4, "output")
    except BundlerunError as exc:
        raise GoldenError(f"{source}: not a readable ExecuTorch program ({exc})"[:400]) from None
    raise GoldenError(f"{source}: the program has no {method!r} method")


def _tensor(value: FlatTable) -> PlanTensor:
    kind = int(value.scalar(0, "u8", 0))
    if kind != _TENSOR:
        return PlanTensor(kind={2: "int", 3: "bool", 4: "double"}.get(kind, f"type {kind}"))
    t = value.table(1, "tensor")
    if t is None:
        raise value.reader.fail("a tensor value has no content")
    sizes = [int(s) for s in t.scalars(2, "i32", "tensor sizes")]
    order = [int(d) for d in t.scalars(3, "u8", "tensor dim_order")] or list(range(len(sizes)))
    code = int(t.scalar(0, "i8", 0))
    try:
        st.name(code)
    except st.UnsupportedScalarType as exc:
        raise value.reader.fail(str(exc)) from None
    if len(sizes) > MAX_DIMS or sorted(order) != list(range(len(sizes))):
        raise value.reader.fail(f"a tensor of {len(sizes)} sizes has dim order {order[:MAX_DIMS]}")
    return PlanTensor("tensor", code, sizes, order, int(t.scalar(8, "i8", 0)) == 0)


@dataclass
class Golden:
    """One test's artifacts in a flow folder."""

    flow: str
    name: str
    folder: Path
    root: Path | None = None  # the folder imported: every file read must resolve inside it

    @property
    def pte(self) -> Path:
        return self.folder / f"{self.name}.pte"

    def artifact(self, kind: str, index: int, count: int) -> Path:
        suffix = "" if count == 1 else f"_{index}"
        return self.folder / f"{self.name}_{kind}{suffix}.bin"


@dataclass
class GoldenProblem:
    path: Path
    message: str


def find_goldens(root: str | Path) -> tuple[list[Golden], list[GoldenProblem]]:
    """Every golden under `root` (a GOLDEN_ARTIFACTS_DIR with one folder per flow, or one flow
    folder), and the artifacts that have no program beside them. The tree is walked without
    recursion and bounded in depth and size (bundles/safe_read.py); what a name points at (a FIFO,
    a device, a link out of `root`) is refused when the golden is read, by name."""
    root = Path(root)
    if not root.is_dir():
        raise GoldenError(f"{root}: not a folder of golden artifacts (GOLDEN_ARTIFACTS_DIR)")
    by_folder: dict[Path, list[Path]] = {}
    for path in walk_files(root):
        if path.suffix in (".pte", ".bin"):
            by_folder.setdefault(path.parent, []).append(path)
    goldens: list[Golden] = []
    problems: list[GoldenProblem] = []
    for folder in sorted(by_folder):
        flow = folder.name if folder != root else root.name
        files = sorted(by_folder[folder])
        names = [p.stem for p in files if p.suffix == ".pte"]
        goldens += [Golden(flow, n, folder, root) for n in names]
        for path in (p for p in files if p.suffix == ".bin"):
            m = _ARTIFACT.match(path.name)
            if m is None:
                problems.append(GoldenProblem(path, f"{path}: not a golden artifact name "
                                                    "(<name>_input[_i].bin or <name>_expected_output[_i].bin)"))
            elif m.group("name") not in names:
                problems.append(GoldenProblem(path, f"{path}: no {m.group('name')}.pte beside it (the suite writes "
                                                    "the program only after a passing comparison, and not for flows "
                                                    "that do not serialize, e.g. arm_tosa_*)"))
    if not goldens and not problems:
        raise GoldenError(f"{root}: no golden artifacts (<name>.pte with <name>_input*.bin) found")
    return goldens, problems


def _read_tensor(path: Path, spec: PlanTensor, physical: bool, root: Path | None, budget: int) -> np.ndarray:
    """The file's bytes as a logical array of the program's dtype and sizes. `physical`: the
    bytes are in the tensor's dim order (inputs); else logical order (expected outputs). The size
    is checked on the opened file before it is read; a FIFO, a device or a link out of `root` is
    refused; `budget`: the bytes the bundle still has room for."""
    if not os.path.lexists(path):
        raise GoldenError(f"{path}: missing (the program's {spec.describe()} tensor needs it)")
    if any(s < 0 for s in spec.sizes) or spec.nbytes > budget:
        raise GoldenError(f"{path}: the program declares a {spec.describe()} tensor, which does not fit a bundle "
                          f"(at most {MAX_PROGRAM_BYTES} bytes in all)"[:400])
    what = f"for the program's {spec.describe()} tensor" + (
        "" if spec.static else " (a dynamic shape: the file must hold its upper bound)")
    data = read_bounded(path, spec.nbytes, root=root, exact=spec.nbytes, what=what)
    order = list(spec.dim_order)
    # bytes in the program's dim order (channels-last): read back to logical order; the bundle stores
    # them in that order again (bundles/from_program.py, program_meta.input_dim_orders)
    reorder = physical and order != list(range(len(spec.sizes))) and sorted(order) == list(range(len(spec.sizes)))
    array = st.to_array(spec.scalar_type, [spec.sizes[d] for d in order] if reorder else spec.sizes, data)
    return np.ascontiguousarray(array.transpose(np.argsort(order))) if reorder else array


def read_golden(golden: Golden) -> tuple[bytes, list[np.ndarray], list[np.ndarray]]:
    """(program, inputs, expected outputs) of one golden; GoldenError names the bad file."""
    program = read_bounded(golden.pte, MAX_PROGRAM_BYTES, root=golden.root)
    inputs_spec, outputs_spec = plan_values(program, str(golden.pte))
    budget = MAX_PROGRAM_BYTES - len(program)  # everything read ends in one bundle (one flatbuffer)
    read: dict[str, list[np.ndarray]] = {"input": [], "expected_output": []}
    for kind, specs in (("input", inputs_spec), ("expected_output", outputs_spec)):
        for i, spec in enumerate(specs):
            if spec.kind != "tensor":
                raise GoldenError(f"{golden.pte}: {kind.split('_')[-1]} {i} is a {spec.kind}, and the goldens hold "
                                  f"tensor {kind.split('_')[-1]}s only")
            array = _read_tensor(golden.artifact(kind, i, len(specs)), spec, kind == "input", golden.root, budget)
            budget -= array.nbytes
            read[kind].append(array)
    return program, read["input"], read["expected_output"]


@dataclass
class ImportResult:
    golden: Golden
    path: Path | None = None
    error: str | None = None
    criteria: str = ""


def import_golden(golden: Golden, out_dir: Path, numbers: Any, *, target: str | None = None,
                  backend: str | None = None, dtype: str | None = None, registry: Any = None) -> ImportResult:
    """One golden -> `<out>/<flow>/<name>.bpte`, its tolerances from the registry for the flow's backend.
    `numbers`: what the flow asks of the registry (runner/suite/flows.FlowNumbers: backend, dtype,
    reference, problem), resolved by the caller from the flow's name; `target`: the flow's default
    target or the user's (else host://<backend>)."""
    from bundlerun.bundles.from_program import ProgramBundleRequest, ProgramCase, bundle_program  # start-up: loads flatbuffers, tomli on use

    try:
        program, inputs, outputs = read_golden(golden)
        chosen = backend or numbers.backend
        if chosen is None:
            raise GoldenError(f"{golden.pte}: {numbers.problem}; give --backend")
        url = target or f"host://{chosen}"
        built = bundle_program(ProgramBundleRequest(
            program=program, cases={"forward": [ProgramCase(inputs, outputs)]}, backend=chosen,
            dtype=dtype or numbers.dtype, target=url, reference=numbers.reference, model=f"{golden.flow}/{golden.name}",
            model_source=str(golden.pte), quantization=f"suite flow {golden.flow}", registry=registry,
            description="golden artifacts of ExecuTorch's backend test suite",
            lowering={"source": "ExecuTorch backend test suite golden artifacts", "flow": golden.flow},
            extra={"suite": {"flow": golden.flow, "test": golden.name, "golden": str(golden.folder)}}),
            Path(out_dir) / golden.flow / f"{golden.name}.bpte")
    except BundlerunError as exc:
        return ImportResult(golden, error=str(exc))
    except OSError as exc:
        return ImportResult(golden, error=f"{exc.filename or golden.pte}: cannot read ({exc.strerror})")
    spec = built.manifest.methods["forward"].outputs
    crit = "; ".join(f"{o.name}: " + " ".join(f"{k} {getattr(o.criteria, k):g}" for k in
                                               ("atol", "rtol", "qtol", "sqnr_min_db", "cosine_min")
                                               if getattr(o.criteria, k) is not None) for o in spec)
    return ImportResult(golden, path=built.path, criteria=crit)
