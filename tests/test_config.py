"""Project configuration: discovery upward, merge over the built-ins, one-line validation errors."""

from __future__ import annotations

import textwrap

import pytest

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.tolerances import ToleranceContext, resolve_criteria
from bundlerun.bundles.project_config import find_config_files, load_project_config


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("BUNDLERUN_CONFIG", raising=False)
    monkeypatch.delenv("BUNDLERUN_TOLERANCES", raising=False)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_bundlerun_toml_is_found_upward_and_sections_pass_through(tmp_path):
    cfg = write(tmp_path / "bundlerun.toml", """
        [tolerances.backends.xnnpack.default]
        atol = 0.002
        [targets.fvp]
        fvp_bin = "/opt/FVP"
        [history]
        db = "h.sqlite"
        [regression]
        max_drop = 0.01
    """)
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    config = load_project_config(nested)
    assert config["_file"] == str(cfg)
    assert config["targets"] == {"fvp": {"fvp_bin": "/opt/FVP"}}
    assert config["history"] == {"db": "h.sqlite"} and config["regression"] == {"max_drop": 0.01}
    assert config["tolerances"]["backends"]["xnnpack"]["default"]["atol"] == 0.002


def test_pyproject_section_and_merge_with_bundlerun_toml(tmp_path):
    write(tmp_path / "pyproject.toml", """
        [project]
        name = "x"
        [tool.bundlerun.targets.adb]
        workdir = "/data/local/tmp/a"
        [tool.bundlerun.tolerances.override]
        atol = 0.5
    """)
    assert load_project_config(tmp_path)["tolerances"]["override"]["atol"] == 0.5
    write(tmp_path / "bundlerun.toml", """
        [tolerances.override]
        atol = 0.25
    """)
    merged = load_project_config(tmp_path)
    assert merged["tolerances"]["override"]["atol"] == 0.25  # bundlerun.toml wins
    assert merged["targets"]["adb"]["workdir"] == "/data/local/tmp/a"  # pyproject kept
    assert [p.name for p in find_config_files(tmp_path)] == ["pyproject.toml", "bundlerun.toml"]


def test_pyproject_without_section_is_skipped_and_no_config_is_empty(tmp_path):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    assert find_config_files(tmp_path) == []  # nothing above a pytest tmp dir either
    (tmp_path / "sub").mkdir()
    assert load_project_config(tmp_path / "sub") == {}


@pytest.mark.parametrize("header", ['[tool.bundlerun]', '[tool . "bundlerun" . targets]',
                                    '[tool."\\u0062undlerun"]', "[tool]\nbundlerun = {history = {db = 'x'}}"])
def test_a_pyproject_is_parsed_only_when_it_can_hold_the_section(tmp_path, header):
    """Another project's pyproject.toml (no `bundlerun` in it, no escape that could spell it) is not parsed:
    its own TOML is not bundlerun's concern, even when broken. Any way of writing the table is found."""
    write(tmp_path / "other" / "pyproject.toml", "[project\nname = 'x'\n")  # invalid TOML, not ours
    assert find_config_files(tmp_path / "other") == [] and load_project_config(tmp_path / "other") == {}
    write(tmp_path / "ours" / "pyproject.toml", header + "\n")
    assert [p.name for p in find_config_files(tmp_path / "ours")] == ["pyproject.toml"]
    write(tmp_path / "broken" / "pyproject.toml", "[tool.bundlerun\n")  # ours, broken: one line, as before
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_project_config(tmp_path / "broken")


def test_explicit_file_and_env_var(tmp_path, monkeypatch):
    cfg = write(tmp_path / "elsewhere" / "my.toml", "[history]\ndb = 'x'\n")
    assert load_project_config(cfg)["history"] == {"db": "x"}
    monkeypatch.setenv("BUNDLERUN_CONFIG", str(cfg))
    assert load_project_config()["_file"] == str(cfg)
    with pytest.raises(ConfigError, match="does not exist"):
        load_project_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    "body, match",
    [
        ("[tolerances.backends.xnnpack.default]\natoll = 0.1\n", r"unknown key 'atoll' \(did you mean 'atol'\?\)"),
        ("[tolerances.backends.xnnpak.default]\natol = 0.1\n", r"unknown backend 'xnnpak' \(did you mean 'xnnpack'\?\)"),
        ("[tolerances.backends.xnnpack.default]\natol = -0.1\n", r"atol must not be negative"),
        ("[tolerances.backends.xnnpack.default]\natol = \"big\"\n", r"atol must be a number"),
        ("[tolerances.backends.xnnpack.tiers.\"int8.vs-flaot\"]\nsqnr_min_db = 10\n", r"did you mean 'int8.vs-float'"),
        ("[tolerances.backends.arm.variants.ethos-u55.tiers.int8]\nqtoll = 2\n", r"did you mean 'qtol'"),
        ("[[tolerances.model_overrides]]\nmodels = ['m']\nbackend = 'amr'\natol = 1\n", r"did you mean 'arm'"),
        ("[[tolerances.model_overrides]]\nmodels = ['m']\nbackend = 'arm'\nvariants = ['etos-u55']\natol = 1\n", r"did you mean 'ethos-u55'"),
        ("[tolerances.override]\ncosine_min = 1.5\n", r"cosine_min must be at most 1"),
        ("[tolerances.override]\nexact = 1\n", r"exact must be true or false"),
        ("[tolerance.override]\natol = 1\n", r"unknown section 'tolerance' \(did you mean 'tolerances'\?\)"),
        ("[tolerances\natol = 1\n", r"invalid TOML"),
    ],
)
def test_validation_errors_are_one_line_and_name_the_file(tmp_path, body, match):
    cfg = write(tmp_path / "bundlerun.toml", body)
    with pytest.raises(ConfigError, match=match) as info:
        load_project_config(tmp_path)
    message = str(info.value)
    assert "\n" not in message and str(cfg) in message


def test_build_resolution_uses_the_project_overlay(tmp_path, monkeypatch):
    cfg = write(tmp_path / "bundlerun.toml", """
        [[tolerances.model_overrides]]
        models = ["tiny-cnn"]
        backend = "xnnpack"
        dtypes = ["fp32"]
        outputs = ["out0"]
        atol = 0.02
    """)
    monkeypatch.chdir(tmp_path)
    c = resolve_criteria(ToleranceContext(backend="xnnpack", target="host://xnnpack", dtype="fp32", model="tiny-cnn"))
    assert c.atol == 0.02
    assert c.trail["atol"][-1] == {"value": 0.02, "source": "model + target override: model_overrides[0] tiny-cnn on xnnpack",
                                   "file": str(cfg)}
    other = resolve_criteria(ToleranceContext(backend="xnnpack", target="host://xnnpack", dtype="fp32", model="mlp"))
    assert other.atol == 1e-3
