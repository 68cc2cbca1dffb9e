"""A non-editable install works beside executorch[ethos-u], whose tosa-tools installs a top-level
`runner` package of its own: bundlerun installs as bundlerun.bundles / .targets / .runner.

The wheel is built from this tree and pip-installed (no deps) into a fresh venv whose other
packages (torch, executorch[ethos-u] with tosa-tools' `runner`) are the project's own, reached
through a path entry; then the installed `bundlerun` validates mlp on the host and runs tosa://int."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package_of_the_tree():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {"bundlerun"} | {"bundlerun." + ".".join(p.parent.relative_to(ROOT).parts)
                             for top in ("bundles", "targets", "runner") for p in (ROOT / top).rglob("__init__.py")}
    found.add("bundlerun.bundles.data")  # the registry's TOML files: a data package (no modules)
    assert listed == found
    assert config["package-data"] == {"bundlerun.bundles.data": ["*.toml"]}
    dirs = {p.parent.relative_to(ROOT) for top in ("bundles", "targets", "runner") for p in (ROOT / top).rglob("*.py")}
    missing = [str(d) for d in dirs if not (ROOT / d / "__init__.py").is_file()]
    assert not missing, f"folders with modules but no __init__.py (not installed): {missing}"


def test_main_venv_keeps_the_real_pyserial_and_no_labgrid():
    """labgrid's pyserial-labgrid fork installs over pyserial's `serial` files, so labgrid lives in
    .venv-labgrid (scripts/setup.sh) and never in bundlerun's venv: `serial` there is pyserial 3.5's."""
    import base64
    import hashlib
    import importlib.util
    from importlib import metadata

    import serial

    dist = metadata.distribution("pyserial")
    assert dist.version == "3.5"
    rfc2217 = next(f for f in dist.files if f.as_posix() == "serial/rfc2217.py")
    path = Path(serial.__file__).parent / "rfc2217.py"
    assert Path(dist.locate_file(rfc2217)).resolve() == path.resolve()
    actual = hashlib.new(rfc2217.hash.mode, path.read_bytes()).digest()
    assert base64.urlsafe_b64encode(actual).rstrip(b"=").decode() == rfc2217.hash.value, \
        "serial/rfc2217.py is not the file pyserial 3.5 installed (overwritten by a fork?)"
    # every installed distribution that claims serial/ files is pyserial
    owners = {d.metadata["Name"] for d in metadata.distributions()
              if any(f.as_posix().startswith("serial/") for f in (d.files or ()))}
    assert owners == {"pyserial"}, owners
    assert importlib.util.find_spec("labgrid") is None
    with __import__("pytest").raises(metadata.PackageNotFoundError):
        metadata.version("labgrid")


def test_executorch_reads_its_edge_dialect_yaml_with_the_c_parser():
    """pyproject's ruamel.yaml.clib: ExecuTorch's `YAML(typ="safe")` (exir/dialects/edge/_ops.py, run at
    `import executorch.exir`) takes ruamel's C parser, and it reads edge.yaml as the pure parser does."""
    from importlib import resources

    from ruamel.yaml import YAML
    from ruamel.yaml.main import CParser

    import executorch.exir.dialects.edge as edge_package

    assert CParser is not None and YAML(typ="safe").Parser is CParser
    text = (resources.files(edge_package) / "edge.yaml").read_text(encoding="utf-8")
    assert YAML(typ="safe").load(text) == YAML(typ="safe", pure=True).load(text)


def test_wheel_installs_beside_executorch_ethos_u_and_runs(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("bundlerun-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the project's packages (torch, executorch[ethos-u] incl. tosa-tools' top-level `runner`), not bundlerun:
    # a plain path entry does not run the editable install's finder
    (site / "project-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], capture_output=True,
                             text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    probe = subprocess.run([str(py), "-c", "import runner, bundlerun.runner, tosa_reference_model; "
                            "print(runner.__file__); print(bundlerun.runner.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    tosa_runner, ours = probe.stdout.split()
    assert "site-packages/runner/" in tosa_runner and str(site) in ours and "/bundlerun/runner/" in ours
    exe = venv / "bin" / "bundlerun"
    res = subprocess.run([str(exe), "validate", "mlp", "--cases", "2", "--report", str(tmp_path / "host"), "--no-history",
                          "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert json.loads(res.stdout)["runs"][0]["verdict"] == "PASS"
    res = subprocess.run([str(exe), "validate", "mlp", "--target", "tosa://int", "--cases", "2", "--report",
                          str(tmp_path / "tosa"), "--no-history", "--json"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    report = json.loads((tmp_path / "tosa" / "mlp-int8" / "report.json").read_text())
    assert report["summary"]["verdict"] == "PASS" and report["target"]["url"] == "tosa://int"
    assert report["tool"]["version"]
