"""How the `bundlerun` process ends (runner/cli.py `end_process`): once the command is done, the
atexit handlers and a flush of stdout/stderr, then the process ends without the interpreter's
teardown; the exit status is SystemExit's. Real processes: the console script and the entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bundlerun.runner.report.check import check_report

ROOT = Path(__file__).resolve().parents[1]
BUNDLERUN = Path(sys.executable).with_name("bundlerun")  # the console script pip installed

END = r'''
import atexit, sys, threading, time
from bundlerun.runner.cli import end_process
class Loud:
    def __del__(self):
        sys.stdout.write("TEARDOWN\n")  # the interpreter's teardown frees this object: it says so
keep = Loud()
atexit.register(lambda: sys.stdout.write("ATEXIT\n"))
if sys.argv[2] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), sys.stdout.write("THREAD\n"))).start()
sys.stdout.write("BUFFERED ")  # piped stdout is block-buffered: still in the buffer here
code = sys.argv[1]
end_process(None if code == "None" else int(code) if code.lstrip("-").isdigit() else code)
'''


@pytest.mark.parametrize("code,status,err", [("3", 3, ""), ("None", 0, ""), ("boom", 1, "boom\n"), ("-1", 255, "")])
def test_end_process_runs_atexit_flushes_and_skips_the_teardown(code, status, err):
    r = subprocess.run([sys.executable, "-c", END, code, "-"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (status, "BUFFERED ATEXIT\n", err)


def test_end_process_leaves_a_live_thread_to_the_interpreters_exit():
    r = subprocess.run([sys.executable, "-c", END, "3", "thread"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and r.stdout == "BUFFERED THREAD\nATEXIT\nTEARDOWN\n"


def _echo_run(bundle: Path, report: Path, *extra: str, argv0: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "BUNDLERUN_TARGETS": "tests.fixtures.echo_target", "PYTHONPATH": str(ROOT)}
    return subprocess.run([*argv0, "run", str(bundle), "--no-history", "--report", str(report), *extra],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("argv0", [[str(BUNDLERUN)], [sys.executable, "-m", "bundlerun.runner.cli"]],
                         ids=["console-script", "python-m"])
def test_a_run_ends_with_its_verdicts_exit_code_and_every_file_whole(argv0, bundle_cache, tmp_path):
    bundle = bundle_cache("mlp", backend="portable", cases=2, target="host://portable")
    passed = _echo_run(bundle, tmp_path / "pass", "--target", "echo://here", "--json", argv0=argv0)
    assert passed.returncode == 0, passed.stderr
    assert json.loads(passed.stdout)["summary"]["verdict"] == "PASS"  # stdout complete: it parses
    failed = _echo_run(bundle, tmp_path / "fail", "--target", "echo://here?scale=2", argv0=argv0)
    assert failed.returncode == 1 and "FAIL" in failed.stdout, failed.stderr
    for name in ("pass", "fail"):
        data = json.loads((tmp_path / name / "report.json").read_text())
        check_report(data)  # written whole, as every reader checks it
        assert set(data["files"]) >= {"html", "junit", "markdown", "json"}
        assert all(Path(f).is_file() for f in data["files"].values())
    bad = _echo_run(tmp_path / "absent.bpte", tmp_path / "bad", "--target", "echo://here", argv0=argv0)
    assert bad.returncode == 2 and "no such file" in bad.stderr
