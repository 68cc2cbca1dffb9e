"""A second Vulkan driver validated against the first by changing ONE setting: the same bundles on Debian 12's
lavapipe (vulkan://lavapipe) and on bookworm-backports' lavapipe unpacked privately
(vulkan://lavapipe?icd=<its json>, firmware_scripts/vulkan/fetch_lavapipe_backports.sh, run by
scripts/setup.sh). Both real drivers; the report says which one ran (read from the driver), every case is
judged on both, and `bundlerun compare` puts the two runs side by side. No double."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, run_cli
from tests.test_vulkan_lane import URL, report, system_mesa_version, vulkan_runner  # noqa: F401 - the fixture

FETCH = REPO / "firmware_scripts" / "vulkan" / "fetch_lavapipe_backports.sh"
MODELS = ("mlp", "tiny-cnn", "mobile-net", "tiny-transformer", "tiny-gru")
DTYPES = ("fp32", "fp16", "int8")


@pytest.fixture(scope="module")
def second_icd() -> Path:
    res = subprocess.run(["bash", str(FETCH)], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        pytest.fail(f"the second driver could not be unpacked: {res.stderr.strip()[-500:]} (bash {FETCH})")
    icd = Path(res.stdout.strip().splitlines()[-1])
    data = json.loads(icd.read_text())
    assert Path(data["ICD"]["library_path"]).is_absolute()  # never the system's libvulkan_lvp.so by name
    return icd


def _packaged_version(icd: Path) -> str:
    line = next(ln for ln in (icd.parent / "packages.txt").read_text().splitlines()
                if ln.startswith("mesa-vulkan-drivers "))
    return line.split()[1]  # e.g. 25.0.7-2~bpo12+1


def test_the_icd_setting_alone_switches_the_driver(vulkan_runner, second_icd, bundle_cache, tmp_path):
    bundle = bundle_cache("mlp", cases=1, target=URL)
    for name, url in (("a", URL), ("b", f"{URL}?icd={second_icd}")):
        res = run_cli("run", str(bundle), "--target", url, "--report", str(tmp_path / name), "--no-history")
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    a, b = (report(tmp_path / n)["target"]["info"] for n in "ab")
    assert a["runner"] == b["runner"] and a["icd"] != b["icd"] == str(second_icd)
    (da,), (db,) = a["driver"]["devices"], b["driver"]["devices"]
    assert da["driver_info"].startswith(f"Mesa {system_mesa_version()}")
    assert db["driver_info"].startswith(f"Mesa {_packaged_version(second_icd)}")  # the unpacked package ran
    assert b["driver_library"] == json.loads(second_icd.read_text())["ICD"]["library_path"]


def test_every_zoo_bundle_on_both_drivers_judged_and_compared(vulkan_runner, second_icd, bundle_cache, tmp_path):
    """Every case judged on both drivers with the bundle's own criteria; `bundlerun compare` (first driver as
    the baseline) shows the second's worst error per output and says regressed exactly when it is worse."""
    rows = []
    for model in MODELS:
        for dtype in DTYPES:
            bundle = bundle_cache(model, dtype=dtype, cases=2, target=URL)
            folders = {}
            for name, url in (("a", URL), ("b", f"{URL}?icd={second_icd}")):
                folders[name] = tmp_path / f"{model}-{dtype}-{name}"
                res = run_cli("run", str(bundle), "--target", url, "--report", str(folders[name]), "--no-history",
                              "--save-outputs")
                assert res.returncode in (0, 1), res.stdout[-2000:] + res.stderr[-2000:]  # judged, never "could not run"
            ra, rb = report(folders["a"]), report(folders["b"])
            assert ra["summary"]["counts"].get("PASS") == 2, (model, dtype, ra["summary"])  # the reference driver
            assert all(c["verdict"] in ("PASS", "FAIL") for c in rb["cases"])
            oa, ob = np.load(folders["a"] / "outputs.npz"), np.load(folders["b"] / "outputs.npz")
            assert sorted(oa.files) == sorted(ob.files)
            drift = max(float(np.abs(oa[k].astype(np.float64) - ob[k].astype(np.float64)).max()) for k in oa.files)
            res = run_cli("compare", str(folders["a"] / "report.json"), str(folders["b"] / "report.json"), "--json")
            assert res.returncode in (0, 1), res.stdout[-2000:] + res.stderr[-2000:]
            cmp = json.loads(res.stdout)
            assert cmp["cross_target"] is True
            (out,) = cmp["outputs"]
            worst_b = max(c["outputs"][0]["stats"]["error_max"] for c in rb["cases"])
            assert out["error_max"]["current"] == pytest.approx(worst_b)
            if drift == 0.0:  # bit-identical outputs: nothing can have regressed
                assert res.returncode == 0 and out["error_max"]["delta"] == 0.0
            rows.append((model, dtype, drift, rb["summary"]["counts"], res.returncode))
    print("\nsecond driver vs first (model, dtype, max |b - a|, verdicts on b, compare exit):")
    for row in rows:
        print("  ", *row)
