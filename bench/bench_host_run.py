"""Whole `bundlerun run` of a 64-case bundle on host://xnnpack vs a bare script that
imports the pybindings, loads the same bundle and runs the same cases. Both are
fresh processes (start-up and imports included), alternated, best of N.
Goal: ratio at most 1.3."""

from __future__ import annotations

import argparse
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


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if proc.returncode not in (0,):
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny-cnn")
    parser.add_argument("--cases", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    with tempfile.TemporaryDirectory() as tmp:
        bpte = Path(tmp) / "bench.bpte"
        subprocess.run([exe, "build", args.model, "--cases", str(args.cases), "-o", str(bpte)], check=True,
                       capture_output=True)
        script = Path(tmp) / "bare.py"
        script.write_text(BARE)
        ours, bare = [], []
        for i in range(args.repeat):
            bare.append(timed([sys.executable, str(script), str(bpte)]))
            ours.append(timed([exe, "run", str(bpte), "--quiet", "--no-history", "--report", f"{tmp}/r{i}"]))
    print(f"{args.cases}-case {args.model} bundle: bare pybindings script best {min(bare):.2f} s, "
          f"`bundlerun run` best {min(ours):.2f} s (runs: bare {[round(x, 2) for x in bare]}, bundlerun {[round(x, 2) for x in ours]})")
    ratio = min(ours) / min(bare)
    print(f"RATIO bundlerun/bare = {ratio:.2f} (goal <= 1.3)")
    return 0 if ratio <= 1.3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
