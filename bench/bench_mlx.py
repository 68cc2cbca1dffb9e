"""Whole `bundlerun run` of a 32-case MLX bundle on mlx://cpu (ExecuTorch's C++ MLX delegate in
the cached executor_runner of firmware_scripts/mlx/build_mlx_runner.sh) vs the bare runtime doing
the same work: that runner called in a shell loop, once per case, on the same one-case bundles
(the runner checks case 0 only), writing the same output files. The one-case bundles for the bare
loop are written before it is timed; bundlerun writes its own inside the timed run.

bundlerun's default runs the bundle's cases on one runner in --server_mode (targets/et_runner/server.py).
Both sides are fresh processes, alternated, best of N, in one run of this script. Also printed:
the same `bundlerun run` with `server=false` (a process per case, as the bare loop), and with
`runtime=interpreter` (bundlerun's Python MLX interpreter), for the cost of the C++ lane against the
lane it replaces. Goal: bundlerun/bare at most 1.3.

    .venv/bin/python bench/bench_mlx.py [--model tiny-cnn] [--cases 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE = r'''
set -e
runner="$1"; dir="$2"
for b in "$dir"/case-*.bpte; do
  n="$(basename "$b" .bpte)"
  mkdir -p "$dir/$n/out"
  (cd "$dir/$n" && "$runner" --model_path "$b" --method_name forward --bundleio_rtol 0.01 --bundleio_atol 0.01 \
     --num_executions 1 --output_file out/output --print_output none > runner.log 2>&1 || [ $? -eq 1 ])
done
'''


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed ({proc.returncode}): {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-cnn")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from bundlerun.bundles.bpte import read_bundle, write_bundle
    from bundlerun.targets.mlx_runner import BUILD_COMMAND, default_runner

    runner = default_runner()
    if runner is None:
        raise SystemExit(f"no MLX executor_runner in the runner cache; {BUILD_COMMAND}")
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    with tempfile.TemporaryDirectory(prefix="bench-mlx-") as tmp:
        bpte = Path(tmp) / "bench.bpte"
        subprocess.run([exe, "build", args.model, "--backend", "mlx", "--target", "mlx://cpu", "--dtype", args.dtype,
                        "--cases", str(args.cases), "-o", str(bpte)], check=True, capture_output=True)
        bundle = read_bundle(bpte)
        cases = Path(tmp) / "bare"
        cases.mkdir()
        for i in range(args.cases):
            write_bundle(bundle.single_case("forward", i), cases / f"case-{i:03d}.bpte")
        script = Path(tmp) / "bare.sh"
        script.write_text(BARE)
        ours, bare, interp, one, alone = [], [], [], [], []
        for i in range(args.repeat):
            for d in cases.glob("case-*/"):
                shutil.rmtree(d)
            bare.append(timed(["bash", str(script), str(runner), str(cases)]))
            ours.append(timed([exe, "run", str(bpte), "--target", "mlx://cpu", "--quiet", "--no-history",
                               "--report", f"{tmp}/r{i}"]))
            alone.append(timed([exe, "run", str(bpte), "--target", "mlx://cpu?server=false", "--quiet", "--no-history",
                                "--report", f"{tmp}/a{i}"]))
            interp.append(timed([exe, "run", str(bpte), "--target", "mlx://cpu?runtime=interpreter", "--quiet",
                                 "--no-history", "--report", f"{tmp}/i{i}"]))
            one.append(timed([exe, "run", str(bpte), "--target", "mlx://cpu", "--select", "0", "--quiet",
                              "--no-history", "--report", f"{tmp}/o{i}"]))
    load = os.getloadavg()[0]
    r = lambda xs: [round(x, 2) for x in xs]  # noqa: E731
    print(f"{args.cases}-case {args.model} {args.dtype} MLX bundle, runner {runner.parent.name}, load {load:.1f}")
    print(f"  bare runner shell loop  best {min(bare):.2f} s  {r(bare)}  ({min(bare) / args.cases * 1000:.0f} ms/case)")
    print(f"  bundlerun run mlx://cpu best {min(ours):.2f} s  {r(ours)}")
    print(f"  bundlerun run mlx://cpu?server=false (a process per case) best {min(alone):.2f} s  {r(alone)}  "
          f"RATIO {min(alone) / min(bare):.2f}")
    print(f"  bundlerun run mlx://cpu?runtime=interpreter best {min(interp):.2f} s  {r(interp)}")
    per_case = (min(ours) - min(one)) / (args.cases - 1)
    print(f"  bundlerun run mlx://cpu --select 0 (the fixed cost: CLI start-up, bundle read, judging, report) best "
          f"{min(one):.2f} s  {r(one)}")
    print(f"  per case: bundlerun {per_case * 1000:.0f} ms (from the 32- and 1-case runs) vs bare "
          f"{min(bare) / args.cases * 1000:.0f} ms: marginal RATIO {per_case / (min(bare) / args.cases):.2f}")
    ratio = min(ours) / min(bare)
    print(f"RATIO bundlerun/bare = {ratio:.2f} (goal <= 1.3); interpreter/C++ lane = {min(interp) / min(ours):.2f}")
    return 0 if ratio <= 1.3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
