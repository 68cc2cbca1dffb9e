"""`bisect`, `validate`, `build` with options that make the baseline unrunnable and with model
factories that exit, raise a BaseException, hang or are interrupted: exit 2 before any lowering, or
a written ERROR report; never a wrong answer ("fails with nothing delegated", "nothing fails"),
never exit 0, never a traceback. In-process through the real entry point; nothing is lowered.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from security_fuzz import run_main  # noqa: E402

FACTORIES = '''
import sys

class Mine(BaseException):
    pass

def exits():
    sys.exit(0)

def exits_text():
    sys.exit("bye")

def base():
    raise BaseException("boom")

def mine():
    raise Mine("mine")

def interrupted():
    raise KeyboardInterrupt

def hangs():
    import time
    while True:
        try:
            time.sleep(0.05)
        except Exception:  # a factory that swallows errors still ends
            pass
'''


def _cli(*argv: str) -> tuple[int, str]:
    code, _out, err = run_main(*argv)
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    return code, err


@pytest.mark.parametrize("option, value, needle", [
    ("--timeout", "nan", "positive number of seconds"), ("--timeout", "-1", "positive number of seconds"),
    ("--timeout", "0", "positive number of seconds"), ("--timeout", "inf", "positive number of seconds"),
    ("--distribution", "weird(", "unknown input distribution"),
    ("--distribution", "uniform(1,0)", "lo < hi"), ("--distribution", "normal(0,nan)", "finite"),
    ("--case", "8", "--case 8"),  # with the default --cases 8: cases 0-7
    ("--output", "", "--output"), ("--method", "x" * 300, "--method"),
])
def test_a_bad_option_stops_bisect_before_any_lowering(tmp_path, monkeypatch, option, value, needle):
    monkeypatch.chdir(tmp_path)
    code, err = _cli("bisect", "mlp", "--target", "host://portable", "--report", str(tmp_path / "b"), option, value)
    assert code == 2 and needle in err, err[-1000:]
    assert not (tmp_path / "b" / "steps").exists()  # nothing was lowered


@pytest.mark.parametrize("factory, said", [("exits", "SystemExit (it called sys.exit(0))"),
                                           ("exits_text", "sys.exit('bye')"), ("base", "BaseException: boom"),
                                           ("mine", "Mine: mine"), ("hangs", "did not finish within 0.5 s")])
def test_a_factory_that_exits_or_raises_a_base_exception_is_an_error_with_a_report(tmp_path, monkeypatch, factory,
                                                                                   said):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BUNDLERUN_FACTORY_TIMEOUT", "0.5")  # bundles/user_code.py's bound on user code
    (tmp_path / "fac.py").write_text(FACTORIES)
    code, err = _cli("bisect", f"fac.py:{factory}", "--target", "host://portable", "--report", str(tmp_path / "b"))
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert code == 2 and report["outcome"] == "stopped" and report["exit_code"] == 2
    assert any(said in note for note in report["notes"]), report["notes"]
    code, err = _cli("validate", f"fac.py:{factory}", "--target", "host://portable", "--report", str(tmp_path / "v"),
                     "--no-history")
    written = json.loads((tmp_path / "v" / f"fac.{factory}-fp32" / "report.json").read_text())
    assert code == 2 and written["summary"]["verdict"] == "ERROR" and said in " ".join(written["warnings"])
    code, err = _cli("build", f"fac.py:{factory}", "-o", str(tmp_path / "x.bpte"))
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_a_factory_interrupted_stays_an_interrupt(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fac.py").write_text(FACTORIES)
    code, _err = _cli("bisect", "fac.py:interrupted", "--target", "host://portable", "--report", str(tmp_path / "b"))
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert code == 130 and report["interrupted"]
    code, _err = _cli("build", "fac.py:interrupted", "-o", str(tmp_path / "x.bpte"))
    assert code == 130
    assert not Path(tmp_path / "x.bpte").exists()
