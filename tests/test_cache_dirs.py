"""bundles/cache_dirs.py: the one cache root every layer uses, and the folders that follow it."""

from __future__ import annotations

from bundlerun.bundles import cache_dirs


def test_bundlerun_cache_wins_over_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("BUNDLERUN_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dirs.cache_root() == tmp_path / "mine"
    assert cache_dirs.cache_dir("builds") == tmp_path / "mine" / "builds"


def test_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("BUNDLERUN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dirs.cache_root() == tmp_path / "xdg" / "bundlerun"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dirs.cache_root() == tmp_path / "home" / ".cache" / "bundlerun"


def test_empty_variables_count_as_unset(tmp_path, monkeypatch):
    monkeypatch.setenv("BUNDLERUN_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dirs.cache_root() == tmp_path / "xdg" / "bundlerun"


def test_every_cache_user_follows_the_root(tmp_path, monkeypatch):
    """The build cache, the QNN simulator folder and the qemu plugins all sit under the one root."""
    from bundlerun.bundles import build_cache
    from bundlerun.bundles.backends import qnn
    from bundlerun.targets.arm import qemu_plugin

    monkeypatch.delenv("BUNDLERUN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmp_path / "bundlerun"
    assert build_cache.builds_dir() == root / "builds"
    assert qnn.simulator_dir() == root / "qnn" / qnn.QNN_VERSION
    assert qemu_plugin._plugins_dir() == root / "qemu-plugins"
