"""`bundlerun run` of an LLM bundle (`llm:llama3 --size tiny`, export_llama's Vulkan program: 3 sequences, 15
steps) on vulkan://lavapipe vs the runner's own server loop doing the same work: ExecuTorch's Vulkan
executor_runner (bundlerun's build, server mode patched so a trigger line names the bundled test case) started
once on the same bundle, the same driver (VK_ICD_FILENAMES) and warm Mesa shader cache, fed the 15 case
indices one line at a time, each waited for until the runner logs `SERVER MODE DONE`. The bare loop judges
nothing and writes no report; bundlerun starts its CLI, serves the same 15 triggers, reads and judges every
output (with the token figures) and writes the report. Per token: a step's trigger time over its tokens.
Fresh processes, alternated, best and median of N rounds. Goal: ratio at most 1.3 (issue 37)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

URL = "vulkan://lavapipe"


def bare_loop(runner: Path, bpte: Path, cases: int, env: dict, folder: Path) -> tuple[float, list[float]]:
    """(whole wall, per-trigger seconds) of the runner's own server loop over `cases` bundled test cases."""
    (folder / "out").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(runner), "--model_path", str(bpte), "--method_name", "forward", "--output_file",
                             "out/output", "--print_output", "none", "--server_mode"], cwd=folder, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdin is not None and proc.stdout is not None

    def until(marker: str) -> None:
        for line in proc.stdout:
            if marker in line:
                return
        raise SystemExit(f"the runner ended before {marker!r} (exit {proc.wait()})")

    until("waiting for stdin triggers")
    steps = []
    for i in range(cases):
        t = time.perf_counter()
        proc.stdin.write(f"{i}\n")
        proc.stdin.flush()
        until("SERVER MODE DONE")
        steps.append(time.perf_counter() - t)
    proc.stdin.close()
    if proc.wait() != 0:
        raise SystemExit(f"the runner exited {proc.returncode}")
    return time.perf_counter() - t0, steps


def main() -> int:
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.sequence import from_manifest
    from bundlerun.targets import open_target
    from bundlerun.targets.vulkan import default_shader_cache, runner_env

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="llama3")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    target = open_target(URL, {})
    runner = target.runner()
    env = runner_env(target.icd, default_shader_cache())
    with tempfile.TemporaryDirectory(prefix="bench-vulkan-llm-") as tmp:
        bpte = Path(tmp) / "llm.bpte"
        t = time.perf_counter()
        subprocess.run([exe, "build", f"llm:{args.arch}", "--size", args.size, "--target", URL, "--dtype", args.dtype,
                        "-o", str(bpte)], check=True, capture_output=True)
        build_s = time.perf_counter() - t
        bundle = read_bundle(bpte)
        steps = [s for seq in from_manifest(bundle.manifest) for s in seq.steps]
        tokens = [len(s.tokens) for s in steps]
        cases = len(steps)
        bare_loop(runner, bpte, cases, env, Path(tmp) / "warm")  # warm-up (untimed): Mesa's shader cache
        bare, ours, loads, bare_steps, our_steps, one = [], [], [], [], [], []
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            wall, per = bare_loop(runner, bpte, cases, env, Path(tmp) / f"bare{r}")
            bare.append(wall)
            bare_steps.append(per)
            t = time.perf_counter()
            proc = subprocess.run([exe, "run", str(bpte), "--target", URL, "--quiet", "--no-history", "--report",
                                   f"{tmp}/r{r}"], capture_output=True, text=True)
            ours.append(time.perf_counter() - t)
            if proc.returncode != 0:
                raise SystemExit(f"bundlerun run exited {proc.returncode}: {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
            report = json.loads((Path(tmp) / f"r{r}" / "report.json").read_text())
            our_steps.append([c["elapsed_s"] for c in report["cases"]])
            # one step (the command's fixed part): the other steps are not run, their sequences ERROR (exit 2)
            t = time.perf_counter()
            proc = subprocess.run([exe, "run", str(bpte), "--target", URL, "--select", "0", "--quiet", "--no-history",
                                   "--report", f"{tmp}/o{r}"], capture_output=True, text=True)
            one.append(time.perf_counter() - t)
            if proc.returncode not in (0, 1, 2):
                raise SystemExit(f"bundlerun run --select 0 exited {proc.returncode}: {proc.stderr[-1500:]}")
    size = len(bundle.program)
    decode = [i for i, n in enumerate(tokens) if n == 1]

    def per_token_ms(runs: list[list[float]]) -> float:
        return statistics.median(run[i] / tokens[i] for run in runs for i in decode) * 1000

    print(f"llm:{args.arch} {args.size} {args.dtype}: {cases} steps ({sum(tokens)} tokens) on {URL} ({runner})")
    print(f"  build (export_llama, or a build-cache copy): {build_s:.1f} s; program {size:,} bytes")
    print(f"  bare server loop: best {min(bare):.2f} s, median {statistics.median(bare):.2f} s ({[round(x, 2) for x in bare]})")
    print(f"  bundlerun run:    best {min(ours):.2f} s, median {statistics.median(ours):.2f} s ({[round(x, 2) for x in ours]})")
    print(f"  bundlerun run --select 0 (one step: the command's fixed part): best {min(one):.2f} s")
    print(f"  per decode token (median trigger): bare {per_token_ms(bare_steps):.2f} ms, bundlerun "
          f"{per_token_ms(our_steps):.2f} ms; per-token ratio {per_token_ms(our_steps) / per_token_ms(bare_steps):.2f}")
    print(f"  RATIO (whole command) best {min(ours) / min(bare):.2f}, median "
          f"{statistics.median(ours) / statistics.median(bare):.2f}; 1-min load {min(loads):.1f}-{max(loads):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
