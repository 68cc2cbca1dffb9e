"""Issue 26 items 9 and 10: text from a bundle cannot forge a line or hide itself, and `--quiet`
never hides that the history was not recorded.

A real bundle (built by the real toolchain) gets a hostile model id and output name through
bundlerun's own API (re-sealed, so every reader accepts it) and a perturbed expected value, so the
run FAILS. The id holds a newline and a forged `PASS (PASS 8) ... exit code 0` line, a carriage
return, U+202E RIGHT-TO-LEFT OVERRIDE, U+2066, U+2028 and a terminal escape. Every format is read
from a real `bundlerun` process: console, GitHub annotations and step summary, Markdown, HTML,
JUnit, and the commands that show it later (compare, merge, history, hud, inspect). No doubles.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402

from bundlerun.bundles.bpte import read_bundle, write_bundle  # noqa: E402

FORGED = "PASS (PASS 8) in 0.1 s \u2014 exit code 0"
HOSTILE_ID = f"mlp\n{FORGED}\r\u202eevil\u2066\u2028\x1b[2J"
RAW = ("\r", "\x1b", "\u202e", "\u2066", "\u2028", "\x85")  # must never reach any output raw
VERDICT_LINE = re.compile(r"^\s*(PASS|FAIL|ERROR) \(.*\) in [0-9.]+ s — exit code \d+\s*$")


@pytest.fixture(scope="module")
def hostile(bundle_cache, tmp_path_factory) -> Path:
    bundle = copy.deepcopy(read_bundle(bundle_cache("mlp", cases=2)))
    bundle.manifest_json["model"]["id"] = HOSTILE_ID
    bundle.manifest_json["methods"]["forward"]["outputs"][0]["name"] = f"out\n{FORGED}\u202e"
    value = bundle.method_test_suites[0].test_cases[0].expected_outputs[0]
    value.data = (value.to_array() + np.float32(1.0)).tobytes()  # case 0 fails
    path = tmp_path_factory.mktemp("hostile") / "hostile.bpte"
    write_bundle(bundle, path)
    return path


def _clean(where: str, text: str) -> None:
    for ch in RAW:
        assert ch not in text, f"{where}: raw {ch!r} reached the output"


def _no_forged_line(where: str, text: str, expected: str | None) -> None:
    verdicts = [line for line in text.splitlines() if VERDICT_LINE.match(line)]
    assert verdicts == ([expected] if expected else []), f"{where}: verdict lines {verdicts}"
    assert not any(line.lstrip().startswith(FORGED[:13]) for line in text.splitlines()), f"{where}: forged line"


def test_every_format_shows_hostile_text_inert(hostile, tmp_path):
    step = tmp_path / "step.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step), "GITHUB_WORKSPACE": str(tmp_path)}
    out = tmp_path / "r"
    r = run_cli("run", str(hostile), "--report", str(out), "--history", str(tmp_path / "h.sqlite"), env=env)
    assert r.returncode == 1, r.stdout + r.stderr  # the failing run stays a failing run
    both = r.stdout + "\n" + r.stderr
    _clean("console", both)
    _no_forged_line("console", both, next(line for line in both.splitlines() if line.startswith("FAIL (")))
    assert "\\x0a" in r.stdout and "\\u202e" in r.stdout  # shown, as escapes
    annotations = [line for line in r.stdout.splitlines() if line.startswith("::")]
    assert annotations and all("\\u202e" in line for line in annotations)
    for name in ("summary.md", "report.html", "junit.xml"):
        text = (out / name).read_text()
        _clean(name, text)
        assert "\\u202e" in text, name
        _no_forged_line(name, text, None)
    _clean("step summary", step.read_text())
    suites = ET.parse(out / "junit.xml").getroot()  # still valid XML
    names = [tc.get("name") for tc in suites.iter("testcase")]
    assert names and all("\n" not in n and "\\x0a" in n for n in names)
    report = json.loads((out / "report.json").read_text())
    assert report["bundle"]["model"] == HOSTILE_ID  # the record keeps the exact text

    # the commands that show it again later
    db = str(tmp_path / "h.sqlite")
    for args in (("compare", str(out), str(out)), ("merge", str(out), "--report", str(tmp_path / "m")),
                 ("history", "--history", db), ("hud", "--out", str(tmp_path / "site"), "--db", db),
                 ("inspect", str(hostile)), ("trend", HOSTILE_ID, "-o", str(tmp_path / "t.png"), "--history", db)):
        res = run_cli(*args)
        assert res.returncode in (0, 1), (args, res.stdout, res.stderr)
        _clean(args[0], res.stdout + res.stderr)
        _no_forged_line(args[0], res.stdout + res.stderr, None)
        assert "Traceback" not in res.stderr
    site = (tmp_path / "site" / "index.html").read_text()
    _clean("hud", site)
    assert "\\u202e" in site
    for page in (tmp_path / "site" / "runs").glob("*.html"):
        _clean(page.name, page.read_text())
    _clean("merged summary.md", (tmp_path / "m" / "summary.md").read_text())


def test_quiet_and_json_still_say_history_was_not_recorded(hostile, tmp_path):
    blocked = tmp_path / "history-is-a-folder"
    blocked.mkdir()
    for mode in ("--quiet", "--json"):
        r = run_cli("run", str(hostile), "--report", str(tmp_path / mode.strip("-")), "--history", str(blocked), mode)
        assert r.returncode == 1, r.stdout + r.stderr
        lines = [line for line in r.stderr.splitlines() if "history not recorded" in line]
        assert len(lines) == 1 and lines[0].startswith("warning: ") and str(blocked) in lines[0], r.stderr
        report = json.loads((tmp_path / mode.strip("-") / "report.json").read_text())
        assert any("history not recorded" in w for w in report["warnings"])
    r = run_cli("run", str(hostile), "--report", str(tmp_path / "ok"), "--history", str(tmp_path / "h.sqlite"),
                "--quiet")
    assert "history not recorded" not in r.stderr  # said only when it is true
