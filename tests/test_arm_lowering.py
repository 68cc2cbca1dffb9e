"""Arm lowering recipe (bundles/backends/arm.py) with the real ExecuTorch Arm
toolchain: TOSA INT/FP, Ethos-U55/U65/U85 through Vela, Cortex-M55."""

from __future__ import annotations

import pytest

from bundlerun.bundles.backends import arm
from bundlerun.bundles.errors import BuildError, TargetError
from bundlerun.targets import lowering_info
from bundlerun.targets.program.walker import read_delegates


# --------------------------------------------------------------------------- target parsing (no torch)


@pytest.mark.parametrize(
    "url, kind, integer, detail",
    [
        ("tosa://int", "tosa", True, "TOSA-1.0+INT"),
        ("tosa://fp", "tosa", False, "TOSA-1.0+FP"),
        ("fvp://corstone-300/ethos-u55-128", "ethos-u", True, "ethos-u55-128"),
        ("fvp://corstone-300/ethos-u65-256", "ethos-u", True, "ethos-u65-256"),
        ("fvp://corstone-320/ethos-u85-256", "ethos-u", True, "ethos-u85-256"),
        ("fvp://corstone-300/cortex-m55", "cortex-m", True, "M55"),
    ],
)
def test_parse_arm_target(url, kind, integer, detail):
    t = arm.parse_arm_target(url, lowering_info(url))
    assert (t.kind, t.integer) == (kind, integer)
    assert detail in (t.tosa_spec, t.accelerator, t.cpu)
    from bundlerun.bundles.backends.base import default_dtype

    assert default_dtype("arm", lowering_info(url)) == ("int8" if integer else "fp32")  # from what the target declares


@pytest.mark.parametrize(
    "url, words",
    [
        ("tosa://bf16", "tosa://int or tosa://fp"),
        ("fvp://corstone-320/ethos-u55-128", "corstone-300"),
        ("fvp://corstone-300/ethos-u55-100", "no 100-MAC"),
        ("fvp://corstone-300/cortex-a53", "unknown processor"),
        ("host://xnnpack", "tosa://, fvp:// and qemu://"),
        ("qemu://virt", "unknown QEMU machine"),
    ],
)
def test_parse_arm_target_rejects(url, words):
    # the target refuses a URL it does not know (TargetError); the recipe one that declares no Arm lowering
    with pytest.raises((BuildError, TargetError), match=words.replace("+", r"\+").replace("/", "/")):
        arm.parse_arm_target(url, lowering_info(url))


# --------------------------------------------------------------------------- real lowering


class _SmallNet:
    """conv -> relu -> pool -> linear: small but exercises conv layout and fc."""

    @staticmethod
    def build():
        import torch.nn as nn
        import torch

        torch.manual_seed(7)
        return nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5)
        ).eval()


@pytest.fixture(scope="module")
def small():
    import torch

    model = _SmallNet.build()
    gen = torch.Generator().manual_seed(3)
    examples = (torch.randn(1, 3, 8, 8, generator=gen),)
    calibration = [(torch.randn(1, 3, 8, 8, generator=gen),) for _ in range(6)]
    return model, examples, calibration


def _lower(small, target, dtype):
    from bundlerun.bundles.backends.base import LoweringRequest

    model, examples, calibration = small
    return arm.lower(LoweringRequest(model, examples, calibration, dtype, "arm", target, target_info=lowering_info(target)))


@pytest.fixture(scope="module")
def tosa_int(small):
    return _lower(small, "tosa://int", "int8")


def test_tosa_int_lowering(small, tosa_int):
    import torch

    r = tosa_int
    assert r.info["partitioner"] == "TOSAPartitioner"
    assert r.info["delegated_partitions"] >= 1
    assert r.info["compile_spec"]["tosa_spec"].startswith("TOSA-1.0+INT")
    assert r.quantization == "arm-ptq-int8-symmetric-per-channel"
    assert any(o.startswith(("conv2d", "convolution")) for o in r.ops) and any(o.startswith("linear") for o in r.ops)
    delegates = read_delegates(bytes(r.program.buffer))
    assert {d.backend_id for d in delegates} == {"TOSABackend"}
    assert delegates[0].compile_specs["tosa_spec"] == b"TOSA-1.0+INT"
    # The quantized reference is the converted eager graph: runnable, close to fp32.
    model, examples, _ = small
    ref = r.quantized_reference(*examples)
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
    fp = model(*examples)
    assert ref.shape == fp.shape
    (scale, zero_point), = r.output_qparams
    assert 0 < scale < 1 and -128 <= zero_point <= 127
    # Output of a dequantize: every value is on the int8 grid of (scale, zero_point).
    steps = ref / scale + zero_point
    assert torch.allclose(steps, steps.round(), atol=1e-3)
    assert (ref - fp).abs().max() < 0.1 * fp.abs().max() + 4 * scale


def test_tosa_fp_lowering(small):
    r = _lower(small, "tosa://fp", "fp32")
    assert r.quantized_reference is None and r.quantization is None and r.output_qparams == []
    assert r.info["delegated_partitions"] >= 1
    delegates = read_delegates(bytes(r.program.buffer))
    assert [d.compile_specs["tosa_spec"] for d in delegates] == [b"TOSA-1.0+FP"] * len(delegates)


@pytest.mark.parametrize(
    "url, accelerator",
    [
        ("fvp://corstone-300/ethos-u55-128", "ethos-u55-128"),
        ("fvp://corstone-300/ethos-u65-256", "ethos-u65-256"),
        ("fvp://corstone-320/ethos-u85-256", "ethos-u85-256"),
    ],
)
def test_ethos_u_lowering(small, url, accelerator):
    r = _lower(small, url, "int8")
    assert r.info["partitioner"] == "EthosUPartitioner"
    assert r.info["backend_id"] == "EthosUBackend"
    assert f"--accelerator-config={accelerator}" in r.info["compile_spec"]["compiler_flags"]
    delegates = read_delegates(bytes(r.program.buffer))
    assert {d.backend_id for d in delegates} == {"EthosUBackend"}
    assert delegates[0].compile_specs["target"] == accelerator.encode()
    assert r.quantized_reference is not None and len(r.output_qparams) == 1


def test_cortex_m55_lowering(small):
    r = _lower(small, "fvp://corstone-300/cortex-m55", "int8")
    assert r.info["delegated_partitions"] == 0
    assert r.info["cortex_m_kernels"], "the Cortex-M passes rewrote nothing"
    assert read_delegates(bytes(r.program.buffer)) == []
    assert r.quantized_reference is not None


@pytest.mark.parametrize("url, dtype", [("tosa://int", "fp32"), ("tosa://fp", "int8"), ("fvp://corstone-300/ethos-u55-128", "fp16")])
def test_dtype_must_match_profile(small, url, dtype):
    with pytest.raises(BuildError, match="--dtype"):
        _lower(small, url, dtype)


def test_cortex_m_backend_needs_a_cortex_m_target(small):
    with pytest.raises(BuildError, match="cortex-m55"):
        from bundlerun.bundles.backends.base import LoweringRequest

        model, examples, calibration = small
        arm.lower(LoweringRequest(model, examples, calibration, "int8", "cortex-m", "tosa://int",
                                  target_info=lowering_info("tosa://int")))
