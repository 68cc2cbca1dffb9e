"""Measure which ExecuTorch example models (`et:NAME`) build and lower on which lane; writes
docs/example-models.md's table from the JSON it records (a measurement, not a test: minutes per model).

    .venv/bin/python bench/et_models_table.py --out /tmp/et-table.json [--names mv2,resnet8] [--lanes ...]
    .venv/bin/python bench/et_models_table.py --out /tmp/et-table.json --markdown
    .venv/bin/python bench/et_models_table.py --out /tmp/et-table.json --long --lanes m55-qemu,qemu-user-int8

int8 lanes are built with `--reference quantized`. Each step runs in its own process (`bundlerun build` / `run`, `--cases 2`) under a time limit and a
4 GiB address-space limit (bundlerun's own bounds for this bench), so one model cannot stall the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
# lane -> (target, dtype, run it here?)
LANES = {
    "portable": ("host://portable", "fp32", True),
    "xnnpack-fp32": ("host://xnnpack", "fp32", True),
    "xnnpack-int8": ("host://xnnpack", "int8", True),
    "tosa-int": ("tosa://int", "int8", True),
    "ethos-u55": ("fvp://corstone-300/ethos-u55-128", "int8", False),
    "cortex-m55": ("fvp://corstone-300/cortex-m55", "int8", False),
    # the emulated lanes (each runs the real runtime: QEMU, lavapipe, Qualcomm's HTP simulator, MLX)
    "m55-qemu": ("qemu://mps3-an547", "int8", True),  # cortex-m backend on the Cortex-M55 runner under QEMU
    "qemu-user-fp32": ("qemu-user://aarch64", "fp32", True),  # portable kernels, aarch64 executor_runner
    "qemu-user-int8": ("qemu-user://aarch64", "int8", True),  # XNNPACK (qemu-user's int8 default)
    "vulkan": ("vulkan://lavapipe", "fp32", True),
    "qnn-htp-sim": ("qnn://htp-sim", "int8", True),
    "mlx": ("mlx://cpu", "fp32", True),
}
AS_LIMIT = 4 << 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    os.nice(10)


def _call(args: list[str], timeout: float) -> tuple[int | str, float, str, str]:
    """(exit code or "timeout", seconds, the line saying why, stdout)."""
    start = time.monotonic()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, preexec_fn=_limit)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start, f"over {timeout:g} s", ""
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    err = next((ln for ln in lines if ln.startswith("bundlerun: error")), lines[-1] if lines else "")
    return proc.returncode, time.monotonic() - start, err.strip()[:300], proc.stdout


def load_names(names: list[str], timeout: float) -> dict[str, dict]:
    out = {}
    for name in names:
        code = ("import time;t=time.monotonic();from bundlerun.bundles.model_source import resolve_model;"
                f"m=resolve_model('et:{name}');import json;print(json.dumps({{'s':time.monotonic()-t,"
                "'params':sum(p.numel() for p in m.module.parameters()),"
                "'inputs':[[list(s.shape),s.distribution] for s in m.inputs]}))")
        rc, secs, err, stdout = _call([PY, "-c", code], timeout)
        if rc == 0:
            out[name] = {"load": "ok", **json.loads(stdout.strip().splitlines()[-1])}
        else:
            out[name] = {"load": "fail", "why": err, "secs": round(secs, 1)}
        print(name, out[name], flush=True)
    return out


def lane(name: str, lane_name: str, work: Path, timeout: float, cases: int = 2, inputs: str | None = None) -> dict:
    target, dtype, run = LANES[lane_name]
    bundle = work / f"{name}-{lane_name}.bpte"
    load = round(os.getloadavg()[0], 1)
    rc, secs, err, _ = _call([PY, "-m", "bundlerun.runner.cli", "build", f"et:{name}", "-o", str(bundle),
                           "--target", target, "--dtype", dtype, "--cases", str(cases)]
                          + (["--inputs", inputs] if inputs else [])
                          # int8 is judged against the quantized reference: some of ExecuTorch's Arm model
                          # tests turn every float-reference check off (the build then refuses)
                          + (["--reference", "quantized"] if dtype == "int8" else []), timeout)
    rec: dict = {"build": rc, "build_s": round(secs, 1), "load": load, "cases": cases,
                 **({"inputs": inputs} if inputs else {})}
    if rc != 0:
        rec["why"] = err
        return rec
    rec["size"] = bundle.stat().st_size
    if run:
        rep = work / f"{name}-{lane_name}-report"
        rc, secs, err, _ = _call([PY, "-m", "bundlerun.runner.cli", "run", str(bundle), "--target", target,
                               "--report", str(rep), "--no-history"], timeout)
        rec.update({"run": rc, "run_s": round(secs, 1)})
        try:
            report = json.loads((rep / "report.json").read_text())
            rec["verdict"] = report["summary"]["verdict"]
            rec["backend"] = report.get("bundle", {}).get("backend")
            per_case = [c.get("elapsed_s") for c in report["cases"] if isinstance(c.get("elapsed_s"), (int, float))]
            if per_case:
                rec["case_s"] = round(sum(per_case) / len(per_case), 3)
            sq = [(o.get("stats") or {}).get("sqnr") for c in report["cases"] for o in c.get("outputs", [])]
            sq = [float(s) if s == "inf" else s for s in sq]  # a bit-exact output's SQNR
            sq = [s for s in sq if isinstance(s, (int, float))]
            if sq:  # a bit-exact one as words: JSON has no infinity (json.dump would write Infinity)
                rec["sqnr_min"] = "inf (bit exact)" if min(sq) == float("inf") else round(min(sq), 1)
        except (OSError, KeyError, ValueError):
            rec["why"] = err
    return rec


WIDE = ("portable", "xnnpack-fp32", "xnnpack-int8", "tosa-int", "ethos-u55", "cortex-m55")  # --markdown's columns


def markdown(data: dict) -> str:
    """The wide table (host, TOSA, FVP builds); the emulated lanes are `--long`'s rows."""
    lanes = list(WIDE)
    rows = ["| name | params | inputs (shape ~ distribution) | " + " | ".join(lanes) + " |",
            "|---|---|---|" + "---|" * len(lanes)]
    notes = []
    for name, rec in sorted(data.items()):
        if rec.get("load") != "ok":
            rows.append(f"| {name} | - | - | " + " | ".join("-" for _ in lanes) + " |")
            notes.append(f"- `{name}`: does not build: {rec.get('why')}")
            continue
        cells = []
        for ln in lanes:
            r = rec.get("lanes", {}).get(ln)
            if r is None:
                cells.append("not measured")
            elif r["build"] != 0:
                cells.append(f"no ({r.get('build_s')} s)")
                notes.append(f"- `{name}` on {ln}: {r.get('why')}")
            elif "verdict" in r:
                sq = "" if "sqnr_min" not in r else (f", {r['sqnr_min']}" if isinstance(r["sqnr_min"], str)
                                                     else f", {r['sqnr_min']} dB")
                per = f", {r['case_s']} s/case" if "case_s" in r else ""
                cells.append(f"{r['verdict']} ({r['build_s']} s build{sq}{per})")
                if r["verdict"] != "PASS":
                    notes.append(f"- `{name}` on {ln}: {r['verdict']} {r.get('why', '')}".rstrip())
            elif "run" in r:
                cells.append(f"built ({r['build_s']} s), run: {r.get('why', r['run'])}")
            else:
                cells.append(f"lowers ({r['build_s']} s, {r['size'] // 1024} KiB)")
        inputs = "; ".join(f"{s} ~ {d}" for s, d in rec.get("inputs", []))
        rows.append(f"| {name} | {rec.get('params', 0):,} | {inputs} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


def long_markdown(data: dict, lanes: list[str]) -> str:
    """One row per measured model x lane (dtype, backend, verdict, SQNR, build and per-case time, load)."""
    rows = ["| model | lane (target) | dtype | backend | verdict | min SQNR | build | time per case | load |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, rec in sorted(data.items()):
        for ln in lanes:
            r = rec.get("lanes", {}).get(ln)
            if r is None:
                continue
            target, dtype, _ = LANES[ln]
            verdict = r.get("verdict") or ("lowers" if r["build"] == 0 and "run" not in r else
                                           f"no: {str(r.get('why', ''))[:120]}")
            sq = "-" if "sqnr_min" not in r else (r["sqnr_min"] if isinstance(r["sqnr_min"], str) else f"{r['sqnr_min']} dB")
            per = f"{r['case_s']} s" if "case_s" in r else "-"
            build = f"{r['build_s']} s" if r.get("build_s") is not None else "not timed"
            ins = f" ({r['inputs']})" if r.get("inputs") else ""
            rows.append(f"| {name}{ins} | {ln} (`{target}`) | {dtype} | {r.get('backend') or '-'} | {verdict} | {sq} | "
                        f"{build} | {per} | {r.get('load', '-')} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--names", default=None)
    ap.add_argument("--lanes", default=",".join(LANES))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--long", action="store_true", help="print the model x lane x dtype rows of --out")
    ap.add_argument("--cases", type=int, default=2)
    ap.add_argument("--inputs", default=None, help="--inputs for every build (images, mnist, DIR)")
    ap.add_argument("--redo", action="store_true", help="measure lanes already in --out again")
    args = ap.parse_args()
    data = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if args.markdown:
        print(markdown(data))
        return
    if args.long:
        print(long_markdown(data, [x for x in args.lanes.split(",") if x in LANES]))
        return
    from executorch.examples.models import MODEL_NAME_TO_MODEL

    names = args.names.split(",") if args.names else sorted(MODEL_NAME_TO_MODEL)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "et-table"
    work.mkdir(exist_ok=True)
    for name in names:
        if name not in data:
            data.update(load_names([name], args.timeout))
            args.out.write_text(json.dumps(data, indent=1))
    for name in names:
        if data[name].get("load") != "ok":
            continue
        for ln in [x for x in args.lanes.split(",") if x in LANES]:  # --lanes none: load only
            if ln in data[name].get("lanes", {}) and not args.redo:
                continue
            data[name].setdefault("lanes", {})[ln] = lane(name, ln, work, args.timeout, args.cases, args.inputs)
            print(name, ln, data[name]["lanes"][ln], flush=True)
            args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
