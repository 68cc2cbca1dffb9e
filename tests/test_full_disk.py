"""A full disk keeps the verdict: the report folder (and the history database) on a real tmpfs
too small for them, a real `bundlerun run` on the real runtime (host://portable).

Whatever the disk refuses, the verdict line and its exit code reach the console, every report
file that is missing is named in one line with the reason, history says the disk is full (not
"cannot rollback"), and there is no internal error. Mounting a tmpfs needs root, which the test
machines have: without it the test fails saying so.
"""

from __future__ import annotations

import errno
import os
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
    if not (disk / "r" / "report.json").is_file():  # no command says success when its record was not written
        assert proc.returncode != 0, err[-2000:]
    said_all = proc.stdout + err
    assert "cannot rollback" not in said_all
    history = said_all[said_all.find("history not recorded"):].split("warning:", 1)[0].replace("\n", " ")
    assert "history not recorded" in history and re.search(r"disk is full|no space left", history, re.I), \
        said_all[-3000:]


def _fill(disk: Path) -> None:
    """Every byte of the tmpfs taken: the next write of any command fails with ENOSPC."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _one_line_disk_error(proc, path_part: str) -> str:
    err = proc.stderr
    assert "internal error" not in err and "Traceback" not in err, err[-3000:]
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    lines = [line for line in err.splitlines() if "No space left on device" in line]
    assert lines and any(path_part in line for line in lines), err[-2000:]
    return lines[0]


def test_a_full_disk_under_every_writing_command_is_one_line_naming_the_file(bundle_cache, tiny_disk, tmp_path):
    """build, judge --report, hud, trend, validate and merge on a full disk: exit 2, the file and
    the reason on one line, no command saying it succeeded (merge: exit 2 without its report.json)."""
    bundle = bundle_cache("mlp", backend="portable", cases=3, target="host://portable")
    history = tmp_path / "history.sqlite"
    run = run_cli("run", str(bundle), "--target", "host://portable", "--report", str(tmp_path / "r"),
                  "--save-outputs", "--history", str(history))
    assert run.returncode == 0, run.stderr[-2000:]
    disk = tiny_disk("64k")
    _fill(disk)
    same = ("--backend", "portable", "--cases", "3", "--target", "host://portable")  # bundle_cache's build: cached
    line = _one_line_disk_error(run_cli("build", "mlp", "-o", str(disk / "b" / "m.bpte"), *same), str(disk / "b"))
    assert line.startswith("bundlerun: error: cannot write")
    _one_line_disk_error(run_cli("judge", str(tmp_path / "r"), "--report", str(disk / "j")), str(disk / "j"))
    _one_line_disk_error(run_cli("hud", "--history", str(history), "--out", str(disk / "site")), str(disk / "site"))
    _one_line_disk_error(run_cli("trend", "mlp", "--history", str(history), "-o", str(disk / "t.png")),
                         str(disk / "t.png"))
    merged = run_cli("merge", str(tmp_path / "r"), "--report", str(disk / "m"))
    assert "merged report is not recorded" in _one_line_disk_error(merged, str(disk / "m" / "report.json"))
    assert not (disk / "m" / "report.json").exists()
    validate = run_cli("validate", "mlp", *same, "--report", str(disk / "v"), "--no-history")
    _one_line_disk_error(validate, str(disk / "v"))
