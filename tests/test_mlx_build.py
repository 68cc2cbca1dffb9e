"""Apple builds here: MLX (with the generated-files step), Core ML, and Metal's refusal off macOS.

All with the real executorch wheel: the MLX codegen runs ExecuTorch's own
generate.py with the wheel's flatc, the lowering is the real MLXPartitioner /
CoreMLPartitioner, and the CLI runs in a fresh process.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tests.conftest import run_cli


def _et_dir() -> Path:
    from bundlerun.bundles.mlx_codegen import _executorch_dir

    return _executorch_dir()


# ---------------------------------------------------------------- MLX generated files


def test_codegen_regenerates_the_missing_files(tmp_path, monkeypatch):
    from bundlerun.bundles import mlx_codegen

    monkeypatch.delenv("BUNDLERUN_EXECUTORCH_SRC", raising=False)
    target = tmp_path / "gen" / "key"
    mlx_codegen._generate(_et_dir(), target)
    ser = target / "serialization"
    for rel in ("mlx_graph_schema.py", "_generated_serializers.py", "_generated/mlx_delegate/MLXGraph.py",
                "_generated/__init__.py", "mlx_graph_serialize.py", "__init__.py", "schema.fbs"):
        assert (ser / rel).is_file(), rel
    assert (target / "_generated_inspector.py").is_file()
    assert not list(ser.glob("*.tmpl")), "C++ templates are not part of the cache"
    complete = (target / "COMPLETE").read_text()
    assert "executorch 1.5.1" in complete and "templates " in complete
    # every op node of the wheel's schema has a generated flatbuffer class
    schema = (ser / "schema.fbs").read_text()
    union = schema.split("union OpNode {", 1)[1].split("}", 1)[0]
    names = [n.strip().rstrip(",") for n in union.splitlines() if n.strip().endswith("Node") or n.strip().endswith("Node,")]
    assert len(names) == 136
    assert all((ser / "_generated" / "mlx_delegate" / f"{n}.py").is_file() for n in names)


def test_cache_key_follows_the_wheel_version(monkeypatch):
    from bundlerun.bundles import mlx_codegen

    key = mlx_codegen.cache_key(_et_dir())
    assert key == mlx_codegen.cache_key(_et_dir())
    monkeypatch.setattr(mlx_codegen, "_executorch_version", lambda: "9.9.9")
    assert mlx_codegen.cache_key(_et_dir()) != key


def test_overlay_leaves_the_installed_package_alone():
    from bundlerun.bundles.mlx_codegen import ensure_mlx_importable

    files = ensure_mlx_importable()
    import executorch.backends.mlx.serialization as ser
    from executorch.backends.mlx import MLXPartitioner  # noqa: F401 - importable now

    wheel_ser = _et_dir() / "backends" / "mlx" / "serialization"
    if files.in_wheel:
        assert Path(ser.__file__).parent == wheel_ser
    else:
        assert not (wheel_ser / "mlx_graph_schema.py").exists()
        assert Path(ser.__file__).is_relative_to(files.root)


def test_missing_sources_is_one_clear_error(tmp_path, monkeypatch):
    from bundlerun.bundles import et_source, mlx_codegen
    from bundlerun.bundles.errors import BuildError

    monkeypatch.delenv("BUNDLERUN_EXECUTORCH_SRC", raising=False)
    monkeypatch.setattr(et_source, "third_party_dirs", lambda: [tmp_path / "nowhere"])
    with pytest.raises(BuildError, match="BUNDLERUN_EXECUTORCH_SRC") as err:
        mlx_codegen._generate(_et_dir(), tmp_path / "gen")
    assert "\n" not in str(err.value)
    monkeypatch.setenv("BUNDLERUN_EXECUTORCH_SRC", str(tmp_path))
    with pytest.raises(BuildError, match="is not an ExecuTorch checkout"):
        mlx_codegen._generate(_et_dir(), tmp_path / "gen2")
    assert not (tmp_path / "gen2").exists()


def test_cli_reports_missing_sources_without_traceback(tmp_path):
    env = {"BUNDLERUN_CACHE": str(tmp_path / "cache"), "BUNDLERUN_EXECUTORCH_SRC": str(tmp_path / "not-a-checkout")}
    proc = run_cli("build", "mlp", "--backend", "mlx", "--dtype", "fp32", "-o", str(tmp_path / "x.bpte"), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "is not an ExecuTorch checkout" in proc.stderr
    assert not (tmp_path / "x.bpte").exists()


# ---------------------------------------------------------------- MLX builds


def test_cli_builds_an_mlx_bf16_bundle_from_a_cold_cache(tmp_path):
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.targets.program.walker import read_delegates

    out = tmp_path / "mlp-bf16.bpte"
    proc = run_cli("build", "mlp", "--backend", "mlx", "--dtype", "bf16", "--cases", "2", "-o", str(out),
                   env={"BUNDLERUN_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list((tmp_path / "cache" / "mlx-gen").glob("*/COMPLETE")), "the cold cache was regenerated"
    bundle = read_bundle(out)
    assert bundle.manifest.build.backend == "mlx" and bundle.manifest.build.dtype == "bf16"
    assert [d.backend_id for d in read_delegates(bundle.program)] == ["MLXBackend"]
    first = bundle.suite("forward").test_cases[0]
    assert first.inputs[0].to_array().dtype.name == "uint16"  # bfloat16 words: the program takes bf16 inputs
    # judged as MLX's own tests judge: against the eager model run in bf16 (test_utils.py:912-920)
    import torch

    from bundlerun.bundles.model_source import resolve_model

    assert bundle.manifest.build.reference == "eager-dtype"
    words = torch.from_numpy(first.inputs[0].to_array().astype("int32")).to(torch.int16)
    x = words.view(torch.bfloat16)
    model = resolve_model("mlp", None).module.to(torch.bfloat16)
    want = model(x).detach().float().numpy()
    got = torch.from_numpy(first.expected_outputs[0].to_array().astype("int32")).to(torch.int16).view(torch.bfloat16)
    assert (got.float().numpy() == want).all()
    fp32_ref = resolve_model("mlp", None).module(x.float()).detach().numpy()
    assert not (fp32_ref == want).all()  # the two references differ: the bf16 one is what was stored


def test_mlx_recipe_refuses_int8():
    import torch

    from bundlerun.bundles.backends.base import LoweringRequest
    from bundlerun.bundles.backends.mlx import lower
    from bundlerun.bundles.errors import BuildError

    with pytest.raises(BuildError, match=r"dtype 'int8' is not supported by the mlx recipe \(fp32, fp16, bf16\)"):
        lower(LoweringRequest(torch.nn.Linear(2, 2), (torch.randn(1, 2),), [], "int8", "mlx", "mlx://cpu"))


# ---------------------------------------------------------------- Core ML, Metal


def test_coreml_fp16_bundle_records_compute_units(tmp_path):
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.builder import BuildRequest, build_bundle
    from bundlerun.targets.program.walker import read_delegates

    result = build_bundle(BuildRequest(model="mlp", output=tmp_path / "mlp-coreml.bpte", backend="coreml",
                                       dtype="fp16", cases=2, target="host://xnnpack", target_info={}))
    info = result.info
    assert info["delegate_calls"] == 1 and info["undelegated_ops"] == []
    assert info["compute_units"] == "all" and info["compute_precision"] == "float16"
    assert info["coremltools"]
    bundle = read_bundle(result.path)
    delegates = read_delegates(bundle.program)
    assert [d.backend_id for d in delegates] == ["CoreMLBackend"]
    assert delegates[0].compile_specs["compute_units"] == b"all"
    assert bundle.suite("forward").test_cases[0].inputs[0].to_array().dtype.name == "float32"  # fp32 I/O


def test_coreml_rejects_unknown_compute_units_and_bf16():
    import torch

    from bundlerun.bundles.backends.base import LoweringRequest
    from bundlerun.bundles.backends.coreml import lower
    from bundlerun.bundles.errors import BuildError

    model, x = torch.nn.Linear(2, 2), (torch.randn(1, 2),)
    with pytest.raises(BuildError, match="unknown Core ML compute units 'npu'"):
        lower(LoweringRequest(model, x, [], "fp32", "coreml", "host://xnnpack", {"compute_units": "npu"}))
    with pytest.raises(BuildError, match="dtype 'bf16' is not supported by the coreml recipe"):
        lower(LoweringRequest(model, x, [], "bf16", "coreml", "host://xnnpack"))


@pytest.mark.skipif(platform.system() == "Darwin", reason="on macOS the metal recipe lowers for real")
def test_metal_says_why_it_cannot_lower_here(tmp_path):
    proc = run_cli("build", "mlp", "--backend", "metal", "--dtype", "fp32", "-o", str(tmp_path / "m.bpte"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "needs macOS with torch's MPS device" in proc.stderr and platform.system() in proc.stderr
