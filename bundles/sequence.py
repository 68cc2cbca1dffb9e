"""The cases of a stateful LLM method read as a sequence (docs: LLM_CONTRACT, issue 35).

A sequence names, in order, the test cases of one method that form a prompt and the decode steps
after it: which case each step is, what it feeds and the eager reference's next token. Targets
run them in suite order on one loaded method (the KV cache lives in the program); the judge reads
the steps to give per-step and per-sequence token verdicts. Plain records: the manifest's strict
schema checks the JSON before `from_dict` is called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SequenceStep:
    case: int  # index of the test case in the method's suite (cases run in this order)
    kind: str  # "prompt" | "decode"
    start_pos: int  # the input_pos value of this step
    tokens: list[int]  # the token ids fed at this step (length 1 for a decode step)
    reference_next: int  # eager argmax of the step's last-token logits (the teacher-forced next token)

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "kind": self.kind, "start_pos": self.start_pos, "tokens": list(self.tokens),
                "reference_next": self.reference_next}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SequenceStep":
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

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "method": self.method, "stateful": self.stateful, "mode": self.mode,
                "steps": [s.to_dict() for s in self.steps], "prompt_text": self.prompt_text}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SequenceSpec":
        return cls(name=str(data["name"]), method=str(data["method"]), stateful=bool(data["stateful"]),
                   mode=str(data["mode"]), steps=[SequenceStep.from_dict(s) for s in data.get("steps") or []],
                   prompt_text=data.get("prompt_text"))
