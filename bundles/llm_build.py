"""`bundlerun build llm:ARCH`: an LLM exported by ExecuTorch's own `export_llama`, bundled with
stateful sequences (docs/llm.md; the data contract in bundles/sequence.py).

The program comes from `executorch.examples.models.llama.export_llama_lib._export_llama(LlmConfig)`
with the KV cache in the program (use_kv_cache, use_sdpa_with_kv_cache), a dynamic token dimension
(enable_dynamic_shape) and the backend's own export_llama path (XNNPACK, Vulkan or MLX). Without a user checkpoint the weights are seeded: the example's
own `construct_transformer` built under `torch.manual_seed(seed)` and saved as the checkpoint
(export_llama without one leaves RMSNorm weights, rope tables and masks uninitialised on the meta
device, and the logits are NaN). The expected logits come from the eager, source-transformed model
export_llama lowered (`LLMEdgeManager.model`), stepped through the same prompts and decode steps in
the same order on its own KV cache.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.llm_arch import ARCHS, LLM_BACKENDS, SIZES, SOURCE_QUANTIZED, params_for, quantization, tier
from bundlerun.bundles.manifest_records import BuildInfo, EtrecordInfo, ModelInfo
from bundlerun.bundles.sequence import SequenceSpec, SequenceStep
from bundlerun.bundles import build_cache, scalar_types as st, vulkan_rms_norm_eps
from bundlerun.bundles.backends.common import quiet_framework_logs
from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.etrecord import etrecord_path_for
from bundlerun.bundles.fileio import file_sha256
from bundlerun.bundles.manifest import Manifest, MethodManifest, OutputSpec
from bundlerun.bundles.mlx_codegen import ensure_mlx_importable
from bundlerun.bundles.program_meta import method_inputs, program_operators
from bundlerun.bundles.safe_read import load_json_bounded
from bundlerun.bundles.tolerances import ToleranceContext, resolve_criteria
from bundlerun.bundles import partition_control
from bundlerun.bundles.backends.common import delegation_summary

PREFIX = "llm:"
# A user's params.json sizes the model bundlerun builds in memory (seeded weights, the eager reference and
# the export): bundlerun's own bounds, far above the 8B-class models export_llama exports
# (examples/models/llama/README.md) and below what a hostile file could make it allocate.
SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "head_dim")
MAX_SHAPE = 1 << 20
MAX_PARAMETERS = 20_000_000_000
# export_llama's dynamic token dimension: Dim("token_dim", max=max_seq_len - 1)
# (extension/llm/export/builder.py:139-151).
REFERENCE = "eager source-transformed model (export_llama's LLMEdgeManager.model, its own KV cache)"


@dataclass
class LlmOptions:
    """What `bundlerun build llm:ARCH` takes beside the BuildRequest."""

    size: str = "tiny"
    params: Path | None = None  # the user's params.json (replaces the size's shape and the arch's flags)
    checkpoint: Path | None = None  # the user's checkpoint (.pth); None: seeded weights
    tokenizer: Path | None = None  # tokenizer.model / tokenizer.json (pytorch_tokenizers)
    prompts: list[str] = field(default_factory=list)  # text prompts (need a tokenizer)
    decode_steps: int | None = None  # per prompt; None: the size's
    max_seq_len: int | None = None  # None: the size's

    def cache_material(self) -> dict[str, Any]:
        return {"size": self.size, "params": _file_digest(self.params), "checkpoint": _file_digest(self.checkpoint),
                "tokenizer": _file_digest(self.tokenizer), "prompts": list(self.prompts),
                "decode_steps": self.decode_steps, "max_seq_len": self.max_seq_len}


def is_llm(model: str) -> bool:
    return model.startswith(PREFIX)


def _file_digest(path: Path | None) -> str | None:
    if path is None:
        return None
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise BuildError(f"cannot read {path}: {exc.strerror or exc}") from None
    return h.hexdigest()


@dataclass
class LlmPlan:
    """The checked request: architecture, params, dtype and the sequences' shape."""

    arch: str
    size: str
    params: dict[str, Any]
    dtype: str
    max_seq_len: int
    prompt_lengths: list[int]
    decode_steps: int
    backend: str = "xnnpack"


def plan(model: str, dtype: str | None, opts: LlmOptions, backend: str = "xnnpack") -> LlmPlan:
    """One-line BuildErrors for everything wrong with the request, before torch is imported."""
    if backend not in LLM_BACKENDS:
        raise BuildError(f"backend {backend} (--backend, else the target's own): bundlerun lowers LLMs through "
                         f"export_llama's own paths for {', '.join(LLM_BACKENDS)}, and QNN's static llama for qnn, only "
                         "(docs/llm.md)")
    arch = model[len(PREFIX):]
    if arch not in ARCHS:
        import difflib

        close = difflib.get_close_matches(arch, list(ARCHS), n=1)
        raise BuildError(f"unknown LLM architecture {arch!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                         + f" (known: {', '.join(ARCHS)})")
    dtype = dtype or "fp32"
    if dtype not in LLM_BACKENDS[backend]:
        raise BuildError(f"--dtype {dtype!r} for an LLM on {backend}: choose one of {', '.join(LLM_BACKENDS[backend])}")
    if opts.size not in SIZES:
        raise BuildError(f"--size {opts.size!r}: choose one of {', '.join(SIZES)}")
    size = SIZES[opts.size]
    if opts.params is not None:
        params = _read_params(opts.params)
    else:
        params = params_for(arch, opts.size)
    max_seq_len = opts.max_seq_len or size.max_seq_len
    if not 4 <= max_seq_len <= 1 << 16:  # bundlerun's own: a cache of 65536 positions is far past any test bundle
        raise BuildError(f"--max-seq-len {max_seq_len}: give 4 to 65536")
    steps = size.decode_steps if opts.decode_steps is None else opts.decode_steps
    if not 0 <= steps <= 1024:  # bundlerun's own bound: a sequence is a test, not a generation
        raise BuildError(f"--decode-steps {steps}: give 0 to 1024")
    lengths = [n for n in size.prompt_lengths if n + steps <= max_seq_len - 1] or [1]
    if opts.prompts and opts.tokenizer is None:
        raise BuildError("--prompt needs --tokenizer (prompts given as text go through the tokenizer)")
    if opts.checkpoint is not None and opts.params is None:
        raise BuildError("--checkpoint needs the --params params.json it was trained with")
    for path in (opts.checkpoint, opts.tokenizer):
        if path is not None and not Path(path).is_file():
            raise BuildError(f"{path}: no such file")
    return LlmPlan(arch, opts.size if opts.params is None else "custom", params, dtype, max_seq_len, lengths, steps,
                   backend)


def _read_params(path: Path) -> dict[str, Any]:
    try:  # 1 MiB: bundlerun's own bound; a params.json is a few hundred bytes (phi_4_mini's, with rope lists, 2 KiB)
        data = load_json_bounded(Path(path), 1 << 20)
    except (OSError, ValueError, BundlerunError) as exc:
        raise BuildError(f"{path}: not a readable params.json ({exc})") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path}: params.json must be a JSON object of ModelArgs fields")
    for key in SHAPE_KEYS:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHAPE):
            raise BuildError(f"{path}: {key} = {str(value)[:40]} is not a whole number from 1 to {MAX_SHAPE}")
    dim, vocab = data.get("dim") or 4096, data.get("vocab_size") or 512  # ModelArgs' defaults where unset
    hidden, layers = data.get("hidden_dim") or 4 * dim, data.get("n_layers") or 1
    count = 2 * dim * vocab + layers * (4 * dim * dim + 3 * dim * hidden)
    if count > MAX_PARAMETERS:
        raise BuildError(f"{path}: about {count / 1e9:.1f}e9 parameters; bundlerun builds up to "
                         f"{MAX_PARAMETERS / 1e9:g}e9 (seeded weights and the eager reference live in memory)")
    return data


# --------------------------------------------------------------------------- export


@dataclass
class Exported:
    program: bytes
    eager: Any  # the source-transformed eager Transformer (KV cache as buffers)
    weights: str
    quantization: str
    export_s: float
    model_class: str
    manager: Any = None  # export_llama's LLMEdgeManager (its export_program: ExecuTorch's program manager)
    lowering: dict[str, Any] = field(default_factory=dict)  # the manifest's build.lowering (delegate calls, bisect units)


def export(p: LlmPlan, opts: LlmOptions, seed: int, say: Callable[[str], None],
           etrecord: Path | None = None) -> Exported:
    """Run ExecuTorch's `_export_llama` in a temporary folder (it writes the .pte to its output dir
    and reads params/checkpoint from files) and return the program bytes and the eager model."""

    quiet_framework_logs()
    import torch
    from executorch.examples.models.llama.export_llama_lib import _export_llama
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs
    from executorch.extension.llm.export.config.llm_config import LlmConfig, ModelType, Pt2eQuantize

    arch = ARCHS[p.arch]
    with tempfile.TemporaryDirectory(prefix="bundlerun-llm-") as tmp, contextlib.chdir(tmp):
        folder = Path(tmp)
        (folder / "params.json").write_text(json.dumps(p.params))
        if opts.checkpoint is not None:
            checkpoint = Path(opts.checkpoint).resolve()
            weights = f"checkpoint sha256:{_file_digest(checkpoint)}"
        else:
            say(f"seeding weights (seed {seed}) with construct_transformer")
            torch.manual_seed(seed)
            try:
                seeded = construct_transformer(ModelArgs(max_seq_len=p.max_seq_len, max_context_len=p.max_seq_len,
                                                         **p.params))
            except Exception as exc:  # noqa: BLE001 - whatever the example's constructor says of bad params
                raise BuildError(f"params {json.dumps(p.params)[:200]} do not build a Transformer: "
                                 f"{type(exc).__name__}: {str(exc)[:200]}") from None
            checkpoint = folder / "seeded.pth"
            torch.save(seeded.state_dict(), checkpoint)
            weights = f"seeded (seed {seed})"
        config = LlmConfig()
        config.base.model_class = ModelType(arch.model_class)
        config.base.params = str(folder / "params.json")
        config.base.checkpoint = str(checkpoint)
        config.model.use_kv_cache = True
        config.model.use_sdpa_with_kv_cache = True
        config.model.enable_dynamic_shape = True
        config.export.max_seq_length = p.max_seq_len
        config.export.max_context_length = p.max_seq_len
        config.export.output_dir = tmp
        config.export.output_name = str(folder / "model.pte")
        _set_backend(config, p)
        config.debug.generate_etrecord = bool(etrecord)  # written as etrecord.bin in the cwd (export_llama_lib.py:1509)
        quant = quantization(p.dtype)
        if "qmode" in quant:
            config.quantization.qmode = quant["qmode"]
            config.quantization.group_size = quant["group_size"]
        if "pt2e_quantize" in quant:
            config.quantization.pt2e_quantize = Pt2eQuantize(quant["pt2e_quantize"])
        say(f"exporting llm:{p.arch} ({p.size}, {p.dtype}) with export_llama for {p.backend}")

        # `bundlerun bisect`: export_llama builds its partitioners itself (XNNPACK's in export_llama_lib.py:1154
        # `_to_edge_and_lower_llama_xnnpack`) and hands them to the `to_edge_transform_and_lower` that
        # extension/llm/export/builder.py:24 imports; under a restriction that binding is patched to wrap them.
        restriction = partition_control.active()
        start = time.perf_counter()
        # vulkan_8w: the Vulkan rms_norm fusion cannot read the pt2e-lifted epsilon (bundles/vulkan_rms_norm_eps.py)
        eps_fix: contextlib.AbstractContextManager[list[str]] = (
            vulkan_rms_norm_eps.lifted_eps_resolved() if p.backend == "vulkan" else contextlib.nullcontext([]))
        try:
            with partition_control.applied(restriction, write=False) as record, eps_fix as eps_resolved, \
                    linears_left_decomposed(restriction is not None), \
                    exports_shared(restriction is not None, _plan_identity(p, weights, seed)):
                manager = _export_llama(config)
        except Exception as exc:  # noqa: BLE001 - ExecuTorch's exporter: one line, exit 2
            raise BuildError(f"export_llama failed for llm:{p.arch}: {type(exc).__name__}: {str(exc)[:300]}") from None
        export_s = time.perf_counter() - start
        control = None
        if restriction is not None:
            control = {"mechanism": partition_control.MECHANISM,
                       "allowed": "all" if restriction.allowed is None else len(restriction.allowed),
                       "units": record.units() if record is not None else []}
        program = (folder / "model.pte").read_bytes()
        if etrecord is not None:
            _keep_etrecord(folder / "etrecord.bin", etrecord)
    described = ", ".join(f"{k}={v}" for k, v in quant.items()) or "none (fp32)"

    edge = getattr(manager, "edge_manager", None)
    lowering = {"delegate": p.backend, "exporter": "export_llama", **(delegation_summary(edge) if edge is not None else {}),
                **({"partition_control": control} if control is not None else {})}
    if eps_resolved:
        lowering["workarounds"] = [f"{vulkan_rms_norm_eps.WHERE}: the rms_norm fusion's epsilon read from the program's "
                                   f"lifted constants ({', '.join(eps_resolved)}), bundles/vulkan_rms_norm_eps.py"]
    return Exported(program, manager.model.eval(), weights, described, export_s, arch.model_class, manager, lowering)


# `bundlerun bisect`'s candidates of one plan in this process: (plan, call, input graph) -> torch.export.save bytes
_SHARED_EXPORTS: dict[tuple[str, int, str], bytes] = {}


def _plan_identity(p: LlmPlan, weights: str, seed: int) -> str:
    """What export_llama's torch.export of this plan depends on: the plan (arch, params, dtype, backend, lengths)
    and the weights (seeded from `seed`, or a checkpoint's digest)."""
    return json.dumps({"plan": p.__dict__, "weights": weights, "seed": seed}, sort_keys=True, default=str)


@contextlib.contextmanager
def exports_shared(active: bool, identity: str) -> Iterator[None]:
    """`bundlerun bisect`'s candidates: export_llama's two torch.exports (LLMEdgeManager._export: the model,
    then the re-export of its pre-autograd graph: extension/llm/export/builder.py:207, called at :237 and :517) done once
    per plan in this process. The Vulkan path (export_llama_lib.py's `_to_edge_and_lower_llama`) re-exports through
    LLMEdgeManager.export_to_edge instead (builder.py:450), whose torch.export is extension/export_util/utils.py:26
    `_to_core_aten` (called at :88): shared the same way.

    Why: a candidate differs from the next only in what the partitioners may take, which acts after both
    exports (to_edge_transform_and_lower's partitioners, then to_executorch); the exports of the same plan and
    weights are the same program every time. They were about a third of each candidate's build (23.7 of
    70.5 s of _export_llama, tiny llama3 on XNNPACK, bundlerun's own cProfile at load 6). The second export's
    key holds its input graph's code, so a graph that came out different (it never does) is exported anew.
    Kept serialized (torch.export.save) and loaded afresh for each candidate, the first included: each gets
    its own program and shape environment (a deep copy shares the pending unbacked symbols of the KV cache's
    update and the next export fails with PendingUnbackedSymbolNotFound), and to_edge_transform_and_lower
    may rewrite the program it is given. Only the latest plan's exports are kept (they hold its weights)."""
    if not active:
        yield
        return
    import io

    import torch
    from executorch.extension.llm.export.builder import LLMEdgeManager

    from executorch.extension.export_util import utils as export_util

    original, original_core_aten = LLMEdgeManager._export, export_util._to_core_aten
    calls = {"n": 0}

    def kept(key: tuple[str, int, str], export: Callable[[], Any]) -> Any:
        if key not in _SHARED_EXPORTS:
            for old in [k for k in _SHARED_EXPORTS if k[0] != identity]:
                del _SHARED_EXPORTS[old]
            buffer = io.BytesIO()
            torch.export.save(export(), buffer)
            _SHARED_EXPORTS[key] = buffer.getvalue()
        return torch.export.load(io.BytesIO(_SHARED_EXPORTS[key]))

    def shared(self: Any, module: Any = None) -> Any:
        calls["n"] += 1
        return kept((identity, calls["n"], "" if module is None else str(module.code)),
                    lambda: original(self, module))

    def core_aten_shared(model: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        code = str(model.code) if hasattr(model, "code") else type(model).__qualname__
        return kept((identity, calls["n"], code), lambda: original_core_aten(model, *args, **kwargs))

    LLMEdgeManager._export = shared
    export_util._to_core_aten = core_aten_shared
    try:
        yield
    finally:
        LLMEdgeManager._export = original
        export_util._to_core_aten = original_core_aten


@contextlib.contextmanager
def linears_left_decomposed(active: bool) -> Iterator[None]:
    """`bundlerun bisect`'s candidates: export_llama without its ConvertToLinearPass.

    Before to_executorch, export_llama turns every linear left outside a delegate back into
    `aten::linear` (extension/llm/export/builder.py:557, "execute them with the optimized op_linear").
    Only ExecuTorch's optimized kernel library has that operator (kernels/optimized; the portable
    library has `addmm`, `mm` and `permute_copy`, no `linear`), so a runner built with the portable
    kernels (the aarch64 executor_runner of qemu-user://) cannot load a candidate that leaves a linear
    undelegated. Without the pass, such a linear stays the `permute_copy` + `addmm`/`mm` that to_edge
    decomposed it into, which every runtime has: the same matmul on the portable kernels. The delegated
    linears (what bisect searches) are untouched; the full build the bundle came from keeps the pass."""
    if not active:
        yield
        return
    from executorch.exir.pass_base import ExportPass, PassResult
    from executorch.extension.llm.export import builder

    class KeepLinearsDecomposed(ExportPass):
        def call(self, graph_module: Any) -> PassResult:
            return PassResult(graph_module, False)

    original = builder.ConvertToLinearPass
    builder.ConvertToLinearPass = KeepLinearsDecomposed
    try:
        yield
    finally:
        builder.ConvertToLinearPass = original


def _set_backend(config: Any, p: LlmPlan) -> None:
    """The LlmConfig backend section for the plan's backend: export_llama then takes that backend's own
    path (examples/models/llama/export_llama_lib.py: XNNPACK's `_to_edge_and_lower_llama_xnnpack`; Vulkan's
    partitioner in `_to_edge_and_lower_llama` with require_dynamic_shapes and force_fp16
    (extension/llm/export/partitioner_lib.py:42-56); `_to_edge_and_lower_llama_mlx`, after the MLX source
    transforms of its attention, KV cache and RMSNorm)."""
    if p.backend == "vulkan":
        config.backend.vulkan.enabled = True
        config.backend.vulkan.force_fp16 = p.dtype == "fp16"
    elif p.backend == "mlx":
        ensure_mlx_importable()  # the wheel lacks the MLX serializer's generated files (bundles/mlx_codegen.py)
        config.backend.mlx.enabled = True
    else:
        config.backend.xnnpack.enabled = True


def _keep_etrecord(written: Path, dest: Path) -> None:
    """Move the ETRecord export_llama wrote into place beside the bundle (atomically)."""
    if not written.is_file():
        raise BuildError("export_llama wrote no etrecord.bin although generate_etrecord was set; build without --etrecord")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(written, tmp)
        os.replace(tmp, dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"cannot write the ETRecord {dest}: {exc.strerror or exc}") from None


def _etrecord_entry(path: Path) -> dict[str, Any]:
    """The manifest's build.etrecord for an ETRecord export_llama recorded (bundles/etrecord.py `locate` reads it)."""

    return {"path": path.name, "sha256": file_sha256(path), "bytes": path.stat().st_size,
            "graphs": ["exported_program", "edge_dialect_exported_program"], "recorded_by": "export_llama"}


# --------------------------------------------------------------------------- sequences


def _prompts(p: LlmPlan, opts: LlmOptions, seed: int) -> tuple[list[list[int]], list[str | None], str | None]:
    """Token ids of each prompt, the decoded text (tokenizer) and the tokenizer's sha256."""
    vocab = int(p.params.get("vocab_size", 512))
    if opts.tokenizer is None:
        rng = np.random.default_rng(seed)
        return [[int(t) for t in rng.integers(0, vocab, n)] for n in p.prompt_lengths], [None] * len(p.prompt_lengths), None
    from pytorch_tokenizers import get_tokenizer

    try:
        tok = get_tokenizer(str(opts.tokenizer))
    except Exception as exc:  # noqa: BLE001 - a file pytorch_tokenizers cannot read
        raise BuildError(f"{opts.tokenizer}: not a tokenizer pytorch_tokenizers reads ({type(exc).__name__})") from None
    texts = opts.prompts or ["Once upon a time", "The quick brown fox jumps over the lazy dog"]
    prompts: list[list[int]] = []
    shown: list[str | None] = []
    for text in texts:
        ids = [int(t) for t in tok.encode(text, bos=1, eos=0)]
        if not ids or len(ids) + p.decode_steps > p.max_seq_len - 1:
            raise BuildError(f"prompt {text[:40]!r} is {len(ids)} tokens; with {p.decode_steps} decode steps it "
                             f"must fit in max_seq_len - 1 = {p.max_seq_len - 1}")
        if max(ids) >= vocab:
            raise BuildError(f"the tokenizer gives token {max(ids)}, past the model's vocab_size {vocab}")
        prompts.append(ids)
        try:
            shown.append(str(tok.decode(ids)))
        except Exception:  # noqa: BLE001 - a tokenizer without decode(list): the text as given
            shown.append(text)
    return prompts, shown, _file_digest(opts.tokenizer)


def reference_steps(eager: Any, prompts: list[list[int]], decode_steps: int) -> tuple[list[tuple[Any, Any, Any]], list[list[SequenceStep]]]:
    """Step the eager model through every prompt and its teacher-forced decode steps, in the order
    the bundle's cases run: (tokens, input_pos, logits) per case, and the steps of each sequence."""
    import torch

    for name, buf in eager.named_buffers():  # a fresh cache, as the runtime's (masked beyond start_pos)
        if name.endswith(("k_cache", "v_cache")):
            buf.zero_()
    cases: list[tuple[Any, Any, Any]] = []
    sequences: list[list[SequenceStep]] = []
    with torch.no_grad():
        for ids in prompts:
            steps: list[SequenceStep] = []
            feed, pos = list(ids), 0
            for k in range(decode_steps + 1):
                tokens = torch.tensor([feed], dtype=torch.long)
                input_pos = torch.tensor([pos], dtype=torch.long)
                out = eager(tokens, {"input_pos": input_pos})
                logits = (out[0] if isinstance(out, tuple) else out).float().reshape(1, -1)
                if not torch.isfinite(logits).all():
                    raise BuildError(f"the eager model's logits are not finite at position {pos} (weights?)")
                nxt = int(logits.argmax(-1))
                steps.append(SequenceStep(case=len(cases), kind="prompt" if k == 0 else "decode", start_pos=pos,
                                          tokens=list(feed), reference_next=nxt))
                cases.append((tokens, input_pos, logits.contiguous()))
                pos += len(feed)
                feed = [nxt]
            sequences.append(steps)
    return cases, sequences


# --------------------------------------------------------------------------- bundle


def build_llm_bundle(req: Any, say: Callable[[str], None]) -> Any:
    """BuildRequest (model `llm:ARCH`, `req.llm` LlmOptions) -> BuildResult; through the build cache."""
    from bundlerun.bundles.build_parts import BuildResult, _cache_key, _from_cache, side_files  # start-up: loads flatbuffers on use

    opts = req.llm or LlmOptions()
    backend = req.backend or "xnnpack"
    p = plan(req.model, req.dtype, opts, backend)
    req.dtype = p.dtype
    reference = "quantized" if p.dtype in SOURCE_QUANTIZED else "eager-fp32"
    key = _cache_key(req, backend, reference)
    etrecord = getattr(req, "etrecord", False)
    use_cache = req.cache and key is not None  # an ETRecord beside the output is cached with it (build_cache.py)
    discarded = None
    if use_cache and key is not None:
        hit = _from_cache(req, key, say)
        if not isinstance(hit, (str, type(None))):
            return hit
        discarded = hit

    # absolute: export_llama runs in a temporary working directory (a relative -o would land the ETRecord there)
    et_path = etrecord_path_for(Path(req.output).resolve()) if etrecord else None
    exported = export(p, opts, req.seed, say, et_path)
    prompts, shown, tokenizer_digest = _prompts(p, opts, req.seed)
    say(f"stepping the eager model through {len(prompts)} prompts x {p.decode_steps} decode steps")
    cases, steps = reference_steps(exported.eager, prompts, p.decode_steps)
    sequences = [SequenceSpec(f"seq{i}", "forward", True, "teacher-forced", s, shown[i]) for i, s in enumerate(steps)]
    manifest = _manifest(req, p, exported, cases, sequences, tokenizer_digest, backend, reference, key)
    if et_path is not None:
        manifest.build.etrecord = EtrecordInfo.from_dict(_etrecord_entry(et_path))
    from bundlerun.bundles.bpte import Bundle, BundledTestCase, MethodTestSuite, write_bundle  # start-up: loads flatbuffers on use
    from bundlerun.bundles.build_parts import _value_from_tensor  # start-up: loads flatbuffers on use

    test_cases = [BundledTestCase(inputs=[_value_from_tensor(t), _value_from_tensor(pos)],
                                  expected_outputs=[_value_from_tensor(logits)]) for t, pos, logits in cases]
    bundle = Bundle(program=exported.program, method_test_suites=[MethodTestSuite("forward", test_cases)],
                    manifest_json=manifest.to_dict())
    say(f"writing {req.output}")
    try:
        path = write_bundle(bundle, req.output)
    except OSError as exc:
        raise BuildError(f"cannot write {req.output}: {exc.strerror or exc}") from None
    info: dict[str, Any] = {"export_s": exported.export_s}
    if use_cache and key is not None:
        stored = build_cache.store(key, path, [Path(path).with_name(name) for name, _ in side_files(manifest)])
        info.update(cache="miss" if stored else "not stored", cache_key=key)
        if discarded:
            info["warnings"] = [discarded]
    return BuildResult(path=path, manifest=manifest, info=info)


def _manifest(req: Any, p: LlmPlan, exported: Exported, cases: list, sequences: list[SequenceSpec],
              tokenizer_digest: str | None, backend: str, reference: str, key: str | None) -> Any:
    from bundlerun.bundles.build_parts import _versions  # start-up: loads flatbuffers on use

    vocab = int(cases[0][2].shape[-1])
    ctx = ToleranceContext(backend=backend, target=req.target, dtype=tier(p.dtype), model=req.model, method="forward",
                           output_name="out0", output_dtype="float32", reference=reference,
                           input_distribution="tokens", host_arch=platform.machine(),
                           quantization=exported.quantization, reference_dtype="float32",
                           expected=np.stack([c[2].numpy() for c in cases]))
    criteria = resolve_criteria(ctx, req.overrides, req.registry)
    declared = (method_inputs(exported.program, "export_llama program") or {}).get("forward") or []
    dynamic = any(not d.static for d in declared)
    llm = {"arch": p.arch, "size": p.size, "params": p.params, "dtype": p.dtype,
           "quantization": exported.quantization, "max_seq_len": p.max_seq_len, "dynamic_shape": dynamic,
           "use_kv_cache": True, "weights": exported.weights, "tokenizer": tokenizer_digest,
           "export_s": round(exported.export_s, 3), "model_class": exported.model_class, "reference": REFERENCE}
    return Manifest(
        model=ModelInfo.from_dict({"id": req.model, "source": "executorch export_llama",
               "description": f"{p.arch} ({p.size}) through examples.models.llama.export_llama_lib._export_llama, "
                              f"{exported.weights} weights"}),
        build=BuildInfo.from_dict({"backend": backend, "target": req.target, "dtype": p.dtype, "quantization": exported.quantization,
               "reference": reference,
               "inputs": [{"shape": [1, p.max_seq_len - 1], "dtype": "int64", "distribution": "tokens"},
                          {"shape": [1], "dtype": "int64", "distribution": "input_pos"}],
               "seed": req.seed, "cases": len(cases), "lowering": {"delegate": backend, "exporter": "export_llama", **exported.lowering},
               "ops": sorted(program_operators(exported.program)), "overrides": dict(req.overrides),
               **({"cache_key": key} if key is not None else {}), "llm": llm}),
        versions=_versions(),
        # the inputs vary in length from case to case (prompt, then decode steps): the program declares
        # their bound, build.inputs and build.llm.max_seq_len say it; the per-case check is the program's
        methods={"forward": MethodManifest("forward", [], [OutputSpec("out0", st.name(st.code_from_torch(cases[0][2].dtype)),
                                                                       [1, vocab], criteria, False)])},
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        sequences=sequences,
    )
