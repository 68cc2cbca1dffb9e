"""The `bundlerun` command as a user runs it: fresh processes, real exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle, write_bundle


def test_help_and_version_do_not_import_torch():
    code = textwrap.dedent("""
        import sys
        from bundlerun.runner.cli import main
        for args in (["--help"], ["--version"], ["run", "--help"]):
            try:
                main(args)
            except SystemExit as e:
                assert e.code in (0, None), e.code
        heavy = [m for m in ("torch", "executorch", "numpy", "rich", "sqlalchemy", "alembic", "psycopg")
                 if m in sys.modules]
        print("HEAVY", heavy)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "bundlerun, version" in out.stdout


@pytest.mark.parametrize("tty", [False, True])
@pytest.mark.parametrize("env", [{}, {"TTY_COMPATIBLE": "0"}, {"TTY_COMPATIBLE": "1"}, {"TTY_COMPATIBLE": "yes"},
                                 {"FORCE_COLOR": ""}, {"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}])
def test_the_run_bar_is_made_only_where_rich_would_draw_it(env, tty, monkeypatch, tmp_path):
    """rich's own `Console(stderr=True).is_terminal` is the oracle `draws_live` reads without loading rich: a pty
    or a plain file as stderr, under the variables rich reads."""
    import os

    from rich.console import Console

    from bundlerun.runner.cli import draws_live

    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if tty:
        master, slave = os.openpty()
        stream = os.fdopen(slave, "w")
    else:
        stream = open(tmp_path / "stderr.txt", "w")
    try:
        monkeypatch.setattr(sys, "stderr", stream)
        assert draws_live() == Console(stderr=True).is_terminal
    finally:
        monkeypatch.undo()
        stream.close()
        if tty:
            os.close(master)


def test_a_run_whose_stderr_is_no_terminal_loads_no_progress_bar(bundle_cache, tmp_path):
    bundle = bundle_cache("mlp", backend="portable", cases=2, target="host://portable")
    code = textwrap.dedent(f"""
        import sys
        from bundlerun.runner.cli import main
        try:
            main(["run", {str(bundle)!r}, "--target", "host://portable", "--report", {str(tmp_path / "r")!r},
                  "--no-history"])
        except SystemExit as e:
            print("EXIT", e.code, "rich.progress" in sys.modules)
    """)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert "EXIT 0 False" in out.stdout, out.stdout + out.stderr
    assert "PASS" in out.stdout  # the verdict table is still printed


def test_build_inspect_run_end_to_end(cli, tmp_path):
    bpte = tmp_path / "tiny-cnn-int8.bpte"
    r = cli("build", "tiny-cnn", "--backend", "xnnpack", "--dtype", "int8", "--cases", "6", "--seed", "0", "-o", str(bpte))
    assert r.returncode == 0, r.stderr
    manifest = read_bundle(bpte).manifest
    assert manifest.build.dtype == "int8" and manifest.build.cases == 6
    r = cli("inspect", str(bpte))
    assert r.returncode == 0 and "tiny-cnn" in r.stdout and "sqnr_min_db" in r.stdout
    r = cli("inspect", str(bpte), "--json")
    assert json.loads(r.stdout)["methods"][0]["cases"] == 6
    report_dir = tmp_path / "out"
    r = cli("run", str(bpte), "--target", "host://xnnpack", "--report", str(report_dir), "--save-outputs", "--no-history")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((report_dir / "report.json").read_text())
    assert report["schema"] == "bundlerun.report/2" and report["summary"]["counts"]["PASS"] == 6
    saved = np.load(report_dir / "outputs.npz")
    assert sorted(saved.files) == [f"forward/{i}/0" for i in range(6)]
    assert "PASS" in r.stdout


def test_perturbed_expected_output_fails_and_points_at_element(cli, bundle_cache, tmp_path):
    bundle = read_bundle(bundle_cache("mlp", cases=4))
    case = bundle.suite("forward").test_cases[2]
    values = case.expected_outputs[0].to_array().copy()
    values[0, 7] += 0.5
    case.expected_outputs[0].data = values.tobytes()
    path = write_bundle(bundle, tmp_path / "perturbed.bpte")
    r = cli("run", str(path), "--report", str(tmp_path / "r"), "--no-history")
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    failing = [(c["case"], o["name"]) for c in report["cases"] for o in c["outputs"] if o["verdict"] == "FAIL"]
    assert failing == [(2, "out0")]
    out = report["cases"][2]["outputs"][0]
    assert out["stats"]["worst_index"] == [0, 7] and out["stats"]["mismatch_count"] == 1
    assert out["failed"][0]["criterion"] == "elementwise"
    assert "[0, 7]" in r.stdout


def test_override_rejudges_and_is_recorded(cli, bundle_cache, tmp_path):
    bundle = read_bundle(bundle_cache("mlp", cases=2))
    case = bundle.suite("forward").test_cases[0]
    values = case.expected_outputs[0].to_array().copy()
    values[0, 1] += 0.02
    case.expected_outputs[0].data = values.tobytes()
    path = write_bundle(bundle, tmp_path / "p.bpte")
    r = cli("run", str(path), "--report", str(tmp_path / "a"), "--no-history")
    assert r.returncode == 1
    r = cli("run", str(path), "--report", str(tmp_path / "b"), "--no-history", "--override", "out0.atol=0.05")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["overrides"] and report["cases"][0]["outputs"][0]["criteria"]["atol"] == 0.05


def test_runs_executorch_made_bundle_with_warning(cli, tmp_path):
    import torch
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
    from executorch.exir import to_edge

    model = torch.nn.Linear(4, 2).eval()
    program = to_edge(torch.export.export(model, (torch.randn(1, 4),))).to_executorch()
    cases = [MethodTestCase(inputs=(x,), expected_outputs=(model(x),)) for x in torch.randn(3, 1, 4).unbind(0)]
    path = tmp_path / "stock.bpte"
    path.write_bytes(serialize_from_bundled_program_to_flatbuffer(BundledProgram(program, [MethodTestSuite("forward", cases)])))
    r = cli("inspect", str(path))
    assert r.returncode == 0 and "no bundlerun manifest" in r.stdout
    # a stock bundle has no seal: judged only with --no-require-seal when $CI is set (runner/seal.py)
    r = cli("run", str(path), "--target", "host://portable", "--report", str(tmp_path / "r"), "--no-history",
            "--no-require-seal")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert any("no bundlerun manifest" in w for w in report["warnings"])
    assert report["summary"]["counts"]["PASS"] == 3


def test_user_factory_model(cli, tmp_path):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        import torch
        def make_model():
            torch.manual_seed(3)
            m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Sigmoid(), torch.nn.Linear(16, 2))
            return m.eval(), (torch.randn(2, 8),)
        def broken():
            raise RuntimeError("weights file missing")
    """))
    out = tmp_path / "mine.bpte"
    r = cli("build", "my_models.py:make_model", "--backend", "xnnpack", "-o", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert read_bundle(out).manifest.model.source == "factory:my_models.py:make_model"
    r = cli("validate", "my_models.py:make_model", "--report", str(tmp_path / "v"), "--no-history", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def bad_inputs(tmp_path, bundle_cache):
    good = bundle_cache("mlp", cases=2).read_bytes()
    files = {
        "text.bpte": b"this is not a flatbuffer at all, just text\n" * 3,
        "truncated.bpte": good[: len(good) // 2],
        "empty.bpte": b"",
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(data)
    bundle = read_bundle(bundle_cache("mlp", cases=2))
    paths["plain.pte"] = tmp_path / "plain.pte"
    paths["plain.pte"].write_bytes(bundle.program)
    return paths


@pytest.mark.parametrize("name,needle", [
    ("text.bpte", "not a BundleIO program"),
    ("truncated.bpte", "truncated"),
    ("empty.bpte", "too short"),
    ("plain.pte", "plain ExecuTorch program"),
])
def test_bad_bundles_one_line_exit_2(cli, bad_inputs, name, needle, tmp_path):
    for command in (["inspect"], ["run", "--no-history", "--report", str(tmp_path / "r")]):
        r = cli(*command[:1], str(bad_inputs[name]), *command[1:])
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0], r.stderr
        assert "Traceback" not in r.stderr


def test_factory_errors_and_unlowerable_ops_exit_2(cli, tmp_path):
    (tmp_path / "models.py").write_text(textwrap.dedent("""
        import torch
        def broken():
            raise RuntimeError("weights file missing")
        class Nonzero(torch.nn.Module):
            def forward(self, x):
                return torch.nonzero(x > 0).sum() + x.sum()
        def unlowerable():
            return Nonzero().eval(), (torch.randn(1, 4, 4),)
    """))
    for ref, needle in (("models.py:broken", "weights file missing"), ("models.py:missing", "no callable"),
                        ("nope.py:f", "not found"), ("tiny-cnnn", "did you mean 'tiny-cnn'"),
                        ("models.py:unlowerable", "could not lower these operators")):
        r = cli("build", ref, "-o", str(tmp_path / "x.bpte"), "--require-delegation", cwd=tmp_path)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (ref, r.stderr)
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--timeout", "0"], "positive number of seconds"),
    (["--timeout", "-1"], "positive number of seconds"),
    (["--timeout", "nan"], "positive number of seconds"),
    (["--setup-timeout", "0"], "positive number of seconds"),
    (["--select", "99"], "there is no case 99"),
    (["--select", "x"], "not a case list"),
])
def test_bad_run_arguments_are_refused_before_anything_runs(cli, bundle_cache, tmp_path, args, needle):
    path = bundle_cache("mlp", cases=2)
    res = cli("run", str(path), "--report", str(tmp_path / "r"), "--no-history", *args)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert not (tmp_path / "r").exists()


def test_report_places_that_cannot_be_written_are_refused_up_front(cli, bundle_cache, tmp_path):
    path = bundle_cache("mlp", cases=2)
    (tmp_path / "file").write_text("x")
    res = cli("run", str(path), "--report", str(tmp_path / "file" / "sub"), "--no-history")
    assert res.returncode == 2 and "is a file" in res.stderr
    res = cli("build", "mlp", "-o", str(tmp_path))
    assert res.returncode == 2 and "is a folder" in res.stderr


def test_unwritable_history_never_changes_the_verdict(cli, bundle_cache, tmp_path):
    path = bundle_cache("mlp", cases=2)
    (tmp_path / "history.sqlite").mkdir()  # a folder where the database file should be
    res = cli("run", str(path), "--report", str(tmp_path / "r"), "--history", str(tmp_path / "history.sqlite"),
              "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["summary"]["verdict"] == "PASS"
    assert any("history not recorded" in w for w in out["warnings"])
    for name in ("report.json", "junit.xml", "summary.md", "report.html"):
        assert (tmp_path / "r" / name).is_file(), name
