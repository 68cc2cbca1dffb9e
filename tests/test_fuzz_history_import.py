"""Generated hostile pytest-json-report and suite CSV files through `bundlerun history import`
(runner/suite/importer.py), all into one history database, then `hud` and `history` on it.

Every field of the suite's format gets every value of security_fuzz.VALUES (wrong types,
non-finite and out-of-range numbers, huge and control-character strings, nested lists), plus
seeded random mutations, huge strings, deep JSON, lone surrogates and CSV fields over csv's
limit. Each import is exit 0 or one line with exit 2 (never a traceback, never an internal
error); the cases the adversarial pass found are refused with their field named; and whatever
was accepted, `hud` and `history` still work on the whole database afterwards. In-process
through the real entry point (runner.cli.main): a few seconds.
"""

from __future__ import annotations

import copy
import json
import random
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from security_fuzz import VALUES, mutate_json, run_main  # noqa: E402

COLUMNS = ["Test ID", "Test Case", "Subtest", "Flow", "Result", "Result Detail", "Error", "Params",
           "Output 0 Error Max", "Output 0 Error MAE", "Output 0 SNR", "bundlerun Target", "bundlerun Verdict",
           "bundlerun Failure Kind", "bundlerun Report"]


def _base() -> dict:
    sub = {"Test ID": "test_add_f32[xnnpack]", "Test Case": "test_add_f32", "Subtest": 0, "Flow": "xnnpack",
           "Result": "Pass", "Result Detail": "", "Error": "", "Params": "", "Output 0 Error Max": "0.001",
           "Output 0 Error MAE": "0.000", "Output 0 SNR": "61.2"}
    return {"created": 1764500000.0, "environment": {"CI_COMMIT_SHA": "feedfacecafebeef0000", "Python": "3.11"},
            "tests": [{"nodeid": "operators/test_add.py::test_add_f32[xnnpack]", "outcome": "passed",
                       "setup": {"duration": 0.1}, "call": {"duration": 1.5}, "teardown": {"duration": 0.0},
                       "metadata": {"subtests": [sub, {**sub, "Subtest": 1, "Result": "Fail",
                                                       "Result Detail": "Output Mismatch"}]}}]}


def _import(path: Path, db: Path) -> tuple[int, str]:
    code, _out, err = run_main("history", "import", str(path), "--history", str(db), "--commit", "abc1234")
    assert "Traceback" not in err and "internal error" not in err, (path.name, err[-1500:])
    assert code in (0, 2), (path.name, code, err[-500:])
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and str(path) in lines[0], (path.name, err[-500:])
    return code, err


def _set(doc: dict, where: tuple, value) -> dict:
    doc = copy.deepcopy(doc)
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    return doc


FIELDS = [("created",), ("environment",), ("environment", "CI_COMMIT_SHA"), ("tests",), ("tests", 0),
          ("tests", 0, "nodeid"), ("tests", 0, "metadata"), ("tests", 0, "metadata", "subtests"),
          ("tests", 0, "metadata", "subtests", 0), ("tests", 0, "setup"), ("tests", 0, "call", "duration"),
          ("tests", 0, "teardown")] + [("tests", 0, "metadata", "subtests", 0, c) for c in COLUMNS]


def _hostile_json(tmp: Path) -> list[Path]:
    base = _base()
    files = []

    def write(name: str, text: str) -> None:
        files.append(tmp / name)
        (tmp / name).write_text(text, encoding="utf-8", errors="surrogatepass")

    for i, where in enumerate(FIELDS):
        for j, value in enumerate(VALUES):
            write(f"f{i}-{j}.json", json.dumps(_set(base, where, value)))
    rng = random.Random(33)
    for k in range(120):
        doc, _done = mutate_json(base, rng, edits=rng.randint(1, 4))
        write(f"m{k}.json", json.dumps(doc))
    return files


# The cases the adversarial pass found: refused, with the field named in the one line.
FOUND = [
    (("created",), 1e20, "created"), (("created",), float("inf"), "created"), (("created",), float("nan"), "created"),
    (("created",), -1, "created"), (("tests", 0, "metadata"), [1], "metadata"),
    (("tests", 0, "metadata", "subtests"), 5, "subtests"), (("tests", 0, "setup"), 3, "setup"),
    (("tests", 0, "call", "duration"), "x", "duration"), (("environment",), [1], "environment"),
    (("tests", 0, "metadata", "subtests", 0, "Test ID"), "x" * 5_000_000, "Test ID"),
    (("tests", 0, "metadata", "subtests", 0, "Error"), "e" * 2_000_000, "Error"),
    (("tests", 0, "metadata", "subtests", 0, "bundlerun Report"), "/a" * 3000, "bundlerun Report"),
    (("tests", 0, "metadata", "subtests", 0, "Test ID"), "\ud800", "Test ID"),
    (("tests", 0, "metadata", "subtests", 0, "Subtest"), float("inf"), "Subtest"),
    (("tests", 0, "metadata", "subtests", 0, "bundlerun Verdict"), "MAYBE", "bundlerun Verdict"),
]


def _hud_and_history_work(db: Path, tmp: Path) -> None:
    code, out, err = run_main("hud", "--history", str(db), "--out", str(tmp / "site"))
    assert code == 0 and "wrote" in out, err[-1500:]
    code, _out, err = run_main("history", "--history", str(db), "--limit", "0")
    assert code == 0, err[-1500:]
    code, out, err = run_main("history", "--history", str(db), "--json", "--limit", "0")
    assert code == 0 and isinstance(json.loads(out), list), err[-1500:]


def test_hostile_suite_reports_are_one_line_and_never_break_the_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "h.sqlite"
    files = _hostile_json(tmp_path)
    codes = [_import(p, db)[0] for p in files]
    assert codes.count(0) > 50 and codes.count(2) > 200, (codes.count(0), codes.count(2))  # both kinds exercised
    for k, (where, value, field) in enumerate(FOUND):
        path = tmp_path / f"found{k}.json"
        path.write_text(json.dumps(_set(_base(), where, value)), encoding="utf-8", errors="surrogatepass")
        code, err = _import(path, db)
        assert code == 2 and field in err, (where, repr(value)[:40], err[-300:])
    deep = tmp_path / "deep.json"
    deep.write_text('{"tests": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    assert "nested too deep" in _import(deep, db)[1]
    _hud_and_history_work(db, tmp_path)


def test_hostile_suite_csv_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "h.sqlite"
    header = "Test ID,Test Case,Subtest,Flow,Result,Error,Output 0 Error Max,Output 0 SNR,bundlerun Verdict\n"
    good = "test_add[xnnpack],test_add,0,xnnpack,Pass,,0.001,60.1,\n"
    rows = {
        "big-field": ("t,t,0,xnnpack,Pass," + "e" * 200_000 + ",0.1,50,\n", "field larger"),
        "long-id": ("x" * 10_000 + ",t,0,xnnpack,Pass,,0.1,50,\n", "Test ID"),
        "subtest-inf": ("t,t,1e400,xnnpack,Pass,,0.1,50,\n", "Subtest"),
        "subtest-negative": ("t,t,-1,xnnpack,Pass,,0.1,50,\n", "Subtest"),
        "stat-text": ("t,t,0,xnnpack,Pass,,abc,50,\n", "Output 0 Error Max"),
        "stat-negative": ("t,t,0,xnnpack,Pass,,-3,50,\n", "Output 0 Error Max"),
        "verdict": ("t,t,0,xnnpack,Pass,,0.1,50,WEIRD\n", "bundlerun Verdict"),
        "extra-fields": ("t,t,0,xnnpack,Pass,,0.1,50,,1,2,3\n", "more than the header"),
    }
    for name, (row, field) in rows.items():
        path = tmp_path / f"{name}.csv"
        path.write_text(header + good + row)
        code, err = _import(path, db)
        assert code == 2 and field in err, (name, err[-300:])
    rng = random.Random(7)
    for k in range(60):  # random bytes spliced into a good file: exit 0 or one line
        data = bytearray((header + good * 3).encode())
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.choice(b'\0,"\n\r\xff\\x')
        path = tmp_path / f"r{k}.csv"
        path.write_bytes(bytes(data))
        _import(path, db)
    _hud_and_history_work(db, tmp_path)


def test_a_fail_whose_device_report_is_missing_is_never_recorded_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "h.sqlite"
    doc = _base()
    sub = doc["tests"][0]["metadata"]["subtests"][0]  # the suite says Pass; bundlerun's device run said FAIL
    sub.update({"bundlerun Target": "qemu-user://aarch64", "bundlerun Verdict": "FAIL",
                "bundlerun Report": str(tmp_path / "gone" / "report.json")})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    assert _import(path, db)[0] == 0
    with sqlite3.connect(db) as conn:
        verdicts = dict(conn.execute("SELECT target, verdict FROM runs").fetchall())
        report = json.loads(conn.execute("SELECT report_json FROM runs WHERE target = 'qemu-user://aarch64'")
                            .fetchone()[0])
    assert verdicts["qemu-user://aarch64"] == "FAIL"
    assert any("is missing or unreadable" in w for w in report["warnings"])


@pytest.mark.parametrize("size", [5_000_000])
def test_hud_survives_an_over_long_string_already_in_the_store(tmp_path, monkeypatch, size):
    """A database filled before the importer's bounds (or by hand): hud writes every page, saying
    on the damaged run's own page why it cannot be read, and cuts the name on the index."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "h.sqlite"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_base()))
    assert _import(path, db)[0] == 0
    with sqlite3.connect(db) as conn:
        rid, text = conn.execute("SELECT id, report_json FROM runs ORDER BY id LIMIT 1").fetchone()
        report = json.loads(text)
        report["bundle"]["model"] = "x" * size
        conn.execute("UPDATE runs SET model = ?, report_json = ? WHERE id = ?", ("x" * size, json.dumps(report), rid))
    _hud_and_history_work(db, tmp_path)
    page = (tmp_path / "site" / "runs" / f"{rid}.html").read_text()
    assert "cannot be read" in page and "5000000 characters" in page
    assert (tmp_path / "site" / "index.html").stat().st_size < 200_000
