"""Stateful sequences of an LLM bundle (docs/llm.md; the contract in LLM_CONTRACT.md).

An exported LLM keeps its KV cache in the program (mutable buffers), so its test cases are not
independent: a decode step is only right after the prompt and the steps before it ran on the
same loaded method. `Manifest.sequences` names, per sequence, which cases form it and in which
order, what token ids each step feeds at which position and the eager reference's next token.
Readers (targets/, runner/) use `stateful_prefix_problem` to refuse a run that would execute a
decode step on a fresh cache.

A sequence's state lives either in the program (`state: "program"`, export_llama's mutable KV
buffers) or in its inputs and outputs (`state: "io"`, QNN's static llama: the KV cache is a set of
program inputs and each step returns the new entries as outputs). For "io" the manifest's
`build.llm.kv_io` lists which output feeds which input (`KvLink`): a lane that runs the sequence
writes each listed output of a step into its input at the step's start_pos along `axis` before the
next step, as QNN's own runner does (examples/qualcomm/oss_scripts/llama/runner/kv_manager.cpp:418-500,
`update_key`/`update_value`, smart mask). The bundle's own inputs for those caches are the eager
reference's, so a plain BundledProgram consumer still runs every step; bundlerun feeds the target's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bundlerun.bundles.manifest import Manifest

KINDS = ("prompt", "decode")
MODES = ("teacher-forced", "greedy")
STATES = ("program", "io")  # where a stateful sequence's KV cache lives (see the module docstring)
MAX_KV_LINKS = 4096  # bundlerun's own bound: 2 links a layer, far above any model's layer count


@dataclass(frozen=True)
class KvLink:
    """One entry of `build.llm.kv_io`: output `output` of a step is written into input `input` of the
    next step, at the step's start_pos along `axis` (its extent along `axis` is the tokens it wrote)."""

    output: int
    input: int
    axis: int

    def to_dict(self) -> dict[str, int]:
        return {"output": self.output, "input": self.input, "axis": self.axis}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "KvLink":
        """From a dict already checked by `validate_manifest`."""
        return cls(output=int(data["output"]), input=int(data["input"]), axis=int(data["axis"]))


def kv_links(manifest: "Manifest | dict[str, Any] | None") -> list[KvLink]:
    """The manifest's `build.llm.kv_io` ([] when it has none)."""
    if manifest is None:
        return []
    if isinstance(manifest, dict):  # the manifest as stored (manifest_json)
        build = manifest.get("build")
        llm = build.get("llm") if isinstance(build, dict) else None
        links = llm.get("kv_io") if isinstance(llm, dict) else None
    else:  # the typed Manifest: build.llm is an LlmBuild (bundles/manifest_records.py)
        llm = manifest.build.llm
        links = llm.kv_io if llm is not None else None
    return [KvLink.from_dict(d) for d in links or []]


def kv_link_problem(links: list[KvLink], inputs: list[tuple[str, list[int]] | None],
                    outputs: list[tuple[str, list[int]] | None], start_pos: int) -> str | None:
    """Why `links` cannot thread a step with these inputs/outputs ((dtype, sizes) per value, None for a
    non-tensor) that writes at `start_pos`, or None. The same check for every reader, torch-free."""
    seen: set[int] = set()
    for n, link in enumerate(links):
        where = f"build.llm.kv_io[{n}]"
        if not 0 <= link.output < len(outputs) or outputs[link.output] is None:
            return f"{where} names output {link.output}, but a step returns {len(outputs)} outputs"
        if not 0 <= link.input < len(inputs) or inputs[link.input] is None:
            return f"{where} names input {link.input}, but a step takes {len(inputs)} inputs"
        if link.input in seen:
            return f"{where}: input {link.input} is fed by two outputs"
        seen.add(link.input)
        (out_dtype, out), (in_dtype, inp) = outputs[link.output], inputs[link.input]  # type: ignore[misc]
        if out_dtype != in_dtype:
            return f"{where}: output {link.output} is {out_dtype}, input {link.input} is {in_dtype}"
        if len(out) != len(inp) or not 0 <= link.axis < len(inp):
            return (f"{where}: output {link.output} {out} and input {link.input} {inp} have no common axis "
                    f"{link.axis}")
        if any(o != i for d, (o, i) in enumerate(zip(out, inp)) if d != link.axis):
            return f"{where}: output {link.output} {out} does not fit input {link.input} {inp} off axis {link.axis}"
        if start_pos + out[link.axis] > inp[link.axis]:
            return (f"{where}: a step at position {start_pos} writes {out[link.axis]} entries into input "
                    f"{link.input}, which holds {inp[link.axis]} along axis {link.axis}")
    return None


@dataclass
class SequenceStep:
    case: int  # index of the test case in the method's suite (cases run in this order)
    kind: str  # "prompt" | "decode"
    start_pos: int  # the input_pos value of this step
    tokens: list[int]  # the token ids fed at this step (length 1 for a decode step)
    reference_next: int  # eager argmax of the step's last-token logits (the teacher-forced next token)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SequenceStep":
        """From a dict already checked by `validate_manifest`."""
        return cls(case=int(data["case"]), kind=str(data["kind"]), start_pos=int(data["start_pos"]),
                   tokens=[int(t) for t in data["tokens"]], reference_next=int(data["reference_next"]))


@dataclass
class SequenceSpec:
    name: str  # e.g. "seq0"
    method: str  # "forward"
    stateful: bool  # True: the KV cache lives in the program (mutable buffers); order matters
    mode: str  # "teacher-forced" | "greedy"
    steps: list[SequenceStep] = field(default_factory=list)
    prompt_text: str | None = None  # decoded prompt when a tokenizer was used
    state: str = "program"  # "program": mutable buffers; "io": inputs/outputs threaded (build.llm.kv_io)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "method": self.method, "stateful": self.stateful,
                               "mode": self.mode, "steps": [s.to_dict() for s in self.steps]}
        if self.prompt_text is not None:
            out["prompt_text"] = self.prompt_text
        if self.state != "program":  # written only when not the default: older bundles stay byte-identical
            out["state"] = self.state
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SequenceSpec":
        """From a dict already checked by `validate_manifest`."""
        return cls(name=str(data["name"]), method=str(data["method"]), stateful=bool(data["stateful"]),
                   mode=str(data["mode"]), steps=[SequenceStep.from_dict(s) for s in data["steps"]],
                   prompt_text=data.get("prompt_text"), state=str(data.get("state", "program")))

    @property
    def cases(self) -> list[int]:
        return [s.case for s in self.steps]


def from_manifest(manifest: Manifest | dict[str, Any] | None) -> list[SequenceSpec]:
    """The sequences of a typed manifest, or of a (validated) manifest dict; [] for every bundle
    made without them."""
    if manifest is None:
        return []
    if isinstance(manifest, dict):
        return [SequenceSpec.from_dict(s) for s in manifest.get("sequences") or []]
    return list(manifest.sequences)


def stateful_methods(sequences: list[SequenceSpec]) -> set[str]:
    return {s.method for s in sequences if s.stateful}


def stateful_prefix_problem(sequences: list[SequenceSpec], pairs: list[tuple[str, int]]) -> str | None:
    """Why running `pairs` (method, case) in this order would judge a step of a stateful sequence
    on a cache its prefix did not fill, or None. Of every stateful sequence, the cases a run holds
    must be a prefix of its steps, run in step order on one loaded method. (Sequences are
    independent of each other: each starts with a prompt at position 0 and attends only to the
    positions below its own, which it wrote itself.)"""
    order = {pair: i for i, pair in enumerate(pairs)}
    for seq in sequences:
        if not seq.stateful:
            continue
        held = [(seq.method, c) in order for c in seq.cases]
        if not any(held):
            continue
        if seq.steps and not held[0] or any(later and not earlier for earlier, later in zip(held, held[1:])):
            gap = next(i for i, h in enumerate(held) if not h)
            return (f"sequence {seq.name!r} of method {seq.method!r} carries a KV cache: its step {gap} (case "
                    f"{seq.steps[gap].case}) is not selected, so a later step would run on a cache it did not "
                    "fill; select whole sequences (or a prefix of one), or every case")
        positions = [order[(seq.method, c)] for c, h in zip(seq.cases, held) if h]
        if positions != sorted(positions):
            return f"sequence {seq.name!r} of method {seq.method!r} carries a KV cache: its cases must run in step order"
    return None


def sequence_prefix(sequences: list[SequenceSpec], method: str, case: int) -> tuple[SequenceSpec | None, list[int]]:
    """The stateful sequence that holds (method, case) and the cases of its earlier steps, in step order
    (what must run on the same loaded method before that case); (None, []) for a case of no such sequence."""
    for seq in sequences:
        if seq.stateful and seq.method == method and case in seq.cases:
            return seq, seq.cases[: seq.cases.index(case)]
    return None, []


def first_failing_step(sequences: list[SequenceSpec], method: str, failing: set[int]) -> int | None:
    """The first step (in step order, sequences in manifest order) whose case is in `failing`: where a
    sequence first diverges, which later steps inherit through the cache."""
    for seq in sequences:
        if seq.method != method:
            continue
        for c in seq.cases:
            if c in failing:
                return c
    return None


def sequence_set_digest(manifest: Manifest | None) -> str | None:
    """One bundle-set's fingerprint: the model id, its params, weights and tokenizer (`build.llm`), the
    seed, and each sequence's prompt tokens (its `prompt` steps' tokens in order: export_llama feeds a
    prompt in one step, QNN's static llama one token a step, the same tokens either way). Bundles of one
    model lowered for different lanes share it, so `bundlerun compare` lines their steps up; None
    without sequences."""
    import hashlib
    import json

    sequences = from_manifest(manifest)
    if manifest is None or not sequences:
        return None
    llm = manifest.build.llm
    material = {
        "model": manifest.model.id, "seed": manifest.build.seed,
        "params": llm.params if llm is not None else None, "weights": llm.weights if llm is not None else None,
        "tokenizer": llm.tokenizer if llm is not None else None,
        "prompts": [[t for s in seq.steps if s.kind == "prompt" for t in s.tokens] for seq in sequences],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()
