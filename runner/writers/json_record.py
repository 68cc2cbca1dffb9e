"""report.json, the record, as a registered format: written by write_reports after every other
format, so its `files` names them (runner/report/record.py writes it; the same atomic write and
the same check a reader makes). Commands that must keep the verdict before anything else runs
(an interrupted run, a farm's attempts) call record.write_record directly as well."""

from __future__ import annotations

from pathlib import Path

from bundlerun.runner.report.model import REPORT_FILE, Report
from bundlerun.runner.writers import Inputs, writer
from bundlerun.runner.report.record import write_record


@writer("json", REPORT_FILE, "JSON report", record=True)
def _write(report: Report, path: Path, inputs: Inputs) -> Path | None:
    """None when the folder refused it: then `report.unwritten` says so (record.write_record), and
    the command still prints the verdict and exits with its code."""

    return write_record(report, path.parent)
