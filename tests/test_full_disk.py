"""A full disk keeps the verdict: the report folder (and the history database) on a real tmpfs
too small for them, a real `bundlerun run` on the real runtime (host://portable).

Whatever the disk refuses, the verdict line and its exit code reach the console, every report
file that is missing is named in one line with the reason, history says the disk is full (not
"cannot rollback"), and there is no internal error. Mounting a tmpfs needs root, which the test
machines have: without it the test fails saying so.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli


@pytest.fixture
def tiny_disk(tmp_path, request):
    def mount(size: str) -> Path:
        where = tmp_path / f"disk-{size}"
        where.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, f"this test mounts a small tmpfs and needs root: {proc.stderr.strip()}"
        request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True))
        return where

    return mount


@pytest.mark.parametrize("size", ["8k", "24k"])
def test_a_full_report_folder_keeps_the_verdict_and_names_what_was_not_written(bundle_cache, tiny_disk, size):
    bundle = bundle_cache("mlp", backend="portable", cases=3, target="host://portable")
    disk = tiny_disk(size)
    proc = run_cli("run", str(bundle), "--target", "host://portable", "--report", str(disk / "r"),
                   "--history", str(disk / "history.sqlite"))
    err = proc.stderr
    assert "internal error" not in err and "Traceback" not in err, err[-3000:]
    said = re.findall(r"^bundlerun: could not write (\S+): (.+) \(the verdict above stands: (\w+), exit code (\d)\)$",
                      err, re.M)
    for name in ("report.json", "junit.xml", "summary.md", "report.html"):
        path = disk / "r" / name
        if not path.is_file():
            assert any(f == str(path) and "No space left" in why for f, why, _v, _c in said), (name, err[-3000:])
    assert said, f"a {size} disk held every report file: the test did not test a full disk\n{err[-2000:]}"
    assert {int(c) for *_, c in said} == {proc.returncode} and proc.returncode in (0, 1, 2)
    said_all = proc.stdout + err
    assert "cannot rollback" not in said_all
    history = said_all[said_all.find("history not recorded"):].split("warning:", 1)[0].replace("\n", " ")
    assert "history not recorded" in history and re.search(r"disk is full|no space left", history, re.I), \
        said_all[-3000:]
