"""Hostile arguments to `bundlerun.api` and to the CLI: the API is the CLI's library, not a second
policy (runner/arguments.py holds the checks both run).

The argument sets are generated from the API functions' own signatures: every parameter gets
every value of HOSTILE while the others keep cheap, valid values whose call stops at a known
later stage (an unreadable bundle, an unknown model). So each call shows whether the argument
was refused up front (a BundlerunError of another kind) or accepted (the later stage's kind),
never anything else: no TypeError, no traceback, no work done with a bad value. The same hostile
options then go through the real CLI entry point in this process, and refused/accepted must
agree. In-process and without a build: a few seconds.
"""

from __future__ import annotations

import inspect
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from security_fuzz import run_main  # noqa: E402

HOSTILE = [None, True, 0, -1, 1.5, math.nan, math.inf, -math.inf, 10**400, "", "x" * 5000, "a\0b", "\ud800",
           "../../x", "\x1b[2J", [], [None], [-1], {}, {"atol": math.nan}, {"x": object()}, object(), b"\xff",
           Path("/nonexistent/a/b")]

# Values each parameter must refuse (beyond a wrong type): the cases the adversarial pass found.
MUST_REFUSE = {
    "timeout": [math.nan, -1, 0, math.inf, "5", 10**400], "setup_timeout": [math.nan, -1, 0],
    "label": [5, "", "\x1b[2J", "x" * 5000], "seed": [-1, 1.5, True, 2**64], "model_id": ["../../x", "a/b", "", ".."],
    "distribution": ["weird(", 5, "uniform(1,0)", "normal(0,nan)"], "tolerances": [{"atol": math.nan}, {"foo": 1}, [1]],
    "overrides": ["out0.atol=1", ["out0.atol=nan"], [5]], "methods": ["forward", [5]], "save_outputs": [1, "yes"],
    "history": [1, None], "require_seal": [1, "no"], "dtype": ["fp64", 5], "backend": ["nosuch", 5],
    "reference": ["nosuch"], "target": ["nosuch://x", "", 5], "output_qparams": [[1], 5],
}
MUST_REFUSE["cases"] = [[-1], "0", [1.5], [10**9], 0, -1, 1.5]


def _calls(tmp_path: Path):
    """(function, baseline kwargs, the kind the baseline call raises)."""
    from bundlerun import api

    garbage = tmp_path / "garbage.bpte"
    garbage.write_bytes(b"not a bundle")
    (tmp_path / "saved").mkdir()
    return [
        (api.run, {"bundle": garbage, "target": "host://portable"}, "bad-bundle"),
        (api.judge, {"report_dir": tmp_path / "saved"}, "bad-report"),
        (api.bundle_program, {"program": b"\0" * 8, "inputs": [(1,)], "backend": "portable"}, "build-failed"),
        (api.build, {"model": "no-such-model-zz", "output": tmp_path / "b.bpte"}, "bad-model"),
        (api.validate, {"model": "no-such-model-zz"}, "bad-model"),
    ]


def _params(fn) -> list[str]:
    from bundlerun import api

    names = [n for n, p in inspect.signature(fn).parameters.items() if p.kind is not p.VAR_KEYWORD]
    if fn is api.validate:  # its **kw: every keyword of run and build it passes on
        names += ["timeout", "setup_timeout", "label", "overrides", "cases", "seed", "distribution", "require_seal",
                  "tolerances", "report_dir", "history"]
    return names


def _outcome(fn, kwargs):
    from bundlerun.bundles.errors import BundlerunError

    try:
        fn(**kwargs)
    except BundlerunError as exc:
        assert "\n" not in str(exc) and str(exc), (fn.__name__, kwargs, str(exc)[:300])
        return exc.kind
    except BaseException as exc:  # noqa: BLE001 - the test fails on it, with what raised
        pytest.fail(f"api.{fn.__name__}({ {k: repr(v)[:40] for k, v in kwargs.items()} }) raised "
                    f"{type(exc).__name__}: {str(exc)[:200]}")
    return "accepted"


def test_every_hostile_api_argument_is_a_bundlerun_error_with_its_kind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BUNDLERUN_HISTORY", str(tmp_path / "h.sqlite"))
    calls = 0
    refused: dict[tuple[str, str], set[str]] = {}
    for fn, base, kind in _calls(tmp_path):
        assert _outcome(fn, base) == kind  # the baseline stops where the test expects
        for name in _params(fn):
            for value in HOSTILE + MUST_REFUSE.get(name, []):
                got = _outcome(fn, {**base, name: value})
                calls += 1
                if got != kind:
                    refused.setdefault((fn.__name__, name), set()).add(repr(value)[:40])
                if any(value is v or (type(value) is type(v) and value == v) for v in MUST_REFUSE.get(name, [])):
                    assert got not in (kind, "accepted"), f"api.{fn.__name__}({name}={value!r:.60}) was accepted"
    assert calls > 700
    # paths are kept inside the folders they name
    assert ("bundle_program", "model_id") in refused and "'../../x'" in refused[("bundle_program", "model_id")]


def test_unsealed_bundle_is_refused_by_the_api_under_ci_as_by_the_cli(tmp_path, monkeypatch):
    """runner/seal.py: $CI makes the seal required for `api.run` / `api.judge` too."""
    from bundlerun import api
    from bundlerun.bundles.errors import BundlerunError
    from bundlerun.runner import seal

    seen = {}
    monkeypatch.setattr("bundlerun.bundles.bpte.read_bundle",
                        lambda path, require_seal=False, **_kw: seen.setdefault("require_seal", require_seal) and
                        (_ for _ in ()).throw(BundlerunError("stop here")))
    bundle = tmp_path / "b.bpte"
    bundle.write_bytes(b"x")
    for ci, want in (("true", True), ("", False)):
        monkeypatch.setenv("CI", ci)
        seen.clear()
        with pytest.raises(BundlerunError):
            api.run(bundle, target="host://portable")
        assert seen["require_seal"] is want and seal.required() is want
    monkeypatch.setenv("CI", "true")
    seen.clear()
    with pytest.raises(BundlerunError):
        api.run(bundle, target="host://portable", require_seal=False)
    assert seen["require_seal"] is False


def _cli(*argv: str) -> tuple[int, str]:
    code, _out, err = run_main(*argv)
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    return code, err


# (API keyword, CLI option, value as text, the value for the API)
SAME_CALLS = [
    ("timeout", "--timeout", "nan", math.nan), ("timeout", "--timeout", "-1", -1.0), ("timeout", "--timeout", "0", 0.0),
    ("timeout", "--timeout", "inf", math.inf), ("timeout", "--timeout", "1e9", 1e9), ("timeout", "--timeout", "30", 30.0),
    ("setup_timeout", "--setup-timeout", "nan", math.nan), ("setup_timeout", "--setup-timeout", "5", 5.0),
    ("label", "--label", "\x1b[2J", "\x1b[2J"), ("label", "--label", "x" * 300, "x" * 300),
    ("label", "--label", "v1.2", "v1.2"),
    ("overrides", "--override", "out0.atol=nan", ["out0.atol=nan"]), ("overrides", "--override", "x", ["x"]),
    ("overrides", "--override", "out0.atol=0.1", ["out0.atol=0.1"]),
    ("target", "--target", "nosuch://x", "nosuch://x"), ("target", "--target", "host://portable", "host://portable"),
]
BUILD_CALLS = [
    ("seed", "--seed", "-1", -1), ("seed", "--seed", "3", 3), ("cases", "--cases", "0", 0), ("cases", "--cases", "2", 2),
    ("distribution", "--distribution", "weird(", "weird("), ("distribution", "--distribution", "uniform(1,0)",
                                                              "uniform(1,0)"),
    ("distribution", "--distribution", "rand", "rand"), ("tolerances", "--tolerance", "atol=nan", {"atol": math.nan}),
    ("tolerances", "--tolerance", "atol=-1", {"atol": -1}), ("tolerances", "--tolerance", "atol=0.1", {"atol": 0.1}),
    ("dtype", "--dtype", "fp64", "fp64"), ("dtype", "--dtype", "fp32", "fp32"),
]


@pytest.mark.parametrize("what", ["run", "build"])
def test_the_cli_and_the_api_refuse_the_same_arguments(tmp_path, monkeypatch, what):
    from bundlerun import api

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BUNDLERUN_HISTORY", "off")
    garbage = tmp_path / "garbage.bpte"
    garbage.write_bytes(b"not a bundle")
    compared = []
    for key, option, text, value in SAME_CALLS if what == "run" else BUILD_CALLS:
        if what == "run":
            code, err = _cli("run", str(garbage), "--target", "host://portable", "--no-history", option, text)
            cli_refused = "not a BundleIO program" not in err
            kind = _outcome(api.run, {"bundle": garbage, "target": "host://portable", key: value})
            api_refused = kind != "bad-bundle"
        else:
            code, err = _cli("build", "no-such-model-zz", "-o", str(tmp_path / "b.bpte"), option, text)
            cli_refused = "unknown model 'no-such-model-zz'" not in err
            kind = _outcome(api.build, {"model": "no-such-model-zz", "output": tmp_path / "b.bpte", key: value})
            api_refused = kind != "bad-model"
        assert code == 2, (option, text, err[-500:])
        assert cli_refused == api_refused, f"{option} {text!r}: CLI refused {cli_refused}, API {kind}: {err[-400:]}"
        if api_refused:
            assert kind == "bad-config", (key, value, kind)
        compared.append(cli_refused)
    assert any(compared) and not all(compared)
