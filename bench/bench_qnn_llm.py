"""Whole `bundlerun run` of llm:llama3 tiny built with QNN's static llama (48 one-token steps, the KV
cache as program I/O) on qnn://htp-sim vs a bare script that imports the pybindings, loads the same
bundle and steps the same cases on the HTP simulator, threading the cache itself (each step's new K/V
written into the next step's cache inputs at its position, as build.llm.kv_io says). Both are fresh
processes (start-up, imports, the QNN context load included), alternated, best of N; the bare side
also prints its per-step median, and bundlerun's per step is the median `elapsed_s` of its report (the
worker's own `run_method` wall time); `bundlerun run --select 0` (one step: the command's fixed part) is
timed too. The load average is printed with the figures. Goal: ratio <= 1.3."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE = r'''
import json, statistics, sys, time, torch
from executorch.extension.pybindings import _C as p  # as bundlerun's host worker imports it
buf = open(sys.argv[1], "rb").read()
m = p._load_for_executorch_from_bundled_program(p._load_bundled_program_from_buffer(buf))
from bundlerun.bundles.bpte import parse_bundle
b = parse_bundle(buf)
links = b.manifest_json["build"]["llm"]["kv_io"]
cases = b.suite("forward").test_cases
dt = {3: torch.int32, 6: torch.float32}
times, state = [], None
for seq in b.manifest_json["sequences"]:
    for k, step in enumerate(seq["steps"]):
        xs = [torch.frombuffer(bytearray(v.data), dtype=dt[v.scalar_type]).reshape(v.sizes) for v in cases[step["case"]].inputs]
        if k == 0:
            state = {l["input"]: xs[l["input"]].clone() for l in links}
        else:
            for i, t in state.items():
                xs[i] = t
        t0 = time.perf_counter()
        outs = m.run_method("forward", xs)
        times.append(time.perf_counter() - t0)
        for l in links:
            idx = [slice(None)] * state[l["input"]].dim()
            idx[l["axis"]] = slice(step["start_pos"], step["start_pos"] + outs[l["output"]].shape[l["axis"]])
            state[l["input"]][tuple(idx)] = outs[l["output"]]
print(f"STEPS {len(times)} median_ms {statistics.median(times) * 1e3:.1f} first_ms {times[0] * 1e3:.1f}")
'''


def timed(cmd: list[str], env: dict | None = None, codes: tuple[int, ...] = (0,)) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if proc.returncode not in codes:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="llama3")
    parser.add_argument("--dtype", default="fp16", help="fp16 or 16a4w (QNN's quant recipe)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from bundlerun.bundles.backends.qnn import INSTALL_COMMAND, simulator_dir, simulator_record

    if simulator_record() is None:
        raise SystemExit(f"the HTP simulator is not installed: {INSTALL_COMMAND}")
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    env = {**os.environ, "LD_LIBRARY_PATH": str(simulator_dir() / "lib"), "QNN_SDK_ROOT": ""}
    with tempfile.TemporaryDirectory() as tmp:
        bpte = Path(tmp) / "bench.bpte"
        subprocess.run([exe, "build", f"llm:{args.arch}", "--size", "tiny", "--target", "qnn://htp-sim", "--backend",
                        "qnn", "--dtype", args.dtype, "-o", str(bpte)], check=True, capture_output=True)
        script = Path(tmp) / "bare.py"
        script.write_text(BARE)
        ours, bare, loads, steps, one, our_steps = [], [], [], "", [], []
        for i in range(args.repeat):
            loads.append(os.getloadavg()[0])
            seconds, said = timed([sys.executable, str(script), str(bpte)], env)
            bare.append(seconds)
            steps = (re.search(r"STEPS .*", said) or re.search(".*", said)).group(0)  # type: ignore[union-attr]
            ours.append(timed([exe, "run", str(bpte), "--target", "qnn://htp-sim", "--quiet", "--no-history",
                               "--report", f"{tmp}/r{i}"])[0])
            report = json.loads((Path(tmp) / f"r{i}" / "report.json").read_text())
            our_steps += [float(c["elapsed_s"]) for c in report["cases"] if c.get("elapsed_s") is not None]
            # one step: the other steps are not run and their sequences are ERROR, so exit 2 is expected
            one.append(timed([exe, "run", str(bpte), "--target", "qnn://htp-sim", "--select", "0", "--quiet",
                              "--no-history", "--report", f"{tmp}/o{i}"], codes=(0, 1, 2))[0])
    print(f"llm:{args.arch} tiny {args.dtype} (QNN static llama) on the HTP simulator: bare pybindings loop best "
          f"{min(bare):.2f} s ({steps}), `bundlerun run` best {min(ours):.2f} s (runs: bare "
          f"{[round(x, 2) for x in bare]}, bundlerun {[round(x, 2) for x in ours]}; 1-minute load "
          f"{[round(x, 1) for x in loads]})")
    print(f"bundlerun's step (median elapsed_s over all runs): {statistics.median(our_steps) * 1e3:.1f} ms; "
          f"`bundlerun run --select 0` (the fixed part) best {min(one):.2f} s")
    ratio = min(ours) / min(bare)
    print(f"RATIO bundlerun/bare = {ratio:.2f} (goal <= 1.3)")
    return 0 if ratio <= 1.3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
