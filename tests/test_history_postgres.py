"""The history on a real PostgreSQL server (Debian's `postgresql`, started privately by
tests/pg_server.py; no test double): the same answers as SQLite, many writers losing nothing, a
writer killed mid-transaction leaving nothing, a server that goes away mid-run, and credentials
that never leave the URL they were given in."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report_samples as rs  # noqa: E402
from pg_server import PgServer, pg  # noqa: E402,F401 - the fixture

from bundlerun.runner.history import store as history  # noqa: E402
from bundlerun.runner.history import tags  # noqa: E402
from bundlerun.runner.history.location import HistoryServer, redact  # noqa: E402
from bundlerun.runner.report.model import Report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WRITER = Path(__file__).resolve().parent / "history_writer.py"
CLI = [sys.executable, "-m", "bundlerun.runner.cli"]


def _quick(**kw) -> Report:
    return Report.from_json(rs.quick_report(**kw))


def _db(pg: PgServer, request) -> str:
    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:50]
    return pg.create_database(name)


def _rounded(value):
    """Floats to 12 significant digits: an AVG sums in another order on another database (last-ulp)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rounded(v) for v in value)
    return value


def _answers(db) -> dict:
    """Everything the commands read, with run ids and record times (which differ by database) left out."""
    runs = history.list_runs(db, limit=None)
    extras = tags.run_extras(db)
    return _rounded({
        "runs": [{k: v for k, v in r.to_dict().items() if k != "id"} for r in runs],
        "sqnr": [(p.label, p.value, p.low, p.exact, p.counted) for p in history.trend(db, "mlp", None, "sqnr")],
        "mae": [(p.label, p.value, p.high) for p in history.trend(db, "mlp", "host://xnnpack", "mae")],
        "series": [(p.label, p.value) for p in history.trend(db, "mlp", series=runs[-1].series)],
        "extras": sorted((e["commit_sha"] or "", e["max_error"], e["fail_output"] or "", e["failing_outputs"],
                          e["fail_criteria"] or "") for e in extras.values()),
        "flaky": {k: [{f: v for f, v in row.items() if f != "last"} for row in rows]  # last: when recorded
                  for k, rows in history.flaky_stats(db).items()},
        "resolved": history.resolve_run(db, "n0.01").run["label"],
        "report": history.load_report(db, runs[0].id).to_json()["summary"],
    })


def test_postgres_gives_the_same_answers_as_sqlite(pg, request, tmp_path):
    url = _db(pg, request)
    reports = [_quick(noise=n, label=f"n{n}") for n in (1e-4, 1e-3, 1e-2, 1e-1)]
    reports.append(_quick(noise=1e-3, label="exact-\x00-\ud800", errors={1: "error"}))
    for db in (tmp_path / "h.sqlite", url):
        ids = [history.record_report(db, r, tags={"commit_sha": "ab" * 20}) for r in reports]
        assert [history.record_report(db, r) for r in reports] == ids  # idempotent
        history.record_farm_attempts(db, "farm1", "job1", [
            {"attempt": 1, "exit_code": 2, "device": "adb:emu-1", "verdict": "ERROR"},
            {"attempt": 2, "exit_code": 0, "device": "adb:emu-2", "final": True, "flaky": True, "retried": True}],
            ids[0])
    sqlite, server = _answers(tmp_path / "h.sqlite"), _answers(url)
    assert server == sqlite
    assert len(server["runs"]) == 5 and server["flaky"]["devices"][0]["device"] == "adb:emu-1"
    assert server["runs"][0]["label"] == "exact-\\x00-\\ud800"  # stored as text every database takes


def test_the_hud_and_history_commands_read_a_server(pg, request, tmp_path):
    url = _db(pg, request)
    for host in ("lab-a", "lab-b"):  # two hosts' runs, one history
        history.record_report(url, _quick(label=host, noise=1e-3), tags={"commit_sha": host.encode().hex() * 4})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BUNDLERUN_HISTORY": url}
    hud = subprocess.run([*CLI, "hud", "--out", str(tmp_path / "site")], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=600)
    assert hud.returncode == 0, hud.stderr[-3000:]
    index = (tmp_path / "site" / "index.html").read_text()
    assert "lab-a" in index and "lab-b" in index
    listing = subprocess.run([*CLI, "history", "--history", url, "--json"], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=600)
    assert listing.returncode == 0 and {r["label"] for r in json.loads(listing.stdout)} == {"lab-a", "lab-b"}
    for text in (hud.stdout, hud.stderr, listing.stdout, listing.stderr, index,
                 *(p.read_text() for p in (tmp_path / "site").rglob("*.html"))):
        assert pg.password not in text
    assert f"bundlerun:***@127.0.0.1:{pg.port}" in index  # the HUD says where it read from, redacted


def test_sixteen_writers_record_every_run_exactly_once(pg, request):
    """16 processes x 250 runs, one transaction each, against one server: every run once."""
    url = _db(pg, request)
    writers = [subprocess.Popen([sys.executable, str(WRITER), url, str(w), "250"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT) for w in range(16)]
    results = []
    for proc in writers:
        out, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    ids = [i for r in results for i in r["ids"]]
    assert len(ids) == 16 * 250 == len(set(ids))
    runs = history.list_runs(url, limit=None)
    assert sorted(r.label for r in runs) == sorted(f"w{w}-{k}" for w in range(16) for k in range(250))
    assert sorted(r.id for r in runs) == sorted(ids)
    import psycopg

    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM case_outputs").fetchone()[0] == 16 * 250 * 3
        assert conn.execute("SELECT COUNT(*) FROM run_tags").fetchone()[0] == 16 * 250
        assert conn.execute("SELECT COUNT(DISTINCT run_uuid) FROM runs").fetchone()[0] == 16 * 250


@pytest.mark.parametrize("where", ["postgresql", "sqlite"])
def test_a_writer_killed_mid_transaction_leaves_no_partial_run(pg, request, tmp_path, where):
    db = _db(pg, request) if where == "postgresql" else str(tmp_path / "h.sqlite")
    history.record_report(db, _quick(label="before"))
    proc = subprocess.Popen([sys.executable, str(WRITER), db, "7", "1", "--hold-in-transaction"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "HOLDING", line + proc.stderr.read()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    # the run's rows were written inside the transaction; none is visible, and the next writer is not blocked
    assert [r.label for r in history.list_runs(db, limit=None)] == ["before"]
    out = subprocess.run([sys.executable, str(WRITER), db, "7", "1"], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = history.list_runs(db, limit=None)
    assert [r.label for r in runs] == ["w7-0", "before"]
    extras = tags.run_extras(db)
    assert all(e["source"] == "bundlerun" for e in extras.values())  # every run has its tags row: whole


def test_credentials_are_redacted_everywhere_a_history_is_named(pg):
    secret = pg.password
    server = HistoryServer(pg.url())
    for shown in (str(server), repr(server), f"{server}", "%s" % server, json.dumps({"h": server}, default=str),
                  redact(pg.url()), redact(pg.url() + "?password=" + secret)):
        assert secret not in shown and "***" in shown
    assert server.password == secret
    wrong = pg.url().replace(secret, secret + "x")
    with pytest.raises(history.HistoryError) as info:
        history.list_runs(wrong)
    said = str(info.value)
    assert secret not in said and "\n" not in said and "password authentication failed" in said, said
    res = subprocess.run([*CLI, "history", "--history", wrong], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2 and secret not in res.stdout + res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "internal error" not in res.stderr, res.stderr


@pytest.fixture(scope="module")
def portable_mlp(bundle_cache) -> Path:
    return bundle_cache("mlp", backend="portable", cases=4, target="host://portable")


def test_a_server_that_goes_away_mid_run_is_one_line_exit_2_and_the_report_is_written(portable_mlp, tmp_path):
    """The run starts with the history's server up (a first run is recorded), the server is killed
    while the second run is between cases, the run finishes: exit 2, one error line, report.json
    written with its verdict, the password nowhere."""
    from proc_helpers import TAG_VAR, new_tag, settled, tagged

    server = PgServer.start()  # this test's own server: it is killed
    try:
        url = server.create_database("gone")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "BUNDLERUN_HISTORY": url}
        first = subprocess.run([*CLI, "run", str(portable_mlp), "--target", "host://portable", "--report",
                                str(tmp_path / "first"), "--quiet"], capture_output=True, text=True, env=env,
                               cwd=tmp_path, timeout=900)
        assert first.returncode == 0, first.stderr[-3000:]
        release, tag = tmp_path / "release", new_tag()
        proc = subprocess.Popen([*CLI, "run", str(portable_mlp), "--target", "host://portable", "--report",
                                 str(tmp_path / "second"), "--timeout", "300"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                env={**env, TAG_VAR: tag, "BUNDLERUN_FAULT": "pause@forward:2",
                                     "BUNDLERUN_FAULT_RELEASE": str(release)})
        deadline = time.monotonic() + 600
        while not any("pausing before forward:2" in p.read_text(errors="replace")
                      for p in (tmp_path / "second" / "work").glob("host-runtime-*.log")):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"the run never reached its pause: {proc.communicate()}")
            time.sleep(0.2)
        server.kill()
        release.touch()
        out, err = proc.communicate(timeout=900)
    finally:
        server.stop()
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("bundlerun: error:")]
    assert len(errors) == 1 and "history not recorded" in errors[0] and "verdict PASS" in errors[0], err[-3000:]
    assert "Traceback" not in err and "internal error" not in err
    report = json.loads((tmp_path / "second" / "report.json").read_text())
    assert report["summary"]["verdict"] == "PASS" and "history_id" not in report["run"]
    assert any("history not recorded" in w for w in report["warnings"])
    for text in (out, err, *(p.read_text(errors="replace") for p in (tmp_path / "second").rglob("*")
                             if p.is_file() and p.suffix in (".json", ".md", ".html", ".xml", ".log"))):
        assert server.password not in text
    assert settled(lambda: tagged(tag, b"")) == []  # the run's processes are gone


def test_revision_0003_upgrades_a_server_in_place_as_it_does_a_file(pg, request, tmp_path):
    """A server history at revision 0002 (the sequence figures as perf_figures rows) opened by this
    bundlerun: sequence_figures is created and filled from the stored reports, the old rows go, and
    the figures and trends read back as from an SQLite file upgraded the same way."""
    from test_sequence_history import _llm_report, upgrade_from_0002

    from bundlerun.runner.history import database

    url = _db(pg, request)
    answers = []
    for db in (tmp_path / "h.sqlite", url):
        ids = upgrade_from_0002(db, [_llm_report(0), _llm_report(1, missing=1)])
        figures = history.sequence_figures(db, ids)  # opening upgrades
        trend = history.sequence_trend(db, "llm:llama3", "sequence_first_divergence")[0]
        answers.append(_rounded(([[{k: v for k, v in r.items() if k != "run_id"} for r in figures[i]] for i in ids],
                                 [(p.value, p.low, p.high) for p in trend])))
        listing = history.perf_trend(db, "llm:llama3", "sequence_greedy_agreement")[0]
        assert listing == []  # moved out of perf_figures
    assert answers[0] == answers[1]
    assert [r["first_divergence"] for r in answers[1][0][0]] == [None, 1]
    import sqlalchemy as sa

    with database.engine_for(url).connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == database.HEAD
