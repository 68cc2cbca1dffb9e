"""host:// target on the real runtime: every zoo model and dtype passes, crashes
and hangs of the runtime are contained, nothing is left running."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bundlerun.bundles.bpte import read_bundle
from bundlerun.bundles.errors import BundleError
from bundlerun.runner.session import RunRequest, execute_run
from bundlerun.targets.base import CaseStatus, RunOptions
from proc_helpers import TAG_VAR, new_tag, tagged

ZOO = ["mlp", "tiny-cnn", "mobile-net", "tiny-transformer", "tiny-gru"]
MATRIX = [(m, d, "host://xnnpack") for m in ZOO for d in ("fp32", "fp16", "int8")] + [
    (m, "fp32", "host://portable") for m in ZOO
]


@pytest.mark.parametrize("model,dtype,target", MATRIX, ids=[f"{m}-{d}-{t.split('//')[1]}" for m, d, t in MATRIX])
def test_zoo_passes_on_host(bundle_cache, tmp_path, model, dtype, target):
    path = bundle_cache(model, dtype=dtype, cases=4, target=target)
    report = execute_run(RunRequest(bundle_path=path, target=target, report_dir=tmp_path)).to_json()
    assert report["summary"]["verdict"] == "PASS", [
        (c["case"], o["name"], o["failed"]) for c in report["cases"] for o in c["outputs"] if o["verdict"] != "PASS"
    ]
    assert report["summary"]["cases"] == 4
    out = report["cases"][0]["outputs"][0]
    stats = out["stats"]
    # a real comparison happened: finite error statistics and non-trivial reference values
    assert stats["reference_stats"]["numel"] > 0 and stats["error_max"] is not None
    assert out["expected"]["dtype"] == ("float16" if dtype == "fp16" else "float32")
    if dtype == "int8":
        assert out["criteria"]["scale"] and out["criteria"]["sqnr_min_db"]
        assert 20 <= stats["sqnr"] < 90  # quantized, so not bit-exact with the float reference
    assert (tmp_path / "report.json").is_file()


def test_every_case_runs_once_program_loaded_once(bundle_cache, tmp_path):
    from bundlerun.targets import open_target

    path = bundle_cache("mlp", cases=6)
    bundle = read_bundle(path)
    run = open_target("host://xnnpack").run(bundle, path, RunOptions(work_dir=tmp_path))
    assert [(c.method, c.case_index) for c in run.cases] == [("forward", i) for i in range(6)]
    assert all(c.status == CaseStatus.OK for c in run.cases)
    assert len(list(tmp_path.glob("host-runtime-*.log"))) == 1  # one child process, one load
    # outputs differ per case: the case's own inputs were used
    assert len({c.outputs[0].data for c in run.cases}) == 6


def test_the_judge_is_made_while_the_worker_starts(bundle_cache, tmp_path):
    # RunOptions.meanwhile from targets/workers/supervisor.py: the session's Judging (runner/session.py) is made
    # after the worker is spawned and before its first result, not before the spawn; the run judged as ever
    path = bundle_cache("mlp", cases=3)
    events: list[str] = []
    req = RunRequest(bundle_path=path, target="host://xnnpack", report_dir=tmp_path / "r",
                     progress=lambda result: events.append(f"result {result.case_index}"))
    import subprocess as sp

    from bundlerun.runner import session

    real_popen, real_ready = sp.Popen, session.Judging.ready

    def popen(argv, *a, **k):
        events.append("spawn")
        return real_popen(argv, *a, **k)

    def ready(self):
        if self.ctx is None:  # made on the first result (the session's fallback) or before it (meanwhile)?
            frame, callers = sys._getframe(1), set()
            while frame is not None:
                callers.add(frame.f_code.co_name)
                frame = frame.f_back
            events.append("judge made on a result" if "progress" in callers else "judge made")
        return real_ready(self)

    sp.Popen, session.Judging.ready = popen, ready
    try:
        report = execute_run(req)
    finally:
        sp.Popen, session.Judging.ready = real_popen, real_ready
    assert events[:3] == ["spawn", "judge made", "result 0"], events
    assert report.summary.verdict == "PASS" and len(report.cases) == 3


def test_crash_and_hang_are_contained(bundle_cache, tmp_path, monkeypatch):
    path = bundle_cache("mlp", cases=5)
    monkeypatch.setenv("BUNDLERUN_FAULT", "crash@forward:1;hang@forward:3")
    tag = new_tag()
    monkeypatch.setenv(TAG_VAR, tag)
    report = execute_run(RunRequest(bundle_path=path, target="host://xnnpack", report_dir=tmp_path,
                                    case_timeout_s=8)).to_json()
    verdicts = [c["verdict"] for c in report["cases"]]
    assert verdicts == ["PASS", "ERROR", "PASS", "TIMEOUT", "PASS"]
    crash = report["cases"][1]
    assert crash["error_kind"] == "crash" and "SIGSEGV" in crash["error"]
    assert report["cases"][3]["error_kind"] == "host-timeout"
    assert report["summary"]["exit_code"] == 2
    assert tagged(tag, b"bundlerun.targets.workers.host") == []  # crashed, hung and finished workers all reaped


def test_bundle_inconsistent_with_program_is_bad_input(bundle_cache, tmp_path):
    from bundlerun.bundles.bpte import write_bundle

    bundle = read_bundle(bundle_cache("mlp", cases=2))
    for case in bundle.suite("forward").test_cases:
        out = case.expected_outputs[0]
        out.sizes, out.data = [1, 5], out.data[: 5 * 4]
    bad = write_bundle(bundle, tmp_path / "bad.bpte")
    # refused when read, before anything runs (bundles/consistency.py reads the program's own outputs)
    with pytest.raises(BundleError, match=r"expected output 0 is a float32\[1, 5\] tensor, but the program returns a float32\[1, 10\]"):
        execute_run(RunRequest(bundle_path=bad, target="host://xnnpack", report_dir=tmp_path / "r"))
    assert not (tmp_path / "r" / "report.json").exists()


def test_the_worker_loads_the_runtime_without_importing_exir():
    """The host worker imports ExecuTorch's runtime extension (`pybindings._C`) without `executorch.exir`,
    which portable_lib drags in for one warning class (~4 s of every worker start on 2 cores), and gets the
    same runtime: the same registered backends and operators as portable_lib's, in a fresh process each."""
    probe = ("import json, sys\n"
             "from bundlerun.targets.workers.host import _quiet_imports\n"
             "_, rt = _quiet_imports()\n"
             "print(json.dumps({'exir': sorted(m for m in sys.modules if m.startswith('executorch.exir')),\n"
             "                  'backends': sorted(rt._get_registered_backend_names()),\n"
             "                  'ops': len(rt._get_operator_names())}))\n")
    reference = ("import json\nimport executorch.kernels.quantized\n"
                 "from executorch.extension.pybindings import portable_lib as rt\n"
                 "print(json.dumps({'backends': sorted(rt._get_registered_backend_names()),\n"
                 "                  'ops': len(rt._get_operator_names())}))\n")
    ours, theirs = (json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                              timeout=300, check=True).stdout.strip().splitlines()[-1])
                    for code in (probe, reference))
    assert ours.pop("exir") == []
    assert "XnnpackBackend" in ours["backends"] and ours["ops"] > 100
    assert ours == theirs
