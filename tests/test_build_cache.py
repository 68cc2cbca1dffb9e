"""The build cache: a second identical build lowers nothing and gives the same bundle; any
input change (dtype, backend, cases, seed, model source, a package version) misses; a corrupted
or mismatched entry is detected by the bundle's integrity checks and rebuilt, never used;
`--no-cache` bypasses it. Real builds (ExecuTorch lowering), counted at the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundlerun.bundles import build_cache, builder
from bundlerun.bundles.bpte import read_bundle
from bundlerun.bundles.builder import BuildRequest, build_bundle

FACTORY = """
import torch

def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.{act}()).eval(), (torch.randn(1, 8),)
"""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture
def lowerings(cache_dir, monkeypatch):
    """A private cache folder, and the number of times a backend recipe actually lowered."""
    monkeypatch.setenv("BUNDLERUN_CACHE", str(cache_dir))
    calls: list[str] = []
    real = builder.lowering_module

    def counting(backend):
        recipe = real(backend)

        class Counted:
            @staticmethod
            def lower(req):
                calls.append(backend)
                return recipe.lower(req)

        return Counted

    monkeypatch.setattr(builder, "lowering_module", counting)
    return calls


def _build(out: Path, model: str = "mlp", **kw) -> builder.BuildResult:
    args = {"backend": "xnnpack", "dtype": "fp32", "cases": 2, "seed": 0, "cache": True, "target_info": {}, **kw}
    return build_bundle(BuildRequest(model=model, output=out, **args))


@pytest.fixture(scope="module")
def baseline(cache_dir, tmp_path_factory):
    """The reference build, made once into the module's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BUNDLERUN_CACHE", str(cache_dir))
        result = _build(tmp_path_factory.mktemp("base") / "mlp.bpte")
    assert result.info["cache"] == "miss"
    return result


def test_second_build_is_a_hit_and_the_same_bundle(baseline, lowerings, tmp_path):
    again = _build(tmp_path / "again.bpte")
    assert lowerings == []  # nothing was lowered
    assert again.info["cache"] == "hit" and again.info["cache_key"] == baseline.info["cache_key"]
    assert again.path.read_bytes() == baseline.path.read_bytes()
    bundle = read_bundle(again.path)  # a valid, sealed bundle at the requested place
    assert bundle.manifest.build.cache_key == baseline.info["cache_key"]
    assert again.manifest.build.dtype == "fp32" and again.manifest.build.cases == 2
    entry = Path(build_cache.builds_dir()) / baseline.info["cache_key"] / build_cache.BUNDLE_FILE
    assert entry.is_file()


@pytest.mark.parametrize("change", [
    {"dtype": "fp16"},
    {"backend": "portable", "target": "host://portable"},
    {"cases": 3},
    {"seed": 1},
    {"distribution": "rand"},
    {"overrides": {"atol": 0.05}},
])
def test_each_build_input_change_misses(baseline, lowerings, tmp_path, change):
    result = _build(tmp_path / "changed.bpte", **change)
    assert result.info["cache"] == "miss" and len(lowerings) == 1
    assert result.info["cache_key"] != baseline.info["cache_key"]
    built = read_bundle(result.path).manifest.build.to_dict()
    for key, value in change.items():
        recorded = built["inputs"][0][key] if key == "distribution" else built[key]
        assert recorded == value
    again = _build(tmp_path / "changed-again.bpte", **change)  # and that build is cached under its own key
    assert again.info["cache"] == "hit" and len(lowerings) == 1


def test_a_package_version_change_misses(baseline, lowerings, tmp_path, monkeypatch):
    real = build_cache.package_versions
    monkeypatch.setattr(build_cache, "package_versions", lambda: {**real(), "torch": "9.9.9"})
    result = _build(tmp_path / "newer-torch.bpte")
    assert result.info["cache"] == "miss" and len(lowerings) == 1
    assert result.info["cache_key"] != baseline.info["cache_key"]


def test_zoo_model_code_change_misses(baseline, lowerings, tmp_path, monkeypatch):
    """Zoo models are keyed by the code of bundlerun's bundles/ package (the zoo, recipes, builder)."""
    assert build_cache.code_digest() == build_cache.key_material(
        BuildRequest(model="mlp", output=tmp_path / "x.bpte", target_info={}), "xnnpack", "fp32", "eager-fp32")["code"]
    monkeypatch.setattr(build_cache, "code_digest", lambda: "0" * 64)
    result = _build(tmp_path / "edited-zoo.bpte")
    assert result.info["cache"] == "miss" and len(lowerings) == 1


def test_user_model_source_change_misses(lowerings, tmp_path):
    src = tmp_path / "mine.py"
    src.write_text(FACTORY.format(act="ReLU"))
    first = _build(tmp_path / "a.bpte", model=f"{src}:make")
    second = _build(tmp_path / "b.bpte", model=f"{src}:make")
    assert (first.info["cache"], second.info["cache"]) == ("miss", "hit") and len(lowerings) == 1
    src.write_text(FACTORY.format(act="Tanh"))  # same file, same factory name, other model
    third = _build(tmp_path / "c.bpte", model=f"{src}:make")
    assert third.info["cache"] == "miss" and len(lowerings) == 2
    assert third.info["cache_key"] != first.info["cache_key"]
    assert "tanh" in " ".join(read_bundle(third.path).manifest.build.ops).lower()


def test_corrupted_entry_is_detected_and_rebuilt(baseline, lowerings, tmp_path):
    key = baseline.info["cache_key"]
    entry = Path(build_cache.builds_dir()) / key / build_cache.BUNDLE_FILE
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    entry.write_bytes(bytes(data))
    result = _build(tmp_path / "rebuilt.bpte")
    assert result.info["cache"] == "miss" and len(lowerings) == 1  # rebuilt, not trusted
    assert any("corrupted build-cache entry" in w for w in result.info.get("warnings", []))
    assert read_bundle(result.path).manifest.build.cache_key == key
    assert entry.read_bytes() == result.path.read_bytes()  # the entry was replaced by the good build
    assert _build(tmp_path / "after.bpte").info["cache"] == "hit" and len(lowerings) == 1


def test_an_entry_filed_under_another_key_is_not_used(baseline, lowerings, tmp_path):
    """A valid bundle in the wrong folder (copied, or a key collision on disk) is refused."""
    other = _build(tmp_path / "seed5.bpte", seed=5)
    assert len(lowerings) == 1
    wrong = Path(build_cache.builds_dir()) / baseline.info["cache_key"] / build_cache.BUNDLE_FILE
    wrong.write_bytes(other.path.read_bytes())
    result = _build(tmp_path / "base-again.bpte")
    assert result.info["cache"] == "miss" and len(lowerings) == 2
    assert read_bundle(result.path).manifest.build.seed == 0


def test_no_cache_builds_and_reads_nothing_from_the_cache(baseline, lowerings, tmp_path):
    result = _build(tmp_path / "fresh.bpte", cache=False)
    assert len(lowerings) == 1 and "cache" not in result.info
    # the key is still recorded (provenance), and it is the same key
    assert read_bundle(result.path).manifest.build.cache_key == baseline.info["cache_key"]


def test_cli_second_validate_rebuilds_nothing(cli, tmp_path):
    env = {"BUNDLERUN_CACHE": str(tmp_path / "cache")}
    args = ["validate", "mlp", "--cases", "2", "--no-history", "--json"]
    first = cli(*args, "--report", str(tmp_path / "r1"), env=env)
    second = cli(*args, "--report", str(tmp_path / "r2"), env=env)
    bypass = cli(*args, "--report", str(tmp_path / "r3"), "--no-cache", env=env)
    assert [p.returncode for p in (first, second, bypass)] == [0, 0, 0], second.stderr[-2000:]
    assert "cached build" not in first.stderr
    assert "mlp-fp32: cached build" in second.stderr
    assert "cached build" not in bypass.stderr
    assert [json.loads(p.stdout)["runs"][0]["verdict"] for p in (first, second, bypass)] == ["PASS"] * 3
    assert (tmp_path / "r2" / "mlp-fp32" / "mlp-fp32.bpte").read_bytes() == \
        (tmp_path / "r1" / "mlp-fp32" / "mlp-fp32.bpte").read_bytes()


def test_an_etrecord_build_is_cached_with_its_side_files(lowerings, tmp_path):
    """`--etrecord` builds (bundlerun debug's input) are cached with the ETRecord and delegate graphs the
    manifest names: a hit in another folder writes the same bundle and the same side files beside it; another
    stem misses (the manifest records the side files' names); a side file changed in the cache is caught by the
    sha256 its manifest records and the entry rebuilt, never used."""
    from bundlerun.bundles.build_parts import side_files
    from bundlerun.bundles.fileio import file_sha256

    first = _build(tmp_path / "a" / "m.bpte", etrecord=True)
    assert first.info["cache"] == "miss" and len(lowerings) == 1
    sides = side_files(first.manifest)
    assert sides[0][0] == "m.etrecord" and all((tmp_path / "a" / name).is_file() for name, _ in sides)
    hit = _build(tmp_path / "b" / "m.bpte", etrecord=True)
    assert hit.info["cache"] == "hit" and len(lowerings) == 1
    assert hit.path.read_bytes() == first.path.read_bytes()
    for name, sha in sides:
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()
        assert file_sha256(tmp_path / "b" / name) == sha
    other = _build(tmp_path / "c" / "n.bpte", etrecord=True)
    assert other.info["cache"] == "miss" and len(lowerings) == 2
    assert other.info["cache_key"] != first.info["cache_key"] and (tmp_path / "c" / "n.etrecord").is_file()
    entry = Path(build_cache.builds_dir()) / first.info["cache_key"]
    (entry / sides[0][0]).write_bytes(b"not the ETRecord")
    rebuilt = _build(tmp_path / "d" / "m.bpte", etrecord=True)
    assert rebuilt.info["cache"] == "miss" and len(lowerings) == 3
    assert any("missing or not the one its manifest records" in w for w in rebuilt.info.get("warnings", []))
    assert file_sha256(tmp_path / "d" / sides[0][0]) == side_files(rebuilt.manifest)[0][1]


def _entry(root: Path, key: str, size: int, mtime: float) -> None:
    folder = root / key
    folder.mkdir(parents=True)
    (folder / build_cache.BUNDLE_FILE).write_bytes(b"\0" * size)
    import os

    os.utime(folder, (mtime, mtime))


def test_the_folder_is_pruned_least_recently_used_first(tmp_path, monkeypatch):
    """Plain folders with set sizes and times (no build): the oldest go until the rest fit, the entry
    just stored stays however big, and a killed writer's day-old temp folder goes; a fresh one stays."""
    monkeypatch.setenv("BUNDLERUN_CACHE", str(tmp_path))
    root = build_cache.builds_dir()
    for i, (size, age) in enumerate([(400, 10), (300, 40), (300, 30), (500, 20), (900, 50)]):
        _entry(root, f"k{i}", size, 1_000_000 - age)
    (root / ".old.writer").mkdir()
    import os

    os.utime(root / ".old.writer", (1.0, 1.0))
    (root / ".new.writer").mkdir()
    removed = build_cache.prune(1000, keep="k4")  # newest first: k0 400, k3 500 (900), k2 +300 > 1000
    assert sorted(removed) == ["k1", "k2"]
    assert sorted(p.name for p in root.iterdir()) == [".new.writer", "k0", "k3", "k4"]


def test_store_bounds_the_folder_and_a_hit_marks_its_entry_used(baseline, lowerings, tmp_path, monkeypatch):
    """The module's real cached build: a hit touches its folder, so a store under a bound that holds
    one entry keeps the new one and removes the older."""
    import os
    import time

    key = baseline.info["cache_key"]
    entry = build_cache.builds_dir() / key
    os.utime(entry, (1.0, 1.0))
    assert _build(tmp_path / "hit.bpte").info["cache"] == "hit"
    assert time.time() - entry.stat().st_mtime < 60  # marked used now
    other = tmp_path / "other.bpte"
    other.write_bytes(b"x" * (2 << 20))
    monkeypatch.setenv(build_cache.MAX_MB_ENV, "1")
    stored = build_cache.store("f" * 64, other)
    assert stored is not None and stored.is_dir() and not entry.exists()  # 2 MB kept alone, over the 1 MB bound
    monkeypatch.setenv(build_cache.MAX_MB_ENV, "0")  # no bound: the folder keeps everything
    assert build_cache.store("e" * 64, other) is not None and stored.is_dir()
    baseline_again = _build(tmp_path / "rebuilt.bpte")  # the pruned entry is simply built again
    assert baseline_again.info["cache"] == "miss" and baseline_again.info["cache_key"] == key


def test_a_malformed_bound_is_said_before_the_build(lowerings, tmp_path, monkeypatch):
    from bundlerun.bundles.errors import BundlerunError

    monkeypatch.setenv(build_cache.MAX_MB_ENV, "5GB")
    with pytest.raises(BundlerunError, match="BUNDLERUN_BUILD_CACHE_MB='5GB': expected a whole number of MB"):
        _build(tmp_path / "x.bpte")
    assert lowerings == []
