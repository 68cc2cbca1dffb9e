"""`bundlerun run` of an LLM bundle whose sequences are 64 steps (prompt + 63 teacher-forced decode steps)
on host://xnnpack vs the same program stepped by a bare pybindings loop (LLM custom ops registered first,
one loaded method, the cases in order), side by side in one run: both fresh processes, alternated, best of N.
Goal (issue 35 item 6): ratio at most 1.3. Also prints the export time and bundle size the build recorded
and the bare loop's per-token time (tokens fed / loop seconds, in process).

    .venv/bin/python bench/bench_llm_sequence.py [--size tiny|small] [--dtype fp32|8da4w] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE = r'''
import sys, time, torch
import executorch.extension.llm.custom_ops.custom_ops  # llama::update_cache, llama::custom_sdpa
try:
    import executorch.kernels.quantized  # quantized_decomposed:: for 8da4w
except Exception:
    pass
from executorch.extension.pybindings import _C as p
from bundlerun.bundles.bpte import parse_bundle
b = parse_bundle(open(sys.argv[1], "rb").read())
m = p._load_for_executorch_from_buffer(b.program)
cases = [[torch.from_numpy(v.to_array().copy()) for v in c.inputs] for c in b.suite("forward").test_cases]
tokens = sum(int(c[0].numel()) for c in cases)
t = time.perf_counter()
for xs in cases:
    m.run_method("forward", xs)[0].numpy().copy()
loop = time.perf_counter() - t
print(f"{len(cases)} {tokens} {loop}")
'''


def timed(cmd: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="tiny", choices=("tiny", "small"))
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--steps", type=int, default=64, help="steps per sequence (prompt + decode steps)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="keep the bundle here")
    args = parser.parse_args()
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    with tempfile.TemporaryDirectory() as tmp:
        bpte = args.keep or Path(tmp) / "llm.bpte"
        build = [exe, "build", "llm:llama3", "--size", args.size, "--dtype", args.dtype, "--decode-steps",
                 str(args.steps - 1), "--max-seq-len", "128" if args.size == "tiny" else "256", "-o", str(bpte)]
        t = time.perf_counter()
        subprocess.run(build, check=True, capture_output=True)
        build_s = time.perf_counter() - t
        from bundlerun.bundles.bpte import read_bundle

        manifest = read_bundle(bpte).manifest
        llm = manifest.build["llm"]
        cases = manifest.build["cases"]
        script = Path(tmp) / "bare.py"
        script.write_text(BARE)
        ours, bare, loops = [], [], []
        for i in range(args.repeat):
            elapsed, out = timed([sys.executable, str(script), str(bpte)])
            bare.append(elapsed)
            n, tokens, loop = out.split()
            loops.append(float(loop))
            ours.append(timed([exe, "run", str(bpte), "--target", "host://xnnpack", "--quiet", "--no-history",
                               "--report", f"{tmp}/r{i}"])[0])
        report = json.loads((Path(tmp) / "r0" / "report.json").read_text())
        verdict = report.get("verdict") or report.get("summary", {}).get("verdict")
    size = bpte.stat().st_size if args.keep else None
    print(f"llm:llama3 {args.size} {args.dtype}: {len(manifest.sequences)} sequences x {args.steps} steps = {cases} "
          f"cases, {tokens} tokens fed; export_llama {llm['export_s']:.1f} s (build command {build_s:.1f} s"
          f"{', cache hit' if build_s < llm['export_s'] else ''})" + (f", bundle {size} bytes" if size else ""))
    print(f"bare pybindings loop: best {min(bare):.2f} s per process, loop {min(loops):.3f} s = "
          f"{1e3 * min(loops) / cases:.2f} ms per step, {1e3 * min(loops) / int(tokens):.2f} ms per token")
    print(f"bundlerun run: best {min(ours):.2f} s per process (verdict {verdict}); ratio {min(ours) / min(bare):.2f}x "
          f"(goal <= 1.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
