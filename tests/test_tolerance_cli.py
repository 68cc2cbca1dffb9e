"""End to end with real builds and runs on host://xnnpack: embedded criteria, qtol from
the lowered graph, SQNR/cosine, `judge`, `run --override`, `tolerance explain|suggest`."""

from __future__ import annotations

import json
import math
import os
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bundlerun.bundles.bpte import read_bundle
from bundlerun.bundles.manifest import Manifest
from bundlerun.bundles.registry import BUILTIN_DIR, Registry
from bundlerun.bundles.tolerances import ToleranceContext, resolve_criteria

slow = pytest.mark.slow  # tests using `work`: two real PTQ builds + runs on host://xnnpack (~1 min)


@pytest.fixture(scope="module")
def work(bundle_cache, tmp_path_factory):
    """Two real bundles built and run once: tiny-cnn int8 (quantized reference) and mlp int8 (vs float)."""
    from bundlerun.runner.session import RunRequest, execute_run

    root = tmp_path_factory.mktemp("tolcli")
    out = {}
    for key, model, reference in (("cnn", "tiny-cnn", "quantized"), ("mlp", "mlp", "eager-fp32")):
        path = bundle_cache(model, dtype="int8", cases=3, target="host://xnnpack", reference=reference)
        run_dir = root / f"run-{key}"
        report = execute_run(RunRequest(bundle_path=path, target="host://xnnpack", report_dir=run_dir, save_outputs=True))
        assert report.summary.verdict == "PASS", report.summary
        out[key] = (path, run_dir)
    return root, out


def _data_copy(tmp_path: Path, edits: dict[str, list[tuple[str, str]]]) -> Path:
    """A copy of the built-in data folder with text edits (each must apply), for $BUNDLERUN_TOLERANCES."""
    dest = tmp_path / "tolerance-data"
    shutil.copytree(BUILTIN_DIR, dest, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    for name, pairs in edits.items():
        text = (dest / name).read_text()
        for old, new in pairs:
            assert old in text, old
            text = text.replace(old, new)
        (dest / name).write_text(text)
    return dest


def _manifest(path: Path) -> Manifest:
    return read_bundle(path).manifest


def _expected0(path: Path) -> np.ndarray:
    return read_bundle(path).suite("forward").test_cases[0].expected_outputs[0].to_array().astype(np.float64)


def _steps(path: Path, crit, delta: float) -> float:
    """Error (in steps) that is `delta` steps inside (<0) or outside (>0) the bound at element 3 of case 0."""
    r = abs(float(_expected0(path).reshape(-1)[3]))
    return crit.qtol + (crit.atol + crit.rtol * r) / crit.scale + delta


def _perturbed(run_dir: Path, dest: Path, path: Path, steps: float, scale: float) -> Path:
    """A copy of a saved run whose output 0 of case 0 is `steps` quantization steps off at element 3."""
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("work"))
    with np.load(run_dir / "outputs.npz") as npz:
        arrays = {k: npz[k].copy() for k in npz.files}
    flat = arrays["forward/0/0"].reshape(-1)
    flat[3] = np.float32(_expected0(path).reshape(-1)[3] + steps * scale)
    np.savez(dest / "outputs.npz", **arrays)
    # a run that produced these outputs: its report records their digest (judge refuses a swapped file)
    from bundlerun.runner.history.saved_outputs import file_digest

    report = json.loads((dest / "report.json").read_text())
    report["outputs_sha256"] = file_digest(dest / "outputs.npz")
    (dest / "report.json").write_text(json.dumps(report, indent=2))
    return dest


def _rejudge(run_dir, overrides=(), out=None):
    from bundlerun.runner.commands.judge import rejudge

    return rejudge(run_dir, list(overrides), None, out).to_json()


# ------------------------------------------------------------------ qtol with a real int8 output


@slow
def test_qtol_uses_the_output_scale_of_the_lowered_graph(work, tmp_path):
    _, bundles = work
    path, run_dir = bundles["cnn"]
    crit = _manifest(path).output_spec("forward", 0).criteria
    assert crit.qtol == 2 and "xnnpack-conv2d" in crit.trail["qtol"][-1]["source"]
    assert crit.trail["qtol"][-1]["origin"].startswith("executorch@cff6f4dd:backends/xnnpack/test/ops/test_conv2d.py:")
    assert crit.scale and crit.scale > 0 and isinstance(crit.zero_point, int)
    # the scale really is the output's quantization step: every actual value sits on its grid
    with np.load(run_dir / "outputs.npz") as npz:
        actual = npz["forward/0/0"].astype(np.float64)
    steps = actual / crit.scale + crit.zero_point
    assert np.allclose(steps, np.round(steps), atol=1e-3)

    inside, outside = _steps(path, crit, -0.25), _steps(path, crit, +0.25)
    ok = _rejudge(_perturbed(run_dir, tmp_path / "p15", path, inside, crit.scale))
    assert ok["summary"]["verdict"] == "PASS"
    bad = _rejudge(_perturbed(run_dir, tmp_path / "p3", path, outside, crit.scale))
    assert bad["summary"]["verdict"] == "FAIL" and bad["summary"]["exit_code"] == 1
    failed = bad["cases"][0]["outputs"][0]["failed"][0]
    assert failed["criterion"] == "elementwise"
    assert failed["measured"] == pytest.approx(outside * crit.scale, rel=1e-3)
    assert "worst at [0, 3]" in failed["detail"] and "> allowed " in failed["detail"] and "qtol 2 x scale" in failed["detail"]
    # one step less of qtol and the 1.5-step error fails
    tight = _rejudge(tmp_path / "p15", ["out0.qtol=1"])
    assert tight["summary"]["verdict"] == "FAIL"
    assert tight["overrides"][0]["key"] == "qtol"
    assert tight["cases"][0]["outputs"][0]["criteria"]["trail"]["qtol"][-1]["source"] == "override (CLI)"


# ------------------------------------------------------------------ embedded vs installed


@slow
def test_verdict_uses_embedded_criteria_not_the_installed_registry(work, tmp_path, monkeypatch):
    _, bundles = work
    path, run_dir = bundles["cnn"]
    m = _manifest(path)
    crit = m.output_spec("forward", 0).criteria
    perturbed = _perturbed(run_dir, tmp_path / "p15", path, _steps(path, crit, -0.25), crit.scale)

    changed = _data_copy(tmp_path, {"tolerances.xnnpack.toml": [
        ("[backends.xnnpack.tiers.int8]\natol = 1e-3\nrtol = 1e-3\nqtol = 0", "[backends.xnnpack.tiers.int8]\natol = 1e-6\nrtol = 0\nqtol = 0"),
        ('ops = ["conv2d", "conv_transpose2d"]\natol = 1e-3\nrtol = 1e-3\nqtol = 2', 'ops = ["conv2d", "conv_transpose2d"]\natol = 1e-6\nrtol = 0\nqtol = 0'),
    ]})
    monkeypatch.setenv("BUNDLERUN_TOLERANCES", str(changed))
    monkeypatch.chdir(tmp_path)
    ctx = ToleranceContext(backend="xnnpack", target="host://xnnpack", dtype="int8", model="tiny-cnn",
                           reference="quantized", ops=["conv2d"], scale=crit.scale, zero_point=crit.zero_point)
    now = resolve_criteria(ctx)
    assert (now.atol, now.qtol) == (1e-6, 0)  # the installed registry really moved ...
    report = _rejudge(perturbed)
    assert report["summary"]["verdict"] == "PASS"  # ... the verdict did not
    judged = report["cases"][0]["outputs"][0]["criteria"]
    assert judged == crit.to_dict()

    from bundlerun.runner.commands.judge import command

    result = CliRunner().invoke(command, [str(perturbed), "--quiet"])
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------ SQNR and cosine on a real int8 output


@slow
def test_sqnr_and_cosine_against_the_float_model(work):
    _, bundles = work
    path, run_dir = bundles["mlp"]
    crit = _manifest(path).output_spec("forward", 0).criteria
    assert (crit.atol, crit.rtol, crit.qtol) == (None, None, None)
    assert (crit.sqnr_min_db, crit.cosine_min) == (20.0, 0.98)
    # as XNNPACK's recipes measure it: compute_error(reference, output) > floor
    assert (crit.sqnr_reference, crit.sqnr_strict) == ("reference", True)
    assert crit.trail["sqnr_reference"][-1]["origin"].endswith("test_xnnpack_recipes.py:78")
    report = json.loads((run_dir / "report.json").read_text())
    stats = [c["outputs"][0]["stats"] for c in report["cases"]]
    worst_sqnr = min(s["sqnr"] for s in stats)
    worst_cos = min(s["cosine_similarity"] for s in stats)
    assert 20.0 < worst_sqnr < 80 and 0.98 < worst_cos < 1.0  # real PTQ error, passing the floors

    floor = round(worst_sqnr + 3, 2)
    res = _rejudge(run_dir, [f"*.sqnr_min_db={floor}"])
    assert res["summary"]["verdict"] == "FAIL"
    fails = [f for c in res["cases"] for f in c["outputs"][0]["failed"]]
    assert fails and all(f["criterion"] == "sqnr_min_db" and f["limit"] == floor for f in fails)
    from bundlerun.runner.judging.numerics import sqnr_db

    suite = read_bundle(path).suite("forward")
    with np.load(run_dir / "outputs.npz") as npz:
        ref_sqnr = [sqnr_db(npz[f"forward/{i}/0"], tc.expected_outputs[0].to_array(), "reference")
                    for i, tc in enumerate(suite.test_cases)]
    assert min(f["measured"] for f in fails) == pytest.approx(min(ref_sqnr))
    assert all("SQNR (signal = reference)" in f["detail"] for f in fails)

    cos_floor = 1.0 - (1.0 - worst_cos) / 2
    res = _rejudge(run_dir, [f"out0.cosine_min={cos_floor!r}"])
    fails = [f for c in res["cases"] for f in c["outputs"][0]["failed"]]
    assert fails and {f["criterion"] for f in fails} == {"cosine_min"}


# ------------------------------------------------------------------ explain == build


@slow
@pytest.mark.parametrize("key, ops", [("cnn", ["convolution", "relu"]), ("mlp", ["linear", "tanh"])])
def test_explain_agrees_with_what_build_embedded(work, key, ops):
    from bundlerun.runner.commands.tolerance import command

    root, bundles = work
    path, _ = bundles[key]
    m = _manifest(path)
    spec = m.output_spec("forward", 0)
    args = ["explain", "--backend", m.build.backend, "--target", m.build.target, "--dtype", m.build.dtype,
            "--model", m.model.id, "--reference", m.build.reference, "--output-dtype", spec.dtype, "--json",
            "--host-arch", m.versions.get("host") or os.uname().machine]
    assert set(ops) <= {o.split(".")[-1] for o in m.build.ops} | {"convolution"}  # the model's own ops
    for op in m.build.ops:  # explain gets the ops build recorded: op rules must match the same way
        args += ["--op", op]
    if spec.criteria.scale is not None:
        args += ["--scale", repr(spec.criteria.scale), "--zero-point", str(spec.criteria.zero_point)]
    old = os.getcwd()
    os.chdir(root)
    try:
        result = CliRunner().invoke(command, args)
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.output
    explained = json.loads(result.output)["criteria"]
    assert explained == spec.criteria.to_dict()


def test_explain_table_shows_the_chain():
    from bundlerun.runner.commands.tolerance import command

    result = CliRunner().invoke(command, ["explain", "--backend", "arm", "--target", "tosa://int", "--dtype", "int8",
                                          "--reference", "quantized", "--model", "lstm", "--host-arch", "aarch64",
                                          "--scale", "0.1", "--no-project"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for text in ("explicit override", "model + target override", "backend + variant + dtype tier", "global default",
                 "aarch64-host-tosa", "tosa-int", "0.33"):
        assert text in result.output


# ------------------------------------------------------------------ run --override, judge CLI


@slow
def test_run_override_is_recorded_in_the_report(work, tmp_path):
    from bundlerun.runner.session import RunRequest, execute_run

    _, bundles = work
    path, _ = bundles["cnn"]
    report = execute_run(RunRequest(bundle_path=path, target="host://xnnpack", report_dir=tmp_path / "r",
                                    overrides=["out0.atol=0.05"], cases=[0])).to_json()
    assert report["overrides"] == [{"text": "out0.atol=0.05", "method": "*", "output": "out0", "key": "atol", "value": 0.05}]
    crit = report["cases"][0]["outputs"][0]["criteria"]
    assert crit["atol"] == 0.05 and crit["trail"]["atol"][-1]["source"] == "override (CLI)"
    assert crit["trail"]["atol"][-2]["source"].startswith("op rule: ")  # xnnpack's conv2d test (1e-3)


@slow
def test_judge_cli_writes_a_new_report_and_keeps_the_old(work, tmp_path):
    from bundlerun.runner.commands.judge import command

    _, bundles = work
    _, run_dir = bundles["cnn"]
    before = (run_dir / "report.json").read_bytes()
    out = tmp_path / "rejudged"
    # 0.05: a looser bound that still tells a working program from an all-zero one (0.5 would be vacuous)
    result = CliRunner().invoke(command, [str(run_dir), "--override", "out0.atol=0.05", "--report", str(out), "--json"])
    assert result.exit_code == 0, result.output
    new = json.loads((out / "report.json").read_text())
    assert new["judged"]["from"] == str(run_dir) and new["overrides"][0]["value"] == 0.05
    assert (out / "outputs.npz").is_file()
    assert (run_dir / "report.json").read_bytes() == before
    bad = CliRunner().invoke(command, [str(run_dir), "--override", "out0.atoll=1"])
    assert bad.exit_code != 0 and "did you mean 'atol'" in str(bad.exception)
    missing = CliRunner().invoke(command, [str(tmp_path)])
    assert missing.exit_code != 0 and "no report" in str(missing.exception)


# ------------------------------------------------------------------ suggest


@slow
def test_suggest_from_saved_runs_proposes_a_block_that_round_trips(work, tmp_path, monkeypatch):
    from bundlerun.runner.commands.tolerance import command

    _, bundles = work
    path, run_dir = bundles["cnn"]
    crit = _manifest(path).output_spec("forward", 0).criteria
    perturbed = _perturbed(run_dir, tmp_path / "p15", path, _steps(path, crit, -0.25), crit.scale)
    result = CliRunner().invoke(command, ["suggest", "--from", str(run_dir), "--from", str(perturbed),
                                          "--margin", "1.5", "--criteria", "qtol"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    block = result.output[result.output.index("# bundlerun tolerance suggest"):]
    parsed = tomllib.loads(block)
    Registry.builtin().validate_overlay(parsed["tolerances"], "suggested")
    entry = parsed["tolerances"]["model_overrides"][0]
    assert entry["models"] == ["tiny-cnn"] and entry["dtypes"] == ["int8"] and entry["outputs"] == ["out0"]

    # independent computation of the qtol needed to pass, with the margin
    expected = np.stack([v.expected_outputs[0].to_array() for v in read_bundle(path).suite("forward").test_cases])
    with np.load(perturbed / "outputs.npz") as npz:
        actual = np.stack([npz[f"forward/{i}/0"] for i in range(len(expected))])
    need = float(((np.abs(actual.astype(np.float64) - expected) - crit.atol - crit.rtol * np.abs(expected)) / crit.scale).max())
    assert entry["qtol"] == math.ceil(1.5 * need - 1e-9) == 3

    js = CliRunner().invoke(command, ["suggest", "--from", str(perturbed), "--json"])
    rows = {r["criterion"]: r for r in json.loads(js.output)["outputs"][0]["rows"]}
    allowed = crit.atol + crit.qtol * crit.scale + crit.rtol * np.abs(expected)
    assert rows["qtol"]["headroom"] == pytest.approx(float((np.abs(actual - expected) / allowed).max()), rel=1e-6)
    assert 0.5 < rows["qtol"]["headroom"] < 1.0

    # pasted into bundlerun.toml, the block is what the next build resolves
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "bundlerun.toml").write_text(block)
    monkeypatch.chdir(tmp_path / "proj")
    c = resolve_criteria(ToleranceContext(backend="xnnpack", target="host://xnnpack", dtype="int8", model="tiny-cnn",
                                          reference="quantized", ops=["convolution"], scale=crit.scale))
    assert c.qtol == 3 and c.trail["qtol"][-1]["file"].endswith("bundlerun.toml")


@slow
def test_suggest_runs_a_bundle_on_a_target(work):
    from bundlerun.runner.commands.tolerance import command

    _, bundles = work
    path, run_dir = bundles["mlp"]
    result = CliRunner().invoke(command, ["suggest", str(path), "--target", "host://xnnpack", "--json", "--margin", "2"])
    assert result.exit_code == 0, result.output
    rows = {r["criterion"]: r for r in json.loads(result.output)["outputs"][0]["rows"]}
    sq = rows["sqnr_min_db"]
    assert sq["current"] == 20.0 and sq["measured"] > 20.0
    assert sq["headroom"] == pytest.approx(20.0 / sq["measured"])
    assert sq["proposed"] <= sq["measured"] - 20 * math.log10(2) + 1e-9
    assert sq["proposed"] > sq["measured"] - 20 * math.log10(2) - 0.1
    cos = rows["cosine_min"]
    assert cos["proposed"] <= 1 - 2 * (1 - cos["measured"]) + 1e-12


# ------------------------------------------------------------------ check: embedded vs installed drift


@slow
def test_check_reports_drift_between_embedded_and_installed(work, tmp_path, monkeypatch):
    from bundlerun.runner.commands.tolerance import command

    _, bundles = work
    path, _ = bundles["cnn"]
    monkeypatch.chdir(tmp_path)
    same = CliRunner().invoke(command, ["check", str(path), "--op", "convolution", "--json"])
    assert same.exit_code == 0, same.output
    assert json.loads(same.output)["drift"] is False
    changed = _data_copy(tmp_path, {"tolerances.xnnpack.toml": [
        ('ops = ["conv2d", "conv_transpose2d"]\natol = 1e-3', 'ops = ["conv2d", "conv_transpose2d"]\natol = 2e-3')]})
    monkeypatch.setenv("BUNDLERUN_TOLERANCES", str(changed))
    drift = CliRunner().invoke(command, ["check", str(path), "--op", "convolution", "--json"])
    assert drift.exit_code == 1
    rows = [r for r in json.loads(drift.output)["rows"] if not r["same"]]
    assert [(r["criterion"], r["embedded"], r["installed"]) for r in rows] == [("atol", 1e-3, 2e-3)]


# ------------------------------------------------------------------ calibration arithmetic (no build)


def _obs(criteria, pairs):
    from bundlerun.runner.judging.calibrate import Observations, OutputObservations

    o = OutputObservations("forward", 0, "out0", criteria, [(np.asarray(a, float), np.asarray(r, float)) for a, r in pairs])
    return Observations(None, {("forward", 0): o}, 1)


def test_propose_margins_and_headroom_on_known_errors():
    from bundlerun.bundles.manifest import Criteria
    from bundlerun.runner.judging.calibrate import propose, toml_block

    ref = np.linspace(-1, 1, 101)
    noise = np.where(np.arange(101) == 7, 0.004, 0.001)  # one outlier of 0.004
    crit = Criteria(atol=0.002, rtol=0.0, sqnr_min_db=20.0)
    [p] = propose(_obs(crit, [(ref + noise, ref)]), margin=2.0)
    rows = {r["criterion"]: r for r in p.rows}
    assert rows["atol"]["measured"] == pytest.approx(0.004)
    assert rows["atol"]["headroom"] == pytest.approx(2.0)  # 0.004 / 0.002: fails today
    assert rows["atol"]["proposed"] == pytest.approx(0.008)
    sqnr = 20 * np.log10(np.linalg.norm(ref + noise) / np.linalg.norm(noise))
    assert rows["sqnr_min_db"]["measured"] == pytest.approx(sqnr)
    assert rows["sqnr_min_db"]["headroom"] == pytest.approx(20.0 / sqnr)
    assert rows["sqnr_min_db"]["proposed"] <= sqnr - 20 * np.log10(2.0)
    assert "rtol" not in {k for k, r in rows.items() if r["proposed"] is not None}  # one element-wise knob
    block = toml_block(_obs(crit, [(ref + noise, ref)]), [p], 2.0)
    parsed = tomllib.loads(block)["tolerances"]["override"]
    assert parsed["outputs"] == ["out0"] and parsed["atol"] == pytest.approx(0.008)


def test_qtol_is_the_default_knob_for_quantized_outputs_and_rounds_up_to_steps():
    from bundlerun.bundles.manifest import Criteria
    from bundlerun.runner.judging.calibrate import default_keys, propose

    crit = Criteria(atol=0.0, rtol=0.0, qtol=1, scale=0.5)
    assert default_keys(crit) == ["qtol"]
    ref = np.zeros(8)
    act = ref.copy()
    act[2] = 1.1  # 2.2 steps
    [p] = propose(_obs(crit, [(act, ref)]), margin=1.5)
    rows = {r["criterion"]: r for r in p.rows}
    assert rows["qtol"]["measured"] == pytest.approx(2.2) and rows["qtol"]["proposed"] == 4.0  # ceil(3.3)
    assert rows["qtol"]["headroom"] == pytest.approx(2.2)


def test_suggest_rejects_two_elementwise_knobs_and_bad_margin(tmp_path):
    from bundlerun.runner.commands.tolerance import command

    r = CliRunner().invoke(command, ["suggest", "--from", str(tmp_path), "--criteria", "atol,rtol"])
    assert "one element-wise criterion at a time" in str(r.exception)
    r = CliRunner().invoke(command, ["suggest", "--from", str(tmp_path), "--margin", "0.5"])
    assert "at least 1.0" in str(r.exception)
    r = CliRunner().invoke(command, ["suggest", "--from", str(tmp_path), "--criteria", "sqnr"])
    assert "did you mean 'sqnr_min_db'" in str(r.exception)


@pytest.mark.parametrize("args, message", [
    (["--target", "hots://xnnpack"], "--target hots://xnnpack: unknown target scheme 'hots' in 'hots://xnnpack' (did you mean 'host'?)"),
    (["--target", "host://xnnpakc"], "--target host://xnnpakc: unknown host variant 'xnnpakc'"),
    (["--backend", "arm", "--target", "tosa-intt"], "unknown target 'tosa-intt': not a target URL (scheme://...) nor a "
                                                    "variant name (did you mean 'tosa-int'?); arm variants: tosa-int,"),
    (["--target", "ethos-u55"], "unknown target 'ethos-u55': not a target URL (scheme://...) nor a variant name; "
                                "xnnpack variants: suite"),
    (["--distribution", "randm"], "unknown input distribution 'randm' (did you mean 'rand'?); use randn, rand,"),
    (["--distribution", "gaussian"], "unknown input distribution 'gaussian'; use randn"),
    (["--distribution", "uniform(1)"], "--distribution 'uniform(1)': distribution uniform takes 2 parameters, got 1"),
    (["--scale", "-0.1"], "--scale must be a positive finite number (one quantization step), got -0.1"),
    (["--scale", "0"], "--scale must be a positive finite number (one quantization step), got 0.0"),
    (["--scale", "nan"], "--scale must be a positive finite number (one quantization step), got nan"),
])
def test_explain_refuses_unknown_targets_distributions_and_bad_scales(cli, args, message):
    base = ["tolerance", "explain", "--backend", "xnnpack", "--dtype", "fp32", "--no-project"]
    if "--backend" in args:
        base[3] = args[args.index("--backend") + 1]
        args = [a for i, a in enumerate(args) if a != "--backend" and (i == 0 or args[i - 1] != "--backend")]
    proc = cli(*base, *args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("bundlerun: error: " + message), proc.stderr


def test_explain_accepts_known_targets_variants_and_distributions():
    from bundlerun.runner.commands.tolerance import command

    for args in (["--backend", "arm", "--target", "tosa-int", "--dtype", "int8", "--scale", "0.05"],
                 ["--backend", "arm", "--target", "fvp://corstone-300/ethos-u55-128", "--dtype", "int8"],
                 ["--backend", "xnnpack", "--target", "host://xnnpack", "--dtype", "fp32", "--distribution", "uniform(-1,1)"],
                 ["--backend", "mlx", "--target", "mlx://gpu", "--dtype", "fp16"]):  # a Mac target, explained anywhere
        result = CliRunner().invoke(command, ["explain", *args, "--no-project", "--json"])
        assert result.exit_code == 0, (args, result.output, result.exception)
        crit = json.loads(result.output)["criteria"]
        assert crit["trail"] and any(crit[k] is not None for k in ("atol", "qtol", "sqnr_min_db", "cosine_min")), crit
