"""Child process of the host target: load the bundle once in the real ExecuTorch
runtime (pybindings), run the requested cases, stream JSON events (see
targets/workers/supervisor.py). Inputs come from the bundle itself. With `--serve` it is
a warm worker: the runtime is imported once and bundles are loaded on request.

`BUNDLERUN_FAULT=crash@forward:2` / `hang@forward:2` makes the child die with
SIGSEGV / stop responding before that case: the supervisor's handling of a real
process crash is exercised by the tests through this switch. `pause@forward:2` waits before
that case until the file `$BUNDLERUN_FAULT_RELEASE` exists (tests/test_history_postgres.py stops
the history's server while a run is in progress).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from bundlerun.bundles.fileio import named
from bundlerun.bundles.program_meta import program_operators
from bundlerun.targets.workers.supervisor import serve


def _emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _fault(method: str, case: int) -> None:
    spec = os.environ.get("BUNDLERUN_FAULT", "")
    for item in filter(None, spec.split(";")):
        kind, _, where = item.partition("@")
        if where == f"{method}:{case}":
            if kind == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            if kind == "hang":
                print(f"BUNDLERUN_FAULT: hanging before {where}", file=sys.stderr, flush=True)
                while True:
                    time.sleep(3600)
            if kind == "pause":  # until $BUNDLERUN_FAULT_RELEASE exists (at most 600 s): the world changes mid-run
                print(f"BUNDLERUN_FAULT: pausing before {where}", file=sys.stderr, flush=True)
                release, deadline = os.environ.get("BUNDLERUN_FAULT_RELEASE", ""), time.monotonic() + 600
                while release and not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.05)


def _openvino_lib_path() -> None:
    """What portable_lib.py does before loading the extension (executorch 1.5.1): point the OpenVINO
    backend's dlopen("libopenvino_c.so") at a pip-installed openvino, when there is one."""
    import glob
    import importlib.util

    if os.environ.get("OPENVINO_LIB_PATH"):
        return
    try:
        spec = importlib.util.find_spec("openvino")
    except (ImportError, ValueError):
        return
    if spec is not None and spec.submodule_search_locations:
        libs = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "libs", "libopenvino_c.so*")))
        if libs:
            os.environ["OPENVINO_LIB_PATH"] = libs[0]


def _pybindings():
    """ExecuTorch's runtime extension `executorch.extension.pybindings._C`, loaded as
    portable_lib.py loads it (torch first, for the libraries it links) and returned as is:
    portable_lib only re-exports `_C`'s names, but it also imports `executorch.exir` (for one
    warning class), which costs ~4 s of every worker's start on a 2-core machine (6.8 s -> 2.4 s
    measured with the 1.5.1 wheel). Falls back to portable_lib if `_C` cannot be imported by name."""
    import torch  # noqa: F401  (loads libtorch*.so, which _C links)

    _openvino_lib_path()
    try:
        from executorch.extension.pybindings import _C
    except ImportError:
        from executorch.extension.pybindings import portable_lib as _C
    return _C


def _quiet_imports():
    """The pybindings import torch/torchao, which print warnings to stdout/stderr."""
    import logging

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # keep stdout for protocol lines only
    try:
        import torch

        portable_lib = _pybindings()
        try:  # quantized_decomposed::* out-variants for programs with undelegated (de)quantize
            import executorch.kernels.quantized  # noqa: F401
        except ImportError:
            pass
    finally:
        sys.stdout = real_stdout
    return torch, portable_lib


# Kernel libraries the pybindings register only when imported (executorch 1.5.1): the LLM custom ops
# (llama::custom_sdpa, llama::update_cache: export_llama keeps the KV cache in them) and the quantized
# kernels (quantized_decomposed::*). Imported only for a program that calls them: the custom ops cost
# start-up time every other bundle would pay for nothing.
KERNEL_LIBRARIES = (("llama::", "executorch.extension.llm.custom_ops.custom_ops"),
                    ("quantized_decomposed::", "executorch.kernels.quantized"))


def _register_kernels(program: bytes) -> list[str]:
    """Import the kernel libraries `program` calls operators of; the modules imported."""
    import importlib

    ops = program_operators(program)
    loaded = []
    for prefix, module in KERNEL_LIBRARIES:
        if any(op.startswith(prefix) for op in ops):
            real_stdout = sys.stdout
            sys.stdout = sys.stderr  # keep stdout for protocol lines only
            try:
                importlib.import_module(module)
            finally:
                sys.stdout = real_stdout
            loaded.append(module)
    return loaded


def _layout_mismatch(module, suite, code_of) -> dict[int, str]:
    """Cases whose expected outputs disagree with the program's declared outputs:
    the bundle itself is inconsistent (bad input), not the runtime's numerics."""
    meta = module.method_meta(suite.method_name)
    declared = []
    for j in range(meta.num_outputs()):
        try:
            info = meta.output_tensor_meta(j)
            declared.append((list(info.sizes()), int(info.dtype())))
        except Exception:
            declared.append(None)  # non-tensor output
    problems: dict[int, str] = {}
    for i, case in enumerate(suite.test_cases):
        outs = case.expected_outputs
        if len(outs) != len(declared):
            problems[i] = f"bundle expects {len(outs)} outputs, the program declares {len(declared)}"
            continue
        for j, (value, decl) in enumerate(zip(outs, declared)):
            if decl is None or value.kind != "tensor":
                continue
            sizes = list(value.sizes)  # a dynamic output is declared at its upper bound: smaller fits
            if len(sizes) != len(decl[0]) or any(s > b for s, b in zip(sizes, decl[0])):
                problems[i] = (f"bundle's expected output {j} has shape {sizes} but the program's "
                               f"output {j} has shape {decl[0]} (inconsistent bundle)")
                break
    return problems


def _run_bundle(bundle_path: str, out_dir: str, pairs: list, threads: int = 0, t0: float | None = None,
                repeat: int = 1, replay: int = 1) -> int:
    """Load one bundle in the runtime, run `pairs`, emit its events (ready ... finished, or fatal).
    Everything of this bundle is dropped on return: a warm worker's next bundle starts clean."""
    from bundlerun.bundles.bpte import parse_bundle  # start-up: loads flatbuffers, numpy on use
    from bundlerun.bundles.scalar_types import BFLOAT16  # start-up: loads numpy on use

    t0 = time.perf_counter() if t0 is None else t0
    try:
        buf = Path(bundle_path).read_bytes()
        bundle = parse_bundle(memoryview(buf), bundle_path)  # views of `buf`, which the runtime keeps: no second copy
        torch, portable_lib = _quiet_imports()
        kernels = _register_kernels(bundle.program)
        bundled = portable_lib._load_bundled_program_from_buffer(buf)
        module = portable_lib._load_for_executorch_from_bundled_program(bundled)
        from bundlerun.bundles import scalar_types as st  # optional: its failure to load is handled here

        code_of = {st.torch_dtype(c): c for c in (0, 1, 2, 3, 4, 5, 6, 7, 11, BFLOAT16)}
        torch_of = {v: k for k, v in code_of.items()}
        methods = set(module.method_names())  # the runtime parses the program lazily: part of the load
        mismatch = {suite.method_name: _layout_mismatch(module, suite, code_of) for suite in bundle.method_test_suites
                    if suite.method_name in methods}
        from bundlerun.targets.workers.io_state import IoStateError, IoThreader  # optional: its failure to load is handled here

        threader = IoThreader.from_manifest(bundle.manifest_json)  # state "io": the KV cache threaded here
    except Exception as exc:  # reported as a classified load failure
        _emit(event="fatal", error=f"runtime could not load the bundle: {type(exc).__name__}: {exc}", kind="load-failure")
        return 1
    if threads:
        try:
            portable_lib._unsafe_reset_threadpool(threads)
        except Exception:
            pass
    _emit(event="ready", load_s=time.perf_counter() - t0, info={"backends": portable_lib._get_registered_backend_names(),
                                                                **({"kernel_libraries": kernels} if kernels else {})})

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    timed: set[str] = set()  # --repeat: methods whose first (cold) execution was reported
    for method, case in pairs:
        _emit(event="start", method=method, case=case)
        if method not in methods:
            _emit(event="error", method=method, case=case, error=f"program has no method {method!r}", kind="bad-bundle")
            continue
        if mismatch.get(method, {}).get(case):
            _emit(event="error", method=method, case=case, error=mismatch[method][case], kind="bad-bundle")
            continue
        test_case = bundle.suite(method).test_cases[case]
        inputs = []
        for value in test_case.inputs:
            if value.kind == "tensor":
                t = torch.frombuffer(bytearray(value.data), dtype=torch_of[value.scalar_type]) if value.data else torch.empty(0, dtype=torch_of[value.scalar_type])
                order = list(value.dim_order)
                if order and order != list(range(len(order))) and len(order) == len(value.sizes):
                    # stored in its dim order (bundles/bpte.py from_array): the logical view over those
                    # bytes, with that order's strides; the pybindings take a contiguous or channels-last
                    # tensor's storage as it is (extension/pybindings/pybindings.cpp:800-807)
                    inputs.append(t.reshape(value.physical_sizes).permute(*[order.index(d) for d in range(len(order))]))
                else:
                    inputs.append(t.reshape(value.sizes))
            else:
                inputs.append(value.scalar)
        state_from = None
        if threader is not None:
            try:
                inputs, state_from = _threaded_inputs(threader, method, case, inputs, torch)
            except IoStateError as exc:
                _emit(event="error", method=method, case=case, error=str(exc), kind="not-run")
                continue
        _fault(method, case)
        start = time.perf_counter()
        try:
            outputs = module.run_method(method, inputs)
        except Exception as exc:
            if threader is not None:
                threader.forget()
            _emit(event="error", method=method, case=case, error=f"method execution failed: {exc}", kind="runner-error",
                  elapsed_s=time.perf_counter() - start)
            continue
        elapsed = time.perf_counter() - start
        if threader is not None:
            try:
                threader.after(method, case, [o.detach().contiguous().numpy() if isinstance(o, torch.Tensor) else o
                                              for o in outputs])
            except IoStateError as exc:
                threader.forget()
                _emit(event="error", method=method, case=case, error=str(exc), kind="runner-error")
                continue
        records = []
        for j, out in enumerate(outputs):
            if not isinstance(out, torch.Tensor):
                out = torch.tensor(out)
            out = out.contiguous()
            code = code_of.get(out.dtype)
            if code is None:
                _emit(event="error", method=method, case=case, error=f"output {j} has unsupported dtype {out.dtype}", kind="runner-error")
                break
            data = (out.view(torch.int16) if out.dtype == torch.bfloat16 else out).numpy().tobytes()
            path = out_dir / f"{method}-{case}-{j}.bin"
            try:
                path.write_bytes(data)
            except OSError as exc:  # a full disk: the supervisor says which file (host-io)
                raise named(exc, path) from None
            records.append({"scalar_type": code, "shape": list(out.shape), "file": str(path)})
        else:
            try:  # --replay N: the same case N-1 more times in this process (runner/judging/replay.py)
                replays = _replay_runs(module, method, case, inputs, out_dir, replay, code_of, torch)
            except Exception as exc:
                _emit(event="error", method=method, case=case, error=f"replay execution failed: {exc}", kind="runner-error")
                continue
            _emit(event="done", method=method, case=case, elapsed_s=elapsed, outputs=records,
                  **({"replays": replays} if replays else {}),
                  **({"extra": {"kv_state_from_case": state_from}} if state_from is not None else {}),
                  **({"perf": _repeat_figures(module, method, inputs, elapsed, repeat, method not in timed)}
                     if repeat > 1 else {}))
            timed.add(method)
    _emit(event="finished")
    return 0


def _threaded_inputs(threader, method: str, case: int, inputs: list, torch) -> tuple[list, int | None]:
    """The case's inputs with its KV cache inputs replaced by the state the previous step of its
    sequence left (targets/workers/io_state.py), and the case that left it."""
    fed, state_from = threader.inputs_for(method, case, inputs)
    if state_from is None:
        return inputs, None
    return [torch.from_numpy(v) if not isinstance(v, torch.Tensor) and hasattr(v, "dtype") else v for v in fed], state_from


def _replay_runs(module, method: str, case: int, inputs: list, out_dir: Path, replay: int, code_of: dict,
                 torch) -> list[list[dict]]:
    """--replay N: runs 2..N of the case in this loaded program, each output written as run 1's are."""
    runs = []
    for k in range(1, replay):
        records = []
        for j, out in enumerate(module.run_method(method, inputs)):
            out = (out if isinstance(out, torch.Tensor) else torch.tensor(out)).contiguous()
            path = out_dir / f"{method}-{case}-{j}-r{k}.bin"
            path.write_bytes((out.view(torch.int16) if out.dtype == torch.bfloat16 else out).numpy().tobytes())
            records.append({"scalar_type": code_of.get(out.dtype), "shape": list(out.shape), "file": str(path)})
        runs.append(records)
    return runs


def _repeat_figures(module, method: str, inputs: list, elapsed: float, repeat: int, first: bool) -> list[dict]:
    """--repeat N: N more timed executions of the case after the one that produced its outputs
    (the warm-up, excluded); the warm figure is their median with the samples."""
    from statistics import median

    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        module.run_method(method, inputs)
        samples.append(time.perf_counter() - start)
    src = "host worker: wall time of the program's run_method (--repeat)"
    figs = [{"name": "execution_wall_time", "value": median(samples), "unit": "s", "kind": "host-wall", "source": src,
             "phase": "warm", "samples": samples,
             "note": f"median of {repeat} executions after the case's warm-up execution (excluded)"}]
    if first:  # the method's first execution in this process: cold
        figs.append({"name": "execution_wall_time", "value": elapsed, "unit": "s", "kind": "host-wall", "source": src,
                     "phase": "first"})
    return figs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", nargs="?")
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--cases")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="timed executions per case after its first")
    parser.add_argument("--replay", type=int, default=1, help="runs per case whose outputs all come back")
    parser.add_argument("--serve", action="store_true",
                        help="warm worker: import the runtime once, then load bundles sent on stdin")
    args = parser.parse_args(argv)

    if args.serve:
        t_import = time.perf_counter()
        try:
            _quiet_imports()  # the expensive part, paid once for every bundle of the command
        except Exception:
            pass  # reported per bundle by the load that needs it
        pending = [t_import]  # the first bundle's setup time includes the import it waited for

        def handle(cmd: dict) -> None:
            _run_bundle(str(cmd["bundle"]), str(cmd["out_dir"]), [tuple(p) for p in cmd.get("cases", [])],
                        args.threads, pending.pop() if pending else None, args.repeat, args.replay)
            gc.collect()

        return serve(handle)
    if not (args.bundle and args.out_dir and args.cases):
        parser.error("BUNDLE OUT_DIR --cases FILE are required (or --serve)")
    return _run_bundle(args.bundle, args.out_dir, json.loads(Path(args.cases).read_text()), args.threads,
                       repeat=args.repeat, replay=args.replay)


if __name__ == "__main__":
    from bundlerun.bundles.stack_room import call_with_stack_room  # python -m: no chunk thrash

    sys.exit(call_with_stack_room(main))
