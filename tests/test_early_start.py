"""`bundlerun run`'s early start (runner/session.py read_for_run, TargetSpec.prestart): a served
runner spawned on the bundle's bytes while the host reads and verifies them, adopted only for the
bundle verified from those bytes, killed and reaped otherwise; and the judging made ready on a thread
meanwhile (runner/preload.py, Judging.offer).

The qemu-user tests run the real cross-built aarch64 executor_runner (bundlerun's served-bundle patch,
ExecuTorch's LLM custom ops) under the real qemu-aarch64, on a bundle made with ExecuTorch's own
BundledProgram API (tests/fixtures/llama_export.py). No double anywhere."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bundlerun.bundles.bpte import method_names, read_bundle_bytes
from bundlerun.bundles.errors import BundleError
from tests.conftest import run_cli
from tests.fixtures.llama_export import cached_llama_bundle
from tests.test_qemu_user_llm import STEPS, URL, llm_runner  # noqa: F401  (the fixture)


def _runner_processes(marker: str) -> list[int]:
    """Live processes whose command line names `marker` (a run's own folder)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if marker.encode() in cmdline or marker in cwd:
            found.append(int(pid))
    return found


# ------------------------------------------------------------------------------------------ the peek


def test_method_names_reads_the_suites_of_a_real_bundle(bundle_cache):
    path = bundle_cache("mlp", cases=2)
    assert method_names(read_bundle_bytes(path)) == ["forward"]


def test_method_names_of_damaged_bytes_is_a_bundle_error_or_names(bundle_cache):
    # the peek reads untrusted bytes before they are verified: any damage is a BundleError (the run then
    # reads the bundle as ever and says what is wrong), never another exception
    data = read_bundle_bytes(bundle_cache("mlp", cases=2))
    rng = random.Random(53)
    tried = 0
    for _ in range(400):
        damaged = bytearray(data)
        kind = rng.randrange(3)
        if kind == 0:
            damaged = damaged[:rng.randrange(len(damaged))]
        elif kind == 1:
            for _ in range(rng.randint(1, 8)):
                damaged[rng.randrange(min(len(damaged), 256))] = rng.randrange(256)  # the tables' offsets
        else:
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        try:
            names = method_names(bytes(damaged))
        except BundleError:
            tried += 1
            continue
        assert isinstance(names, list) and all(isinstance(n, str) for n in names)
    assert tried > 50  # the damage did reach the reader's checks
    with pytest.raises(BundleError):
        method_names(b"")
    with pytest.raises(BundleError):
        method_names(b"\x00" * 64)


# ------------------------------------------------------------------------------ the judging's thread


def test_results_offered_while_the_judging_prepares_are_held_then_judged_ahead(bundle_cache, tmp_path):
    import threading

    from bundlerun.bundles.on_file import read_bundle_on_file
    from bundlerun.runner.session import Judging, RunRequest
    from bundlerun.targets.base import CaseResult, CaseStatus

    path = bundle_cache("mlp", cases=3)
    bundle = read_bundle_on_file(path)
    req = RunRequest(bundle_path=path, target="host://xnnpack", report_dir=tmp_path / "r")
    judging = Judging(bundle, req, [])
    judging.release = lambda result, handed: False
    gate = threading.Event()
    judging._prep = threading.Thread(target=gate.wait, daemon=True)  # meanwhile's thread, still at work
    judging._prep.start()
    results = [CaseResult("forward", i, CaseStatus.OK, outputs=[]) for i in range(3)]
    judging.offer(results[0])
    judging.offer(results[1])
    assert judging.ctx is None and judging._held == results[:2]  # held: the loop did not wait for the thread
    gate.set()
    judging._prep.join()
    judging.offer(results[2])
    assert judging.ctx is not None and judging._held == []
    assert judging.ahead is not None and sorted(job[0].case_index for job in judging.ahead._jobs.values()) == [0, 1, 2]
    judging.close()


def test_meanwhile_makes_the_judge_on_a_thread_with_every_import_it_needs(bundle_cache, tmp_path):
    # a fresh interpreter: the judging's and the report formats' modules are not imported before meanwhile
    path = bundle_cache("mlp", cases=2)
    code = (
        "import sys, threading\n"
        "from bundlerun.bundles.on_file import read_bundle_on_file\n"
        "from bundlerun.runner.session import Judging, RunRequest\n"
        f"b = read_bundle_on_file({str(path)!r})\n"
        f"j = Judging(b, RunRequest(bundle_path={str(path)!r}, target='host://xnnpack', report_dir='r'), [])\n"
        "before = [m for m in ('numpy', 'bundlerun.runner.judging.judge', 'bundlerun.runner.writers.html') "
        "if m in sys.modules]\n"
        "j.meanwhile()\n"
        "name = j._prep.name\n"
        "j._prep.join()\n"
        "after = [m for m in ('numpy', 'bundlerun.runner.judging.judge', 'bundlerun.runner.writers.html') "
        "if m in sys.modules]\n"
        "print('RESULT', before, name, j.ctx is not None, after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "RESULT [] judging-prepare True ['numpy', 'bundlerun.runner.judging.judge', " \
           "'bundlerun.runner.writers.html']" in out.stdout, out.stdout + out.stderr


# ------------------------------------------------------------------------- qemu-user, the real runner

SPAWN_BEFORE_VERIFIED = """
import subprocess, sys
events = []
real = subprocess.Popen
import bundlerun.runner.session as session
import bundlerun.targets.et_runner.server as server
verify = session.read_bundle_on_file
def read(*a, **k):
    events.append("verify")
    bundle = verify(*a, **k)
    events.append("verified")
    return bundle
HEAVY = ("bundlerun.bundles.bpte", "bundlerun.bundles.manifest", "bundlerun.bundles.on_file", "numpy")
def spawn(argv, *a, **k):
    if "--server_mode" in argv:
        events.append("spawn")
        events.append(f"imported {[m for m in HEAVY if m in sys.modules]}")
    return real(argv, *a, **k)
send = server.RunnerServer.send
def trigger(self, case=None):
    if case is not None and case < 2:
        events.append(f"trigger {case}")
    return send(self, case)
subprocess.Popen, session.read_bundle_on_file, server.RunnerServer.send = spawn, read, trigger
from bundlerun.runner.cli import main
try:
    main(sys.argv[1:])
finally:
    print("EVENTS", events, file=sys.stderr)
"""


@pytest.mark.slow
def test_the_runner_starts_before_the_bundle_is_verified_and_serves_it(llm_runner, tmp_path):  # noqa: F811
    fixture = cached_llama_bundle("fp32")
    out = subprocess.run([sys.executable, "-c", SPAWN_BEFORE_VERIFIED, "run", str(fixture / "llama.bpte"), "--target",
                          URL, "--report", str(tmp_path / "r"), "--no-history"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    events = eval(out.stderr.split("EVENTS", 1)[1].strip().splitlines()[0])
    # one spawn, before the bundle's checks ended (and before their modules were imported: bundles/bpte_bytes.py),
    # and the triggers after them: the runner was adopted
    assert events == ["spawn", "imported []", "verify", "verified", "trigger 0", "trigger 1"], events
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["summary"]["verdict"] == "PASS" and len(report["cases"]) == STEPS
    served = tmp_path / "r" / "work" / "qemu-user" / "forward-served"
    assert sorted(p.name for p in served.glob("server-*.log")) == ["server-1.log"]
    assert (served / "model.bpte").read_bytes() == (fixture / "llama.bpte").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["appended", "manifest"])
def test_a_bundle_that_fails_its_checks_kills_the_started_runner(llm_runner, tmp_path, damage):  # noqa: F811
    # the peek finds the one method and the runner starts; the full read refuses the bundle: one line,
    # exit 2, the runner killed and reaped, and no report folder made of it
    from dataclasses import replace

    from bundlerun.bundles.bpte import read_bundle, serialize_bundle

    path = cached_llama_bundle("fp32") / "llama.bpte"
    if damage == "appended":
        data = path.read_bytes() + b"\x01" * 4096  # bytes after the bundle's data (docs/security.md)
    else:  # a manifest no bundlerun version wrote: refused by the manifest's checks, after the peek
        data = serialize_bundle(replace(read_bundle(path), manifest_json={"schema_version": 999, "methods": []}))
    bad = tmp_path / "bad.bpte"
    bad.write_bytes(data)
    assert method_names(data) == ["forward"]  # what the early start sees
    report = tmp_path / "never"
    res = run_cli("run", str(bad), "--target", URL, "--report", str(report), "--no-history", timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(bad) in lines[0], res.stderr
    assert not report.exists()
    assert _runner_processes(str(report)) == []


@pytest.mark.slow
def test_a_stop_while_the_bundle_is_verified_kills_and_reaps_the_started_runner(llm_runner, tmp_path, monkeypatch):  # noqa: F811
    from bundlerun.runner import session
    from bundlerun.runner.session import RunRequest, read_for_run

    fixture = cached_llama_bundle("fp32")
    started: list = []

    def stop(*a, **k):
        started.extend(_runner_processes(str(tmp_path / "r")))
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "read_bundle_on_file", stop)
    req = RunRequest(bundle_path=fixture / "llama.bpte", target=URL, report_dir=tmp_path / "r")
    with pytest.raises(KeyboardInterrupt):
        read_for_run(req, None)
    assert started, "the runner had started when the stop came"
    assert _runner_processes(str(tmp_path / "r")) == []
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_bundle_changed_in_memory_is_not_served_by_the_runner_started_on_its_file(llm_runner, tmp_path):  # noqa: F811
    from bundlerun.runner.session import RunRequest, execute_run, read_for_run

    fixture = cached_llama_bundle("fp32")
    req = RunRequest(bundle_path=fixture / "llama.bpte", target=URL, report_dir=tmp_path / "r")
    bundle, opened = read_for_run(req, None)
    assert opened is not None and opened[0]._prestarted is not None
    early = opened[0]._prestarted.server.proc
    bundle.method_test_suites[0].test_cases.pop()  # no longer the bundle the runner was given
    report = execute_run(req, bundle=bundle, write=False, opened=opened)
    assert early.returncode == -9  # killed, not adopted
    assert report.summary.verdict == "PASS" and len(report.cases) == STEPS - 1
    served = tmp_path / "r" / "work" / "qemu-user" / "forward-served"
    assert sorted(p.name for p in served.glob("server-*.log")) == ["server-1.log"]  # the run's own server
    assert _runner_processes(str(tmp_path / "r")) == []


@pytest.mark.slow
def test_qemu_user_serves_with_the_lowered_switch_interval(llm_runner, tmp_path, monkeypatch):  # noqa: F811
    # targets/gil_handoff.py: the judge-ahead thread must not hold the GIL past a step's DONE line for
    # CPython's default 5 ms; lowered while the lane serves, restored after
    from bundlerun.runner.session import RunRequest, execute_run, read_for_run
    from bundlerun.targets.et_runner import server
    from bundlerun.targets.gil_handoff import SERVING_SWITCH_INTERVAL_S

    seen: list[float] = []
    send = server.RunnerServer.send

    def spy(self, case=None):
        seen.append(sys.getswitchinterval())
        return send(self, case)

    monkeypatch.setattr(server.RunnerServer, "send", spy)
    before = sys.getswitchinterval()
    req = RunRequest(bundle_path=cached_llama_bundle("fp32") / "llama.bpte", target=URL, report_dir=tmp_path / "r")
    bundle, opened = read_for_run(req, None)
    report = execute_run(req, bundle=bundle, write=False, opened=opened)
    assert report.summary.verdict == "PASS" and len(seen) == STEPS
    assert all(interval == pytest.approx(min(before, SERVING_SWITCH_INTERVAL_S), abs=2e-6) for interval in seen), seen
    assert sys.getswitchinterval() == before
