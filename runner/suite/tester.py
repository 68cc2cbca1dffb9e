"""The Tester on a target: a Tester-based test runs its compare step on a bundlerun target.

    from executorch.backends.xnnpack.test.tester import Tester
    from bundlerun.runner.suite.tester import on_target

    tester = Tester(model, inputs).export().to_edge_transform_and_lower().to_executorch().serialize()
    with on_target(tester, "qemu-user://aarch64", report_dir=tmp_path) as t:
        t.run_method_and_compare_outputs(atol=1e-3, rtol=1e-3)   # the Tester's own call and checks
    record = tester.bundlerun_records[0]                          # bundlerun's verdict, registry numbers

Lowering is the Tester's, untouched. Inside the block, `run_method_and_compare_outputs` bundles
the lowered program with the Tester's inputs and its reference outputs (the registry's numbers
for the program's backend embedded), runs the bundle on the target and gives the target's
outputs to the Tester's own comparison: a mismatch is the Tester's AssertionError with its
usual message; a run the target could not do is a DeviceRunError naming the failure kind.
`strict=True` also fails on a FAIL by the registry's numbers. Under pytest with
`--bundlerun-target URL`, the `bundlerun_tester` fixture does the same on the leased target
with the session's warm runtime: `bundlerun_tester(tester).run_method_and_compare_outputs()`.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Iterator

from bundlerun.runner.suite.device import CompareSpec, DeviceRecord, DeviceRunError, TargetRunner, attach, safe

__all__ = ["DeviceRecord", "DeviceRunError", "TargetRunner", "on_target", "attach_target"]


def attach_target(tester: Any, runner: TargetRunner, name: str | None = None, report_dir: str | Path | None = None,
                  flow: str | None = None, quantized: bool | None = None) -> Any:
    """Attach `runner`'s target to `tester` (until `detach`); returns the tester."""
    name = name or type(tester.original_module).__name__
    folder = Path(report_dir) if report_dir else runner.report_root / safe(name)
    return attach(tester, runner, CompareSpec(name=name, report_dir=folder, flow=flow, quantized=quantized))


def detach(tester: Any) -> None:
    """The Tester's own run_method_and_compare_outputs again."""
    tester.__dict__.pop("run_method_and_compare_outputs", None)


@contextlib.contextmanager
def on_target(tester: Any, target: str, report_dir: str | Path | None = None, *, name: str | None = None,
              backend: str | None = None, strict: bool = False, timeout_s: float = 120.0,
              runner: TargetRunner | None = None) -> Iterator[Any]:
    """Within the block, the Tester's compare step runs on `target` (a bundlerun target URL).
    `backend` overrides the registry backend (default: the program's delegate, portable without
    one). A `runner` given is reused (its session and warm workers) and not closed here."""
    own = runner is None
    root = Path(report_dir) if report_dir else Path(tempfile.mkdtemp(prefix="bundlerun-tester-"))
    runner = runner or TargetRunner(target, root, timeout_s=timeout_s, strict=strict, backend=backend)
    try:
        yield attach_target(tester, runner, name, root if report_dir else None)
    finally:
        detach(tester)
        if own:
            runner.close()
