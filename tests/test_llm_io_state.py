"""A sequence whose KV cache is the program's inputs and outputs (`state: "io"`, QNN's static llama):
the manifest's `build.llm.kv_io`, its checks when a bundle is read, and the worker's threading
(targets/workers/io_state.py). Fast tier: no runtime, no simulator (the real run on qnn://htp-sim is
tests/test_qnn_llm.py)."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest

from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite
from bundlerun.bundles.consistency import check_consistency
from bundlerun.bundles.errors import BundleError, ConfigError, ManifestError
from bundlerun.bundles.manifest import Manifest, validate_manifest
from bundlerun.bundles.sequence import KvLink, SequenceSpec, SequenceStep, kv_link_problem, kv_links
from bundlerun.runner.report.sequences import SequenceRecord, headline, sequence_records
from bundlerun.targets.workers.io_state import IoStateError, IoThreader
from tests.security_fuzz import mutate_json

CTX = 6  # cache length of the toy program: tokens [1,1] int32, cache [1, 2, CTX] float32 -> logits [1, 4], new [1, 2, 1]
LINKS = [KvLink(output=1, input=1, axis=2)]


def _seq(name: str, first: int, prompt: int, decode: int, state: str = "io") -> SequenceSpec:
    steps = [SequenceStep(first + k, "prompt", k, [k + 1], 3) for k in range(prompt)]
    steps += [SequenceStep(first + prompt + k, "decode", prompt + k, [3], 3) for k in range(decode)]
    return SequenceSpec(name, "forward", True, "teacher-forced", steps, None, state=state)


def _manifest(sequences: list[SequenceSpec] | None = None, links: list[KvLink] | None = None) -> dict:
    seqs = sequences if sequences is not None else [_seq("seq0", 0, 2, 1), _seq("seq1", 3, 1, 1)]
    llm = {"arch": "llama3", "size": "tiny", "dtype": "fp16", "max_seq_len": CTX, "weights": "seeded (seed 0)",
           "kv_io": [link.to_dict() for link in (LINKS if links is None else links)], "kv_update": "at start_pos"}
    return Manifest(
        model={"id": "llm:llama3", "source": "test", "description": ""},
        build={"backend": "qnn", "dtype": "fp16", "cases": 5, "llm": llm},
        versions={}, methods={"forward": Manifest.from_dict({
            "schema": "bundlerun.manifest/1", "model": {"id": "x"},
            "methods": {"forward": {"name": "forward", "outputs": [
                {"name": "out0", "dtype": "float32", "shape": [1, 4], "criteria": {"atol": 0.1}},
                {"name": "out1", "dtype": "float32", "shape": [1, 2, 1], "criteria": {"atol": 0.1}}]}}}).methods["forward"]},
        sequences=seqs,
    ).to_dict()


def _tensor(array: np.ndarray) -> BundledValue:
    return BundledValue.from_array(np.ascontiguousarray(array), {np.dtype(np.float32): 6, np.dtype(np.int32): 3}[array.dtype])


def _bundle(manifest: dict, out_shape=(1, 2, 1)) -> Bundle:
    cases = [BundledTestCase(inputs=[_tensor(np.zeros((1, 1), np.int32)), _tensor(np.zeros((1, 2, CTX), np.float32))],
                             expected_outputs=[_tensor(np.zeros((1, 4), np.float32)), _tensor(np.zeros(out_shape, np.float32))])
             for _ in range(5)]
    return Bundle(program=b"not a program", method_test_suites=[MethodTestSuite("forward", cases)], manifest_json=manifest)


# --------------------------------------------------------------------------- manifest


def test_io_state_round_trips_and_program_state_manifests_stay_byte_identical():
    data = _manifest()
    validate_manifest(data)
    back = Manifest.from_dict(json.loads(json.dumps(data)))
    assert [s.state for s in back.sequences] == ["io", "io"]
    assert kv_links(back) == LINKS and kv_links(data) == LINKS
    program = SequenceSpec("s", "forward", True, "teacher-forced", [SequenceStep(0, "prompt", 0, [1], 2)])
    assert "state" not in program.to_dict()  # export_llama's bundles are written as before


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["sequences"][0].__setitem__("state", "buffers"), "expected program or io"),
    (lambda d: d["build"]["llm"].pop("kv_io"), "needs build.llm.kv_io"),
    (lambda d: d["build"]["llm"].__setitem__("kv_io", []), "non-empty list"),
    (lambda d: d["build"]["llm"]["kv_io"][0].__setitem__("axis", -1), "outside"),
    (lambda d: d["build"]["llm"]["kv_io"][0].__setitem__("output", "1"), "expected"),
    (lambda d: d["build"]["llm"]["kv_io"][0].pop("input"), "input"),
    (lambda d: d["build"]["llm"]["kv_io"][0].__setitem__("from", 1), "unknown key"),
    (lambda d: d["build"]["llm"].__setitem__("kv_io", [LINKS[0].to_dict()] * 5000), "at most"),
])
def test_schema_refuses_each_broken_kv_io_in_one_line(edit, words):
    data = _manifest()
    edit(data)
    with pytest.raises(ManifestError) as err:
        validate_manifest(data, "x.bpte")
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("link, words", [
    (KvLink(output=2, input=1, axis=2), "names output 2, but a step returns 2 outputs"),
    (KvLink(output=1, input=5, axis=2), "names input 5, but a step takes 2 inputs"),
    (KvLink(output=1, input=1, axis=7), "no common axis 7"),
    (KvLink(output=0, input=1, axis=2), "output 0 [1, 4] and input 1 [1, 2, 6] have no common axis 2"),
    (KvLink(output=1, input=0, axis=2), "int32"),
])
def test_a_kv_io_naming_what_the_cases_lack_is_a_broken_bundle_in_one_line(link, words):
    data = _manifest(links=[link])
    validate_manifest(data)  # well-formed: only the cases say it names a missing or misfit value
    with pytest.raises(BundleError) as err:
        check_consistency(_bundle(data), "tampered.bpte")
    assert words in str(err.value) and "\n" not in str(err.value) and "tampered.bpte" in str(err.value)


def test_a_step_past_the_cache_and_two_outputs_into_one_input_are_refused():
    ins, outs = [("int32", [1, 1]), ("float32", [1, 2, CTX])], [("float32", [1, 4]), ("float32", [1, 2, 1])]
    assert kv_link_problem(LINKS, ins, outs, CTX - 1) is None
    assert "does not fit input 1 [1, 2, 6] off axis 2" in kv_link_problem(LINKS, ins, [outs[0], ("float32", [1, 3, 1])], 0)
    assert "holds 6 along axis 2" in kv_link_problem(LINKS, ins, outs, CTX)
    assert "fed by two outputs" in kv_link_problem(LINKS * 2, ins, outs, 0)
    assert "names output 1" in kv_link_problem(LINKS, ins, [("float32", [1, 4]), None], 0)


def test_a_consistent_io_bundle_is_read():
    assert isinstance(check_consistency(_bundle(_manifest()), "ok.bpte"), list)  # no BundleError


def test_seeded_hostile_kv_io_is_refused_in_one_line_or_checked_against_the_cases():
    rng = random.Random(37)
    base = _manifest()
    refused = read = 0
    for _ in range(300):
        doc, _edits = mutate_json({"kv_io": copy.deepcopy(base["build"]["llm"]["kv_io"]),
                                   "states": [s.get("state") for s in base["sequences"]]}, rng, edits=rng.randint(1, 2))
        data = copy.deepcopy(base)
        data["build"]["llm"]["kv_io"] = doc.get("kv_io")
        states = doc.get("states")
        for seq, state in zip(data["sequences"], states if isinstance(states, list) else []):
            seq["state"] = state
        try:
            validate_manifest(data, "fuzz.bpte")
            check_consistency(_bundle(data), "fuzz.bpte")
        except (ManifestError, BundleError) as exc:
            assert "\n" not in str(exc)
            refused += 1
            continue
        read += 1
        links = kv_links(data)  # what passed both checks builds its records and threads without error
        assert all(isinstance(link.axis, int) for link in links)
    assert refused > 100 and read > 10


# --------------------------------------------------------------------------- threading


def _outputs(step: int) -> list[np.ndarray]:
    return [np.zeros((1, 4), np.float32), np.full((1, 2, 1), step + 1, np.float32)]


def _inputs(marker: float = 0.0) -> list[np.ndarray]:
    return [np.zeros((1, 1), np.int32), np.full((1, 2, CTX), marker, np.float32)]


def test_each_later_step_runs_on_the_cache_the_earlier_steps_returned():
    threader = IoThreader.from_manifest(_manifest())
    assert threader is not None
    fed, source = threader.inputs_for("forward", 0, _inputs())
    assert source is None  # the first step runs on the bundle's own (zero) cache
    threader.after("forward", 0, _outputs(0))
    fed, source = threader.inputs_for("forward", 1, _inputs(marker=-9.0))  # the bundle's cache is not used
    assert source == 0
    assert fed[1][0, :, 0].tolist() == [1.0, 1.0] and (fed[1][0, :, 1:] == 0).all()
    threader.after("forward", 1, _outputs(1))
    fed, source = threader.inputs_for("forward", 2, _inputs(marker=-9.0))
    assert source == 1 and fed[1][0, 0, :3].tolist() == [1.0, 2.0, 0.0]
    threader.after("forward", 2, _outputs(2))
    fed, source = threader.inputs_for("forward", 3, _inputs(marker=5.0))  # seq1 starts over on its own inputs
    assert source is None and (fed[1] == 5.0).all()
    assert threader.threaded == 2


def test_a_step_whose_predecessor_did_not_run_here_gets_no_state():
    threader = IoThreader.from_manifest(_manifest())
    with pytest.raises(IoStateError, match="without the state of its previous step"):
        threader.inputs_for("forward", 1, _inputs())
    threader.inputs_for("forward", 0, _inputs())
    threader.forget()  # step 0 failed on the target
    threader.after("forward", 0, _outputs(0))  # nothing is threaded from a failed step
    with pytest.raises(IoStateError):
        threader.inputs_for("forward", 1, _inputs())


def test_an_output_that_does_not_fit_its_cache_is_an_error_not_a_silent_write():
    threader = IoThreader.from_manifest(_manifest())
    threader.inputs_for("forward", 0, _inputs())
    with pytest.raises(IoStateError, match="does not fit input 1"):
        threader.after("forward", 0, [np.zeros((1, 4), np.float32), np.zeros((1, 2, CTX + 1), np.float32)])
    with pytest.raises(IoStateError, match="returned 1 outputs"):
        threader.after("forward", 0, [np.zeros((1, 4), np.float32)])


def test_program_state_bundles_have_no_threader():
    data = _manifest([_seq("seq0", 0, 2, 1, state="program")])
    assert IoThreader.from_manifest(data) is None
    assert IoThreader.from_manifest(None) is None


# --------------------------------------------------------------------------- lanes and report


def test_a_lane_that_cannot_thread_io_state_refuses_the_bundle_in_one_line():
    from bundlerun.bundles.bpte import parse_bundle  # noqa: F401 - the refusal reads only the manifest
    from bundlerun.runner.stateful import refusal

    bundle = _bundle(_manifest())
    pairs = [("forward", i) for i in range(5)]
    assert refusal("qnn://htp-sim", bundle, pairs) is None
    assert refusal("host://xnnpack", bundle, pairs) is None
    refused = refusal("qemu-user://aarch64", bundle, pairs)  # stateful (served), but it cannot thread I/O
    assert isinstance(refused, ConfigError) and "cannot thread a KV cache" in str(refused)
    assert "\n" not in str(refused)


def test_the_report_says_bundlerun_threaded_the_state():
    specs = [_seq("seq0", 0, 2, 1)]
    verdicts = {("forward", i): "PASS" for i in range(3)}
    record = sequence_records(specs, verdicts, {}, {("forward", 1): 0, ("forward", 2): 1})[0]
    assert record.state.startswith("KV cache threaded by bundlerun: 2/2 later steps")
    assert "threaded by bundlerun" in headline(record)
    assert SequenceRecord.from_json(json.loads(json.dumps(record.to_json()))).state == record.state
    half = sequence_records(specs, verdicts, {}, {("forward", 1): 0})[0]
    assert "1/2 later steps" in half.state
    program = sequence_records([_seq("p", 0, 2, 1, state="program")], verdicts, {})[0]
    assert program.state is None and "state" not in program.to_json()
