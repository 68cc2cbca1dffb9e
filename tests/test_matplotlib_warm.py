"""The HTML report's matplotlib import, started on a thread while the target runs (runner/pictures/warm.py).

Real components: the pybindings on host://portable in bundlerun's worker, matplotlib itself; no doubles.
"""

from __future__ import annotations

import subprocess
import sys

from bundlerun.runner.pictures import plots, warm
from bundlerun.runner.session import RunRequest, execute_run


def test_start_imports_matplotlib_on_a_thread_and_wait_joins_it():
    code = ("import sys, threading\n"
            "from bundlerun.runner.pictures import warm\n"
            "assert 'matplotlib.figure' not in sys.modules\n"
            "warm.start()\n"
            "names = [t.name for t in threading.enumerate()]\n"
            "warm.wait()\n"
            "print('matplotlib-import' in names, 'matplotlib.figure' in sys.modules, warm._thread.is_alive())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "False"]


def test_a_process_that_ends_before_the_import_waits_for_it_at_exit():
    # A target that refuses at once ends the run while the import runs: the interpreter's teardown with
    # that thread inside an extension's import aborted the CLI once (SIGABRT after its report was written,
    # tests/test_qnn_faults.py). The last exit hook (registered first) sees which threads are still alive.
    code = ("import atexit, sys, threading\n"
            "atexit.register(lambda: print([t.name for t in threading.enumerate() if t.is_alive() and t is not threading.main_thread()]))\n"
            "from bundlerun.runner.pictures import warm\n"
            "warm.start()\n"
            "raise SystemExit(2)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[]"]  # nothing of ours still running


def test_every_plot_waits_for_the_import_thread_before_its_own(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(warm, "wait", lambda: order.append("wait"))
    real = plots._figure
    monkeypatch.setattr(plots, "_figure", lambda *a, **k: (order.append("figure"), real(*a, **k))[1])
    png = plots.case_strip([1.0, float("inf"), None], ["PASS", "PASS", "ERROR"], "out0", "SQNR")
    assert png.startswith(b"\x89PNG")
    assert order[0] == "wait" and "figure" in order  # case_strip imports matplotlib's transforms first


def test_a_run_starts_the_import_before_its_target_runs(bundle_cache, tmp_path, monkeypatch):
    bundle = bundle_cache("mlp", backend="portable", cases=2, target="host://portable")
    events: list[str] = []
    monkeypatch.setattr(warm, "start", lambda: events.append("start"))
    from bundlerun.targets import host

    real_run = host.HostTarget.run

    def run(self, *a, **k):
        events.append("target")
        return real_run(self, *a, **k)

    monkeypatch.setattr(host.HostTarget, "run", run)
    report = execute_run(RunRequest(bundle_path=bundle, target="host://portable", report_dir=tmp_path / "r"))
    assert report.summary.verdict == "PASS"
    assert events == ["start", "target"]
    assert (tmp_path / "r" / "report.json").exists()


def test_only_a_run_with_a_case_outside_an_llm_sequence_imports_it_ahead():
    from types import SimpleNamespace

    from bundlerun.runner.session import _plots_cases

    seq = {"name": "seq0", "method": "forward", "stateful": True, "mode": "teacher-forced",
           "steps": [{"case": 0, "kind": "prompt", "start_pos": 0, "tokens": [1, 2], "reference_next": 3}]}
    llm = SimpleNamespace(manifest={"sequences": [seq]})
    assert not _plots_cases(llm, [("forward", 0)])  # its steps are drawn without matplotlib
    assert _plots_cases(llm, [("forward", 0), ("encode", 0)])  # another method's cases get strips
    assert _plots_cases(SimpleNamespace(manifest=None), [("forward", 0)])
