"""`bundlerun bisect`: the delegated node that makes a case fail, where nothing can be dumped.

Real lowerings, real runtimes: the model of tests/fixtures/planted_fault.py has its `conv2` weight
negated inside ExecuTorch's delegate preprocess (a tampered constant on one delegated node: no
double, the fault is planted in the real lowering) and is bisected on host://xnnpack (XNNPACK
runtime), tosa://int (TOSA reference model), qnn://htp-sim (Qualcomm's HTP simulator) and
vulkan://lavapipe (the Vulkan delegate on Mesa's lavapipe). The culprit must be named exactly
(exported-program node, eager module, source line) within the O(log n) bound; a model whose failure
is not the delegate's (tests/fixtures/export_divergent.py: the exported program itself differs
from eager) is reported as failing with nothing delegated, not bisected. Runs with the fixture's
default environment use the build cache (a warm CI re-runs the candidates without re-lowering);
the others build with --no-cache, so the planted fault's environment cannot leak between them.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from bundlerun.runner.debug.bisect import minimal_failing, search_bound

ROOT = Path(__file__).resolve().parents[1]
FAULT = f"{ROOT / 'tests' / 'fixtures' / 'planted_fault.py'}:model"
DIVERGENT = f"{ROOT / 'tests' / 'fixtures' / 'export_divergent.py'}:model"
CMD = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()"]


def _bisect(tmp_path: Path, model: str, target: str, *extra: str, env: dict | None = None,
            cache: bool = True, report: Path | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """`cache=False` (--no-cache) for runs whose fixture environment changes what is built: the
    build-cache key follows the fixture file's content, not $BUNDLERUN_PLANTED_FAULT*."""
    report = report or tmp_path / "bisect"
    full_env = {**os.environ, "BUNDLERUN_HISTORY": "off", **(env or {})}
    if not cache:
        extra = (*extra, "--no-cache")
    proc = subprocess.run([*CMD, "bisect", model, "--target", target, "--cases", "1", "--report", str(report), *extra],
                          capture_output=True, text=True, env=full_env, timeout=1800)
    path = report / "report.json"
    assert path.is_file(), proc.stderr[-3000:]
    return proc, json.loads(path.read_text())


def _assert_conv2_culprit(proc: subprocess.CompletedProcess, result: dict, backend_id: str) -> dict:
    assert proc.returncode == 1, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert result["schema"] == "bundlerun.bisect/1"
    assert result["outcome"] == "culprit" and result["exit_code"] == 1
    assert len(result["culprits"]) == 1
    found = result["culprits"][0]
    assert [u["key"] for u in found["units"]] == ["conv2d_1"]  # the exported program's node of self.conv2
    unit = found["units"][0]
    assert unit["module"] == "conv2 (Conv2d)"
    assert "planted_fault.py:" in unit["source"] and "self.conv2(x)" in unit["source"]
    assert unit["op"] == "aten.convolution.default"
    assert unit["backend"] == backend_id
    assert found["with"]["verdict"] == "FAIL"  # only conv2 delegated: fails
    assert found["without"]["verdict"] == "PASS"  # everything else delegated: passes
    n = len(result["units"])
    assert n >= 4  # conv1, its relu (or the pair), conv2, ..., fc: something to bisect
    assert result["lowerings"] <= search_bound(n) == result["bound"]
    roles = [s["role"] for s in result["steps"]]
    assert roles[:2] == ["all", "none"] and roles[-1] == "all-but-culprits"
    assert result["steps"][0]["verdict"] == "FAIL" and result["steps"][1]["verdict"] == "PASS"
    assert "culprit: conv2d_1 = aten.convolution.default in conv2 (Conv2d)" in proc.stdout
    return unit


def test_search_is_logarithmic_and_finds_interacting_culprits():
    """The search itself: one culprit in ceil(log2 n) + 1 predicate calls; a pair that fails only
    together is found whole; the calls stay within the bound the command states."""
    units = [f"u{i}" for i in range(37)]
    for culprits in ({"u0"}, {"u17"}, {"u36"}, {"u3", "u30"}, {"u5", "u6", "u20"}):
        calls: list[frozenset] = []

        def fails(keys, culprits=culprits):
            calls.append(frozenset(keys))
            return culprits <= set(keys)  # interacting: all of them must be delegated

        found = minimal_failing(units, fails)
        assert set(found) == culprits
        per = math.ceil(math.log2(len(units))) + 1
        assert len(set(calls)) <= len(culprits) * per
        assert len(set(calls)) + 3 <= search_bound(len(units), len(culprits))


def test_bisect_xnnpack_names_the_planted_conv_and_reuses_the_build_cache(tmp_path):
    proc, result = _bisect(tmp_path, FAULT, "host://xnnpack")
    _assert_conv2_culprit(proc, result, "XnnpackBackend")
    assert {s["cache"] for s in result["steps"]} <= {"miss", "hit"}
    # every candidate is a real bundle whose manifest says what was delegated
    from bundlerun.bundles.bpte import read_bundle

    search = next(s for s in result["steps"] if s["role"] == "search")
    control = read_bundle(search["bundle"]).manifest.build.lowering["partition_control"]
    delegated = [u["key"] for u in control["units"] if u["delegated"]]
    assert delegated == search["delegated"] and "RestrictedPartitioner" in control["mechanism"]
    summary = (tmp_path / "bisect" / "summary.md").read_text()
    assert "Culprit set 1" in summary and "conv2d\\_1" in summary
    # the same bisection again: every candidate comes from the build cache, same answer
    proc2, again = _bisect(tmp_path, FAULT, "host://xnnpack", report=tmp_path / "again")
    assert proc2.returncode == 1
    assert {s["cache"] for s in again["steps"]} == {"hit"}
    assert again["culprits"][0]["keys"] == ["conv2d_1"]


def test_bisect_tosa_int_names_the_planted_conv(tmp_path):
    proc, result = _bisect(tmp_path, FAULT, "tosa://int")
    _assert_conv2_culprit(proc, result, "TOSABackend")
    # int8: conv2 and the ReLU its quantization pattern fuses are one unit (no qparams between them)
    unit = result["culprits"][0]["units"][0]
    assert unit["roots"] == ["conv2d_1", "relu_1"]
    assert any("quantize_per_tensor" in n for n in unit["nodes"])


def test_bisect_qnn_htp_simulator_names_the_planted_conv(tmp_path):
    # QNN fp16 is judged at ExecuTorch's QNN tolerances (atol = rtol = 0.1): a larger planted error
    proc, result = _bisect(tmp_path, FAULT, "qnn://htp-sim", env={"BUNDLERUN_PLANTED_FAULT_GAIN": "-8"},
                           cache=False)
    _assert_conv2_culprit(proc, result, "QnnBackend")
    none = result["steps"][1]
    assert none["target"] == "host://portable"  # qnn:// refuses a program without a QnnBackend delegate
    assert any("refuses a program with nothing delegated" in n for n in result["notes"])
    assert all(s["target"] == "qnn://htp-sim" for s in result["steps"] if s["role"] != "none")


def test_bisect_vulkan_lavapipe_names_the_planted_conv(tmp_path):
    proc, result = _bisect(tmp_path, FAULT, "vulkan://lavapipe")
    _assert_conv2_culprit(proc, result, "VulkanBackend")


def test_bisect_failure_outside_the_delegate_is_not_bisected(tmp_path):
    """The exported program itself differs from eager: it fails with nothing delegated too."""
    proc, result = _bisect(tmp_path, DIVERGENT, "host://xnnpack")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert result["outcome"] == "fails-undelegated"
    assert result["lowerings"] == 2 and [s["role"] for s in result["steps"]] == ["all", "none"]
    assert not result["culprits"]
    first = result["export_divergence"]["first_divergent"]
    assert first["module"] == "block.conv" and first["type"] == "ScaledConv"
    assert "portable kernels or the model itself" in proc.stdout


def test_bisect_nothing_fails(tmp_path):
    proc, result = _bisect(tmp_path, FAULT, "host://xnnpack", env={"BUNDLERUN_PLANTED_FAULT": "off"}, cache=False)
    assert result["steps"][0]["cache"] == "off"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["outcome"] == "nothing-fails" and result["lowerings"] == 1
    assert result["steps"][0]["verdict"] == "PASS"


def test_bisect_could_not_run_is_exit_2(tmp_path):
    """An XNNPACK lowering on the TOSA reference model cannot run at all: not a crash to bisect."""
    proc, result = _bisect(tmp_path, FAULT, "tosa://fp", "--backend", "xnnpack", "--dtype", "fp32")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert result["outcome"] == "stopped" and result["lowerings"] == 1
    assert result["steps"][0]["error_kind"] == "missing-backend"  # the walker has no XnnpackBackend
    assert "could not run on tosa://fp" in result["notes"][-1]


def test_bisect_interrupted_keeps_what_it_found(tmp_path):
    """Ctrl-C after the second candidate: exit 130, the report holds the finished steps."""
    report = tmp_path / "bisect"
    env = {**os.environ, "BUNDLERUN_HISTORY": "off"}
    # --no-cache: each candidate takes seconds to lower, so the signal lands inside the third one
    proc = subprocess.Popen([*CMD, "bisect", FAULT, "--target", "host://xnnpack", "--cases", "1", "--report",
                             str(report), "--no-cache"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    seen = []
    try:
        deadline = time.monotonic() + 1200
        for line in proc.stderr:  # progress lines: "[3] search: ..." starts the third candidate
            seen.append(line)
            if line.startswith("[3]") or time.monotonic() > deadline:
                break
        assert any(line.startswith("[3]") for line in seen), "".join(seen)[-3000:]
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    result = json.loads((report / "report.json").read_text())
    assert result["interrupted"] == "interrupted (Ctrl-C)" and result["exit_code"] == 130
    assert [s["verdict"] for s in result["steps"][:2]] == ["FAIL", "PASS"]
    assert len(result["units"]) >= 4


def test_bisect_output_the_case_does_not_have_is_exit_2_not_nothing_fails(tmp_path):
    """`--output nosuch` once judged no output and said "nothing fails" (exit 0)."""
    proc, result = _bisect(tmp_path, FAULT, "host://xnnpack", "--output", "nosuch")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert result["outcome"] == "stopped" and result["lowerings"] == 1
    assert "--output 'nosuch'" in result["notes"][-1] and "its outputs: out0" in result["notes"][-1]
