"""LLM sequences end to end without an export: a synthetic manifest with sequences and raw logits
through the real judge -> Report.sequences -> every writer -> the strict reader; and the strict
reader on hostile `sequences` JSON (generated, as tests/security_fuzz.py does)."""

from __future__ import annotations

import copy
import io
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite
from bundlerun.bundles.manifest import Criteria, Manifest, MethodManifest, OutputSpec, TensorSpec
from bundlerun.bundles.sequence import SequenceSpec, SequenceStep
from bundlerun.runner.judging.judge import JudgeContext, judge_run, judge_sequences, summarize
from bundlerun.runner.report.model import Report, ReportError, read_report
from bundlerun.targets.base import CaseResult, CaseStatus, RawTensor, TargetRun
from tests.report_samples import STUB_PROGRAM

VOCAB = 16
# (sequence, kind, start_pos, tokens fed): two sequences of a prompt and two decode steps
STEPS = [("seq0", "prompt", 0, [1, 2, 3]), ("seq0", "decode", 3, [0]), ("seq0", "decode", 4, [0]),
         ("seq1", "prompt", 0, [5, 6]), ("seq1", "decode", 2, [0]), ("seq1", "decode", 3, [0])]
FLIPPED = 4  # the case whose target logits swap the top two tokens (seq1's first decode step)
CRITERIA = Criteria(atol=1e-3, rtol=1e-3, argmax_match=True, kl_max=1e-3, top_k_overlap_min=0.8)


def _sequence_bundle(seed: int = 0) -> tuple[Bundle, Manifest, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    logits = [(rng.standard_normal((1, VOCAB)) * 3).astype(np.float32) for _ in STEPS]
    cases, specs = [], {}
    for i, (name, kind, pos, tokens) in enumerate(STEPS):
        ins = [BundledValue.from_array(np.array([tokens], np.int64)), BundledValue.from_array(np.array([pos], np.int64))]
        cases.append(BundledTestCase(ins, [BundledValue.from_array(logits[i])]))
        spec = specs.setdefault(name, SequenceSpec(name, "forward", True, "teacher-forced", [],
                                                   "a prompt <b>&" if name == "seq0" else None))
        spec.steps.append(SequenceStep(i, kind, pos, tokens, int(np.argmax(logits[i]))))
    manifest = Manifest(
        model={"id": "llm:llama3", "source": "test", "description": ""},
        build={"backend": "xnnpack", "target": "host://xnnpack", "dtype": "fp32", "reference": "eager-fp32"},
        versions={"bundlerun": "0.1.0"},
        methods={"forward": MethodManifest("forward", [TensorSpec("tokens", "int64", [1, 3]),
                                                       TensorSpec("input_pos", "int64", [1])],
                                           [OutputSpec("out0", "float32", [1, VOCAB], CRITERIA)])},
        sequences=list(specs.values()),
    )
    bundle = Bundle(program=STUB_PROGRAM, method_test_suites=[MethodTestSuite("forward", cases)],
                    manifest_json=manifest.to_dict())
    return bundle, manifest, logits


def _target(logits: list[np.ndarray], missing: int | None = None) -> TargetRun:
    results = []
    for i, ref in enumerate(logits):
        act = ref + np.float32(1e-6)
        if i == FLIPPED:
            order = np.argsort(-ref[0])
            act = ref.copy()
            act[0, order[0]], act[0, order[1]] = ref[0, order[1]], ref[0, order[0]]
        if i == missing:
            results.append(CaseResult("forward", i, CaseStatus.ERROR, error="runtime error", error_kind="crash"))
            continue
        act = np.ascontiguousarray(act, np.float32)
        results.append(CaseResult("forward", i, CaseStatus.OK, [RawTensor(st.FLOAT, list(act.shape), act.tobytes())],
                                  elapsed_s=0.001))
    return TargetRun("host://xnnpack", results, info={"runtime": "test"})


def _report(missing: int | None = None) -> tuple[Report, Bundle, list[np.ndarray]]:
    bundle, manifest, logits = _sequence_bundle()
    ctx = JudgeContext(manifest)  # Manifest.from_dict takes `sequences` once branch llm's schema lands
    cases, warnings = judge_run(bundle, _target(logits, missing), ctx)
    report = Report(summary=summarize(cases), cases=cases, warnings=warnings,
                    bundle={"model": "llm:llama3", "backend": "xnnpack", "dtype": "fp32", "path": "llm.bpte"},
                    target={"url": "host://xnnpack"}, run={"id": "r1", "started": "2026-01-01T00:00:00+00:00"},
                    sequences=judge_sequences(ctx, cases))
    return report, bundle, logits


def test_judge_fills_sequences_and_fails_the_flipped_step():
    report, _, logits = _report()
    assert report.summary.verdict == "FAIL" and report.summary.exit_code == 1
    flipped = report.cases[FLIPPED].outputs[0]
    by = {f.criterion: f for f in flipped.failed}
    ref_tok = int(np.argmax(logits[FLIPPED]))
    assert by["argmax_match"].detail.startswith(f"argmax: expected token {ref_tok} -> got token ")
    assert [c.verdict for c in report.cases] == ["PASS"] * 4 + ["FAIL", "PASS"]
    seq0, seq1 = report.sequences
    assert (seq0.verdict, seq0.first_divergence, seq0.greedy_agreement) == ("PASS", None, 3)
    assert (seq1.verdict, seq1.first_divergence, seq1.greedy_agreement) == ("FAIL", 1, 1)
    step = seq1.steps[1]
    assert (step.case, step.kind, step.start_pos, step.tokens) == (FLIPPED, "decode", 2, 1)
    assert step.argmax_match is False and step.margin is not None and step.margin < 0
    lp = logits[FLIPPED][0].astype(np.float64)
    order = np.argsort(-lp)
    assert step.margin == pytest.approx(lp[order[1]] - lp[order[0]], rel=1e-6)  # swapped top two: the gap, negated
    assert seq0.perplexity_ratio == pytest.approx(1.0, abs=1e-5) and seq1.perplexity_ratio > 1.0
    assert seq0.steps[0].sqnr > 100 and seq0.prompt_text == "a prompt <b>&"


def test_a_reference_token_that_is_not_the_argmax_is_named():
    bundle, manifest, logits = _sequence_bundle()
    wrong = (manifest.sequences[0].steps[2].reference_next + 1) % VOCAB
    manifest.sequences[0].steps[2].reference_next = wrong
    ctx = JudgeContext(manifest)
    cases, warnings = judge_run(bundle, _target(logits), ctx)
    assert any("forward[2]: the manifest's reference_next" in w for w in warnings)
    step = judge_sequences(ctx, cases)[0].steps[2]
    assert step.reference_token == wrong and step.argmax_match is False


def test_a_step_that_did_not_run_is_where_the_sequence_stops():
    report, _, _ = _report(missing=1)
    seq0 = report.sequences[0]
    assert seq0.steps[1].verdict == "ERROR" and seq0.steps[1].sqnr is None
    assert seq0.first_divergence == 1 and seq0.greedy_agreement == 1 and seq0.perplexity_target is None
    assert seq0.verdict == "ERROR"


def test_every_writer_shows_the_step_table(tmp_path):
    from bundlerun.runner.writers import write_reports

    report, bundle, _ = _report()
    files = write_reports(report, tmp_path, bundle=bundle, formats=["html", "junit", "markdown", "json"])
    assert set(files) >= {"html", "junit", "markdown", "json"}
    md = (tmp_path / "summary.md").read_text()
    assert "Sequence seq1" in md and "first divergence at step 1 \\(case 4\\)" in md
    assert "| step | kind | pos | SQNR dB | cosine | argmax ref->tgt | top-k overlap | KL | margin | verdict |" in md
    html = (tmp_path / "report.html").read_text()
    assert "<h2 id='sequences'>Sequences</h2>" in html and "alt=\"sequence seq1\"" in html
    assert "a prompt &lt;b&gt;&amp;" in html and "<b>&" not in html.split("<h2 id='sequences'>")[1][:4000]
    root = ET.parse(tmp_path / "junit.xml").getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["sequence.seq1.first_divergence"] == "1" and props["sequence.seq0.first_divergence"] == ""
    assert props["sequence.seq0.greedy_agreement"] == "3"
    out = root.find("testsuite/system-out")
    assert out is not None and "greedy agreement 1/3" in out.text and "argmax ref->tgt" in out.text
    back = read_report(tmp_path)
    assert [s.to_json() for s in back.sequences] == [s.to_json() for s in report.sequences]
    assert back.sequences[1].steps[1].argmax_match is False


def test_console_shows_the_step_table():
    from rich.console import Console

    from bundlerun.runner.report.console import print_summary

    report, _, _ = _report()
    console = Console(record=True, width=200)
    print_summary(report, console)
    text = console.export_text()
    assert "seq1 (teacher-forced, stateful, 3 steps): FAIL" in text and "argmax ref->tgt" in text
    assert "✗" in text


def test_no_sequences_leaves_the_report_json_unchanged(tmp_path):
    from bundlerun.runner.report.record import write_record
    from tests.report_samples import quick_report

    data = quick_report()
    report = Report.from_json(data)
    assert report.sequences == [] and "sequences" not in report.to_json()
    write_record(report, tmp_path)
    written = (tmp_path / "report.json").read_bytes()
    assert b"sequences" not in written
    again = tmp_path / "again"
    write_record(read_report(tmp_path), again)
    assert (again / "report.json").read_bytes() == written


def test_sequence_json_round_trips_non_finite_numbers():
    report, _, _ = _report()
    report.sequences[0].steps[0].sqnr = math.inf
    report.sequences[0].perplexity_ratio = math.nan
    data = json.loads(json.dumps(report.to_json()))
    assert data["sequences"][0]["steps"][0]["sqnr"] == "inf"
    back = Report.from_json(data).sequences[0]
    assert back.steps[0].sqnr == math.inf and math.isnan(back.perplexity_ratio)


def _base() -> dict:
    report, _, _ = _report()
    return json.loads(json.dumps(report.to_json()))


BASE: dict = {}


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(sequences={"a": 1}), r"sequences: expected a list"),
    (lambda d: d["sequences"][0].pop("name"), r"sequences\[0\]: no 'name'"),
    (lambda d: d["sequences"][0].update(stateful="yes"), r"sequences\[0\]\.stateful: expected true or false"),
    (lambda d: d["sequences"][0].update(verdict="MAYBE"), r"sequences\[0\]\.verdict: expected one of"),
    (lambda d: d["sequences"][0].update(greedy_agreement=-1), r"greedy_agreement: -1 is outside"),
    (lambda d: d["sequences"][0].update(steps="x"), r"sequences\[0\]\.steps: expected a list"),
    (lambda d: d["sequences"][0]["steps"][0].update(case=2**40), r"steps\[0\]\.case: .* is outside"),
    (lambda d: d["sequences"][0]["steps"][0].update(margin="big"), r"steps\[0\]\.margin: expected a number"),
    (lambda d: d["sequences"][0]["steps"][0].pop("reference_token"), r"steps\[0\]: no 'reference_token'"),
    (lambda d: d["sequences"][0]["steps"][0].update(argmax_match=1), r"argmax_match: expected true or false"),
    (lambda d: d["sequences"][0].update(perplexity_ratio=10**400), r"too large for a number"),
])
def test_strict_reader_refuses_malformed_sequences(mutate, needle, tmp_path):
    if not BASE:
        BASE.update(_base())
    data = copy.deepcopy(BASE)
    mutate(data)
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(ReportError, match=needle) as err:
        read_report(tmp_path)
    assert "\n" not in str(err.value)


_JSON = hs.recursive(hs.none() | hs.booleans() | hs.integers(-(2**70), 2**70) | hs.floats() | hs.text(max_size=8),
                     lambda kids: hs.lists(kids, max_size=4) | hs.dictionaries(hs.text(max_size=6), kids, max_size=4),
                     max_leaves=12)
_KEYS = ("name", "method", "mode", "stateful", "verdict", "steps", "first_divergence", "greedy_agreement",
         "perplexity_target", "perplexity_ratio", "prompt_text")
_STEP_KEYS = ("step", "case", "kind", "start_pos", "tokens", "verdict", "reference_token", "target_token",
              "argmax_match", "top_k", "sqnr", "kl", "margin")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=hs.sampled_from(("top", "sequence", "step")), key=hs.sampled_from(_KEYS + _STEP_KEYS), value=_JSON)
def test_hostile_sequences_are_one_line_errors_or_read(where, key, value):
    """Any value at any key of a sequence or step: the reader either refuses it with a ReportError
    or reads it into records every view can render; never another exception."""
    if not BASE:
        BASE.update(_base())
    data = copy.deepcopy(BASE)
    if where == "top":
        data["sequences"] = value
    elif where == "sequence":
        data["sequences"][1][key] = value
    else:
        data["sequences"][1]["steps"][0][key] = value
    try:
        report = Report.from_json(data)
    except ReportError as exc:
        assert "\n" not in str(exc)
        return
    from bundlerun.runner.report.sequences import headline, text_lines

    for seq in report.sequences:  # what every view calls
        headline(seq)
        text_lines(seq)


def _shard_report(cases_run: list[int], run_id: str) -> Report:
    """A report of the synthetic bundle that ran only `cases_run` (a shard of the run)."""
    bundle, manifest, logits = _sequence_bundle()
    run = _target(logits)
    run = TargetRun(run.target, [r for r in run.cases if r.case_index in cases_run], info=run.info)
    ctx = JudgeContext(manifest)
    cases, warnings = judge_run(bundle, run, ctx)
    return Report(summary=summarize(cases), cases=cases, warnings=warnings,
                  bundle={"model": "llm:llama3", "backend": "xnnpack", "dtype": "fp32", "path": "llm.bpte"},
                  target={"url": "host://xnnpack"}, run={"id": run_id, "started": "2026-01-01T00:00:00+00:00"},
                  sequences=judge_sequences(ctx, cases))


def test_merge_of_shards_keeps_the_sequences_as_one_run_has_them():
    """Each shard ran one sequence (the other reads ERROR there): merged, every step comes from the
    shard that ran it and the figures are those of the unsharded run."""
    from bundlerun.runner.report.merge import merge_reports

    whole, _, _ = _report()
    first, second = _shard_report([0, 1, 2], "a"), _shard_report([3, 4, 5], "b")
    assert first.sequences[1].verdict == "ERROR" and second.sequences[0].verdict == "ERROR"
    merged = merge_reports([first, second])
    assert [s.to_json() for s in merged.sequences] == [s.to_json() for s in whole.sequences]
    assert merged.sequences[1].first_divergence == 1 and merged.sequences[0].greedy_agreement == 3
    # a merge of one report keeps its sequences as they are; a shard missing a step leaves it ERROR
    assert [s.to_json() for s in merge_reports([whole]).sequences] == [s.to_json() for s in whole.sequences]
    partial = merge_reports([_shard_report([0, 1, 2], "a"), _shard_report([3, 4], "b")])
    assert partial.sequences[1].steps[2].verdict == "ERROR" and partial.sequences[1].verdict == "ERROR"


def test_merge_of_jobs_names_each_jobs_sequences_as_its_cases():
    from bundlerun.runner.report.merge import MergeOptions, merge_reports

    one, two = _report()[0], _report()[0]
    merged = merge_reports([one, two], MergeOptions(jobs=True, names=["cpu", "arm"]))
    assert [(s.method, s.name) for s in merged.sequences] == [
        ("cpu/forward", "seq0"), ("cpu/forward", "seq1"), ("arm/forward", "seq0"), ("arm/forward", "seq1")]
    assert {c.method for c in merged.cases} == {"cpu/forward", "arm/forward"}
    again = merge_reports([merged])  # a farm's report merged again (its jobs carried) keeps them
    assert [(s.method, s.name) for s in again.sequences] == [(s.method, s.name) for s in merged.sequences]


def test_sequence_section_renders_in_headless_chromium(tmp_path):
    """The HTML's sequence plots load as real images in a browser (tests/browser.py)."""
    from tests import browser
    from tests.test_html_report import _need_chromium

    _need_chromium()
    from bundlerun.runner.writers import write_reports

    report, bundle, _ = _report()
    files = write_reports(report, tmp_path, bundle=bundle, formats=["html"])
    check = browser.check_page(files["html"].resolve().as_uri(), tmp_path / "page.png")
    assert check.console_errors == []
    seq_images = [i for i in check.images if str(i["alt"]).startswith("sequence ")]
    assert [i["alt"] for i in seq_images] == ["sequence seq0", "sequence seq1"]
    for img in seq_images:
        assert img["complete"] and img["naturalWidth"] > 100 and img["naturalHeight"] > 100, img


def test_seeded_mutations_of_sequences_read_or_refuse_and_render():
    """tests/security_fuzz.py's mutations (hostile values, deleted keys, cut lists) of the `sequences`
    section: a one-line ReportError, or records that Markdown, JUnit and the console render."""
    import random

    from rich.console import Console

    from bundlerun.runner.report.console import print_sequences
    from bundlerun.runner.writers.junit import junit_bytes
    from bundlerun.runner.writers.markdown import render_markdown
    from tests.security_fuzz import mutate_json

    if not BASE:
        BASE.update(_base())
    refused = read = 0
    for seed in range(400):
        rng = random.Random(seed)
        sequences, done = mutate_json(BASE["sequences"], rng, edits=1 + seed % 3)
        data = copy.deepcopy(BASE)
        data["sequences"] = sequences
        try:
            report = Report.from_json(data)
        except ReportError as exc:
            assert "\n" not in str(exc), done
            refused += 1
            continue
        read += 1
        render_markdown(report)
        ET.fromstring(junit_bytes(report))
        print_sequences(report, Console(file=io.StringIO(), width=200))
    assert refused > 50 and read > 50  # both sides of the reader are exercised


def test_cases_judged_ahead_give_the_report_judging_afterwards_gives():
    """runner/judging/ahead.py judges each result while the run goes on (a thread); the records, token
    figures and notes are the ones judging them all afterwards gives, also when each case's outputs are
    let go once judged (runner/session.py CaseStream.release). What the lane adds after the hand-over
    (attempts, a log line, an error line) is settled into the record; a result whose status or outputs
    changed is judged again, one never handed over is judged at the end."""
    from bundlerun.runner.judging.ahead import JudgeAhead
    from bundlerun.targets.failures import FailureKind

    bundle, manifest, logits = _sequence_bundle()
    manifest.sequences[0].steps[2].reference_next = (manifest.sequences[0].steps[2].reference_next + 1) % VOCAB

    def after_hand_over(run: TargetRun) -> None:  # what lanes do to results they handed over
        run.cases[1].extra["attempts"] = 2
        run.cases[1].log_excerpt = ["retried once"]
        run.cases[2].error, run.cases[2].error_kind = "the board reset after the case", FailureKind.CRASH
        run.cases[3].status, run.cases[3].error, run.cases[3].error_kind = CaseStatus.TIMEOUT, "late", FailureKind.HOST_TIMEOUT
        bad = np.ascontiguousarray(logits[0] + np.float32(1.0))  # new outputs: judged again with them (FAIL)
        run.cases[0].outputs = [RawTensor(st.FLOAT, list(bad.shape), bad.tobytes())]

    plain_run = _target(logits)
    after_hand_over(plain_run)
    plain_ctx = JudgeContext(copy.deepcopy(manifest))
    plain, plain_warnings = judge_run(bundle, plain_run, plain_ctx)
    assert plain[0].verdict == "FAIL" and plain[2].error == "the board reset after the case" and plain[3].verdict == "TIMEOUT"

    for let_go in (False, True):
        run = _target(logits)
        released = []

        def release(r: CaseResult, handed: tuple) -> bool:
            if not let_go or tuple(map(id, r.outputs)) != handed:
                return False
            released.append(r.case_index)
            r.outputs = []
            return True

        ctx = JudgeContext(copy.deepcopy(manifest))
        ahead = JudgeAhead(bundle, ctx, after=release)
        for r in run.cases[:5]:  # the last case is never handed over
            ahead.submit(r)
        for job in list(ahead._jobs.values()):
            job[2].result()  # every hand-over judged (and let go) before the lane changes the results
        after_hand_over(run)
        cases, warnings = judge_run(bundle, run, ctx, ahead)
        ahead.close()
        assert sorted(released) == ([0, 1, 2, 3, 4] if let_go else [])
        assert [c.to_json() for c in cases] == [c.to_json() for c in plain], let_go
        assert warnings == plain_warnings and any("reference_next" in w for w in warnings)
        assert ctx.step_metrics == plain_ctx.step_metrics
        assert [s.to_json() for s in judge_sequences(ctx, cases)] == [s.to_json() for s in judge_sequences(plain_ctx, plain)]


def test_a_stop_inside_a_hand_over_never_judges_a_case_from_outputs_it_let_go():
    """A Ctrl-C that lands in `submit` after the judging job was queued but before it was recorded (seen
    in a loaded CI run: case 0 came out ERROR, "returned 0 outputs"): the thread judges it but does not
    let its outputs go, so the end-of-run judging, which cannot take that job, judges it from them."""
    from concurrent.futures import ThreadPoolExecutor

    from bundlerun.runner.judging.ahead import JudgeAhead

    bundle, manifest, logits = _sequence_bundle()
    run = _target(logits)
    plain, _ = judge_run(bundle, _target(logits), JudgeContext(copy.deepcopy(manifest)))
    released = []

    def release(r: CaseResult, handed: tuple) -> bool:
        released.append(r.case_index)
        r.outputs = []
        return True

    ahead = JudgeAhead(bundle, JudgeContext(copy.deepcopy(manifest)), after=release)
    real_pool = ahead._pool
    futures = []

    class StoppedPool(ThreadPoolExecutor):  # queues the job, then the stop arrives (before submit records it)
        def submit(self, fn, *args):
            futures.append(real_pool.submit(fn, *args))
            raise KeyboardInterrupt

    ahead._pool = StoppedPool(max_workers=1)
    with pytest.raises(KeyboardInterrupt):
        ahead.submit(run.cases[0])
    futures[0].result()
    assert released == [] and run.cases[0].outputs  # judged on the thread, its outputs kept
    ahead._pool = real_pool
    cases, _ = judge_run(bundle, run, ahead._ctx, ahead)
    ahead.close()
    assert cases[0].to_json() == plain[0].to_json() and cases[0].verdict == "PASS"
