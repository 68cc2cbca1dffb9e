"""What a bundle costs as models grow (issue 36 item 6): build time, bundle size, `bundlerun run`
time per case, host RSS and report size, side by side with a bare pybindings loop over the same
bundle, from the tiny zoo to resnet50 and dl3 (a segmentation model: 2 x 1x21x224x224 float outputs,
8.4 MB a case).

    .venv/bin/python bench/bench_cost.py --models tiny-cnn,et:mv2,et:resnet50,et:dl3 --cases 16 \
        --before /tmp/before-path --out cost.json --readme bench/README.md

Per model: `bundlerun build MODEL --cases N --no-cache` once (wall time, bundle bytes), then,
alternated, fresh processes: the bare loop, `bundlerun run` on host://xnnpack of each side
(`--before DIR` puts DIR first on PYTHONPATH: a tree whose `bundlerun` package is an older
checkout, the "before"; the installed bundlerun is the "after"), and `run --save-outputs` of each
side (the raw outputs written into the report's outputs.npz). RSS is the peak of the sum over the
command's process tree (the CLI and its runtime worker), sampled from /proc every 50 ms.

Goals (the issue's): run RSS <= 2 x (bundle bytes + one case's outputs); run time <= 1.3 x the bare
loop. torch + the runtime + the CLI cost a fixed ~300 MiB that no bundle size changes, so the RSS goal
is also given over that fixed part: `RSS - RSS(first model)` against `2 x (its bundle + one case's
outputs)` (the first model, the tiny zoo's, measures the fixed part in the same run).
`--readme FILE` replaces the table between `<!-- bench_cost:begin -->` and `<!-- bench_cost:end -->`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
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


def _env(before: Path | None) -> dict:
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = str(before) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build(model: str, cases: int, keep: Path, exe: str) -> dict:
    """One bundle per (model, cases), built once; a bundle already in `keep` is reused with the
    figures recorded beside it."""
    bpte = keep / f"{model.replace(':', '_')}-{cases}.bpte"
    meta = bpte.with_suffix(".json")
    if bpte.is_file() and meta.is_file():
        return {**json.loads(meta.read_text()), "bpte": str(bpte)}
    load = os.getloadavg()[0]
    b = measured([exe, "build", model, "--cases", str(cases), "--no-cache", "-o", str(bpte)])
    row = {"build_s": b["wall_s"], "build_rss": b["rss_tree"], "build_load": load,
           "bundle_bytes": bpte.stat().st_size, "case_output_bytes": one_case_outputs(bpte)}
    meta.write_text(json.dumps(row))
    return {**row, "bpte": str(bpte)}


def bench(model: str, cases: int, repeat: int, tmp: Path, keep: Path, exe: str, before: Path | None,
          save_outputs: bool) -> dict:
    row = {"model": model, "cases": cases, **build(model, cases, keep, exe)}
    bpte = row.pop("bpte")
    script = tmp / "bare.py"
    script.write_text(BARE)
    sides = {"after": _env(None), **({"before": _env(before)} if before else {})}
    variants = [("run", [])] + ([("save", ["--save-outputs"])] if save_outputs else [])
    runs: dict[str, list[dict]] = {"bare": []}
    row["load_before"] = os.getloadavg()[0]
    for i in range(repeat):
        runs["bare"].append(measured([sys.executable, str(script), bpte]))
        for side, env in sides.items():
            for variant, flags in variants:
                key = f"{side}_{variant}"
                report = tmp / f"r-{model.replace(':', '_')}-{key}-{i}"
                r = measured([exe, "run", bpte, "--quiet", "--no-history", *flags, "--report", str(report)], env)
                r["report_json_bytes"] = (report / "report.json").stat().st_size
                r["report_dir_bytes"] = _dir_bytes(report)
                r["verdict"] = json.loads((report / "report.json").read_text())["summary"]["verdict"]
                runs.setdefault(key, []).append(r)
                shutil.rmtree(report, ignore_errors=True)
    row["load_after"] = os.getloadavg()[0]
    for key, rs in runs.items():
        best = min(rs, key=lambda r: r["wall_s"])
        row[key] = {"wall_s": best["wall_s"], "walls": [r["wall_s"] for r in rs],
                    "rss_tree": max(r["rss_tree"] for r in rs), "rss_single": max(r["rss_single"] for r in rs),
                    **{k: rs[-1][k] for k in ("report_json_bytes", "report_dir_bytes", "verdict") if k in rs[-1]}}
    row["goal_bytes"] = row["bundle_bytes"] + row["case_output_bytes"]
    return row


def mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f}"


def ratios(rows: list[dict]) -> None:
    """time ratio vs bare, RSS over the goal's bytes, and over the first row's (the fixed part)."""
    base = rows[0]
    for row in rows:
        for key in [k for k in row if isinstance(row[k], dict) and "rss_tree" in row[k]]:
            r = row[key]
            r["time_ratio"] = r["wall_s"] / row["bare"]["wall_s"]
            r["rss_ratio"] = r["rss_tree"] / row["goal_bytes"]
            grow = row["goal_bytes"] - base["goal_bytes"]
            if row is not base and key in base and grow > 0:
                r["rss_ratio_over_fixed"] = (r["rss_tree"] - base[key]["rss_tree"]) / grow


def table(rows: list[dict], sides: list[str]) -> str:
    head = ("| model, cases | build | bundle | one case's outputs | side | run (per case) | vs bare | "
            "run RSS (largest process) | RSS / (bundle + outputs) | over the fixed part | report.json / folder | "
            "`--save-outputs` run, RSS, folder | load |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        for side in sides:
            r, s = row.get(f"{side}_run"), row.get(f"{side}_save")
            if r is None:
                continue
            over = r.get("rss_ratio_over_fixed")
            save = (f"{s['wall_s']:.1f} s, {mib(s['rss_tree'])} MiB, {s['report_dir_bytes'] / 1e6:,.1f} MB"
                    if s else "-")
            lines.append(
                f"| {row['model']}, {row['cases']} | {row['build_s']:.0f} s | {row['bundle_bytes'] / 1e6:,.1f} MB | "
                f"{row['case_output_bytes'] / 1e6:,.2f} MB | {side} | {r['wall_s']:.1f} s ({r['wall_s'] / row['cases']:.2f} s) | "
                f"{r['time_ratio']:.2f} (bare {row['bare']['wall_s']:.1f} s) | {mib(r['rss_tree'])} MiB "
                f"({mib(r['rss_single'])}; bare {mib(row['bare']['rss_tree'])}) | {r['rss_ratio']:.2f} | "
                f"{'-' if over is None else f'{over:.2f}'} | {r['report_json_bytes'] / 1024:,.0f} KiB / "
                f"{r['report_dir_bytes'] / 1e6:,.1f} MB | {save} | {row['load_before']:.1f}-{row['load_after']:.1f} |")
    return "\n".join(lines)


def write_readme(path: Path, text: str) -> None:
    begin, end = "<!-- bench_cost:begin -->", "<!-- bench_cost:end -->"
    doc = path.read_text()
    block = f"{begin}\n{text}\n{end}"
    if begin in doc and end in doc:
        doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(doc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-cnn,et:mv2,et:resnet50,et:dl3",
                        help="MODEL or MODEL@CASES, comma separated; the first measures the fixed part")
    parser.add_argument("--cases", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--before", type=Path, default=None, help="PYTHONPATH dir of the 'before' bundlerun")
    parser.add_argument("--save-for", default="all",
                        help="MODEL@CASES whose `run --save-outputs` is measured too (comma separated, 'all', 'none')")
    parser.add_argument("--keep", type=Path, default=None, help="folder keeping the built bundles between runs")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--readme", type=Path, default=None)
    args = parser.parse_args()
    exe = shutil.which("bundlerun") or str(Path(sys.executable).with_name("bundlerun"))
    sides = ["before", "after"] if args.before else ["after"]
    rows: list[dict] = []
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory() as tmp:
        keep = args.keep or Path(tmp) / "bundles"
        keep.mkdir(parents=True, exist_ok=True)
        for spec in args.models.split(","):
            model, _, n = spec.partition("@")
            cases = int(n or args.cases)
            save = args.save_for == "all" or f"{model}@{cases}" in args.save_for.split(",")
            row = bench(model, cases, args.repeat, Path(tmp), keep, exe, args.before, save)
            rows.append(row)
            ratios(rows)
            for side in sides:
                r = row[f"{side}_run"]
                print(f"RATIO {model}@{row['cases']} {side}: run/bare time = {r['time_ratio']:.2f} (goal <= 1.3); "
                      f"RSS / (bundle + one case's outputs) = {r['rss_ratio']:.2f}, over the fixed part "
                      f"{r.get('rss_ratio_over_fixed', float('nan')):.2f} (goal <= 2); {r['verdict']}", flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=2))
    text = table(rows, sides)
    print(text)
    if args.readme:
        note = (f"bench/bench_cost.py, {started:%Y-%m-%d %H:%M} UTC, `--repeat {args.repeat}` (best wall time, "
                f"highest RSS), host://xnnpack fp32; sides: {', '.join(sides)}"
                + (f" (before = `{args.before}` on PYTHONPATH)" if args.before else "") + ".")
        write_readme(args.readme, note + "\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
