"""An already-lowered program + inputs + expected outputs -> `.bpte` with resolved tolerances.

`bundles/builder.py` lowers a model itself. Everything that arrives with a program that was
lowered elsewhere goes through here instead: ExecuTorch's backend test suite and its Tester
(runner/suite/), a nightly's golden artifacts (bundles/goldens.py), and the Python API. The
caller says which backend, dtype and target the numbers are for, and hands over the output
quantization parameters when it knows them (qtol counts steps of that scale); the registry
(bundles/registry.py) resolves every output's criteria with their trail, exactly as a build
does, and the manifest records where the program came from.

Expected outputs are stored in the dtype the program declares for each output (the stock
runtime verifies the file too), inputs as given, laid out in the dim order the program declares for
them (bundles/program_meta.py input_dim_orders). Nothing here imports torch unless a tensor
is handed in.
"""

from __future__ import annotations

import datetime as _dt
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bundlerun.bundles.manifest_records import BuildInfo, ModelInfo
from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite, write_bundle
from bundlerun.bundles.errors import BuildError, BundlerunError
from bundlerun.bundles.manifest import Manifest, MethodManifest, OutputSpec, TensorSpec
from bundlerun.bundles.program_meta import input_dim_orders, method_outputs, program_operators
from bundlerun.bundles.registry import BASE_DTYPES, REFERENCES
from bundlerun.bundles.tolerances import ToleranceContext, resolve_criteria
from bundlerun.bundles.dynamic_shapes import shape_over_cases


@dataclass
class ProgramCase:
    """One test case: the method's inputs and the reference's outputs (tensors, arrays or scalars)."""

    inputs: Sequence[Any]
    expected: Sequence[Any]


@dataclass
class ProgramBundleRequest:
    """What is known about a lowered program: enough to bundle it and resolve its tolerances."""

    program: Any  # .pte bytes, or anything with `.buffer` (ExecutorchProgramManager, a Tester's Serialize artifact)
    cases: dict[str, list[ProgramCase]]  # method name -> its cases
    backend: str  # registry backend: xnnpack | portable | arm | qnn | vulkan | cortex-m | coreml | nxp | mlx ...
    dtype: str  # fp32 | fp16 | bf16 | int8 | int16: the dtype tier the numbers are for
    target: str  # target URL (or variant name) the bundle is meant for: picks the registry variant
    reference: str = "eager-fp32"  # what produced `expected`: eager-fp32 | quantized
    output_qparams: dict[str, list[tuple[float, int] | None]] = field(default_factory=dict)  # method -> per output
    model: str = "program"  # the manifest's model id (a test id, a golden's name)
    model_source: str = ""
    description: str = ""
    ops: list[str] | None = None  # operators of the model for op rules (default: the program's kernel calls)
    quantization: str | None = None
    input_distribution: str = "randn"
    overrides: dict[str, Any] = field(default_factory=dict)  # criterion (or out0.atol ...) -> value
    registry: Any = None  # the session's registry; None: built-in + the cwd's project config
    lowering: dict[str, Any] = field(default_factory=dict)  # manifest build.lowering: where the program came from
    extra: dict[str, Any] = field(default_factory=dict)  # manifest extra (e.g. {"suite": {...}})
    host_arch: str | None = None  # machine whose arithmetic is judged (None: this one), for adjustments


@dataclass
class ProgramBundle:
    bundle: Bundle
    manifest: Manifest
    path: Path


def program_bytes(program: Any) -> bytes:
    """The .pte bytes of `program` (bytes, or an object with `.buffer`)."""
    data = getattr(program, "buffer", program)
    if callable(data):
        data = data()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BuildError(f"expected .pte bytes or an ExecutorchProgramManager, got {type(program).__name__}")
    data = bytes(data)
    if len(data) < 8 or data[4:6] != b"ET":
        raise BuildError(f"not an ExecuTorch program (file identifier {data[4:8]!r}, expected b'ET..')")
    return data


def to_array(value: Any) -> np.ndarray | None:
    """A tensor or array as a contiguous numpy array in logical (row-major) order; bfloat16
    as its raw uint16 words. None for a Python scalar."""
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value)
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor (torch imported by the caller)
        import torch

        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16).copy()
        return t.numpy().copy()
    return None


def _code(value: Any, array: np.ndarray) -> int:
    dtype = getattr(value, "dtype", None)
    if dtype is not None and not isinstance(value, np.ndarray):
        try:
            return st.code_from_torch(dtype)
        except KeyError:
            raise BuildError(f"unsupported tensor dtype {dtype}") from None
    try:
        return st.code_from_numpy(array.dtype)
    except st.UnsupportedScalarType as exc:
        raise BuildError(str(exc)) from None


def to_value(value: Any, want: int | None = None, what: str = "value",
             dim_order: list[int] | None = None) -> BundledValue:
    """A BundleIO value; with `want` (a ScalarType code) a float/int tensor is cast to it; with
    `dim_order` its bytes are stored in that order (a program input declared channels_last)."""
    if isinstance(value, bool):
        return BundledValue(kind="bool", scalar=value)
    if isinstance(value, int):
        return BundledValue(kind="int", scalar=value)
    if isinstance(value, float):
        return BundledValue(kind="double", scalar=value)
    array = to_array(value)
    if array is None:
        raise BuildError(f"{what}: {type(value).__name__} is not a tensor, array or scalar")
    code = _code(value, array)
    if want is not None and want != code:
        if want == st.BFLOAT16 or code == st.BFLOAT16:
            raise BuildError(f"{what} is {st.name(code)}, the program declares {st.name(want)}")
        array = array.astype(st.numpy_dtype(want))
        code = want
    if dim_order is not None and len(dim_order) != array.ndim:
        raise BuildError(f"{what} has {array.ndim} dimensions, the program declares {len(dim_order)}")
    return BundledValue.from_array(array, code, dim_order=dim_order)


def _flatten(outputs: Any) -> list[Any]:
    if isinstance(outputs, (list, tuple)):
        flat: list[Any] = []
        for o in outputs:
            flat.extend(_flatten(o))
        return flat
    if isinstance(outputs, dict):
        return _flatten(list(outputs.values()))
    return [outputs]


def bundle_program(req: ProgramBundleRequest, output: str | Path) -> ProgramBundle:
    """Build, seal and write the bundle; every problem is a one-line BuildError."""
    program = program_bytes(req.program)
    if req.dtype not in BASE_DTYPES:
        raise BuildError(f"unknown dtype {req.dtype!r}; choose one of {', '.join(BASE_DTYPES)}")
    if req.reference not in REFERENCES:
        raise BuildError(f"unknown reference {req.reference!r}; choose {' or '.join(REFERENCES)}")
    if not req.cases or not any(req.cases.values()):
        raise BuildError("no test cases to bundle")
    try:
        declared = method_outputs(program, "program")
    except BundlerunError as exc:
        raise BuildError(f"the program cannot be read: {exc}") from None
    ops = list(req.ops) if req.ops is not None else sorted(program_operators(program))
    suites: list[MethodTestSuite] = []
    methods: dict[str, MethodManifest] = {}
    for method, cases in req.cases.items():
        if declared is not None and method not in declared:
            raise BuildError(f"the program has no method {method!r} (it has {', '.join(map(repr, declared)) or 'none'})")
        outs = declared.get(method) if declared is not None else None
        in_orders = input_dim_orders(program, method) if declared is not None else []
        test_cases = []
        for i, case in enumerate(cases):
            expected = _flatten(case.expected)
            if outs is not None and len(expected) != len(outs):
                raise BuildError(f"method {method!r} case {i}: {len(expected)} expected outputs, "
                                 f"the program returns {len(outs)}")
            values = [to_value(e, outs[j].scalar_type if outs is not None and outs[j].kind == "tensor" else None,
                               f"method {method!r} case {i} expected output {j}") for j, e in enumerate(expected)]
            inputs = [to_value(x, None, f"method {method!r} case {i} input {k}",
                               in_orders[k] if k < len(in_orders) else None) for k, x in enumerate(case.inputs)]
            test_cases.append(BundledTestCase(inputs=inputs, expected_outputs=values))
        suites.append(MethodTestSuite(method, test_cases))
        methods[method] = _method_manifest(req, method, test_cases, ops)
    manifest = Manifest(
        model=ModelInfo.from_dict({"id": req.model, "source": req.model_source, "description": req.description}),
        build=BuildInfo.from_dict({
            "backend": req.backend,
            "target": req.target,
            "dtype": req.dtype,
            "quantization": req.quantization,
            "reference": req.reference,
            "inputs": [{"shape": list(v.sizes), "dtype": st.name(v.scalar_type), "distribution": req.input_distribution}
                       for v in suites[0].test_cases[0].inputs if v.kind == "tensor"],
            "cases": sum(len(s.test_cases) for s in suites),
            "lowering": dict(req.lowering),
            "ops": ops,
            "overrides": dict(req.overrides),
        }),
        versions=_versions(),
        methods=methods,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        extra=dict(req.extra),
    )
    bundle = Bundle(program=program, method_test_suites=suites, manifest_json=manifest.to_dict())
    try:
        path = write_bundle(bundle, output)
    except OSError as exc:
        raise BuildError(f"cannot write {output}: {exc.strerror or exc}") from None
    return ProgramBundle(bundle=bundle, manifest=manifest, path=Path(path))


def _versions() -> dict[str, str]:
    from bundlerun.bundles.versions import package_versions  # late: looked up at call time (tests replace it)

    return {"python": platform.python_version(), "host": platform.machine(),
            **package_versions(("bundlerun", "torch", "executorch"))}


def _over_cases(method: str, what: str, values: list[BundledValue]) -> tuple[list[int], list[int]]:
    """One tensor's manifest shape over the cases (the largest size of a dim that varies: a dynamic
    dim), and those dims; cases of different kinds or ranks are a BuildError."""

    if any(v.kind != "tensor" for v in values):
        raise BuildError(f"method {method!r}: {what} is a tensor in some cases and not in others")
    try:
        return shape_over_cases([list(v.sizes) for v in values])
    except ValueError as exc:
        raise BuildError(f"method {method!r}: {what}: {exc}") from None


def _method_manifest(req: ProgramBundleRequest, method: str, cases: list[BundledTestCase], ops: list[str]) -> MethodManifest:
    """Each output's criteria from the registry, with the stacked expected values for data rules."""
    first = cases[0]
    qparams = req.output_qparams.get(method) or []
    outputs = []
    for j, value in enumerate(first.expected_outputs):
        name = f"out{j}"
        if value.kind != "tensor":
            dtype_name = {"int": "int64", "bool": "bool", "double": "float64"}[value.kind]
            shape: list[int] = []
            code = st.code_from_name(dtype_name)
        else:
            code, shape, dtype_name = value.scalar_type, list(value.sizes), st.name(value.scalar_type)
        qp = qparams[j] if j < len(qparams) else None
        stack = None
        same = all(c.expected_outputs[j].kind == "tensor" and c.expected_outputs[j].sizes == value.sizes for c in cases)
        if value.kind == "tensor" and same:
            stack = np.stack([c.expected_outputs[j].to_array() for c in cases])
        ctx = ToleranceContext(
            backend=req.backend, target=req.target, dtype=req.dtype, model=req.model, method=method,
            output_index=j, output_name=name, output_dtype=dtype_name, ops=ops, reference=req.reference,
            input_distribution=req.input_distribution, host_arch=req.host_arch,
            scale=float(qp[0]) if qp else None, zero_point=int(qp[1]) if qp and qp[1] is not None else None,
            quantization=req.quantization, expected=stack,
        )
        try:
            criteria = resolve_criteria(ctx, req.overrides, req.registry)
        except BundlerunError as exc:
            raise BuildError(f"tolerances for {method}.{name}: {exc}") from None
        dynamic: list[int] = []
        if value.kind == "tensor" and not same:
            shape, dynamic = _over_cases(method, f"expected output {j}", [c.expected_outputs[j] for c in cases])
        outputs.append(OutputSpec(name=name, dtype=dtype_name, shape=shape, criteria=criteria,
                                  quantized=qp is not None or not st.is_floating(code), dynamic=dynamic))
    inputs = [TensorSpec(f"in{k}", st.name(v.scalar_type),
                         *_over_cases(method, f"input {k}", [c.inputs[k] for c in cases]))
              for k, v in enumerate(first.inputs) if v.kind == "tensor"]
    if len(inputs) != len(first.inputs):
        inputs = []  # a scalar input has no tensor spec: the manifest then describes no inputs
    return MethodManifest(method, inputs, outputs)
