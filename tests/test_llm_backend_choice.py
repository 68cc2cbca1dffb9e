"""Which export_llama path an `llm:ARCH` build takes: the target's own backend unless --backend says
otherwise, each backend's own dtypes, and the one-line refusals (before torch is imported). Pure
Python and the real CLI; no export runs here (tests/test_llm_lanes.py lowers for real)."""

from __future__ import annotations

import pytest

from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.llm_arch import LLM_BACKENDS, SOURCE_QUANTIZED, llm_backend, quantization, tier
from bundlerun.bundles.llm_build import LlmOptions, plan
from tests.conftest import run_cli


@pytest.mark.parametrize(("target_backend", "expected"), [
    ("xnnpack", "xnnpack"), ("vulkan", "vulkan"), ("mlx", "mlx"),
    ("portable", "xnnpack"),  # qemu-user://aarch64: its runner links XNNPACK and the LLM custom ops
    ("arm", "arm"),  # left as it is: the plan refuses it in one line
])
def test_the_llm_backend_is_the_targets_own(target_backend, expected):
    assert llm_backend(target_backend) == expected


def test_each_backend_takes_its_own_dtypes_and_refuses_the_others():
    assert plan("llm:llama3", None, LlmOptions(), "vulkan").dtype == "fp32"
    assert plan("llm:qwen3", "fp16", LlmOptions(), "vulkan").backend == "vulkan"
    assert plan("llm:qwen3", "4w", LlmOptions(), "mlx").dtype == "4w"
    with pytest.raises(BuildError, match="on vulkan: choose one of fp32, fp16, vulkan_8w"):
        plan("llm:llama3", "8da4w", LlmOptions(), "vulkan")
    with pytest.raises(BuildError, match="on mlx: choose one of fp32, 4w"):
        plan("llm:llama3", "vulkan_8w", LlmOptions(), "mlx")
    with pytest.raises(BuildError, match="on xnnpack: choose one of fp32, 8da4w, int8-dynamic"):
        plan("llm:llama3", "4w", LlmOptions(), "xnnpack")
    with pytest.raises(BuildError, match="backend arm .*export_llama's own paths for xnnpack, vulkan, mlx"):
        plan("llm:llama3", "fp32", LlmOptions(), "arm")


def test_the_dtypes_map_to_export_llamas_own_options():
    assert quantization("4w") == {"qmode": "4w", "group_size": 32}
    assert quantization("vulkan_8w") == {"pt2e_quantize": "vulkan_8w"}
    assert quantization("fp16") == {} and quantization("fp32") == {}
    assert [tier(d) for d in ("fp32", "fp16", "vulkan_8w", "4w", "8da4w")] == ["fp32", "fp16", "int8", "int8", "int8"]
    assert set(SOURCE_QUANTIZED) <= {d for ds in LLM_BACKENDS.values() for d in ds}


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "vulkan://lavapipe", "--dtype", "8da4w"], "for an LLM on vulkan: choose one of fp32, fp16, vulkan_8w"),
    (["--target", "mlx://cpu", "--dtype", "fp16"], "for an LLM on mlx: choose one of fp32, 4w"),
    (["--target", "mlx://cpu", "--backend", "vulkan", "--dtype", "4w"], "for an LLM on vulkan"),
    (["--target", "tosa://fp"], "backend arm (--backend, else the target's own)"),
])
def test_the_cli_lowers_for_the_targets_backend_and_refuses_in_one_line(args, message, tmp_path):
    out = tmp_path / "x.bpte"
    proc = run_cli("build", "llm:llama3", "-o", str(out), *args, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "internal error" not in lines[0], proc.stderr
    assert not out.exists()
