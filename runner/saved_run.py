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
from bundlerun.targets.base import CaseResult, CaseStatus, RawTensor, TargetRun


@dataclass
class SavedRun:
    directory: Path
    report: dict[str, Any]
    bundle: Bundle
    bundle_path: Path
    run: TargetRun
    warnings: list[str] = field(default_factory=list)


def load_saved_run(directory: str | Path, bundle_path: str | Path | None = None) -> SavedRun:
    """Report, bundle and actual outputs of the run saved in `directory`."""
    import numpy as np

    from bundlerun.bundles import scalar_types as st
    from bundlerun.bundles.fileio import file_sha256
    from bundlerun.runner.report import OUTPUTS_FILE, REPORT_FILE

    directory = Path(directory)
    report_file = directory / REPORT_FILE if directory.is_dir() else directory
    if directory.is_file():
        directory = directory.parent
    from bundlerun.runner.report_model import read_report

    report = read_report(report_file).to_json()
    outputs_file = directory / OUTPUTS_FILE  # the directory's own file first: copies stay self-contained
    if not outputs_file.is_file() and report.get("outputs_file"):
        outputs_file = Path(report["outputs_file"])
    if not outputs_file.is_file():
        raise BundlerunError(f"{directory} has no {OUTPUTS_FILE}: the run was not made with --save-outputs")

    warnings: list[str] = []
    recorded = report.get("bundle") or {}
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
            raise BundlerunError(f"bundle {path} changed since the run (sha256 differs); pass --bundle to judge anyway")
        warnings.append(f"bundle {path} is not the file the run used (sha256 differs)")
    bundle = read_bundle(path)

    with np.load(outputs_file, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    cases = []
    for case in report.get("cases", []):
        method, index = case["method"], int(case["case"])
        status = CaseStatus(case.get("status", "ok"))
        outs: list[RawTensor] = []
        if status == CaseStatus.OK:
            expected = bundle.suite(method).test_cases[index].expected_outputs
            j = 0
            while f"{method}/{index}/{j}" in arrays:
                arr = np.ascontiguousarray(arrays[f"{method}/{index}/{j}"])
                rec = next((o for o in case.get("outputs", []) if o.get("index") == j), {})
                dtype_name = (rec.get("actual") or {}).get("dtype")
                if dtype_name:
                    code = st.code_from_name(dtype_name)
                elif j < len(expected) and expected[j].kind == "tensor":
                    code = expected[j].scalar_type
                else:
                    code = st.code_from_numpy(arr.dtype)
                outs.append(RawTensor(code, list(arr.shape), arr.tobytes(), lossy=bool(rec.get("lossy", False))))
                j += 1
            if not outs and expected:
                status = CaseStatus.ERROR
                warnings.append(f"{method} case {index}: no saved outputs; judged as ERROR")
        cases.append(CaseResult(
            method, index, status, outs, error=case.get("error"), error_kind=case.get("error_kind"),
            log_excerpt=case.get("log_excerpt") or [], log_path=case.get("log_path"),
            elapsed_s=case.get("elapsed_s"), device_verdict=case.get("device_verdict"),
        ))
    target = report.get("target") or {}
    run = TargetRun(target.get("url", "?"), cases, info=target.get("info") or {}, logs=target.get("logs") or {},
                    setup_s=target.get("setup_s"))
    return SavedRun(directory, report, bundle, path, run, warnings)
