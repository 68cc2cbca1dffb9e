"""`bundlerun debug` on a decode step of an LLM's sequence on the aarch64 lanes: qemu-user://aarch64 and an
emulated arm64 Android device over adb+tcp://.

Which runner each test uses: the real aarch64 debug runner (firmware_scripts/android/debug_runner/, built
from ExecuTorch's sources with the LLM custom-op kernels by build_executor_runner.sh --toolchain gnu
--debug-runner; scripts/setup.sh builds it) under the real qemu-aarch64; its `--prefix_testset_idx` runs
the step's earlier steps on the same loaded method (the KV cache lives in it). On adb+tcp:// the
device is tests/doubles/adbd.py (the real ADB protocol; pushed aarch64 ELFs run under qemu-aarch64): the
only double is the phone. The bundles are tests/test_llm_debug.py's fixture: the tiny llama3 built by
export_llama with its ETRecord, and a copy with `layers.1.feed_forward.w2` negated in the lowered program.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_debug_android import WORKSPACE, arm64, debug_runner  # noqa: F401 - fixtures
from tests.test_llm_debug import llm_bundles  # noqa: F401 - the shared fixture

QEMU_URL = "qemu-user://aarch64"
LAYER = "layers.1.feed_forward.w2"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=1800)


@pytest.mark.slow
def test_qemu_user_debug_of_a_decode_step_names_the_planted_layer(llm_bundles, debug_runner):  # noqa: F811
    work = llm_bundles
    done = _cli("debug", "broken.bpte", "--target", QEMU_URL, "--case", "3", "--report", "dbg-qemu", cwd=work)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    body = json.loads((work / "dbg-qemu" / "report.json").read_text())["debug"]
    assert body["first_bad_layer"]["module"] == LAYER
    assert LAYER in done.stdout
    assert any("replayed 3 earlier step(s) of the sequence (cases 0, 1, 2)" in n for n in body["notes"])
    assert any(f"debug runner {debug_runner}" in n for n in body["notes"])
    log = (work / "dbg-qemu" / "work" / "qemu-user" / "forward-3" / "runner.log").read_text()
    assert "Ran 3 prefix test case(s) on the loaded method." in log and "Using method forward, test case 3" in log


@pytest.mark.slow
def test_qemu_user_debug_of_a_healthy_decode_step_finds_nothing(llm_bundles, debug_runner):  # noqa: F811
    """Both sides replay the prefix: every layer of step 3 agrees (a fresh cache on one side would not)."""
    done = _cli("debug", "tiny.bpte", "--target", QEMU_URL, "--case", "3", cwd=llm_bundles)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "no layer exceeds" in done.stdout


@pytest.mark.slow
def test_adb_debug_of_a_decode_step_names_the_planted_layer(llm_bundles, debug_runner, arm64, tmp_path):  # noqa: F811
    from bundlerun.runner.debug.localize import debug_bundle

    result = debug_bundle(llm_bundles / "broken.bpte", f"adb+tcp://127.0.0.1:{arm64.port}", case=3,
                          work_dir=tmp_path / "w", target_config={"workspace": WORKSPACE})
    assert result.first_bad_row is not None and result.first_bad_row.module == LAYER
    runs = [c for c in arm64.stats.shell_commands if "debug_runner --model_path" in c]
    assert len(runs) == 1 and "--testset_idx 3" in runs[0] and "--prefix_testset_idx 0,1,2" in runs[0]
    assert any("replayed 3 earlier step(s)" in n for n in result.notes)


def test_the_debug_runner_command_line_carries_the_prefix():
    from bundlerun.targets.android.intermediates import debug_runner_args

    args = debug_runner_args("forward", 3, 1 << 20, prefix=(0, 1, 2))
    assert args[args.index("--testset_idx") + 1] == "3"
    assert args[args.index("--prefix_testset_idx") + 1] == "0,1,2"
    assert "--prefix_testset_idx" not in debug_runner_args("forward", 0, 1 << 20)


def test_a_debug_runner_without_the_prefix_flag_is_refused_in_one_line(tmp_path):
    """A cached debug runner built before --prefix_testset_idx existed (its runner.json lists its flags)."""
    from bundlerun.targets.android.intermediates import _check_prefix_support
    from bundlerun.targets.intermediates import IntermediatesFailed

    (tmp_path / "runner.json").write_text(json.dumps({"kind": "debug_runner", "binary": str(tmp_path / "debug_runner"),
                                                      "cli": {"flags": ["--model_path", "--testset_idx"]}}))
    with pytest.raises(IntermediatesFailed) as info:
        _check_prefix_support(QEMU_URL, tmp_path / "debug_runner", (0, 1))
    assert "\n" not in str(info.value) and "--prefix_testset_idx" in str(info.value)
    _check_prefix_support(QEMU_URL, tmp_path / "debug_runner", ())  # no prefix: any debug runner will do


def test_qnn_profile_refuses_a_prefix(tmp_path):
    """qnn_executor_runner runs one inference per process: a decode step would run on a fresh cache."""
    from bundlerun.targets.android.intermediates import _capture_adb
    from bundlerun.targets.intermediates import IntermediatesFailed

    with pytest.raises(IntermediatesFailed, match="fresh KV cache"):
        _capture_adb("adb+tcp://127.0.0.1:1", {"profile": "qnn-executor-runner"}, None, tmp_path / "x.bpte",
                     "forward", 3, tmp_path, 60.0, 64, prefix=(0, 1, 2))


@pytest.mark.slow
def test_qemu_user_run_then_debug_localizes_the_fault_at_the_first_step_it_touches(llm_bundles, debug_runner):  # noqa: F811
    """`run` on the real aarch64 runner records the planted fault's first diverging step (in step order:
    seq0's prompt, case 0, where the negated weight is first used); `debug` without --case takes that
    step from the history and names the layer on the same runner."""
    work = llm_bundles
    ran = _cli("run", "broken.bpte", "--target", QEMU_URL, "--history", "hq.db", "--report", "run-qemu", cwd=work)
    assert ran.returncode == 1, ran.stdout[-2000:] + ran.stderr[-2000:]
    seq0 = json.loads((work / "run-qemu" / "report.json").read_text())["sequences"][0]
    assert seq0["first_divergence"] == 0
    done = _cli("debug", "broken.bpte", "--target", QEMU_URL, "--history", "hq.db", "--json", cwd=work)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    body = json.loads(done.stdout)
    assert body["case"] == 0 and "first diverging step" in body["case_source"]
    assert body["first_bad_layer"]["module"] == LAYER
