"""`bundlerun debug` on qemu-user://aarch64 of a fault whose first step is a decode step: one row of the
tiny llama's embedding table negated in the lowered program - the row of the first token fed at a decode
step of seq0 that its prompt and earlier steps never fed. `run` on the real aarch64 runner passes the
steps before it and fails that step first; `debug` without --case takes that step from the history,
replays its prefix on the debug runner's one loaded method (and through the reference graph) and names
the embedding lookup. Runners: the real aarch64 executor_runner and debug runner under qemu-aarch64
(tests/test_llm_debug_aarch64.py says which); no double."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from tests.test_debug_android import debug_runner  # noqa: F401 - fixture
from tests.test_llm_debug import llm_bundles  # noqa: F401 - the shared fixture
from tests.test_llm_debug_aarch64 import QEMU_URL, _cli


@pytest.fixture(scope="module")
def embedding_fault(llm_bundles):  # noqa: F811
    from executorch.devtools.etrecord import parse_etrecord

    from bundlerun.bundles.bpte import read_bundle, write_bundle

    work = llm_bundles
    bundle = read_bundle(work / "tiny.bpte")
    steps = bundle.manifest_json["sequences"][0]["steps"]
    seen = set(steps[0]["tokens"])
    faulty = None
    for st in steps[1:]:
        if st["tokens"][0] not in seen:
            faulty = st
            break
        seen.update(st["tokens"])
    assert faulty is not None, "seq0 feeds no new token at a decode step"
    table = parse_etrecord(str(work / "tiny.etrecord")).exported_program.state_dict["tok_embeddings.weight"]
    row = np.ascontiguousarray(table.detach().float().numpy()[faulty["tokens"][0]])
    assert bundle.program.count(row.tobytes()) == 1  # the table is in the program as eager holds it
    write_bundle(replace(bundle, program=bundle.program.replace(row.tobytes(), (-row).tobytes())), work / "emb.bpte")
    (work / "emb.etrecord").write_bytes((work / "tiny.etrecord").read_bytes())
    return work, faulty


@pytest.mark.slow
def test_a_fault_first_touched_at_a_decode_step_is_localized_there_with_its_prefix_replayed(embedding_fault,
                                                                                            debug_runner):  # noqa: F811
    work, faulty = embedding_fault
    ran = _cli("run", "emb.bpte", "--target", QEMU_URL, "--history", "he.db", "--report", "run-emb", cwd=work)
    assert ran.returncode == 1, ran.stdout[-2000:] + ran.stderr[-2000:]
    report = json.loads((work / "run-emb" / "report.json").read_text())
    verdicts = {c["case"]: c["verdict"] for c in report["cases"]}
    assert all(verdicts[c] == "PASS" for c in range(faulty["case"])), verdicts  # seq0's steps before it
    assert verdicts[faulty["case"]] == "FAIL"
    done = _cli("debug", "emb.bpte", "--target", QEMU_URL, "--history", "he.db", "--report", "dbg-emb", cwd=work)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    body = json.loads((work / "dbg-emb" / "report.json").read_text())["debug"]
    assert body["case"] == faulty["case"] and "first diverging step" in body["case_source"]
    prefix = ", ".join(str(c) for c in range(faulty["case"]))
    assert any(f"replayed {faulty['case']} earlier step(s) of the sequence (cases {prefix})" in n
               for n in body["notes"]), body["notes"]
    bad = body["first_bad_layer"]
    assert bad["module"] == "tok_embeddings", bad
    print(f"first bad layer at case {faulty['case']}: {bad}")
