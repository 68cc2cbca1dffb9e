"""`bundlerun bisect`: which delegated node makes a case fail, on targets that cannot dump it.

A delegate that returns only its final outputs (a QNN context binary, a Vulkan subgraph, an
XNNPACK runtime, a TOSA graph on a device) cannot be debugged layer by layer. Its *lowering* can be
controlled, though: the model is re-lowered with the delegate restricted to a subset of the nodes
its partitioner took (bundles/partition_control.py: by exported-program node, the same mechanism
on every recipe), each candidate is built (through the build cache) and its failing case run on
the same target, and the delegated node list is bisected.

The search (`minimal_failing`): the units (exported-program nodes) the delegate took, in
topological order. Known: delegating all of them fails, delegating none passes (checked first; a
case that fails with nothing delegated is the portable kernels' or the model's, and is reported
as such without bisecting). A binary search finds the shortest failing prefix; its last unit is a
culprit. If delegating the culprits found so far fails on its own, that is the answer: one
culprit in ceil(log2 n) + 1 runs. Otherwise the failure needs an earlier unit too (interacting
culprits: a wrong layout handed between two delegated nodes, a fused pattern): the search repeats
over the units before the culprit, with the culprits found kept delegated, each further member
costing another ceil(log2 n) + 1. Finally everything *except* the culprit set is delegated: if
that still fails there is an independent culprit, and the search runs again over the rest
(bounded by --max-lowerings). Every candidate is memoized by its set of delegated units.

An LLM (`llm:ARCH`, bundles/llm_build.py) is bisected the same way: export_llama builds its XNNPACK
partitioners itself, but hands them to the `to_edge_transform_and_lower` its builder imports, which the
restriction wraps. Its cases are stateful sequences (a KV cache in the program): without --case the
full build runs every case and the first diverging step of the first failing sequence is bisected;
every candidate then runs that step's sequence prefix first on the same loaded method (a decode step
on a fresh cache is not the step that failed), and only that step is judged.

Predicate: a candidate fails when the judged output(s) of the case FAIL (numerics), judged with
the bundle's own criteria. When the full build's case ended ERROR / TIMEOUT (a crash) instead,
those count as failing (a crash bisection). A candidate that cannot be built, or whose run errors
in a numerics bisection, stops the search (exit 2) with what was found so far.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from bundlerun.bundles.errors import BundlerunError
from bundlerun.runner.judging.stats_records import OutputStats
from bundlerun.targets import lowering_info
from bundlerun.targets.base import Verdict
from bundlerun.bundles import limits, partition_control
from bundlerun.bundles.partition_control import MECHANISM
from bundlerun.runner import interrupts
from bundlerun.bundles.sequence import first_failing_step, from_manifest, sequence_prefix

SCHEMA = "bundlerun.bisect/1"
# Failure kinds (targets/failures.py) that say the case could not be run at all - not a crash of the
# program a bisection could localize: the search stops there (exit 2).
NOT_BISECTABLE = ("bad-bundle", "unsupported", "bad-config", "tool-missing", "tool-failed", "transport",
                  "auth-refused", "host-key", "version-mismatch", "device-full", "device-busy", "interrupted",
                  "not-run", "missing-backend", "missing-operator")


class BisectError(BundlerunError):
    """The bisection could not run (the full build failed, the target could not run it, ...)."""


class BisectStopped(Exception):
    """A candidate could not be decided (its build or run failed): the search stops there."""


@dataclass
class Step:
    """One re-lowering and its run."""

    index: int
    role: str  # "all" | "none" | "search" | "culprits" | "all-but-culprits"
    delegated: list[str]  # unit keys delegated in this candidate
    verdict: str | None = None  # the judged outputs' worst verdict (PASS/FAIL/ERROR/TIMEOUT), None when not run
    failing: bool | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)  # name, verdict, stats (sqnr, error_max, ...), failed
    error: str | None = None
    error_kind: str | None = None
    target: str | None = None  # where it ran (the undelegated build may run elsewhere, see BisectRequest)
    cache: str | None = None  # build cache: hit / miss / off
    delegate_calls: int | None = None
    bundle: str | None = None
    report: str | None = None
    build_s: float | None = None
    run_s: float | None = None


@dataclass
class BisectRequest:
    model: str
    target: str
    report_dir: Path
    case: int | None = None  # None: 0, or for an LLM the first diverging step of the full build's run
    method: str = "forward"
    output: str | None = None  # judge only this output (default: every output)
    backend: str | None = None
    dtype: str | None = None
    cases: int = 8
    seed: int = 0
    reference: str | None = None
    distribution: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    cache: bool = True
    timeout_s: float = 120.0
    max_lowerings: int | None = None  # default: bound(n) for up to four culprit nodes
    target_config: dict[str, Any] = field(default_factory=dict)
    # Where the build with nothing delegated runs: the target itself, unless it refuses a program
    # without its delegate (FailureKind UNSUPPORTED, as qnn://htp-sim does): then this URL runs it
    # (default host://portable: the same ExecuTorch portable kernels on this host), said in the report.
    undelegated_target: str = "host://portable"
    llm: Any = None  # bundles/llm_build.LlmOptions for an llm:ARCH model (size, params, checkpoint, ...)


@dataclass
class BisectResult:
    model: str
    target: str
    backend: str | None
    dtype: str | None
    method: str
    case: int | None
    output: str | None
    mechanism: str
    outcome: str  # "culprit" | "fails-undelegated" | "nothing-fails" | "nothing-delegated" | "stopped" | "interrupted"
    units: list[dict[str, Any]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    culprits: list[dict[str, Any]] = field(default_factory=list)  # culprit sets: {"units", "interacting", ...}
    failure_mode: str | None = None  # "numerics" | "crash"
    bound: int | None = None
    budget: int | None = None
    notes: list[str] = field(default_factory=list)
    export_divergence: dict[str, Any] | None = None
    interrupted: str | None = None
    # a step of a stateful sequence: {"name", "step", "kind", "start_pos", "prefix": [cases run first], "chosen"}
    sequence: dict[str, Any] | None = None
    # an LLM: the delegated nodes that are not a layer with weights, delegated in every candidate (not searched)
    pinned: list[dict[str, Any]] = field(default_factory=list)

    @property
    def lowerings(self) -> int:
        return len(self.steps)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return interrupts.exit_code()
        return {"culprit": 1, "fails-undelegated": 1, "nothing-fails": 0}.get(self.outcome, 2)

    def to_json(self) -> dict[str, Any]:
        from bundlerun.runner.judging.numerics import _clean  # start-up: loads numpy on use

        body = asdict(self)
        body["lowerings"] = self.lowerings
        body["exit_code"] = self.exit_code
        return {"schema": SCHEMA, **_clean(body)}


def check_request(req: BisectRequest) -> None:
    """Every option that could make the baseline unrunnable, checked before any lowering: a bad
    one is a one-line BisectError (exit 2), never a wrong answer ("fails with nothing delegated"
    for a timeout of nan) found after minutes of builds."""
    from bundlerun.bundles.inputs import check_distribution  # start-up: loads numpy on use

    from bundlerun.bundles.llm_build import is_llm  # start-up: loads numpy on use

    llm = isinstance(req.model, str) and is_llm(req.model)
    if req.llm is not None and not llm:
        raise BisectError(f"{req.model}: --size/--params/--checkpoint/... are for llm:ARCH models only")
    try:
        limits.seconds(req.timeout_s, "--timeout")
        if req.case is not None:
            limits.count(req.case, "--case", 0, limits.MAX_CASES - 1)
        limits.count(req.cases, "--cases", 1, limits.MAX_CASES)
        if req.case is not None and req.case >= req.cases and not llm:  # an LLM's cases are its sequences' steps
            raise BisectError(f"--case {req.case}: the candidates bundle cases 0-{req.cases - 1} (--cases {req.cases})")
        if req.max_lowerings is not None:
            limits.count(req.max_lowerings, "--max-lowerings", 2, 10_000)
        if req.distribution is not None:
            check_distribution(req.distribution, "--distribution")
        for what, value in (("--method", req.method), ("--output", req.output)):
            if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
                raise BisectError(f"{what}: expected a name, got {str(value)[:40]!r}")
    except BisectError:
        raise
    except BundlerunError as exc:
        raise BisectError(str(exc)) from None


def search_bound(n: int, culprit_nodes: int = 1) -> int:
    """Lowerings for `culprit_nodes` culprits among `n` delegated units: the full build and the
    undelegated one, then per culprit node a binary search (ceil(log2 n)) and the check that the
    culprits found fail alone, then the build with everything but the culprits."""
    per = max(1, math.ceil(math.log2(max(n, 2)))) + 1
    return 3 + culprit_nodes * per


def minimal_failing(universe: list[str], fails: Callable[[list[str]], bool]) -> list[str]:
    """The culprit set within `universe` (topological order), given fails(universe) and not fails([]).

    Invariant: fails(core + cands). Each round binary-searches the shortest failing prefix of
    `cands` (with `core` delegated), takes its last unit into `core` and keeps the units before
    it as candidates, until `core` fails on its own."""
    core: list[str] = []
    cands = list(universe)
    while cands:
        if core and fails(core):
            break
        lo, hi = 0, len(cands)  # fails(core + cands[:hi]) holds, fails(core + cands[:lo]) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails(core + cands[:mid]):
                hi = mid
            else:
                lo = mid
        core.append(cands[hi - 1])
        cands = cands[:hi - 1]
    order = {key: i for i, key in enumerate(universe)}
    return sorted(core, key=order.get)


class Bisector:
    """Builds and runs the candidates of one bisection (memoized by their delegated set)."""

    def __init__(self, req: BisectRequest, session: Any, progress: Callable[[str], None] | None = None) -> None:
        self.req = req
        self.session = session
        self.say = progress or (lambda _m: None)
        self.memo: dict[frozenset[str] | None, Step] = {}
        self.result: BisectResult | None = None
        self.model = None
        self.order: dict[str, int] = {}
        self.t0 = time.monotonic()
        from bundlerun.bundles.llm_build import is_llm  # start-up: loads numpy on use

        self.llm = isinstance(req.model, str) and is_llm(req.model)
        # the case judged and the cases run before it on the same loaded method (a sequence's earlier
        # steps); None until the full build's run chose it (an LLM without --case)
        self.case: int | None = req.case if req.case is not None or self.llm else 0
        self.prefix: list[int] = []
        self.pinned_roots: frozenset[str] = frozenset()

    # ---------------------------------------------------------------- one candidate

    def _build(self, step: Step, allowed: frozenset[str] | None, folder: Path):
        from bundlerun.bundles.builder import BuildRequest, build_bundle  # start-up: loads flatbuffers, numpy, tomli on use

        req = self.req
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / "candidate.bpte"
        t = time.monotonic()
        roots = None if allowed is None else frozenset(r for u in self.result.units if u["key"] in allowed
                                                      for r in u.get("roots") or [u["key"]]) | self.pinned_roots
        previous = logging.root.manager.disable
        logging.disable(max(previous, logging.INFO))  # partitioners log every decision at INFO
        try:
            with partition_control.restricting(partition_control.Restriction(roots, str(folder / "partition.json"))):
                built = build_bundle(BuildRequest(
                    model=req.model, output=out, backend=req.backend, target=req.target,
                    target_info=lowering_info(req.target), dtype=req.dtype,
                    cases=req.cases, seed=req.seed, reference=req.reference, distribution=req.distribution,
                    overrides=dict(req.overrides), resolved_model=self.model, registry=self.session.registry,
                    cache=req.cache, llm=req.llm))
        finally:
            logging.disable(previous)
        step.build_s = time.monotonic() - t
        step.cache = built.info.get("cache", "off") if req.cache else "off"
        lowering = built.manifest.build.lowering or {}
        step.delegate_calls = lowering.get("delegate_calls")
        step.bundle = str(out)
        return built, (lowering.get("partition_control") or {})

    def _run(self, step: Step, bundle_path: Path, folder: Path, target: str | None = None) -> None:
        from bundlerun.runner.report.record import write_record  # start-up: loads numpy on use
        from bundlerun.runner.session import RunRequest  # start-up: loads flatbuffers, numpy on use

        req = self.req
        t = time.monotonic()
        target = target or req.target
        step.target = target
        config = dict(req.target_config) if target == req.target else self.session.target_config(target)
        # a sequence step runs after its prefix on the same loaded method; an LLM without --case runs
        # every case once (the full build), to choose its first diverging step
        cases = None if self.case is None else [*self.prefix, self.case]
        run_req = RunRequest(bundle_path=bundle_path, target=target, report_dir=folder, case_timeout_s=req.timeout_s,
                             methods=[req.method], cases=cases, target_config=config)
        report = self.session.execute(run_req)  # the session's open targets and warm workers
        write_record(report, folder)
        step.run_s = time.monotonic() - t
        step.report = str(folder / "report.json")
        if report.summary.interrupted:  # the run kept its report; the bisection stops too
            raise KeyboardInterrupt
        if self.case is None:
            self._choose_step(report, bundle_path)
        case = next((c for c in report.cases if c.method == req.method and c.case == self.case), None)
        if case is None:
            raise BisectStopped(f"the run of step {step.index} has no {req.method}[{self.case}]")
        outs = [o for o in case.outputs if req.output is None or o.name == req.output]
        if req.output is not None and not outs and case.outputs:  # a typo must not read as "nothing fails"
            raise BisectStopped(f"--output {req.output!r}: {req.method}[{self.case}] has no such output (its outputs: "
                                f"{', '.join(o.name for o in case.outputs)})")
        step.outputs = [{"name": o.name, "verdict": o.verdict, "stats": _brief(o.stats),
                         "failed": [f.detail or f.criterion for f in o.failed]}
                        for o in outs]
        verdicts = [o.verdict for o in outs] or [case.verdict]
        step.verdict = next((v for v in (Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT) if v in verdicts), verdicts[0])
        step.error = str(case.error) if case.error else None
        step.error_kind = case.error_kind.value if case.error_kind else None

    def _choose_step(self, report: Any, bundle_path: Path) -> None:
        """An LLM without --case: the first diverging step of the full build's run (step order, first
        sequence first: later steps inherit the damage through the cache), else its first case."""
        from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers, numpy on use

        req = self.req
        bad = (Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT)
        failing = {c.case for c in report.cases if c.method == req.method and (c.verdict in (Verdict.ERROR, Verdict.TIMEOUT)
                   or any(o.verdict in bad and (req.output is None or o.name == req.output) for o in c.outputs))}
        sequences = from_manifest(read_bundle(bundle_path).manifest)
        first = first_failing_step(sequences, req.method, failing)
        if first is None and failing:
            first = min(failing)
        self.case = first if first is not None else min((c.case for c in report.cases if c.method == req.method),
                                                        default=0)
        assert self.result is not None
        self.result.case = self.case
        if first is not None:
            self.result.notes.append(f"{req.method}[{self.case}] is the first diverging step of the full build's run "
                                     f"(cases failing: {len(failing)} of {len(report.cases)})")
        self._set_prefix(sequences, chosen=True)

    def _set_prefix(self, sequences: list[Any], chosen: bool) -> None:
        """The sequence holding the case and its earlier steps, run first in every candidate."""

        assert self.result is not None and self.case is not None
        seq, self.prefix = sequence_prefix(sequences, self.req.method, self.case)
        if seq is None:
            return
        step = seq.steps[len(self.prefix)]
        self.result.sequence = {"name": seq.name, "step": len(self.prefix), "kind": step.kind,
                                "start_pos": step.start_pos, "prefix": list(self.prefix), "chosen": chosen}
        if self.prefix:
            self.result.notes.append(
                f"{self.req.method}[{self.case}] is step {len(self.prefix)} of stateful sequence {seq.name!r} ({step.kind} "
                f"at position {step.start_pos}): every candidate runs its {len(self.prefix)} earlier step(s) (cases "
                f"{', '.join(map(str, self.prefix))}) first on the same loaded method; only this step is judged")

    def evaluate(self, role: str, allowed: frozenset[str] | None) -> Step:
        """Build + run one candidate (or return the memoized one)."""
        if allowed in self.memo:
            return self.memo[allowed]
        assert self.result is not None
        if self.result.budget is not None and len(self.result.steps) >= self.result.budget:
            raise BisectStopped(f"--max-lowerings {self.result.budget} reached")
        index = len(self.result.steps)
        delegated = sorted(allowed, key=lambda k: self.order.get(k, 0)) if allowed is not None else \
            [u["key"] for u in self.result.units]
        step = Step(index, role, list(delegated))
        self.result.steps.append(step)
        self.memo[allowed] = step
        folder = Path(self.req.report_dir) / "steps" / f"{index:02d}-{role}"
        n = len(self.result.units)
        self.say(f"[{index + 1}] {role}: " + ("delegating every node the partitioner takes" if allowed is None else
                                             f"delegating {_count(len(delegated), n)} {_span(delegated)}"))
        try:
            built, control = self._build(step, allowed, folder)
        except BundlerunError as exc:
            step.error = f"build failed: {exc}"
            self.say(f"    build failed: {exc}")
            raise BisectStopped(f"step {index} ({role}) could not be built: {exc}") from None
        if allowed is None:  # the full build says which units the delegate takes
            self.result.units = self._searched([u for u in control.get("units") or []])
            self.order = {u["key"]: i for i, u in enumerate(self.result.units)}
            step.delegated = [u["key"] for u in self.result.units]
            if self.case is not None and self.llm:  # --case on an LLM: its prefix, from the built sequences
                self._given_case(built)
        self._run(step, built.path, folder)
        if (allowed == frozenset() and step.verdict == Verdict.ERROR and step.error_kind == "unsupported"
                and self.req.undelegated_target and self.req.undelegated_target != self.req.target):
            self.result.notes.append(f"{self.req.target} refuses a program with nothing delegated ({step.error}); "
                                     f"that build ran on {self.req.undelegated_target} (the same ExecuTorch portable "
                                     "kernels, on this host)")
            self.say(f"    {self.req.target} refuses it: running it on {self.req.undelegated_target}")
            self._run(step, built.path, folder / "undelegated", self.req.undelegated_target)
        step.failing = self._is_failing(step)
        self.say(f"    {step.verdict}{_stats_text(step)} (build {step.build_s:.1f} s, {step.cache}; run "
                 f"{step.run_s:.1f} s)")
        return step

    def _searched(self, units: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The units the search takes apart. An LLM's: its delegated layers with weights (the linears;
        QNN's static llama has them as 1x1 convolutions), the rest (norms, rope, attention, the KV cache's
        update and read) delegated in every candidate. A lane whose delegate takes the whole forward keeps
        the cache inside it (export_llama's Vulkan and MLX programs: llama::update_cache and custom_sdpa
        delegated, and the lavapipe runner links no LLM custom-op kernels, firmware_scripts/vulkan/
        build_vulkan_runner.sh), so a candidate that left them out would not run; a layer left out runs
        on the portable kernels as permute_copy + mm/addmm (or convolution) beside the delegate."""
        assert self.result is not None
        if not self.llm:
            return units
        layers = [u for u in units if _is_layer(u)]
        pinned = [u for u in units if not _is_layer(u)]
        if not layers or not pinned:
            return units
        self.pinned_roots = frozenset(r for u in pinned for r in u.get("roots") or [u["key"]])
        self.result.pinned = [{"key": u["key"], "op": u.get("op"), "module": u.get("module")} for u in pinned]
        self.result.notes.append(
            f"the delegate took {len(units)} node group(s): bisect searches its {len(layers)} layer(s) with weights "
            f"(linears / 1x1 convolutions); the other {len(pinned)} (norms, rope, attention, the KV cache's update "
            "and read) stay delegated in every candidate")
        return layers

    def _given_case(self, built: Any) -> None:
        from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers, numpy on use

        assert self.case is not None
        suite_cases = len(read_bundle(built.path).suite(self.req.method).test_cases)
        if self.case >= suite_cases:
            raise BisectStopped(f"--case {self.case}: {self.req.model} bundles cases 0-{suite_cases - 1} "
                                "(its sequences' steps)")
        self._set_prefix(from_manifest(built.manifest), chosen=False)

    def _is_failing(self, step: Step) -> bool:
        assert self.result is not None
        if step.verdict == Verdict.FAIL:
            return True
        if step.verdict == Verdict.PASS:
            return False
        if self.result.failure_mode == "crash" or self.result.failure_mode is None:
            return True
        raise BisectStopped(f"step {step.index} ({step.role}) ended {step.verdict}: {step.error or 'no detail'}; a "
                            "numerics bisection cannot decide it")

    def fails(self, keys: list[str]) -> bool:
        step = self.evaluate("search" if keys else "none", frozenset(keys))
        return bool(step.failing)

    # ---------------------------------------------------------------- the whole search

    def run(self) -> BisectResult:
        from bundlerun.bundles.model_source import resolve_model  # start-up: loads numpy on use

        req = self.req
        check_request(req)
        self.result = result = BisectResult(model=req.model, target=req.target, backend=req.backend, dtype=req.dtype,
                                            method=req.method, case=req.case, output=req.output, mechanism=MECHANISM,
                                            outcome="stopped")
        if self.llm and req.backend == "qnn":
            result.notes.append("candidates are QNN's static llama (bundles/llm_qnn.py) lowered by the QNN partitioner "
                                "restricted in the AOT child; its KV cache is program I/O, threaded by bundlerun from "
                                "step to step in every candidate's replayed prefix (targets/workers/io_state.py)")
        elif self.llm:
            result.notes.append("candidates are lowered by export_llama without its ConvertToLinearPass "
                                "(extension/llm/export/builder.py:557): a linear left undelegated stays permute_copy + "
                                "addmm/mm, which the portable kernels have (aten::linear is only in the optimized "
                                "library); the delegated linears are lowered as in the full build")
        try:
            if not self.llm:  # an LLM is built by export_llama from its plan (bundles/llm_build.py)
                self.model = resolve_model(req.model, req.distribution)
            full = self.evaluate("all", None)
            n = len(result.units)
            if full.verdict not in (Verdict.FAIL, Verdict.PASS) and (full.error_kind in NOT_BISECTABLE or not full.error_kind):
                raise BisectStopped(f"the full build could not run on {full.target}: {full.error or full.verdict}")
            result.failure_mode = "numerics" if full.verdict in (Verdict.FAIL, Verdict.PASS) else "crash"
            result.bound = search_bound(n)
            result.budget = req.max_lowerings or search_bound(n, 4)
            if not full.failing:
                result.outcome = "nothing-fails"
                return result
            if n == 0:
                result.outcome = "nothing-delegated"
                result.notes.append("the delegate took no node: the failure is the portable kernels' or the model's")
                return result
            none = self.evaluate("none", frozenset())
            if none.failing:
                result.outcome = "fails-undelegated"
                result.notes.append("the case fails with nothing delegated: the cause is in the portable kernels or "
                                    "in the model itself (as exported), not in the delegate")
                return result
            universe = [u["key"] for u in result.units]
            remaining = list(universe)
            while remaining:
                core = minimal_failing(remaining, self.fails)
                alone = self.memo.get(frozenset(core))
                rest = [k for k in universe if k not in {c for s in result.culprits for c in s["keys"]} | set(core)]
                without = self.evaluate("all-but-culprits", frozenset(rest))
                result.culprits.append(self._culprit_set(core, alone, without))
                result.outcome = "culprit"
                if not without.failing:
                    break
                remaining = [k for k in remaining if k not in core]
                result.notes.append(f"delegating everything but culprit set {len(result.culprits)} still fails: "
                                    "searching the rest for an independent culprit")
        except (BisectStopped, BundlerunError) as exc:  # the model factory failed, a step could not run
            result.notes.append(f"stopped: {exc}")
            if result.outcome != "culprit":
                result.outcome = "stopped"
        except KeyboardInterrupt:
            result.interrupted = interrupts.describe()
            result.notes.append(f"{interrupts.describe()} after {len(result.steps)} lowering(s); what was found so far is "
                                "kept")
        return result

    def _culprit_set(self, core: list[str], alone: Step | None, without: Step) -> dict[str, Any]:
        assert self.result is not None
        units = [{**u, "place": unit_place(u, self.result.units)} for u in self.result.units if u["key"] in set(core)]
        return {
            "keys": list(core),
            "units": units,
            "interacting": len(core) > 1,
            "with": {"step": alone.index if alone else None, "delegated": "only these",
                     "verdict": alone.verdict if alone else None, "outputs": alone.outputs if alone else []},
            "without": {"step": without.index, "delegated": "everything else", "verdict": without.verdict,
                        "outputs": without.outputs},
        }


def _is_layer(unit: dict[str, Any]) -> bool:
    """A unit traced from an nn.Linear or nn.Conv2d module (its innermost eager module)."""
    stack = unit.get("module_stack") or []
    kind = str(stack[-1][1]) if stack and len(stack[-1]) > 1 else ""
    return kind.rsplit(".", 1)[-1] in ("Linear", "Conv2d")


def _brief(stats: OutputStats | None) -> dict[str, Any]:
    keys = ("sqnr", "error_max", "error_mae", "cosine_similarity", "mismatch_count", "error_max_steps", "error_mae_steps")
    return {k: getattr(stats, k) for k in keys if getattr(stats, k, None) is not None}


def _count(k: int, n: int) -> str:
    return f"{k} of {n} unit(s)" if n else f"{k} unit(s)"


def _span(keys: list[str]) -> str:
    if not keys:
        return ""
    if len(keys) <= 3:
        return f"({', '.join(keys)})"
    return f"({keys[0]} .. {keys[-1]})"


def _stats_text(step: Step) -> str:
    parts = []
    for out in step.outputs:
        s = out.get("stats") or {}
        bits = []
        if isinstance(s.get("sqnr"), (int, float)):
            bits.append(f"SQNR {s['sqnr']:.1f} dB")
        elif s.get("sqnr") is not None:
            bits.append(f"SQNR {s['sqnr']} dB")
        if isinstance(s.get("error_max"), (int, float)):
            bits.append(f"max |err| {s['error_max']:.3g}")
        if bits:
            parts.append(f"{out.get('name')}: {', '.join(bits)}")
    return f" ({'; '.join(parts)})" if parts else (f" ({step.error})" if step.error else "")


def unit_place(unit: dict[str, Any], units: list[dict[str, Any]]) -> str:
    """Where a unit sits: its eager module stack (`Transformer > layers.1 (TransformerBlock) > feed_forward
    (FeedForward) > w2 (Linear)`) and its place among the delegated units in graph order."""
    parts = []
    parent = ""
    for path, kind in unit.get("module_stack") or []:
        name = path[len(parent) + 1:] if parent and path.startswith(parent + ".") else path
        short = str(kind).rsplit(".", 1)[-1]
        parts.append(f"{name} ({short})" if name else short)
        parent = path
    index = next((i for i, u in enumerate(units) if u.get("key") == unit.get("key")), None)
    where = f"delegated unit {index + 1} of {len(units)} in graph order" if index is not None else ""
    return "; ".join(filter(None, [" > ".join(parts), where]))


def unit_label(unit: dict[str, Any]) -> str:
    """`conv2d_1 = aten.convolution.default in conv2 (Conv2d)`."""
    where = f" in {unit['module']}" if unit.get("module") else ""
    return f"{unit.get('key')} = {unit.get('op')}{where}"
