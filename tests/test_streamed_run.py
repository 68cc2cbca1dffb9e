"""A run holds one case's outputs at a time (issue 36, "cost that stays bounded"): each case is
judged as the target hands it over, its raw outputs go into outputs.npz as they come and are let
go; a run whose outputs would not fit in the report is said at build time. Real runtime
(host://portable, the pybindings in bundlerun's worker), no test doubles. The cost itself is
measured by bench/bench_cost.py, not timed here."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite
from bundlerun.bundles.manifest import Criteria, Manifest, MethodManifest, OutputSpec, TensorSpec
from bundlerun.bundles.manifest_records import DatasetInfo
from bundlerun.bundles.limits import MAX_REPORT_BYTES, MAX_REPORT_OUTPUTS_BYTES
from bundlerun.bundles.report_fit import OUTPUT_RECORD_BYTES, bundle_report_fit, report_fit
from bundlerun.runner import session as session_mod
from bundlerun.runner.history.saved_outputs import Expect, read_outputs
from bundlerun.runner.report.model import Report, read_report
from bundlerun.runner.report.record import OutputsWriter
from bundlerun.runner.session import CaseStream, RunRequest, execute_run
from bundlerun.targets.base import CaseResult, CaseStatus, RawTensor, TargetRun

ROOT = Path(__file__).resolve().parents[1]


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


def _raw(values: list[float]) -> RawTensor:
    a = np.asarray(values, np.float32)
    return RawTensor(st.FLOAT, list(a.shape), a.tobytes())


def test_outputs_npz_keeps_the_outputs_of_the_results_the_run_ends_with(tmp_path):
    """A case handed over twice (a lane's retry gives a new result) is saved from the last one; a case
    that ended without outputs keeps none of an earlier hand-over's; no temp file stays."""
    writer = OutputsWriter(tmp_path)
    first, retried = CaseResult("forward", 0, CaseStatus.OK, [_raw([1, 2])]), CaseResult("forward", 0, CaseStatus.OK, [_raw([3, 4])])
    gone, ended = CaseResult("forward", 1, CaseStatus.OK, [_raw([5, 6])]), CaseResult("forward", 1, CaseStatus.ERROR)
    kept = CaseResult("forward", 2, CaseStatus.OK, [_raw([7, 8])])
    for r in (first, gone, kept, retried):
        writer.add(r)
    first.outputs = gone.outputs = kept.outputs = []  # let go, as CaseStream.release does
    path = writer.close([retried, ended, kept])
    saved = read_outputs(path, {f"forward/{i}/0": Expect(np.dtype("float32"), 64) for i in range(3)})
    assert sorted(saved) == ["forward/0/0", "forward/2/0"]
    assert saved["forward/0/0"].tolist() == [3, 4] and saved["forward/2/0"].tolist() == [7, 8]
    assert [p.name for p in tmp_path.iterdir()] == ["outputs.npz"]


def _dataset_bundle(cases: int) -> Bundle:
    logits = [BundledValue.from_array(np.eye(4, dtype=np.float32)[i % 4][None]) for i in range(cases)]
    manifest = Manifest(
        model={"id": "mlp", "source": "test", "description": ""},
        build={"backend": "portable", "target": "host://portable", "dtype": "fp32", "reference": "eager-fp32"},
        versions={"bundlerun": "0.1.0"},
        methods={"forward": MethodManifest("forward", [TensorSpec("x", "float32", [1, 4])],
                                           [OutputSpec("out0", "float32", [1, 4], Criteria(atol=1e-3))])},
        dataset=DatasetInfo(name="four", labels=[i % 4 for i in range(cases)], num_classes=4))
    suite = MethodTestSuite("forward", [BundledTestCase([BundledValue.from_array(np.zeros((1, 4), np.float32))], [v])
                                        for v in logits])
    return Bundle(program=b"", method_test_suites=[suite], manifest_json=manifest.to_dict())


def test_dataset_top1_reads_output_0_of_the_final_results_after_their_bytes_are_let_go(tmp_path):
    """runner/judging/accuracy.py's top-k reads output 0 of each case: kept from the released result
    while it is the run's, the new result's own when the lane replaced it, none when it ended without."""
    bundle = _dataset_bundle(3)
    req = RunRequest(bundle_path=tmp_path / "b.bpte", target="host://portable", report_dir=tmp_path / "r", save_outputs=True)
    stream = CaseStream(bundle, req, [])
    right = [CaseResult("forward", i, CaseStatus.OK, [_raw(np.eye(4)[i % 4].tolist())]) for i in range(3)]
    for r in right:
        assert stream.release(r, tuple(map(id, r.outputs))) and r.outputs == []
    swapped = CaseResult("forward", 0, CaseStatus.OK, [_raw([0, 0, 0, 1])])  # case 0 handed over again: wrong now
    replaced = right[2].outputs = [_raw([1, 0, 0, 0])]
    assert not stream.release(right[2], ()), "outputs the lane replaced after the hand-over are not let go"
    assert right[2].outputs is replaced
    run = TargetRun("host://portable", [swapped, CaseResult("forward", 1, CaseStatus.ERROR), right[2]])
    got = stream.dataset_outputs(run)
    assert sorted(got) == ["forward/0/0", "forward/2/0"]
    assert got["forward/0/0"].tolist() == [0, 0, 0, 1] and got["forward/2/0"].tolist() == [1, 0, 0, 0]
    report = Report(summary=None, cases=[], warnings=[])
    stream.save(report, run, req.report_dir)
    saved = read_outputs(report.outputs_file, {f"forward/{i}/0": Expect(np.dtype("float32"), 64) for i in range(3)})
    assert {k: v.tolist() for k, v in saved.items()} == {"forward/0/0": [0, 0, 0, 1], "forward/2/0": [1, 0, 0, 0]}


def test_an_error_mid_run_leaves_no_temp_outputs_file(bundle_cache, tmp_path):
    bundle = bundle_cache("mlp", backend="portable", cases=6, target="host://portable")

    def fail(result):
        if result.case_index == 2:
            raise RuntimeError("the progress display broke")

    with pytest.raises(RuntimeError, match="display broke"):
        execute_run(RunRequest(bundle_path=bundle, target="host://portable", report_dir=tmp_path / "r",
                               save_outputs=True, progress=fail))
    assert not list((tmp_path / "r").glob(".outputs.npz.*")) and not (tmp_path / "r" / "outputs.npz").exists()


def test_ctrl_c_mid_run_keeps_the_finished_cases_outputs_and_no_temp_file(bundle_cache, tmp_path):
    """A real SIGINT to `bundlerun run --save-outputs` while the runtime hangs in case 3 (the host worker's
    BUNDLERUN_FAULT): report.json says interrupted, outputs.npz holds cases 0-2, no temp file stays."""
    bundle = bundle_cache("mlp", backend="portable", cases=5, target="host://portable")
    report_dir = tmp_path / "r"
    env = {**os.environ, "BUNDLERUN_FAULT": "hang@forward:3", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "run", str(bundle),
                             "--target", "host://portable", "--report", str(report_dir), "--save-outputs",
                             "--no-history", "--timeout", "300"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not any("hanging before forward:3" in p.read_text(errors="replace")
                  for p in (report_dir / "work").glob("host-runtime-*.log")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the runtime never reached case 3"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    report = read_report(report_dir / "report.json")
    # the CLI may not have taken every case the runtime finished before the hang when the stop comes (a loaded
    # machine): each case is PASS or not finished, never judged from outputs it let go (ERROR, 0 outputs)
    done = [c.case for c in report.cases if c.verdict == "PASS"]
    assert report.summary.interrupted and done == list(range(len(done))) and 1 <= len(done) <= 3, \
        [(c.verdict, c.error) for c in report.cases]
    assert all(c.error_kind == "interrupted" for c in report.cases[len(done):]), [c.error for c in report.cases]
    saved = read_outputs(report.outputs_file, {f"forward/{i}/0": Expect(np.dtype("float32"), 1 << 20) for i in range(5)})
    assert sorted(saved) == [f"forward/{i}/0" for i in done]
    assert not list(report_dir.glob(".outputs.npz.*"))


def test_a_disk_full_mid_run_keeps_no_outputs_npz_and_says_so(tmp_path):
    """The report folder on a real tmpfs that fills up between two cases (needs root to mount, as
    tests/test_full_disk.py): the streamed outputs.npz is given up, its temp file removed, the report
    names it with the reason, and later cases are still let go."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"this test mounts a small tmpfs and needs root: {mounted.stderr.strip()}"
    try:
        bundle = _dataset_bundle(3)
        req = RunRequest(bundle_path=tmp_path / "b.bpte", target="host://portable", report_dir=disk / "r", save_outputs=True)
        stream = CaseStream(bundle, req, [])
        results = [CaseResult("forward", i, CaseStatus.OK, [_raw(np.random.default_rng(i).random(16384).tolist())])
                   for i in range(3)]
        assert stream.release(results[0], tuple(map(id, results[0].outputs)))
        with open(disk / "filler", "wb") as fh:  # every byte left taken
            with pytest.raises(OSError) as full:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            assert full.value.errno == errno.ENOSPC
        for r in results[1:]:  # 64 KiB each: no slack of a page holds them
            assert stream.release(r, tuple(map(id, r.outputs))) and r.outputs == []
        report = Report(summary=None, cases=[], warnings=[])
        stream.save(report, TargetRun("host://portable", results), req.report_dir)
        assert report.outputs_file is None
        assert report.unwritten == [{"file": str(disk / "r" / "outputs.npz"), "error": "No space left on device"}]
        assert not list((disk / "r").iterdir())
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_the_host_worker_holds_the_bundle_once(bundle_cache):
    """targets/workers/host.py parses the file buffer the runtime keeps (PyBundledModule holds it,
    extension/pybindings/pybindings.cpp:332) as a memoryview: the program and every value are views of
    that buffer, not a second copy of the bundle, and read the same as a parse that copies."""
    from bundlerun.bundles.bpte import parse_bundle

    path = bundle_cache("mlp", backend="portable", cases=3, target="host://portable")
    buf = path.read_bytes()
    view, copy = parse_bundle(memoryview(buf), str(path)), parse_bundle(buf, str(path))
    values = [v for s in view.method_test_suites for c in s.test_cases for v in (*c.inputs, *c.expected_outputs)]
    copied = [v for s in copy.method_test_suites for c in s.test_cases for v in (*c.inputs, *c.expected_outputs)]
    assert isinstance(view.program, memoryview) and view.program.obj is buf and bytes(view.program) == copy.program
    assert len(values) == 6 and all(isinstance(v.data, memoryview) and v.data.obj is buf for v in values)
    assert all(isinstance(v.data, bytes) for v in copied)
    assert [v.to_array().tolist() for v in values] == [v.to_array().tolist() for v in copied]
    assert view.manifest_json == copy.manifest_json
