"""ExecuTorch's backend test suite, one flow's operator tests, three ways side by side in one run:

    A  the suite's own run (pytest --pyargs executorch.backends.test.suite.operators -m flow_F)
    B  the same with --bundlerun-target host://<portable|xnnpack> (the compare step on bundlerun's
       warm host runtime: bundle, run, judge with the registry, report per test)
    C  the same with --bundlerun-target qemu-user://aarch64 (the aarch64 runner under qemu-aarch64)

Each in a fresh pytest process (the suite's lowering is identical in all three), alternated when
--rounds > 1; prints each wall time, the tests and subtests that reached the compare step, and the
RATIO lines B/A and C/A. Goal: one warm runtime per target for the whole session, so B stays
within a small factor of A at suite scale; C adds qemu-aarch64's emulation per case.

    .venv/bin/python bench/bench_suite.py --flow portable -k "test_add or test_mul or test_relu"
    .venv/bin/python bench/bench_suite.py --flow portable --all     # every operator test of the flow
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_K = ("test_add or test_sub or test_mul or test_div or test_relu or test_sigmoid or test_tanh or test_split "
             "or test_cat or test_linear or test_exp or test_neg")


def run(flow: str, k: str | None, target: str | None, folder: Path) -> dict:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "pytest_jsonreport.plugin", "-q",
            "--pyargs", "executorch.backends.test.suite.operators", "-m", f"flow_{flow}",
            "--json-report", f"--json-report-file={folder / 'r.json'}"]
    if k:
        args += ["-k", k]
    if target:
        args += ["-p", "bundlerun.runner.pytest_plugin", "--bundlerun-target", target, "--bundlerun-report",
                 str(folder / "out")]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=folder, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    data = json.loads((folder / "r.json").read_text()) if (folder / "r.json").is_file() else {"tests": []}
    subs = [s for t in data["tests"] for s in (t.get("metadata") or {}).get("subtests") or []]
    ran = sum(1 for s in subs if s.get("Output 0 SNR") not in (None, ""))
    on_target = sum(1 for s in subs if s.get("bundlerun Verdict"))
    verdicts: dict[str, int] = {}
    for s in subs:
        verdicts[s.get("bundlerun Verdict") or s.get("Result")] = verdicts.get(s.get("bundlerun Verdict") or
                                                                               s.get("Result"), 0) + 1
    return {"wall": wall, "rc": proc.returncode, "tests": len(data["tests"]), "subtests": len(subs), "compared": ran,
            "on_target": on_target, "verdicts": verdicts, "load": load, "tail": proc.stdout.splitlines()[-1:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flow", default="portable")
    ap.add_argument("-k", default=DEFAULT_K, help="pytest -k selection (default: a dozen operators)")
    ap.add_argument("--all", action="store_true", help="every operator test of the flow")
    ap.add_argument("--host", default=None, help="host target (default host://<flow> for portable/xnnpack)")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    k = None if args.all else args.k
    host = args.host or ("host://xnnpack" if args.flow.startswith("xnnpack") else "host://portable")
    lanes = {"A suite": None, f"B {host}": host, "C qemu-user://aarch64": "qemu-user://aarch64"}
    results: dict[str, list[dict]] = {name: [] for name in lanes}
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        for r in range(args.rounds):
            for name, target in lanes.items():
                folder = Path(tmp) / f"{r}-{name.split()[0]}"
                folder.mkdir()
                res = run(args.flow, k, target, folder)
                results[name].append(res)
                print(f"{name:28s} round {r}: {res['wall']:7.1f} s  rc {res['rc']}  {res['tests']} tests, "
                      f"{res['subtests']} subtests, {res['compared']} compared, {res['on_target']} on the target; "
                      f"{res['verdicts']}; load {res['load']:.1f}; {' '.join(res['tail'])}", flush=True)
    best = {name: min(x["wall"] for x in rs) for name, rs in results.items()}
    names = list(lanes)
    print(f"RATIO {names[1]} / suite = {best[names[1]] / best[names[0]]:.2f} (best {best[names[1]]:.1f} s vs "
          f"{best[names[0]]:.1f} s)")
    print(f"RATIO {names[2]} / suite = {best[names[2]] / best[names[0]]:.2f} (best {best[names[2]]:.1f} s vs "
          f"{best[names[0]]:.1f} s)")


if __name__ == "__main__":
    main()
