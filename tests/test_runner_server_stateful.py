"""A stateful sequence (the LLM contract's manifest `sequences`) on the executor_runner lanes
(targets/et_runner/server.py): its cases run in suite order on one loaded method, or not at all.

Pure Python: the serve and one-case paths are recording functions here (what is under test is which
of them run_cases calls, and what it refuses before calling any); the real runner's side is
tests/test_qemu_user_llm.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite
from bundlerun.bundles.errors import ManifestError, TargetError
from bundlerun.bundles.manifest import Criteria, Manifest, MethodManifest, OutputSpec
from bundlerun.bundles.sequence import SequenceSpec, SequenceStep
from bundlerun.targets.base import CaseResult, CaseStatus, RunOptions, TargetRun
from bundlerun.targets.et_runner import server
from bundlerun.targets.failures import FailureKind


def _manifest(n: int, stateful: bool) -> dict:
    """A valid manifest whose one sequence is a prompt then n-1 decode steps of `forward`."""
    steps = [SequenceStep(i, "prompt" if i == 0 else "decode", 0 if i == 0 else 2 + i, [1, 2, 3] if i == 0 else [1], 1)
             for i in range(n)]
    out = OutputSpec("out0", "float32", [1, 2], Criteria(atol=1e-3))
    return Manifest(model={"id": "llm:llama3", "source": "test"}, build={"cases": n}, versions={},
                    methods={"forward": MethodManifest("forward", [], [out])},
                    sequences=[SequenceSpec("seq0", "forward", stateful, "teacher-forced", steps)]).to_dict()


def _bundle(n: int = 5, stateful: bool = True) -> Bundle:
    case = BundledTestCase([BundledValue("int", scalar=1)], [BundledValue.from_array([[0.0, 1.0]])])
    return Bundle(program=b"", method_test_suites=[MethodTestSuite("forward", [case] * n)],
                  manifest_json=_manifest(n, stateful))


def _run(bundle: Bundle, tmp_path: Path, one_case: str | None = None, cases: list[int] | None = None,
         left: int = 0, bundled: bool = True):
    served: list[list[int]] = []
    alone: list[int] = []
    run = TargetRun("test://", [])

    def serve_fn(method: str, indices: list[int]) -> list[int]:
        served.append(indices)
        return indices[len(indices) - left:] if left else []

    def alone_fn(method: str, index: int) -> CaseResult:
        alone.append(index)
        return CaseResult(method=method, case_index=index, status=CaseStatus.OK)

    server.run_cases(bundle, RunOptions(work_dir=tmp_path, cases=cases), run, one_case, serve_fn, alone_fn,
                     bundled=bundled)
    return run, served, alone


def test_stateful_methods_come_from_the_manifest_sequences():
    assert server.stateful_methods(_bundle()) == {"forward"}
    assert server.stateful_methods(_bundle(stateful=False)) == set()
    assert server.stateful_methods(Bundle(b"", [], manifest_json=None)) == set()
    hostile = _manifest(5, True)
    hostile["sequences"] = [1, {"method": 3, "stateful": True}, {"stateful": "yes"}]
    with pytest.raises(ManifestError) as exc:  # the manifest's strict schema refuses it before any lane reads it
        server.stateful_methods(Bundle(b"", [], manifest_json=hostile))
    assert "\n" not in str(exc.value)


def test_a_stateful_sequence_is_served_whole_on_one_method(tmp_path):
    run, served, alone = _run(_bundle(), tmp_path)
    assert served == [[0, 1, 2, 3, 4]] and alone == []


@pytest.mark.parametrize("why", ["server=false", "etdump: one ETDump per process"])
def test_a_lane_that_runs_a_process_per_case_is_refused_before_anything_runs(tmp_path, why):
    with pytest.raises(TargetError) as exc:
        _run(_bundle(), tmp_path, one_case=why)
    assert exc.value.kind == "bad-config" and why in str(exc.value) and "\n" not in str(exc.value)
    assert "fresh method" in str(exc.value)


def test_a_selection_that_drops_part_of_the_sequence_is_refused(tmp_path):
    with pytest.raises(TargetError, match="selection of 2") as exc:
        _run(_bundle(), tmp_path, cases=[3, 4])
    assert exc.value.kind == "bad-config"


def test_inputs_the_files_cannot_carry_are_refused_without_bundled_serving(tmp_path):
    # the --inputs files carry an int input only as the program declares it; this "program" declares none
    with pytest.raises(TargetError, match="one process each"):
        _run(_bundle(), tmp_path, bundled=False)


def test_a_sequence_that_is_not_stateful_runs_as_any_cases_do(tmp_path):
    run, served, alone = _run(_bundle(stateful=False), tmp_path, one_case="server=false")
    assert served == [] and alone == [0, 1, 2, 3, 4]


def test_after_a_server_stops_only_the_first_step_may_run_alone_the_rest_is_not_run(tmp_path):
    run, served, alone = _run(_bundle(), tmp_path, left=5)  # the server never reached its loop
    assert alone == [0]
    rest = [c for c in run.cases if c.case_index > 0]
    assert [c.case_index for c in rest] == [1, 2, 3, 4]
    assert all(c.status is CaseStatus.ERROR and c.error_kind is FailureKind.NOT_RUN for c in rest)
    assert "fresh method" in (rest[0].error or "")
    run, served, alone = _run(_bundle(), tmp_path, left=2)  # it died mid-sequence: nothing runs alone
    assert alone == [] and [c.case_index for c in run.cases] == [3, 4]


def test_adb_runs_a_process_per_case_so_it_refuses_a_stateful_sequence(tmp_path):
    from bundlerun.targets import open_target

    target = open_target("adb+tcp://127.0.0.1:9")  # refused before any connection is tried
    with pytest.raises(TargetError) as exc:
        target.run(_bundle(), tmp_path / "b.bpte", RunOptions(work_dir=tmp_path))
    assert exc.value.kind == "bad-config" and "one runner process per case" in str(exc.value)


def test_hostile_sequences_are_refused_in_one_line_or_name_only_text_methods(tmp_path):
    """Seeded mutations (tests/security_fuzz.py) of a manifest's `sequences`: the manifest's strict
    schema refuses it in one line (ManifestError, as read_bundle would), or stateful_methods names
    text methods and run_cases serves, runs, or refuses with a one-line bad-config, never another error."""
    import random

    from tests.security_fuzz import mutate_json

    rng = random.Random(35)
    good = _manifest(5, True)
    refused = 0
    for _ in range(300):
        mutated, _edits = mutate_json(good["sequences"], rng, edits=rng.randint(1, 3))
        bundle = _bundle()
        assert bundle.manifest_json is not None
        bundle.manifest_json = {**bundle.manifest_json, "sequences": mutated}
        try:
            names = server.stateful_methods(bundle)
        except ManifestError as exc:
            assert "\n" not in str(exc)
            refused += 1
            continue
        assert all(isinstance(n, str) for n in names)
        try:
            _run(bundle, tmp_path, one_case="server=false")
        except TargetError as exc:
            assert exc.kind == "bad-config" and "\n" not in str(exc)
    assert refused > 0  # the mutations reach the schema
