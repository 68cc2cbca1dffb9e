"""The runner cache is relocatable: an entry copied to another cache root (a CI cache restored under
~/.cache, a farm's shared volume) names its own files, not the ones it was built beside.

No double: the entries are runner.json files as firmware_scripts/ write them (absolute paths), in
tmp_path caches; one test copies the real aarch64 runner's entry when setup has built it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bundlerun.targets.runner_cache import RunnerEntryError, cached_runners, find_runner, read_record
from tests.doubles.android_env import real_executor_runner


def _entry(root: Path, key: str, built_in: Path) -> Path:
    """A cache entry under `root` whose runner.json was written by a build that ran in `built_in`."""
    folder = root / "runners" / key
    folder.mkdir(parents=True)
    (folder / "executor_runner").write_bytes(b"\x7fELF")
    old = built_in / "runners" / key
    (folder / "runner.json").write_text(json.dumps({
        "kind": "executor_runner", "arch": "aarch64", "binary": str(old / "executor_runner"),
        "flags": [f"-DKLEIDIAI_SOURCE_DIR={built_in}/src/abc/kleidiai"],
        "xnnpack": {"kleidiai_source": f"{built_in}/src/abc/kleidiai"},
        "sources": {"root": "/home/me/executorch", "fingerprint": "abc"},
        "near": f"{built_in}-other/runners/{key}/executor_runner"}))
    return folder


def test_a_moved_entry_names_its_own_binary_and_the_new_cache(tmp_path, monkeypatch):
    root = tmp_path / "restored"
    folder = _entry(root, "0123456789abcdef0123", tmp_path / "built-here")
    monkeypatch.setenv("BUNDLERUN_CACHE", str(root))
    record = read_record(folder)
    assert record["binary"] == str(folder / "executor_runner") and record["dir"] == str(folder)
    assert record["xnnpack"]["kleidiai_source"] == f"{root}/src/abc/kleidiai"
    # what is not a path under the old cache root is left as recorded: flags (the cache key's input), a
    # user's own checkout, a path that only shares the root's prefix
    assert record["flags"] == [f"-DKLEIDIAI_SOURCE_DIR={tmp_path}/built-here/src/abc/kleidiai"]
    assert record["sources"]["root"] == "/home/me/executorch"
    assert record["near"].startswith(f"{tmp_path}/built-here-other/")
    assert find_runner("executor_runner", "binary", arch="aarch64") == folder / "executor_runner"
    assert [r["binary"] for r in cached_runners("executor_runner")] == [str(folder / "executor_runner")]


def test_an_entry_in_place_and_unreadable_entries(tmp_path):
    folder = _entry(tmp_path, "k" * 20, tmp_path)
    assert read_record(folder)["binary"] == str(folder / "executor_runner")
    for text, why in (("{ not json", "not valid JSON"), ("[1, 2]", "runner.json holds list, not a table")):
        (folder / "runner.json").write_text(text)
        with pytest.raises(RunnerEntryError, match=f"^runner entry damaged: {folder}/runner.json: {why}.*; rebuild "):
            read_record(folder)
    assert read_record(tmp_path / "absent") is None


def test_the_real_aarch64_runner_copied_to_another_cache_is_found_and_named_there(tmp_path, monkeypatch):
    """The entry scripts/setup.sh built, copied whole to a new root: qemu-user:// finds and names the copy."""
    from bundlerun.targets.qemu_user import cached_runner, runner_meta

    try:
        folder = real_executor_runner("aarch64")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    copy = tmp_path / "cache" / "runners" / folder.name
    shutil.copytree(folder, copy, symlinks=True)
    monkeypatch.setenv("BUNDLERUN_CACHE", str(tmp_path / "cache"))
    record = cached_runner("aarch64")
    assert record is not None and record["binary"] == str(copy / "executor_runner")
    assert runner_meta(copy / "executor_runner")["dir"] == str(copy)
