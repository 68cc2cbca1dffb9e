"""`bundlerun debug` on a step of an LLM's stateful sequence (docs/debugging.md section 11): the
sequence's earlier steps replayed on the target's one loaded method and through the reference
graph, a planted fault in one layer's weight named by its eager module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bundlerun.bundles.sequence import SequenceSpec, SequenceStep, first_failing_step, sequence_prefix


def _seq(name: str, first: int, steps: int, stateful: bool = True) -> SequenceSpec:
    return SequenceSpec(name, "forward", stateful, "teacher-forced",
                        [SequenceStep(first + k, "prompt" if k == 0 else "decode", k, [1], 2) for k in range(steps)])


def test_the_prefix_of_a_step_is_its_sequences_earlier_steps_only():
    seqs = [_seq("a", 0, 4), _seq("b", 4, 3)]
    assert sequence_prefix(seqs, "forward", 2)[1] == [0, 1]
    seq, prefix = sequence_prefix(seqs, "forward", 5)
    assert seq is not None and seq.name == "b" and prefix == [4]
    assert sequence_prefix(seqs, "forward", 4)[1] == []  # a prompt runs on a fresh cache by design
    assert sequence_prefix(seqs, "other", 2) == (None, [])
    assert sequence_prefix([_seq("c", 0, 3, stateful=False)], "forward", 2) == (None, [])


def test_the_first_diverging_step_is_in_step_order_not_the_worst():
    seqs = [_seq("a", 0, 4), _seq("b", 4, 3)]
    assert first_failing_step(seqs, "forward", {3, 2, 6}) == 2
    assert first_failing_step(seqs, "forward", {6, 5}) == 5
    assert first_failing_step(seqs, "forward", set()) is None


@pytest.mark.parametrize("url", ["tosa://fp", "mlx://cpu"])
def test_a_capture_that_cannot_replay_the_prefix_refuses(url, tmp_path):
    from bundlerun.targets.intermediates import IntermediatesUnsupported, capture

    with pytest.raises(IntermediatesUnsupported, match="fresh KV cache"):
        capture(url, tmp_path / "x.bpte", "forward", 3, tmp_path / "w", prefix=(0, 1, 2))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=1800)


@pytest.fixture(scope="module")
def llm_bundles(tmp_path_factory):
    """A tiny llama built through export_llama with its ETRecord, and a copy with layer 1's w2 negated in
    the lowered program (the XNNPACK payload holds the weight bytes as eager has them), re-sealed."""
    import numpy as np

    from dataclasses import replace

    work = tmp_path_factory.mktemp("llmdebug")
    done = _cli("build", "llm:llama3", "--etrecord", "-o", "tiny.bpte", cwd=work)  # relative: export_llama runs elsewhere
    assert done.returncode == 0, done.stderr[-2000:]
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 - the reference graph's llama:: ops
    from executorch.devtools.etrecord import parse_etrecord

    from bundlerun.bundles.bpte import read_bundle, write_bundle

    bundle = read_bundle(work / "tiny.bpte")
    weight = parse_etrecord(str(work / "tiny.etrecord")).exported_program.state_dict["layers.1.feed_forward.w2.weight"]
    raw = np.ascontiguousarray(weight.detach().float().numpy())
    assert bundle.program.count(raw.tobytes()) == 1
    write_bundle(replace(bundle, program=bundle.program.replace(raw.tobytes(), (-raw).tobytes())),
                 work / "broken.bpte")
    (work / "broken.etrecord").write_bytes((work / "tiny.etrecord").read_bytes())
    return work


@pytest.mark.slow
def test_debug_of_a_decode_step_names_the_planted_layer(llm_bundles):
    work = llm_bundles
    done = _cli("debug", "broken.bpte", "--target", "host://xnnpack", "--case", "3", "--report", "dbg", cwd=work)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    body = json.loads((work / "dbg" / "report.json").read_text())["debug"]
    assert body["first_bad_layer"]["module"] == "layers.1.feed_forward.w2"
    assert "layers.1.feed_forward.w2" in done.stdout
    assert any("replayed 3 earlier step(s)" in n for n in body["notes"])


@pytest.mark.slow
def test_debug_of_a_healthy_decode_step_finds_nothing(llm_bundles):
    """Both sides replay the prefix: the step's layers agree (a reference on a fresh cache would not)."""
    done = _cli("debug", "tiny.bpte", "--target", "host://xnnpack", "--case", "3", cwd=llm_bundles)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "no layer exceeds" in done.stdout


@pytest.mark.slow
def test_debug_without_a_case_takes_the_first_diverging_step(llm_bundles):
    work = llm_bundles
    assert _cli("run", "broken.bpte", "--target", "host://xnnpack", "--history", "h.db", cwd=work).returncode == 1
    done = _cli("debug", "broken.bpte", "--target", "host://xnnpack", "--history", "h.db", "--json", cwd=work)
    assert done.returncode == 1, done.stderr[-2000:]
    body = json.loads(done.stdout)
    assert body["case"] == 0 and "first diverging step" in body["case_source"]


def test_seeded_hostile_sequences_give_a_prefix_of_earlier_steps_or_nothing():
    """Sequences as a (validated but hostile) manifest may hold them: overlapping, repeated or huge case
    numbers, other methods: the prefix is always the holding sequence's steps before the case, never a crash."""
    import random

    rng = random.Random(35)
    for _ in range(300):
        seqs = []
        for i in range(rng.randint(0, 4)):
            cases = [rng.choice([rng.randint(0, 20), rng.randint(0, 2**62)]) for _ in range(rng.randint(0, 6))]
            seqs.append(SequenceSpec(f"s{i}", rng.choice(["forward", "other"]), rng.random() < 0.8, "teacher-forced",
                                     [SequenceStep(c, "decode", 0, [1], 0) for c in cases]))
        case = rng.randint(0, 20)
        seq, prefix = sequence_prefix(seqs, "forward", case)
        if seq is None:
            assert prefix == []
        else:
            assert seq.stateful and seq.method == "forward" and case not in prefix
            assert prefix == seq.cases[: len(prefix)] and seq.cases[len(prefix)] == case
        failing = {rng.randint(0, 20) for _ in range(rng.randint(0, 5))}
        first = first_failing_step(seqs, "forward", failing)
        assert first is None or first in failing


@pytest.mark.slow
def test_run_debug_on_fail_drills_into_the_first_diverging_step(llm_bundles):
    work = llm_bundles
    done = _cli("run", "broken.bpte", "--target", "host://xnnpack", "--no-history", "--debug-on-fail", "--report",
                "dof", cwd=work)
    assert done.returncode == 1, done.stderr[-2000:]
    found = [json.loads(p.read_text()) for p in (work / "dof").rglob("report.json")]
    debug = [r["debug"] for r in found if r.get("kind") == "debug"]
    assert debug and debug[0]["case"] == 0 and "first diverging step" in debug[0]["case_source"]
    assert debug[0]["first_bad_layer"]["module"] == "layers.1.feed_forward.w2"
