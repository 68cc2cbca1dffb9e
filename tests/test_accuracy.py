"""Dataset accuracy: dataset sources, the digits classifier, real runs on host://xnnpack,
and a degraded model / miscompiled program caught against a recorded baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles import datasets
from bundlerun.bundles.datasets import DatasetError, fit_to_inputs, load_dataset
from bundlerun.bundles.zoo import InputSpec

REPO = Path(__file__).resolve().parents[1]
BUNDLERUN = [sys.executable, "-m", "bundlerun.runner.cli"]
SAMPLES = 60

DEGRADED = """
import torch
from bundlerun.bundles.datasets import digits_model

def degraded():
    '''digits-mlp with every weight perturbed by 0.8 of its layer's std (a "bad retrain").'''
    m = digits_model()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.8)
    return m, (torch.zeros(1, 64),), {"distribution": "rand"}
"""


# ---------------------------------------------------------------- dataset sources (fast)


def test_folder_dataset_per_sample_files_and_labels_txt(tmp_path):
    for i in range(12):  # natural order: s2 before s10
        np.save(tmp_path / f"s{i}.npy", np.full((64,), i, np.float32))
    (tmp_path / "labels.txt").write_text("\n".join(f"s{i}.npy {i % 10}" for i in range(12)) + "\n# comment\n")
    ds = load_dataset(str(tmp_path))
    assert ds.labels == [i % 10 for i in range(12)]
    assert [float(s[0][0]) for s in ds.samples] == list(range(12))
    fitted = fit_to_inputs(ds, [InputSpec((1, 64))])
    assert fitted.samples[3][0].shape == (1, 64) and fitted.samples[3][0].dtype == np.float32


def test_folder_dataset_stacked_npy(tmp_path):
    np.save(tmp_path / "samples.npy", np.random.default_rng(0).random((5, 1, 64)).astype(np.float32))
    np.save(tmp_path / "labels.npy", np.array([1, 2, 3, 4, 5]))
    ds = load_dataset(str(tmp_path))
    assert len(ds.samples) == 5 and ds.num_classes == 6 and ds.name == tmp_path.name


def test_factory_dataset(tmp_path):
    f = tmp_path / "mydata.py"
    f.write_text("import numpy as np\ndef make():\n    return np.zeros((4, 64), np.float32), [0, 1, 2, 3]\n")
    ds = load_dataset(f"{f}:make")
    assert ds.name == "mydata.make" and ds.labels == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: np.save(p / "a.npy", np.zeros(64)), "no labels.txt or labels.npy"),
        (lambda p: (np.save(p / "a.npy", np.zeros(64)), (p / "labels.txt").write_text("1\n2\n")), "1 samples but 2 labels"),
        (lambda p: (np.save(p / "a.npy", np.zeros(64)), (p / "labels.txt").write_text("cat\n")), "is not an integer"),
        (lambda p: ((p / "a.npy").write_bytes(b"junk"), (p / "labels.txt").write_text("1\n")), "cannot read dataset file"),
    ],
)
def test_bad_folders_give_one_line_errors(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(tmp_path))


def test_shape_mismatch_names_the_sample(tmp_path):
    ds = datasets.Dataset("x", [[np.zeros(64, np.float32)], [np.zeros(63, np.float32)]], [0, 1], 2)
    with pytest.raises(DatasetError, match="sample 1 has shape \\[63\\], model input needs \\[1, 64\\]"):
        fit_to_inputs(ds, [InputSpec((1, 64))])
    with pytest.raises(DatasetError, match="not found"):
        load_dataset("no-such-dataset")


def test_digits_weights_are_cached_by_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("BUNDLERUN_CACHE", str(tmp_path))
    recipe = dict(datasets.DIGITS_RECIPE, epochs=3)
    w1 = datasets.digits_weights(recipe)
    files = list(tmp_path.glob("digits-mlp-*.pt"))
    assert [f.name for f in files] == [f"digits-mlp-{datasets.recipe_hash(recipe)}.pt"]
    mtime = files[0].stat().st_mtime_ns
    w2 = datasets.digits_weights(recipe)
    assert files[0].stat().st_mtime_ns == mtime  # read, not retrained
    assert all((w1[k] == w2[k]).all() for k in w1)
    assert datasets.recipe_hash(dict(recipe, lr=0.1)) != datasets.recipe_hash(recipe)


# ---------------------------------------------------------------- real runs on host://xnnpack


def _eager_top1(n: int) -> float:
    import torch

    _, _, x, y = datasets.digits_split()
    with torch.no_grad():
        pred = datasets.digits_model()(torch.from_numpy(x[:n])).argmax(1).numpy()
    return float((pred == y[:n]).mean())


def _accuracy(tmp_path, name, model="digits-mlp", dtype="fp32", baseline=None, label=None, db=None):
    from bundlerun.runner.commands.accuracy import AccuracyRequest, run_accuracy
    from bundlerun.runner.session import Session

    return run_accuracy(AccuracyRequest(
        model=model, dataset="digits", target="host://xnnpack", dtype=dtype, samples=SAMPLES, backend="xnnpack",
        report_dir=tmp_path / name, label=label, session=Session(history_db=str(db), baseline=baseline),
    )).to_json()  # the JSON of record


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acc")
    db = tmp / "history.sqlite"
    return tmp, db, _accuracy(tmp, "fp32", label="good", db=db)


def test_fp32_accuracy_matches_eager(baseline_run):
    _, db, report = baseline_run
    ds = report["dataset"]
    assert ds["samples"] == ds["evaluated"] == SAMPLES
    assert ds["reference_top1"] == pytest.approx(_eager_top1(SAMPLES))  # the bundle's expected outputs are eager fp32
    assert ds["top1"] > 0.9 and ds["top5"] >= ds["top1"]
    assert ds["agreement"] >= 0.99
    lo, hi = ds["top1_diff_ci"]
    assert lo <= ds["top1_diff"] <= hi
    for name in ("report.json", "junit.xml", "summary.md", "report.html", "outputs.npz"):
        assert (Path(report["files"]["html"]).parent / name).is_file(), name
    from bundlerun.runner.history import store as history

    runs = history.list_runs(db, label="good")
    assert len(runs) == 1 and runs[0].top1 == pytest.approx(ds["top1"])


@pytest.mark.slow
def test_int8_accuracy_is_measured(baseline_run):
    tmp, db, fp32 = baseline_run
    report = _accuracy(tmp, "int8", dtype="int8", db=db, label="int8")
    ds = report["dataset"]
    assert report["bundle"]["dtype"] == "int8" and report["bundle"]["quantization"]
    assert ds["reference_top1"] == pytest.approx(fp32["dataset"]["reference_top1"])  # same float reference
    assert 0.8 < ds["top1"] <= 1.0
    # int8 logits are not the float ones: the element-wise stats show it even when argmax agrees
    sqnrs = [o["stats"]["sqnr"] for c in report["cases"] for o in c["outputs"]]
    assert max(sqnrs) < 80


def test_degraded_model_is_a_top1_regression(baseline_run):
    tmp, db, good = baseline_run
    factory = tmp / "bad_retrain.py"
    factory.write_text(DEGRADED)
    report = _accuracy(tmp, "degraded", model=f"{factory}:degraded", baseline="good", db=db, label="bad")
    ds = report["dataset"]
    assert ds["reference_top1"] < good["dataset"]["reference_top1"] - 0.1
    rules = [r["rule"] for r in report["regressions"]]
    assert rules == ["top1-drop"], rules
    assert report["summary"]["exit_code"] == 1
    assert report["baseline"]["label"] == "good"


@pytest.mark.slow
def test_miscompiled_program_is_caught_by_run_baseline(baseline_run, tmp_path):
    """The degraded program spliced into the good bundle: what a broken backend looks like.
    `bundlerun run --baseline good` must flag verdict flips and the SQNR drop."""
    from bundlerun.bundles.bpte import read_bundle, write_bundle
    from dataclasses import replace

    tmp, db, good = baseline_run
    factory = tmp_path / "bad_retrain.py"
    factory.write_text(DEGRADED)
    from bundlerun.bundles.builder import BuildRequest, build_bundle

    bad = build_bundle(BuildRequest(model=f"{factory}:degraded", output=tmp_path / "bad.bpte", cases=1, backend="xnnpack", target_info={}))
    good_bundle = read_bundle(good["bundle"]["path"])
    spliced = write_bundle(replace(good_bundle, program=read_bundle(bad.path).program), tmp_path / "miscompiled.bpte")
    env = dict(os.environ, BUNDLERUN_HISTORY=str(db))
    proc = subprocess.run(
        [*BUNDLERUN, "run", str(spliced), "--report", str(tmp_path / "rep"), "--baseline", "good", "--quiet"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    rules = {r["rule"] for r in report["regressions"]}
    assert {"verdict-flip", "sqnr-drop"} <= rules, rules
    assert report["baseline"]["label"] == "good"
