"""Shared by tests/test_qnn_*.py: QNN programs lowered with bundlerun's qnn recipe (ExecuTorch's real
Qualcomm AOT, in its child process) and bundles made from them. No double: everything runs on
Qualcomm's HTP simulator libraries installed by firmware_scripts/qnn/install_htp_sim.sh."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest


def require_simulator() -> Path:
    """The installed simulator's lib folder; FAILS (never skips) when setup did not install it."""
    from bundlerun.bundles.backends.qnn import INSTALL_COMMAND, simulator_dir, simulator_record

    if simulator_record() is None:
        pytest.fail(f"Qualcomm's HTP simulator libraries are not installed in {simulator_dir()}: "
                    f"scripts/setup.sh runs `{INSTALL_COMMAND}`")
    return simulator_dir() / "lib"


def lower_qnn(model, x, dtype: str = "fp16", soc: str = "SM8650"):
    """The recipe's LoweringResult for `model` on one input tuple."""
    from bundlerun.bundles.backends.base import LoweringRequest
    from bundlerun.bundles.backends.qnn import lower

    return lower(LoweringRequest(model=model.eval(), example_inputs=x, calibration_inputs=[x], dtype=dtype,
                                 backend="qnn", target=f"qnn://htp-sim?soc={soc}", options={"soc": soc}))


def tiny_linear():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), (torch.randn(1, 8),)


def write_plain_bundle(program: bytes, inputs: list[np.ndarray], expected: list[np.ndarray], path: Path,
                       cases: int = 3) -> Path:
    """A bundle without a bundlerun manifest (as ExecuTorch's BundledProgram API makes them)."""
    from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue, MethodTestSuite, write_bundle

    case = BundledTestCase([BundledValue.from_array(a) for a in inputs], [BundledValue.from_array(e) for e in expected])
    return write_bundle(Bundle(program=program, method_test_suites=[MethodTestSuite("forward", [case] * cases)]), path)


def run_on_simulator(path: Path, work: Path, pool=None, url: str = "qnn://htp-sim", config: dict | None = None,
                     timeout_s: float = 300.0):
    """The qnn target's TargetRun for one bundle, in this process; with `pool` (a WorkerPool) the
    cases run on its warm worker, shared by the calls of one test module."""
    import contextlib

    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.targets import open_target
    from bundlerun.targets.base import RunOptions

    target = open_target(url, config or {})
    with pool.activate() if pool is not None else contextlib.nullcontext():
        return target.run(read_bundle(path), path, RunOptions(work_dir=work, case_timeout_s=timeout_s))


def htp_api_version_offset(program: bytes) -> int:
    """Where the program's QNN context binary records the HTP backend API version it was compiled
    with (three little-endian u32: 5, 49, 0 for QNN 2.49.40); exactly one such triple."""
    needle = struct.pack("<III", 5, 49, 0)
    first = program.find(needle)
    assert first != -1 and program.find(needle, first + 1) == -1, "expected one HTP API version 5.49.0 in the program"
    return first
