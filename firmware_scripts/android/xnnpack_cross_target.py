"""The docs/android.md XNNPACK table: the SAME bundles on host://xnnpack (x86_64 kernels, the wheel's
pybindings) and on qemu-user://aarch64 (the aarch64 executor_runner built from source: XNNPACK's
NEON / dot-product / fp16-arithmetic kernels under qemu-aarch64 -cpu max), every case judged with the
registry's numbers, side by side.

    .venv/bin/python firmware_scripts/android/xnnpack_cross_target.py [--models zoo] [--dtypes fp32,fp16,int8]
        [--cases 8] [--work /tmp/xnn-table]

Each model x dtype: `bundlerun build` once (for host://xnnpack), `bundlerun run` of that file on both
targets with --save-outputs, then `bundlerun compare HOST ARM --json` (same bundle on two targets). Per
target: verdict, worst max-abs error and lowest SQNR over every case and output (against the bundle's
expected outputs), median per-case time; and the largest |aarch64 - x86| output difference.
Prints a markdown table (and --json rows).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

ARM = "qemu-user://aarch64"
HOST = "host://xnnpack"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", *args], capture_output=True, text=True)


def _num(v) -> float:
    return math.inf if v == "inf" else (-math.inf if v == "-inf" else float(v))


def _summary(report_dir: Path) -> dict:
    r = json.loads((report_dir / "report.json").read_text())
    outs = [o for c in r["cases"] for o in c.get("outputs") or []]
    times = [c["elapsed_s"] for c in r["cases"] if c.get("elapsed_s") is not None]
    return {"verdict": r["summary"]["verdict"],
            "cases": len(r["cases"]),
            "error_max": max((_num(o["stats"]["error_max"]) for o in outs), default=None),
            "sqnr_min": min((_num(o["stats"]["sqnr"]) for o in outs), default=None),
            "case_s": statistics.median(times) if times else None}


def _output_diff(host_dir: Path, arm_dir: Path) -> tuple[float, bool]:
    """(largest |aarch64 - x86| over every saved output, bit-identical everywhere)."""
    import numpy as np

    a, b = np.load(host_dir / "outputs.npz"), np.load(arm_dir / "outputs.npz")
    worst, same = 0.0, True
    for key in sorted(set(a.files) & set(b.files)):
        x, y = a[key], b[key]
        same = same and x.tobytes() == y.tobytes()
        if x.size:
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst, same


def _fmt(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "sqnr":
        return "exact" if v == math.inf else f"{v:.1f} dB"
    if kind == "s":
        return f"{v * 1000:.0f} ms" if v >= 0.01 else f"{v * 1000:.2f} ms"
    return f"{v:.3g}"


def render(rows: list[dict]) -> str:
    """The markdown table of docs/android.md."""
    out = ["| model | dtype | host://xnnpack (x86_64): verdict, max err, min SQNR, per case | "
           "qemu-user://aarch64: verdict, max err, min SQNR, per case | aarch64 vs x86 outputs, max abs |",
           "|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for side in ("host", "arm"):
            s = r[side]
            cells.append(f"{s.get('verdict')}, {_fmt(s.get('error_max'), 'e')}, {_fmt(s.get('sqnr_min'), 'sqnr')}, "
                         f"{_fmt(s.get('case_s'), 's')}")
        diff = "identical" if r.get("bit_identical") else _fmt(r.get("arm_vs_host_max"), "e")
        out.append(f"| {r['model']} | {r['dtype']} | {cells[0]} | {cells[1]} | {diff} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="zoo")
    ap.add_argument("--dtypes", default="fp32,fp16,int8")
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/xnn-table"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from bundlerun.bundles.zoo import names

    models = names() if args.models == "zoo" else args.models.split(",")
    rows = []
    for model in models:
        for dtype in args.dtypes.split(","):
            d = args.work / f"{model}-{dtype}"
            d.mkdir(parents=True, exist_ok=True)
            bpte = d / "bundle.bpte"
            res = _cli("build", model, "--backend", "xnnpack", "--dtype", dtype, "--cases", str(args.cases),
                       "--target", HOST, "-o", str(bpte))
            if res.returncode != 0:
                print(f"{model} {dtype}: build failed: {res.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            row = {"model": model, "dtype": dtype}
            for name, url in (("host", HOST), ("arm", ARM)):
                run = _cli("run", str(bpte), "--target", url, "--report", str(d / name), "--no-history", "--quiet",
                           "--save-outputs")
                row[name] = _summary(d / name) if (d / name / "report.json").is_file() else {"verdict": f"exit {run.returncode}"}
            cmp = _cli("compare", str(d / "host"), str(d / "arm"), "--json")
            row["compare_exit"] = cmp.returncode
            row["cross_target"] = json.loads(cmp.stdout).get("cross_target") if cmp.stdout.strip().startswith("{") else None
            try:
                row["arm_vs_host_max"], row["bit_identical"] = _output_diff(d / "host", d / "arm")
            except (OSError, ValueError, KeyError):
                row["arm_vs_host_max"], row["bit_identical"] = None, None
            rows.append(row)
            print(f"{model} {dtype}: host {row['host'].get('verdict')}, aarch64 {row['arm'].get('verdict')}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    print(render(rows))
    return 0 if all(r["host"].get("verdict") == r["arm"].get("verdict") == "PASS" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
