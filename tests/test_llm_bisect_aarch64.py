"""`bundlerun bisect llm:llama3 --target qemu-user://aarch64`: every candidate on the cross-built aarch64 runner.

The same planted fault, helpers and real components as tests/test_llm_bisect.py (imported from there): ExecuTorch's
export_llama builds every candidate, ExecuTorch's executor_runner cross-built for aarch64 runs each under
qemu-user. A file of its own so that `--dist loadfile` runs it on one worker while the host bisection of
test_llm_bisect.py runs on the other: each is 8 cold export_llama lowerings (129 s and 130 s of the full run
at load 2-3, 2026-12-05), which one file ran one after the other.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_llm_bisect import _assert_w2_culprit, _bisect


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 7-8 export_llama lowerings cold: 15+ min at load average 20 (2026-12-04)
def test_bisect_llm_on_qemu_user_runs_every_candidate_on_the_aarch64_runner(tmp_path):
    """qemu-user://aarch64: ExecuTorch's executor_runner cross-built for aarch64 with the portable, quantized
    and LLM kernels (no optimized library, so no aten::linear). Candidates are lowered without export_llama's
    ConvertToLinearPass, so the one with nothing delegated holds permute_copy + mm/addmm, runs on that runner
    (not on a host fallback) and PASSes; the search names the planted layer as on the host."""
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.program_meta import program_operators

    proc, result = _bisect(tmp_path, "qemu", target="qemu-user://aarch64")
    _assert_w2_culprit(proc, result)
    assert result["target"] == "qemu-user://aarch64"
    assert not any("refuses a program with nothing delegated" in n for n in result["notes"])
    assert any("ConvertToLinearPass" in n for n in result["notes"])
    none = next(s for s in result["steps"] if s["role"] == "none")
    ops = program_operators(read_bundle(none["bundle"]).program)
    assert not any(op.startswith("aten::linear") for op in ops), sorted(ops)
    assert any(op.startswith(("aten::mm", "aten::addmm")) for op in ops), sorted(ops)
    ran = json.loads(Path(none["report"]).read_text())
    assert ran["target"]["url"].startswith("qemu-user://aarch64") and none["verdict"] == "PASS"
