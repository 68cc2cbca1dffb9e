"""Realistic JSON reports for the report/history/regression tests.

Reports are produced by the real judge (runner.judging.judge) from a real in-memory
bundle (expected outputs + manifest criteria) and target results whose outputs
are the expected ones plus controlled noise, so every statistic in them is
computed by the code a user runs. Only the program bytes are a stub: nothing
here executes the program.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite, write_bundle
from bundlerun.bundles.manifest import Criteria, Manifest, MethodManifest, OutputSpec, TensorSpec
from bundlerun.runner.judging.judge import judge_run, summarize
from bundlerun.targets.base import CaseResult, CaseStatus, RawTensor, TargetRun

STUB_PROGRAM = b"\x00\x00\x00\x00ET12" + b"\x00" * 56


def make_bundle(cases: int = 4, shape=(1, 10), seed: int = 0, model: str = "mlp", dtype: str = "fp32",
                criteria: Criteria | None = None, dataset: dict | None = None) -> Bundle:
    rng = np.random.default_rng(seed)
    crit = criteria or Criteria(atol=1e-3, rtol=1e-3)
    tcs = []
    for _ in range(cases):
        x = rng.standard_normal((1, 32)).astype(np.float32)
        y = rng.standard_normal(shape).astype(np.float32)
        tcs.append(BundledTestCase([BundledValue.from_array(x)], [BundledValue.from_array(y)]))
    manifest = Manifest(
        model={"id": model, "source": "zoo", "description": ""},
        build={"backend": "xnnpack", "target": "host://xnnpack", "dtype": dtype, "reference": "eager-fp32", "seed": seed},
        versions={"bundlerun": "0.1.0", "torch": "2.13.0", "executorch": "1.5.1"},
        methods={"forward": MethodManifest("forward", [TensorSpec("in0", "float32", [1, 32])],
                                           [OutputSpec("out0", "float32", list(shape), crit)])},
        dataset=dataset,
    )
    return Bundle(program=STUB_PROGRAM, method_test_suites=[MethodTestSuite("forward", tcs)], manifest_json=manifest.to_dict())


def target_run(bundle: Bundle, noise: float = 1e-5, seed: int = 1, errors: dict[int, str] | None = None,
               outputs: dict[int, np.ndarray] | None = None) -> TargetRun:
    """Expected + uniform noise of amplitude `noise`; `errors` = {case: "error"|"timeout"|"skip"}."""
    rng = np.random.default_rng(seed)
    results = []
    for i, case in enumerate(bundle.suite("forward").test_cases):
        kind = (errors or {}).get(i)
        if kind:
            status = {"error": CaseStatus.ERROR, "timeout": CaseStatus.TIMEOUT, "skip": CaseStatus.SKIP}[kind]
            results.append(CaseResult("forward", i, status, error=f"case {i}: runtime {kind} (exit -11)",
                                      error_kind={"error": "crash", "timeout": "host-timeout", "skip": None}[kind],
                                      log_excerpt=["E [executorch:method.cpp:1 execute()] \x1b[31mfault\x1b[0m\x04"]))
            continue
        exp = case.expected_outputs[0].to_array()
        act = outputs[i] if outputs and i in outputs else exp + rng.uniform(-noise, noise, exp.shape).astype(np.float32)
        act = np.ascontiguousarray(act.astype(np.float32))
        results.append(CaseResult("forward", i, CaseStatus.OK, [RawTensor(st.FLOAT, list(act.shape), act.tobytes())],
                                  elapsed_s=0.002))
    return TargetRun("host://xnnpack", results, info={"runtime": "test"})


def make_report(bundle: Bundle, run: TargetRun, bundle_path: Path | None = None, label: str | None = None,
                dataset: dict | None = None, started: str | None = None) -> dict[str, Any]:
    cases, warnings = judge_run(bundle, run)
    m = bundle.manifest_json or {}
    now = started or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {
        "schema": "bundlerun.report/1",
        "tool": {"name": "bundlerun", "version": "0.1.0"},
        "run": {"id": uuid.uuid4().hex, "label": label, "started": now, "finished": now, "duration_s": 0.5,
                "command": ["bundlerun", "run"], "host": {"machine": "x86_64", "python": "3.11"}},
        "bundle": {"path": str(bundle_path or "model.bpte"), "sha256": "ab" * 32, "size": 1234, "has_manifest": True,
                   "model": m.get("model", {}).get("id"), "backend": m.get("build", {}).get("backend"),
                   "dtype": m.get("build", {}).get("dtype"), "built_for": "host://xnnpack", "reference": "eager-fp32",
                   "quantization": None, "seed": 0, "versions": m.get("versions", {})},
        "target": {"url": run.target, "info": run.info, "logs": {}, "setup_s": 0.1},
        "overrides": [],
        "warnings": warnings,
        "summary": summarize(cases).to_json(),  # report dicts as read from a report.json of schema /1
        "cases": [c.to_json() for c in cases],
        "dataset": dataset,
    }


def quick_report(noise: float = 1e-5, label: str | None = None, model: str = "mlp", cases: int = 4, seed: int = 0,
                 errors: dict[int, str] | None = None) -> dict[str, Any]:
    b = make_bundle(cases=cases, model=model, seed=seed)
    return make_report(b, target_run(b, noise=noise, errors=errors), label=label)


def saved_outputs(run: TargetRun) -> dict[str, np.ndarray]:
    return {f"{c.method}/{c.case_index}/{j}": r.to_array() for c in run.cases for j, r in enumerate(c.outputs)}


def write_stub_bundle(bundle: Bundle, path: Path) -> Path:
    return write_bundle(bundle, path)
