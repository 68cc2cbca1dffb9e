"""QEMU's instruction count in the qemu:// perf section (issue 17, item 1).

Real components: bundlerun's TCG plugin (firmware_scripts/arm/qemu_plugin/insn_count.c) built
by build_qemu_plugin.sh against the qemu-plugin.h of Debian's QEMU 7.2 source, loaded by the
real qemu-system-arm running ExecuTorch's arm_executor_runner (built from source). The only
stand-in is a shell script posing as a QEMU that refuses the plugin (the refusal path)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bundlerun.targets.arm import qemu_plugin
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "firmware_scripts" / "arm" / "build_qemu_plugin.sh"
URL = "qemu://mps3-an547"


@pytest.fixture(scope="module")
def plugin() -> Path:
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"build_qemu_plugin.sh failed (scripts/setup.sh builds it):\n{proc.stderr[-3000:]}"
    folder = Path(proc.stdout.strip().splitlines()[-1])
    meta = json.loads((folder / "plugin.json").read_text())
    assert meta["qemu_version"].startswith("QEMU emulator version") and (folder / "libinsn_count.so").is_file()
    return folder / "libinsn_count.so"


def _run(bundle: Path, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    # a report folder relative to the working directory, as users type it (QEMU runs in the case folder)
    res = run_cli("run", str(bundle), "--target", URL, "--report", out.name, "--no-history", *extra, cwd=out.parent)
    return res, json.loads((out / "report.json").read_text())


def _insns(report: dict) -> list[int]:
    out = []
    for case in report["cases"]:
        figs = [f for f in case.get("perf") or [] if f["name"] == "session_instructions"]
        assert len(figs) == 1, case.get("perf")
        fig = figs[0]
        assert fig["unit"] == "instructions" and fig["kind"] == "simulation-counter" and "TCG plugin" in fig["source"]
        out.append(fig["value"])
    return out


def test_the_plugin_is_found_for_this_qemu_and_cached(plugin):
    import shutil

    assert qemu_plugin.find_plugin(shutil.which("qemu-system-arm")) == plugin
    again = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and Path(again.stdout.strip().splitlines()[-1]) == plugin.parent
    assert "fetching" not in again.stderr  # the cache answered: no download, no compile


def test_every_case_carries_a_deterministic_instruction_count(plugin, qemu_runner, bundle_cache, tmp_path):
    qemu_runner()
    bundle = bundle_cache("mlp", dtype="int8", backend="cortex-m", cases=3, target=URL)
    res, first = _run(bundle, tmp_path / "a")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    counts = _insns(first)
    assert all(c > 10_000 for c in counts)  # a real session: boot, load and inference
    _res, second = _run(bundle, tmp_path / "b")
    assert _insns(second) == counts  # the same runner and bundle: the same count, run after run
    # A bigger program executes more instructions (the figure measures the model, not noise).
    big = bundle_cache("tiny-cnn", dtype="int8", backend="cortex-m", cases=1, target=URL)
    res, other = _run(big, tmp_path / "c")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert _insns(other)[0] > max(counts)


def test_an_instruction_count_rise_fails_the_baseline(plugin, qemu_runner, bundle_cache, tmp_path):
    qemu_runner()
    bundle = bundle_cache("mlp", dtype="int8", backend="cortex-m", cases=3, target=URL)
    _res, base = _run(bundle, tmp_path / "base")
    # The baseline as a run that executed 10% fewer instructions: today's run is a 11% rise.
    for case in base["cases"]:
        for fig in case["perf"]:
            if fig["name"] == "session_instructions":
                fig["value"] = int(fig["value"] / 1.11)
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(base))
    res, report = _run(bundle, tmp_path / "now", "--baseline", str(baseline))
    assert res.returncode == 1, res.stdout[-2000:]
    named = [r for r in report["regressions"] if "session_instructions" in json.dumps(r)]
    assert named, report["regressions"]
    assert "forward.session\\_instructions" in (tmp_path / "now" / "summary.md").read_text()  # markdown-escaped


def test_a_qemu_that_refuses_the_plugin_is_named_and_nothing_is_cached(tmp_path):
    fake = tmp_path / "qemu-system-arm"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'QEMU emulator version 99.0.0'; exit 0; fi\n"
                    "echo 'qemu-system-arm: Could not load plugin x.so: plugin needs API version 99' >&2; exit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "BUNDLERUN_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", str(BUILD), "--qemu", str(fake)], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 2
    assert "QEMU emulator version 99.0.0 does not load the plugin" in proc.stderr
    assert "plugin needs API version 99" in proc.stderr and "--qemu-src" in proc.stderr
    assert not list((tmp_path / "cache" / "qemu-plugins").glob("*/plugin.json"))


def test_the_count_is_read_only_from_a_complete_plugin_line(tmp_path):
    log = tmp_path / "plugin.log"
    assert qemu_plugin.read_count(log) is None  # QEMU killed before exit: no file, no figure (never 0)
    log.write_bytes(b"bundlerun-insn-count: insns=12345\n")
    fig = qemu_plugin.read_count(log)
    assert fig is not None and fig.value == 12345 and fig.name == "session_instructions"
    log.write_bytes(b"bundlerun-insn-count: insns=12\n")  # truncated mid-line by a kill? still a whole line
    assert qemu_plugin.read_count(log).value == 12
    for bad in (b"bundlerun-insn-count: insns=\n", b"bundlerun-insn-count: insns=5\nbundlerun-insn-count: insns=6\n",
                b"garbage\x00\xff", b"bundlerun-insn-count: insns=-3\n"):
        log.write_bytes(bad)
        assert qemu_plugin.read_count(log) is None, bad
