"""What a bundle costs as models grow (issue 36 item 6): build time, bundle size, `bundlerun run`
time per case and host RSS, report size, side by side with a bare pybindings loop over the same
bundle, from the tiny zoo to resnet50 and dl3 (a segmentation model: large outputs).

    .venv/bin/python bench/bench_cost.py --models tiny-cnn,et:mv2,et:resnet50,et:dl3 --cases 16 --out cost.json

Per model: `bundlerun build MODEL --cases N --no-cache` (wall time, bundle bytes), then, alternated,
`bundlerun run` on host://xnnpack and a bare script that loads the same bundle into the pybindings'
`_C` and runs the same cases (fresh processes, imports included). RSS is the peak of the sum over
the command's whole process tree (the CLI and its runtime worker), sampled from /proc every 50 ms,
and the peak of its largest single process. Goals (the issue's): run RSS <= 2 x (bundle bytes + one
case's outputs), run time <= 1.3 x the bare loop. Prints a table and a RATIO line per model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BARE = r'''
import sys, torch
from executorch.extension.pybindings import _C as p
buf = open(sys.argv[1], "rb").read()
bp = p._load_bundled_program_from_buffer(buf)
m = p._load_for_executorch_from_bundled_program(bp)
from bundlerun.bundles.bpte import parse_bundle
b = parse_bundle(buf)
del buf
n = 0
for case in b.suite("forward").test_cases:
    xs = [torch.frombuffer(bytearray(v.data), dtype=torch.float32).reshape(v.sizes) for v in case.inputs]
    outs = [o.numpy().copy() for o in m.run_method("forward", xs)]  # one case's outputs at a time
    n += 1
print(n)
'''


def _tree(pid: int) -> list[int]:
    """pid and every descendant (from /proc/*/stat ppid fields)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def measured(cmd: list[str], env: dict | None = None) -> dict:
    """Wall time and peak RSS (tree sum, largest process) of one command."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak = {"tree": 0, "single": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            sizes = [_rss(p) for p in _tree(proc.pid)]
            peak["tree"] = max(peak["tree"], sum(sizes))
            peak["single"] = max(peak["single"], max(sizes, default=0))
            done.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    done.set()
    th.join()
    wall = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd[:4])} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"wall_s": wall, "rss_tree": peak["tree"], "rss_single": peak["single"], "code": proc.returncode}


def one_case_outputs(bpte: Path) -> int:
    from bundlerun.bundles.bpte import read_bundle

    b = read_bundle(bpte)
    case = b.method_test_suites[0].test_cases[0]
    return sum(len(v.data or b"") for v in case.expected_outputs)


def bench(model: str, cases: int, repeat: int, tmp: Path, exe: str) -> dict:
    bpte = tmp / (model.replace(":", "_") + ".bpte")
    b = measured([exe, "build", model, "--cases", str(cases), "--no-cache", "-o", str(bpte)])
    row = {"model": model, "cases": cases, "build_s": b["wall_s"], "build_rss": b["rss_tree"],
           "bundle_bytes": bpte.stat().st_size, "case_output_bytes": one_case_outputs(bpte)}
    script = tmp / "bare.py"
    script.write_text(BARE)
    ours, bare = [], []
    for i in range(repeat):
        bare.append(measured([sys.executable, str(script), str(bpte)]))
        report = tmp / f"r-{model.replace(':', '_')}-{i}"
        ours.append(measured([exe, "run", str(bpte), "--quiet", "--no-history", "--report", str(report)]))
        row["report_json_bytes"] = (report / "report.json").stat().st_size
        row["report_dir_bytes"] = sum(f.stat().st_size for f in report.rglob("*") if f.is_file())
        row["verdict"] = json.loads((report / "report.json").read_text())["summary"]["verdict"]
        shutil.rmtree(report, ignore_errors=True)
    best_o, best_b = min(ours, key=lambda r: r["wall_s"]), min(bare, key=lambda r: r["wall_s"])
    row.update(run_s=best_o["wall_s"], bare_s=best_b["wall_s"], run_s_per_case=best_o["wall_s"] / cases,
               run_rss_tree=max(r["rss_tree"] for r in ours), run_rss_single=max(r["rss_single"] for r in ours),
               bare_rss=max(r["rss_tree"] for r in bare), runs=[r["wall_s"] for r in ours],
               bares=[r["wall_s"] for r in bare])
    row["time_ratio"] = row["run_s"] / row["bare_s"]
    row["rss_goal"] = 2 * (row["bundle_bytes"] + row["case_output_bytes"])
    row["rss_ratio"] = row["run_rss_tree"] / (row["bundle_bytes"] + row["case_output_bytes"])
    bpte.unlink(missing_ok=True)
    return row


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-cnn,et:mv2,et:resnet50,et:dl3")
    parser.add_argument("--cases", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            load = os.getloadavg()[0]
            row = bench(model, args.cases, args.repeat, Path(tmp), exe)
            row["load_before"] = load
            row["load_after"] = os.getloadavg()[0]
            rows.append(row)
            print(f"{model}: build {row['build_s']:.1f} s, bundle {mib(row['bundle_bytes'])} MiB, one case's outputs "
                  f"{mib(row['case_output_bytes'])} MiB, run {row['run_s']:.1f} s ({row['run_s_per_case']:.2f} s/case, "
                  f"bare {row['bare_s']:.1f} s), run RSS tree {mib(row['run_rss_tree'])} MiB (largest process "
                  f"{mib(row['run_rss_single'])}, bare {mib(row['bare_rss'])}), report.json "
                  f"{row['report_json_bytes'] / 1024:.0f} KiB, {row['verdict']}, load {load:.1f}", flush=True)
            print(f"RATIO {model}: run/bare time = {row['time_ratio']:.2f} (goal <= 1.3); run RSS / (bundle + one "
                  f"case's outputs) = {row['rss_ratio']:.2f} (goal <= 2)", flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
