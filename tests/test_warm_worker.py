"""Warm runtime workers: within one command (an open Session) the bundles share one runtime
worker per target, each bundle loaded on request; a crash or hang still costs only its case,
a bundle the runtime cannot load costs only that bundle, and closing the session (normally,
on an exception) leaves nothing running. Real runtime (host://xnnpack), real processes."""

from __future__ import annotations

import os
from proc_helpers import settled
from dataclasses import replace
from pathlib import Path

import pytest

from bundlerun.bundles.bpte import read_bundle, write_bundle
from bundlerun.runner.session import RunRequest, Session


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _host_workers() -> set[int]:
    """Live runtime workers started by this test process (others may run tests beside us)."""
    found = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if b"bundlerun.targets.workers.host" in cmd and ppid == os.getpid() and _alive(int(pid)):
                found.add(int(pid))
    return found


def _run(session: Session, path: Path, report_dir: Path, **kw) -> dict:
    return session.run(RunRequest(bundle_path=path, target="host://xnnpack", report_dir=report_dir, **kw)).to_json()


@pytest.fixture
def no_history(monkeypatch):
    monkeypatch.setenv("BUNDLERUN_HISTORY", "off")


def test_one_worker_serves_every_bundle_of_the_session(bundle_cache, tmp_path):
    paths = [bundle_cache("mlp", cases=3), bundle_cache("tiny-cnn", cases=3), bundle_cache("mlp", dtype="int8", cases=3)]
    before = _host_workers()
    with Session(no_history=True) as session:
        reports = []
        pids = []
        for i, path in enumerate(paths):
            reports.append(_run(session, path, tmp_path / f"r{i}"))
            pids.append(session.workers.pids())
        assert session.workers.started == 1
        assert len(pids[0]) == 1 and pids[0] == pids[1] == pids[2]  # the same process served all three
        worker_pid = pids[0][0]
        assert _alive(worker_pid)
    assert [r["summary"]["verdict"] for r in reports] == ["PASS"] * 3
    assert [r["target"]["info"]["worker"] for r in reports] == ["warm, started", "warm, reused", "warm, reused"]
    # each bundle ran its own program: different models, different outputs, every case judged
    assert [r["summary"]["cases"] for r in reports] == [3, 3, 3]
    assert reports[1]["bundle"]["model"] == "tiny-cnn"
    # each bundle keeps its own runtime log, written by the shared worker while it served that bundle
    for i in range(3):
        assert (tmp_path / f"r{i}" / "work" / "host-runtime-1.log").is_file()
    # the first bundle paid the import, the others only their load
    assert reports[1]["target"]["setup_s"] < reports[0]["target"]["setup_s"]
    assert not _alive(worker_pid)  # closing the session killed and reaped it
    assert _host_workers() - before == set()


def test_crash_and_hang_in_a_warm_worker_cost_only_their_case(bundle_cache, tmp_path, monkeypatch):
    a, b = bundle_cache("mlp", cases=5), bundle_cache("tiny-cnn", cases=5)
    monkeypatch.setenv("BUNDLERUN_FAULT", "crash@forward:1;hang@forward:3")
    before = _host_workers()
    with Session(no_history=True) as session:
        ra = _run(session, a, tmp_path / "a", case_timeout_s=6)
        rb = _run(session, b, tmp_path / "b", case_timeout_s=6)
        # a: initial worker, replaced after the crash and after the hang; b reuses the last one,
        # then needs two replacements of its own
        assert session.workers.started == 5
    for report in (ra, rb):
        assert [c["verdict"] for c in report["cases"]] == ["PASS", "ERROR", "PASS", "TIMEOUT", "PASS"]
        assert report["cases"][1]["error_kind"] == "crash" and "SIGSEGV" in report["cases"][1]["error"]
        assert report["cases"][3]["error_kind"] == "host-timeout"
    assert ra["target"]["info"]["worker"] == "warm, started"
    assert rb["target"]["info"]["worker"] == "warm, reused"  # the worker that finished a served b
    assert sorted(p.name for p in (tmp_path / "b" / "work").glob("host-runtime-*.log")) == [
        "host-runtime-1.log", "host-runtime-2.log", "host-runtime-3.log"]
    assert "hanging before forward:3" in (tmp_path / "b" / "work" / "host-runtime-2.log").read_text()
    assert settled(lambda: _host_workers() - before) == set()


def test_a_bundle_the_runtime_cannot_load_costs_only_that_bundle(bundle_cache, tmp_path):
    good = bundle_cache("mlp", cases=2)
    broken = tmp_path / "broken.bpte"  # a sealed bundle whose program the runtime refuses to load
    original = read_bundle(good)
    write_bundle(replace(original, program=original.program[:8] + b"\xff" * 256), broken)
    with Session(no_history=True) as session:
        bad = _run(session, broken, tmp_path / "bad")
        ok = _run(session, good, tmp_path / "ok")
        assert session.workers.started == 1  # the load failure left the worker idle, not dead
    assert [c["error_kind"] for c in bad["cases"]] == ["load-failure", "load-failure"]
    assert "could not load" in bad["cases"][0]["error"]
    assert ok["summary"]["verdict"] == "PASS" and ok["target"]["info"]["worker"] == "warm, reused"


def test_closing_on_an_exception_leaves_nothing_running(bundle_cache, tmp_path):
    path = bundle_cache("mlp", cases=2)
    before = _host_workers()
    with pytest.raises(RuntimeError, match="boom"):
        with Session(no_history=True) as session:
            _run(session, path, tmp_path / "r")
            pid = session.workers.pids()[0]
            raise RuntimeError("boom")
    assert not _alive(pid)
    assert _host_workers() - before == set()


def test_an_unopened_session_and_the_opt_out_start_one_child_per_bundle(bundle_cache, tmp_path, monkeypatch):
    path = bundle_cache("mlp", cases=2)
    report = _run(Session(no_history=True), path, tmp_path / "cold")  # never opened: no pool at all
    assert "worker" not in report["target"]["info"] and report["summary"]["verdict"] == "PASS"
    monkeypatch.setenv("BUNDLERUN_WARM_WORKER", "0")
    with Session(no_history=True) as session:
        r1 = _run(session, path, tmp_path / "o1")
        r2 = _run(session, path, tmp_path / "o2")
        assert session.workers.started == 0
    assert "worker" not in r1["target"]["info"] and "worker" not in r2["target"]["info"]
    assert r1["summary"]["verdict"] == r2["summary"]["verdict"] == "PASS"


def test_tosa_bundles_share_a_warm_walker(bundle_cache, tmp_path):
    path = bundle_cache("tiny-cnn", dtype="int8", backend="arm", cases=2, target="tosa://int", reference="quantized")
    with Session(no_history=True) as session:
        reports = [session.run(RunRequest(bundle_path=path, target="tosa://int", report_dir=tmp_path / f"t{i}"))
                   for i in range(2)]
        assert session.workers.started == 1
    assert [r.summary.verdict for r in reports] == ["PASS", "PASS"]
    assert [r.target["info"]["worker"] for r in reports] == ["warm, started", "warm, reused"]
    assert "TOSABackend" in reports[1].target["info"]["delegates"]


def test_session_keeps_targets_that_ask_for_it_and_closes_them(monkeypatch):
    """A target whose module declares keep_open is opened once per URL and settings and closed with
    the session; any other is closed as soon as its bundle releases it."""
    import bundlerun.runner.session as session_module

    opened = []

    class Target:
        def __init__(self, url):
            self.url, self.closed = url, 0
            opened.append(self)

        def close(self):
            self.closed += 1

    monkeypatch.setattr(session_module, "open_target", lambda url, config: Target(url))
    monkeypatch.setattr(session_module, "_keeps_open", lambda url: url.startswith("keep"))  # as SPEC.keep_open says
    session = Session()
    cold = session.open_target("keep://a", {})
    assert session.open_target("keep://a", {}) is not cold  # not open: nothing is kept
    with session:
        kept = session.open_target("keep://a", {"x": 1})
        assert session.open_target("keep://a", {"x": 1}) is kept  # reused for the command's bundles
        assert session.open_target("keep://a", {"x": 2}) is not kept  # other settings, other target
        session.release(kept)
        assert kept.closed == 0  # kept for the next bundle
        fresh = [session.open_target("fresh://b", {}) for _ in range(2)]
        assert fresh[0] is not fresh[1]
        for target in fresh:
            session.release(target)
        assert all(t.closed == 1 for t in fresh)  # closed when their bundle was done
    assert kept.closed == 1
    assert cold.closed == 0  # opened outside the session: not the session's to close
    session.close()  # idempotent
    assert kept.closed == 1


def test_bundles_run_at_the_same_time_get_a_worker_each(bundle_cache, tmp_path):
    import threading

    paths = [bundle_cache("mlp", cases=3), bundle_cache("tiny-cnn", cases=3)]
    reports: dict[int, dict] = {}
    gate = threading.Barrier(2)
    with Session(no_history=True) as session:
        def one(i: int) -> None:
            gate.wait()
            reports[i] = _run(session, paths[i], tmp_path / f"p{i}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert session.workers.started == 2  # a busy worker is never shared: the protocol is one bundle at a time
        assert len(session.workers.pids()) == 2
        third = _run(session, paths[0], tmp_path / "p2")  # afterwards both are idle: one of them is reused
        assert session.workers.started == 2
    assert [reports[i]["summary"]["verdict"] for i in range(2)] == ["PASS", "PASS"]
    assert third["summary"]["verdict"] == "PASS" and third["target"]["info"]["worker"] == "warm, reused"
