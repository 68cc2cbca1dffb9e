"""A second Vulkan driver validated against the first by changing ONE setting: the same bundles on Debian 12's
lavapipe (vulkan://lavapipe) and on bookworm-backports' lavapipe unpacked privately
(vulkan://lavapipe?icd=<its json>, firmware_scripts/vulkan/fetch_lavapipe_backports.sh, run by
scripts/setup.sh). Both real drivers; the report says which one ran (read from the driver). Every zoo bundle on
both drivers, judged and compared: tests/test_vulkan_lane.py (it reuses that module's zoo run). No double."""

from __future__ import annotations

from pathlib import Path

from bundlerun.targets.vulkan import icd_library
from tests.conftest import run_cli
from tests.test_vulkan_lane import URL, report, second_icd, system_mesa_version, vulkan_runner  # noqa: F401 - fixtures


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
    assert b["driver_library"] == icd_library(second_icd)[0] and Path(b["driver_library"]).is_file()
