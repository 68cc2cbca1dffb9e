"""Regression rules against a baseline, and the paired accuracy interval they rely on."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import report_samples as rs  # noqa: E402

from bundlerun.bundles.errors import ConfigError  # noqa: E402
from bundlerun.runner import accuracy  # noqa: E402
from bundlerun.runner.regression import RegressionRules, comparison_notes, find_regressions  # noqa: E402


def _pair(base_noise, cur_noise, cases=4, **kw):
    b = rs.make_bundle(cases=cases, **kw)
    return rs.make_report(b, rs.target_run(b, noise=base_noise, seed=1)), rs.make_report(b, rs.target_run(b, noise=cur_noise, seed=2))


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
    base = rs.make_report(b, rs.target_run(b, noise=1e-5))
    cur = rs.make_report(b, rs.target_run(b, noise=1e-5, errors={1: "timeout"}))
    assert find_regressions(base, cur) == []
    assert any("PASS -> TIMEOUT" in n for n in comparison_notes(base, cur))
    sub = dict(cur, cases=cur["cases"][:2])
    assert any("only in the baseline" in n for n in comparison_notes(base, sub))


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
    base = rs.quick_report()
    b, s, d = (dict(base, dataset=_dataset(p, labels)) for p in (good, slightly, bad))
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

    from bundlerun.runner import history

    db = tmp_path / "h.sqlite"
    b = rs.make_bundle(cases=3)
    good = rs.make_report(b, rs.target_run(b, noise=1e-5), label="good")
    bad = rs.make_report(b, rs.target_run(b, noise=5e-2), label="bad")
    history.record_report(db, good)
    history.record_report(db, bad)
    (tmp_path / "good.json").write_text(_json.dumps(good))
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
