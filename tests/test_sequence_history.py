"""An LLM run's per-sequence figures over time: the history's `sequence_figures` table (Alembic
revision 0003), `bundlerun history --sequences`, `trend --metric sequence_*`, and the HUD's
per-sequence pages (runner/pictures/hud_sequences.py). Reports come from the real judge on a
synthetic LLM bundle (tests/test_sequence_report.py: no export); real SQLite, real Alembic. The same
upgrade on PostgreSQL: tests/test_history_postgres.py."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_history_migrations import LEGACY_V2  # noqa: E402
from test_sequence_report import _report  # noqa: E402

from bundlerun.runner.cli import cli  # noqa: E402
from bundlerun.runner.history import database  # noqa: E402
from bundlerun.runner.history import schema as t  # noqa: E402
from bundlerun.runner.history import store as history  # noqa: E402
from bundlerun.runner.pictures import hud_site  # noqa: E402

# the perf_figures rows bundlerun recorded per sequence before revision 0003 (git show 58a34a9:runner/report/sequences.py)
OLD_FIGURES = (("sequence_first_divergence", "steps"), ("sequence_greedy_agreement", "steps"),
               ("sequence_perplexity_ratio", "ratio"))


def _llm_report(i: int, missing: int | None = None, model: str = "llm:llama3"):
    report, _, _ = _report(missing=missing)
    report.run["id"] = f"run-{model}-{i}"
    report.run["started"] = f"2026-01-{i + 1:02d}T00:00:00+00:00"
    report.bundle["model"] = model
    return report


def test_a_run_records_one_row_per_sequence_and_trend_reads_them(tmp_path):
    db = tmp_path / "h.sqlite"
    rid = history.record_report(db, _llm_report(0))
    seq0, seq1 = history.sequence_figures(db, [rid])[rid]
    assert (seq0["name"], seq0["verdict"], seq0["steps"], seq0["first_divergence"], seq0["greedy_agreement"]) == \
        ("seq0", "PASS", 3, None, 3)
    assert (seq1["name"], seq1["verdict"], seq1["first_divergence"], seq1["greedy_agreement"]) == ("seq1", "FAIL", 1, 1)
    assert seq0["perplexity_ratio"] == pytest.approx(1.0, abs=1e-5) and seq1["perplexity_ratio"] > 1.05
    assert seq1["perplexity_target"] > seq1["perplexity_reference"]
    assert seq1["sqnr_worst"] < 40 < 100 < seq1["sqnr_median"]  # the flipped step is the worst; the others ~1e-6 off
    assert seq0["sqnr_worst"] <= seq0["sqnr_median"]
    stored = history.load_report(db, rid).sequences  # the same numbers as the report's own
    assert seq1["perplexity_target"] == stored[1].perplexity_target
    with sqlite3.connect(db) as conn:  # nothing left in perf_figures: one table holds them
        assert conn.execute("SELECT count(*) FROM perf_figures WHERE name LIKE 'sequence_%'").fetchone()[0] == 0
    points, info = history.sequence_trend(db, "llm:llama3", "sequence_greedy_agreement")
    assert info["unit"] == "steps" and [(p.value, p.low, p.high, p.counted) for p in points] == [(2.0, 1.0, 3.0, 2)]
    first, _ = history.sequence_trend(db, "llm:llama3", "sequence_first_divergence")
    assert (first[0].low, first[0].high) == (1.0, 3.0)  # seq1 at step 1; seq0 never: its 3 steps
    worst, info = history.sequence_trend(db, "llm:llama3", "sequence_sqnr_worst")
    assert info["unit"] == "dB" and worst[0].low == seq1["sqnr_worst"]


def test_an_interrupted_run_records_no_sequence_figures(tmp_path):
    db = tmp_path / "h.sqlite"
    report = _llm_report(0)
    report.summary.interrupted = True
    rid = history.record_report(db, report)
    assert history.sequence_figures(db, [rid]) == {}


def test_history_and_trend_commands_show_them(tmp_path):
    db = tmp_path / "h.sqlite"
    history.record_report(db, _llm_report(0))
    history.record_report(db, _llm_report(1, missing=1))  # seq0 stops at step 1: ERROR there
    runner = CliRunner()
    out = runner.invoke(cli, ["history", "--history", str(db), "--sequences", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [(r["run"], r["name"], r["first_divergence"], r["greedy_agreement"]) for r in rows] == [
        (2, "seq0", 1, 1), (2, "seq1", 1, 1), (1, "seq0", None, 3), (1, "seq1", 1, 1)]
    text = runner.invoke(cli, ["history", "--history", str(db), "--sequences"], terminal_width=240)
    assert text.exit_code == 0 and "seq1" in text.output and "1/3" in text.output and "none" in text.output
    none = runner.invoke(cli, ["history", "--history", str(db), "--sequences", "--model", "mlp"])
    assert none.exit_code == 0 and "no per-sequence figures" in none.output
    png = tmp_path / "t.png"
    trend = runner.invoke(cli, ["trend", "llm:llama3", "--history", str(db), "--metric", "sequence_greedy_agreement",
                                "-o", str(png)])
    assert trend.exit_code == 0, trend.output
    assert "median over each run's sequences" in trend.output and "latest median 1 steps" in trend.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_revision_0002_file_gets_the_table_filled_from_its_reports(tmp_path):
    """A file written before revision 0003 (the hand-written version-2 schema, the sequence figures as
    perf_figures rows): opening it creates sequence_figures from each stored report and moves the old
    rows out of perf_figures."""
    made = tmp_path / "made.sqlite"
    ids = [history.record_report(made, _llm_report(i, missing=(1 if i else None))) for i in range(2)]
    want = history.sequence_figures(made, ids)
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(LEGACY_V2)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    conn.execute(f"ATTACH DATABASE '{made}' AS made")
    conn.execute("INSERT INTO runs SELECT * FROM made.runs")
    for rid, rows in want.items():  # as 58a34a9 recorded them
        for r in rows:
            first = r["first_divergence"] if r["first_divergence"] is not None else r["steps"]
            for (name, unit), value in zip(OLD_FIGURES, (first, r["greedy_agreement"], r["perplexity_ratio"])):
                if value is None:  # as 58a34a9: a figure with no value has no row
                    continue
                conn.execute("INSERT INTO perf_figures VALUES (?, ?, ?, ?, '', ?, ?, 'accuracy', NULL, NULL, NULL)",
                             (rid, r["method"], r["sequence_index"], name, value, unit))
    conn.commit()
    conn.close()
    assert history.sequence_figures(db, ids) == want  # opening upgrades
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == database.HEAD == "0003"
        assert conn.execute("SELECT count(*) FROM perf_figures").fetchone()[0] == 0
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    points, _ = history.sequence_trend(db, "llm:llama3", "sequence_first_divergence")
    assert [(p.run_id, p.value) for p in points] == [(1, 2.0), (2, 1.0)]


def upgrade_from_0002(url_or_path, reports) -> list[int]:
    """A database at revision 0002 (Alembic's own upgrade to it) holding these reports as 58a34a9
    recorded them (runs rows; sequence figures as perf_figures rows); the run ids. Shared with
    tests/test_history_postgres.py."""
    from alembic import command
    from alembic.config import Config

    engine = database.engine_for(url_or_path)
    ids = []
    with engine.connect().execution_options(history_write=True) as conn:
        with conn.begin():
            config = Config()
            config.set_main_option("script_location", str(Path(database.__file__).with_name("migrations")))
            config.attributes["connection"] = conn
            command.upgrade(config, "0002")
            for report in reports:
                row = history._run_row(report, None)
                rid = int(conn.execute(t.runs.insert().values(**row)).inserted_primary_key[0])
                ids.append(rid)
                for i, seq in enumerate(report.sequences):
                    first = seq.first_divergence if seq.first_divergence is not None else len(seq.steps)
                    for (name, unit), value in zip(OLD_FIGURES, (first, seq.greedy_agreement, seq.perplexity_ratio)):
                        if value is None:  # as 58a34a9: a figure with no value has no row
                            continue
                        conn.execute(t.perf_figures.insert().values(
                            run_id=rid, method=seq.method, case_index=i, name=name, phase="", value=float(value),
                            unit=unit, kind="accuracy"))
    return ids


def test_alembic_0002_to_0003_on_sqlite(tmp_path):
    db = tmp_path / "h.sqlite"
    ids = upgrade_from_0002(db, [_llm_report(0), _llm_report(1, missing=1)])
    figures = history.sequence_figures(db, ids)
    assert [[r["first_divergence"] for r in figures[i]] for i in ids] == [[None, 1], [1, 1]]
    with database.engine_for(db).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t.perf_figures)).scalar() == 0


def test_a_0002_file_with_a_sequence_figures_table_of_another_shape_gets_it_rebuilt(tmp_path):
    """A development build wrote a `sequence_figures` of its own shape into a file still stamped 0002
    (found on a real machine): the table is derived data, so the upgrade drops and refills it instead
    of refusing the whole history ("table sequence_figures has no column named sequence_index")."""
    db = tmp_path / "h.sqlite"
    ids = upgrade_from_0002(db, [_llm_report(0), _llm_report(1, missing=1)])
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE sequence_figures (run_id INTEGER NOT NULL, method TEXT NOT NULL, sequence TEXT "
                     "NOT NULL, seq_index INTEGER, min_sqnr REAL, PRIMARY KEY (run_id, method, sequence))")
        conn.execute("INSERT INTO sequence_figures VALUES (1, 'forward', 'seq0', 0, 1.0)")
    figures = history.sequence_figures(db, ids)
    assert [[r["first_divergence"] for r in figures[i]] for i in ids] == [[None, 1], [1, 1]]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == database.HEAD
        assert "seq_index" not in {r[1] for r in conn.execute("PRAGMA table_info(sequence_figures)")}


def _hud_history(tmp_path, commits: int = 3):
    db = tmp_path / "h.sqlite"
    for i in range(commits):
        history.record_report(db, _llm_report(i, missing=(1 if i == 1 else None)), tags={"commit_sha": f"{i:02x}" * 20})
    history.record_report(db, _llm_report(9, model="llm:<script>alert(1)</script>"), tags={"commit_sha": "ff" * 20})
    return db


def test_the_hud_links_an_llm_rows_cells_to_its_sequence_page(tmp_path):
    db = _hud_history(tmp_path)
    out = tmp_path / "site"
    built = hud_site.write_site(db, out)
    pages = sorted((out / "seq").glob("*.html"))
    assert len(pages) == 2  # one per LLM row (the hostile model id is a row of its own)
    index = (out / "index.html").read_text()
    llama = next(p for p in pages if "llm:llama3 ·" in p.read_text())
    link = f"seq/{llama.name}"
    assert index.count(f"href='{link}'") == 1  # the row's name
    for rid in (1, 2, 3):
        assert f"href='{link}#run{rid}'" in index  # each of its cells
    page = llama.read_text()
    for rid in (1, 2, 3):
        assert f"<tr id='run{rid}'>" in page and f"href='../runs/{rid}.html'" in page
    assert (out / "runs" / "1.html").is_file()
    # seq0 over three commits: agreement 3/3, 1/3 (its step 1 did not run), 3/3; first divergence none, 1, none
    seq0 = page.split("<h2>seq0</h2>")[1].split("</table>")[0]
    assert re.findall(r"<td>(none|\d+)</td><td>(\d/3)</td>", seq0) == [("none", "3/3"), ("1", "1/3"), ("none", "3/3")]
    assert "<svg class='spark'" in seq0
    hostile = next(p for p in pages if p != llama).read_text()
    assert "<script>" not in hostile and "&lt;script&gt;" in hostile
    assert "<script>alert" not in index
    assert built.grid.runs == 4


def test_the_sequence_pages_follow_the_history_incrementally(tmp_path):
    db = _hud_history(tmp_path, commits=2)
    out = tmp_path / "site"
    hud_site.write_site(db, out)
    llama = next(p for p in (out / "seq").glob("*.html") if "llm:llama3 ·" in p.read_text())
    before = llama.stat().st_mtime_ns
    again = hud_site.write_site(db, out)
    assert again.incremental and again.pages_written == 0 and llama.stat().st_mtime_ns == before
    history.record_report(db, _llm_report(5), tags={"commit_sha": "05" * 20})
    more = hud_site.write_site(db, out)
    assert more.incremental and more.new_runs == 1
    assert "<tr id='run4'>" in llama.read_text()  # the new commit's line (runs 1-2 llama, 3 the hostile row)
    state = json.loads((out / hud_site.STATE_NAME).read_text())
    assert f"seq/{llama.name}" in state["pages"]

