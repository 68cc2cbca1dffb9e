"""The writer registry (runner/writers/__init__.py): a report format is one module that registers
itself, and write_reports writes every registered format from a typed Report. No doubles: the
reports come from the real judge (tests/report_samples.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import report_samples as rs  # noqa: E402

from bundlerun.runner import writers  # noqa: E402
from bundlerun.runner.report.model import Report  # noqa: E402
from bundlerun.runner.writers import Writer, WriterError, register, write_reports  # noqa: E402


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry for this test: what it registers is gone afterwards."""
    monkeypatch.setattr(writers, "_REGISTRY", dict(writers.registered()))
    return writers


def _cases_csv(report: Report, path: Path, inputs: writers.Inputs) -> Path:
    path.write_text("".join(f"{c.method},{c.case},{c.verdict}\n" for c in report.cases))
    return path


def test_the_built_in_formats_and_their_files():
    known = writers.registered()
    assert {name: w.filename for name, w in known.items()} == {
        "junit": "junit.xml", "markdown": "summary.md", "html": "report.html", "json": "report.json",
        "github-summary": None}  # GitHub's step summary is a file GitHub names, not one of the folder
    assert [name for name, w in known.items() if w.record] == ["json"]


def test_a_writer_registered_in_a_test_is_written(registry, tmp_path):
    @registry.writer("cases-csv", "cases.csv", "case list")
    def write_csv(report, path, inputs):
        return _cases_csv(report, path, inputs)

    assert registry.registered()["cases-csv"].write is write_csv
    report = Report.from_json(rs.quick_report(errors={1: "error"}))
    files = write_reports(report, tmp_path, formats=("cases-csv", "junit"))
    assert files == {"cases-csv": tmp_path / "cases.csv", "junit": tmp_path / "junit.xml"}
    assert (tmp_path / "cases.csv").read_text() == "forward,0,PASS\nforward,1,ERROR\nforward,2,PASS\nforward,3,PASS\n"
    assert not (tmp_path / "summary.md").exists()  # only the formats asked for


def test_a_new_module_in_the_package_is_a_new_format(registry, monkeypatch, tmp_path):
    """One new module and nothing else: write_reports finds it by importing the package's modules."""
    pkg = tmp_path / "extra"
    pkg.mkdir()
    (pkg / "caselist.py").write_text(
        "from bundlerun.runner.writers import writer\n\n"
        "@writer('caselist', 'cases.txt', 'case list')\n"
        "def _write(report, path, inputs):\n"
        "    path.write_text(str(len(report.cases)))\n"
        "    return path\n")
    monkeypatch.setattr(writers, "__path__", [*writers.__path__, str(pkg)])
    monkeypatch.setattr(writers, "_discovered", False)
    monkeypatch.delitem(sys.modules, "bundlerun.runner.writers.caselist", raising=False)
    try:
        assert "caselist" in registry.registered()
        files = write_reports(Report.from_json(rs.quick_report()), tmp_path / "out", formats=("caselist",))
    finally:
        sys.modules.pop("bundlerun.runner.writers.caselist", None)
    assert files == {"caselist": tmp_path / "out" / "cases.txt"} and files["caselist"].read_text() == "4"


def test_default_writes_every_registered_format(registry, tmp_path):
    registry.writer("cases-csv", "cases.csv", "case list")(_cases_csv)
    report = Report.from_json(rs.quick_report())
    files = write_reports(report, tmp_path)
    assert set(files) == {"junit", "markdown", "html", "cases-csv", "json"}, report.warnings
    assert all(p.is_file() and p.parent == tmp_path for p in files.values())
    # the record is written last and lists every file, itself included
    record = json.loads((tmp_path / "report.json").read_text())
    assert record["files"] == {k: str(v) for k, v in files.items()} == report.files


def test_an_unknown_format_is_a_clear_error_and_writes_nothing(tmp_path):
    report = Report.from_json(rs.quick_report())
    with pytest.raises(WriterError, match=r"unknown report format 'junt' \(did you mean 'junit'\?\); "
                                          r"registered: github-summary, html, json, junit, markdown"):
        write_reports(report, tmp_path / "out", formats=("markdown", "junt"))
    assert not (tmp_path / "out").exists()


def test_two_writers_cannot_claim_one_name_or_one_file(registry):
    with pytest.raises(WriterError, match="report format 'junit' .* clashes with 'junit'"):
        register(Writer("junit", "other.xml", _cases_csv))
    with pytest.raises(WriterError, match="'md2' .*summary.md.* clashes with 'markdown'"):
        register(Writer("md2", "summary.md", _cases_csv))


def test_a_writer_that_cannot_write_is_a_warning_and_an_unwritten_entry(registry, tmp_path):
    def full_disk(report, path, inputs):
        raise OSError(28, "No space left on device", str(path))

    registry.register(Writer("full", "full.bin", full_disk, "Full-disk report"))
    report = Report.from_json(rs.quick_report())
    files = write_reports(report, tmp_path, formats=("full", "junit"))
    assert files == {"junit": tmp_path / "junit.xml"}  # the others are still written
    assert report.warnings[-1] == f"Full-disk report not written: [Errno 28] No space left on device: '{tmp_path / 'full.bin'}'"
    assert report.unwritten == [{"file": str(tmp_path / "full.bin"), "error": "No space left on device"}]


def test_a_writer_bug_is_not_hidden_as_a_warning(registry, tmp_path):
    def broken(report, path, inputs):
        raise KeyError("a bug")

    registry.register(Writer("broken", "broken.txt", broken, "Broken report"))
    with pytest.raises(KeyError):
        write_reports(Report.from_json(rs.quick_report()), tmp_path, formats=("broken",))
