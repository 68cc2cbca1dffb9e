"""Regression rules against a baseline, and the paired accuracy interval they rely on.

The rules read the typed `Report`: the samples (tests/report_samples.py, judged by the real judge)
are read with `Report.from_json`, as a report.json is."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import report_samples as rs  # noqa: E402

from bundlerun.bundles.errors import ConfigError  # noqa: E402
from bundlerun.runner.judging import accuracy  # noqa: E402
from bundlerun.runner.history.regression import RegressionRules, comparison_notes, find_regressions  # noqa: E402
from bundlerun.runner.report.model import Report  # noqa: E402


def _judged(bundle, run, **kw) -> Report:
    """A report of `run` by the real judge, read as a report.json is."""
    return Report.from_json(rs.make_report(bundle, run, **kw))


def _pair(base_noise, cur_noise, cases=4, **kw):
    b = rs.make_bundle(cases=cases, **kw)
    return _judged(b, rs.target_run(b, noise=base_noise, seed=1)), _judged(b, rs.target_run(b, noise=cur_noise, seed=2))


def test_same_quality_is_not_a_regression():
    base, cur = _pair(1e-5, 1e-5)
    assert find_regressions(base, cur) == []


def test_verdict_flip_and_sqnr_drop_and_error_growth():
    base, cur = _pair(1e-4, 5e-2)  # PASS everywhere -> FAIL everywhere
    regs = find_regressions(base, cur)
    rules = {r.rule for r in regs}
    assert {"verdict-flip", "sqnr-drop", "mae-growth", "max-growth"} <= rules
    flip = next(r for r in regs if r.rule == "verdict-flip")
    assert flip.baseline == "PASS" and flip.current == "FAIL" and "elementwise" in flip.message
    drop = next(r for r in regs if r.rule == "sqnr-drop")
    assert drop.baseline - drop.current > 40  # 500x more noise is ~54 dB


def test_thresholds_come_from_config():
    base, cur = _pair(3e-4, 8e-4)  # ~8.5 dB worse, 2.7x error: both still PASS (atol 1e-3)
    assert {r.rule for r in find_regressions(base, cur)} >= {"sqnr-drop", "mae-growth"}
    lax = RegressionRules.from_config({"regression": {"sqnr_drop_db": 12, "error_growth": 6}})
    assert find_regressions(base, cur, lax) == []
    with pytest.raises(ConfigError, match="unknown key 'sqnr_drop'"):
        RegressionRules.from_config({"regression": {"sqnr_drop": 1}})
    with pytest.raises(ConfigError, match="non-negative number"):
        RegressionRules.from_config({"regression": {"error_growth": "big"}})


def test_tiny_errors_and_high_sqnr_are_noise():
    # fp32 rounding-level differences: 140 dB -> 110 dB and 1e-8 -> 1e-7 are not regressions
    base, cur = _pair(1e-8, 3e-7)
    assert find_regressions(base, cur) == []


def test_errored_or_missing_cases_are_notes_not_regressions():
    b = rs.make_bundle(cases=4)
    base = _judged(b, rs.target_run(b, noise=1e-5))
    cur = _judged(b, rs.target_run(b, noise=1e-5, errors={1: "timeout"}))
    assert find_regressions(base, cur) == []
    assert any("PASS -> TIMEOUT" in n for n in comparison_notes(base, cur))
    sub = replace(cur, cases=cur.cases[:2])
    assert any("only in the baseline" in n for n in comparison_notes(base, sub))
    # one note per case, in case order (the same report.json from one run to the next)
    down = _judged(b, rs.target_run(b, noise=1e-5, errors={3: "timeout", 1: "error", 2: "timeout"}))
    assert [n.split(":")[0] for n in comparison_notes(base, down) if "infrastructure" in n] == [
        "forward[1] output 0", "forward[2] output 0", "forward[3] output 0"]


def _dataset(pred, labels):
    n = len(labels)
    logits = np.zeros((n, 10))
    logits[np.arange(n), pred] = 1
    ref = np.zeros((n, 10))
    ref[np.arange(n), labels] = 1
    return accuracy.dataset_summary(logits, ref, labels, "synthetic", 10)


def test_top1_drop_needs_to_beat_the_noise():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 400)
    good = labels.copy()
    good[:20] = (labels[:20] + 1) % 10  # 95.0%
    slightly = good.copy()
    slightly[20:23] = (labels[20:23] + 1) % 10  # 94.25%: a 0.75 point drop, within noise
    bad = good.copy()
    bad[20:60] = (labels[20:60] + 1) % 10  # 85%: a 10 point drop
    base = Report.from_json(rs.quick_report())
    b, s, d = (replace(base, dataset=_dataset(p, labels)) for p in (good, slightly, bad))
    assert find_regressions(b, s) == []
    regs = find_regressions(b, d)
    assert [r.rule for r in regs] == ["top1-drop"]
    assert "paired" in regs[0].message and regs[0].baseline == pytest.approx(0.95)


def test_newcombe_paired_matches_bootstrap_and_covers():
    rng = np.random.default_rng(1)
    n = 300
    ref = rng.random(n) < 0.95
    tgt = ref.copy()
    flip = rng.random(n) < 0.04
    tgt[flip] = ~tgt[flip]
    diff, lo, hi = accuracy.newcombe_paired(tgt, ref)
    assert lo < diff < hi
    boots = []
    for _ in range(2000):
        idx = rng.integers(0, n, n)
        boots.append(tgt[idx].mean() - ref[idx].mean())
    b_lo, b_hi = np.percentile(boots, [2.5, 97.5])
    assert lo == pytest.approx(b_lo, abs=0.012) and hi == pytest.approx(b_hi, abs=0.012)
    # coverage of the true difference over repeated paired samples
    hits = 0
    trials = 400
    p_ref, p_flip_down, p_flip_up = 0.9, 0.05, 0.02
    true = -p_ref * p_flip_down + (1 - p_ref) * p_flip_up
    for _ in range(trials):
        r = rng.random(120) < p_ref
        u = rng.random(120)
        t = np.where(r, u >= p_flip_down, u < p_flip_up)
        _, l, h = accuracy.newcombe_paired(t, r)
        hits += l <= true <= h
    assert 0.92 <= hits / trials <= 0.99
    # degenerate cases stay within [-1, 1] and contain the observed difference
    ones = np.ones(50, dtype=bool)
    d, l, h = accuracy.newcombe_paired(ones, ones)
    assert d == 0 and -1 <= l < 0 < h <= 1


def test_wilson_known_values():
    # Wilson 95% for 0/10 is [0, 0.2775]; for 10/10 [0.7225, 1]
    lo, hi = accuracy.wilson(0, 10)
    assert lo == pytest.approx(0, abs=1e-12) and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = accuracy.wilson(10, 10)
    assert lo == pytest.approx(0.7225, abs=1e-4) and hi == pytest.approx(1)


def test_compare_command_exit_codes(tmp_path):
    import json as _json
    import os
    import subprocess

    from bundlerun.runner.history import store as history

    db = tmp_path / "h.sqlite"
    b = rs.make_bundle(cases=3)
    good = _judged(b, rs.target_run(b, noise=1e-5), label="good")
    bad = _judged(b, rs.target_run(b, noise=5e-2), label="bad")
    history.record_report(db, good)
    history.record_report(db, bad)
    (tmp_path / "good.json").write_text(_json.dumps(good.to_json()))
    env = dict(os.environ, BUNDLERUN_HISTORY=str(db))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", "compare", *args], capture_output=True, text=True,
                              env=env, cwd=Path(__file__).resolve().parents[1], timeout=120)

    proc = cli("good", "bad")
    assert proc.returncode == 1 and "verdict-flip x3" in proc.stdout, proc.stdout + proc.stderr
    proc = cli(str(tmp_path / "good.json"), "good")  # a report file against a history label
    assert proc.returncode == 0 and "no regressions" in proc.stdout
    proc = cli("good", "bad", "--json", "--sqnr-drop", "100", "--error-growth", "1e9")
    assert {r["rule"] for r in _json.loads(proc.stdout)["regressions"]} == {"verdict-flip"}
    proc = cli("good", "missing-label")
    assert proc.returncode == 2 and "no run 'missing-label'" in proc.stderr


# ------------------------------------------------------------------ related runs and per-output deltas


def _related_pair(base_noise=1e-5, cur_noise=1e-5, cases=4):
    """Two runs of one bundle, each report carrying the bundle's inputs and program digests as
    `run` records them."""
    from bundlerun.bundles.integrity import inputs_digest, program_sha256

    b = rs.make_bundle(cases=cases)
    reports = [_judged(b, rs.target_run(b, noise=n, seed=s)) for n, s in ((base_noise, 1), (cur_noise, 2))]
    for r in reports:
        r.bundle.update(inputs_sha256=inputs_digest(b), program_sha256=program_sha256(b.manifest, b))
    return b, reports[0], reports[1]


def test_related_runs_have_no_reasons_and_unrelated_ones_say_why():
    import copy

    from bundlerun.bundles.integrity import inputs_digest
    from bundlerun.runner.history.regression import unrelated_reasons

    b, base, cur = _related_pair()
    assert unrelated_reasons(base, cur) == []
    # a subset of the cases (run --select) is still the same bundle
    assert unrelated_reasons(base, replace(cur, cases=cur.cases[:2])) == []

    def changed(edit):
        c = copy.deepcopy(cur)
        edit(c)
        return unrelated_reasons(base, c)

    assert changed(lambda c: c.target.update(url="tosa://int")) == [
        "target differs (baseline 'host://xnnpack', current 'tosa://int')"]
    assert changed(lambda c: c.bundle.update(dtype="int8")) == ["dtype differs (baseline 'fp32', current 'int8')"]
    other = rs.make_bundle(cases=4, seed=7)  # another seed: other inputs
    [reason] = changed(lambda c: c.bundle.update(inputs_sha256=inputs_digest(other)))
    assert reason.startswith("different test inputs")
    # a retrained model on the same inputs is a fair comparison; without the inputs digest it is not
    assert changed(lambda c: c.bundle.update(model="mlp-retrained")) == []
    assert changed(lambda c: c.bundle.update(model="mlp-retrained", inputs_sha256=None)) == [
        "model differs (baseline 'mlp', current 'mlp-retrained')"]
    assert changed(lambda c: [setattr(case, "method", "decode") for case in c.cases])[0].startswith("methods differ")
    shifted = changed(lambda c: [setattr(case, "case", case.case + 2) for case in c.cases])
    assert shifted == ["the runs cover different cases (2 only in the baseline, 2 only in the current run; "
                       "one must be a subset of the other)"]
    renamed = changed(lambda c: [setattr(o, "name", "logits") for case in c.cases for o in case.outputs])
    assert renamed == ["outputs differ (forward output 0 is 'out0' in the baseline, 'logits' now)"]
    assert changed(lambda c: setattr(c, "cases", [])) == ["no case-output in common: nothing to compare"]
    # a different program is what a comparison is for: a note, not a reason
    assert changed(lambda c: c.bundle.update(program_sha256="f" * 64)) == []
    c = copy.deepcopy(cur)
    c.bundle["program_sha256"] = "f" * 64
    assert any(n.startswith("program differs") for n in comparison_notes(base, c))


def test_metric_deltas_side_by_side():
    from bundlerun.runner.history.regression import metric_deltas

    b, base, cur = _related_pair(1e-5, 5e-2, cases=3)
    exact = b.suite("forward").test_cases[1].expected_outputs[0].to_array()
    cur2 = _judged(b, rs.target_run(b, noise=5e-2, seed=2, outputs={1: exact}))  # case 1 matches exactly
    deltas = metric_deltas(base, cur2)
    [out] = deltas["outputs"]
    assert (out["method"], out["name"], out["cases"]) == ("forward", "out0", 3)
    assert out["verdicts"] == {"baseline": {"PASS": 3}, "current": {"FAIL": 2, "PASS": 1}}

    def stats(report, key):
        return [getattr(c.outputs[0].stats, key) for c in report.cases]

    em = out["error_max"]
    assert em["baseline"] == max(stats(base, "error_max")) and em["current"] == max(stats(cur2, "error_max"))
    assert em["delta"] == pytest.approx(em["current"] - em["baseline"])
    sq = out["sqnr"]  # the worst case: the exact match (infinite SQNR) is never the minimum
    assert sq["current"] == min(s for s in stats(cur2, "sqnr") if s not in ("inf", float("inf"))) and sq["delta"] < -40
    assert out["cosine_similarity"]["current"] == min(stats(cur2, "cosine_similarity"))
    assert out["mismatch_count"]["current"] == sum(stats(cur2, "mismatch_count")) > 0
    assert out["mismatch_count"]["baseline"] == 0
    assert stats(cur2, "sqnr")[1] in ("inf", float("inf"))
    rows = {r["case"]: r for r in deltas["case_outputs"]}
    assert rows[1]["sqnr"]["current"] == "inf" and rows[1]["sqnr"]["delta"] is None  # exact: no number to subtract
    assert rows[1]["error_max"] == {"baseline": stats(base, "error_max")[1], "current": 0.0,
                                    "delta": -stats(base, "error_max")[1]}
    assert rows[0]["verdict"] == {"baseline": "PASS", "current": "FAIL"}


def test_run_baseline_refuses_unrelated_runs_like_compare(tmp_path):
    from bundlerun.runner.history import store as history
    from bundlerun.runner.history.regression import check_baseline

    db = tmp_path / "h.sqlite"
    b, base, cur = _related_pair(1e-5, 1e-5)
    base.run["label"] = "v1"
    history.record_report(db, base)
    cnn = Report.from_json(rs.quick_report(model="tiny-cnn"))
    assert cnn.summary.exit_code == 0 and cnn.baseline is None
    assert check_baseline("v1", cnn, db) == []
    assert cnn.baseline["refused"] == "model differs (baseline 'mlp', current 'tiny-cnn')"
    assert cnn.baseline["label"] == "v1" and cnn.baseline["history_id"] == 1  # the run it was held against
    assert cnn.summary.exit_code == 2 and cnn.summary.verdict == "PASS"  # the check asked for was not made
    assert any("baseline 'v1' not compared: unrelated runs" in w for w in cnn.warnings)
    # the summaries say it was not compared, never "no regressions"
    from bundlerun.runner.writers.html import render_html
    from bundlerun.runner.writers.markdown import render_markdown

    md, page = render_markdown(cnn, []), render_html(cnn, regressions=[])
    assert "Baseline v1 not compared" in md and "No regressions" not in md
    assert "not compared: unrelated runs" in page and "No regressions" not in page
    # allowed by config, it is compared (and finds nothing)
    forced = Report.from_json(rs.quick_report(model="tiny-cnn"))
    assert check_baseline("v1", forced, db, {"regression": {"allow_unrelated": True}}) == []
    assert "refused" not in forced.baseline and forced.summary.exit_code == 0
    # a related run gets the per-output deltas in its report and summary.md
    check_baseline("v1", cur, db)
    assert "refused" not in cur.baseline and cur.baseline["outputs"][0]["name"] == "out0"
    assert "| forward.out0 | 4 |" in render_markdown(cur, [])


def test_compare_command_refuses_unrelated_and_shows_deltas(tmp_path):
    import json as _json
    import os
    import subprocess

    from bundlerun.runner.history import store as history

    db = tmp_path / "h.sqlite"
    b, good, bad = _related_pair(1e-5, 5e-2, cases=3)
    good.run["label"], bad.run["label"] = "good", "bad"
    other = Report.from_json(rs.quick_report(model="tiny-cnn", label="cnn"))
    other.target["url"] = "tosa://int"
    for r in (good, bad, other):
        history.record_report(db, r)
    (tmp_path / "empty.json").write_text("{}")
    env = dict(os.environ, BUNDLERUN_HISTORY=str(db), COLUMNS="250")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", "compare", *args], capture_output=True,
                              text=True, env=env, cwd=Path(__file__).resolve().parents[1], timeout=120)

    proc = cli("good", "cnn")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line
    assert proc.stderr.startswith("bundlerun: error: refusing to compare unrelated runs: target differs "
                                  "(baseline 'host://xnnpack', current 'tosa://int'); model differs")
    assert "--force" in proc.stderr
    proc = cli("good", "cnn", "--force", "--json")
    assert proc.returncode == 0, proc.stderr
    forced = _json.loads(proc.stdout)
    assert forced["forced"] is True and len(forced["unrelated"]) == 2
    proc = cli(str(tmp_path / "empty.json"), "good")
    assert proc.returncode == 2 and "not a bundlerun report" in proc.stderr
    proc = cli("good", "bad", "--json")
    assert proc.returncode == 1
    data = _json.loads(proc.stdout)
    [out] = data["outputs"]
    worst = max(c.outputs[0].stats.error_max for c in bad.cases)
    assert out["error_max"]["current"] == pytest.approx(worst)
    assert out["sqnr"]["delta"] == pytest.approx(out["sqnr"]["current"] - out["sqnr"]["baseline"]) and out["sqnr"]["delta"] < -40
    assert len(data["case_outputs"]) == 3 and data["baseline"]["label"] == "good"
    proc = cli("good", "bad")
    assert proc.returncode == 1
    row = next(line for line in proc.stdout.splitlines() if "forward.out0" in line)
    for cell in (f"{out['error_max']['baseline']:.3g} → {out['error_max']['current']:.3g}",
                 f"{out['sqnr']['baseline']:.2f} → {out['sqnr']['current']:.2f} ({out['sqnr']['delta']:+.2f})",
                 "PASS:3 → FAIL:3"):
        assert cell in row, (cell, row)
    assert "verdict-flip x3" in proc.stdout
