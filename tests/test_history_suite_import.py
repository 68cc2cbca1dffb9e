"""`bundlerun history import`: the backend test suite's CSV (written by the suite's own
reporting.write_csv_row from its own TestCaseSummary records) and its pytest-json-report format
into the history; bad files are one line. The real CLI in a fresh process."""

from __future__ import annotations

import io
import json
import sqlite3

import pytest
import torch


def _suite_csv(path):
    """A CSV exactly as the suite writes it (reporting.py), from its own records and statistics."""
    from executorch.backends.test.harness.error_statistics import ErrorStatistics
    from executorch.backends.test.suite.reporting import TestCaseSummary, TestResult, write_csv_header, write_csv_row

    ref = torch.linspace(-1, 1, 64)
    good = ErrorStatistics.from_tensors(ref + 1e-4, ref)
    bad = ErrorStatistics.from_tensors(ref + 0.3, ref)
    rows = [
        TestCaseSummary("xnnpack", "test_conv2d_k3", "xnnpack", "test_conv2d_k3[xnnpack]", 0, None,
                        TestResult.SUCCESS, None, [good, good]),
        TestCaseSummary("xnnpack", "test_conv2d_k3", "xnnpack", "test_conv2d_k3[xnnpack]", 1, None,
                        TestResult.OUTPUT_MISMATCH_FAIL, AssertionError("Output 0 does not match"), [bad]),
        TestCaseSummary("xnnpack", "test_maxpool2d_ceil", "xnnpack", "test_maxpool2d_ceil[xnnpack]", 0,
                        {"dtype": torch.float32}, TestResult.LOWER_FAIL, RuntimeError("partitioner"), []),
        TestCaseSummary("portable", "test_gelu_tanh", "portable", "test_gelu_tanh[portable-float16]", 0,
                        {"dtype": torch.float16}, TestResult.SKIPPED, None, []),
    ]
    buf = io.StringIO()
    write_csv_header(buf)
    for r in rows:
        write_csv_row(r, buf)
    path.write_text(buf.getvalue())
    return good, bad


def test_the_suites_csv_into_the_history(tmp_path, cli):
    csv_path, db = tmp_path / "report.csv", tmp_path / "h.sqlite"
    good, bad = _suite_csv(csv_path)
    res = cli("history", "import", str(csv_path), "--commit", "0123456789abcdef0123", "--history", str(db))
    assert res.returncode == 0, res.stderr
    assert "4 run(s) recorded" in res.stdout and "commit 0123456789abcdef0123" in res.stdout
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT r.model, r.target, r.dtype, r.verdict, r.label, t.flow, t.operator, t.source, "
                            "t.suite_result, t.suite_detail FROM runs r JOIN run_tags t ON t.run_id = r.id "
                            "ORDER BY r.id").fetchall()
        outs = conn.execute("SELECT error_max, error_mae, sqnr FROM case_outputs ORDER BY run_id, output_index").fetchall()
    assert runs == [
        ("test_conv2d_k3[xnnpack]", "host (suite)", "fp32", "PASS", "0123456789ab", "xnnpack", "conv2d", "suite",
         "Pass", None),
        ("test_conv2d_k3[xnnpack]#1", "host (suite)", "fp32", "FAIL", "0123456789ab", "xnnpack", "conv2d", "suite",
         "Fail", "Output Mismatch"),
        ("test_maxpool2d_ceil[xnnpack]", "host (suite)", "fp32", "FAIL", "0123456789ab", "xnnpack", "maxpool2d",
         "suite", "Fail", "Lowering Failed"),
        ("test_gelu_tanh[portable-float16]", "host (suite)", "fp16", "SKIP", "0123456789ab", "portable", "gelu",
         "suite", "Skip", None),
    ]
    # the suite's 3-decimal statistics, both outputs of the first subtest
    assert outs[0] == (pytest.approx(round(good.error_max, 3)), pytest.approx(round(good.error_mae, 3)),
                       pytest.approx(round(good.sqnr, 3)))
    assert len(outs) == 3 and outs[2][0] == pytest.approx(round(bad.error_max, 3))
    # the listing still works beside the new subcommand
    res = cli("history", "--history", str(db), "--json", "--limit", "2")
    assert res.returncode == 0 and [r["model"] for r in json.loads(res.stdout)] == [
        "test_gelu_tanh[portable-float16]", "test_maxpool2d_ceil[xnnpack]"]
    again = cli("history", "import", str(csv_path), "--commit", "0123456789abcdef0123", "--history", str(db))
    assert "0 run(s) recorded, 4 already there" in again.stdout


def test_json_report_commit_from_its_environment(tmp_path, cli):
    db = tmp_path / "h.sqlite"
    report = {"created": 1764500000.0, "environment": {"CI_COMMIT_SHA": "feedfacecafebeef0000"}, "tests": [
        {"nodeid": "operators/test_add.py::test_add_f32_alpha[xnnpack]", "outcome": "passed", "call": {"duration": 1.5},
         "metadata": {"subtests": [{"Test ID": "test_add_f32_alpha[xnnpack]", "Test Case": "test_add_f32_alpha",
                                    "Subtest": 0, "Flow": "xnnpack", "Result": "Pass", "Result Detail": "",
                                    "Output 0 Error Max": "0.000", "Output 0 Error MAE": "0.000",
                                    "Output 0 SNR": "inf"}]}},
        {"nodeid": "operators/test_add.py::test_add_dtype[xnnpack-float32]", "outcome": "skipped",
         "metadata": {"subtests": []}}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    res = cli("history", "import", str(path), "--history", str(db))
    assert res.returncode == 0 and "1 run(s) recorded" in res.stdout and "feedfacecafebeef0000" in res.stdout
    with sqlite3.connect(db) as conn:
        (label, started, commit_source, sqnr) = conn.execute(
            "SELECT r.label, r.started, t.commit_source, c.sqnr FROM runs r JOIN run_tags t ON t.run_id = r.id "
            "JOIN case_outputs c ON c.run_id = r.id").fetchone()
    assert label == "feedfacecafe" and commit_source == "report environment CI_COMMIT_SHA"
    assert started.startswith("2025-11-30T") and sqnr == float("inf")  # exact: the suite's "inf"


@pytest.mark.parametrize("content, message", [
    (b"", "neither a pytest-json-report file nor the suite's CSV"),
    (b"{\"tests\": 3}", "not a pytest-json-report file (no 'tests' list)"),
    (b"{not json", "not valid JSON"),
    (b"a,b\n1,2\n", "neither a pytest-json-report file nor the suite's CSV (needs the columns Test ID, Flow, Result)"),
    (json.dumps({"tests": [{"nodeid": "x.py::t", "outcome": "passed"}]}).encode(), "carry no suite metadata"),
])
def test_bad_files_are_one_line(tmp_path, cli, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    res = cli("history", "import", str(path), "--history", str(tmp_path / "h.sqlite"), "--commit", "abc1234")
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = cli("history", "import", str(tmp_path / "missing.json"), "--history", str(tmp_path / "h.sqlite"))
    assert res.returncode == 2 and "missing.json: no such file" in res.stderr
