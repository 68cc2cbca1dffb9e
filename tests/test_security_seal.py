"""Issue 26 item 3: sealed-only bundles, and criteria that check nothing.

Every test goes through the real `bundlerun` entry point in a fresh process, on real bundles built by
the real toolchain (tests/conftest.py bundle_cache), run on the real host runtime. No doubles.

The attack of the issue, byte for byte: the manifest's `"integrity": {...}` overwritten with spaces
(same length, still valid JSON), then an expected value and an `atol` edited in place. Without
`--require-seal` that bundle is only a warning and a PASS (documented in docs/security.md); with it,
and by default whenever $CI is set, it is refused with one line.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402

from bundlerun.bundles.bpte import parse_bundle, read_bundle, serialize_bundle, write_bundle  # noqa: E402

NOT_SEALED = "is not sealed"


@pytest.fixture(scope="module")
def mlp(bundle_cache) -> Path:
    return bundle_cache("mlp", cases=2)


def blank_seal_and_loosen(src: Path, dst: Path) -> Path:
    """What a hex editor can do: spaces over the integrity section, atol 0.001 -> 0.099, +0.05 on an
    expected value, every edit the same length so the flatbuffer stays valid (and loose enough to
    pass, not so loose that the vacuity rule would catch it)."""
    buf = bytearray(src.read_bytes())
    text = buf.decode("latin-1")
    match = re.search(r',"integrity":\{[^{}]*\{[^{}]*\}[^{}]*\}', text)
    assert match, "the built bundle carries a seal"
    buf[match.start():match.end()] = b" " * (match.end() - match.start())
    at = buf.decode("latin-1").index('"atol":0.001')
    buf[at:at + 12] = b'"atol":0.099'
    value = parse_bundle(bytes(buf), "x").method_test_suites[0].test_cases[0].expected_outputs[0]
    arr = value.to_array().copy()
    arr.flat[0] += 0.05
    offset = bytes(buf).index(value.data)
    buf[offset:offset + len(value.data)] = arr.tobytes()
    dst.write_bytes(bytes(buf))
    return dst


def _one_error_line(stderr: str, needle: str) -> None:
    lines = [line for line in stderr.splitlines() if needle in line]
    assert len(lines) == 1 and lines[0].startswith("bundlerun: error: "), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr


def test_blanked_seal_passes_only_without_require_seal(mlp, tmp_path):
    bad = blank_seal_and_loosen(mlp, tmp_path / "blanked.bpte")
    assert read_bundle(bad).manifest.integrity is None  # it reads as an unsealed bundle
    # outside CI, as documented: a warning and the loosened verdict
    r = run_cli("run", str(bad), "--report", str(tmp_path / "lax"), "--no-history", env={"CI": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "predates integrity hashes" in r.stdout
    # --require-seal, $CI set (GitHub/GitLab set CI=true): refused in one line, nothing run
    for args, env in (((("--require-seal",), {"CI": ""})), (((), {"CI": "true"}))):
        out = tmp_path / f"strict-{len(args)}"
        r = run_cli("run", str(bad), "--report", str(out), "--no-history", *args, env=env)
        assert r.returncode == 2, r.stdout + r.stderr
        _one_error_line(r.stderr, NOT_SEALED)
        assert "--no-require-seal" in r.stderr and not (out / "report.json").exists()
    # the escape hatch in CI, with the warning
    r = run_cli("run", str(bad), "--report", str(tmp_path / "escape"), "--no-history", "--no-require-seal",
                env={"CI": "true"})
    assert r.returncode == 0 and "predates integrity hashes" in r.stdout, r.stdout + r.stderr


def test_stock_bundle_without_manifest_has_no_seal(mlp, tmp_path):
    stock = tmp_path / "stock.bpte"
    stock.write_bytes(serialize_bundle(replace(read_bundle(mlp), manifest_json=None)))
    r = run_cli("run", str(stock), "--report", str(tmp_path / "r"), "--no-history", "--require-seal")
    assert r.returncode == 2
    _one_error_line(r.stderr, "has no bundlerun manifest, so no seal")


def test_judge_and_farm_refuse_unsealed_bundles(mlp, tmp_path):
    bad = blank_seal_and_loosen(mlp, tmp_path / "blanked.bpte")
    saved = tmp_path / "saved"
    r = run_cli("run", str(bad), "--report", str(saved), "--no-history", "--save-outputs", "--no-require-seal")
    assert r.returncode == 0, r.stderr
    r = run_cli("judge", str(saved), "--require-seal", env={"CI": ""})
    assert r.returncode == 2
    _one_error_line(r.stderr, NOT_SEALED)
    r = run_cli("judge", str(saved), "--quiet", env={"CI": "1"})
    assert r.returncode == 2 and NOT_SEALED in r.stderr
    assert run_cli("judge", str(saved), "--quiet", env={"CI": "false"}).returncode == 0
    plan = tmp_path / "plan.toml"
    plan.write_text(f'bundles = ["{bad}"]\ntargets = ["host://portable"]\nretries = 0\n')
    r = run_cli("farm", str(plan), "--report", str(tmp_path / "farm"), "--no-history", "--require-seal", "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    job = json.loads(r.stdout)["jobs"][0]
    report = json.loads(Path(job["report"]).read_text())
    assert job["verdict"] == "ERROR" and any(NOT_SEALED in w for w in report["warnings"]), report["warnings"]
    for command in ("run", "validate", "judge", "farm"):  # documented on every command that judges
        assert "--require-seal" in run_cli(command, "--help").stdout


def _resealed(mlp: Path, path: Path, expected_shift: float = 0.0, **criteria) -> Path:
    """Criteria changed through bundlerun's own API, which re-seals (docs/security.md: the seal is
    not a signature), so only the schema and the vacuity rule stand between them and a verdict."""
    bundle = copy.deepcopy(read_bundle(mlp))
    bundle.manifest_json["methods"]["forward"]["outputs"][0]["criteria"].update(criteria)
    if expected_shift:
        for case in bundle.method_test_suites[0].test_cases:
            value = case.expected_outputs[0]
            value.data = (value.to_array() + np.float32(expected_shift)).astype(np.float32).tobytes()
    write_bundle(bundle, path)
    return path


@pytest.mark.parametrize("criteria", [{"atol": 1e30}, {"atol": None, "rtol": 5.0},
                                      {"atol": None, "rtol": None, "qtol": None, "rel_frobenius_max": 1.0}])
def test_vacuous_criteria_are_an_error_in_every_format(mlp, tmp_path, criteria):
    bundle = _resealed(mlp, tmp_path / "vacuous.bpte", **criteria)
    step = tmp_path / "step_summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step), "GITHUB_WORKSPACE": str(tmp_path)}
    r = run_cli("run", str(bundle), "--report", str(tmp_path / "r"), "--no-history", env=env)
    assert r.returncode == 2, r.stdout + r.stderr  # never a PASS
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["summary"]["verdict"] == "ERROR" and report["summary"]["counts"]["PASS"] == 0
    for case in report["cases"]:
        out = case["outputs"][0]
        assert out["verdict"] == "ERROR" and out["failed"][0]["criterion"] == "vacuous", out
        assert case["error_kind"] == "bad-bundle"
    assert any("vacuous criteria" in w for w in report["warnings"])
    assert "vacuous" in r.stdout  # the console
    assert any(line.startswith("::warning") and "vacuous" in line for line in r.stdout.splitlines())  # GitHub
    for name in ("junit.xml", "summary.md", "report.html"):
        assert "vacuous" in (tmp_path / "r" / name).read_text(), name
    assert "vacuous" in step.read_text()


def test_a_loose_criterion_still_fails_an_output_outside_it(mlp, tmp_path):
    """The rule only stops a PASS: an output wrong even by the loose bound stays a FAIL (exit 1)."""
    bundle = _resealed(mlp, tmp_path / "far.bpte", expected_shift=1e31, atol=1e30)
    r = run_cli("run", str(bundle), "--report", str(tmp_path / "r"), "--no-history", "--quiet")
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert {c["verdict"] for c in report["cases"]} == {"FAIL"}


def test_a_bound_that_overflows_to_infinity_is_refused_at_read(mlp, tmp_path):
    bundle = _resealed(mlp, tmp_path / "inf.bpte", qtol=1e300, scale=1e300)
    for args in (("inspect", str(bundle)), ("run", str(bundle), "--report", str(tmp_path / "r"), "--no-history")):
        r = run_cli(*args)
        assert r.returncode == 2, r.stdout + r.stderr
        _one_error_line(r.stderr, "overflows to infinity")
    assert not (tmp_path / "r" / "report.json").exists()
