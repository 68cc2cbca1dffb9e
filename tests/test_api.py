"""The Python API (bundlerun.api) as docs/api.md shows it: every `python` block of that page runs
here, in order, in one namespace, so the documented example cannot drift from the code. It uses
the real lowering (XNNPACK) and the real runtime (host://xnnpack)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_the_documented_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 2
    namespace: dict = {"__name__": "api_example"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    report = namespace["report"]
    assert report.summary.verdict == "PASS" and {c.method for c in report.cases} == {"forward", "features"}
    assert (namespace["work"] / "report" / "report.json").is_file()
    strict = namespace["strict"]
    assert strict.summary.exit_code in (0, 1) and strict.judged["previous_summary"]["exit_code"] == 0


def test_run_without_a_report_folder_keeps_nothing_and_returns_typed_records(tmp_path, bundle_cache, monkeypatch):
    import tempfile

    from bundlerun import api
    from bundlerun.runner.report.model import CaseRecord, Report

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where api.run's scratch folder goes
    bundle = bundle_cache("mlp", backend="portable", cases=2, target="host://portable")
    report = api.run(bundle, target="host://portable", overrides=["out0.atol=0", "out0.rtol=0"])
    assert isinstance(report, Report) and all(isinstance(c, CaseRecord) for c in report.cases)
    assert report.summary.verdict == "FAIL" and report.summary.exit_code == 1
    assert report.failures() and report.failures()[0].startswith("forward[0].out0: FAIL (elementwise")
    assert list(tmp_path.glob("bundlerun-run-*")) == []  # the scratch folder is gone


def test_bad_input_is_one_line_errors(tmp_path, monkeypatch):
    import tempfile

    from bundlerun import api
    from bundlerun.bundles.errors import BundlerunError

    scratch = tmp_path / "temp"  # where a build without `output` makes its folder
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    bad = tmp_path / "x.bpte"
    bad.write_bytes(b"nope")
    with pytest.raises(BundlerunError, match="not a BundleIO program|too short"):
        api.run(bad)
    with pytest.raises(BundlerunError, match="example_inputs"):
        api.build(__import__("torch").nn.Linear(2, 2))
    with pytest.raises(BundlerunError, match="expected outputs or a reference"):
        api.bundle_program(b"\0" * 8, [(1,)], backend="portable")
    assert list(scratch.iterdir()) == []  # a failed build leaves no folder behind
