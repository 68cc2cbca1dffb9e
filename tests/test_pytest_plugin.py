"""The pytest plugin, driven the way a user drives it: pytest in a fresh process on a folder of
real bundles (built by the real toolchain), on the real host runtime. Plugin autoloading is
off in those processes and the plugin is named with -p, so the outcome does not depend on which
other pytest plugins this machine has installed."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bundlerun.bundles.bpte import read_bundle, write_bundle

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "bundlerun.runner.pytest_plugin"


def _pytest(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)  # this suite may itself run under xdist
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-rA", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _junit(path: Path) -> dict[str, dict]:
    """testcase name -> {"outcome", "message", "text", "props"} (subtest entries left out)."""
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        outcome, message, text = "passed", None, None
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome, message, text = tag, el.get("message"), el.text
        out.setdefault(tc.get("name"), []).append({"outcome": outcome, "message": message, "text": text,
                                                   "props": props, "classname": tc.get("classname")})
    return out


@pytest.fixture(scope="module")
def suite(bundle_cache, tmp_path_factory):
    """A folder holding a passing bundle and a failing one (case 1's expected output moved)."""
    folder = tmp_path_factory.mktemp("plugin-suite")
    good = read_bundle(bundle_cache("mlp", cases=2))
    write_bundle(good, folder / "good.bpte")
    bad = read_bundle(bundle_cache("mlp", cases=2))
    values = bad.suite("forward").test_cases[1].expected_outputs[0].to_array().copy()
    values[0, 4] += 0.5
    bad.suite("forward").test_cases[1].expected_outputs[0].data = values.tobytes()
    write_bundle(bad, folder / "bad.bpte")
    return folder


def test_import_is_cheap_and_inactive_without_options(tmp_path):
    code = ("import sys, bundlerun.runner.pytest_plugin as p; "
            "heavy = [m for m in ('torch', 'numpy', 'executorch', 'bundlerun.runner.session') if m in sys.modules]; "
            "print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout
    (tmp_path / "test_plain.py").write_text("def test_one():\n    assert True\n")
    (tmp_path / "x.bpte").write_bytes(b"not a bundle")  # nothing may look at it without an option
    r = _pytest(tmp_path, "--junitxml", str(tmp_path / "j.xml"))
    assert r.returncode == 0, r.stdout[-3000:]
    assert list(_junit(tmp_path / "j.xml")) == ["test_one"]
    assert "bundlerun" not in r.stdout.split("short test summary")[0].split("rootdir")[0]


def test_verdicts_become_outcomes_with_the_report_attached(suite, tmp_path):
    (tmp_path / "test_uses_fixture.py").write_text(
        "from pathlib import Path\n"
        f"BUNDLES = Path({str(suite)!r})\n"
        "def test_leased_target_runs_a_bundle(bundlerun_target, tmp_path):\n"
        "    report = bundlerun_target.run(BUNDLES / 'good.bpte', tmp_path / 'r')\n"
        "    assert bundlerun_target.url == 'host://xnnpack' and bundlerun_target.worker == 'master'\n"
        "    assert report['summary']['verdict'] == 'PASS' and (tmp_path / 'r' / 'report.json').is_file()\n")
    r = _pytest(tmp_path, "--bundlerun-target", "host://xnnpack", "--bundlerun-bundles", str(suite / "*.bpte"),
                "--junitxml", str(tmp_path / "j.xml"), "--bundlerun-report", str(tmp_path / "reports"))
    assert r.returncode == 1, r.stdout[-4000:]
    cases = _junit(tmp_path / "j.xml")
    good, bad = cases["good[host://xnnpack]"][0], cases["bad[host://xnnpack]"][0]
    assert cases["test_leased_target_runs_a_bundle"][0]["outcome"] == "passed"
    assert good["outcome"] == "passed" and good["props"]["bundlerun_verdict"] == "PASS"
    assert good["classname"] == "bundlerun"
    assert bad["outcome"] == "failure" and bad["props"]["bundlerun_verdict"] == "FAIL"
    # the failure names the worst output with its numbers
    assert "bundlerun FAIL: 1 of 2 cases failed (1 of 2 outputs)" in bad["text"]
    assert "worst output: forward[1].out0" in bad["text"] and "elementwise: measured 0.5" in bad["text"]
    assert "worst element [0, 4]" in bad["text"]
    for item in (good, bad):
        report_dir = Path(item["props"]["bundlerun_report"])
        assert report_dir.parent == tmp_path / "reports" / "master"
        assert {p.name for p in report_dir.iterdir()} >= {"report.json", "junit.xml", "summary.md", "report.html"}
        assert item["props"]["bundlerun_target"] == "host://xnnpack"
    # per-case subtests: case 1 of the bad bundle failed, shown as its own entry
    assert "SUBFAILED[forward[1]] (verdict='FAIL') bundlerun::bad[host://xnnpack]" in r.stdout, r.stdout[-4000:]
    assert "SUBFAILED[forward[0]]" not in r.stdout
    assert "FAILED bundlerun::bad[host://xnnpack]" in r.stdout
    # -k selects among the bundle items like any test
    r = _pytest(tmp_path, "--bundlerun-target", "host://xnnpack", "--bundlerun-bundles", str(suite / "*.bpte"),
                "-k", "good", "--bundlerun-no-subtests", "--junitxml", str(tmp_path / "k.xml"))
    assert r.returncode == 0, r.stdout[-3000:]
    assert list(_junit(tmp_path / "k.xml")) == ["good[host://xnnpack]"]


def test_infrastructure_error_is_a_pytest_error_and_models_are_built(suite, tmp_path):
    r = _pytest(tmp_path, "--bundlerun-target", "adb+tcp://127.0.0.1:9", "--bundlerun-bundles", str(suite / "good.bpte"),
                "--bundlerun-target", "host://xnnpack", "--bundlerun-models", "mlp", "--bundlerun-dtype", "fp32",
                "--bundlerun-cases", "2", "--junitxml", str(tmp_path / "j.xml"))
    assert r.returncode == 1, r.stdout[-4000:]
    cases = _junit(tmp_path / "j.xml")
    assert sorted(cases) == ["good[adb+tcp://127.0.0.1:9]", "good[host://xnnpack]", "mlp-fp32[adb+tcp://127.0.0.1:9]",
                             "mlp-fp32[host://xnnpack]"]
    for name in ("good[adb+tcp://127.0.0.1:9]", "mlp-fp32[adb+tcp://127.0.0.1:9]"):
        err = cases[name][0]
        assert err["outcome"] == "error", err
        assert "bundlerun ERROR (infrastructure, exit code 2): 2 of 2 cases could not run" in err["text"]
        assert err["props"]["bundlerun_verdict"] == "ERROR"
    assert cases["mlp-fp32[host://xnnpack]"][0]["outcome"] == "passed"
    assert "2 passed, 2 errors" in r.stdout.splitlines()[-1], r.stdout.splitlines()[-1]


def test_xdist_workers_lease_the_devices_of_a_pool(suite, tmp_path):
    pytest.importorskip("xdist")
    pool = "host://xnnpack?threads=1,host://xnnpack?threads=2"
    (tmp_path / "test_lease.py").write_text(
        "def test_lease(bundlerun_target, record_property):\n"
        "    record_property('leased', bundlerun_target.url)\n"
        "    record_property('worker', bundlerun_target.worker)\n"
        f"    assert bundlerun_target.pool == {pool.split(',')!r}\n")
    r = _pytest(tmp_path, "-p", "xdist.plugin", "-n", "2", "--bundlerun-target", pool,
                "--bundlerun-bundles", str(suite / "good.bpte"), "--bundlerun-models", "mlp,tiny-gru",
                "--bundlerun-cases", "2", "--bundlerun-dtype", "fp32", "--bundlerun-no-subtests",
                "--junitxml", str(tmp_path / "j.xml"))
    assert r.returncode == 0, r.stdout[-4000:]
    cases = _junit(tmp_path / "j.xml")
    assert len(cases) == 4
    by_worker: dict[str, set] = {}
    for name, entries in cases.items():
        props = entries[0]["props"]
        worker = props.get("bundlerun_worker") or props.get("worker")
        url = props.get("bundlerun_target") or props.get("leased")
        by_worker.setdefault(worker, set()).add(url)
    assert by_worker == {"gw0": {"host://xnnpack?threads=1"}, "gw1": {"host://xnnpack?threads=2"}}, by_worker


def test_fixture_skips_without_a_target(tmp_path):
    (tmp_path / "test_f.py").write_text("def test_f(bundlerun_target):\n    pass\n")
    r = _pytest(tmp_path)
    assert r.returncode == 0 and "1 skipped" in r.stdout and "needs --bundlerun-target" in r.stdout, r.stdout[-2000:]


def test_entry_point_is_declared():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"bundlerun": PLUGIN}
