"""`bundlerun judge REPORT_DIR`: re-judge the saved outputs of an earlier run.

Nothing runs again: the actual outputs come from `outputs.npz` (written by
`run --save-outputs`), the expected outputs and criteria from the bundle's
embedded manifest, and `--override` changes criteria for this verdict only
(recorded in the new report). The original report is never modified.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from bundlerun.runner import seal
from bundlerun.runner.report.model import elapsed_figures

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report


@click.command(name="judge")
@click.argument("report_dir", type=click.Path(path_type=Path))
@click.option("--override", "overrides", multiple=True, metavar="[METHOD.]OUTPUT.KEY=VALUE",
              help="Criterion to change for this verdict, e.g. out0.atol=0.05 (repeatable).")
@click.option("--bundle", "bundle_path", type=click.Path(path_type=Path), default=None,
              help="The bundle, when it moved since the run (default: the path in the report).")
@click.option("--report", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Write the new report.json (and outputs.npz link) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the new summary and overrides as JSON.")
@click.option("--quiet", is_flag=True, help="No table; the exit code says it all.")
@seal.option
@click.pass_context
def command(ctx, report_dir, overrides, bundle_path, out_dir, as_json, quiet):
    """Re-judge the outputs saved in REPORT_DIR (from `run --save-outputs`).

    Exit code: 0 all passed, 1 numerical failure, 2 errors in the original run or bad input.
    """
    report = rejudge(report_dir, list(overrides), bundle_path, out_dir, require_seal=seal.required())
    if as_json:
        import json

        click.echo(json.dumps({"summary": report.summary.to_json(), "overrides": report.overrides,
                               "previous_summary": report.judged["previous_summary"]}, indent=2))
    elif not quiet:
        from bundlerun.runner.report.console import print_summary  # start-up: not loaded by `bundlerun --help`

        print_summary(report)
    from bundlerun.runner.report.console import exit_code, warn_unwritten  # start-up: not loaded by `bundlerun --help`

    warn_unwritten(report)
    ctx.exit(exit_code(report))


def rejudge(report_dir: Path, overrides: list[str], bundle_path: Path | None = None,
            out_dir: Path | None = None, require_seal: bool = False) -> "Report":
    """The report of `report_dir` judged again (with overrides); written to out_dir if given."""
    import copy
    import datetime as _dt
    import shutil

    from bundlerun.runner.judging.judge import judge_run, judge_sequences, load_context, summarize  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.judging.overrides import apply_overrides  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.record import OUTPUTS_FILE  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.history.saved_run import load_saved_run  # start-up: not loaded by `bundlerun --help`

    from bundlerun.runner.judging.overrides import parse_overrides  # start-up: not loaded by `bundlerun --help`

    parsed = parse_overrides(overrides)  # bad input fails before anything is read
    saved = load_saved_run(report_dir, bundle_path, require_seal=require_seal)
    ctx = load_context(saved.bundle)
    records = apply_overrides(ctx, saved.bundle, parsed)
    cases, warnings = judge_run(saved.bundle, saved.run, ctx)
    old = saved.report
    report = copy.deepcopy(old)
    report.cases = cases
    report.summary = summarize(cases)
    report.sequences = judge_sequences(ctx, cases)
    elapsed_figures(report.cases, report.target.get("url", ""))  # as a run's report has them
    report.overrides = records
    from bundlerun.runner.history.series import criteria_digest  # an --override is other criteria: another series

    report.bundle["criteria_sha256"] = criteria_digest(cases)
    report.warnings = list(dict.fromkeys(saved.warnings + warnings))
    report.judged = {
        "from": str(saved.directory),
        "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "previous_summary": old.summary.to_json(),
        "previous_overrides": old.overrides,
        "note": "re-judged from saved outputs with the bundle's embedded criteria",
    }
    if out_dir is not None:
        from bundlerun.bundles.fileio import named  # start-up: not loaded by `bundlerun --help`
        from bundlerun.runner import arguments  # start-up: not loaded by `bundlerun --help`

        out_dir = arguments.report_folder(out_dir)
        src = saved.outputs_file or saved.directory / OUTPUTS_FILE  # the file that was checked and judged
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            if src.resolve() != (out_dir / OUTPUTS_FILE).resolve():
                shutil.copyfile(src, out_dir / OUTPUTS_FILE)
        except OSError as exc:  # a full disk: one line naming the file (runner/cli.py main), exit 2
            (out_dir / OUTPUTS_FILE).unlink(missing_ok=True)
            raise named(exc, out_dir / OUTPUTS_FILE) from None
        report.outputs_file = str(out_dir / OUTPUTS_FILE)
        from bundlerun.runner.history.saved_outputs import file_digest  # start-up: not loaded by `bundlerun --help`

        report.outputs_sha256 = file_digest(out_dir / OUTPUTS_FILE)
        from bundlerun.runner.writers import write_reports  # start-up: not loaded by `bundlerun --help`

        write_reports(report, out_dir, bundle=saved.bundle)  # every format of the new verdict, report.json last
    return report
