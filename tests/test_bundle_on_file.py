"""`bundlerun run` keeps the bundle's bytes in its file (bundles/on_file.py, issue 36 item 6): the
CLI reads and verifies the bundle once, then holds its structure and spans of the file, each read back
and checked against the bytes that were verified. It reads as `read_bundle` reads; a file edited or
replaced after the check is refused where it is read, so a tampered bundle never passes. Real bundles
(the build cache's), the real runtime (host://portable) for the run; no test doubles."""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from conftest import run_cli
import report_samples as rs

from bundlerun.bundles.bpte import read_bundle
from bundlerun.bundles.errors import BundleFormatError, IntegrityError
from bundlerun.bundles.integrity import inputs_digest, program_sha256
from bundlerun.bundles.on_file import FileBundle, FileValue, read_bundle_on_file


def _values(bundle):
    return [v for s in bundle.method_test_suites for c in s.test_cases for v in (*c.inputs, *c.expected_outputs)]


@pytest.fixture
def mlp(bundle_cache, tmp_path) -> Path:
    """A private copy of a cached bundle (the tests edit it)."""
    src = bundle_cache("mlp", backend="portable", cases=4, target="host://portable")
    path = tmp_path / "mlp.bpte"
    path.write_bytes(src.read_bytes())
    return path


def test_reads_as_read_bundle_and_holds_no_bytes(mlp):
    lean, full = read_bundle_on_file(mlp), read_bundle(mlp)
    assert isinstance(lean, FileBundle) and lean.__dict__["_program"] is None  # not read until asked
    assert lean.manifest_json == full.manifest_json and lean.warnings == full.warnings
    assert [(s.method_name, len(s.test_cases)) for s in lean.method_test_suites] == \
        [(s.method_name, len(s.test_cases)) for s in full.method_test_suites]
    values, copied = _values(lean), _values(full)
    assert len(values) == 8 and all(isinstance(v, FileValue) and v._data == b"" for v in values)
    assert [(v.kind, v.scalar_type, v.sizes, v.nbytes, v.data) for v in values] == \
        [(v.kind, v.scalar_type, v.sizes, len(v.data), v.data) for v in copied]
    # what a report names the bundle by: the same, without reading the program or the inputs again
    assert program_sha256(None, lean) == program_sha256(None, full) and inputs_digest(lean) == inputs_digest(full)
    assert lean.__dict__["_program"] is None
    assert lean.program == full.program and lean.__dict__["_program"] is not None  # a lane that sends it: read once


def test_what_the_cli_keeps_is_not_the_bundle(tmp_path):
    """The bytes a read keeps alive: the structure, not the program or the cases' data (a bundle of
    16 cases of 256 KiB expected outputs, report_samples' stub program)."""
    path = rs.write_stub_bundle(rs.make_bundle(cases=16, shape=(1, 256, 256)), tmp_path / "big.bpte")
    read_bundle_on_file(path)  # imports done before counting
    gc.collect()
    tracemalloc.start()
    try:
        lean = read_bundle_on_file(path)
        gc.collect()
        lean_kept = tracemalloc.get_traced_memory()[0]
        del lean
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        full = read_bundle(path)
        gc.collect()
        full_kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    data = len(full.program) + sum(len(v.data) for v in _values(full))
    print(f"\nfile {path.stat().st_size:,} B (program + tensors {data:,} B); kept: read_bundle {full_kept:,} B, "
          f"on file {lean_kept:,} B")
    assert full_kept >= data  # the copy holds every byte
    assert lean_kept < data / 20, (lean_kept, data)


@pytest.mark.parametrize("where", ["expected output", "input", "program"])
def test_bytes_edited_after_the_check_are_refused_where_they_are_read(mlp, where):
    lean = read_bundle_on_file(mlp)
    case = lean.suite("forward").test_cases[2]
    span = {"expected output": case.expected_outputs[0], "input": case.inputs[0]}.get(where)
    offset = span._span.offset + 3 if span is not None else lean.__dict__["_program_span"].offset + 100
    raw = bytearray(mlp.read_bytes())
    raw[offset] ^= 0x40
    mlp.write_bytes(bytes(raw))  # same length, one bit: what a check of sizes alone would let through
    with pytest.raises(IntegrityError, match="changed on disk after the bundle was read and verified"):
        _ = span.data if span is not None else lean.program
    if span is not None:
        with pytest.raises(IntegrityError):
            span.to_array()
        assert lean.suite("forward").test_cases[1].expected_outputs[0].to_array() is not None  # the others still read


def test_a_file_replaced_cut_or_removed_is_refused(mlp, tmp_path):
    lean = read_bundle_on_file(mlp)
    value = lean.suite("forward").test_cases[3].expected_outputs[0]
    other = tmp_path / "other.bpte"
    raw = mlp.read_bytes()
    other.write_bytes(raw[: value._span.offset])  # cut before the last case's expected output
    other.replace(mlp)  # renamed over it: the path now names another file
    with pytest.raises(IntegrityError):
        _ = value.data
    mlp.unlink()
    with pytest.raises(BundleFormatError, match="moved or removed"):
        _ = value.data


TAMPER_MID_RUN = r'''
import sys
from pathlib import Path
import bundlerun.bundles.on_file as on_file

read = on_file.read_bundle_on_file

def tampered(path, *args, **kwargs):
    """The CLI's read, then the file edited before the runtime reads it and the judge reads the case."""
    bundle = read(path, *args, **kwargs)
    span = bundle.suite("forward").test_cases[1].expected_outputs[0]._span
    raw = bytearray(Path(path).read_bytes())
    raw[span.offset:span.offset + span.length] = bytes(span.length)  # expected output 1 now all zeros
    Path(path).write_bytes(bytes(raw))
    return bundle

on_file.read_bundle_on_file = tampered
from bundlerun.runner.cli import main
sys.argv[0] = "bundlerun"
main()
'''


def test_a_bundle_edited_during_the_run_is_never_judged(mlp, tmp_path):
    """`bundlerun run` on host://portable with the file edited after the CLI verified it: the run
    stops with the integrity error, no report says PASS."""
    report_dir = tmp_path / "r"
    r = subprocess.run([sys.executable, "-c", TAMPER_MID_RUN, "run", str(mlp), "--target", "host://portable",
                        "--report", str(report_dir), "--no-history", "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode not in (0, 1), r.stdout + r.stderr
    assert "changed on disk after the bundle was read and verified" in r.stderr, r.stderr
    assert not (report_dir / "report.json").exists()
    again = run_cli("run", str(mlp), "--target", "host://portable", "--report", str(tmp_path / "r2"), "--no-history",
                    "--quiet")
    assert again.returncode not in (0, 1) and "case 1" in again.stderr  # read afresh: its sealed case digest differs
