"""Arm recipe: TOSA (INT/FP profiles), Ethos-U55/U65/U85 via Vela, Cortex-M.

Target URL -> lowering:

    tosa://int                          TosaCompileSpec("TOSA-1.0+INT")   TOSAQuantizer + TOSAPartitioner
    tosa://fp                           TosaCompileSpec("TOSA-1.0+FP")    no quantization, TOSAPartitioner
    fvp://corstone-300/ethos-u55-128    EthosUCompileSpec("ethos-u55-128") EthosUQuantizer + EthosUPartitioner
    fvp://corstone-300/ethos-u65-256    EthosUCompileSpec("ethos-u65-256")      "
    fvp://corstone-320/ethos-u85-256    EthosUCompileSpec("ethos-u85-256")      "
    fvp://corstone-300/cortex-m55       CortexMQuantizer + CortexMPassManager (no delegate: cortex_m:: kernels)

Integer targets quantize post-training with the Arm quantizer (symmetric int8
weights per channel, affine int8 activations; int16 = a16w8), calibrated on the
request's calibration inputs. The converted eager module is returned as the
"quantized" reference and the output qparams come from its final dequantize.
The compile-spec defaults follow ExecuTorch's own Arm test utilities
(backends/arm/test/common.py: get_u55/u65/u85_compile_spec).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import (
    delegation_summary,
    export_model,
    graph_ops,
    output_qparams,
)
from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.arm_platforms import NPU_FAMILIES

_INT_DTYPES = ("int8", "int16")
_FP_DTYPES = ("fp32", "fp16")


@dataclass
class ArmTarget:
    """What a target URL means for lowering."""

    url: str
    kind: str  # "tosa" | "ethos-u" | "cortex-m"
    integer: bool
    tosa_spec: str | None = None  # tosa: "TOSA-1.0+INT" / "TOSA-1.0+FP"
    accelerator: str | None = None  # ethos-u: "ethos-u55-128"
    cpu: str | None = None  # cortex-m: "M55"
    options: dict[str, Any] = field(default_factory=dict)


def parse_arm_target(url: str, target_info: dict[str, Any]) -> ArmTarget:
    """The Arm lowering the target at `url` declares (its SPEC's `lowering`: tosa://, fvp://,
    qemu://, or a wrapper around them); a one-line BuildError for a target that declares none.
    `target_info` is what the caller asked the target registry for (BuildRequest.target_info)."""
    kind = target_info.get("arm")
    if kind not in ("tosa", "ethos-u", "cortex-m"):
        raise BuildError(f"the arm backend builds for tosa://, fvp:// and qemu:// targets, not {url!r}")
    return ArmTarget(url, kind, bool(target_info.get("integer")), tosa_spec=target_info.get("tosa_spec"),
                     accelerator=target_info.get("accelerator"), cpu=target_info.get("cpu"))


def default_dtype(target_info: dict[str, Any]) -> str:
    """The dtype a build for this target should use when none is given."""
    return "int8" if target_info.get("integer") else "fp32"


# --------------------------------------------------------------------------- compile specs


def _tosa_spec_string(target: ArmTarget, dtype: str) -> str:
    spec = target.tosa_spec or ""
    if dtype == "int16":
        spec += "+int16"
    return spec


def _compile_spec(target: ArmTarget, dtype: str, options: dict[str, Any]):
    if target.kind == "tosa":
        from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

        return TosaCompileSpec(_tosa_spec_string(target, dtype))
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    fam = NPU_FAMILIES[target.accelerator.rsplit("-", 1)[0]]  # type: ignore[union-attr]
    defaults = {"system_config": fam.system_config, "memory_mode": fam.memory_mode, "extra_flags": fam.extra_flags}
    try:
        return EthosUCompileSpec(
            target.accelerator,  # type: ignore[arg-type]
            system_config=options.get("system_config", defaults["system_config"]),
            memory_mode=options.get("memory_mode", defaults["memory_mode"]),
            extra_flags=list(options.get("extra_flags", defaults["extra_flags"])),
        )
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"invalid Ethos-U compile spec for {target.accelerator}: {exc}") from None


def _describe_spec(spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"class": type(spec).__name__, "tosa_spec": str(spec.tosa_spec)}
    if getattr(spec, "compiler_flags", None):
        out["compiler_flags"] = list(spec.compiler_flags)
    if getattr(spec, "target", None):
        out["accelerator"] = spec.target
    return out


def _quantizer(target: ArmTarget, spec: Any, dtype: str):
    from executorch.backends.arm.quantizer import (
        EthosUQuantizer,
        TOSAQuantizer,
        get_symmetric_a16w8_quantization_config,
        get_symmetric_quantization_config,
    )

    quantizer = EthosUQuantizer(spec) if target.kind == "ethos-u" else TOSAQuantizer(spec)
    if dtype == "int16":
        quantizer.set_global(get_symmetric_a16w8_quantization_config(is_per_channel=True))
        return quantizer, "arm-ptq-a16w8-symmetric-per-channel"
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    return quantizer, "arm-ptq-int8-symmetric-per-channel"


def _partitioner(target: ArmTarget, spec: Any):
    if target.kind == "ethos-u":
        from executorch.backends.arm.ethosu import EthosUPartitioner

        return EthosUPartitioner(spec)
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    return TOSAPartitioner(spec)


# --------------------------------------------------------------------------- lowering


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _quantize(exported, quantizer, calibration_inputs: list[tuple]):
    """prepare -> calibrate -> convert, as Arm's public flow does it.

    `module(check_guards=False)`: the Arm annotation passes retrace the graph and
    reject the `_guards_fn` call_module node torch.export adds otherwise.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    try:
        prepared = prepare_pt2e(exported.module(check_guards=False), quantizer)
        for sample in calibration_inputs:
            prepared(*sample)
        return convert_pt2e(prepared)
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"post-training quantization failed: {_root_cause(exc)}") from None


def _root_cause(exc: BaseException) -> str:
    """The innermost exception's first line (pass managers wrap the real error)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _lower_and_emit(exported, partitioner, backend_id: str) -> tuple[Any, dict[str, Any]]:
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    try:
        edge = to_edge_transform_and_lower(
            exported, partitioner=[partitioner], compile_config=EdgeCompileConfig(_check_ir_validity=False)
        )
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"{backend_id} lowering failed: {_root_cause(exc)}") from None
    summary = delegation_summary(edge)
    try:
        program = edge.to_executorch()
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"to_executorch failed: {_root_cause(exc)}") from None
    return program, summary


def _check_dtype(target: ArmTarget, dtype: str) -> None:
    allowed = _INT_DTYPES if target.integer else _FP_DTYPES
    if dtype not in allowed:
        profile = "integer" if target.integer else "floating-point"
        raise BuildError(
            f"{target.url} is an {profile} target: build it with --dtype {' or '.join(allowed)}, not {dtype}"
        )


def _lower_delegated(req: LoweringRequest, target: ArmTarget) -> LoweringResult:
    import torch

    spec = _compile_spec(target, req.dtype, req.options)
    partitioner = _partitioner(target, spec)
    backend_id = "EthosUBackend" if target.kind == "ethos-u" else "TOSABackend"
    examples = req.example_inputs
    exported = export_model(req.model, examples)
    ops = graph_ops(exported)
    info: dict[str, Any] = {
        "partitioner": type(partitioner).__name__,
        "backend_id": backend_id,
        "compile_spec": _describe_spec(spec),
    }
    if target.integer:
        quantizer, scheme = _quantizer(target, spec, req.dtype)
        converted = _quantize(exported, quantizer, list(req.calibration_inputs) or [examples])
        qparams = output_qparams(converted)
        to_lower = export_model(converted, examples)
        program, summary = _lower_and_emit(to_lower, partitioner, backend_id)
        input_dtypes = [x.dtype for x in examples]
        reference, quantization = converted, scheme
    else:
        model, inputs = req.model, examples
        if req.dtype == "fp16":
            import copy

            model = copy.deepcopy(req.model).to(torch.float16)
            inputs = tuple(x.to(torch.float16) if x.is_floating_point() else x for x in examples)
            exported = export_model(model, inputs)
        program, summary = _lower_and_emit(exported, partitioner, backend_id)
        input_dtypes = [x.dtype for x in inputs]
        qparams, reference, quantization = [], None, None
    info["delegated_partitions"] = summary["delegate_calls"]
    info["delegate_calls"] = summary["delegate_calls"]
    info["undelegated_ops"] = summary["undelegated_ops"]
    if not summary["delegate_calls"]:
        info.setdefault("warnings", []).append(
            f"{info['partitioner']} delegated nothing; the program runs on portable kernels only"
        )
    return LoweringResult(
        program,
        input_dtypes,
        quantized_reference=reference,
        output_qparams=qparams,
        ops=ops,
        quantization=quantization,
        info=info,
    )


def _channels_last_inputs(examples: tuple) -> bool:
    """Whether the model takes an image-like (4-D floating) input: CMSIS-NN convs and pools work on NHWC."""
    return any(getattr(x, "dim", lambda: 0)() == 4 and x.is_floating_point() for x in examples)


def _to_channels_last(inputs: tuple) -> tuple:
    """4-D floating inputs in channels_last memory format, the rest as they are: how ExecuTorch's
    Cortex-M model tests give every image model its example inputs (backends/cortex_m/test/models/
    test_ds_cnn.py:40, test_resnet8.py:38, test_mobilenet_v1_025.py:37, test_nn_modules.py:138; 2-D
    inputs stay as they are, test_deep_autoencoder.py:28). torch.export records that layout as the
    program input's dim order (0, 2, 3, 1), which the cortex_m:: kernels check on every activation
    (backends/cortex_m/ops/cortex_m_ops_common.h:128 is_channels_last_tensor)."""
    import torch

    return tuple(
        x.to(memory_format=torch.channels_last)
        if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point() else x
        for x in inputs
    )


def _channels_last_model(model: Any):
    """A copy of the model with channels_last 4-D weights and its 4-D outputs made contiguous. Both
    are bundlerun's own, beyond ExecuTorch's Cortex-M tests (which pass `Model().eval()` as is,
    backends/cortex_m/test/models/test_ds_cnn.py:38):
    - weights: with contiguous (OIHW) weights the Cortex-M passes add each conv weight again in the
      OHWI layout CMSIS-NN takes and the original stays in the program unreferenced; measured on
      et:resnet8 int8: program 173,368 bytes against 99,208 with channels_last weights, whose OHWI
      view is the same bytes (one constant buffer);
    - outputs: bundlerun reads a runner's output bytes in contiguous order and keeps expected outputs
      contiguous (bundles/bpte.py _check_tensor)."""
    import copy

    import torch

    class ContiguousOutputs(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            out = self.inner(*args)
            if isinstance(out, torch.Tensor):
                return out.contiguous() if out.dim() == 4 else out
            if isinstance(out, (tuple, list)):
                return type(out)(o.contiguous() if isinstance(o, torch.Tensor) and o.dim() == 4 else o for o in out)
            return out

    return ContiguousOutputs(copy.deepcopy(model).to(memory_format=torch.channels_last)).eval()


def _decompose_float_linear_pass():
    """An edge pass rewriting the aten.linear the Cortex-M passes left in float (no quantized_linear
    match) to permute_copy + addmm/mm (+ view_copy for rank != 2), which have portable kernels;
    aten::linear.out has none (only kernels/optimized has one). The Cortex-M edge config preserves
    aten.linear so quantized linears can become cortex_m::quantized_linear; the float rest needs this."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass

    edge = exir_ops.edge.aten

    class DecomposeFloatLinear(ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op != edge.linear.default:
                return super().call_operator(op, args, kwargs, meta)
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            in_shape = list(x.to_tensor().shape)
            out_features = int(weight.to_tensor().shape[0])
            weight_t = super().call_operator(edge.permute_copy.default, (weight, [1, 0]), {}, meta)
            flat = x
            if len(in_shape) != 2:
                rows = 1
                for d in in_shape[:-1]:
                    rows *= int(d)
                flat = super().call_operator(edge.view_copy.default, (x, [rows, int(in_shape[-1])]), {}, meta)
            if bias is None:
                out = super().call_operator(edge.mm.default, (flat, weight_t), {}, meta)
            else:
                out = super().call_operator(edge.addmm.default, (bias, flat, weight_t), {}, meta)
            if len(in_shape) != 2:
                out = super().call_operator(
                    edge.view_copy.default, (out, [int(d) for d in in_shape[:-1]] + [out_features]), {}, meta
                )
            return out

    return DecomposeFloatLinear()


def _failing_node_probe():
    """A context manager that records the graph node whose execution raised inside a pass
    (the pass manager reports only the pass; the node says which operator broke)."""
    import contextlib

    import torch.fx.interpreter as fx_interpreter

    @contextlib.contextmanager
    def probe(record: dict):
        original = fx_interpreter.Interpreter.run_node

        def run_node(self, n):
            try:
                return original(self, n)
            except Exception:
                if "node" not in record:
                    ins = []
                    for a in n.all_input_nodes:
                        val = a.meta.get("val")
                        ins.append(str(getattr(val, "dtype", "?")).replace("torch.", ""))
                    record["node"] = f"{_op_label(n.target)}({', '.join(ins)})"
                raise

        fx_interpreter.Interpreter.run_node = run_node
        try:
            yield record
        finally:
            fx_interpreter.Interpreter.run_node = original

    return probe


def _op_label(target: Any) -> str:
    """'aten::bmm.default' for an (edge) operator overload; the callable's name otherwise."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return f"{schema.name}.{schema.overload_name or 'default'}"
    return getattr(target, "__name__", None) or str(target)


def _run_cortex_m_passes(edge_program, config):
    """CortexMPassManager's passes one by one, so a failure names the pass and the operator."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager

    manager = CortexMPassManager(edge_program, target_config=config)
    passes = list(manager.passes)
    done: list[str] = []
    probe = _failing_node_probe()
    program = edge_program
    for pass_cls in passes:
        record: dict = {}
        try:
            with probe(record):
                program = CortexMPassManager(program, passes=[pass_cls], target_config=config).transform()
        except Exception as exc:  # noqa: BLE001
            where = f" at {record['node']}" if "node" in record else ""
            after = f" (after {', '.join(done)})" if done else ""
            raise BuildError(
                f"Cortex-M lowering failed in {pass_cls.__name__}{where}{after}: {_root_cause(exc)}"
            ) from None
        done.append(pass_cls.__name__)
    return program


def _lower_cortex_m(req: LoweringRequest, target: ArmTarget) -> LoweringResult:
    """Cortex-M is not a delegate: the quantized graph is rewritten to cortex_m:: kernels.

    As upstream's Cortex-M tests do, image models take channels_last inputs (so convs become
    cortex_m::quantized_conv2d and every conv and pool gets the NHWC tensors its kernel checks
    for); the bundle stores those inputs in the program's dim order (bundles/builder.py). Float
    linears left over (no quantized pattern) are decomposed to portable addmm/mm.
    """
    try:
        from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
        from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager  # noqa: F401
        from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
        from executorch.backends.cortex_m.target_config import CortexM, CortexMTargetConfig
    except ImportError as exc:
        raise BuildError(f"the Cortex-M backend is not usable in this executorch install: {exc}") from None
    from executorch.exir import to_edge

    # fake_tensor logs the whole failing dispatch at ERROR before raising: the BuildError says it in one line.
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    # One PassManager per pass (so a failure names its pass): its deprecation warning would repeat.
    logging.getLogger("executorch.exir.pass_manager").setLevel(logging.ERROR)

    examples = req.example_inputs
    exported = export_model(req.model, examples)
    ops = graph_ops(exported)
    layout = "contiguous"
    calibration = list(req.calibration_inputs) or [examples]
    if _channels_last_inputs(examples):
        # As ExecuTorch's Cortex-M tests export (backends/cortex_m/test/tester.py CortexMTester takes the
        # test case's channels_last example inputs for every stage, calibration included): the program's
        # 4-D inputs are channels_last, and the builder stores the bundled inputs in that dim order.
        examples = _to_channels_last(examples)
        calibration = [_to_channels_last(c) for c in calibration]
        exported = export_model(_channels_last_model(req.model), examples)
        layout = "channels_last inputs (dim order 0,2,3,1, as ExecuTorch's Cortex-M tests export)"
    converted = _quantize(exported, CortexMQuantizer(), calibration)
    qparams = output_qparams(converted)
    requantized = export_model(converted, examples)
    try:
        edge = to_edge(requantized, compile_config=cortex_m_edge_compile_config())
        config = CortexMTargetConfig(cpu=getattr(CortexM, target.cpu))  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"Cortex-M lowering failed in to_edge: {_root_cause(exc)}") from None
    edge._edge_programs["forward"] = _run_cortex_m_passes(edge.exported_program(), config)
    try:
        edge = edge.transform([_decompose_float_linear_pass()])
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"Cortex-M lowering failed decomposing float linear: {_root_cause(exc)}") from None
    labels = {_op_label(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"}
    kernels = sorted(lb.split("::", 1)[1].rsplit(".", 1)[0] for lb in labels if lb.startswith("cortex_m::"))
    # Not a delegate: what runs outside cortex_m:: kernels is what lands on portable kernels.
    portable = sorted(lb.rsplit(".", 1)[0] for lb in labels if "::" in lb and not lb.startswith("cortex_m::"))
    try:
        program = edge.to_executorch()
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"Cortex-M to_executorch failed: {_root_cause(exc)}") from None
    return LoweringResult(
        program,
        [x.dtype for x in examples],
        quantized_reference=converted,
        output_qparams=qparams,
        ops=ops,
        quantization="cortex-m-ptq-int8",
        info={
            "partitioner": None,
            "pass_manager": "CortexMPassManager",
            "compile_spec": {"cpu": target.cpu},
            "layout": layout,
            "delegated_partitions": 0,
            "cortex_m_kernels": kernels,
            "undelegated_ops": portable,
        },
    )


def lower(req: LoweringRequest) -> LoweringResult:
    target = parse_arm_target(req.target, req.target_info)
    if req.backend == "cortex-m" and target.kind != "cortex-m":
        raise BuildError(f"backend cortex-m builds for fvp://corstone-300/cortex-m55 (or cortex-m85), not {req.target}")
    _check_dtype(target, req.dtype)
    if target.kind == "cortex-m":
        return _lower_cortex_m(req, target)
    return _lower_delegated(req, target)
