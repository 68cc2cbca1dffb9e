"""Which runs measure the same thing: the one identity `compare`, `--baseline`, the history's trends,
the HUD's rows and the HTML report's history plot all go by.

A series is one bundle identity on one target in one dtype: the model, the target URL, the dtype, the
test inputs (`bundle.inputs_sha256`: another seed, distribution or case count is another set of
cases) and the criteria the outputs were judged by (`bundle.criteria_sha256`, below: a tolerance
tightened or an `--override` makes a PASS -> FAIL the tolerance's, not the model's). Runs of two
series are never joined in a line, never held against each other, and a culprit ("regressed since
X") is only named within one.

The program (`bundle.program_sha256`) is recorded but is not part of the identity: a new program on
the same inputs and criteria (a new toolchain, a miscompiling backend, the next commit's export) is
exactly the change a series and a comparison exist to show. A model id that differs is forgiven by
`compare` when both runs carry the same inputs (a retrained model on the same inputs is a fair
comparison), but the HUD and the trends keep each model its own row.

A hash a run does not carry (a report written before it was recorded, a suite result) is None:
it matches only None in a series key, and `differences` does not call two runs different over a
hash one of them lacks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

# Where each value came from (bundles/tolerances.py: source and file per criterion): provenance, not
# what an output is judged by, and it names files of the machine that built the bundle.
PROVENANCE = ("trail",)
SHORT = 6  # hex digits of a hash in a series' name: enough to tell a handful of bundles apart at a glance


@dataclass(frozen=True)
class Series:
    """One bundle identity (see the module docstring); hashable, so it keys rows and plot lines."""

    model: str | None
    target: str | None
    dtype: str | None
    inputs: str | None  # bundle.inputs_sha256
    criteria: str | None  # bundle.criteria_sha256

    @property
    def tag(self) -> str:
        """The hashes for people: `in 3fa2c1 · cr 9b01de` (`?` where the run did not record one)."""
        return f"in {(self.inputs or '?')[:SHORT]} · cr {(self.criteria or '?')[:SHORT]}"

    @property
    def name(self) -> str:
        """A short, readable name: `mlp host://xnnpack fp32 in 3fa2c1 · cr 9b01de`."""
        return f"{self.model or '?'} {self.target or '?'} {self.dtype or '?'} {self.tag}"


def criteria_digest(cases: Iterable[Any], methods: set[str] | None = None) -> str | None:
    """sha256 over the criteria every output of every method was judged by (the report's own
    `cases[].outputs[].criteria`: the manifest's resolved tolerances with any `--override` applied;
    the judge records them for errored cases too, runner/judging/judge.py), without their provenance
    trail. One entry per method x output, whichever cases ran, so a run of a subset of the cases
    has the digest of the whole run. `methods` narrows it to those methods (`compare` of a run
    over fewer methods). None: no output carries criteria (a suite result, an empty report)."""
    seen: set[str] = set()
    for case in cases:
        if methods is not None and case.method not in methods:
            continue
        for out in case.outputs:
            criteria = out.criteria_json(copy_trail=False)  # as the report holds it (the trail, left out, uncopied)
            if criteria is not None:
                judged = {k: v for k, v in criteria.items() if k not in PROVENANCE}
                seen.add(json.dumps([case.method, out.index, judged], sort_keys=True, default=str))
    if not seen:
        return None
    return hashlib.sha256("\n".join(sorted(seen)).encode()).hexdigest()


def target_of(report: Report) -> str | None:
    """The target a run ran on: its URL, else what the bundle was built for (the history's `target`)."""
    return report.target.get("url") or report.bundle.get("built_for")


def of_report(report: Report) -> Series:
    """The series of a report. The criteria digest is computed from its cases, which say what was
    judged (a report written before the digest was recorded gets the one it would have had; one
    re-judged with `--override` its new one); the recorded digest only where no case carries criteria."""
    bundle = report.bundle
    criteria = criteria_digest(report.cases) or bundle.get("criteria_sha256")
    return Series(bundle.get("model"), target_of(report), bundle.get("dtype"), bundle.get("inputs_sha256"), criteria)


def of_row(row: Mapping[str, Any] | Any) -> Series:
    """The series of a history row (a RunRecord or a sqlite row with the runs table's columns)."""
    def get(key: str) -> Any:
        if isinstance(row, Mapping):
            return row.get(key)
        if hasattr(row, "keys"):  # sqlite3.Row
            return row[key] if key in row.keys() else None
        return getattr(row, key, None)

    return Series(get("model"), get("target"), get("dtype"), get("inputs_sha256"), get("criteria_sha256"))


def short_repr(v: Any) -> str:
    """A value for a one-line reason: its repr, cut at 60 characters."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "...'"


def differences(base: Series, cur: Series) -> list[str]:
    """Why two runs are not one series, as `compare` words its refusal (empty: they are). A hash
    only one side carries is not a difference; a model id is forgiven on equal inputs."""
    reasons: list[str] = []
    if base.target != cur.target:
        reasons.append(f"target differs (baseline {short_repr(base.target)}, current {short_repr(cur.target)})")
    if base.dtype != cur.dtype:
        reasons.append(f"dtype differs (baseline {short_repr(base.dtype)}, current {short_repr(cur.dtype)})")
    same_inputs = bool(base.inputs and cur.inputs and base.inputs == cur.inputs)
    if base.inputs and cur.inputs and base.inputs != cur.inputs:
        reasons.append(f"different test inputs (inputs sha256 {base.inputs[:12]}... vs {cur.inputs[:12]}...: "
                       "another seed, distribution, case count or dataset)")
    if base.model != cur.model and not same_inputs:
        reasons.append(f"model differs (baseline {short_repr(base.model)}, current {short_repr(cur.model)})")
    if base.criteria and cur.criteria and base.criteria != cur.criteria:
        reasons.append(f"different criteria (criteria sha256 {base.criteria[:12]}... vs {cur.criteria[:12]}...: "
                       "other tolerances or an --override; a verdict would be the tolerance's)")
    return reasons


def tags(keys: Iterable[Series]) -> dict[Series, str]:
    """Each series' tag where it is needed to tell it apart: a series whose model, target and dtype
    no other one shares keeps its short name (""); two bundles of one model on one target in one
    dtype are told apart by their hashes."""
    keys = list(dict.fromkeys(keys))
    count: dict[tuple, int] = {}
    for k in keys:
        count[(k.model, k.target, k.dtype)] = count.get((k.model, k.target, k.dtype), 0) + 1
    return {k: (k.tag if count[(k.model, k.target, k.dtype)] > 1 else "") for k in keys}
