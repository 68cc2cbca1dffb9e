"""`bundlerun run` keeps the bundle's bytes in its file (bundles/on_file.py, issue 36 item 6): the
CLI reads and verifies the bundle once, then holds its structure and spans of the file, each read back
and checked against the bytes that were verified. It reads as `read_bundle` reads; a file edited or
replaced after the check is refused where it is read, so a tampered bundle never passes. Real bundles
(the build cache's), the real runtime (host://portable) for the run; no test doubles."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
import report_samples as rs

from bundlerun.bundles.bpte import read_bundle, serialize_bundle
from bundlerun.bundles.errors import BundleFormatError, IntegrityError
from bundlerun.bundles.integrity import inputs_digest, program_sha256
from bundlerun.bundles.on_file import FileBundle, FileValue, read_bundle_on_file, whole_bundle_bytes


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


def test_reading_a_bundle_and_opening_a_served_lane_import_no_numpy(mlp):
    # what `bundlerun run` does before it spawns a served lane's runtime (runner/session.py Judging): numpy
    # (36 ms) and the judging modules come after, while the runtime loads; the bytes and spans read are the
    # same as read_bundle's (the test above), the value spans found with ctypes over a writable buffer
    code = (
        "import sys\n"
        "from bundlerun.bundles.on_file import read_bundle_on_file\n"
        "import bundlerun.runner.session, bundlerun.targets.qemu_user, bundlerun.runner.cli\n"
        f"b = read_bundle_on_file({str(mlp)!r})\n"
        "spans = [v._span.offset for s in b.method_test_suites for c in s.test_cases for v in c.inputs]\n"
        "print('HEAVY', [m for m in ('numpy', 'flatbuffers', 'bundlerun.runner.judging.judge') if m in sys.modules])\n"
        "print('SPANS', spans)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    data, lean = mlp.read_bytes(), read_bundle_on_file(mlp)
    spans = [v._span for s in lean.method_test_suites for c in s.test_cases for v in c.inputs]
    assert f"SPANS {[sp.offset for sp in spans]}" in out.stdout
    full = read_bundle(mlp)
    assert [data[sp.offset:sp.offset + sp.length] for sp in spans] == \
        [bytes(v.data) for s in full.method_test_suites for c in s.test_cases for v in c.inputs]


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
import os, sys
from pathlib import Path
import bundlerun.bundles.on_file as on_file

read = on_file.read_bundle_on_file

def tampered(path, *args, **kwargs):
    """The CLI's read, then the file edited before the runtime reads it and the judge reads the case
    (an expected output's bytes; or, TAMPER=gap, one byte outside every span)."""
    bundle = read(path, *args, **kwargs)
    span = bundle.suite("forward").test_cases[1].expected_outputs[0]._span
    raw = bytearray(Path(path).read_bytes())
    if os.environ.get("TAMPER") == "gap":  # the last byte outside every span: only the gaps' digest sees it
        covered = {i for s in bundle.layout.spans for i in range(s.offset, s.offset + s.length)}
        raw[max(set(range(len(raw))) - covered)] ^= 0x01
    else:
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


def test_a_served_runner_gets_the_file_as_verified(mlp):
    """A served runner (et_runner/server.py) loads the whole bundle: it gets the file's own bytes,
    checked again span by span and gap by gap, not a FlatBuffers rebuild; the same bytes here,
    because bundlerun writes bundles canonically."""
    lean = read_bundle_on_file(mlp)
    assert lean.file_bytes() == mlp.read_bytes() == serialize_bundle(lean)
    assert whole_bundle_bytes(lean) == mlp.read_bytes()


@pytest.mark.parametrize("edit", ["expected output data", "a case dropped", "the program", "the manifest object",
                                  "the manifest in place"])
def test_a_bundle_changed_in_memory_is_serialized_not_sent_as_its_file(mlp, edit):
    """What the runner loads is the bundle in memory: an edit to it means its file no longer is."""
    lean = read_bundle_on_file(mlp)
    suite = lean.suite("forward")
    if edit == "expected output data":
        suite.test_cases[1].expected_outputs[0].data = bytes(suite.test_cases[1].expected_outputs[0].nbytes)
    elif edit == "a case dropped":
        suite.test_cases.pop()
    elif edit == "the program":
        lean.program = lean.program[:-4] + b"\0\0\0\0"
    elif edit == "the manifest object":
        lean.manifest_json = dict(lean.manifest_json, note="changed")
    else:
        lean.manifest_json["note"] = "changed"
    assert lean.file_bytes() is None
    sent = whole_bundle_bytes(lean)
    assert sent == serialize_bundle(lean) and sent != mlp.read_bytes()


def _gap_offset(lean) -> int:
    """A byte no span covers (the FlatBuffers structure or the manifest)."""
    covered = set()
    for s in lean.layout.spans:
        covered.update(range(s.offset, s.offset + s.length))
    return next(i for i in range(lean.layout.size - 1, -1, -1) if i not in covered)


@pytest.mark.parametrize("change", ["a gap byte", "a span byte", "a byte appended", "the last byte cut"])
def test_a_file_changed_before_a_served_runner_reads_it_is_refused(mlp, change):
    lean = read_bundle_on_file(mlp)
    raw = bytearray(mlp.read_bytes())
    if change == "a gap byte":
        raw[_gap_offset(lean)] ^= 0x01
    elif change == "a span byte":
        raw[lean.suite("forward").test_cases[0].expected_outputs[0]._span.offset] ^= 0x01
    elif change == "a byte appended":
        raw += b"\0"
    else:
        del raw[-1]
    mlp.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="changed on disk after it was read and verified"):
        whole_bundle_bytes(lean)


def test_fuzz_no_changed_byte_reaches_a_served_runner(mlp):
    """Fuzz (seeded): one byte of the file changed anywhere after the read is refused; every byte of
    the file is in a span (its own digest) or a gap (the gaps' digest)."""
    lean = read_bundle_on_file(mlp)
    raw = mlp.read_bytes()
    rng = np.random.default_rng(35)
    for offset in rng.integers(0, len(raw), 200):
        bad = bytearray(raw)
        bad[offset] ^= int(rng.integers(1, 256))
        mlp.write_bytes(bytes(bad))
        with pytest.raises(IntegrityError):
            whole_bundle_bytes(lean)
    mlp.write_bytes(raw)
    assert whole_bundle_bytes(lean) == raw


@pytest.mark.parametrize("tamper", ["span", "gap"])
def test_a_bundle_edited_before_a_served_runner_loads_it_is_never_judged(mlp, tmp_path, tamper):
    """`bundlerun run --select` on qemu-user://aarch64 (ExecuTorch's real aarch64 executor_runner under
    qemu-aarch64, served: it loads the whole bundle from the report folder; --select: the CLI reads the
    bundle first, so the runner starts after it) with the file edited after the CLI verified it: no runner
    is given the edited bytes, the run stops with the integrity error."""
    from tests.doubles.android_env import real_executor_runner

    real_executor_runner("aarch64")  # fails with the build command when it is not built
    report_dir = tmp_path / "r"
    r = subprocess.run([sys.executable, "-c", TAMPER_MID_RUN, "run", str(mlp), "--target", "qemu-user://aarch64",
                        "--report", str(report_dir), "--no-history", "--quiet", "--select", "0-3"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "TAMPER": tamper})
    assert r.returncode == 2, r.stdout + r.stderr
    report = json.loads((report_dir / "report.json").read_text())
    assert report["summary"]["verdict"] == "ERROR" and report["summary"]["counts"]["ERROR"] == 4
    assert all(c["error_kind"] == "bad-bundle" and "changed on disk after it was read and verified" in c["error"]
               for c in report["cases"]), report["cases"]
    assert not list(report_dir.rglob("model.bpte"))  # nothing was written for a runner to load


@pytest.mark.parametrize("tamper", ["span", "gap"])
def test_a_bundle_edited_after_its_early_started_runner_loaded_it_is_never_judged_edited(mlp, tmp_path, tamper):
    """`bundlerun run` on qemu-user://aarch64 with its early start (runner/session.py read_for_run): the
    runner was given the bytes the host read and then verified, before the file was edited. It never sees
    the edit; a case the judge reads afresh from the edited file (an expected output: span) stops the run
    with the integrity error, as on every lane (the host://portable test above); an edit outside every
    span (gap) touches nothing the run uses: judged on the bytes verified."""
    from tests.doubles.android_env import real_executor_runner

    real_executor_runner("aarch64")  # fails with the build command when it is not built
    original = mlp.read_bytes()
    report_dir = tmp_path / "r"
    r = subprocess.run([sys.executable, "-c", TAMPER_MID_RUN, "run", str(mlp), "--target", "qemu-user://aarch64",
                        "--report", str(report_dir), "--no-history", "--quiet"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "TAMPER": tamper})
    assert mlp.read_bytes() != original  # the edit was made
    runner_got = report_dir / "work" / "qemu-user" / "forward-served" / "model.bpte"
    assert runner_got.read_bytes() == original
    if tamper == "span":
        assert r.returncode == 2, r.stdout + r.stderr
        assert "changed on disk after the bundle was read and verified" in r.stderr, r.stderr
        assert not (report_dir / "report.json").exists()
    else:
        assert r.returncode == 0, r.stdout + r.stderr
        report = json.loads((report_dir / "report.json").read_text())
        assert report["summary"]["verdict"] == "PASS"
