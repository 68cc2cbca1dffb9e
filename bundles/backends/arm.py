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

import re
from dataclasses import dataclass, field
from typing import Any

from bundles.backends.base import LoweringRequest, LoweringResult
from bundles.backends.common import (
    delegation_summary,
    export_model,
    graph_ops,
    output_qparams,
)
from bundles.errors import BuildError

# QEMU system machines that are a Corstone platform's CPU side (board, core).
QEMU_MACHINES = {"mps3-an547": ("corstone-300", "cortex-m55")}
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


def parse_arm_target(url: str) -> ArmTarget:
    """Map a target URL to an Arm lowering; a one-line BuildError for anything else."""
    scheme, _, rest = url.partition("://")
    rest = rest.split("?", 1)[0].strip("/").lower()
    if scheme == "tosa":
        if rest == "int":
            return ArmTarget(url, "tosa", True, tosa_spec="TOSA-1.0+INT")
        if rest == "fp":
            return ArmTarget(url, "tosa", False, tosa_spec="TOSA-1.0+FP")
        raise BuildError(f"unknown TOSA target {url!r}; use tosa://int or tosa://fp")
    if scheme in ("fvp", "qemu"):
        from bundles.arm_platforms import parse_platform

        if scheme == "qemu":  # qemu://mps3-an547 is Corstone-300's CPU side: a Cortex-M55, no NPU
            if rest not in QEMU_MACHINES:
                raise BuildError(f"unknown QEMU machine {rest!r} in {url!r}; known: {', '.join(QEMU_MACHINES)}")
            board, core = QEMU_MACHINES[rest]
        else:
            parts = rest.split("/")
            if len(parts) != 2:
                raise BuildError(f"FVP target {url!r} must look like fvp://corstone-300/ethos-u55-128")
            board, core = parts
        try:
            platform = parse_platform(board, core)
        except ValueError as exc:
            raise BuildError(f"{exc} ({url})") from None
        if platform.has_npu:
            return ArmTarget(url, "ethos-u", True, accelerator=platform.accelerator)
        return ArmTarget(url, "cortex-m", True, cpu=platform.cpu)
    raise BuildError(f"the arm backend builds for tosa:// and fvp:// targets, not {url!r}")


def default_dtype(target_url: str) -> str:
    """The dtype a build for this target should use when none is given."""
    return "int8" if parse_arm_target(target_url).integer else "fp32"


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

    from bundles.arm_platforms import NPU_FAMILIES

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


def _lower_cortex_m(req: LoweringRequest, target: ArmTarget) -> LoweringResult:
    """Cortex-M is not a delegate: the quantized graph is rewritten to cortex_m:: kernels."""
    try:
        from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
        from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
        from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
        from executorch.backends.cortex_m.target_config import CortexM, CortexMTargetConfig
    except ImportError as exc:
        raise BuildError(f"the Cortex-M backend is not usable in this executorch install: {exc}") from None
    from executorch.exir import to_edge

    examples = req.example_inputs
    exported = export_model(req.model, examples)
    ops = graph_ops(exported)
    converted = _quantize(exported, CortexMQuantizer(), list(req.calibration_inputs) or [examples])
    qparams = output_qparams(converted)
    requantized = export_model(converted, examples)
    try:
        edge = to_edge(requantized, compile_config=cortex_m_edge_compile_config())
        config = CortexMTargetConfig(cpu=getattr(CortexM, target.cpu))  # type: ignore[arg-type]
        edge._edge_programs["forward"] = CortexMPassManager(edge.exported_program(), target_config=config).transform()
        summary = delegation_summary(edge)
        kernels = sorted(
            {str(n.target).split(".")[-2] for n in edge.exported_program().graph.nodes
             if n.op == "call_function" and "cortex_m" in str(n.target)}
        )
        program = edge.to_executorch()
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"Cortex-M lowering failed: {_root_cause(exc)}") from None
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
            "delegated_partitions": 0,
            "cortex_m_kernels": kernels,
            "undelegated_ops": [o for o in summary["undelegated_ops"] if o != "alloc"],
        },
    )


def lower(req: LoweringRequest) -> LoweringResult:
    target = parse_arm_target(req.target)
    if req.backend == "cortex-m" and target.kind != "cortex-m":
        raise BuildError(f"backend cortex-m builds for fvp://corstone-300/cortex-m55 (or cortex-m85), not {req.target}")
    _check_dtype(target, req.dtype)
    if target.kind == "cortex-m":
        return _lower_cortex_m(req, target)
    return _lower_delegated(req, target)
