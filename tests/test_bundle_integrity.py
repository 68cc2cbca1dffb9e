"""Integrity and strict validation of bundles: a tampered or broken bundle is a one-line
BundleError for every reader (exit 2), never a PASS, a SKIP or an internal error."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest

from bundlerun.bundles.bpte import (TRAILING_SLACK, BundledValue, load_bundle, parse_bundle, read_bundle,
                                    serialize_bundle, write_bundle)
from bundlerun.bundles.errors import BundleError, BundleFormatError, IntegrityError, ManifestError
from bundlerun.bundles.integrity import UNSEALED_WARNING, case_digest, seal
from bundlerun.bundles.manifest import Manifest


@pytest.fixture(scope="module")
def mlp(bundle_cache):
    """A real sealed mlp bundle (built once per session by the real toolchain)."""
    return read_bundle(bundle_cache("mlp", cases=2))


def _tampered(bundle, reseal: bool = False) -> bytes:
    """Bytes of `bundle` as an outside tool would write them (no re-seal), or re-sealed."""
    return serialize_bundle(seal(bundle) if reseal else bundle)


def _criteria(bundle) -> dict:
    return bundle.manifest_json["methods"]["forward"]["outputs"][0]["criteria"]


def test_built_bundle_is_sealed_and_reads_without_warning(mlp, bundle_cache):
    integrity = mlp.manifest_json["integrity"]
    assert integrity["program"] == hashlib.sha256(mlp.program).hexdigest()
    assert integrity["cases"]["forward"] == [case_digest(c) for c in mlp.suite("forward").test_cases]
    assert mlp.warnings == []
    assert mlp.manifest.integrity == integrity


def test_program_spliced_from_another_build_is_refused(mlp, bundle_cache):
    other = read_bundle(bundle_cache("mlp", dtype="int8", cases=2))
    assert other.program != mlp.program
    with pytest.raises(IntegrityError, match="program was changed after the bundle was built"):
        load_bundle(_tampered(replace(mlp, program=other.program)), "spliced.bpte")


def test_edited_expected_output_is_refused(mlp):
    bundle = copy.deepcopy(mlp)
    value = bundle.suite("forward").test_cases[1].expected_outputs[0]
    arr = value.to_array().copy()
    arr[0, 3] += 0.25
    value.data = arr.tobytes()
    with pytest.raises(IntegrityError, match=r"method 'forward' case 1 .* changed"):
        load_bundle(_tampered(bundle), "edited.bpte")


@pytest.mark.parametrize("reseal", [False, True])
def test_scalar_in_place_of_expected_tensor_is_a_named_bundle_error(mlp, reseal):
    bundle = copy.deepcopy(mlp)
    bundle.suite("forward").test_cases[1].expected_outputs[0] = BundledValue(kind="int", scalar=7)
    with pytest.raises(BundleError, match=r"case 1: expected output 0 is an int \(7\), but the program returns "
                                          r"a float32\[1, 10\] tensor"):
        load_bundle(_tampered(bundle, reseal), "scalar.bpte")


def test_scalar_expected_output_is_caught_without_a_manifest_too(mlp):
    """A stock-made bundle has no manifest: the program's own output declaration is the reference."""
    bundle = replace(copy.deepcopy(mlp), manifest_json=None)
    assert load_bundle(serialize_bundle(bundle)).manifest is None
    bundle.suite("forward").test_cases[0].expected_outputs[0] = BundledValue(kind="double", scalar=0.5)
    with pytest.raises(BundleError, match="expected output 0 is a double"):
        load_bundle(serialize_bundle(bundle), "stock.bpte")


def test_missing_expected_output_and_missing_cases(mlp):
    bundle = copy.deepcopy(mlp)
    bundle.suite("forward").test_cases[0].expected_outputs = []
    with pytest.raises(BundleError, match="has 0 expected outputs, the program returns 1"):
        load_bundle(_tampered(bundle, reseal=True))
    empty = replace(copy.deepcopy(mlp), method_test_suites=[])
    with pytest.raises(BundleError, match="no test cases"):
        load_bundle(_tampered(empty, reseal=True))


def test_wrong_shape_expected_output(mlp):
    bundle = copy.deepcopy(mlp)
    value = bundle.suite("forward").test_cases[0].expected_outputs[0]
    value.sizes, value.data, value.dim_order = [1, 5], value.data[:20], [0, 1]
    with pytest.raises(BundleError, match=r"float32\[1, 5\] tensor, but the program returns a float32\[1, 10\]"):
        load_bundle(_tampered(bundle, reseal=True))


@pytest.mark.parametrize("key, value, message", [
    ("atol", float("nan"), "atol: nan is not a finite number"),
    ("rtol", float("inf"), "rtol: inf is not a finite number"),
    ("atol", -0.001, "atol: -0.001 must be >= 0"),
    ("atol", "0.5", "atol: expected a finite number, got a string '0.5'"),
    ("atol", [0.5], "atol: expected a finite number, got a list"),
    ("atol", True, "atol: expected a finite number, got a boolean"),
    ("cosine_min", 1.5, "cosine_min: 1.5 must be <= 1"),
    ("scale", 0.0, "scale: 0.0 must be > 0"),
    ("exact", "yes", "exact: expected a boolean"),
    ("atoll", 0.1, "unknown key 'atoll' \\(did you mean 'atol'\\?\\)"),
    ("trail", [], "trail: expected an object, got a list"),
])
def test_bad_criteria_are_rejected_even_when_resealed(mlp, key, value, message):
    bundle = copy.deepcopy(mlp)
    _criteria(bundle)[key] = value
    with pytest.raises(ManifestError, match=message) as err:
        load_bundle(_tampered(bundle, reseal=True), "bad.bpte")
    assert "\n" not in str(err.value) and str(err.value).startswith("bad.bpte: invalid bundlerun manifest: ")
    assert "methods.forward.outputs[0].criteria" in str(err.value)


def test_output_with_no_criterion_is_an_error(mlp):
    bundle = copy.deepcopy(mlp)
    crit = _criteria(bundle)
    for key in ("atol", "rtol", "qtol", "sqnr_min_db", "cosine_min", "rel_frobenius_max"):
        crit[key] = None
    crit["exact"] = False
    with pytest.raises(ManifestError, match="no criterion is set"):
        load_bundle(_tampered(bundle, reseal=True))
    crit["exact"] = True  # exact alone is a criterion
    assert load_bundle(_tampered(bundle, reseal=True)).manifest_json["methods"]["forward"]["outputs"][0]["criteria"]["exact"]


def test_loosened_criterion_without_reseal_is_detected(mlp):
    bundle = copy.deepcopy(mlp)
    _criteria(bundle)["atol"] = 1.0
    with pytest.raises(IntegrityError, match="manifest .* was changed"):
        load_bundle(_tampered(bundle), "loose.bpte")


@pytest.mark.parametrize("mutate, message", [
    (lambda m: m["model"].update(id="x" * 200_000), "model.id: string of 200000 characters"),
    (lambda m: m.update(extra={"a": json.loads("[" * 40 + "]" * 40)}), "nested deeper than 32 levels"),
    (lambda m: m.update(schema="bundlerun.manifest/9"), "not supported"),
    (lambda m: m.update(schemaa=1), "unknown key 'schemaa' \\(did you mean 'schema'\\?\\)"),
    (lambda m: m["build"].update(seeed=1), "build: unknown key 'seeed' \\(did you mean 'seed'\\?\\)"),
    (lambda m: m.update(methods=[]), "methods: expected an object"),
    (lambda m: m["methods"]["forward"].update(outputs={}), "outputs: expected a list"),
    (lambda m: m["methods"]["forward"]["outputs"][0].update(dtype="float33"), "did you mean 'float32'"),
    (lambda m: m["methods"]["forward"]["outputs"][0].update(shape=[1, -10]), r"shape\[1\]: -10 is outside"),
    (lambda m: m.update(model="mlp"), "model: expected an object, got a string 'mlp'"),
    (lambda m: m["dataset"] if False else m.update(dataset={"labels": ["cat"]}), r"labels\[0\]: expected an integer"),
    (lambda m: m["integrity"].update(program="00"), "integrity.program: expected a lowercase hex sha256"),
])
def test_malformed_manifests_give_one_line_errors(mlp, mutate, message):
    bundle = copy.deepcopy(mlp)
    mutate(bundle.manifest_json)
    with pytest.raises(ManifestError, match=message) as err:
        load_bundle(_tampered(bundle, reseal="integrity" not in message), "m.bpte")
    assert "\n" not in str(err.value) and len(str(err.value)) < 600


def test_raw_manifest_json_problems(mlp):
    from bundlerun.bundles.bpte import _decode_manifest

    with pytest.raises(ManifestError, match="duplicate key 'atol'"):
        _decode_manifest('{"atol": 1, "atol": 2}', "d.bpte")
    with pytest.raises(ManifestError, match="nested deeper than 32"):
        _decode_manifest("[" * 100_000 + "]" * 100_000, "deep.bpte")
    with pytest.raises(ManifestError, match="not valid JSON"):
        _decode_manifest('{"a": ', "j.bpte")
    with pytest.raises(ManifestError, match="expected a JSON object"):
        _decode_manifest("[1]", "l.bpte")
    assert _decode_manifest('{"s": "[[[[{{{{"}', "s.bpte") == {"s": "[[[[{{{{"}  # brackets in strings


def test_unsealed_old_bundle_reads_with_warning(mlp):
    bundle = copy.deepcopy(mlp)
    del bundle.manifest_json["integrity"]
    again = load_bundle(serialize_bundle(bundle), "old.bpte")
    assert again.warnings == [f"old.bpte: {UNSEALED_WARNING}"]
    # ...and is still strictly validated
    _criteria(bundle)["rtol"] = float("nan")
    with pytest.raises(ManifestError, match="rtol: nan"):
        load_bundle(serialize_bundle(bundle))


def test_judge_and_from_dict_refuse_an_invalid_manifest(mlp):
    """The judge no longer falls back to default tolerances for a manifest it cannot read."""
    from bundlerun.runner.judging.judge import load_context

    bundle = copy.deepcopy(mlp)
    _criteria(bundle)["atol"] = float("nan")
    with pytest.raises(ManifestError, match="atol: nan"):
        load_context(bundle)
    with pytest.raises(ManifestError):
        Manifest.from_dict({"schema": "bundlerun.manifest/1", "model": {"id": "m"}, "methods": {}})


def test_trailing_bytes(mlp):
    data = serialize_bundle(mlp)
    assert load_bundle(data + b"\0" * 7).program == mlp.program  # alignment-sized zero padding
    with pytest.raises(BundleFormatError, match="bytes follow the end of the bundle data") as info:
        load_bundle(data + b"\0" * 100)
    # the 100 appended bytes plus whatever alignment padding the writer left after the last field read
    counted = int(re.search(r"(\d+) bytes follow", str(info.value)).group(1))
    assert 100 <= counted < 100 + TRAILING_SLACK
    with pytest.raises(BundleFormatError, match="follow the end"):
        load_bundle(data + b"#!/bin/sh")


def test_dim_order_rules(mlp):
    bundle = copy.deepcopy(mlp)
    value = bundle.suite("forward").test_cases[0].expected_outputs[0]
    value.dim_order = [1, 0]
    with pytest.raises(BundleFormatError, match=r"non-contiguous dim_order \[1, 0\]"):
        parse_bundle(serialize_bundle(bundle))
    value.dim_order = [0, 0]
    with pytest.raises(BundleFormatError, match="not a permutation"):
        parse_bundle(serialize_bundle(bundle))
    value.dim_order = []  # absent means contiguous, as old ExecuTorch writers left it
    assert load_bundle(serialize_bundle(bundle)).suite("forward").test_cases[0].expected_outputs[0].dim_order == [0, 1]


def test_unsupported_schema_version(mlp):
    with pytest.raises(BundleFormatError, match="schema version 3 is not supported"):
        parse_bundle(serialize_bundle(replace(mlp, version=3)))


def test_single_case_bundles_stay_valid(mlp):
    single = load_bundle(serialize_bundle(mlp.single_case("forward", 1)))
    assert single.warnings == [] and len(single.suite("forward").test_cases) == 1
    assert single.manifest_json["integrity"]["program"] == mlp.manifest_json["integrity"]["program"]


def test_write_bundle_reseals_edits_made_through_the_api(mlp, tmp_path):
    bundle = copy.deepcopy(mlp)
    _criteria(bundle)["atol"] = 0.5
    back = read_bundle(write_bundle(bundle, tmp_path / "edited.bpte"))
    assert _criteria(back)["atol"] == 0.5 and back.warnings == []
    assert back.manifest_json["integrity"]["manifest"] != mlp.manifest_json["integrity"]["manifest"]


def test_criteria_of_a_valid_bundle_are_finite(mlp):
    crit = mlp.manifest.methods["forward"].outputs[0].criteria
    assert crit.has_any
    assert all(math.isfinite(getattr(crit, k)) for k in ("atol", "rtol") if getattr(crit, k) is not None)


def test_cli_refuses_tampered_bundles_with_one_line(cli, mlp, tmp_path):
    bundle = copy.deepcopy(mlp)
    bundle.suite("forward").test_cases[1].expected_outputs[0] = BundledValue(kind="int", scalar=7)
    scalar = tmp_path / "scalar.bpte"
    scalar.write_bytes(_tampered(bundle))
    nan = copy.deepcopy(mlp)
    _criteria(nan)["atol"] = float("nan")
    nan_path = tmp_path / "nan.bpte"
    nan_path.write_bytes(_tampered(nan, reseal=True))
    for path, needle in ((scalar, "expected output 0 is an int"), (nan_path, "atol: nan")):
        for args in (("inspect", str(path)), ("run", str(path), "--report", str(tmp_path / "r"), "--no-history")):
            r = cli(*args)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert needle in r.stderr and "Traceback" not in r.stderr + r.stdout, r.stderr
            assert len([line for line in r.stderr.splitlines() if needle in line]) == 1
    assert not (tmp_path / "r" / "report.json").exists()  # refused before anything ran


def test_hash_covers_every_field_of_a_value():
    base = BundledValue.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))
    from bundlerun.bundles.bpte import BundledTestCase

    def digest(v):
        return case_digest(BundledTestCase([base], [v]))

    ref = digest(base)
    variants = [replace(base, scalar_type=3), replace(base, sizes=[3, 2]), replace(base, data=base.data[::-1]),
                replace(base, dim_order=[1, 0]), BundledValue(kind="int", scalar=1), BundledValue(kind="bool", scalar=True)]
    digests = {digest(v) for v in variants}
    assert ref not in digests and len(digests) == len(variants)
    assert digest(replace(base, dim_order=[])) == ref  # absent dim order == contiguous
    assert case_digest(BundledTestCase([base], [])) != case_digest(BundledTestCase([], [base]))
