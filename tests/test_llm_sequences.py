"""LLM sequences, pure Python: the contract's records, their strict schema (with seeded hostile
manifests), the prefix rule a run must keep, the input-bounds check, and the build request's
one-line refusals (before torch is imported). The real exports are in tests/test_llm_build.py."""

from __future__ import annotations

import copy
import json
import random

import pytest

from bundlerun.bundles.consistency import _inputs_within_bounds
from bundlerun.bundles.errors import BuildError, BundleError, ManifestError
from bundlerun.bundles.llm_arch import ARCHS, SIZES, params_for
from bundlerun.bundles.llm_build import LlmOptions, plan
from bundlerun.bundles.manifest import Manifest, validate_manifest
from bundlerun.bundles.program_meta import DeclaredOutput
from bundlerun.bundles.sequence import SequenceSpec, SequenceStep, from_manifest, stateful_prefix_problem
from tests.security_fuzz import mutate_json


def _seq(name: str, first: int, decode: int, prompt: int = 3) -> SequenceSpec:
    steps = [SequenceStep(first, "prompt", 0, list(range(1, prompt + 1)), 7)]
    steps += [SequenceStep(first + k, "decode", prompt + k - 1, [7], 7) for k in range(1, decode + 1)]
    return SequenceSpec(name, "forward", True, "teacher-forced", steps, None)


def _manifest(sequences: list[SequenceSpec] | None = None) -> dict:
    seqs = sequences if sequences is not None else [_seq("seq0", 0, 2), _seq("seq1", 3, 2)]
    return Manifest(
        model={"id": "llm:llama3", "source": "executorch export_llama", "description": ""},
        build={"backend": "xnnpack", "dtype": "fp32", "cases": 6,
               "llm": {"arch": "llama3", "size": "tiny", "dtype": "fp32", "max_seq_len": 64, "weights": "seeded (seed 0)",
                       "dynamic_shape": True, "use_kv_cache": True, "tokenizer": None, "params": {"dim": 64}}},
        versions={}, methods={"forward": Manifest.from_dict({
            "schema": "bundlerun.manifest/1", "model": {"id": "x"},
            "methods": {"forward": {"name": "forward", "outputs": [
                {"name": "out0", "dtype": "float32", "shape": [1, 512], "criteria": {"atol": 1e-3}}]}}}).methods["forward"]},
        sequences=seqs,
    ).to_dict()


def test_sequences_round_trip_and_only_appear_when_present():
    data = _manifest()
    validate_manifest(data)
    back = Manifest.from_dict(json.loads(json.dumps(data)))
    assert [s.to_dict() for s in back.sequences] == data["sequences"]
    assert from_manifest(data)[1].cases == [3, 4, 5]
    plain = _manifest([])
    assert "sequences" not in plain  # every manifest made without sequences stays byte-identical
    assert json.dumps(Manifest.from_dict(plain).to_dict(), sort_keys=True) == json.dumps(plain, sort_keys=True)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["sequences"][0]["steps"][1].__setitem__("tokens", [1, 2]), "a decode step feeds one token"),
    (lambda d: d["sequences"][0]["steps"][0].__setitem__("kind", "decode"), "starts with a prompt"),
    (lambda d: d["sequences"][1]["steps"][0].__setitem__("case", 1), "belongs to two sequences"),
    (lambda d: d["sequences"][1]["steps"][1].__setitem__("case", 3), "does not follow"),
    (lambda d: d["sequences"][1]["steps"][2].__setitem__("case", 6), "outside [0, 5]"),
    (lambda d: d["sequences"][0].__setitem__("method", "decode"), "not a method"),
    (lambda d: d["sequences"][0].__setitem__("stateful", "yes"), "expected a boolean"),
    (lambda d: d["sequences"][0]["steps"][0].__setitem__("tokens", [-1]), "outside"),
    (lambda d: d["sequences"][1].__setitem__("name", "seq0"), "names two sequences"),
    (lambda d: d.__setitem__("sequences", []), "non-empty list"),
    (lambda d: d["build"]["llm"].__setitem__("max_seq_len", 1), "outside"),
    (lambda d: d["build"]["llm"].__setitem__("weigths", "x"), "unknown key"),
])
def test_schema_refuses_each_broken_sequence_in_one_line(edit, words):
    data = _manifest()
    edit(data)
    with pytest.raises(ManifestError) as err:
        validate_manifest(data, "x.bpte")
    assert words in str(err.value) and "\n" not in str(err.value)


def test_seeded_hostile_sequences_are_refused_or_read_never_crash():
    rng = random.Random(35)
    base = _manifest()
    refused = 0
    for _ in range(400):
        doc, _edits = mutate_json({"sequences": copy.deepcopy(base["sequences"]), "build": copy.deepcopy(base["build"])},
                                  rng, edits=rng.randint(1, 3))
        data = {**base, **doc}
        try:
            validate_manifest(data, "fuzz.bpte")
        except ManifestError as exc:
            assert "\n" not in str(exc)
            refused += 1
            continue
        manifest = Manifest.from_dict(data)  # what passed the schema builds its records
        for seq in manifest.sequences:
            assert all(isinstance(t, int) for step in seq.steps for t in step.tokens)
    assert refused > 100


def test_a_run_must_hold_each_stateful_sequence_from_its_prompt_in_order():
    seqs = [_seq("seq0", 0, 2), _seq("seq1", 3, 2)]
    every = [("forward", i) for i in range(6)]
    assert stateful_prefix_problem(seqs, every) is None
    assert stateful_prefix_problem(seqs, every[3:]) is None  # a whole sequence: it starts at position 0
    assert stateful_prefix_problem(seqs, every[:2]) is None  # a prefix of one
    problem = stateful_prefix_problem(seqs, every[1:3])
    assert problem and "step 0 (case 0) is not selected" in problem
    assert "not selected" in (stateful_prefix_problem(seqs, [every[0], every[2]]) or "")
    assert "step order" in (stateful_prefix_problem(seqs, [every[1], every[0]]) or "")
    stateless = [SequenceSpec("s", "forward", False, "teacher-forced", seqs[0].steps)]
    assert stateful_prefix_problem(stateless, every[1:3]) is None


def test_inputs_are_checked_against_the_programs_declared_bounds():
    from bundlerun.bundles.bpte import BundledValue

    import numpy as np

    def value(shape):
        return BundledValue.from_array(np.zeros(shape, dtype=np.int64), 4)

    dynamic = [DeclaredOutput("tensor", 4, [1, 63], static=False), DeclaredOutput("tensor", 4, [1], static=True)]
    _inputs_within_bounds("c", [value((1, 63)), value((1,))], dynamic)
    _inputs_within_bounds("c", [value((1, 1)), value((1,))], dynamic)
    with pytest.raises(BundleError, match=r"past the program's upper bound \[1, 63\]"):
        _inputs_within_bounds("c", [value((1, 64)), value((1,))], dynamic)
    static = [DeclaredOutput("tensor", 4, [1, 1], static=True)]
    with pytest.raises(BundleError, match=r"static \[1, 1\]: the runtime cannot resize it"):
        _inputs_within_bounds("c", [value((1, 5))], static)
    with pytest.raises(BundleError, match="dimensions"):
        _inputs_within_bounds("c", [value((5,))], static)


def test_build_request_refusals_are_one_line_before_torch():
    with pytest.raises(BuildError, match="did you mean 'qwen3'"):
        plan("llm:qwen", "fp32", LlmOptions())
    with pytest.raises(BuildError, match="choose one of fp32, 8da4w, int8-dynamic"):
        plan("llm:llama3", "int4", LlmOptions())
    with pytest.raises(BuildError, match="--prompt needs --tokenizer"):
        plan("llm:llama3", None, LlmOptions(prompts=["hi"]))
    with pytest.raises(BuildError, match="--checkpoint needs the --params"):
        plan("llm:llama3", None, LlmOptions(checkpoint="x.pth"))
    p = plan("llm:smollm2", None, LlmOptions(decode_steps=2))
    assert p.dtype == "fp32" and p.decode_steps == 2 and all(n + 2 <= p.max_seq_len - 1 for n in p.prompt_lengths)


def test_sizes_keep_the_architecture_flags_and_the_small_size_is_stories15m():
    small = params_for("llama2", "small")
    assert (small["dim"], small["n_layers"], small["n_heads"], small["n_kv_heads"], small["vocab_size"]) == (288, 6, 6, 6, 32000)
    qwen = params_for("qwen3", "tiny")
    assert qwen["use_qk_norm"] and qwen["use_hf_rope"] and qwen["n_kv_heads"] == 2
    assert set(ARCHS) >= {"llama3", "qwen3", "smollm2"} and set(SIZES) == {"tiny", "small"}


def test_hostile_params_files_are_one_line_build_errors(tmp_path):
    """A user's params.json from outside: seeded hostile variants each end as one BuildError line, or
    are accepted only inside the bounds (never a crash, never a huge allocation)."""
    from bundlerun.bundles.llm_build import MAX_PARAMETERS

    base = {"dim": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 512, "hidden_dim": 128}
    rng = random.Random(7)
    refused = 0
    for i in range(200):
        doc, _ = mutate_json(copy.deepcopy(base), rng, edits=rng.randint(1, 3))
        path = tmp_path / f"p{i}.json"
        path.write_text(json.dumps(doc) if rng.random() < 0.9 else "{" * rng.randint(1, 5000))
        try:
            p = plan("llm:llama3", "fp32", LlmOptions(params=path))
        except BuildError as exc:
            assert "\n" not in str(exc)
            refused += 1
            continue
        dim = p.params.get("dim") or 4096
        assert 2 * dim * (p.params.get("vocab_size") or 512) <= MAX_PARAMETERS
    assert refused > 20
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({**base, "dim": 1 << 20, "vocab_size": 1 << 20}))
    with pytest.raises(BuildError, match="parameters; bundlerun builds up to"):
        plan("llm:llama3", "fp32", LlmOptions(params=huge))


def test_text_prompts_go_through_the_tokenizer_and_are_shown_decoded(tmp_path):
    """--tokenizer + --prompt: the prompt's token ids come from pytorch_tokenizers (here a small BPE
    tokenizer.json trained on the spot with HF tokenizers) and the decoded text is what the manifest shows."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from bundlerun.bundles.llm_build import _prompts

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["Once upon a time there was a tiny llama"] * 20,
                            trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    opts = LlmOptions(tokenizer=path, prompts=["Once upon a time", "a tiny llama"])
    p = plan("llm:llama3", "fp32", opts)
    ids, shown, digest = _prompts(p, opts, 0)
    assert ids[0] == tok.encode("Once upon a time").ids and shown == ["Once upon a time", "a tiny llama"]
    assert digest and len(digest) == 64
    long = LlmOptions(tokenizer=path, prompts=["llama " * 80])
    with pytest.raises(BuildError, match="must fit in max_seq_len - 1 = 63"):
        _prompts(plan("llm:llama3", "fp32", long), long, 0)
