"""`mlx://cpu`: MLX-delegated bundles run end to end on the real mlx package (mlx[cpu]),
judged with the criteria embedded at build time, from the CLI as a user runs them."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_validate_on_mlx_cpu_every_dtype(tmp_path):
    """bundlerun's MLX interpreter (runtime=interpreter); the default C++ delegate: tests/test_mlx_cpp_delegate.py."""
    res = run_cli("validate", "mlp", "tiny-cnn", "--target", "mlx://cpu?runtime=interpreter", "--dtype", "fp32,fp16,bf16", "--cases", "3",
                  "--report", str(tmp_path), "--no-history")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for slug in ("mlp-fp32", "mlp-fp16", "mlp-bf16", "tiny-cnn-fp32", "tiny-cnn-fp16", "tiny-cnn-bf16"):
        report = json.loads((tmp_path / slug / "report.json").read_text())
        assert report["bundle"]["backend"] == "mlx"  # the target's declared default backend
        assert report["summary"]["verdict"] == "PASS" and report["summary"]["counts"]["PASS"] == 3
        assert report["target"]["info"]["delegates"] == ["MLXBackend"]
        assert report["target"]["info"]["timing"].startswith("interpreter time")
        if slug.endswith("fp32"):
            worst = max(o["stats"]["error_max"] for c in report["cases"] for o in c["outputs"])
            assert worst < 1e-4


def test_mlx_target_refuses_other_delegates_in_one_line(tmp_path, bundle_cache):
    xnn = bundle_cache("mlp", backend="xnnpack", cases=1)
    res = run_cli("run", str(xnn), "--target", "mlx://cpu", "--report", str(tmp_path / "r"), "--no-history")
    assert res.returncode == 2
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["cases"][0]["error_kind"] == "unsupported" and "XnnpackBackend" in report["cases"][0]["error"]
    assert "build it with --backend mlx" in report["cases"][0]["error"]
    res = run_cli("run", str(xnn), "--target", "mlx://tpu", "--report", str(tmp_path / "s"), "--no-history")
    # a URL naming no target is refused before any case runs: one line, exit 2, no report folder
    assert res.returncode == 2 and "unknown MLX device 'tpu'" in res.stderr and not (tmp_path / "s").exists()
