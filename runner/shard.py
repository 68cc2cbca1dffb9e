"""Stable shard assignment for CI matrices: `--shard i/n` on run, validate and farm.

A shard is `i/n` (1-based: `1/4` ... `4/4`). Which shard a work item lands in depends
only on its key (a string) and, for the balanced form, the full list of keys, never on
Python's per-process `hash()` randomisation, the machine or the order items were listed:
every job of a CI matrix computes the same split.

    in_shard(key, shard)              sha256(key) mod n: stable even when other keys come
                                      and go, but small sets can leave a shard empty
    in_shard(key, shard, keys=ALL)    balanced: the keys ordered by their hash, dealt out
                                      round-robin, so shard sizes differ by at most one
    select(keys, shard)               the balanced form for a whole list (input order kept)

Keys used by bundlerun: `run` shards the cases of one bundle (`case_key(method, index)` =
"forward/3"); `validate` shards models x dtypes (the report folder name, "mlp-fp32"); the
farm shards its jobs by their job key. A sharded report records `shard_record(...)` under
"shard" so `bundlerun merge` can tell overlapping and missing shards apart.

Importing this module is cheap (hashlib only).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from bundlerun.bundles.errors import BundlerunError
from bundlerun.targets.base import Verdict
from bundlerun.bundles.limits import MAX_SHARDS
from bundlerun.runner.judging.outcome import EXIT_PASS, VERDICTS

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report


class ShardError(BundlerunError):
    """A `--shard` value that is not `i/n` with 1 <= i <= n; one line, exit code 2."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


_SHARD = re.compile(r"^\s*(\d{1,18})\s*/\s*(\d{1,18})\s*$")  # bounded: int() of 5,000 digits raises


def parse_shard(text: "str | Shard | None") -> Shard | None:
    """`"2/4"` -> Shard(2, 4); None/"" -> None. 1-based; `0/4` or `5/4` is an error."""
    if text is None or isinstance(text, Shard):
        return text
    if not str(text).strip():
        return None
    m = _SHARD.match(str(text))
    if not m:
        raise ShardError(f"--shard {text!r}: expected I/N, e.g. 2/4 (shard 2 of 4, counted from 1)")
    index, count = int(m.group(1)), int(m.group(2))

    if count > MAX_SHARDS:
        raise ShardError(f"--shard {text!r}: at most {MAX_SHARDS} shards (bundlerun's limit, docs/security.md)")
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"--shard {text!r}: the shard index must be between 1 and {max(count, 1)}")
    return Shard(index, count)


def stable_hash(key: str) -> int:
    """A 64-bit number from sha256(key as UTF-8): the same on every machine and Python."""
    return int.from_bytes(hashlib.sha256(str(key).encode("utf-8")).digest()[:8], "big")


def _ranked(keys: Iterable[str]) -> list[str]:
    return sorted(set(map(str, keys)), key=lambda k: (stable_hash(k), k))


def in_shard(key: str, shard: "str | Shard", keys: Sequence[str] | None = None) -> bool:
    """Does `key` belong to `shard`? Without `keys`: stable_hash(key) mod n. With `keys` (every
    key of the work, which each shard must see identically): the balanced assignment."""
    shard = parse_shard(shard)
    if shard is None:
        return True
    if keys is None:
        return stable_hash(key) % shard.count == shard.index - 1
    ranked = _ranked(keys)
    try:
        return ranked.index(str(key)) % shard.count == shard.index - 1
    except ValueError:
        raise ShardError(f"{key!r} is not one of the keys being sharded") from None


def select(keys: Sequence[str], shard: "str | Shard | None") -> list[str]:
    """The keys of `shard` under the balanced assignment, in their input order."""
    shard = parse_shard(shard)
    if shard is None:
        return list(keys)
    position = {k: i for i, k in enumerate(_ranked(keys))}
    return [k for k in keys if position[str(k)] % shard.count == shard.index - 1]


def assignment(keys: Sequence[str], count: int) -> dict[str, int]:
    """key -> the 1-based shard it lands in (balanced), for every key: for dry runs and merges."""
    return {k: i % count + 1 for i, k in enumerate(_ranked(keys))}


def case_key(method: str, index: int) -> str:
    """The key of one test case of a bundle: `forward/3`."""
    return f"{method}/{int(index)}"


def shard_record(shard: Shard, axis: str, keys: Sequence[str], universe: Sequence[str]) -> dict:
    """What a sharded report carries under "shard": which shard, what it holds, out of what.
    axis: "cases" (run: keys are case keys) or "models" (validate: keys are model-dtype names)."""
    return {"spec": str(shard), "index": shard.index, "count": shard.count, "axis": axis,
            "assignment": "balanced-sha256", "keys": list(keys), "universe": list(universe)}


@dataclass
class RunShardPlan:
    """How `run --shard` runs its part of a bundle: the methods and case indexes to ask the
    target for, the case keys to keep, and the report's "shard" record."""

    shard: Shard
    methods: list[str] | None
    cases: list[int] | None
    keep: list[str]
    record: dict

    @property
    def empty(self) -> bool:
        return not self.keep

    def amend(self, report: "Report") -> None:
        """Session.run's amend hook: keep this shard's cases (a bundle whose methods got different
        index sets ran their union), recompute the summary, record the shard."""
        from bundlerun.runner.judging.judge import summarize  # start-up: not loaded by `bundlerun --help`

        keep = set(self.keep)
        cases = [c for c in report.cases if case_key(c.method, c.case) in keep]
        if len(cases) != len(report.cases):
            before = report.summary
            report.cases = cases
            report.summary = summarize(cases)
            if before.interrupted:
                report.summary.interrupted, report.summary.exit_code = True, before.exit_code
        report.extras["shard"] = self.record


def plan_run_shard(bundle, shard: "str | Shard", methods: list[str] | None = None,
                   cases: list[int] | None = None) -> RunShardPlan:
    """Split the selected cases of `bundle` (after --method/--select) for `shard`."""
    shard = parse_shard(shard)
    universe = [case_key(s.method_name, i) for s in bundle.method_test_suites
                if not methods or s.method_name in methods
                for i in range(len(s.test_cases)) if cases is None or i in cases]
    keep = select(universe, shard)
    by_method: dict[str, list[int]] = {}
    for key in keep:
        method, _, index = key.rpartition("/")
        by_method.setdefault(method, []).append(int(index))
    union = sorted({i for idx in by_method.values() for i in idx})
    return RunShardPlan(shard, list(by_method) or [], union, keep, shard_record(shard, "cases", keep, universe))


def empty_shard_report(bundle_path, bundle, target: str, plan: RunShardPlan, label: str | None = None) -> "Report":
    """The report of a shard that holds no case (more shards than cases): nothing ran, exit 0."""
    import datetime as _dt
    import sys
    import uuid
    from pathlib import Path

    from bundlerun.runner.report.model import Report, Summary  # late: its name is bound otherwise in this module
    from bundlerun.runner.report.record import bundle_section, host_section, target_section, tool_version  # start-up: not loaded by `bundlerun --help`

    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
    return Report(
        summary=Summary(Verdict.SKIP, EXIT_PASS, {v: 0 for v in VERDICTS}, 0, 0), cases=[],
        tool={"name": "bundlerun", "version": tool_version()},
        run={"id": uuid.uuid4().hex, "label": label, "started": now, "finished": now, "duration_s": 0.0,
             "command": sys.argv, "host": host_section()},
        bundle=bundle_section(Path(bundle_path), bundle.manifest, bundle),
        target=target_section(None, target),
        warnings=[f"shard {plan.shard} holds none of the {len(plan.record['universe'])} selected cases; nothing ran"],
        extras={"shard": plan.record},
    )
