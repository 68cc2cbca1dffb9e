"""Refuse a run that would judge a step of a stateful sequence on state its prefix did not leave.

An LLM bundle's cases form sequences whose KV cache lives in the program (bundles/sequence.py).
A lane runs them right only when it keeps one loaded method across the cases, in suite order, and
the run holds each sequence from its first step: otherwise a decode step would run on a fresh cache
and be misjudged. Such a run is refused with one line (ConfigError: every case ERROR, kind
bad-config, exit 2) before anything runs.
"""

from __future__ import annotations

from typing import Any

from bundlerun.bundles.errors import BundlerunError, ConfigError
from bundlerun.bundles.sequence import from_manifest, stateful_prefix_problem
from bundlerun.targets import TargetURL, resolve_target


def refusal(target_url: "str | TargetURL", bundle: Any, pairs: list[tuple[str, int]]) -> ConfigError | None:
    """Why `target_url` must not run `pairs` of `bundle`, or None (also for every bundle without sequences)."""
    sequences = [s for s in from_manifest(bundle.manifest) if s.stateful]
    if not sequences or not pairs:
        return None
    try:
        spec = resolve_target(target_url).declared
    except BundlerunError:
        return None  # the run reports the bad URL itself
    if not spec.stateful:
        return ConfigError(f"{target_url} cannot keep one loaded method across test cases, and this bundle's "
                           f"{len(sequences)} sequence(s) carry a KV cache from step to step: refused rather than "
                           "judging decode steps on a fresh cache (run it on a lane that keeps state, e.g. host://xnnpack)")
    io = [s for s in sequences if s.state == "io"]
    if io and not spec.io_state:
        return ConfigError(f"{target_url} cannot thread a KV cache from a step's outputs into the next step's inputs, "
                           f"and this bundle's {len(io)} sequence(s) keep their cache there (state io, build.llm.kv_io): "
                           "refused rather than running decode steps on the bundle's own cache (run it on qnn://htp-sim "
                           "or host://)")
    problem = stateful_prefix_problem(sequences, pairs)
    return ConfigError(problem) if problem else None
