"""`bundlerun build llm:ARCH --backend qnn`: QNN's own static llama, its KV cache as program I/O (docs/qnn.md).

export_llama's `backend.qnn` path warns that "the model definition in current repro is not
performant" and points at examples/qualcomm/oss_scripts/llama (examples/models/llama/export_llama_lib.py:1410-1415).
That path's model is `model/static_llama.py:LlamaModel`: static shapes, the KV cache as inputs
(`k_caches` [1, n_kv, head_dim, ctx - ar_len], `v_caches` [1, n_kv, ctx - ar_len, head_dim]) and
only the step's new entries as outputs (`output_new_cache_only=True`, as wrappers/llm_wrappers.py
builds it), which QNN's runner writes into the cache at the step's position
(runner/kv_manager.cpp:418-500). bundlerun builds that module as llm_wrappers.TextDecoder does for
`--model_mode kv` (ar_len 1): the checkpoint (the same seeded `construct_transformer` weights the
XNNPACK build uses) loaded strictly, wq/wk permuted where the model's LLMModelConfig says
`transform_weight`, `prepare_attention_conv` / `prepare_feedforward_conv`, `convert_linear_to_conv2d`,
then lowered by bundlerun's qnn recipe (bundles/backends/qnn.py: ExecuTorch's
`to_edge_transform_and_lower_to_qnn` in the AOT child) in fp16 for one SoC.

The example package's `__init__.py` is not run: it imports every example model's weight converter,
and granite_speech's needs torchtune, whose 0.6.1 imports `torchao.dtypes.nf4tensor`, absent from
torchao 0.18 (the executorch 1.5.1 pin). The package is registered by path and only its `model/`
and `masking_utils.py` are imported (they need `transformers`, the `qnn-llm` extra).

Each step feeds one token (ar_len 1: QNN's "kv" mode runs a prompt token by token), so a prompt of
n tokens is n `prompt` steps. The expected outputs are the eager static model's, stepped on its own
cache the same way; the bundle's cache inputs are that eager cache (a BundledProgram consumer runs
every case as is); bundlerun threads the target's own cache instead (`state: "io"`,
`build.llm.kv_io`, targets/workers/io_state.py).
"""

from __future__ import annotations

import os
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable

from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.llm_arch import OWN_LLM_BACKENDS
from bundlerun.bundles.manifest_records import BuildInfo, ModelInfo
from bundlerun.bundles.sequence import KvLink, SequenceSpec, SequenceStep
from bundlerun.bundles import build_cache, partition_control
from bundlerun.bundles.backends.base import LoweringRequest
from bundlerun.bundles.backends.qnn import lower
from bundlerun.bundles.manifest import Manifest, MethodManifest, OutputSpec
from bundlerun.bundles.program_meta import program_operators
from bundlerun.bundles.tolerances import ToleranceContext, resolve_criteria

PACKAGE = "executorch.examples.qualcomm.oss_scripts.llama"
AR_LEN = 1  # QNN's "kv" model_mode (wrappers/base_component.py:93-101)
KV_UPDATE = ("each step's new K (output 1+l, axis 3) and V (output 1+n_layers+l, axis 2) written into the cache "
             "inputs at the step's start_pos, QNN's smart-mask KV manager "
             "(examples/qualcomm/oss_scripts/llama/runner/kv_manager.cpp:418-500)")
EXPORTER = "examples/qualcomm/oss_scripts/llama model/static_llama.py LlamaModel (kv mode, ar_len 1)"


_RECIPES = "examples/qualcomm/oss_scripts/llama/static_llm_quant_recipe.py"
# `--dtype 16a4w`: the recipe QNN's config names for the architecture (16-bit activations, 4-bit weights, per
# block or per channel, with the 16a8w layers it lists), quantization_guidance.md's and README.md's "16a4w"
QUANT_DTYPE = "16a4w"


@dataclass(frozen=True)
class QnnArch:
    """What QNN's LLMModelConfig registry (examples/qualcomm/oss_scripts/llama/__init__.py) says of the
    architecture's closest registered model: read from the source, since its module is not imported."""

    config: str  # the registered name
    transform_weight: bool  # permute wq/wk from Meta's rope layout to HF's (llm_wrappers.py:330-356)
    masked_softmax: bool  # enable_masked_softmax (QNN >= 2.35; the simulator is 2.49.40)
    source: str
    recipe: str  # the config's quant_recipe: a class of static_llm_quant_recipe.py (`--dtype 16a4w`)
    recipe_source: str


QNN_ARCHS: dict[str, QnnArch] = {
    "llama3": QnnArch("llama3_2-1b_instruct", True, False, "examples/qualcomm/oss_scripts/llama/__init__.py:265-281",
                      "Llama3_1BQuantRecipe", f"{_RECIPES}:130-168"),
    "llama2": QnnArch("stories110m", True, False, "examples/qualcomm/oss_scripts/llama/__init__.py:248-262",
                      "LlamaStories110MQuantRecipe", f"{_RECIPES}:88-128"),
    "qwen3": QnnArch("qwen3-0_6b", False, True, "examples/qualcomm/oss_scripts/llama/__init__.py:497-513",
                     "Qwen3_0_6BQuantRecipe", f"{_RECIPES}:603-636"),
    "qwen2_5": QnnArch("qwen2_5-0_5b", False, True, "examples/qualcomm/oss_scripts/llama/__init__.py:459-475",
                       "Qwen2_5_0_5BQuantRecipe", f"{_RECIPES}:545-567"),
    "smollm2": QnnArch("smollm2_135m", True, False, "examples/qualcomm/oss_scripts/llama/__init__.py:535-551",
                       "Smollm2QuantRecipe", f"{_RECIPES}:676-697"),
}


def kv_io(n_layers: int) -> list[KvLink]:
    """Inputs are tokens, atten_mask, input_pos, k_0..k_{n-1}, v_0..v_{n-1}; outputs logits,
    k_0..k_{n-1}, v_0..v_{n-1} (LlamaModel.forward's flattened (logits, [k], [v]))."""
    return ([KvLink(1 + layer, 3 + layer, 3) for layer in range(n_layers)]
            + [KvLink(1 + n_layers + layer, 3 + n_layers + layer, 2) for layer in range(n_layers)])


def _static_package() -> None:
    """Register the example package by path, without running its __init__ (see the module docstring)."""
    if PACKAGE in sys.modules:
        return
    import executorch.examples.qualcomm.oss_scripts as oss

    folder = os.path.join(list(oss.__path__)[0], "llama")
    if not os.path.isfile(os.path.join(folder, "model", "static_llama.py")):
        raise BuildError(f"this executorch wheel has no QNN static llama ({folder}/model/static_llama.py)")
    pkg = types.ModuleType(PACKAGE)
    pkg.__path__ = [folder]
    pkg.__package__ = PACKAGE
    sys.modules[PACKAGE] = pkg


def _decoder(p: Any, seed: int, checkpoint: Any) -> tuple[Any, str]:
    """QNN's static LlamaModel with the build's weights, transformed as llm_wrappers.TextDecoder does."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    _static_package()
    try:
        from executorch.backends.qualcomm.utils.utils import convert_linear_to_conv2d
        from executorch.examples.qualcomm.oss_scripts.llama.model.static_llama import LlamaModel
    except ImportError as exc:
        raise BuildError(f"QNN's static llama needs {exc.name or exc}: pip install -e '.[qnn-llm]' "
                         "(scripts/setup.sh installs it)") from None
    arch = QNN_ARCHS[p.arch]
    if checkpoint is not None:
        from bundlerun.bundles.llm_build import _file_digest  # start-up: loads numpy on use

        state = torch.load(checkpoint, weights_only=True, map_location="cpu")
        state = state.get("model", state) if isinstance(state, dict) else state
        weights = f"checkpoint sha256:{_file_digest(checkpoint)}"
    else:  # the XNNPACK build's seeded weights (bundles/llm_build.export): one model on every lane
        torch.manual_seed(seed)
        state = construct_transformer(ModelArgs(max_seq_len=p.max_seq_len, max_context_len=p.max_seq_len,
                                                **p.params)).state_dict()
        weights = f"seeded (seed {seed})"
    args = ModelArgs(max_seq_len=p.max_seq_len, max_context_len=p.max_seq_len, **p.params)
    # what wrappers/base_component.py:process_model_args sets for the decode graph (ar_len 1, kv mode)
    args.max_batch_size, args.use_kv_cache, args.ar_len = 1, True, AR_LEN
    args.kv_io_bit_width = 32  # unquantized KV I/O (llm_wrappers.py:432-434's sentinel)
    args.enable_masked_softmax = arch.masked_softmax
    args.enable_r3 = False
    decoder = LlamaModel(args, ar_len=AR_LEN, output_new_cache_only=True, output_cache=True, use_i64_token=False)
    state = {k: v for k, v in state.items() if k in decoder.state_dict() or not k.endswith(("freqs_cos", "freqs_sin"))}
    if arch.transform_weight:
        state = _permute_rope(state, decoder, args)
    try:
        decoder.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise BuildError(f"the checkpoint does not fit QNN's static llama: {str(exc).splitlines()[0][:300]}") from None
    for layer in decoder.layers:
        if getattr(layer.attention, "prepare_attention_conv", None):
            layer.attention.prepare_attention_conv()
        if getattr(layer.feed_forward, "prepare_feedforward_conv", None):
            layer.feed_forward.prepare_feedforward_conv()
    decoder = convert_linear_to_conv2d(decoder)
    for name in ("freqs_cos", "freqs_sin"):  # hf rope slices a view: a buffer of its own (see docs/qnn.md)
        decoder.register_buffer(name, getattr(decoder, name).contiguous().clone(), persistent=False)
    return decoder.eval(), weights


def _permute_rope(state: dict, decoder: Any, args: Any) -> dict:
    """wq/wk from Meta's interleaved rope layout to HF's halves (llm_wrappers.py:330-356, transform_weight)."""
    partial = int(1 // args.partial_rotary_factor)

    def permute(w: Any, heads: int) -> Any:
        d0, d1 = w.size(0), w.size(1)
        return w.view(heads, -1, d0 // heads // 2 // partial, 2, d1).transpose(2, 3).reshape(d0, d1)

    state = dict(state)
    for i in range(decoder.n_layers):
        state[f"layers.{i}.attention.wq.weight"] = permute(state[f"layers.{i}.attention.wq.weight"], decoder.n_heads)
        state[f"layers.{i}.attention.wk.weight"] = permute(state[f"layers.{i}.attention.wk.weight"], decoder.n_kv_heads)
    return state


def quant_recipe(arch: str) -> tuple[Any, str]:
    """The QuantRecipe QNN's config names for the architecture (its `quant_recipe`), and a line saying
    what it quantizes how. No KV-I/O or logits-I/O tagging: the program keeps fp32 I/O (docs/qnn.md)."""
    _static_package()
    from importlib import import_module

    try:
        module = import_module(f"{PACKAGE}.static_llm_quant_recipe")
    except ImportError as exc:
        raise BuildError(f"QNN's static llama quant recipes need {exc.name or exc}") from None
    spec = QNN_ARCHS[arch]
    recipe = getattr(module, spec.recipe)()
    kv8 = any(getattr(f, "__name__", "") == "annotate_kv_8bit" for f in recipe.recipe.custom_quant_annotations)
    return recipe.recipe, (f"{spec.recipe} ({spec.recipe_source}, {spec.config}'s quant_recipe): default "
                           f"{recipe.default_quant_dtype.name}" + (", KV cache 8-bit (annotate_kv_8bit)" if kv8 else ""))


def _mask(ctx: int, pos: int) -> Any:
    """The attention mask of a one-token step at `pos`: QNN's causal mask (masking_utils.py:15-40, shape
    [1, 1, ar_len, ctx], the step's own column last) with the first `pos` cache columns unmasked, the smart
    mask QNN's runner keeps (runner/kv_manager.cpp:418-500). Not `smart_mask_init(pos)`: at executorch 1.5.1
    it writes `mask[:, :, :pos] = 0` (masking_utils.py:146), the ar_len axis of that 4-D mask, which unmasks
    the whole row from pos 1 on: every step then attended to all ctx-1 cache slots, zeros included, and the
    reference was not export_llama's model (5-6 dB apart at position 2, tests/test_qnn_llm.py)."""
    from executorch.examples.qualcomm.oss_scripts.llama.masking_utils import create_causal_attn_mask

    mask = create_causal_attn_mask(1, AR_LEN, ctx).clone()
    mask[..., :pos] = 0
    return mask


def reference_cases(decoder: Any, prompts: list[list[int]], decode_steps: int,
                    ctx: int) -> tuple[list[tuple[list[Any], list[Any]]], list[list[SequenceStep]]]:
    """Step the eager static model through every prompt (one token a step) and its teacher-forced
    decode steps on its own cache, threaded as kv_io says: (inputs, expected outputs) per case."""
    import torch

    n = decoder.n_layers
    links = kv_io(n)
    cases: list[tuple[list[Any], list[Any]]] = []
    sequences: list[list[SequenceStep]] = []
    example = decoder.get_example_inputs()
    with torch.no_grad():
        for ids in prompts:
            caches = [t.clone().zero_() for t in (*example[3], *example[4])]
            steps: list[SequenceStep] = []
            feed = list(ids)
            pos, nxt = 0, -1
            plan = [("prompt", t) for t in feed] + [("decode", None)] * decode_steps
            for kind, token in plan:
                token = nxt if token is None else token
                inputs = [torch.tensor([[token]], dtype=torch.int32), _mask(ctx, pos),
                          torch.tensor([[pos]], dtype=torch.int32), *[c.clone() for c in caches]]
                logits, ks, vs = decoder(*inputs[:3], *inputs[3:])
                outputs = [logits.float().contiguous(), *[k.contiguous() for k in ks], *[v.contiguous() for v in vs]]
                if not torch.isfinite(logits).all():
                    raise BuildError(f"the eager static model's logits are not finite at position {pos} (weights?)")
                nxt = int(logits.reshape(-1).argmax())
                steps.append(SequenceStep(case=len(cases), kind=kind, start_pos=pos, tokens=[token], reference_next=nxt))
                cases.append((inputs, outputs))
                for link in links:
                    index = [slice(None)] * caches[link.input - 3].dim()
                    index[link.axis] = slice(pos, pos + AR_LEN)
                    caches[link.input - 3][tuple(index)] = outputs[link.output]
                pos += AR_LEN
            sequences.append(steps)
    return cases, sequences


def build_qnn_llm_bundle(req: Any, say: Callable[[str], None]) -> Any:
    """BuildRequest (model `llm:ARCH`, backend qnn) -> BuildResult; through the build cache."""
    from bundlerun.bundles.build_parts import BuildResult, _cache_key, _from_cache, _value_from_tensor  # start-up: loads flatbuffers, numpy on use
    from bundlerun.bundles.llm_build import LlmOptions, _prompts, plan  # start-up: loads numpy on use

    opts = req.llm or LlmOptions()
    dtypes = OWN_LLM_BACKENDS["qnn"]
    dtype = req.dtype or dtypes[0]
    if dtype not in dtypes:
        raise BuildError(f"--dtype {dtype!r} for an LLM on QNN: bundlerun builds {', '.join(dtypes)} (fp16, or "
                         f"{QUANT_DTYPE}: the quant recipe QNN's config names for the architecture, docs/qnn.md)")
    p = plan(req.model, "fp32", opts)  # the shape and sequences; the dtype is QNN's
    if p.arch not in QNN_ARCHS:
        raise BuildError(f"llm:{p.arch} on QNN: bundlerun maps {', '.join(QNN_ARCHS)} to QNN's static llama configs")
    req.dtype = dtype
    reference = "eager-fp32"
    key = _cache_key(req, "qnn", reference)
    discarded = None
    if req.cache and key is not None:
        hit = _from_cache(req, key, say)
        if not isinstance(hit, (str, type(None))):
            return hit
        discarded = hit
    say(f"building QNN's static llama for llm:{p.arch} ({p.size}, ar_len {AR_LEN}, KV cache as I/O)")
    decoder, weights = _decoder(p, req.seed, opts.checkpoint)
    prompts, shown, tokenizer_digest = _prompts(p, opts, req.seed)
    say(f"stepping the eager static model through {len(prompts)} prompts + {p.decode_steps} decode steps each")
    cases, steps = reference_cases(decoder, prompts, p.decode_steps, p.max_seq_len)

    recipe, recipe_line, calibration = None, None, []
    if dtype == QUANT_DTYPE:
        recipe, recipe_line = quant_recipe(p.arch)
        # PTQStrategy._calibrate (quantize/ptq.py:40-60) runs the calibration prompts through the prepared
        # decoder; in kv mode a prompt goes one token a step: here every step of every sequence, the
        # bundle's own prompts and teacher-forced continuations
        calibration = [tuple(ins) for ins, _ in cases]
        say(f"quantizing with {recipe_line}; calibrating on {len(calibration)} steps")
    say(f"lowering with QNN ({'fp16' if recipe is None else QUANT_DTYPE}, to_edge_transform_and_lower_to_qnn)")
    start = time.perf_counter()
    # `bundlerun bisect`: the AOT child applies the restriction and records what QNN took (bundles/partition_control.py)
    lowered = partition_control.wrap(lower)(LoweringRequest(
        model=decoder, example_inputs=tuple(cases[0][0]), calibration_inputs=calibration,
        dtype="fp16" if recipe is None else "int16", backend="qnn", target=req.target,
        options={} if recipe is None else {"qnn_recipe": recipe},
        target_info=dict(req.target_info or {})))
    export_s = time.perf_counter() - start
    program = lowered.program.buffer
    sequences = [SequenceSpec(f"seq{i}", "forward", True, "teacher-forced", s, shown[i], state="io")
                 for i, s in enumerate(steps)]
    manifest = _manifest(req, p, decoder, cases, sequences, program, lowered.info, weights, tokenizer_digest,
                         export_s, reference, key, recipe_line)
    from bundlerun.bundles.bpte import Bundle, BundledTestCase, MethodTestSuite, write_bundle  # start-up: loads flatbuffers, numpy on use

    test_cases = [BundledTestCase(inputs=[_value_from_tensor(t) for t in ins],
                                  expected_outputs=[_value_from_tensor(t) for t in outs]) for ins, outs in cases]
    bundle = Bundle(program=program, method_test_suites=[MethodTestSuite("forward", test_cases)],
                    manifest_json=manifest.to_dict())
    say(f"writing {req.output}")
    try:
        path = write_bundle(bundle, req.output)
    except OSError as exc:
        raise BuildError(f"cannot write {req.output}: {exc.strerror or exc}") from None
    info: dict[str, Any] = {"export_s": export_s, **lowered.info}
    if req.cache and key is not None:
        stored = build_cache.store(key, path)
        info.update(cache="miss" if stored else "not stored", cache_key=key)
        if discarded:
            info["warnings"] = [discarded]
    return BuildResult(path=path, manifest=manifest, info=info)


def _manifest(req: Any, p: Any, decoder: Any, cases: list, sequences: list[SequenceSpec], program: bytes,
              lowering: dict[str, Any], weights: str, tokenizer_digest: str | None, export_s: float,
              reference: str, key: str | None, recipe_line: str | None = None) -> Any:
    import datetime as _dt
    import platform

    import numpy as np

    from bundlerun.bundles import scalar_types as st  # start-up: loads numpy on use
    from bundlerun.bundles.build_parts import _versions  # start-up: loads flatbuffers, numpy on use
    from bundlerun.bundles.llm_build import REFERENCE  # start-up: loads numpy on use

    n = decoder.n_layers
    names = ["logits", *[f"k_cache_{i}" for i in range(n)], *[f"v_cache_{i}" for i in range(n)]]
    outputs = []
    for j, name in enumerate(names):
        first = cases[0][1][j]
        # 16a4w: 16-bit activations, the int16 tier against the eager fp32 model (int16.vs-float)
        ctx = ToleranceContext(backend="qnn", target=req.target, dtype="int16" if recipe_line else req.dtype,
                               model=req.model, method="forward",
                               output_name=f"out{j}", output_index=j, output_dtype="float32", reference=reference,
                               input_distribution="tokens", host_arch=platform.machine(),
                               quantization=QUANT_DTYPE if recipe_line else None,
                               reference_dtype="float32", expected=np.stack([c[1][j].numpy() for c in cases]))
        criteria = resolve_criteria(ctx, req.overrides, req.registry)
        outputs.append(OutputSpec(f"out{j}", st.name(st.code_from_torch(first.dtype)), list(first.shape), criteria,
                                  False))
    arch = QNN_ARCHS[p.arch]
    llm = {"arch": p.arch, "size": p.size, "params": p.params, "dtype": req.dtype, "quantization": recipe_line or "none (fp16 HTP)",
           "max_seq_len": p.max_seq_len, "dynamic_shape": False, "use_kv_cache": True, "weights": weights,
           "tokenizer": tokenizer_digest, "export_s": round(export_s, 3),
           "model_class": f"static_llama.LlamaModel ({arch.config}: transform_weight={arch.transform_weight}, "
                          f"masked_softmax={arch.masked_softmax}, {arch.source})",
           "reference": REFERENCE.replace("export_llama's LLMEdgeManager.model", "QNN's static LlamaModel"),
           "exporter": EXPORTER, "kv_io": [link.to_dict() for link in kv_io(n)], "kv_update": KV_UPDATE}
    declared = [{"shape": list(t.shape), "dtype": st.name(st.code_from_torch(t.dtype)), "distribution": d}
                for t, d in zip(cases[0][0], ["tokens", "attention-mask", "input_pos", *["kv-cache"] * (2 * n)])]
    lowering = {k: v for k, v in lowering.items() if k != "warnings"}
    return Manifest(
        model=ModelInfo.from_dict({"id": req.model, "source": "executorch examples/qualcomm/oss_scripts/llama (static llama)",
               "description": f"{p.arch} ({p.size}) as QNN's static LlamaModel, KV cache as inputs/outputs, "
                              f"{weights} weights"}),
        build=BuildInfo.from_dict({"backend": "qnn", "target": req.target, "dtype": req.dtype,
               "quantization": f"qnn-static-llm-{QUANT_DTYPE}" if recipe_line else None,
               "reference": reference, "inputs": declared, "seed": req.seed, "cases": len(cases),
               "lowering": {**lowering, "exporter": "qnn static llama"},
               "ops": sorted(program_operators(program)), "overrides": dict(req.overrides),
               **({"cache_key": key} if key is not None else {}), "llm": llm}),
        versions=_versions(),
        methods={"forward": MethodManifest("forward", [], outputs)},
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        sequences=sequences,
    )
