"""Whether a run of a bundle fits in its report, said when the bundle is built (issue 36): a user
learns before a long run that `run --save-outputs` cannot keep every raw output, or that
report.json would pass the size its readers take, not after it.

Both bounds are bundlerun's own (bundles/limits.py; no ExecuTorch source sets them):

- the raw outputs of one run (every case's outputs, as `--save-outputs` writes them into
  outputs.npz) against MAX_REPORT_OUTPUTS_BYTES: each reader of that file holds it whole;
- report.json (one record per judged output, read whole) against MAX_REPORT_BYTES, at about
  OUTPUT_RECORD_BYTES a record.
"""

from __future__ import annotations

from typing import Any

from bundlerun.bundles.limits import MAX_REPORT_BYTES, MAX_REPORT_OUTPUTS_BYTES

# bytes one judged output adds to report.json: 4,266 measured for tiny-cnn's fp32 output (its
# statistics, criteria and their trail; 2026-12-05), rounded up. An estimate, for a warning only.
OUTPUT_RECORD_BYTES = 4608


def run_size(bundle: Any) -> tuple[int, int]:
    """(bytes of every case's expected outputs, number of outputs judged) of a parsed Bundle: what
    a run of all its cases brings back (the runtime's outputs have the expected outputs' sizes)."""
    total = count = 0
    for suite in bundle.method_test_suites:
        for case in suite.test_cases:
            for value in case.expected_outputs:
                total += len(value.data or b"")
                count += 1
    return total, count


def report_fit(output_bytes: int, outputs: int) -> list[str]:
    """One warning per report bound a run of all the cases would pass; [] when it fits."""
    warnings = []
    if output_bytes > MAX_REPORT_OUTPUTS_BYTES:
        warnings.append(
            f"a run of every case brings back {output_bytes / (1 << 20):,.0f} MiB of outputs, more than the "
            f"{MAX_REPORT_OUTPUTS_BYTES >> 20} MiB a report keeps (bundlerun's bound on outputs.npz, which its "
            "readers hold whole): `run --save-outputs` will keep none; judge it anyway, or build fewer --cases")
    record = outputs * OUTPUT_RECORD_BYTES
    if record > MAX_REPORT_BYTES:
        warnings.append(
            f"{outputs:,} judged outputs make a report.json of about {record / (1 << 20):,.0f} MiB, more than the "
            f"{MAX_REPORT_BYTES >> 20} MiB bundlerun reads back (`compare`, `judge`, history): build fewer --cases "
            "or run a part at a time (--select, --shard)")
    return warnings


def bundle_report_fit(bundle: Any) -> list[str]:
    """`report_fit` of a parsed Bundle."""
    return report_fit(*run_size(bundle))
