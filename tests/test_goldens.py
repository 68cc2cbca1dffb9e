"""The backend test suite's golden artifacts -> bundles -> replayed on targets.

The goldens are written by the suite itself (GOLDEN_ARTIFACTS_DIR with the wheel's operator
tests, portable flow: add with two inputs, split with three outputs and two subtests), then
`bundlerun import-goldens`, then `bundlerun run` of the bundles on the aarch64 runner under
qemu-aarch64 (qemu-user://) and on the Cortex-M55 runner on QEMU's Corstone SSE-300 (qemu://).
Bad goldens are the real files damaged. No doubles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle


@pytest.fixture(scope="module")
def goldens(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("goldens")
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "GOLDEN_ARTIFACTS_DIR": str(root / "g")}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        env.pop(key, None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs",
                        "executorch.backends.test.suite.operators", "-m", "flow_portable",
                        "-k", "test_add_f32_bcast_first or test_split_size_uneven"],
                       cwd=root, capture_output=True, text=True, timeout=1200, env=env)
    assert r.returncode == 0, r.stdout[-3000:]
    return root / "g"


def test_the_suite_writes_what_the_importer_reads(goldens):
    names = sorted(p.name for p in (goldens / "portable").iterdir())
    assert "add_f32_bcast_first.pte" in names and "add_f32_bcast_first_input_1.bin" in names
    assert "add_f32_bcast_first_expected_output.bin" in names  # one output: no index
    assert "split_size_uneven_1.pte" in names and "split_size_uneven_1_expected_output_2.bin" in names
    assert "split_size_uneven_input.bin" in names  # one input: no index


def test_import_and_replay_on_qemu_user_and_qemu(goldens, tmp_path, cli):
    out = tmp_path / "bundles"
    res = cli("import-goldens", str(goldens), "-o", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "imported 3 of 3 golden(s)" in res.stdout
    add = read_bundle(out / "portable" / "add_f32_bcast_first.bpte")
    m = add.manifest_json
    assert m["model"]["id"] == "portable/add_f32_bcast_first" and m["build"]["backend"] == "portable"
    assert m["extra"]["suite"]["flow"] == "portable"
    crit = m["methods"]["forward"]["outputs"][0]["criteria"]
    assert crit["atol"] == 1e-3 and crit["trail"]["atol"][-1]["file"].endswith("tolerances.toml")  # with its trail
    case = add.suite("forward").test_cases[0]
    assert [v.sizes for v in case.inputs] == [[5], [1, 5, 1, 5]]  # shapes read from the program
    raw = np.fromfile(goldens / "portable" / "add_f32_bcast_first_input_1.bin", dtype=np.float32)
    assert (case.inputs[1].to_array().ravel() == raw).all()
    split = read_bundle(out / "portable" / "split_size_uneven_1.bpte")
    assert len(split.suite("forward").test_cases[0].expected_outputs) == 3
    for target in ("qemu-user://aarch64", "qemu://mps3-an547"):
        for name in ("add_f32_bcast_first", "split_size_uneven_1"):
            report_dir = tmp_path / "runs" / target.split(":")[0] / name
            res = cli("run", str(out / "portable" / f"{name}.bpte"), "--target", target, "--report", str(report_dir),
                      "--no-history", timeout=900)
            report = json.loads((report_dir / "report.json").read_text())
            assert res.returncode == 0 and report["summary"]["verdict"] == "PASS", (target, res.stderr[-2000:])
            assert report["target"]["url"] == target
            assert report["summary"]["outputs"] == (1 if name.startswith("add") else 3)


def test_bad_goldens_are_one_line_each_and_the_rest_is_imported(goldens, tmp_path, cli):
    bad = tmp_path / "g"
    shutil.copytree(goldens, bad)
    flow = bad / "portable"
    (flow / "add_f32_bcast_first_input_1.bin").write_bytes(b"\0" * 7)  # wrong size
    shutil.copy(flow / "add_f32_bcast_first.pte", flow / "extra.pte")  # its inputs are missing
    (flow / "split_size_uneven_1.pte").write_bytes(b"PK\x03\x04 not a program at all")
    (flow / "orphan_expected_output.bin").write_bytes(b"\0" * 4)  # no program beside it
    res = cli("import-goldens", str(bad), "-o", str(tmp_path / "out"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 4, res.stderr
    text = "\n".join(errors)
    assert f"{flow / 'add_f32_bcast_first_input_1.bin'}: 7 bytes, expected 100 for the program's float32[1, 5, 1, 5]" in text
    assert f"{flow / 'extra_input_0.bin'}: missing" in text
    assert f"{flow / 'split_size_uneven_1.pte'}: not an ExecuTorch program" in text
    assert f"{flow / 'orphan_expected_output.bin'}: no orphan.pte beside it" in text
    assert "imported 1 of 4 golden(s)" in res.stdout  # split_size_uneven is intact
    assert (tmp_path / "out" / "portable" / "split_size_uneven.bpte").is_file()
