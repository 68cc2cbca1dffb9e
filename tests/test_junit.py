"""JUnit XML (of a typed Report): validates against the Jenkins JUnit schema and carries the right verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lxml import etree

sys.path.insert(0, str(Path(__file__).parent))
import report_samples as rs  # noqa: E402

from bundlerun.runner.report.model import Report  # noqa: E402
from bundlerun.runner.writers.junit import write_junit  # noqa: E402

XSD = Path(__file__).parent / "data" / "junit.xsd"


@pytest.fixture(scope="module")
def schema():
    return etree.XMLSchema(etree.parse(str(XSD)))


def _mixed_report():
    """PASS, FAIL, ERROR, TIMEOUT and SKIP in one run, plus a control character in a log."""
    b = rs.make_bundle(cases=6)
    # case 1 fails numerically
    exp = b.suite("forward").test_cases[1].expected_outputs[0].to_array()
    run = rs.target_run(b, noise=1e-5, errors={2: "error", 3: "timeout", 4: "skip"}, outputs={1: exp + 0.5})
    report = rs.make_report(b, run, label="abc123")
    report["warnings"].append("a warning \x1b[31mwith ANSI\x1b[0m")
    return Report.from_json(report)


def test_junit_validates_and_maps_verdicts(tmp_path, schema):
    report = _mixed_report()
    path = write_junit(report, tmp_path / "junit.xml")
    doc = etree.parse(str(path))
    schema.assertValid(doc)
    cases = doc.findall(".//testcase")
    assert len(cases) == 6
    assert {c.get("classname") for c in cases} == {"mlp/host://xnnpack/forward"}
    by_name = {c.get("name"): c for c in cases}
    fail = by_name["case[1].out0"].find("failure")
    assert fail is not None and fail.get("message").startswith("elementwise: measured 0.5")
    assert fail.get("message").startswith("elementwise: measured 0.5 limit 0.00104") and "worst at" in fail.text
    err = by_name["case[2].out0"].find("error")
    assert err is not None and err.get("type") == "crash"
    assert by_name["case[3].out0"].find("error").get("type") == "timeout"
    assert by_name["case[4].out0"].find("skipped") is not None
    for ok in ("case[0].out0", "case[5].out0"):
        assert len(by_name[ok]) == 0
    suite = doc.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("6", "1", "2", "1")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["label"] == "abc123" and props["model"] == "mlp"
    # control characters from device logs are escaped, not written raw
    assert b"\x1b" not in path.read_bytes() and b"\x04" not in path.read_bytes()


def test_junitparser_reads_it_back(tmp_path):
    from junitparser import Error, Failure, JUnitXml, Skipped

    path = write_junit(_mixed_report(), tmp_path / "junit.xml")
    xml = JUnitXml.fromfile(str(path))
    kinds = []
    for suite in xml:
        for case in suite:
            kinds.append(tuple(type(r).__name__ for r in case.result))
    assert sorted(kinds) == sorted([(), ("Failure",), ("Error",), ("Error",), ("Skipped",), ()])
    assert Failure and Error and Skipped


def test_schema_rejects_what_it_should(schema):
    """The XSD is not a rubber stamp: a testcase without a name is invalid."""
    bad = etree.fromstring(b"<testsuites><testsuite name='s' tests='1'><testcase classname='c'/></testsuite></testsuites>")
    assert not schema.validate(bad)


def test_all_errored_run_still_valid(tmp_path, schema):
    b = rs.make_bundle(cases=2)
    report = Report.from_json(rs.make_report(b, rs.target_run(b, errors={0: "error", 1: "error"})))
    doc = etree.parse(str(write_junit(report, tmp_path / "j.xml")))
    schema.assertValid(doc)
    assert doc.find("testsuite").get("errors") == "2"


def test_hostile_text_gives_valid_xml(tmp_path, schema):
    """Terminal escapes, markup, C1 controls and a lone surrogate in the model id, output and
    method names, label, device error and log: the file is valid XML with them made visible."""
    evil = "evil<x>&\"'\x1b[31m[/x]\x07\x9b\x00\ud800\x04"
    b = rs.make_bundle(cases=3, model=evil)
    report = Report.from_json(rs.make_report(b, rs.target_run(b, noise=1e-2, errors={2: "error"}), label=evil))
    for case in report.cases:
        for out in case.outputs:
            out.name = evil + "out"
    report.cases[2].method, report.cases[2].error = evil + "method", evil + " device"
    report.cases[2].log_excerpt = [evil + " log"]
    report.run["started"] = evil
    path = write_junit(report, tmp_path / "junit.xml")
    raw = path.read_bytes()
    for ch in ("\x1b", "\x07", "\x00", "\x04", "\x9b"):
        assert ch.encode() not in raw, repr(ch)
    doc = etree.parse(str(path))  # parses: no raw control character, no unencodable surrogate
    schema.assertValid(doc)
    visible = "evil<x>&\"'\\x1b[31m[/x]\\x07\\x9b\\x00\\ud800\\x04"
    names = {c.get("name") for c in doc.iter("testcase")}
    assert names == {f"case[{i}].{visible}out" for i in (0, 1, 2)}
    assert {c.get("classname") for c in doc.iter("testcase")} == {
        f"{visible}/host://xnnpack/forward", f"{visible}/host://xnnpack/{visible}method"}
    props = {p.get("name"): p.get("value") for p in doc.iter("property")}
    assert props["model"] == visible and props["label"] == visible
    err = doc.find(".//error")
    assert err.get("message") == visible + " device" and doc.find(".//system-out").text == visible + " log"
