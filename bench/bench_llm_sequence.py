"""`bundlerun run` of an LLM bundle whose sequences are 64 steps (prompt + 63 teacher-forced decode steps)
vs the same program stepped by a bare loop, per lane, side by side in one run: both fresh processes,
alternated, best of N.

- host://xnnpack: the bare loop is a pybindings script (LLM custom ops registered first, one loaded
  method, the cases in order), run with the frame-stack room bundlerun's worker has
  (bundles/stack_room.py: without it a script's imports can cost seconds at an unlucky depth);
- qemu-user://aarch64 (`--lanes host,qemu-user`): the bare loop is the aarch64 executor_runner that
  bundlerun uses, under qemu-aarch64 in `--server_mode` with the whole .bpte and bundlerun's flags
  (`--print_output none`: the runner's default prints 200 elements of every output), one trigger line
  per case index (bundlerun's own runner patch: each trigger loads that bundled case), reading nothing
  back - what the lane does minus bundlerun (its CLI, reading the outputs, judging, the report).

Also printed per lane: the ratio of medians, bundlerun's fixed part (best minus best) and PER STEP, the
median step as bundlerun's report times it (elapsed_s) against the bare loop's median step.

Goal (issue 35 item 6): ratio at most 1.3. Also prints the export time and bundle size the build recorded
and the bare loop's per-token time (tokens fed / loop seconds, in process).

    .venv/bin/python bench/bench_llm_sequence.py [--size tiny|small] [--dtype fp32|8da4w] [--repeat 3]
        [--keep llm.bpte | --bundle llm.bpte]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE = r'''
import sys, time


def bare():
    import torch
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
    steps = []
    for xs in cases:
        s = time.perf_counter()
        m.run_method("forward", xs)[0].numpy().copy()
        steps.append(time.perf_counter() - s)
    loop = time.perf_counter() - t
    print(f"{len(cases)} {tokens} {sorted(steps)[len(steps) // 2]} {loop}")


# with the frame-stack room bundlerun's worker has (bundles/stack_room.py): a script's imports can
# thrash CPython 3.11's frame chunks at its depth, which would flatter bundlerun's ratio
from bundlerun.bundles.stack_room import call_with_stack_room
call_with_stack_room(bare)
'''


BARE_QEMU = r'''
import subprocess, sys, time
qemu, runner, bundle, cases = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
argv = [qemu, "-cpu", "max", runner, "--model_path", bundle, "--method_name", "forward", "--output_file",
        "out/output", "--print_output", "none", "--cpu_threads", "1", "--server_mode"]
proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
t = time.perf_counter()
done, steps = 0, []
for i in range(cases):
    s = time.perf_counter()
    proc.stdin.write(f"{i}\n".encode()); proc.stdin.flush()
    for line in proc.stdout:
        if b"SERVER MODE DONE" in line:
            done += 1
            break
    steps.append(time.perf_counter() - s)
loop = time.perf_counter() - t
proc.stdin.close(); proc.wait()
print(f"{done} {sorted(steps[1:])[len(steps[1:]) // 2]} {loop}")
'''


def timed(cmd: list[str], cwd: str | None = None) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
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
    parser.add_argument("--bundle", type=Path, default=None,
                        help="a bundle this bench built before (--keep): used as it is, not built again")
    parser.add_argument("--lanes", default="host", help="host, qemu-user or host,qemu-user")
    args = parser.parse_args()
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    with tempfile.TemporaryDirectory() as tmp:
        bpte = args.bundle or args.keep or Path(tmp) / "llm.bpte"
        build = [exe, "build", "llm:llama3", "--size", args.size, "--dtype", args.dtype, "--decode-steps",
                 str(args.steps - 1), "--max-seq-len", "128" if args.size == "tiny" else "256", "-o", str(bpte)]
        t = time.perf_counter()
        if args.bundle is None:
            subprocess.run(build, check=True, capture_output=True)
        build_s = time.perf_counter() - t
        from bundlerun.bundles.bpte import read_bundle

        manifest = read_bundle(bpte).manifest
        export_s = manifest.build.llm.export_s if manifest.build.llm else None
        cases = manifest.build.cases
        script = Path(tmp) / "bare.py"
        script.write_text(BARE)
        lanes = args.lanes.split(",")
        results = {}
        load = [" ".join(Path("/proc/loadavg").read_text().split()[:3])]
        for lane in lanes:
            ours, bare, loops, bare_steps = [], [], [], []
            if lane == "host":
                url, bare_cmd, cwd = "host://xnnpack", [sys.executable, str(script), str(bpte)], None
            else:
                url = "qemu-user://aarch64"  # an untimed first run: the runner bundlerun uses, as its report names it
                timed([exe, "run", str(bpte), "--target", url, "--quiet", "--no-history", "--report", f"{tmp}/first"])
                runner = json.loads((Path(tmp) / "first" / "report.json").read_text())["target"]["info"]["runner"]
                qscript = Path(tmp) / "bare_qemu.py"
                qscript.write_text(BARE_QEMU)
                (Path(tmp) / "out").mkdir(exist_ok=True)
                url = "qemu-user://aarch64"
                bare_cmd, cwd = [sys.executable, str(qscript), shutil.which("qemu-aarch64") or "qemu-aarch64",
                                 str(runner), str(bpte.resolve()), str(cases)], tmp
            for i in range(args.repeat):
                elapsed, out = timed(bare_cmd, cwd)
                bare.append(elapsed)
                loops.append(float(out.split()[-1]))
                bare_steps.append(float(out.split()[-2]))
                ours.append(timed([exe, "run", str(bpte), "--target", url, "--quiet", "--no-history",
                                   "--report", f"{tmp}/{lane}-r{i}"])[0])
            report = json.loads((Path(tmp) / f"{lane}-r0" / "report.json").read_text())
            steps = [c["elapsed_s"] for i in range(args.repeat)
                     for c in json.loads((Path(tmp) / f"{lane}-r{i}" / "report.json").read_text())["cases"]
                     if c.get("elapsed_s") is not None]
            results[lane] = (ours, bare, loops, report.get("summary", {}).get("verdict"), steps, bare_steps)
        load.append(" ".join(Path("/proc/loadavg").read_text().split()[:3]))
        tokens = sum(len(st.tokens) for seq in manifest.sequences for st in seq.steps)
    size = bpte.stat().st_size if args.keep or args.bundle else None
    built = (f"build command {build_s:.1f} s{', cache hit' if build_s < (export_s or 0) else ''}" if args.bundle is None
             else f"bundle {args.bundle} built before")
    print(f"llm:llama3 {args.size} {args.dtype}: {len(manifest.sequences)} sequences x {args.steps} steps = {cases} "
          f"cases, {tokens} tokens fed; export_llama {export_s or 0:.1f} s ({built})" + (f", bundle {size} bytes" if size else "")
          + f"; load average {load[0]} before, {load[1]} after")
    for lane, (ours, bare, loops, verdict, steps, bare_steps) in results.items():
        what = "pybindings loop" if lane == "host" else "executor_runner --server_mode loop under qemu-aarch64"
        print(f"{lane}: bare {what}: best {min(bare):.2f} s per process (runs {[round(x, 2) for x in bare]}), "
              f"loop {min(loops):.3f} s = {1e3 * min(loops) / cases:.2f} ms per step")
        print(f"{lane}: bundlerun run: best {min(ours):.2f} s per process (runs {[round(x, 2) for x in ours]}, "
              f"verdict {verdict}); ratio {min(ours) / min(bare):.2f}x (goal <= 1.3x), "
              f"{statistics.median(ours) / statistics.median(bare):.2f}x of medians; bundlerun's fixed part "
              f"{min(ours) - min(bare):.2f} s")
        if steps:  # a step as bundlerun times it (its report's elapsed_s) vs the bare loop's, both medians
            step, bare_step = statistics.median(steps), statistics.median(bare_steps)
            print(f"{lane}: PER STEP median {1e3 * step:.2f} ms (bundlerun's report, {len(steps)} steps) vs the bare "
                  f"loop's {1e3 * bare_step:.2f} ms: {step / bare_step:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
