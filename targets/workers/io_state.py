"""Thread a sequence's KV cache through a program's inputs and outputs (`state: "io"`, bundles/sequence.py).

QNN's static llama takes its KV cache as inputs and returns only the new entries as outputs; its
own runner writes each step's new entries into the cache at the step's position before the next
step (examples/qualcomm/oss_scripts/llama/runner/kv_manager.cpp:418-500, `update_key` /
`update_value`). A lane that runs such a sequence does the same here: the first step's cache
inputs are the bundle's (zeros at position 0), every later step's are the cache the target itself
filled. The bundle's own cache inputs for later steps (the eager reference's) are not used: a
step is judged on the state the target produced, as on a device.

Pure numpy, no runtime: a worker hands in arrays (torch tensors share their memory through
`.numpy()`) and gets the inputs to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bundlerun.bundles.sequence import KvLink, SequenceSpec, from_manifest, kv_links


class IoStateError(Exception):
    """A step whose outputs or inputs do not fit the links (the bundle was checked when read:
    this is a program that returned something else than its bundle says)."""


@dataclass
class IoThreader:
    """The cache of the sequence now running, and which case continues it."""

    sequences: list[SequenceSpec]
    links: list[KvLink]
    _owner: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # (method, case) -> (seq, step)
    _state: dict[int, np.ndarray] = field(default_factory=dict)  # input index -> the cache as the target left it
    _next: tuple[int, int] | None = None  # (seq, step) whose inputs the state is ready for
    _threaded: int = 0

    def __post_init__(self) -> None:
        for s, seq in enumerate(self.sequences):
            if seq.state == "io":
                for k, step in enumerate(seq.steps):
                    self._owner[(seq.method, step.case)] = (s, k)

    @classmethod
    def from_manifest(cls, manifest: Any) -> "IoThreader | None":
        """The threader of a manifest with io-state sequences, else None."""

        sequences = [s for s in from_manifest(manifest) if s.state == "io"]
        links = kv_links(manifest)
        return cls(sequences, links) if sequences and links else None

    def inputs_for(self, method: str, case: int, inputs: list[Any]) -> tuple[list[Any], int | None]:
        """The inputs to run (case, as numpy arrays or scalars) and the case whose outputs filled the
        cache (None: the bundle's own inputs, a sequence's first step or a case of no io sequence).
        A later step whose predecessor did not run here (a crash, a selection) gets no threaded state:
        IoStateError."""
        where = self._owner.get((method, case))
        if where is None:
            return inputs, None
        s, k = where
        if k == 0:
            self._state = {link.input: np.array(inputs[link.input], copy=True) for link in self.links}
            self._next = (s, 0)
            return inputs, None
        if self._next != (s, k):
            raise IoStateError(f"step {k} of sequence {self.sequences[s].name!r} (case {case}) runs without the "
                               "state of its previous step in this process")
        fed = list(inputs)
        for index, cache in self._state.items():
            fed[index] = cache
        self._threaded += 1
        return fed, self.sequences[s].steps[k - 1].case

    def after(self, method: str, case: int, outputs: list[np.ndarray]) -> None:
        """Write the step's new entries into the cache, at its start_pos along each link's axis."""
        where = self._owner.get((method, case))
        if where is None:
            return
        s, k = where
        if self._next != (s, k):
            return  # a step that ran on no threaded state leaves none behind
        pos = self.sequences[s].steps[k].start_pos
        for link in self.links:
            if link.output >= len(outputs):
                raise IoStateError(f"the program returned {len(outputs)} outputs; build.llm.kv_io names output "
                                   f"{link.output}")
            new, cache = np.asarray(outputs[link.output]), self._state[link.input]
            n = new.shape[link.axis] if new.ndim > link.axis else -1
            if new.ndim != cache.ndim or n < 0 or pos + n > cache.shape[link.axis] or new.dtype != cache.dtype:
                raise IoStateError(f"output {link.output} {new.dtype}{list(new.shape)} does not fit input "
                                   f"{link.input} {cache.dtype}{list(cache.shape)} at position {pos} along axis {link.axis}")
            index = [slice(None)] * cache.ndim
            index[link.axis] = slice(pos, pos + n)
            cache[tuple(index)] = new
        self._next = (s, k + 1)

    def forget(self) -> None:
        """The step failed: no later step of its sequence gets state."""
        self._next = None

    @property
    def threaded(self) -> int:
        """How many steps ran on state threaded here."""
        return self._threaded
