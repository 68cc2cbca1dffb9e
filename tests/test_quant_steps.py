"""Quantized outputs: worst error and MAE also in units of the output's quantization step.

A real int8 XNNPACK build of tiny-cnn run on host://xnnpack: its output comes out of a dequantize
whose scale the manifest records (criteria.scale); the report's stats must carry error_max_steps =
error_max / scale (and the MAE likewise), the console and Markdown show them beside the absolute
values, and an fp32 output has none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from bundlerun.runner.judging.numerics import OutputStats, error_statistics, quantization_steps

CMD = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()"]


def test_quantization_steps_function():
    stats = error_statistics(np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.25, 0.5]))
    quantization_steps(stats, 0.125)
    assert stats.error_max_steps == 4.0 and abs(stats.error_mae_steps - 2.0) < 1e-12
    plain = error_statistics(np.array([1.0]), np.array([1.5]))
    for scale in (None, 0.0, -1.0, float("nan")):
        quantization_steps(plain, scale)
        assert plain.error_max_steps is None and plain.error_mae_steps is None
    assert "error_max_steps" in OutputStats.__dataclass_fields__


def test_int8_report_console_and_markdown_in_steps(tmp_path):
    env = {**os.environ, "BUNDLERUN_HISTORY": "off"}
    bundle = tmp_path / "q.bpte"
    proc = subprocess.run([*CMD, "build", "tiny-cnn", "--target", "host://xnnpack", "--dtype", "int8", "--cases", "2",
                           "-o", str(bundle)], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run([*CMD, "run", str(bundle), "--target", "host://xnnpack", "--report", str(tmp_path / "r")],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    out = report["cases"][0]["outputs"][0]
    scale = out["criteria"]["scale"]
    assert isinstance(scale, float) and scale > 0
    stats = out["stats"]
    assert abs(stats["error_max_steps"] - stats["error_max"] / scale) < 1e-9
    assert abs(stats["error_mae_steps"] - stats["error_mae"] / scale) < 1e-9
    assert " q)" in proc.stdout  # the console's max |err| and MAE columns: "0.00113 (0.521 q)"
    assert "steps)" in (tmp_path / "r" / "summary.md").read_text()
