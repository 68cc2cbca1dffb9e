"""History database: recording, listing, references, trends, and parallel writers.

Reports go in and come out as the typed `Report`: the samples (tests/report_samples.py, judged by
the real judge) are read with `Report.from_json`, as a report.json is."""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import report_samples as rs  # noqa: E402

from bundlerun.runner.history import store as history  # noqa: E402
from bundlerun.runner.report.model import Report  # noqa: E402


def _quick(**kw) -> Report:
    return Report.from_json(rs.quick_report(**kw))


def test_record_and_list_filters(tmp_path):
    db = tmp_path / "h.sqlite"
    a = _quick(noise=1e-5, label="sha-a", model="mlp")
    b = _quick(noise=5e-2, label="sha-b", model="mlp")
    c = _quick(noise=1e-5, label="sha-a", model="tiny-cnn")
    ids = [history.record_report(db, r, report_path=f"/r/{i}/report.json") for i, r in enumerate((a, b, c))]
    assert ids == sorted(ids) and len(set(ids)) == 3
    runs = history.list_runs(db)
    assert [r.id for r in runs] == ids[::-1]  # newest first
    assert {r.model for r in history.list_runs(db, model="mlp")} == {"mlp"}
    assert [r.label for r in history.list_runs(db, label="sha-a")] == ["sha-a", "sha-a"]
    assert history.list_runs(db, limit=1)[0].id == ids[-1]
    failing = history.list_runs(db, label="sha-b")[0]
    assert failing.verdict == "FAIL" and failing.exit_code == 1 and failing.n_fail == 4
    assert failing.report_path == "/r/1/report.json"
    assert failing.torch_version == "2.13.0" and failing.executorch_version == "1.5.1"
    # per case-output rows carry the statistics of the report
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT case_index, sqnr, error_mae, verdict FROM case_outputs WHERE run_id=? ORDER BY case_index",
                            (ids[1],)).fetchall()
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    for (ci, sqnr, mae, verdict), case in zip(rows, b.cases):
        assert sqnr == pytest.approx(case.outputs[0].stats.sqnr)
        assert mae == pytest.approx(case.outputs[0].stats.error_mae)
        assert verdict == "FAIL"


def test_record_is_idempotent_and_wal(tmp_path):
    db = tmp_path / "h.sqlite"
    r = _quick()
    assert history.record_report(db, r) == history.record_report(db, r)
    assert len(history.list_runs(db)) == 1
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_batch_stores_each_run_once_and_every_figure_across_flushes(tmp_path, monkeypatch):
    """record_reports (a suite import): a run named twice in one batch, or recorded before, is stored once
    and keeps its id; figure rows held back for one executemany all land, also when the batch is flushed
    part-way (the bound lowered to 3 rows here)."""
    db = tmp_path / "h.sqlite"
    before = _quick(noise=1e-5, label="before")
    first = history.record_report(db, before)
    monkeypatch.setattr(history, "_FLUSH_ROWS", 3)
    a, b = _quick(noise=1e-5, label="a"), _quick(noise=5e-2, label="b")
    ids = history.record_reports(db, [(a, None, None), (before, None, None), (a, None, None), (b, None, None)])
    assert ids[1] == first and ids[0] == ids[2] and len({ids[0], ids[3], first}) == 3
    assert history.recorded_run_uuids(db, [a.run["id"], b.run["id"], "no-such-run"]) == {a.run["id"], b.run["id"]}
    assert len(history.list_runs(db, limit=None)) == 3
    with sqlite3.connect(db) as conn:
        for run_id, report in ((ids[0], a), (ids[3], b)):
            rows = conn.execute("SELECT case_index, sqnr FROM case_outputs WHERE run_id=? ORDER BY case_index",
                                (run_id,)).fetchall()
            assert [r[0] for r in rows] == [c.case for c in report.cases]
            assert [r[1] for r in rows] == pytest.approx([c.outputs[0].stats.sqnr for c in report.cases])
            assert conn.execute("SELECT COUNT(*) FROM run_tags WHERE run_id=?", (run_id,)).fetchone()[0] == 1


def test_resolve_run_by_id_uuid_label_and_path(tmp_path):
    db = tmp_path / "h.sqlite"
    r1, r2 = _quick(label="v1"), _quick(label="v1", noise=1e-2)
    id1, id2 = history.record_report(db, r1), history.record_report(db, r2)
    assert history.resolve_run(db, str(id1)).run["id"] == r1.run["id"]
    assert history.resolve_run(db, f"#{id2}").run["id"] == r2.run["id"]
    assert history.resolve_run(db, r1.run["id"][:10]).run["id"] == r1.run["id"]
    assert history.resolve_run(db, "v1").run["id"] == r2.run["id"]  # newest with the label
    # what comes back is the report as recorded, with the run's id in this history
    loaded = history.load_report(db, id2)
    assert isinstance(loaded, Report) and loaded.run.pop("history_id") == id2
    assert loaded.to_json() == r2.to_json()
    path = tmp_path / "rep" / "report.json"
    path.parent.mkdir()
    path.write_text(json.dumps(r1.to_json()))
    assert history.resolve_run(db, str(path)).run["id"] == r1.run["id"]
    assert history.resolve_run(None, str(path.parent)).run["id"] == r1.run["id"]
    other = _quick(label="v1", model="tiny-cnn")
    history.record_report(db, other)
    assert history.resolve_run(db, "v1").run["id"] == other.run["id"]
    # a label prefers the newest run of the same model, and never the run being judged
    assert history.resolve_run(db, "v1", prefer={"model": "mlp"}).run["id"] == r2.run["id"]
    assert history.resolve_run(db, "v1", exclude_uuid=r2.run["id"], prefer={"model": "mlp"}).run["id"] == r1.run["id"]
    with pytest.raises(history.HistoryError, match="no run 'nope'"):
        history.resolve_run(db, "nope")
    with pytest.raises(history.HistoryError, match="does not exist"):
        history.resolve_run(db, str(tmp_path / "missing.json"))


def test_history_path_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("BUNDLERUN_HISTORY", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert history.resolve_history_path() == tmp_path / "xdg" / "bundlerun" / "history.sqlite"
    cfg = {"history": {"path": str(tmp_path / "cfg.sqlite")}}
    assert history.resolve_history_path(None, cfg) == tmp_path / "cfg.sqlite"
    monkeypatch.setenv("BUNDLERUN_HISTORY", str(tmp_path / "env.sqlite"))
    assert history.resolve_history_path(None, cfg) == tmp_path / "env.sqlite"
    assert history.resolve_history_path(str(tmp_path / "flag.sqlite"), cfg) == tmp_path / "flag.sqlite"
    assert history.resolve_history_path("off", cfg) is None


def test_corrupt_database_is_one_line_error(tmp_path):
    db = tmp_path / "h.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(history.HistoryError, match="not usable"):
        history.record_report(db, _quick())


def test_trend_series(tmp_path):
    db = tmp_path / "h.sqlite"
    for noise in (1e-4, 1e-3, 1e-2):
        history.record_report(db, _quick(noise=noise, label=f"n{noise}"))
    sq = history.trend(db, "mlp", "host://xnnpack", "sqnr")
    assert [p.label for p in sq] == ["n0.0001", "n0.001", "n0.01"]
    # more noise, less SQNR: each tenfold is ~20 dB
    assert sq[0].value - sq[1].value == pytest.approx(20, abs=3)
    assert all(p.low <= p.value for p in sq)
    mae = history.trend(db, "mlp", None, "mae")
    assert mae[0].value < mae[1].value < mae[2].value
    assert history.trend(db, "other", None, "sqnr") == []


def _writer(args):
    db, worker, n = args
    sys.path.insert(0, str(Path(__file__).parent))
    import report_samples

    ids = []
    for k in range(n):
        report = Report.from_json(report_samples.quick_report(label=f"w{worker}-{k}", cases=3, seed=k))
        ids.append(history.record_report(db, report))
    return ids


def test_eight_parallel_writers_lose_nothing(tmp_path):
    db = tmp_path / "shared.sqlite"
    per_worker = 20
    ctx = mp.get_context("spawn")
    with ctx.Pool(8) as pool:
        results = pool.map(_writer, [(str(db), w, per_worker) for w in range(8)])
    all_ids = [i for ids in results for i in ids]
    assert len(all_ids) == 8 * per_worker == len(set(all_ids))
    runs = history.list_runs(db, limit=None)
    assert sorted(r.label for r in runs) == sorted(f"w{w}-{k}" for w in range(8) for k in range(per_worker))
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM case_outputs").fetchone()[0] == 8 * per_worker * 3
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _cli(args, env):
    import subprocess

    return subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", *args], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[1], timeout=120)


def test_history_and_trend_commands(tmp_path):
    import os

    db = tmp_path / "h.sqlite"
    for k, noise in enumerate((1e-4, 1e-3, 1e-2)):
        history.record_report(db, _quick(noise=noise, label=f"c{k}"))
    history.record_report(db, _quick(noise=1e-4, label="other", model="tiny-cnn"))
    env = dict(os.environ, BUNDLERUN_HISTORY=str(db))
    proc = _cli(["history", "--model", "mlp", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)
    assert [r["label"] for r in runs] == ["c2", "c1", "c0"]
    assert runs[0]["min_sqnr"] < runs[2]["min_sqnr"]
    proc = _cli(["history", "--limit", "2"], env)
    assert proc.returncode == 0 and "other" in proc.stdout and "c0" not in proc.stdout
    png = tmp_path / "trend.png"
    proc = _cli(["trend", "mlp", "--target", "host://xnnpack", "--metric", "sqnr", "-o", str(png)], env)
    assert proc.returncode == 0, proc.stderr
    assert "3 run(s)" in proc.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = _cli(["trend", "nope", "--metric", "top1", "-o", str(png)], env)
    assert proc.returncode == 2 and "no recorded runs of nope" in proc.stderr


# ------------------------------------------------------------------ times carry their timezone


def test_times_are_stored_in_utc_with_offset_and_old_rows_read_as_utc(tmp_path):
    import os

    db = tmp_path / "h.sqlite"
    aware = _quick(label="aware")
    aware.run["started"] = "2026-03-01T14:30:00+02:00"
    naive = _quick(label="naive")
    naive.run["started"] = "2026-03-01T12:00:00"  # what reports without an offset say
    for r in (aware, naive):
        history.record_report(db, r)
    with sqlite3.connect(db) as conn:
        stored = dict(conn.execute("SELECT label, started FROM runs").fetchall())
        recorded = conn.execute("SELECT recorded FROM runs").fetchone()[0]
        # a row written before times carried an offset
        conn.execute("UPDATE runs SET started = '2025-12-31T23:00:00' WHERE label = 'naive'")
    assert stored == {"aware": "2026-03-01T12:30:00+00:00", "naive": "2026-03-01T12:00:00+00:00"}
    assert recorded.endswith("+00:00")
    runs = {r.label: r for r in history.list_runs(db)}
    assert runs["naive"].started == "2025-12-31T23:00:00+00:00"  # read as UTC
    env = dict(os.environ, BUNDLERUN_HISTORY=str(db), TZ="Asia/Kolkata", COLUMNS="250")
    proc = _cli(["history"], env)
    assert proc.returncode == 0, proc.stderr
    assert "2026-03-01 18:00:00 +05:30" in proc.stdout and "2026-01-01 04:30:00 +05:30" in proc.stdout
    proc = _cli(["history", "--utc"], env)
    assert "2026-03-01 12:30:00 +00:00" in proc.stdout and "2025-12-31 23:00:00 +00:00" in proc.stdout
    proc = _cli(["history", "--json"], env)
    assert {r["label"]: r["started"] for r in json.loads(proc.stdout)} == {
        "aware": "2026-03-01T12:30:00+00:00", "naive": "2025-12-31T23:00:00+00:00"}


# ------------------------------------------------------------------ trend: one series per target x dtype


def _recorded(db, noise, label, dtype="fp32", target="host://xnnpack", exact_cases=()):
    b = rs.make_bundle(cases=4, dtype=dtype)
    outputs = {i: b.suite("forward").test_cases[i].expected_outputs[0].to_array() for i in exact_cases}
    report = Report.from_json(rs.make_report(b, rs.target_run(b, noise=noise, outputs=outputs), label=label))
    report.target["url"] = target
    history.record_report(db, report)
    return report


def test_trend_never_mixes_dtypes_or_targets(tmp_path):
    import os

    db = tmp_path / "h.sqlite"
    _recorded(db, 1e-4, "x-fp32-1")
    _recorded(db, 1e-2, "x-int8-1", dtype="int8")
    _recorded(db, 1e-3, "t-fp32-1", target="tosa://fp")
    _recorded(db, 1e-4, "x-fp32-2")
    points = history.trend(db, "mlp", None, "sqnr")
    groups = history.series_of(points)
    assert {(k.target, k.dtype): [p.label for p in v] for k, v in groups.items()} == {
        ("host://xnnpack", "fp32"): ["x-fp32-1", "x-fp32-2"], ("host://xnnpack", "int8"): ["x-int8-1"],
        ("tosa://fp", "fp32"): ["t-fp32-1"]}
    assert [p.label for p in history.trend(db, "mlp", "host://xnnpack", "sqnr", dtype="int8")] == ["x-int8-1"]
    env = dict(os.environ, BUNDLERUN_HISTORY=str(db))
    png = tmp_path / "t.png"
    proc = _cli(["trend", "mlp", "-o", str(png)], env)
    assert proc.returncode == 0, proc.stderr
    assert "4 run(s) of mlp in 3 series (one per target x dtype x test inputs x criteria" in proc.stdout
    assert "host://xnnpack fp32: 2 run(s)" in proc.stdout and "host://xnnpack int8: 1 run(s)" in proc.stdout
    assert "tosa://fp fp32: 1 run(s)" in proc.stdout
    proc = _cli(["trend", "mlp", "--dtype", "fp32", "--target", "host://xnnpack", "-o", str(png)], env)
    assert "2 run(s) of mlp in 1 series" in proc.stdout and "int8" not in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sqnr_trend_leaves_exact_matches_out_of_the_mean(tmp_path):
    db = tmp_path / "h.sqlite"
    mixed = _recorded(db, 1e-3, "mixed", exact_cases=(0, 2))
    _recorded(db, 1e-3, "exact", exact_cases=(0, 1, 2, 3))
    finite = [c.outputs[0].stats.sqnr for c in mixed.cases]
    finite = [s for s in finite if s not in ("inf", float("inf"))]
    assert len(finite) == 2 and max(finite) < 100
    p_mixed, p_exact = history.trend(db, "mlp", None, "sqnr")
    assert p_mixed.value == pytest.approx(sum(finite) / 2)  # not (a + b + 200 + 200) / 4
    assert p_mixed.low == pytest.approx(min(finite)) and (p_mixed.exact, p_mixed.counted) == (2, 2)
    assert p_exact.value is None and p_exact.low is None and (p_exact.exact, p_exact.counted) == (4, 0)
    # the error metrics are unaffected: an exact match is a zero error there
    mae = history.trend(db, "mlp", None, "mae")
    assert mae[1].value == 0 and mae[0].counted == 4
    import os

    proc = _cli(["trend", "mlp", "-o", str(tmp_path / "t.png")], dict(os.environ, BUNDLERUN_HISTORY=str(db)))
    assert proc.returncode == 0, proc.stderr
    assert ("host://xnnpack fp32: 2 run(s), latest: every output matched exactly; 6 exact match(es) (SQNR "
            "infinite) over these runs, left out of the mean and drawn apart") in proc.stdout


def test_runs_by_ids_read_exactly_those_runs_dense_or_sparse(tmp_path):
    """list_runs/run_extras by ids: a near-contiguous set is read as its id range and filtered
    (store.by_ids), a sparse one by IN; both give exactly the runs asked for, newest first, and
    the limit counts only those."""
    from bundlerun.runner.history.tags import run_extras

    db = tmp_path / "h.sqlite"
    base = _quick()
    ids = []
    for k in range(120):
        base.run["id"] = f"run-{k}"
        base.run["label"] = f"l{k}"
        ids.append(history.record_report(db, base))
    dense = [i for i in ids[10:115] if i % 3]  # 70 of a range of 105: read as the range
    sparse = ids[::30] + ids[5:6]
    import sqlalchemy as sa

    assert history.by_ids(sa.column("id"), dense)[1] == set(dense)  # the range, filtered
    assert history.by_ids(sa.column("id"), sparse)[1] is None  # IN
    for want in (dense, sparse):
        got = history.list_runs(db, limit=None, ids=want)
        assert [r.id for r in got] == sorted(want, reverse=True)
        assert [r.id for r in history.list_runs(db, limit=5, ids=want)] == sorted(want, reverse=True)[:5]
        assert sorted(run_extras(db, ids=want)) == sorted(want)
