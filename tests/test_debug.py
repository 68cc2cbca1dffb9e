"""`bundlerun debug`: ETRecord at build time, intermediates on host:// and tosa://, the first bad
layer of a program miscompiled on purpose, quantization vs lowering attribution, unmatched
operators, reports (browser-checked), `run --debug-on-fail` and `validate --etrecord --debug-on-fail`.
Real builds, real runtime. Per TOSA operator: test_debug_tosa_ops.py; per MLX instruction:
test_debug_mlx.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import browser  # noqa: E402

from bundlerun.bundles.bpte import read_bundle, write_bundle  # noqa: E402
from bundlerun.bundles.builder import BuildRequest, build_bundle  # noqa: E402
from bundlerun.runner.report.model import Report

BUNDLERUN = [sys.executable, "-m", "bundlerun.runner.cli"]
ARTIFACTS = Path(__file__).parent / "artifacts"


def _cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "BUNDLERUN_HISTORY": "off", **(env or {})}
    return subprocess.run([*BUNDLERUN, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=full_env,
                          timeout=900)


def _conv_weight(program: bytes, nth_conv: int) -> tuple[np.ndarray, bytes]:
    """The constant weight tensor of the nth convolution kernel call, and its raw bytes."""
    from executorch.exir import schema as S
    from executorch.exir._serialize._program import deserialize_pte_binary

    prog = deserialize_pte_binary(program).program
    plan = prog.execution_plan[0]
    seen = 0
    for ins in plan.chains[0].instructions:
        a = ins.instr_args
        if isinstance(a, S.KernelCall) and "convolution" in plan.operators[a.op_index].name:
            if seen == nth_conv:
                t = plan.values[a.args[1]].val
                storage = bytes(prog.constant_buffer[t.data_buffer_idx].storage)
                n = int(np.prod(t.sizes))
                dtype = {6: np.float32, 1: np.int8}[int(t.scalar_type)]
                raw = storage[: n * np.dtype(dtype).itemsize]
                return np.frombuffer(raw, dtype).reshape(t.sizes), raw
            seen += 1
    raise AssertionError("no such convolution")


def _weight_feeding_conv(program: bytes, nth_conv: int) -> tuple[np.ndarray, bytes]:
    """int8 portable programs: the int8 weight behind the dequantize_per_channel of the nth conv."""
    from executorch.exir import schema as S
    from executorch.exir._serialize._program import deserialize_pte_binary

    prog = deserialize_pte_binary(program).program
    plan = prog.execution_plan[0]
    weights = []
    for ins in plan.chains[0].instructions:
        a = ins.instr_args
        if isinstance(a, S.KernelCall) and "dequantize_per_channel" in plan.operators[a.op_index].name:
            t = plan.values[a.args[0]].val
            if t.data_buffer_idx > 0:
                raw = bytes(prog.constant_buffer[t.data_buffer_idx].storage)[: int(np.prod(t.sizes))]
                weights.append((np.frombuffer(raw, np.int8).reshape(t.sizes), raw))
    convs = [w for w in weights if len(w[0].shape) == 4]
    return convs[nth_conv]


def _tamper(src: Path, dst: Path, raw: bytes, new: bytes) -> None:
    """Replace a constant inside the lowered program and re-seal the bundle with the writer."""
    bundle = read_bundle(src)
    assert bundle.program.count(raw) == 1
    program = bundle.program.replace(raw, new)
    from dataclasses import replace

    write_bundle(replace(bundle, program=program), dst)
    etrecord = src.with_suffix(".etrecord")
    dst.with_suffix(".etrecord").write_bytes(etrecord.read_bytes())


@pytest.fixture(scope="module")
def fp32_bundles(tmp_path_factory):
    """tiny-cnn portable fp32 built through the CLI with --etrecord, and a copy with conv2d_1's weights negated."""
    d = tmp_path_factory.mktemp("fp32")
    proc = _cli("build", "tiny-cnn", "--target", "host://portable", "--backend", "portable", "--cases", "4",
                "--etrecord", "-o", d / "good.bpte")
    assert proc.returncode == 0, proc.stderr
    weight, raw = _conv_weight(read_bundle(d / "good.bpte").program, 1)
    _tamper(d / "good.bpte", d / "bad.bpte", raw, (-weight).astype(np.float32).tobytes())
    return d


@pytest.fixture(scope="module")
def int8_bundles(tmp_path_factory):
    """tiny-cnn portable int8 (eager-fp32 reference): untouched with a 60 dB SQNR floor that quantization
    cannot meet, and with conv2d_1's int8 weights negated inside the program."""
    d = tmp_path_factory.mktemp("int8")
    build_bundle(BuildRequest(model="tiny-cnn", output=d / "strict.bpte", backend="portable", target="host://portable",
                              target_info={}, dtype="int8", cases=2, etrecord=True, overrides={"sqnr_min_db": 60.0}))
    build_bundle(BuildRequest(model="tiny-cnn", output=d / "good.bpte", backend="portable", target="host://portable",
                              target_info={}, dtype="int8", cases=2, etrecord=True))
    weight, raw = _weight_feeding_conv(read_bundle(d / "good.bpte").program, 1)
    _tamper(d / "good.bpte", d / "bad.bpte", raw, np.clip(-weight.astype(np.int16), -127, 127).astype(np.int8).tobytes())
    return d


# ------------------------------------------------------------------ 1. build keeps the ETRecord


def test_build_etrecord_is_written_and_recorded(fp32_bundles):
    from bundlerun.bundles.fileio import file_sha256

    manifest = read_bundle(fp32_bundles / "good.bpte").manifest
    entry = manifest.build.etrecord
    path = fp32_bundles / entry.path
    assert path.name == "good.etrecord" and path.is_file()
    assert entry.sha256 == file_sha256(path) and entry.bytes == path.stat().st_size
    assert entry.debug_handles >= 9  # tiny-cnn: one per kernel of the program


def test_host_debug_worker_loads_only_the_runtime_and_the_parent_reads_its_etdump(tmp_path, fp32_bundles,
                                                                                 monkeypatch):
    """The host debug child runs the case and writes the runtime's ETDump + debug buffer; the parent reads
    them with ExecuTorch's Inspector (it loads devtools for the ETRecord anyway). The child never imports
    executorch.exir (4-5 s of CPU per `bundlerun debug` on 2 cores)."""
    from bundlerun.targets.intermediates import run_worker

    work = tmp_path / "w"
    code = ("import atexit, runpy, sys; atexit.register(lambda: print('EXIR-LOADED' if 'executorch.exir' in "
            "sys.modules else 'NO-EXIR', file=sys.__stderr__)); sys.argv = ['debug', *sys.argv[1:]]; "
            "runpy.run_module('bundlerun.targets.workers.debug', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, "host", str(fp32_bundles / "good.bpte"), "forward", "0",
                           str(work)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "NO-EXIR" in proc.stderr, proc.stderr[-2000:]
    meta = json.loads((work / "intermediates.json").read_text())
    assert meta["intermediates"] == [] and meta["etdump"]["file"] == "case.etdump"
    assert (work / "case.etdump").stat().st_size > 0
    run = run_worker("host://portable", "host", fp32_bundles / "good.bpte", "forward", 0, tmp_path / "p", 600, 64,
                     "every kernel call")
    items = run.intermediates
    assert len(items) >= 9 and all(item.kind == "kernel" for item in items)  # one per kernel of tiny-cnn
    assert np.array_equal(items[-1].outputs[0].reshape(run.outputs[0].shape), run.outputs[0])
    # an ETDump the reader cannot take is one line naming the file, not a traceback
    from bundlerun.targets import intermediates

    def unreadable(*_args, **_kwargs):
        raise ValueError("bad flatbuffer\nmore")

    monkeypatch.setattr(intermediates, "parse_etdump", unreadable)
    with pytest.raises(intermediates.IntermediatesFailed, match=r"cannot read the runtime's ETDump .*case.etdump: "
                                                                r"ValueError: bad flatbuffer$"):
        run_worker("host://portable", "host", fp32_bundles / "good.bpte", "forward", 0, tmp_path / "q", 600, 64,
                   "every kernel call")


def test_debug_without_etrecord_says_how_to_rebuild(tmp_path, fp32_bundles):
    from dataclasses import replace

    bundle = read_bundle(fp32_bundles / "good.bpte")
    manifest = json.loads(json.dumps(bundle.manifest_json))
    del manifest["build"]["etrecord"]
    write_bundle(replace(bundle, manifest_json=manifest), tmp_path / "plain.bpte")
    proc = _cli("debug", tmp_path / "plain.bpte", "--target", "host://portable", "--case", "0")
    assert proc.returncode == 2
    assert "built without an ETRecord" in proc.stderr
    assert "bundlerun build tiny-cnn --target host://portable --backend portable --dtype fp32" in proc.stderr
    assert "--etrecord" in proc.stderr


def test_debug_refuses_an_etrecord_of_another_build(tmp_path, fp32_bundles, int8_bundles):
    from bundlerun.runner.debug.localize import DebugError, debug_bundle

    (tmp_path / "good.bpte").write_bytes((fp32_bundles / "good.bpte").read_bytes())
    (tmp_path / "good.etrecord").write_bytes((int8_bundles / "good.etrecord").read_bytes())
    with pytest.raises(DebugError, match="does not belong to"):
        debug_bundle(tmp_path / "good.bpte", "host://portable", case=0)


# ------------------------------------------------------------------ 2. targets return intermediates


def test_unsupported_targets_say_what_they_need(tmp_path):
    from bundlerun.targets.intermediates import IntermediatesUnsupported, capture

    for url, needs in (("ssh://box/host://portable", "remote worker to run the inner target's intermediate capture"),
                       ("labgrid://place", "labgrid agent")):
        with pytest.raises(IntermediatesUnsupported) as info:
            capture(url, tmp_path / "x.bpte", "forward", 0, tmp_path / "unused")
        text = str(info.value)
        assert text.startswith(f"{url}: cannot return intermediate outputs (yet): ") and needs in text
        # the list of lanes that can is what the target modules declare (SPEC.capture); where nothing
        # can be dumped, bisect is the way
        assert " can. To find the delegated operator" in text
        assert text.endswith(f"bundlerun bisect MODEL --target {url} --case N (re-lowers with the delegate "
                             "restricted, docs/debugging.md)")
        assert "\n" not in text


# ------------------------------------------------------------------ 3. the miscompiled layer is named


def assert_conv2d_1_first_bad(bad) -> None:
    """`bad.bpte` (tiny-cnn with conv2d_1's weights changed after lowering), case 2, on any target:
    conv2d_1 (instruction 4) is the first bad row and the 4 matched rows before it are exact."""
    row = bad.first_bad_row
    assert row is not None, [(r.aot_ops, r.fp32) for r in bad.rows]
    assert row.aot_ops == ["conv2d_1"] and "convolution" in row.runtime_op and row.instruction == 4
    assert row.fp32.sqnr < 10
    earlier = [r for r in bad.rows if r.status == "matched" and r.index < row.index]
    assert len(earlier) == 4 and all(r.fp32.sqnr > 100 and not r.exceeds for r in earlier)


@pytest.mark.parametrize("target", ["host://portable", "tosa://fp"])
def test_debug_names_the_miscompiled_conv(fp32_bundles, target, tmp_path, monkeypatch):
    import tempfile

    from bundlerun.runner.debug.localize import debug_bundle

    bad = debug_bundle(fp32_bundles / "bad.bpte", target, case=2, work_dir=tmp_path / "bad")
    assert_conv2d_1_first_bad(bad)
    assert any((tmp_path / "bad").rglob("*"))  # a work folder given is kept
    # the same case of the untouched build: nothing exceeds; without a work folder the dumps (tens of MB)
    # go to a temporary one, removed on return
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    good = debug_bundle(fp32_bundles / "good.bpte", target, case=2)
    assert good.first_bad is None and all(r.fp32.sqnr > 100 for r in good.rows if r.fp32 is not None)
    assert list((tmp_path / "temp").iterdir()) == []


def test_unmatched_operators_are_listed_not_dropped(fp32_bundles, tmp_path):
    from executorch.devtools.etrecord import parse_etrecord

    from bundlerun.runner.debug.localize import compare_layers
    from bundlerun.targets.intermediates import capture

    run = capture("host://portable", fp32_bundles / "good.bpte", "forward", 0, tmp_path / "w")
    record = parse_etrecord(str(fp32_bundles / "good.etrecord"))
    import torch

    inputs = tuple(torch.from_numpy(v.to_array().copy()) for v in read_bundle(fp32_bundles / "good.bpte")
                   .suite("forward").test_cases[0].inputs)
    handles = record._debug_handle_map["forward"]
    key = 2 if 2 in handles else "2"  # JSON keys after parse_etrecord
    del handles[key]  # the relu: no way back to the eager graph
    rows, _ = compare_layers(run, record, inputs, "forward", quantized=False)
    assert len(rows) == len(run.intermediates) == 10  # every runtime operator has a row
    relu = rows[2]
    assert relu.status == "unmatched" and "relu" in relu.runtime_op and "no debug handle" in relu.note
    assert relu.fp32 is None
    # the weight transpose of the linear shares its debug handle with the addmm: unmatched, says where it went
    permute = next(r for r in rows if "permute" in r.runtime_op)
    assert permute.status == "unmatched" and "overlap instruction 9" in permute.note
    assert sum(r.status == "matched" for r in rows) == 8


# ------------------------------------------------------------------ int8: quantization vs lowering


def test_int8_lowering_error_is_attributed_to_lowering(int8_bundles, tmp_path):
    from bundlerun.runner.debug.localize import debug_bundle

    result = debug_bundle(int8_bundles / "bad.bpte", "host://portable", case=0, work_dir=tmp_path / "w")
    row = result.first_bad_row
    assert row is not None and "conv2d_1" in row.aot_ops and row.attribution == "lowering"
    assert row.quantized.sqnr < 10 and row.quant_vs_fp32.sqnr > 25  # runtime misses the quantized reference


def test_int8_quantization_error_is_attributed_to_quantization(int8_bundles, tmp_path):
    from bundlerun.runner.debug.localize import debug_bundle

    result = debug_bundle(int8_bundles / "strict.bpte", "host://portable", case=0, work_dir=tmp_path / "w")
    assert result.budget_db == 60.0 and result.judged_column == "fp32"
    row = result.first_bad_row
    assert row is not None and row.attribution == "quantization"
    compared = [r for r in result.rows if r.quantized is not None and r.fp32 is not None]
    assert len(compared) >= 6
    # the runtime follows the quantized reference closely; the gap to fp32 is what quantization costs
    assert all(r.quantized.sqnr > row.fp32.sqnr + 10 for r in compared)
    assert row.quant_vs_fp32.sqnr == pytest.approx(row.fp32.sqnr, abs=3.0)
    assert any(r.note and "folded" in r.note for r in result.rows)  # conv+bn: fp32 side is the batch norm


# ------------------------------------------------------------------ CLI, history, reports, --debug-on-fail


@pytest.mark.skipif(browser.chromium_path() is None, reason="chromium is not installed (.ci/run installs it)")
def test_run_debug_on_fail_and_debug_from_history_write_reports(fp32_bundles, tmp_path):
    db = tmp_path / "history.sqlite"
    env = {"BUNDLERUN_HISTORY": str(db)}
    run = _cli("run", fp32_bundles / "bad.bpte", "--target", "host://portable", "--report", tmp_path / "run",
               "--debug-on-fail", "--quiet", env=env)
    assert run.returncode == 1, run.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    from bundlerun.runner.debug.localize import worst_failing_case

    worst = worst_failing_case(Report.from_json(report))
    drilled = json.loads((tmp_path / "run" / "debug" / "report.json").read_text())["debug"]
    assert drilled["case"] == worst and drilled["first_bad_layer"]["aot_ops"] == ["conv2d_1"]

    # `debug` without --case: the worst failing case of the last recorded run of this bundle
    proc = _cli("debug", fp32_bundles / "bad.bpte", "--target", "host://portable", "--report", tmp_path / "dbg",
                env=env)
    assert proc.returncode == 1, proc.stderr
    assert "first bad layer: instruction 4" in proc.stdout and "conv2d_1" in proc.stdout
    body = json.loads((tmp_path / "dbg" / "report.json").read_text())
    debug = body["debug"]
    assert body["kind"] == "debug" and debug["schema"] == "bundlerun.debug/1"
    assert debug["case"] == worst and debug["case_source"].startswith("worst failing case of run #")
    assert len(debug["rows"]) == 10 and debug["unmatched"] == 1
    assert debug["rows"][4]["exceeds"] is True and debug["rows"][4]["fp32"]["sqnr"] < 10
    md = (tmp_path / "dbg" / "summary.md").read_text()
    assert "**FIRST BAD**" in md and "| unmatched" in md
    ARTIFACTS.mkdir(exist_ok=True)
    check = browser.check_page((tmp_path / "dbg" / "report.html").resolve().as_uri(), ARTIFACTS / "debug_report.png")
    assert check.console_errors == []
    assert check.title.startswith("bundlerun debug: tiny-cnn on host://portable")
    assert len(check.images) == 1
    img = check.images[0]
    assert img["complete"] and img["naturalWidth"] > 600 and img["naturalHeight"] > 300


# the TOSA delegate miscompiled inside its payload, per TOSA operator: tests/test_debug_tosa_ops.py;
# mlx:// per MLX instruction: tests/test_debug_mlx.py


def test_validate_etrecord_and_debug_on_fail(tmp_path):
    """`validate --etrecord` writes each bundle's ETRecord beside it; with --debug-on-fail a failing model
    drills into its worst case, the debug report in that model's report folder."""
    out = tmp_path / "v"
    proc = _cli("validate", "tiny-cnn", "--target", "host://portable", "--cases", "2", "--etrecord",
                "--debug-on-fail", "--tolerance", "sqnr_min_db=300", "--report", out)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = out / "tiny-cnn-fp32"
    manifest = read_bundle(folder / "tiny-cnn-fp32.bpte").manifest
    assert manifest.build.etrecord.path == "tiny-cnn-fp32.etrecord"
    assert (folder / "tiny-cnn-fp32.etrecord").is_file()
    report = json.loads((folder / "report.json").read_text())
    from bundlerun.runner.debug.localize import worst_failing_case

    debug = json.loads((folder / "debug" / "report.json").read_text())["debug"]
    assert debug["case"] == worst_failing_case(Report.from_json(report)) and debug["case_source"].endswith("(--debug-on-fail)")
    assert debug["budget_db"] == 300 and debug["first_bad_layer"]["row"] == 0  # nothing reaches 300 dB
    assert len(debug["rows"]) == 10 and "first bad layer: instruction 0" in proc.stdout
    # --etrecord without --debug-on-fail: the ETRecord, no drill-down
    proc = _cli("validate", "mlp", "--target", "host://portable", "--cases", "1", "--etrecord",
                "--tolerance", "sqnr_min_db=300", "--report", out, "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["runs"][0]["verdict"] == "FAIL"
    assert (out / "mlp-fp32" / "mlp-fp32.etrecord").is_file() and not (out / "mlp-fp32" / "debug").exists()


def test_output_budget_takes_the_strictest_criterion():
    from bundlerun.runner.debug.localize import output_budget

    from bundlerun.bundles.manifest import Criteria, Manifest, MethodManifest, OutputSpec

    out0 = OutputSpec("out0", "float32", [4], Criteria(rel_frobenius_max=0.15, cosine_min=0.9))
    manifest = Manifest(model={}, build={}, versions={}, methods={"forward": MethodManifest("forward", [], [out0])})
    budget, source = output_budget(manifest, "forward", "out0", np.ones(4, np.float32))
    assert budget == pytest.approx(-20 * np.log10(0.15)) and "rel_frobenius_max=0.15" in source  # 16.5 > 7.0 dB
    out0.criteria.atol, out0.criteria.rtol = 1e-3, 1e-3
    budget, source = output_budget(manifest, "forward", "out0", np.full(4, 2.0, np.float32))
    assert budget == pytest.approx(20 * np.log10(2.0 / (1e-3 + 2e-3))) and "atol=0.001" in source
    out0.criteria = Criteria(atol=0.0, rtol=0.0)
    assert output_budget(manifest, "forward", "out0", np.ones(4, np.float32))[0] is None
    assert output_budget(None, "forward", "out0", np.full(4, 2.0, np.float32))[0] is not None  # the 1e-3 default


def test_etrecord_recording_restores_the_lowering_entry_point():
    import executorch.exir as exir

    from bundlerun.bundles.etrecord import recording

    original = exir.to_edge_transform_and_lower
    seen = {}

    def lower(_req):
        seen["wrapped"] = exir.to_edge_transform_and_lower is not original
        raise RuntimeError("lowering failed")

    with pytest.raises(RuntimeError):
        recording(True, lower)(None)
    assert seen["wrapped"] and exir.to_edge_transform_and_lower is original
    assert recording(False, lower) is lower


def test_bfloat16_intermediates_are_compared_as_values_not_raw_words():
    """bf16 outputs keep their raw uint16 words for bit-exact reports; an intermediate is compared,
    so it must come back as its value (1.5 is 0x3FC0 = 16320 as a word)."""
    import torch

    from bundlerun.runner.debug.localize import Column
    from bundlerun.targets.intermediates import intermediate_array

    t = torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16)
    a = intermediate_array(t)
    assert a.dtype == np.float32 and a.tolist() == [1.5, -2.0, 0.25]
    col = Column.of(a, np.array([1.5, -2.0, 0.25], dtype=np.float32))
    assert col.sqnr == float("inf") or col.sqnr > 100
    assert intermediate_array(torch.tensor([3], dtype=torch.int8)).dtype == np.int8  # others unchanged
