"""Model -> `.bpte`: inputs, lowering, expected outputs, resolved tolerances, manifest.

The expected outputs come from the eager fp32 model (reference "eager-fp32") run
on exactly the inputs the program receives (fp16 builds: the half-rounded
inputs, widened back), or from the eager quantized model (reference "quantized").
They are stored in the program's output dtype so the stock BundleIO runtime can
verify the file too.
"""

from __future__ import annotations

import datetime as _dt
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bundlerun.bundles.manifest_records import BuildInfo, DatasetInfo, ModelInfo
from bundlerun.bundles import dynamic_shapes, scalar_types as st
from bundlerun.bundles.backends.base import DTYPES, LoweringRequest, lowering_module
from bundlerun.bundles.bpte import Bundle, BundledTestCase, MethodTestSuite, write_bundle
from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.inputs import check_distribution, generate_cases
from bundlerun.bundles.manifest import Manifest, MethodManifest, OutputSpec, TensorSpec
from bundlerun.bundles.model_source import ResolvedModel, resolve_model
from bundlerun.bundles.registry import REFERENCES
from bundlerun.bundles.tolerances import ToleranceContext, resolve_criteria
from bundlerun.bundles.build_parts import BuildResult, _cache_key, _from_cache, _torch_to_code, _value_from_tensor, _versions, side_files  # noqa: F401
from bundlerun.bundles.program_meta import input_dim_orders
from bundlerun.bundles import build_cache, etrecord as _etrecord, real_inputs
from bundlerun.bundles.backends.base import default_dtype, default_reference
from bundlerun.bundles.backends.common import quiet_framework_logs
from bundlerun.bundles.inputs import case_rng
from bundlerun.bundles.limits import MAX_CASES, MAX_SEED
from bundlerun.bundles.llm_build import build_llm_bundle, is_llm
from bundlerun.bundles.llm_qnn import build_qnn_llm_bundle
from bundlerun.bundles.report_fit import bundle_report_fit


# PTQ calibration (bundlerun's own numbers): 64 samples for small inputs (16 left mlp int8 at 20.3 dB SQNR,
# randn outliers clipped; 64 gave 30.9 dB), fewer as the inputs grow, at least 8. XNNPACKQuantizer observes
# activations with torchao's HistogramObserver (aminmax + histc over every activation of every sample):
# et:mv2's 64 samples of 1x3x224x224 took 55% of its int8 build (cProfile, bench/README.md), its convolutions
# 1%. ExecuTorch's examples/xnnpack calibrate on the one example input (quantization/utils.py:37).
CALIBRATION_MAX = 64
CALIBRATION_MIN = 8
CALIBRATION_INPUT_ELEMENTS = 1 << 20  # input elements over all samples: mv2 (150,528 a sample) -> 8


def calibration_count(shapes: list[tuple[int, ...]]) -> int:
    """How many generated or real samples an int8 build calibrates on, from the size of one sample."""
    per_sample = sum(int(np.prod(s)) for s in shapes) or 1
    return max(CALIBRATION_MIN, min(CALIBRATION_MAX, CALIBRATION_INPUT_ELEMENTS // per_sample))


@dataclass
class BuildRequest:
    model: str  # zoo name or path.py:factory
    output: Path
    backend: str | None = None  # default: from the target
    target: str = "host://xnnpack"
    dtype: str | None = None  # default: from the target (int8 for integer Arm targets, else fp32)
    # what `target` declares a recipe should lower for ({} for none), from the target registry:
    # `bundlerun.targets.lowering_info(target)`, asked by the caller (bundles/ never imports targets/)
    target_info: dict[str, Any] | None = None
    cases: int = 8
    seed: int = 0
    reference: str | None = None  # default eager-fp32
    distribution: str | None = None  # override the model's input distribution
    calibration_cases: int | None = None  # PTQ samples; None: calibration_count() of the model's inputs
    calibration: list[list[np.ndarray]] | None = None  # real samples for PTQ (else generated inputs)
    overrides: dict[str, Any] = field(default_factory=dict)  # criterion -> value, for every output
    dataset: dict[str, Any] | None = None  # {"name", "samples": [[array,...], ...], "labels": [...]}
    require_delegation: bool = False  # fail if any operator stays outside the delegate
    resolved_model: ResolvedModel | None = None  # pass an already-built model (accuracy flows)
    progress: Callable[[str], None] | None = None
    registry: Any = None  # tolerance registry (the session's); None: built-in + the cwd's project config
    cache: bool = False  # reuse/record the build in the content-addressed build cache (bundles/build_cache.py)
    etrecord: bool = False  # write <output stem>.etrecord beside the bundle for `bundlerun debug` (bundles/etrecord.py)
    llm: Any = None  # bundles/llm_build.LlmOptions for model `llm:ARCH` (size, params, checkpoint, tokenizer)
    state_dict: str | None = None  # et:NAME: the user's weights (torch state dict file); else seeded random
    inputs: str | None = None  # real test inputs: "images", "mnist" or a folder (bundles/real_inputs.py)


def _flatten_outputs(result: Any) -> list[Any]:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        flat: list[Any] = []
        for r in result:
            flat.extend(_flatten_outputs(r))
        return flat
    if isinstance(result, dict):
        return _flatten_outputs(list(result.values()))
    raise BuildError(f"model output of type {type(result).__name__} is not supported (tensors, tuples, lists, dicts)")


def _program_output_dtypes(program: Any) -> list[Any]:
    ep = program.exported_program()
    out = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    args = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    return [a.meta["val"].dtype if hasattr(a, "meta") and "val" in a.meta else None for a in args]


def _dynamic_points(req: BuildRequest, backend: str, recipe: Any, model: ResolvedModel) -> list[str]:
    """Which point (min, typical, max) each case tests; [] for a model without dynamic dims.
    A recipe that does not export with dynamic shapes, or real inputs of one fixed size, refuse
    them in one line rather than drop them and test one static shape."""
    if not model.dynamic:
        return []
    if not getattr(recipe, "DYNAMIC_SHAPES", False):
        raise BuildError(f"{model.name} declares dynamic dims; the {backend} recipe exports static shapes only "
                         "(dynamic shapes are lowered for xnnpack and portable)")
    if req.inputs is not None or req.dataset is not None:
        raise BuildError(f"{model.name} declares dynamic dims, which are tested on generated inputs at their "
                         "min, typical and max sizes: drop --inputs / --dataset")
    if req.cases < len(dynamic_shapes.POINTS):
        raise BuildError(f"{model.name} declares dynamic dims: give --cases {len(dynamic_shapes.POINTS)} or more "
                         "(one each at the minimum, a typical size and the maximum)")
    return dynamic_shapes.case_points(req.cases)


def _dynamic_cases(model: ResolvedModel, points: list[str], seed: int) -> list[list[np.ndarray]]:
    """Case i drawn as generated cases are (the same seed stream), at point i's shapes."""

    examples = [tuple(s.shape) for s in model.inputs]
    cases = []
    for i, point in enumerate(points):
        rng = case_rng(seed, "cases", i)
        shapes = dynamic_shapes.shapes_at(model.dynamic, examples, point)
        cases.append([s.dist.sample(rng, shape, s.dtype) for s, shape in zip(model.inputs, shapes)])
    return cases


def _stacked(values: list[Any]) -> np.ndarray | None:
    """The cases' expected values as one array for data rules; None when their shapes differ."""
    if any(tuple(v.sizes) != tuple(values[0].sizes) for v in values):
        return None
    return np.stack([v.to_array() for v in values])


def _over_cases(values: list[Any], what: str) -> tuple[list[int], list[int]]:
    try:
        return dynamic_shapes.shape_over_cases([list(v.sizes) for v in values])
    except ValueError as exc:
        raise BuildError(f"{what}: {exc}") from None


def build_bundle(req: BuildRequest) -> BuildResult:
    """Build and write the bundle; every failure is a one-line BundlerunError. With `req.cache`,
    a build already in the build cache is copied instead (result.info["cache"] == "hit")."""
    say = req.progress or (lambda _msg: None)

    if is_llm(req.model):  # ExecuTorch's export_llama, with stateful sequences (bundles/llm_build.py)
        if req.backend == "qnn":  # QNN's own static llama, the KV cache as program I/O (bundles/llm_qnn.py)
            return build_qnn_llm_bundle(req, say)
        return build_llm_bundle(req, say)
    if not req.backend:
        raise BuildError("no lowering backend given (the CLI takes the target's declared default)")
    backend = req.backend
    if req.target_info is None:
        raise BuildError(f"no lowering information for {req.target}: BuildRequest.target_info is "
                         "bundlerun.targets.lowering_info(target)")
    if req.dtype is None:
        req.dtype = default_dtype(backend, req.target_info)
    if req.dtype not in DTYPES:
        raise BuildError(f"unknown dtype {req.dtype!r}; choose one of {', '.join(DTYPES)}")

    if isinstance(req.cases, bool) or not isinstance(req.cases, int) or not 1 <= req.cases <= MAX_CASES:
        raise BuildError(f"--cases {req.cases!r}: give 1 to {MAX_CASES} test cases (bundlerun's limit, docs/security.md)")
    if isinstance(req.seed, bool) or not isinstance(req.seed, int) or not 0 <= req.seed <= MAX_SEED:
        raise BuildError(f"--seed {req.seed!r}: give a whole number from 0 to {MAX_SEED}")

    if req.distribution is not None:
        check_distribution(req.distribution)  # before the model is imported: one line, exit 2
    reference = req.reference or default_reference(backend, req.dtype)
    if reference not in REFERENCES:
        raise BuildError(f"unknown reference {reference!r}; choose {' or '.join(REFERENCES)}")
    key = _cache_key(req, backend, reference)
    discarded = None
    use_cache = req.cache and key is not None
    if use_cache:
        hit = _from_cache(req, key, say)
        if isinstance(hit, BuildResult):
            return hit
        discarded = hit

    quiet_framework_logs()
    import torch

    recipe = lowering_module(backend)

    say(f"loading model {req.model}")
    model = req.resolved_model or resolve_model(req.model, req.distribution, req.state_dict)
    specs = [(s.shape, s.dtype, s.dist) for s in model.inputs]
    inputs_used: dict[str, Any] | None = None
    points = _dynamic_points(req, backend, recipe, model)
    if points:  # each dynamic dim at its min, a typical size and its max, in turn (bundles/dynamic_shapes.py)
        case_arrays = _dynamic_cases(model, points, req.seed)
    elif req.dataset is not None:
        case_arrays = [list(sample) for sample in req.dataset["samples"]]
    elif req.inputs is not None:
        case_arrays, inputs_used = real_inputs.cases(req.inputs, model, req.cases, req.seed)
    else:
        case_arrays = generate_cases(specs, req.cases, req.seed, "cases")
    n_calibration = req.calibration_cases or calibration_count([tuple(s.shape) for s in model.inputs])
    if req.calibration:
        calibration = req.calibration
    elif req.inputs is not None and not points and req.dtype in ("int8", "int16"):  # PTQ: like the cases, not randn
        calibration = real_inputs.calibration(req.inputs, model, n_calibration, req.seed)
    else:
        calibration = generate_cases(specs, n_calibration, req.seed, "calibration")
    to_torch = lambda arrays: tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)  # noqa: E731

    say(f"lowering for {backend} ({req.dtype})")

    from bundlerun.bundles import partition_control  # `bundlerun bisect`: the delegate restricted to some nodes

    lowering = _etrecord.recording(req.etrecord, partition_control.wrap(recipe.lower))(
        LoweringRequest(
            model=model.module,
            example_inputs=to_torch(case_arrays[points.index("typical") if points else 0]),
            calibration_inputs=[to_torch(c) for c in calibration],
            dtype=req.dtype,
            backend=backend,
            target=req.target,
            target_info=dict(req.target_info),
            dynamic_shapes=dynamic_shapes.to_torch(model.dynamic, len(model.inputs)),
        )
    )
    if lowering.quantized_reference is not None:  # what PTQ saw, for the manifest (inspect: build.lowering)
        lowering.info.setdefault("calibration", {
            "samples": len(calibration),
            "from": "dataset" if req.calibration else (f"--inputs {req.inputs}" if req.inputs is not None and not points
                                                       and req.dtype in ("int8", "int16") else "generated")})
    undelegated = [op for op in lowering.info.get("undelegated_ops", []) if not op.startswith("dim_order_ops")]
    if req.require_delegation and backend != "portable" and undelegated:
        raise BuildError(f"{backend} could not lower these operators (they would run on portable kernels): "
                         f"{', '.join(undelegated)}")
    if undelegated and backend != "portable":
        lowering.info.setdefault("warnings", []).append(
            f"{backend} left {', '.join(undelegated)} on portable kernels")
    if reference == "quantized" and lowering.quantized_reference is None:
        raise BuildError(f"reference 'quantized' needs a quantized build; {req.dtype} on {backend} has none")
    in_dtype, dtype_model = None, None  # eager-dtype: a copy of the eager model, and its inputs, in the build's dtype
    if reference == "eager-dtype":
        import copy

        in_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}.get(req.dtype)
        if in_dtype is None:
            raise BuildError(f"reference 'eager-dtype' needs a float build (fp32, fp16 or bf16), not {req.dtype}")
        dtype_model = copy.deepcopy(model.module).to(in_dtype)
    out_dtypes = _program_output_dtypes(lowering.program)
    in_orders = input_dim_orders(lowering.program.buffer)

    say(f"computing expected outputs for {len(case_arrays)} cases")
    test_cases: list[BundledTestCase] = []
    first_outputs: list[Any] = []
    reference_dtypes: list[str] = []
    with torch.no_grad():
        for i, arrays in enumerate(case_arrays):
            program_inputs = tuple(
                x.to(dt) if x.is_floating_point() else x for x, dt in zip(to_torch(arrays), lowering.input_dtypes)
            )
            float_inputs = tuple(x.float() if x.is_floating_point() else x for x in program_inputs)
            runner = lowering.quantized_reference if reference == "quantized" else model.module
            if in_dtype is not None:
                float_inputs = tuple(x.to(in_dtype) if x.is_floating_point() else x for x in program_inputs)
                runner = dtype_model
            try:
                outs = _flatten_outputs(runner(*float_inputs))
            except BuildError:
                raise
            except Exception as exc:
                raise BuildError(f"reference model failed on case {i}: {type(exc).__name__}: {exc}") from None
            if len(out_dtypes) != len(outs):
                raise BuildError(f"reference produced {len(outs)} outputs, program has {len(out_dtypes)}")
            if i == 0:
                reference_dtypes = [st.name(_torch_to_code(o.dtype)) for o in outs]
            outs = [o.to(dt) if dt is not None else o for o, dt in zip(outs, out_dtypes)]
            if i == 0:
                first_outputs = outs
            test_cases.append(
                BundledTestCase(
                    inputs=[_value_from_tensor(x, in_orders[k] if k < len(in_orders) else None)
                            for k, x in enumerate(program_inputs)],
                    expected_outputs=[_value_from_tensor(o) for o in outs],
                )
            )

    say("resolving tolerances")
    qparams = lowering.output_qparams or [None] * len(first_outputs)
    outputs = []
    for j, out in enumerate(first_outputs):
        code = _torch_to_code(out.dtype)
        qp = qparams[j] if j < len(qparams) else None
        ctx = ToleranceContext(
            backend=backend,
            target=req.target,
            dtype=req.dtype,
            model=model.name,
            method="forward",
            output_index=j,
            output_name=f"out{j}",
            output_dtype=st.name(code),
            ops=lowering.ops,
            reference=reference,
            input_distribution=str(model.inputs[0].distribution) if model.inputs else "randn",
            host_arch=platform.machine(),
            scale=qp[0] if qp else None,
            zero_point=qp[1] if qp else None,
            quantization=lowering.quantization,
            reference_dtype=reference_dtypes[j],
            expected=_stacked([tc.expected_outputs[j] for tc in test_cases]),
        )
        criteria = resolve_criteria(ctx, req.overrides, req.registry)
        shape, dynamic = _over_cases([tc.expected_outputs[j] for tc in test_cases], f"output {j}")
        outputs.append(
            OutputSpec(
                name=f"out{j}",
                dtype=st.name(code),
                shape=shape,
                criteria=criteria,
                quantized=qp is not None or not st.is_floating(code),
                dynamic=dynamic,
            )
        )
    inputs_spec = [
        TensorSpec(f"in{k}", st.name(v.scalar_type), *_over_cases([tc.inputs[k] for tc in test_cases], f"input {k}"))
        for k, v in enumerate(test_cases[0].inputs)
    ]
    manifest = Manifest(
        model=ModelInfo.from_dict({"id": model.name, "source": model.source, "description": model.description,
               **({"weights": model.weights} if model.weights else {})}),
        build=BuildInfo.from_dict({
            "backend": backend,
            "target": req.target,
            "dtype": req.dtype,
            "quantization": lowering.quantization,
            "reference": reference,
            "inputs": [{"shape": list(s.shape), "dtype": s.dtype, "distribution": s.distribution,
                        **({"distribution_from": "example"} if model.inputs_inferred else {})} for s in model.inputs],
            **({"input_source": inputs_used} if inputs_used else {}),
            **({"input_structure": model.input_structure} if model.input_structure else {}),
            **({"dynamic_shapes": {"dims": [d.to_dict() for d in model.dynamic], "cases": points}} if points else {}),
            "seed": req.seed,
            "cases": len(test_cases),
            "lowering": lowering.info,
            "ops": lowering.ops,
            "overrides": dict(req.overrides),
            **({"cache_key": key} if key is not None else {}),
            **_etrecord.manifest_entry(req.etrecord, lowering, model.module, to_torch(case_arrays[0]), req.output),
        }),
        versions=_versions(),
        methods={"forward": MethodManifest("forward", inputs_spec, outputs)},
        dataset=None
        if req.dataset is None
        else DatasetInfo.from_dict({k: v for k, v in req.dataset.items() if k != "samples"}),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    bundle = Bundle(
        program=bytes(lowering.program.buffer),
        method_test_suites=[MethodTestSuite("forward", test_cases)],
        manifest_json=manifest.to_dict(),
    )
    say(f"writing {req.output}")
    try:
        path = write_bundle(bundle, req.output)
    except OSError as exc:  # a full disk: one line naming the file, as a cached build's copy says it
        raise BuildError(f"cannot write {req.output}: {exc.strerror or exc}") from None
    info = lowering.info
    fit = bundle_report_fit(bundle)  # a run whose outputs would not fit in its report: said now, not after it
    if fit:
        info.setdefault("warnings", []).extend(fit)
    if use_cache:
        stored = build_cache.store(key, path, [Path(path).with_name(name) for name, _ in side_files(manifest)])
        info = {**lowering.info, "cache": "miss" if stored else "not stored", "cache_key": key}
        if discarded:
            info["warnings"] = [*info.get("warnings", []), discarded]
    return BuildResult(path=path, manifest=manifest, info=info)
