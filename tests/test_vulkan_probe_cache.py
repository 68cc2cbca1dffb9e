"""The Vulkan driver probe is asked once per driver file version: the real lavapipe answers the first time
(a real child through the real loader), the answer is kept in the bundlerun cache (vulkan_probes/) and read
back without a child; a changed ICD, a tampered stored answer or a driver error is asked again. The "no
child" check replaces targets.vulkan._ask_driver with a function that fails the test if called (a guard,
not a double of the driver: every answer asserted here came from the real driver)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bundlerun.targets import vulkan

pytestmark = pytest.mark.slow  # every test starts the real probe child (vulkan.probe_driver), unseen by tests/tiers.py

LAVAPIPE = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BUNDLERUN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vulkan, "_PROBES", {})
    assert LAVAPIPE.is_file(), "lavapipe is not installed (scripts/setup.sh: mesa-vulkan-drivers)"
    return tmp_path / "cache" / "vulkan_probes"


def _no_child(*_a, **_k):
    raise AssertionError("the driver was asked again")


def test_the_answer_is_read_from_the_cache_the_second_time(cache, monkeypatch):
    first = vulkan.probe_driver(LAVAPIPE)
    assert first["devices"][0]["driver_name"] == "llvmpipe", first
    (stored,) = cache.iterdir()
    assert json.loads(stored.read_text()) == first
    monkeypatch.setattr(vulkan, "_PROBES", {})  # a new command
    monkeypatch.setattr(vulkan, "_ask_driver", _no_child)
    assert vulkan.probe_driver(LAVAPIPE) == first


def test_a_changed_icd_or_a_tampered_answer_is_asked_again(cache, tmp_path, monkeypatch):
    icd = tmp_path / "lvp.json"
    icd.write_text(LAVAPIPE.read_text())
    first = vulkan.probe_driver(icd)
    (stored,) = cache.iterdir()
    stored.write_text(json.dumps({"devices": [{"name": 1}]}))  # not the child's shape
    monkeypatch.setattr(vulkan, "_PROBES", {})
    assert vulkan.probe_driver(icd) == first  # asked again (the real driver), and stored again
    assert json.loads(stored.read_text()) == first
    os.utime(icd, ns=(1, 1))  # another version of the ICD file: another key
    monkeypatch.setattr(vulkan, "_PROBES", {})
    assert vulkan.probe_driver(icd) == first
    assert len(list(cache.iterdir())) == 2


def test_a_driver_error_is_never_kept(cache, tmp_path):
    icd = tmp_path / "broken.json"
    icd.write_text(json.dumps({"file_format_version": "1.0.0",
                               "ICD": {"library_path": str(tmp_path / "libmissing.so"), "api_version": "1.3.0"}}))
    assert "error" in vulkan.probe_driver(icd)
    assert not cache.exists() or not list(cache.iterdir())
