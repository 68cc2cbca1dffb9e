"""One Ctrl-C stops the whole command: a real SIGINT to a real `bundlerun validate a b`
(host://xnnpack, the real runtime). Finished cases keep their verdicts, the report says
interrupted, exit code 130, the second model is never started, nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from proc_helpers import TAG_VAR, new_tag, settled, tagged

ROOT = Path(__file__).resolve().parents[1]


def test_ctrl_c_keeps_finished_cases_and_stops_the_command(tmp_path):
    tag = new_tag()
    env = {**os.environ, "BUNDLERUN_FAULT": "hang@forward:3", "PYTHONPATH": str(ROOT), TAG_VAR: tag}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "validate", "mlp", "tiny-cnn", "--cases", "5",
         "--report", str(tmp_path), "--no-history", "--timeout", "300"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    work = tmp_path / "mlp-fp32" / "work"
    deadline = time.monotonic() + 600
    while not any("hanging before forward:3" in p.read_text(errors="replace") for p in work.glob("host-runtime-*.log")):
        assert proc.poll() is None, proc.communicate()  # cases 0-2 done, case 3 hangs: now press Ctrl-C
        assert time.monotonic() < deadline, "the runtime never reached case 3"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "interrupted" in err
    report = json.loads((tmp_path / "mlp-fp32" / "report.json").read_text())
    assert report["summary"]["interrupted"] is True and report["summary"]["exit_code"] == 130
    verdicts = [c["verdict"] for c in report["cases"]]
    assert verdicts[:3] == ["PASS", "PASS", "PASS"], verdicts
    assert all(c["error_kind"] == "interrupted" for c in report["cases"][3:])
    assert not (tmp_path / "tiny-cnn-fp32").exists()  # the command stopped: the next model was never built
    assert settled(lambda: tagged(tag, b"bundlerun.targets.workers.host")) == []  # this command's workers are gone
