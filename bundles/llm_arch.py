"""Which LLM architectures `bundlerun build llm:ARCH` builds, and at which sizes (docs/llm.md).

ExecuTorch's `export_llama` builds every model of `examples/models/llama/llama_transformer.py`
from a `params.json` (ModelArgs fields) and a `ModelType` (model_class). The wheel ships the
code but not the params files, so each architecture's shape-free flags (rope flavour, qk-norm,
qkv bias, rope theta, norm eps) are copied here from the pinned source and cited; the shape
(dim, layers, heads, vocabulary) comes from the size. Pure data: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arch:
    model_class: str  # executorch.extension.llm.export.config.llm_config.ModelType value
    flags: dict[str, Any]  # ModelArgs fields that make the architecture what it is
    source: str  # where the flags come from (ExecuTorch path:lines at the pinned commit)
    gqa: bool = True  # the real models use fewer kv heads than query heads


ARCHS: dict[str, Arch] = {
    # ModelArgs defaults are Llama's (examples/models/llama/model_args.py); rope theta 500000 and
    # scaled rope are Llama 3's published params.json (not in the ExecuTorch tree: bundlerun copies
    # them); export_llama keeps the default rope_scale_factor for model_class llama3
    # (examples/models/llama/model.py:131-138).
    "llama3": Arch("llama3", {"rope_theta": 500000.0, "use_scaled_rope": True, "norm_eps": 1e-05},
                   "examples/models/llama/model_args.py; examples/models/llama/model.py:131-138; Llama 3 params.json"),
    "llama2": Arch("llama2", {"norm_eps": 1e-05}, "examples/models/llama/params/demo_config.json:1", gqa=False),
    "qwen3": Arch("qwen3_0_6b", {"rope_theta": 1000000.0, "use_scaled_rope": False, "norm_eps": 1e-06,
                                 "use_hf_rope": True, "attention_qkv_bias": False, "use_qk_norm": True,
                                 "qk_norm_before_rope": True},
                  "examples/models/qwen3/config/0_6b_config.json:1-17"),
    "qwen2_5": Arch("qwen2_5_0_5b", {"rope_theta": 1000000.0, "use_scaled_rope": False, "norm_eps": 1e-06,
                                     "use_hf_rope": True, "attention_qkv_bias": True},
                    "examples/models/qwen2_5/config/0_5b_config.json:1-14"),
    "smollm2": Arch("smollm2", {"rope_theta": 100000.0, "use_scaled_rope": False, "norm_eps": 1e-05,
                                "use_hf_rope": False, "attention_qkv_bias": False},
                    "examples/models/smollm2/135M_config.json:1-13"),
}


@dataclass(frozen=True)
class Size:
    shape: dict[str, int]
    max_seq_len: int
    prompt_lengths: tuple[int, ...]  # one sequence per length, inside the dynamic range
    decode_steps: int
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


SIZES: dict[str, Size] = {
    # bundlerun's own: the smallest llama export_llama lowers in ~30 s on 2 cores (issue 35's
    # "dim 64, 2 layers, 4 heads, vocab 512"; ExecuTorch's own demo config is dim 64, vocab 512:
    # examples/models/llama/params/demo_config.json:1).
    "tiny": Size({"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128, "vocab_size": 512},
                 max_seq_len=64, prompt_lengths=(3, 9, 24), decode_steps=4),
    # stories15M (karpathy/llama2.c, the model ExecuTorch's stories110M guide scales down):
    # dim 288, 6 layers, 6 heads, 6 kv heads, hidden 768, vocab 32000, context 256.
    "small": Size({"dim": 288, "n_layers": 6, "n_heads": 6, "hidden_dim": 768, "vocab_size": 32000},
                  max_seq_len=256, prompt_lengths=(3, 17, 64), decode_steps=4,
                  note="stories15M-class (llama2.c)"),
}

# The LLM lowerings `bundlerun build llm:ARCH --backend B` runs, each export_llama's own path for B
# (examples/models/llama/export_llama_lib.py: `_to_edge_and_lower_llama_xnnpack`, the Vulkan partitioner
# in `_to_edge_and_lower_llama` (get_vulkan_partitioner), `_to_edge_and_lower_llama_mlx`), and the dtypes
# each takes: export_llama's own options for that backend (extension/llm/export/config/llm_config.py:
# QuantizationConfig.qmode, Pt2eQuantize, VulkanConfig.force_fp16).
LLM_BACKENDS: dict[str, tuple[str, ...]] = {
    "xnnpack": ("fp32", "8da4w", "int8-dynamic"),
    "vulkan": ("fp32", "fp16", "vulkan_8w"),
    "mlx": ("fp32", "4w"),
}
DTYPES = tuple(dict.fromkeys(d for dtypes in LLM_BACKENDS.values() for d in dtypes))
# Backends whose own LLM path is not export_llama's (bundles/llm_qnn.py: QNN's static llama, its KV cache
# as program I/O): their dtypes, the first the default. HTP computes in fp16 or integer.
OWN_LLM_BACKENDS: dict[str, tuple[str, ...]] = {"qnn": ("fp16", "16a4w")}


def default_llm_dtype(backend: str) -> str:
    """The dtype an LLM build takes on `backend` when none is given."""
    return OWN_LLM_BACKENDS.get(backend, ("fp32",))[0]
# torchao source transforms: the eager model export_llama lowers is already quantized (reference `quantized`)
SOURCE_QUANTIZED = ("8da4w", "4w")


def params_for(arch: str, size: str) -> dict[str, Any]:
    """params.json for `arch` at `size`: the architecture's flags and the size's shape. Query heads
    share kv heads two to one where the real model uses grouped-query attention."""
    a, s = ARCHS[arch], SIZES[size]
    params = {**s.shape, **a.flags}
    params["n_kv_heads"] = params["n_heads"] // 2 if a.gqa and params["n_heads"] % 2 == 0 else params["n_heads"]
    return params


def llm_backend(target_backend: str) -> str:
    """The LLM lowering a target's own backend implies: itself where export_llama lowers for it; the
    CPU lanes whose zoo default is portable (qemu-user://aarch64: its runner links XNNPACK and the LLM
    custom ops) take XNNPACK, export_llama's CPU path; anything else stays as it is and is refused by
    the build in one line."""
    if target_backend in LLM_BACKENDS:
        return target_backend
    return "xnnpack" if target_backend == "portable" else target_backend


def tier(dtype: str) -> str:
    """The registry's dtype tier an LLM dtype is judged in: fp16 compute is the fp16 tier, every quantized
    mode the int8 one (quantized linears)."""
    return dtype if dtype in ("fp32", "fp16") else "int8"


def quantization(dtype: str) -> dict[str, Any]:
    """The LlmConfig fields a dtype sets (extension/llm/export/config/llm_config.py): 8da4w is torchao's
    int8-dynamic-activation int4-weight source transform at group 32 (QuantizationConfig.qmode, the
    group size export_llama's README uses); int8-dynamic is pt2e's xnnpack_dynamic (Pt2eQuantize);
    4w torchao's int4 weight-only transform (qmode "4w", examples/models/llama/source_transformation/
    quantize.py:177-193) at group 32, the smallest group MLX's quantized matmul takes
    (backends/mlx/llm/quantization.py: --qlinear-group-size 32/64/128) and one that divides the tiny dim
    64; vulkan_8w pt2e's Vulkan 8-bit weight quantizer (extension/llm/export/quantizer_lib.py:309-323)."""
    if dtype in ("8da4w", "4w"):
        return {"qmode": dtype, "group_size": 32}
    if dtype == "int8-dynamic":
        return {"pt2e_quantize": "xnnpack_dynamic"}
    if dtype == "vulkan_8w":
        return {"pt2e_quantize": "vulkan_8w"}
    return {}
