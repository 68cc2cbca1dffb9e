"""`bundlerun run` of a 32-case XNNPACK bundle on qemu-user://aarch64 vs the bare aarch64 executor_runner
called in a shell loop under qemu-aarch64 doing the same work: the same 32 one-case bundles (written
beforehand, untimed: the bare runner checks case 0 only, so a loop needs them), the same flags bundlerun
passes (targets/executor_runner.runner_args: outputs to files, --cpu_threads 1, -cpu max; ETDump only
when the target keeps it).
bundlerun's side is the whole command in a fresh process: CLI start-up, the bundle's cases on one emulated
runner in --server_mode (targets/et_runner/server.py: the inputs as --inputs files), reading the outputs
back, judging every output, writing the report; `?server=false` (a one-case bundle and process per case,
as the bare loop) is timed too.
Alternated, best of N, load average printed. Goal: ratio at most 1.3.

    .venv/bin/python bench/bench_qemu_user.py [--model tiny-cnn] [--dtype fp32] [--cases 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str], **kw) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-cnn")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from bundlerun.bundles.bpte import read_bundle, write_bundle
    from bundlerun.targets.et_runner import executor_runner
    from bundlerun.targets.qemu_user import QemuUserSettings, cached_runner, qemu_for

    meta = cached_runner("aarch64")
    if not meta or "xnnpack" not in (meta.get("backends") or []):
        raise SystemExit("no cached aarch64 executor_runner with XNNPACK: "
                         "bash firmware_scripts/android/build_executor_runner.sh --toolchain gnu")
    runner, qemu, settings = meta["binary"], qemu_for("aarch64"), QemuUserSettings()
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    with tempfile.TemporaryDirectory() as tmp:
        bpte = Path(tmp) / "bench.bpte"
        subprocess.run([exe, "build", args.model, "--backend", "xnnpack", "--dtype", args.dtype, "--cases",
                        str(args.cases), "--target", "qemu-user://aarch64", "-o", str(bpte)], check=True,
                       capture_output=True)
        bundle = read_bundle(bpte)
        method = bundle.method_test_suites[0].method_name
        lines = ["set -e"]
        for i in range(args.cases):
            d = Path(tmp) / "bare" / f"{method}-{i}"
            (d / "out").mkdir(parents=True)
            write_bundle(bundle.single_case(method, i), d / "model.bpte")
            flags = executor_runner.runner_args("model.bpte", method, "out/output", print_output=settings.print_output,
                                                etdump="out/model.etdump" if settings.etdump else None,
                                                cpu_threads=settings.cpu_threads)
            lines.append(f"cd {shlex.quote(str(d))} && {qemu} -cpu {settings.cpu} {runner} "
                         f"{' '.join(shlex.quote(f) for f in flags)} > runner.log 2>&1")
        script = Path(tmp) / "bare.sh"
        script.write_text("\n".join(lines) + "\n")
        ours, bare, alone = [], [], []
        print(f"load average before: {loadavg()}")
        for i in range(args.repeat):
            bare.append(timed(["bash", str(script)]))
            ours.append(timed([exe, "run", str(bpte), "--target", "qemu-user://aarch64", "--quiet", "--no-history",
                               "--report", f"{tmp}/r{i}"], env={**os.environ}))
            alone.append(timed([exe, "run", str(bpte), "--target", "qemu-user://aarch64?server=false", "--quiet",
                                "--no-history", "--report", f"{tmp}/a{i}"], env={**os.environ}))
        print(f"load average after: {loadavg()}")
    print(f"{args.cases}-case {args.model} {args.dtype} XNNPACK bundle on qemu-user://aarch64 ({runner}):")
    print(f"  bare runner in a shell loop: best {min(bare):.2f} s, runs {[round(x, 2) for x in bare]}")
    print(f"  `bundlerun run`:             best {min(ours):.2f} s, runs {[round(x, 2) for x in ours]}")
    print(f"  `bundlerun run`, server=false: best {min(alone):.2f} s, runs {[round(x, 2) for x in alone]}, "
          f"RATIO {min(alone) / min(bare):.2f}")
    ratio = min(ours) / min(bare)
    median = sorted(ours)[len(ours) // 2] / sorted(bare)[len(bare) // 2]
    print(f"RATIO bundlerun/bare = {ratio:.2f} best, {median:.2f} median (goal <= 1.3)")
    return 0 if ratio <= 1.3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
