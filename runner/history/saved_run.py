"""Read back an earlier run (`report.json` + `outputs.npz` + the bundle) as a TargetRun.

`judge` re-judges it and `tolerance suggest --from` calibrates from it, without
running anything again. The bundle is found through the report (its path and
sha256); a different file is refused unless named explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundlerun.bundles.bpte import Bundle, read_bundle
from bundlerun.bundles.errors import BundlerunError
from bundlerun.runner.report.model import Report
from bundlerun.targets.base import CaseResult, CaseStatus, RawTensor, TargetRun
from bundlerun.targets.failures import FailureKind
from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.fileio import file_sha256
from bundlerun.runner.history.saved_outputs import Expect, OutputsError, file_digest, read_outputs
from bundlerun.runner.report.model import read_report
from bundlerun.runner.report.record import OUTPUTS_FILE, REPORT_FILE


@dataclass
class SavedRun:
    directory: Path
    report: Report
    bundle: Bundle
    bundle_path: Path
    run: TargetRun
    warnings: list[str] = field(default_factory=list)
    outputs_file: Path | None = None  # the outputs.npz that was read (checked by sha256 and member by member)


def _expectations(report: Report, bundle: Bundle, where: str) -> dict[str, Any]:
    """What each member of outputs.npz must be (runner/history/saved_outputs.py): one per output of every
    finished case, with the dtype the report recorded and at most the bytes of the bundle's
    expected output (a recorded wrong-size actual output: at most 16x that, plus 1 MiB)."""
    import math

    expect: dict[str, Expect] = {}
    for i, case in enumerate(report.cases):
        method, index = case.method, case.case
        at = f"{where}: cases[{i}]"
        if case.status != CaseStatus.OK:
            continue
        try:
            suite = bundle.suite(method)
        except KeyError:
            raise BundlerunError(f"{at}: method {method!r} is not in the bundle (methods: "
                                 f"{', '.join(s.method_name for s in bundle.method_test_suites)})") from None
        if not 0 <= index < len(suite.test_cases):
            raise BundlerunError(f"{at}: case {index} of {method!r} is not in the bundle (cases 0-"
                                 f"{len(suite.test_cases) - 1})")
        records = {o.index: o for o in case.outputs}
        for j, value in enumerate(suite.test_cases[index].expected_outputs):
            if value.kind != "tensor":
                continue
            rec = records.get(j)
            actual = (rec.actual if rec else None) or {}
            try:
                code = st.code_from_name(actual["dtype"]) if actual.get("dtype") else value.scalar_type
                dtype = st.numpy_dtype(code)
            except st.UnsupportedScalarType as exc:
                raise BundlerunError(f"{at}.outputs[{j}].actual.dtype: {exc}") from None
            limit = len(value.data)
            shape = actual.get("shape")
            if isinstance(shape, list) and shape != list(value.sizes):
                recorded = math.prod(shape) * dtype.itemsize
                limit = max(limit, min(recorded, 16 * limit + (1 << 20)))
            limit = max(limit, math.prod(value.sizes) * dtype.itemsize)  # same shape, other dtype width
            expect[f"{method}/{index}/{j}"] = Expect(dtype, limit)
    return expect


def load_saved_run(directory: str | Path, bundle_path: str | Path | None = None,
                   require_seal: bool = False) -> SavedRun:
    """Report, bundle and actual outputs of the run saved in `directory`. Every file is checked
    before it is used: the report by the strict reader, the bundle by its own (and its seal with
    `require_seal`), outputs.npz by its sha256 in the report and member by member against the
    bundle (runner/history/saved_outputs.py)."""

    directory = Path(directory)
    report_file = directory / REPORT_FILE if directory.is_dir() else directory
    if directory.is_file():
        directory = directory.parent

    report = read_report(report_file)
    outputs_file = directory / OUTPUTS_FILE  # the directory's own file first: copies stay self-contained
    if not outputs_file.is_file() and report.outputs_file:
        outputs_file = Path(report.outputs_file)
    if not outputs_file.is_file():
        raise BundlerunError(f"{directory} has no {OUTPUTS_FILE}: the run was not made with --save-outputs")

    warnings: list[str] = []
    recorded = report.bundle
    explicit = bundle_path is not None
    path = Path(bundle_path or recorded.get("path") or "")
    if not explicit and not path.is_absolute():
        # a relative path was relative to where `run` was started: try the usual places
        for base in (Path.cwd(), directory, directory.parent):
            if (base / path).is_file():
                path = base / path
                break
    if not path.is_file():
        raise BundlerunError(f"bundle {path} of the run in {directory} is gone; pass it with --bundle")
    sha = recorded.get("sha256")
    if sha and file_sha256(path) != sha:
        if not explicit:
            raise BundlerunError(f"{report_file}: bundle {path} changed since the run (sha256 differs); pass "
                                 "--bundle to judge anyway")
        warnings.append(f"bundle {path} is not the file the run used (sha256 differs)")
    bundle = read_bundle(path, require_seal=require_seal)

    recorded_sha = report.outputs_sha256
    if recorded_sha:
        actual_sha = file_digest(outputs_file)
        if actual_sha != recorded_sha:
            raise OutputsError(f"{outputs_file}: not the outputs the run saved (sha256 {actual_sha[:16]}..., the "
                               f"report records {str(recorded_sha)[:16]}...): replaced or edited; nothing judged")
    else:
        warnings.append(f"{report_file}: records no outputs_sha256 (written by an older bundlerun): "
                        f"{outputs_file} cannot be checked against replacement")
    arrays = read_outputs(outputs_file, _expectations(report, bundle, str(report_file)))
    cases = []
    for case in report.cases:
        method, index = case.method, case.case
        status = CaseStatus(case.status)
        outs: list[RawTensor] = []
        if status == CaseStatus.OK:
            expected = bundle.suite(method).test_cases[index].expected_outputs
            j = 0
            while f"{method}/{index}/{j}" in arrays:
                arr = arrays[f"{method}/{index}/{j}"]
                rec = next((o for o in case.outputs if o.index == j), None)
                dtype_name = ((rec.actual if rec else None) or {}).get("dtype")
                code = st.code_from_name(dtype_name) if dtype_name else expected[j].scalar_type
                outs.append(RawTensor(code, list(arr.shape), arr.tobytes(), lossy=bool(rec and rec.lossy)))
                j += 1
        error, kind = case.error, case.error_kind
        if status == CaseStatus.OK and not outs and expected:  # the case ran, but its outputs are not in the file
            status, kind = CaseStatus.ERROR, FailureKind.MISSING_OUTPUT
            error = f"no saved output of this case in {outputs_file}: nothing to judge"
            warnings.append(f"{method} case {index}: {error}; judged as ERROR")
        cases.append(CaseResult(
            method, index, status, outs, error=error, error_kind=kind,
            log_excerpt=list(case.log_excerpt), log_path=case.log_path,
            elapsed_s=case.elapsed_s, device_verdict=case.device_verdict,
        ))
    target = report.target
    run = TargetRun(target.get("url", "?"), cases, info=target.get("info") or {}, logs=target.get("logs") or {},
                    setup_s=target.get("setup_s"))
    return SavedRun(directory, report, bundle, path, run, warnings, outputs_file)
