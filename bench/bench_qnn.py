"""Whole `bundlerun run` of a 32-case QNN bundle on qnn://htp-sim vs a bare script that imports the
pybindings, loads the same bundle and runs the same cases on the HTP simulator (the same
LD_LIBRARY_PATH and empty QNN_SDK_ROOT). Both are fresh processes (start-up, imports and the QNN
context load included), alternated, best of N; the load average is printed with the figures.
Goal: ratio at most 1.3."""

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
import sys, torch
# the runtime extension portable_lib re-exports, imported directly as bundlerun's host worker does
# (portable_lib also imports all of executorch.exir: ~4 s that neither side needs)
from executorch.extension.pybindings import _C as p
buf = open(sys.argv[1], "rb").read()
bp = p._load_bundled_program_from_buffer(buf)
m = p._load_for_executorch_from_bundled_program(bp)
from bundlerun.bundles.bpte import parse_bundle
b = parse_bundle(buf)
outs = []
for case in b.suite("forward").test_cases:
    xs = [torch.frombuffer(bytearray(v.data), dtype=torch.float32).reshape(v.sizes) for v in case.inputs]
    outs.append(m.run_method("forward", xs)[0].numpy().copy())
print(len(outs))
'''


def timed(cmd: list[str], env: dict | None = None) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny-cnn")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from bundlerun.bundles.backends.qnn import INSTALL_COMMAND, simulator_dir, simulator_record

    if simulator_record() is None:
        raise SystemExit(f"the HTP simulator is not installed: {INSTALL_COMMAND}")
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    env = {**os.environ, "LD_LIBRARY_PATH": str(simulator_dir() / "lib"), "QNN_SDK_ROOT": ""}
    with tempfile.TemporaryDirectory() as tmp:
        bpte = Path(tmp) / "bench.bpte"
        subprocess.run([exe, "build", args.model, "--target", "qnn://htp-sim", "--dtype", args.dtype, "--cases",
                        str(args.cases), "-o", str(bpte)], check=True, capture_output=True)
        script = Path(tmp) / "bare.py"
        script.write_text(BARE)
        ours, bare, loads = [], [], []
        for i in range(args.repeat):
            loads.append(os.getloadavg()[0])
            bare.append(timed([sys.executable, str(script), str(bpte)], env))
            ours.append(timed([exe, "run", str(bpte), "--target", "qnn://htp-sim", "--quiet", "--no-history",
                               "--report", f"{tmp}/r{i}"]))
    print(f"{args.cases}-case {args.model} {args.dtype} bundle on the HTP simulator: bare pybindings script best "
          f"{min(bare):.2f} s, `bundlerun run` best {min(ours):.2f} s (runs: bare {[round(x, 2) for x in bare]}, "
          f"bundlerun {[round(x, 2) for x in ours]}; 1-minute load {[round(x, 1) for x in loads]})")
    ratio = min(ours) / min(bare)
    print(f"RATIO bundlerun/bare = {ratio:.2f} (goal <= 1.3)")
    return 0 if ratio <= 1.3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
