"""MLX recipe (Apple MLX delegate): MLXPartitioner in fp32, fp16 or bf16.

fp16/bf16 convert model and I/O to the half type, as ExecuTorch's MLX op tests
do (the delegate computes in the program's dtype). The executorch wheel for
Linux lacks MLX's generated serialization files: `bundles.mlx_codegen`
regenerates them once into a cache and overlays them before the import.
Constants go to the program's named data (not the delegate payload).
"""

from __future__ import annotations

import copy

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import export_model, graph_ops, lower_and_emit
from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.mlx_codegen import ensure_mlx_importable

DTYPES = ("fp32", "fp16", "bf16")


def _partitioner():
    files = ensure_mlx_importable()
    try:
        from executorch.backends.mlx import MLXPartitioner
    except ImportError as exc:
        raise BuildError(f"the MLX backend cannot be imported from this executorch build: {exc}") from None
    import logging

    # The MLX partitioner logs a per-node support table at INFO on its own handler (set up by the
    # import above): noise in a build log.
    logging.getLogger("executorch.backends.mlx").setLevel(logging.WARNING)
    return MLXPartitioner(), files


def lower(req: LoweringRequest) -> LoweringResult:
    import torch

    if req.dtype not in DTYPES:
        raise BuildError(f"dtype {req.dtype!r} is not supported by the mlx recipe ({', '.join(DTYPES)})")
    partitioner, files = _partitioner()
    model, examples = req.model, req.example_inputs
    if req.dtype != "fp32":
        half = torch.float16 if req.dtype == "fp16" else torch.bfloat16
        model = copy.deepcopy(model).to(half)
        examples = tuple(x.to(half) if x.is_floating_point() else x for x in examples)
    exported = export_model(model, examples)
    program, summary = lower_and_emit(exported, [partitioner])
    summary["partitioner"] = "MLXPartitioner"
    summary["mlx_generated_files"] = "executorch wheel" if files.in_wheel else str(files.root)
    if not summary.get("delegate_calls"):
        summary.setdefault("warnings", []).append("MLX delegated nothing; the program runs on portable kernels")
    return LoweringResult(program, [x.dtype for x in examples], ops=graph_ops(exported), info=summary)
