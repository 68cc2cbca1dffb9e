"""firmware_scripts/qnn/install_htp_sim.sh, for real (pip from PyPI, the pinned onnxruntime-qnn 2.5.0
wheel) into a private cache: hash-checked, only the five libraries, idempotent, a damaged install
repaired. No double."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "firmware_scripts" / "qnn" / "install_htp_sim.sh"


def _install(cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--python", sys.executable], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "BUNDLERUN_CACHE": str(cache)})


def test_installs_the_pinned_libraries_once_and_repairs_a_damaged_one(tmp_path):
    from bundlerun.bundles.backends.qnn import QNN_LIBRARIES

    res = _install(tmp_path)
    assert res.returncode == 0, res.stderr
    dest = Path(res.stdout.strip().splitlines()[-1])
    assert dest == tmp_path / "qnn" / "2.49.40"
    record = json.loads((dest / "qnn.json").read_text())
    pinned = next(ln.split('"')[1] for ln in SCRIPT.read_text().splitlines() if ln.startswith("WHEEL_SHA256="))
    assert record["wheel_sha256"] == pinned and record["qnn_version"] == "2.49.40"
    assert sorted(p.name for p in (dest / "lib").iterdir()) == sorted(QNN_LIBRARIES)
    for f in record["files"]:
        assert hashlib.sha256((dest / "lib" / f["name"]).read_bytes()).hexdigest() == f["sha256"]
    assert (dest / "Qualcomm_LICENSE.pdf").is_file()

    start = time.monotonic()
    again = _install(tmp_path)
    assert again.returncode == 0 and again.stdout.strip() == str(dest)
    assert time.monotonic() - start < 5.0  # nothing downloaded: qnn.json matched

    with open(dest / "lib" / "libQnnSystem.so", "r+b") as f:  # a truncated library
        f.truncate(1000)
    repaired = _install(tmp_path)
    assert repaired.returncode == 0, repaired.stderr
    assert (dest / "lib" / "libQnnSystem.so").stat().st_size == next(
        f["size"] for f in record["files"] if f["name"] == "libQnnSystem.so")


def test_unknown_option_is_one_line(tmp_path):
    res = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip() == "install_htp_sim.sh: unknown option --bogus (see --help)"
