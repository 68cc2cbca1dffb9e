"""A Tester's compare step on a bundlerun target.

ExecuTorch's Tester runs the program under test through one seam: the stage's
`run_artifact(inputs)` (harness/tester.py `run_method_and_compare_outputs`: reference first,
then `self.stages[stage].run_artifact(inputs_to_run)`, then `_compare_outputs`); Arm's own
Serialize stage uses the same seam to run on an FVP (arm/test/tester/serialize.py). bundlerun
plugs in there: for the duration of one `run_method_and_compare_outputs` call, the stage's
`run_artifact` bundles the lowered program with exactly those inputs and the Tester's own
reference outputs (the registry's resolved numbers embedded, bundles/from_program.py), runs
the bundle on the target (runner/session.py, one open Session: warm workers), records
bundlerun's verdict and hands the target's outputs back. The Tester then compares them as it
always does, so its failures, its ErrorStatistics (the suite's "Output N Error Max / MAE /
SNR" columns) and its golden-artifact dump describe what the device computed.

A run that could not happen on the target (the runner lacks the delegate, a crash, a timeout)
raises DeviceRunError, which the suite records as "PTE Run Failed" with the failure kind in
its Error column. A numerical FAIL by the registry's numbers does not change the Tester's
verdict unless `strict` is set (then it is an AssertionError, as the Tester's own mismatch).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bundlerun.runner.judging.outcome import EXIT_FAIL, EXIT_INFRA
from bundlerun.runner.suite.flows import FlowNumbers, numbers_for
from bundlerun.runner.suite.item_messages import error_message, failure_message
from bundlerun.targets.base import Verdict
from bundlerun.targets.failures import FailureKind
from bundlerun.bundles.errors import BundlerunError

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

# delegate backend id in a program -> registry backend (a Tester handed in without a flow)
DELEGATE_BACKENDS = {"XnnpackBackend": "xnnpack", "TOSABackend": "arm", "EthosUBackend": "arm", "VgfBackend": "arm",
                     "QnnBackend": "qnn", "VulkanBackend": "vulkan", "CoreMLBackend": "coreml",
                     "NeutronBackend": "nxp", "MLXBackend": "mlx"}


class DeviceRunError(RuntimeError):
    """The target could not run the program: the Tester (and the suite) see a run failure."""

    def __init__(self, message: str, kind: str | None = None, report_dir: Path | None = None):
        super().__init__(message)
        self.kind = kind
        self.report_dir = report_dir


@dataclass
class DeviceRecord:
    """bundlerun's view of one compare step: verdict with the registry's numbers, or why not run."""

    name: str
    target: str
    backend: str | None
    dtype: str
    reference: str
    verdict: str  # PASS | FAIL | ERROR | TIMEOUT
    exit_code: int
    failure_kind: str | None = None
    error: str | None = None
    report_dir: Path | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)  # name, verdict, criteria, stats, failed
    message: str = ""  # what a failed test says (runner/pytest_plugin.py failure/error message)
    elapsed_s: float | None = None

    def criteria_text(self) -> str:
        parts = []
        for o in self.outputs:
            c = o.get("criteria") or {}
            bits = [f"{k} {c[k]:g}" for k in ("atol", "rtol", "qtol", "sqnr_min_db", "cosine_min", "rel_frobenius_max")
                    if isinstance(c.get(k), (int, float))]
            if c.get("scale") is not None and c.get("qtol"):
                bits.append(f"scale {c['scale']:g}")
            if c.get("exact"):
                bits.append("exact")
            parts.append(f"{o.get('name')}: {' '.join(bits) or '-'}")
        return "; ".join(parts)

    def failed_text(self) -> str:
        out = []
        for o in self.outputs:
            for f in o.get("failed") or []:
                measured, limit = f.get("measured"), f.get("limit")
                out.append(f"{o.get('name')} {f.get('criterion')}: {_g(measured)} > {_g(limit)}"
                           if measured is not None else f"{o.get('name')} {f.get('criterion')}")
        return "; ".join(out)

    def columns(self) -> dict[str, Any]:
        """The bundlerun columns of the suite's CSV / JSON subtest metadata."""
        return {
            "bundlerun Target": self.target,
            "bundlerun Verdict": self.verdict,
            "bundlerun Failure Kind": self.failure_kind or "",
            "bundlerun Criteria": self.criteria_text(),
            "bundlerun Failed": self.failed_text() or (self.error or "")[:400],
            "bundlerun Backend": self.backend or "",
            "bundlerun Dtype": self.dtype,
            "bundlerun Reference": self.reference,
            "bundlerun Device Time (s)": "" if self.elapsed_s is None else f"{self.elapsed_s:.3f}",
            "bundlerun Report": str(self.report_dir / "report.json") if self.report_dir else "",
        }


def _g(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", text).strip("_")[:120] or "x"


class TargetRunner:
    """Runs bundles on one target for many Tester compare steps: one open Session (one warm
    runtime worker for host://, tosa://, ...), opened on first use. The only place this package
    asks runner/session.py to run anything."""

    def __init__(self, url: str, report_root: str | Path, *, timeout_s: float = 120.0,
                 session_provider: Callable[[], Any] | None = None, target_config: dict[str, Any] | None = None,
                 label: str | None = None, strict: bool = False, backend: str | None = None) -> None:
        self.url = url
        self.report_root = Path(report_root)
        self.timeout_s = timeout_s
        self.target_config = dict(target_config or {})
        self.label = label if label is not None else os.environ.get("BUNDLERUN_LABEL")
        self.strict = strict
        self.backend = backend  # registry backend override
        self._provider = session_provider
        self._own = None

    def session(self):
        if self._provider is not None:
            return self._provider()
        if self._own is None:
            from bundlerun.runner.session import Session  # start-up: loads flatbuffers, numpy on use

            self._own = Session.load(None, no_history=True).open()
        return self._own

    @property
    def registry(self):
        return self.session().registry

    def run(self, bundle_path: Path, report_dir: Path) -> "Report":
        from bundlerun.runner.session import RunRequest  # start-up: loads flatbuffers, numpy on use

        session = self.session()
        config = {**session.target_config(self.url), **self.target_config}
        return session.run(RunRequest(bundle_path=Path(bundle_path), target=self.url, report_dir=Path(report_dir),
                                      case_timeout_s=self.timeout_s, target_config=config, save_outputs=True,
                                      label=self.label))

    def close(self) -> None:
        own, self._own = self._own, None
        if own is not None:
            own.close()

    def __enter__(self) -> "TargetRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ------------------------------------------------------------------------------ the Tester side


def _stage_type():
    from executorch.backends.test.harness.stages import StageType

    return StageType


def program_of(tester: Any, stage: Any) -> bytes:
    """The serialized program of `stage` (Serialize: bytes; ToExecutorch: the manager's buffer),
    else of the Tester's Serialize / ToExecutorch stage."""
    StageType = _stage_type()
    for candidate in (stage, StageType.SERIALIZE, StageType.TO_EXECUTORCH):
        st = tester.stages.get(candidate) if candidate is not None else None
        artifact = getattr(st, "artifact", None) if st is not None else None
        if isinstance(artifact, (bytes, bytearray)):
            return bytes(artifact)
        if artifact is not None and hasattr(artifact, "buffer"):
            return bytes(artifact.buffer)
    raise RuntimeError("bundlerun: the Tester has no serialized program yet; run .to_executorch() "
                       "(and .serialize()) before run_method_and_compare_outputs")


def output_qparams(exported_program: Any) -> list[tuple[float, int] | None]:
    """(scale, zero point) of each output produced by a dequantize_per_tensor with constant
    parameters (as arm/test/runner_utils.py get_output_quantization_params reads them), else None.
    Matched by node name too: harness/tester.py _calculate_reference_output swaps the
    dequantize node's target for a shim and does not restore it."""
    import torch

    dq = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    out = exported_program.graph.output_node()
    args = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    params: list[tuple[float, int] | None] = []
    for node in args:
        found = None
        if getattr(node, "op", None) == "call_function" and (
                node.target == dq or str(node.name).startswith("dequantize_per_tensor")):
            a = node.args
            if len(a) >= 3 and isinstance(a[1], (int, float)) and isinstance(a[2], int):
                found = (float(a[1]), int(a[2]))
        params.append(found)
    return params


def model_ops(exported_program: Any) -> list[str]:
    """The aten operators of the exported model (what the registry's op rules match)."""
    names = set()
    for node in exported_program.graph.nodes:
        if node.op == "call_function":
            target = node.target
            names.add(target.name() if hasattr(target, "name") and callable(target.name) else
                      getattr(target, "__name__", str(target)))
    return sorted(names)


def reference_outputs(tester: Any, inputs: Any) -> tuple[list[Any], list[tuple[float, int] | None]]:
    """The Tester's own reference for `inputs`, as its compare computes it: ArmTester-style
    testers pick their reference stage (`_get_input_and_stages`: Quantize or the initial
    model); the harness Tester runs the EXPORT stage (`_calculate_reference_output`)."""
    from torch.utils import _pytree as pytree

    StageType = _stage_type()
    exported = tester.stages[StageType.EXPORT].artifact
    qparams = output_qparams(exported)
    if hasattr(tester, "_get_input_and_stages"):
        _, reference_stage, _ = tester._get_input_and_stages(inputs, None, None, False)
        flat, _ = pytree.tree_flatten(reference_stage.run_artifact(copy.deepcopy(inputs)))
        return flat, qparams
    output, _scale = tester._calculate_reference_output(exported, copy.deepcopy(inputs))
    flat, _ = pytree.tree_flatten(output)
    return flat, qparams


def delegate_backend(program: bytes) -> str:
    """The registry backend of the program's (first) delegate; portable when it has none."""
    from bundlerun.targets.program.walker import WalkError, read_delegates  # start-up: loads numpy on use

    try:
        ids = [d.backend_id for d in read_delegates(program)]
    except WalkError:
        ids = []
    for backend_id in ids:
        if backend_id in DELEGATE_BACKENDS:
            return DELEGATE_BACKENDS[backend_id]
    return "portable"


@dataclass
class CompareSpec:
    """Who is asking: the name of the test, where its report goes, the flow when there is one."""

    name: str
    report_dir: Path
    flow: str | None = None  # suite flow name
    suite_backend: str | None = None  # TestFlow.backend
    quantized: bool | None = None  # None: the Tester ran a Quantize stage
    extra: dict[str, Any] = field(default_factory=dict)  # manifest extra
    on_record: Callable[[DeviceRecord], None] | None = None


def attach(tester: Any, runner: TargetRunner, spec: CompareSpec) -> Any:
    """Make `tester.run_method_and_compare_outputs` run its compared stage on `runner`'s target.
    Returns the tester (for chaining). Records of every compare step go to spec.on_record and
    to `tester.bundlerun_records`."""
    original = tester.run_method_and_compare_outputs
    tester.bundlerun_records = []

    def run_method_and_compare_outputs(stage=None, inputs=None, *args: Any, **kwargs: Any):
        stage_type = stage or tester.cur
        stage_obj = tester.stages[stage_type]
        device = _DeviceArtifact(tester, program_of(tester, stage_type), runner, spec)
        stage_obj.run_artifact = device.run_artifact  # instance attribute: this call only
        try:
            result = original(stage, inputs, *args, **kwargs)
        finally:
            stage_obj.__dict__.pop("run_artifact", None)
        failed = [r for r in device.records if r.verdict == Verdict.FAIL]
        if runner.strict and failed:
            raise AssertionError(failed[0].message)
        return result

    tester.run_method_and_compare_outputs = run_method_and_compare_outputs
    return tester


class _DeviceArtifact:
    def __init__(self, tester: Any, program: bytes, runner: TargetRunner, spec: CompareSpec) -> None:
        self.tester, self.program, self.runner, self.spec = tester, program, runner, spec
        self.records: list[DeviceRecord] = []

    def numbers(self, tensors: list[Any]) -> FlowNumbers:
        StageType = _stage_type()
        quantized = self.spec.quantized
        if quantized is None:
            quantized = self.tester.stages.get(StageType.QUANTIZE) is not None
        suite_backend = self.spec.suite_backend or delegate_backend(self.program)
        return numbers_for(self.spec.flow or suite_backend, suite_backend, quantized, tensors, self.runner.backend)

    def run_artifact(self, inputs: Any) -> list[Any]:
        from torch.utils import _pytree as pytree

        flat_inputs, _ = pytree.tree_flatten(inputs)
        reference, qparams = reference_outputs(self.tester, inputs)
        numbers = self.numbers([*flat_inputs, *reference])
        k = len(self.records)
        report_dir = self.spec.report_dir if k == 0 else self.spec.report_dir.with_name(f"{self.spec.report_dir.name}-run{k}")
        record = self._run(flat_inputs, reference, qparams, numbers, report_dir)
        self.records.append(record)
        self.tester.bundlerun_records.append(record)
        if self.spec.on_record:
            self.spec.on_record(record)
        if record.exit_code == 2:
            raise DeviceRunError(record.message, record.failure_kind, record.report_dir)
        return self._outputs(record)

    def _run(self, inputs: list[Any], reference: list[Any], qparams: list, numbers: FlowNumbers,
             report_dir: Path) -> DeviceRecord:
        from bundlerun.bundles.from_program import ProgramBundleRequest, ProgramCase, bundle_program  # start-up: loads flatbuffers, numpy, tomli on use

        base = dict(name=self.spec.name, target=self.runner.url, backend=numbers.backend, dtype=numbers.dtype,
                    reference=numbers.reference)
        if numbers.problem:
            return DeviceRecord(**base, verdict=Verdict.ERROR, exit_code=2, failure_kind=FailureKind.BAD_CONFIG, error=numbers.problem,
                                message=f"bundlerun ERROR: {numbers.problem}")
        StageType = _stage_type()
        exported = self.tester.stages[StageType.EXPORT].artifact
        report_dir.mkdir(parents=True, exist_ok=True)
        try:
            built = bundle_program(ProgramBundleRequest(
                program=self.program, cases={"forward": [ProgramCase(inputs, reference)]}, backend=numbers.backend,
                dtype=numbers.dtype, target=self.runner.url, reference=numbers.reference,
                output_qparams={"forward": qparams}, model=self.spec.name,
                model_source=f"{type(self.tester).__module__}.{type(self.tester).__name__}",
                ops=model_ops(exported), quantization=f"suite flow {numbers.flow}" if self.spec.flow else None,
                registry=self.runner.registry,
                lowering={"source": "ExecuTorch Tester", "tester": type(self.tester).__name__,
                          **({"flow": self.spec.flow} if self.spec.flow else {})},
                extra=dict(self.spec.extra)), report_dir / "bundle.bpte")
            report = self.runner.run(built.path, report_dir)
        except BundlerunError as exc:
            return DeviceRecord(**base, verdict=Verdict.ERROR, exit_code=2, failure_kind=FailureKind.BAD_BUNDLE, error=str(exc),
                                report_dir=report_dir, message=f"bundlerun ERROR: {exc}")
        summary = report.summary
        case = report.cases[0] if report.cases else None
        record = DeviceRecord(**base, verdict=summary.verdict, exit_code=summary.exit_code,
                              failure_kind=case.error_kind.value if case and case.error_kind else None,
                              error=case.error if case else None, report_dir=report_dir,
                              outputs=[{"name": o.name, "verdict": o.verdict, "criteria": o.criteria_json(),  # the suite's
                                        "stats": o.stats_json(), "failed": o.failed_json(),  # JSON metadata
                                        "actual": o.actual} for o in (case.outputs if case else [])],
                              elapsed_s=case.elapsed_s if case else None)
        record.report = report  # type: ignore[attr-defined]
        if summary.exit_code == EXIT_INFRA:
            record.message = error_message(report, report_dir).replace(
                "bundlerun ERROR", f"bundlerun ERROR on {self.runner.url}", 1)
        elif summary.exit_code == EXIT_FAIL:
            record.message = failure_message(report, report_dir).replace(
                "bundlerun FAIL", f"bundlerun FAIL on {self.runner.url} (registry: {record.criteria_text()})", 1)
        return record

    def _outputs(self, record: DeviceRecord) -> list[Any]:
        """The target's outputs as torch tensors, in the program's output dtypes."""
        import numpy as np
        import torch

        report = getattr(record, "report", None)
        path = report.outputs_file if report is not None else None
        if not path or not Path(path).is_file():
            raise DeviceRunError(f"bundlerun: the run on {self.runner.url} kept no outputs ({record.report_dir})",
                                 "missing-output", record.report_dir)
        with np.load(path) as saved:
            arrays = [saved[f"forward/0/{j}"] for j in range(len(record.outputs)) if f"forward/0/{j}" in saved]
        outs = []
        for array, out in zip(arrays, record.outputs):
            dtype = (out.get("actual") or {}).get("dtype")
            if dtype == "bfloat16":
                outs.append(torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16))
            else:
                outs.append(torch.from_numpy(np.array(array, copy=True)))
        return outs
