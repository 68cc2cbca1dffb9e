"""MLPerf Tiny models (ExecuTorch's examples/models/mlperf_tiny, `et:NAME`) int8 on the Cortex-M55
runner under QEMU (`qemu://mps3-an547`, issue 36 item 5): ExecuTorch's own arm_executor_runner built
from source with exactly these bundles' operators (firmware_scripts/arm/build_qemu_runner.sh
--ops-from), every case judged on the host against the quantized reference, as
bench/et_models_table.py's m55-qemu lane builds them. No double anywhere.

ds_cnn used to end in ERROR: its program took a contiguous input, and
cortex_m::quantized_depthwise_conv2d refuses an activation that is not channels_last
(backends/cortex_m/ops/op_quantized_depthwise_conv2d.cpp:70). The cortex-m recipe now exports 4-D
inputs channels_last as ExecuTorch's Cortex-M tests do (backends/cortex_m/test/models/
test_ds_cnn.py:40) and the bundle stores each input in the program's dim order. resnet8's 3-channel
input is the case where that order changes the bytes: the control below stores them NCHW under the
same program and is judged FAIL, so the PASS is the layout's doing."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import BundledValue, read_bundle, write_bundle
from bundlerun.bundles.integrity import seal
from bundlerun.bundles.program_meta import method_inputs
from tests.conftest import run_cli

URL = "qemu://mps3-an547"
MODELS = ("ds_cnn", "resnet8")


@pytest.fixture(scope="module")
def mlperf(bundle_cache, qemu_runner) -> tuple[dict[str, Path], Path]:
    """The int8 bundles (2 cases, quantized reference: bench/et_models_table.py lane m55-qemu) and a
    runner holding exactly their operators."""
    bundles = {name: bundle_cache(f"et:{name}", "int8", cases=2, target=URL, reference="quantized")
               for name in MODELS}
    runner = qemu_runner("--ops-from", *(str(p) for p in bundles.values()))
    return bundles, runner / "arm_executor_runner.elf"


def _run(bundle: Path, elf: Path, report_dir: Path) -> tuple[int, dict]:
    res = run_cli("run", str(bundle), "--target", URL, "--target-opt", f"runner_elf={elf}",
                  "--report", str(report_dir), "--no-history")
    return res.returncode, json.loads((report_dir / "report.json").read_text())


@pytest.mark.parametrize("name", MODELS)
def test_mlperf_tiny_int8_passes_on_the_cortex_m55(mlperf, tmp_path, name):
    bundles, elf = mlperf
    bundle = read_bundle(bundles[name])
    declared = method_inputs(bundle.program, name)["forward"][0]
    # channels_last as torch.export records it: (0, 2, 3, 1); for ds_cnn's one channel the stride
    # ties keep index order, (0, 2, 1, 3) (the same bytes as NCHW).
    assert declared.dim_order == {"ds_cnn": [0, 2, 1, 3], "resnet8": [0, 2, 3, 1]}[name]
    for case in bundle.suite("forward").test_cases:
        assert case.inputs[0].dim_order == declared.dim_order and case.inputs[0].sizes == declared.sizes
    code, report = _run(bundles[name], elf, tmp_path / "r")
    assert code == 0, json.dumps(report["summary"])[:2000]
    assert report["summary"]["verdict"] == "PASS"
    assert report["bundle"]["backend"] == "cortex-m"
    for case in report["cases"]:
        assert case["verdict"] == "PASS"
        assert case["device_verdict"]["verdict"] == "PASS"  # the runner's own BundleIO check


def test_resnet8_inputs_stored_nchw_are_misread_and_fail(mlperf, tmp_path):
    """The control: the same program, each input stored contiguous (NCHW bytes, dim order 0,1,2,3:
    how bundles were written before the inputs followed the program's dim order). The runtime copies
    the bytes as they are and reads them as NHWC, so every case is judged FAIL."""
    bundles, elf = mlperf
    bundle = copy.deepcopy(read_bundle(bundles["resnet8"]))
    for case in bundle.suite("forward").test_cases:
        logical = case.inputs[0].to_array()
        contiguous = BundledValue.from_array(logical, case.inputs[0].scalar_type)  # dim order (0, 1, 2, 3)
        assert contiguous.data != case.inputs[0].data  # three channels: the layouts differ
        np.testing.assert_array_equal(contiguous.to_array(), logical)  # the same values, to bundlerun
        case.inputs[0] = contiguous
    path = write_bundle(seal(bundle), tmp_path / "nchw.bpte")
    code, report = _run(path, elf, tmp_path / "r")
    assert code != 0
    assert [c["verdict"] for c in report["cases"]] == ["FAIL", "FAIL"]
