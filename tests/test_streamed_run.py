"""A run holds one case's outputs at a time (issue 36, "cost that stays bounded"): each case is
judged as the target hands it over, its raw outputs go into outputs.npz as they come and are let
go; a run whose outputs would not fit in the report is said at build time. Real runtime
(host://portable, the pybindings in bundlerun's worker), no test doubles. The cost itself is
measured by bench/bench_cost.py, not timed here."""

from __future__ import annotations

import numpy as np

from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite
from bundlerun.bundles.limits import MAX_REPORT_BYTES, MAX_REPORT_OUTPUTS_BYTES
from bundlerun.bundles.report_fit import OUTPUT_RECORD_BYTES, bundle_report_fit, report_fit
from bundlerun.runner import session as session_mod
from bundlerun.runner.history.saved_outputs import Expect, read_outputs
from bundlerun.runner.session import RunRequest, execute_run


def test_each_case_is_let_go_once_judged_and_outputs_npz_holds_every_case(bundle_cache, tmp_path):
    """The judge-ahead thread (runner/judging/ahead.py) saves and drops each case's bytes once it judged
    it; nothing keeps them to the end of the run."""
    bundle = bundle_cache("mlp", backend="portable", cases=6, target="host://portable")
    seen = []
    report = execute_run(RunRequest(bundle_path=bundle, target="host://portable", report_dir=tmp_path / "r",
                                    save_outputs=True, progress=seen.append))
    assert len(seen) == 6 and all(r.outputs == [] for r in seen)  # handed over, judged, let go
    assert report.summary.verdict == "PASS" and [c.case for c in report.cases] == list(range(6))
    assert all(o.stats is not None and o.stats.sqnr is not None for c in report.cases for o in c.outputs)  # from the bytes
    saved = read_outputs(report.outputs_file, {f"forward/{i}/0": Expect(np.dtype("float32"), 1 << 20)
                                               for i in range(6)})
    assert sorted(saved) == sorted(f"forward/{i}/0" for i in range(6))
    assert not list((tmp_path / "r").glob(".outputs.npz.*"))  # the temp file was renamed into place


def test_save_outputs_over_the_report_bound_keeps_none_and_says_so(bundle_cache, tmp_path, monkeypatch):
    bundle = bundle_cache("mlp", backend="portable", cases=6, target="host://portable")
    monkeypatch.setattr(session_mod, "MAX_REPORT_OUTPUTS_BYTES", 16)
    report = execute_run(RunRequest(bundle_path=bundle, target="host://portable", report_dir=tmp_path / "r",
                                    save_outputs=True))
    assert report.summary.verdict == "PASS" and report.outputs_file is None
    assert any("--save-outputs" in w and "not written" in w for w in report.warnings)
    assert not (tmp_path / "r" / "outputs.npz").exists() and not list((tmp_path / "r").glob(".outputs.npz.*"))


def _bundle(cases: int, output_bytes: int, outputs: int = 1) -> Bundle:
    value = BundledValue(kind="tensor", scalar_type=6, sizes=[output_bytes // 4], data=b"\0" * output_bytes)
    case = BundledTestCase(inputs=[], expected_outputs=[value] * outputs)
    return Bundle(program=b"", method_test_suites=[MethodTestSuite("forward", [case] * cases)])


def test_a_run_that_would_not_fit_in_the_report_is_said_at_build_time():
    assert bundle_report_fit(_bundle(4, 1 << 20)) == []
    big = bundle_report_fit(_bundle(2, MAX_REPORT_OUTPUTS_BYTES // 2 + 4))  # dl3-sized outputs, many cases
    assert len(big) == 1 and "--save-outputs" in big[0] and f"{MAX_REPORT_OUTPUTS_BYTES >> 20} MiB" in big[0]
    many = report_fit(0, MAX_REPORT_BYTES // OUTPUT_RECORD_BYTES + 1)
    assert len(many) == 1 and "report.json" in many[0]
    assert report_fit(0, MAX_REPORT_BYTES // OUTPUT_RECORD_BYTES) == []
