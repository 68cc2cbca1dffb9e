"""Child process of the program-walking targets (tosa://, mlx://): walk the bundle's
program in Python (targets.program.walker) with the delegates of `--delegates`
(TOSA on the reference model, MLX on the mlx package), run the requested cases,
stream JSON events (protocol: targets/workers/supervisor.py). Inputs come from the
bundle itself. With `--serve` it is a warm worker: the delegates' libraries are
imported once and bundles are loaded on request (targets/workers/supervisor.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from pathlib import Path
from bundlerun.targets.workers.supervisor import serve


def _emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


# --delegates NAME -> (delegate runners, runtime description, distributions to record)
def _runners(name: str):
    if name == "tosa":
        from bundlerun.targets.program.tosa_delegate import delegate_runners  # start-up: loads numpy on use

        return delegate_runners(), "bundlerun pte walker + TOSA reference model", ("tosa-tools",)
    if name.startswith("mlx-"):
        from bundlerun.targets.program.mlx_delegate import delegate_runners  # start-up: loads numpy on use

        return delegate_runners(device=name[4:]), f"bundlerun pte walker + MLX ({name[4:]})", ("mlx",)
    raise ValueError(f"unknown delegate set {name!r}")


def _load(bundle_path: str, delegates: str = "tosa"):
    """Read the bundle and load the program; library chatter goes to stderr."""
    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers, numpy on use
    from bundlerun.targets.program.walker import ProgramWalker, load_program  # start-up: loads numpy on use

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # keep stdout for protocol lines only
    try:
        runners, runtime, dists = _runners(delegates)
        bundle = read_bundle(bundle_path)
        loaded = load_program(bundle.program)
        walker = ProgramWalker(loaded, runners)
    finally:
        sys.stdout = real_stdout
    return bundle, loaded, walker, runtime, dists


def _tool_versions(dists: tuple[str, ...]) -> dict[str, str]:
    from bundlerun.bundles.versions import package_versions  # late: looked up at call time (tests replace it)

    return package_versions((*dists, "executorch", "torch"))


def _run_bundle(bundle_path: str, out_dir: str, pairs: list, delegates: str = "tosa", t0: float | None = None,
                replay: int = 1) -> int:
    """Load one bundle, run `pairs`, emit its events (ready ... finished, or fatal)."""
    t0 = time.perf_counter() if t0 is None else t0
    try:
        bundle, loaded, walker, runtime, dists = _load(bundle_path, delegates)
        from bundlerun.targets.program.walker import WalkError  # optional: its failure to load is handled here
    except Exception as exc:  # noqa: BLE001 - reported as a classified load failure
        kind = getattr(exc, "kind", "load-failure")
        _emit(event="fatal", error=f"could not load the program: {getattr(exc, 'message', exc)}", kind=kind)
        return 1
    _emit(
        event="ready",
        load_s=time.perf_counter() - t0,
        info={"runtime": runtime, "delegates": loaded.delegate_ids, **_tool_versions(dists)},
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for method, case in pairs:
        _emit(event="start", method=method, case=case)
        try:
            test_case = bundle.suite(method).test_cases[case]
        except (KeyError, IndexError):
            _emit(event="error", method=method, case=case, error=f"bundle has no case {method}[{case}]", kind="bad-bundle")
            continue
        inputs = [v.to_array() if v.kind == "tensor" else v.scalar for v in test_case.inputs]
        start = time.perf_counter()
        try:
            outputs = walker.run(method, inputs)
        except WalkError as exc:
            _emit(event="error", method=method, case=case, error=exc.message, kind=exc.kind,
                  elapsed_s=time.perf_counter() - start)
            continue
        elapsed = time.perf_counter() - start
        records = []
        for j, (code, array) in enumerate(outputs):
            path = out_dir / f"{method}-{case}-{j}.bin"
            path.write_bytes(array.tobytes())
            records.append({"scalar_type": int(code), "shape": [int(s) for s in array.shape], "file": str(path)})
        replays = []  # --replay N: runs 2..N of the case in this walker (runner/judging/replay.py)
        try:
            for k in range(1, replay):
                again = []
                for j, (code, array) in enumerate(walker.run(method, inputs)):
                    path = out_dir / f"{method}-{case}-{j}-r{k}.bin"
                    path.write_bytes(array.tobytes())
                    again.append({"scalar_type": int(code), "shape": [int(s) for s in array.shape], "file": str(path)})
                replays.append(again)
        except WalkError as exc:
            _emit(event="error", method=method, case=case, error=f"replay run failed: {exc.message}", kind=exc.kind)
            continue
        _emit(event="done", method=method, case=case, elapsed_s=elapsed, outputs=records,
              **({"replays": replays} if replays else {}))
    _emit(event="finished")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", nargs="?")
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--cases")
    parser.add_argument("--delegates", default="tosa", help="tosa | mlx-cpu | mlx-gpu")
    parser.add_argument("--replay", type=int, default=1, help="runs per case whose outputs all come back")
    parser.add_argument("--serve", action="store_true",
                        help="warm worker: import the delegates once, then load bundles sent on stdin")
    args = parser.parse_args(argv)

    if args.serve:
        import gc

        t_import = time.perf_counter()
        real_stdout = sys.stdout
        sys.stdout = sys.stderr  # library chatter at import goes to the log
        try:
            warnings.filterwarnings("ignore")
            logging.disable(logging.WARNING)
            _runners(args.delegates)
            import bundlerun.targets.program.walker  # noqa: F401
        except Exception:  # noqa: BLE001 - reported per bundle by the load that needs it
            pass
        finally:
            sys.stdout = real_stdout
        pending = [t_import]

        def handle(cmd: dict) -> None:
            _run_bundle(str(cmd["bundle"]), str(cmd["out_dir"]), [tuple(p) for p in cmd.get("cases", [])],
                        args.delegates, pending.pop() if pending else None, args.replay)
            gc.collect()

        return serve(handle)
    if not (args.bundle and args.out_dir and args.cases):
        parser.error("BUNDLE OUT_DIR --cases FILE are required (or --serve)")
    return _run_bundle(args.bundle, args.out_dir, json.loads(Path(args.cases).read_text()), args.delegates,
                       replay=args.replay)


if __name__ == "__main__":
    from bundlerun.bundles.stack_room import call_with_stack_room  # python -m: no chunk thrash

    sys.exit(call_with_stack_room(main))
