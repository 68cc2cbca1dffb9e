"""`bundlerun run` of a 32-case bundle on vulkan://lavapipe vs the bare runner doing the same work: ExecuTorch's
Vulkan executor_runner called in a shell loop, once per case on that case's one-case bundle, with the same
flags, the same driver (VK_ICD_FILENAMES) and the same warm Mesa shader cache. The bare loop gets its 32
one-case bundles and folders made beforehand (untimed); bundlerun makes what it runs itself, runs, reads every
output and judges it, and writes the report. bundlerun's default runs a method's cases on one runner in
--server_mode (targets/et_runner/server.py); `?server=false` (a process per case, as the bare loop) is timed
too. Fresh processes, alternated, best and median of N rounds. Goal: ratio at most 1.3."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

URL = "vulkan://lavapipe"


def timed(cmd: list[str], env: dict | None = None) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {proc.stdout[-1000:]} {proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    from bundlerun.bundles.bpte import read_bundle, write_bundle
    from bundlerun.targets import open_target
    from bundlerun.targets.et_runner import executor_runner
    from bundlerun.targets.vulkan import default_shader_cache, runner_env

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny-cnn")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    target = open_target(URL, {})
    runner = target.runner()
    env = runner_env(target.icd, default_shader_cache())
    with tempfile.TemporaryDirectory(prefix="bench-vulkan-") as tmp:
        bpte = Path(tmp) / "bench.bpte"
        subprocess.run([exe, "build", args.model, "--target", URL, "--dtype", args.dtype, "--cases", str(args.cases),
                        "-o", str(bpte)], check=True, capture_output=True)
        bundle = read_bundle(bpte)
        flags = executor_runner.runner_args("model.bpte", "forward", "out/output", print_output="none")
        loop = []
        for i in range(args.cases):
            folder = Path(tmp) / "bare" / f"forward-{i}"
            (folder / "out").mkdir(parents=True)
            write_bundle(bundle.single_case("forward", i), folder / "model.bpte")
            loop.append(f"cd {shlex.quote(str(folder))} && {shlex.quote(str(runner))} {shlex.join(flags)} "
                        "> runner.log 2>&1 || exit 1")
        script = Path(tmp) / "bare.sh"
        script.write_text("set -e\n" + "\n".join(loop) + "\n")
        # warm-up (untimed): Mesa compiles this model's shaders into its cache once
        timed(["bash", str(script)], env)
        bare, ours, alone, loads = [], [], [], []
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            bare.append(timed(["bash", str(script)], env))
            ours.append(timed([exe, "run", str(bpte), "--target", URL, "--quiet", "--no-history", "--report",
                               f"{tmp}/r{r}"]))
            alone.append(timed([exe, "run", str(bpte), "--target", URL + "?server=false", "--quiet", "--no-history",
                                "--report", f"{tmp}/a{r}"]))
    print(f"{args.cases}-case {args.model} {args.dtype} bundle on {URL} ({runner}):")
    print(f"  bare runner shell loop: best {min(bare):.2f} s, median {statistics.median(bare):.2f} s "
          f"({[round(x, 2) for x in bare]})")
    print(f"  bundlerun run:          best {min(ours):.2f} s, median {statistics.median(ours):.2f} s "
          f"({[round(x, 2) for x in ours]})")
    print(f"  bundlerun run, server=false (a process per case): best {min(alone):.2f} s, median "
          f"{statistics.median(alone):.2f} s ({[round(x, 2) for x in alone]}); RATIO {min(alone) / min(bare):.2f}")
    print(f"  1-minute load average at the start of each round: {[round(x, 1) for x in loads]}")
    ratio = min(ours) / min(bare)
    print(f"RATIO bundlerun/bare = {ratio:.2f} best, {statistics.median(ours) / statistics.median(bare):.2f} median "
          "(goal <= 1.3)")
    return 0 if ratio <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
