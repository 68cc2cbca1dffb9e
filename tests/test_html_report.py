"""HTML report: self-contained, plots embedded, renders in a real headless Chromium.

The writers take the typed `Report`; the samples are built as report.json dicts by the real judge
(tests/report_samples.py) and read with `Report.from_json`, as a report.json is. The history is
fed the dicts (runner/history/store.py reads report.json as stored)."""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import browser  # noqa: E402
import report_samples as rs  # noqa: E402

from bundlerun.runner.history import store as history  # noqa: E402
from bundlerun.runner.judging.accuracy import dataset_summary  # noqa: E402
from bundlerun.runner.report.model import Report  # noqa: E402
from bundlerun.runner.writers import write_reports  # noqa: E402

ARTIFACTS = Path(__file__).parent / "artifacts"


def _need_chromium() -> None:
    """The page is checked in a real browser: without one the test fails with the reason, never skips."""
    if browser.chromium_path() is None:
        pytest.fail("chromium is not installed (scripts/setup.sh installs it)")


def _report_with_history(tmp_path):
    """A failing run with saved outputs, a dataset section, and five earlier runs in history."""
    db = tmp_path / "history.sqlite"
    bundle = rs.make_bundle(cases=6, model="digits-mlp", dtype="int8")
    bundle_path = rs.write_stub_bundle(bundle, tmp_path / "digits.bpte")
    labels = np.arange(60) % 10
    rng = np.random.default_rng(0)
    for k, noise in enumerate((1e-4, 2e-4, 1e-4, 5e-4, 3e-3)):
        run = rs.target_run(bundle, noise=noise, seed=k)
        ref = rng.standard_normal((60, 10))
        ref[np.arange(60), labels] += 3
        act = ref + rng.standard_normal((60, 10)) * (0.2 + k * 0.3)
        history.record_report(db, Report.from_json(rs.make_report(bundle, run, bundle_path, label=f"commit{k}",
                                                 dataset=dataset_summary(act, ref, labels, "digits", 10))))
    run = rs.target_run(bundle, noise=4e-3, seed=9, errors={5: "timeout"})
    ref = rng.standard_normal((60, 10))
    ref[np.arange(60), labels] += 3
    act = ref + rng.standard_normal((60, 10)) * 1.5
    report = rs.make_report(bundle, run, bundle_path, label="commit5", dataset=dataset_summary(act, ref, labels, "digits", 10))
    history.record_report(db, Report.from_json(report))
    return Report.from_json(report), bundle_path, rs.saved_outputs(run), db


def test_html_is_self_contained_with_plots(tmp_path):
    report, bundle_path, outputs, db = _report_with_history(tmp_path)
    files = write_reports(report, tmp_path / "out", bundle=bundle_path, outputs=outputs, history_db=db)
    assert set(files) == {"junit", "markdown", "html", "json"}
    page = files["html"].read_text()
    # nothing is fetched from anywhere: no external src/href, no scripts
    assert not re.search(r'(src|href)=["\']?(https?:|//|file:)', page)
    assert "<script" not in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    # confusion matrix, SQNR per case + histogram + scatter for the output, trends for sqnr, mae, top1
    assert len(images) == 7
    for data in images:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Dataset accuracy: digits" in page and "TIMEOUT" in page and "History" in page


def test_html_without_outputs_shows_stats_only(tmp_path):
    report = Report.from_json(rs.quick_report(noise=1e-3))
    files = write_reports(report, tmp_path, formats=("html",))
    page = files["html"].read_text()
    # no arrays: no histogram or scatter; the SQNR per case is drawn from the report's own numbers
    assert "statistics only" in page and "alt=\"error histogram" not in page
    assert re.findall(r'<img class="plot" alt="([^"]+)"', page) == [f"sqnr per case forward/{report.cases[0].outputs[0].name}"]
    assert report.cases[0].outputs[0].name in page


def test_markdown_goes_to_github_step_summary(tmp_path, monkeypatch):
    summary = tmp_path / "step_summary.md"
    summary.write_text("previous step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    report = Report.from_json(rs.quick_report(noise=5e-2))
    files = write_reports(report, tmp_path / "out", formats=("markdown", "github-summary"))
    assert set(files) == {"markdown"}  # the step summary is not a file of the report folder
    text = summary.read_text()
    assert text.startswith("previous step\n")  # appended, not replaced
    assert "**FAIL**" in text and "elementwise" in text
    assert files["markdown"].read_text() in text


def test_html_renders_in_headless_chromium(tmp_path):
    _need_chromium()
    report, bundle_path, outputs, db = _report_with_history(tmp_path)
    files = write_reports(report, tmp_path / "out", bundle=bundle_path, outputs=outputs, history_db=db)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "html_report.png"
    check = browser.check_page(files["html"].resolve().as_uri(), shot)
    assert check.console_errors == []
    assert check.title.startswith("bundlerun: digits-mlp on host://xnnpack")
    assert len(check.images) == 7
    assert {i["alt"] for i in check.images} >= {"confusion matrix", "error histogram forward/out0", "trend top1",
                                               "sqnr per case forward/out0"}
    for img in check.images:
        assert img["complete"] and img["naturalWidth"] > 100 and img["naturalHeight"] > 100, img
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 1000 and height > 900  # the full page, longer than one screen


def test_browser_check_sees_broken_images_and_errors(tmp_path):
    """The checker itself must be able to fail: a broken image and a console error are seen."""
    _need_chromium()
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><head><link rel='icon' href='data:,'><title>bad</title></head><body>"
        "<img alt='broken' src='data:image/png;base64,AAAA'>"
        "<script>console.error('boom')</script></body></html>"
    )
    check = browser.check_page(page.as_uri(), tmp_path / "bad.png")
    assert any("boom" in e for e in check.console_errors)
    assert check.images[0]["naturalWidth"] == 0


# ------------------------------------------------------------------ hostile text from a bundle

EVIL = "evil<script>alert(1)</script>&amp;\"'\x1b[31m[/x]$\\foo{$\x07\x9b2J\ud800\x04"
CONTROLS = ("\x1b", "\x07", "\x9b", "\x04", "\ud800")


def _hostile_report(tmp_path):
    """Terminal escapes, HTML, rich markup and matplotlib mathtext in the model id, an output
    name, a method name, a label, the device's error text and log, and a warning."""
    db = tmp_path / "history.sqlite"
    bundle = rs.make_bundle(cases=4, model=EVIL)
    bundle_path = rs.write_stub_bundle(bundle, tmp_path / "evil.bpte")
    run = rs.target_run(bundle, noise=1e-2, errors={3: "error"})
    report = rs.make_report(bundle, run, bundle_path, label=EVIL)
    for case in report["cases"]:
        for out in case["outputs"]:
            out["name"] = EVIL + "out"
    report["cases"][3].update(method=EVIL + "method", error=EVIL + " device said", log_excerpt=[EVIL + " log"])
    report["warnings"].append(EVIL + " warning")
    history.record_report(db, Report.from_json(report))
    return Report.from_json(report), bundle_path, rs.saved_outputs(run), db


def test_hostile_text_is_inert_in_html(tmp_path):
    report, bundle_path, outputs, db = _hostile_report(tmp_path)
    files = write_reports(report, tmp_path / "out", bundle=bundle_path, outputs=outputs, history_db=db)
    assert set(files) == {"junit", "markdown", "html", "json"}, report.warnings
    assert not any("not written" in w for w in report.warnings)  # the mathtext did not break a plot
    page = files["html"].read_text(encoding="utf-8")
    for ch in CONTROLS:
        assert ch not in page, repr(ch)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&amp;amp;&quot;&#x27;" in page  # entities and quotes escaped, not interpreted
    assert "\\x1b[31m[/x]$\\foo{$\\x07\\x9b2J\\ud800\\x04" in page  # the escapes are visible as text
    for where in ("out</td>", "method[3]", " device said", " warning"):
        assert "\\x04" + where in page, where
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 5  # SQNR per case, histogram + scatter of the output, SQNR and MAE trends


def test_hostile_text_renders_as_text_in_chromium(tmp_path):
    _need_chromium()
    report, bundle_path, outputs, db = _hostile_report(tmp_path)
    files = write_reports(report, tmp_path / "out", bundle=bundle_path, outputs=outputs, history_db=db)
    check = browser.check_page(files["html"].resolve().as_uri(), tmp_path / "evil.png")
    assert check.console_errors == []
    # the title is the model id as text: the <script> in it is characters, not an element
    assert check.title.startswith("bundlerun: evil<script>alert(1)</script>&amp;\"'\\x1b[31m")
    assert all(img["naturalWidth"] > 100 for img in check.images) and len(check.images) == 5


def test_sqnr_history_counts_exact_matches_apart(tmp_path):
    """Exact matches (SQNR infinite) are not averaged into the SQNR history as 200 dB; the page says so."""
    db = tmp_path / "history.sqlite"
    bundle = rs.make_bundle(cases=4)
    exact = {i: bundle.suite("forward").test_cases[i].expected_outputs[0].to_array() for i in range(4)}
    for k, outs in enumerate(({0: exact[0]}, exact, {})):
        history.record_report(db, Report.from_json(rs.make_report(
            bundle, rs.target_run(bundle, noise=1e-3, seed=k, outputs=outs), label=f"r{k}")))
    report = rs.make_report(bundle, rs.target_run(bundle, noise=1e-3, outputs={1: exact[1]}), label="now")
    history.record_report(db, Report.from_json(report))
    page = write_reports(Report.from_json(report), tmp_path / "out", history_db=db, formats=("html",))["html"].read_text()
    assert "mean SQNR over the case-outputs that did not match exactly" in page
    assert "SQNR history: 6 of 16 case-outputs matched exactly (SQNR infinite); they are counted apart and " \
           "not averaged in. 1 run(s) with every output exact are drawn as ▲." in page
    # the case table says "exact", not a number
    row = re.search(r"<td class='l'>forward\[1\]</td>.*?</tr>", page).group(0)
    assert "<td>exact</td>" in row and "inf" not in row


def test_a_report_with_many_outputs_draws_the_budget_of_case_plots_failing_first():
    """A farm's merged report has an output per job (the jobs mode names each job's method): the page
    draws PLOT_BUDGET per-case strips, those of outputs with a case that did not pass first, not one
    matplotlib figure per job (minutes at 2,000 jobs: bench/bench_farm_scale.py)."""
    import dataclasses

    from bundlerun.runner.writers.html import PLOT_BUDGET, render_html

    base = Report.from_json(rs.quick_report(cases=2))
    bad = Report.from_json(rs.quick_report(cases=2, errors={0: "error"}))
    cases = []
    for j in range(PLOT_BUDGET + 6):
        for case in (bad if j == PLOT_BUDGET + 5 else base).cases:
            cases.append(dataclasses.replace(case, method=f"job{j:03d}"))
    base.cases = cases
    page = render_html(base)
    strips = page.count('alt="sqnr per case ')
    assert strips == PLOT_BUDGET, strips
    assert f"{PLOT_BUDGET + 6} outputs: per-case plots for {PLOT_BUDGET}" in page
    assert f'alt="sqnr per case job{PLOT_BUDGET + 5:03d}/' in page  # the failing job's strip is drawn


def _two_output_run(tmp_path):
    """A 5-case run of a two-output method (out1 fails its bound on case 3), its outputs saved as
    `run --save-outputs` saves them (np.savez), its bundle written."""
    import copy

    from bundlerun.bundles.bpte import BundledValue
    from bundlerun.bundles import scalar_types as st
    from bundlerun.targets.base import CaseResult, CaseStatus, RawTensor, TargetRun

    bundle = rs.make_bundle(cases=5, shape=(1, 40))
    rng = np.random.default_rng(5)
    manifest = copy.deepcopy(bundle.manifest_json)
    second = copy.deepcopy(manifest["methods"]["forward"]["outputs"][0])
    second.update(name="out1", shape=[2, 3])
    manifest["methods"]["forward"]["outputs"].append(second)
    bundle.manifest_json = manifest
    results = []
    for i, case in enumerate(bundle.suite("forward").test_cases):
        case.expected_outputs.append(BundledValue.from_array(rng.standard_normal((2, 3)).astype(np.float32)))
        acts = [v.to_array() + np.float32(1e-4 if j == 0 or i != 3 else 0.5) for j, v in enumerate(case.expected_outputs)]
        results.append(CaseResult("forward", i, CaseStatus.OK,
                                  [RawTensor(st.FLOAT, list(a.shape), np.ascontiguousarray(a).tobytes()) for a in acts]))
    run = TargetRun("host://xnnpack", results, info={"runtime": "test"})
    path = rs.write_stub_bundle(bundle, tmp_path / "two.bpte")
    outputs = rs.saved_outputs(run)
    np.savez(tmp_path / "outputs.npz", **outputs)
    return Report.from_json(rs.make_report(bundle, run, path)), path, outputs


def test_saved_outputs_are_read_one_output_at_a_time(tmp_path):
    """The HTML report's plots read outputs.npz a member at a time (runner/writers SavedOutputs), one
    output's cases together, and let that output's arrays go before the next output's are read (issue
    36: dl3's `run --save-outputs` held every case's outputs, 2 GiB). The page is the one the same
    outputs given in memory draw."""
    import weakref

    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.runner.writers import SavedOutputs, _load_outputs
    from bundlerun.runner.writers.html import render_html

    report, path, outputs = _two_output_run(tmp_path)
    bundle = read_bundle(path)
    reads: list[str] = []
    alive: dict[str, list] = {}

    class Counted(SavedOutputs):
        def __getitem__(self, key):
            method, _, out = key.rpartition("/")
            if out == "1":  # output 1's first read: none of output 0's arrays is still held
                assert not [r for r in alive.get("0", []) if r() is not None], "output 0's arrays still held"
            arr = super().__getitem__(key)
            reads.append(key)
            alive.setdefault(out, []).append(weakref.ref(arr))
            return arr

    saved = _load_outputs(None, tmp_path)
    assert isinstance(saved, SavedOutputs) and saved.shape_of("forward/2/1") == (2, 3)
    lazy = render_html(report, bundle, Counted(saved.path, dict(saved._shapes)))
    assert reads == [f"forward/{i}/0" for i in range(5)] + [f"forward/{i}/1" for i in range(5)]  # each once
    assert lazy == render_html(report, bundle, outputs)  # the same page as from the arrays in memory
    assert lazy.count('alt="error histogram') == 2 and lazy.count('alt="scatter') == 2


def test_a_damaged_outputs_npz_draws_no_plots_as_before(tmp_path):
    """A member whose bytes no longer match its CRC: no arrays at all (as when the file was read whole), no error."""
    import zipfile

    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.runner.writers import _load_outputs
    from bundlerun.runner.writers.html import render_html

    report, path, _ = _two_output_run(tmp_path)
    npz = tmp_path / "outputs.npz"
    with zipfile.ZipFile(npz) as zf:
        info = zf.getinfo("forward/4/1.npy")
    raw = bytearray(npz.read_bytes())
    raw[info.header_offset + 30 + len(info.filename) + info.file_size - 2] ^= 0xFF  # last data bytes of the member
    npz.write_bytes(bytes(raw))
    assert _load_outputs(None, tmp_path) is None
    page = render_html(report, read_bundle(path), _load_outputs(None, tmp_path))
    assert 'alt="error histogram' not in page and page.count("statistics only") == 2
