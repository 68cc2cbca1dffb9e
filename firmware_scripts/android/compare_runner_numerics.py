#!/usr/bin/env python3
"""Run every case of .bpte bundles through built executor_runner binaries and compare
their raw outputs with the host ExecuTorch pybindings, bit for bit.

Why: the real runner verifies test case 0 only; this runs each case as its own
one-case bundle (as bundlerun's executor-runner profile does), reads the
`--output_file PREFIX` files (`PREFIX-<i>.bin`) and reports, per model and output,
the max |difference| against the pybindings and against the expected outputs.

    compare_runner_numerics.py --runner DIR_OR_BINARY [--runner ...] BUNDLE.bpte...

A runner folder is one made by build_executor_runner.sh --toolchain gnu (runner.json
says the arch; aarch64 runs under qemu-aarch64). Prints a JSON report on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


@dataclass
class Runner:
    binary: Path
    arch: str

    def command(self) -> list[str]:
        """How to start it on this host: aarch64 under qemu-aarch64, x86_64 directly."""
        if self.arch == "aarch64" and os.uname().machine != "aarch64":
            return ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(self.binary)]
        return [str(self.binary)]


@dataclass
class CaseResult:
    model: str
    runner: str
    case: int
    exit_status: int
    seconds: float
    verdict: str | None
    max_abs_vs_host: list[float] = field(default_factory=list)
    bit_equal_to_host: list[bool] = field(default_factory=list)
    max_abs_vs_expected: list[float] = field(default_factory=list)
    error: str | None = None


def load_runner(spec: str) -> Runner:
    path = Path(spec)
    if path.is_dir():
        meta = json.loads((path / "runner.json").read_text())
        binary = path / Path(meta["binary"]).name  # this folder's own binary, wherever the cache was when built
        return Runner(binary, meta["arch"])
    head = path.read_bytes()[:20]
    arch = "aarch64" if head[18] | (head[19] << 8) == 183 else "x86_64"
    return Runner(path, arch)


def host_outputs(program: bytes, inputs: list) -> list:
    """Outputs of the host pybindings (the reference bundlerun's host target uses)."""
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    try:  # registers quantized_decomposed kernels into the pybindings (int8 portable bundles)
        import executorch.kernels.quantized  # noqa: F401
    except ImportError:
        pass
    module = _load_for_executorch_from_buffer(program)
    outs = module.run_method("forward", [torch.from_numpy(a.copy()) for a in inputs])
    return [o.detach().numpy() if hasattr(o, "detach") else o for o in outs]


def run_case(runner: Runner, case_bundle: bytes, work: Path, timeout_s: float) -> tuple[int, float, str, list[Path]]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "model.bpte").write_bytes(case_bundle)
    for old in work.glob("output-*.bin"):
        old.unlink()
    cmd = runner.command() + ["--model_path", "model.bpte", "--output_file", "output", "--print_output", "none",
                              "--etdump_path", "model.etdump"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
    seconds = time.monotonic() - t0
    files = sorted(work.glob("output-*.bin"), key=lambda p: int(p.stem.split("-")[1]))
    return proc.returncode, seconds, out, files


def compare(bundle_path: Path, runners: dict[str, Runner], timeout_s: float) -> list[CaseResult]:
    import numpy as np

    from bundlerun.bundles.bpte import read_bundle, serialize_bundle
    from bundlerun.bundles.scalar_types import numpy_dtype

    bundle = read_bundle(bundle_path)
    model = bundle_path.stem
    suite = bundle.method_test_suites[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="bundlerun-cmp-") as tmp:
        for index, case in enumerate(suite.test_cases):
            inputs = [v.to_array() for v in case.inputs if v.kind == "tensor"]
            host = host_outputs(bytes(bundle.program), inputs)
            single = serialize_bundle(bundle.single_case(suite.method_name, index))
            for name, runner in runners.items():
                rc, secs, log, files = run_case(runner, single, Path(tmp) / name, timeout_s)
                verdict = "PASS" if "Test_result: PASS" in log else "FAIL" if "Test_result: FAIL" in log else None
                res = CaseResult(model, name, index, rc, round(secs, 3), verdict)
                expected = [v for v in case.expected_outputs if v.kind == "tensor"]
                if len(files) != len(expected):
                    res.error = f"{len(files)} output files for {len(expected)} outputs; log tail: {log.strip().splitlines()[-3:]}"
                    results.append(res)
                    continue
                for f, want, ref in zip(files, expected, host):
                    got = np.frombuffer(f.read_bytes(), dtype=numpy_dtype(want.scalar_type)).reshape(want.sizes)
                    ref = np.asarray(ref)
                    res.bit_equal_to_host.append(bool(got.tobytes() == ref.tobytes()))
                    res.max_abs_vs_host.append(float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))))
                    res.max_abs_vs_expected.append(
                        float(np.max(np.abs(got.astype(np.float64) - want.to_array().astype(np.float64)))))
                results.append(res)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", action="append", required=True, help="runner folder (runner.json) or binary")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("bundles", nargs="+", type=Path)
    args = ap.parse_args(argv)
    try:
        runners = {}
        for spec in args.runner:
            r = load_runner(spec)
            runners[f"{r.arch}:{r.binary.parent.name}"] = r
        missing = [str(b) for b in args.bundles if not b.is_file()]
        if missing:
            raise FileNotFoundError(f"no such bundle: {', '.join(missing)}")
    except (OSError, ValueError, KeyError) as exc:
        print(f"compare_runner_numerics: {exc}", file=sys.stderr)
        return 2
    results = []
    for b in args.bundles:
        try:
            results += compare(b, runners, args.timeout)
        except (RuntimeError, ValueError, OSError) as exc:
            results.append(CaseResult(b.stem, "host", -1, -1, 0.0, None, error=f"{type(exc).__name__}: {exc}"))
    json.dump([asdict(r) for r in results], sys.stdout, indent=1)
    print()
    bad = [r for r in results if r.error or r.exit_status not in (0, 1)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
