"""Child process of `bundlerun debug`: run one case of a bundle with every intermediate output.

    python -m bundlerun.targets.workers.debug host|tosa|mlx BUNDLE METHOD CASE WORK_DIR
        [--debug-buffer-mb N] [--device cpu|gpu]

host: the program in the real ExecuTorch runtime (pybindings) loaded with ETDump and
a debug buffer; after the run the ETDump and the buffer are written to WORK_DIR, and the
parent reads them with ExecuTorch's Inspector (targets/intermediates.py run_worker) and
maps instructions to the eager graph through the ETRecord: this child loads only the runtime. tosa: the program walker with an observer (targets/intermediates.py
`walker_observer`), the TOSA delegate recording every operator's outputs. mlx: the
same walker with the MLX delegate (on --device) recording every instruction's outputs.
Writes WORK_DIR/intermediates.{json,npz}; a failure is {"error": ...} in the JSON.
A crash kills only this process (the parent reports it).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from bundlerun.targets.workers.host import _quiet_imports, _register_kernels
from bundlerun.targets.workers.program import _load

def _inputs(bundle, method: str, case: int) -> list:
    test_case = bundle.suite(method).test_cases[case]
    return [v.to_array() if v.kind == "tensor" else v.scalar for v in test_case.inputs]


def _run_host(bundle_path: str, method: str, case: int, work: Path, buffer_mb: int,
              prefix: tuple[int, ...] = ()) -> tuple[dict, list, list]:
    import numpy as np

    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers, numpy on use
    from bundlerun.targets.program.walker import numpy_to_tensor, tensor_to_numpy  # start-up: loads numpy on use

    bundle = read_bundle(bundle_path)
    torch, portable_lib = _quiet_imports()
    _register_kernels(bundle.program)  # llama:: custom ops, quantized kernels: as the run's worker
    module = portable_lib._load_for_executorch_from_buffer(bundle.program, enable_etdump=True,
                                                           debug_buffer_size=buffer_mb << 20)

    def inputs(k: int) -> list:
        return [numpy_to_tensor(a, v.scalar_type) if v.kind == "tensor" else a
                for a, v in zip(_inputs(bundle, method, k), bundle.suite(method).test_cases[k].inputs)]

    for k in prefix:  # a stateful sequence's earlier steps, in order, on this one loaded method
        module.run_method(method, inputs(k))
    outputs = module.run_method(method, inputs(case))
    etdump, buffer = work / "case.etdump", work / "case.debug"
    module.write_etdump_result_to_file(str(etdump), str(buffer))
    # Read by the parent (targets/intermediates.py run_worker), which loads ExecuTorch's devtools for the
    # ETRecord anyway: this process then needs only the runtime, not executorch.exir (~4 s of CPU at import)
    notes = [f"replayed {len(prefix)} earlier step(s) of the sequence (cases {', '.join(map(str, prefix))}) on "
             f"the same loaded method before case {case}"] if prefix else []
    meta = {"runtime": "executorch pybindings (ETDump + debug buffer)", "notes": notes,
            "etdump": {"file": etdump.name, "debug_buffer": buffer.name, "replayed": len(prefix),
                       "buffer_size": f"{buffer_mb} MiB", "hint": "rerun with a larger --debug-buffer-mb"}}
    outs = [tensor_to_numpy(o) if isinstance(o, torch.Tensor) else np.asarray(o) for o in outputs]
    return meta, [], outs


def _run_walker(bundle_path: str, method: str, case: int, delegates: str) -> tuple[dict, list, list]:
    from bundlerun.targets.intermediates import walker_observer  # start-up: loads numpy on use

    bundle, loaded, walker, runtime, _dists = _load(bundle_path, delegates)
    items: list = []
    walker.observer = walker_observer(walker, items)
    outputs = walker.run(method, _inputs(bundle, method, case))
    notes = []
    ops = sum(1 for i in items if i.kind == "delegate-op")
    calls = sum(1 for i in items if i.kind == "delegate")
    if calls and not ops:
        notes.append(f"{calls} delegate call(s) returned no per-operator outputs: each is one row")
    return {"runtime": runtime, "notes": notes}, items, [a for _code, a in outputs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("host", "tosa", "mlx"))
    parser.add_argument("bundle")
    parser.add_argument("method")
    parser.add_argument("case", type=int)
    parser.add_argument("work_dir")
    parser.add_argument("--debug-buffer-mb", type=int, default=64)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="mlx: the MLX device")
    parser.add_argument("--prefix", default="", help="host: cases run first on the same method (comma-separated)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    from bundlerun.targets.intermediates import save  # start-up: loads numpy on use

    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # library chatter goes to the log
    try:
        if args.mode == "host":
            prefix = tuple(int(c) for c in args.prefix.split(",") if c)
            meta, items, outs = _run_host(args.bundle, args.method, args.case, work, args.debug_buffer_mb, prefix)
        elif args.mode == "tosa":
            meta, items, outs = _run_walker(args.bundle, args.method, args.case, "tosa")
        else:
            meta, items, outs = _run_walker(args.bundle, args.method, args.case, f"mlx-{args.device}")
    except Exception as exc:  # noqa: BLE001 - reported by the parent in one line
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        (work / "intermediates.json").write_text(json.dumps({"error": str(message).splitlines()[0]}))
        return 0
    finally:
        sys.stdout = real_stdout
    save(work, meta, items, outs)
    return 0


if __name__ == "__main__":
    from bundlerun.bundles.stack_room import call_with_stack_room  # python -m: no chunk thrash

    sys.exit(call_with_stack_room(main))
