"""`bundlerun debug BUNDLE --target URL [--case N] [--output NAME] [--report DIR]`: run one case
with every intermediate output and name the first layer whose error exceeds its share of
the output's budget (runner/debug/localize.py). Exit codes: 0 no layer exceeds, 1 a first bad layer
was found, 2 could not run (no ETRecord, a target that cannot dump intermediates, ...)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bundlerun.targets import capture_schemes
from bundlerun.bundles.errors import BundlerunError
from bundlerun.bundles.sequence import first_failing_step, from_manifest
from bundlerun.targets.base import Verdict

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report


def run_debug(bundle: Path, target: str, case: int | None = None, output: str | None = None,
              report_dir: Path | None = None, history_db: Path | None = None, method: str = "forward",
              timeout: float = 600.0, debug_buffer_mb: int = 64, as_json: bool = False, quiet: bool = False,
              case_source: str | None = None, target_config: dict | None = None):
    """The command's work (also used by `run --debug-on-fail`); returns the DebugResult."""
    from bundlerun.runner.debug.localize import debug_bundle  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.debug.localize_report import rich_table, verdict_line, write_debug_reports  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.console import wide_console  # start-up: not loaded by `bundlerun --help`

    work = (report_dir / "work") if report_dir else None
    result = debug_bundle(bundle, target, case=case, output=output, method=method, work_dir=work,
                          history_db=history_db, timeout_s=timeout, debug_buffer_mb=debug_buffer_mb,
                          target_config=target_config)
    if case_source:
        result.case_source = case_source
    files = write_debug_reports(result, report_dir) if report_dir else {}
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, default=str))
    elif not quiet:
        from bundlerun.runner.report.safe_text import visible  # names in these lines come from the bundle

        console = wide_console()
        console.print(rich_table(result))
        from bundlerun.runner.debug.localize_report import merged_into  # start-up: not loaded by `bundlerun --help`

        from bundlerun.runner.debug.localize_report import where_text  # start-up: not loaded by `bundlerun --help`

        merged = steps = 0
        for row in result.rows:
            if row.status == "unmatched" and row.compared_at is not None:
                steps += 1
            elif row.status == "unmatched" and merged_into(row, result.rows) is not None:
                merged += 1
            elif row.status == "unmatched":
                console.print(visible(f"row {row.index} ({where_text(row)}, {row.runtime_op}): unmatched: {row.note}"),
                              markup=False)
        if merged:
            console.print(f"{merged} unmatched row(s) marked 'unmatched→#N': their debug handles overlap row N's, so the "
                          "Inspector merges them and compares the group's output there (notes in report.json)",
                          markup=False)
        if steps:
            console.print(f"{steps} row(s) inside delegates marked 'step→#N': a step of an eager node's computation "
                          "(a layout transpose, part of a decomposition) whose value no eager node holds; the node's "
                          "output is compared at row N", markup=False)
        for note in result.notes:
            console.print(f"note: {visible(note)}", markup=False)
        if (result.export_divergence or {}).get("finding"):  # runner/debug/export_divergence.py
            from bundlerun.runner.debug.export_divergence import print_divergence  # start-up: not loaded by `bundlerun --help`

            print_divergence(result.export_divergence, console)
        found = result.first_bad is not None or (result.export_divergence or {}).get("finding")
        console.print(visible(verdict_line(result)), markup=False, style="bold red" if found else "green")
    if files:
        click.echo(f"debug report: {files['json']}", err=True)
    return result


@click.command(name="debug")
@click.argument("bundle", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--target", default="host://xnnpack", show_default=True,
              help=f"Target URL. These return intermediates (their modules declare a capture): "
                   f"{', '.join(capture_schemes())}; others say what they would need.")
@click.option("--case", "case", type=click.IntRange(min=0), default=None,
              help="Case index (default: the worst failing case of this bundle's last recorded run, else 0).")
@click.option("--output", default=None, help="Output name whose budget is split over the layers (default: the first).")
@click.option("--method", default="forward", show_default=True)
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=None,
              help="Write report.json (debug section), summary.md and report.html here.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds for the debug run.")
@click.option("--debug-buffer-mb", type=click.IntRange(min=1), default=64, show_default=True,
              help="Size of the runtime's debug buffer for intermediate outputs: host:// and runners that take it "
                   "at run time; qemu:// builds (or finds) an --etdump runner with this buffer (at most 64); a given "
                   "debug_elf keeps the size it was built with.")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="bundlerun.toml to use (default: searched upward from the current directory).")
@click.option("--target-opt", "target_opts", multiple=True, metavar="KEY=VALUE",
              help="Target setting (overrides [targets.<scheme>] in config), as for `run`.")
@click.option("--history", "history_db", default=None, envvar="BUNDLERUN_HISTORY", metavar="PATH|URL",
              help="History database to find the last run's worst case in.")
@click.option("--json", "as_json", is_flag=True, help="Print the debug result as JSON.")
def command(bundle, target, case, output, method, report_dir, timeout, debug_buffer_mb, config_path, target_opts,
            history_db, as_json):
    """Name the first layer of BUNDLE that goes wrong on --target (needs `build --etrecord`)."""
    from bundlerun.runner.history.store import resolve_history_path  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.session import Session  # start-up: not loaded by `bundlerun --help`

    session = Session.load(config_path, target_opts=tuple(target_opts), history_db=history_db)
    db = resolve_history_path(history_db, session.project)
    result = run_debug(bundle, target, case, output, report_dir, db, method, timeout, debug_buffer_mb, as_json,
                       target_config=session.target_config(target))
    sys.exit(1 if result.first_bad is not None or (result.export_divergence or {}).get("finding") else 0)


def debug_on_fail(bundle: Path, target: str, report: "Report", report_dir: Path, quiet: bool = False,
                  target_config: dict | None = None) -> None:
    """`run --debug-on-fail`: drill into the run's worst failing case; never changes the run's exit code."""
    from bundlerun.runner.debug.localize import worst_failing_case  # start-up: not loaded by `bundlerun --help`

    from bundlerun.bundles.bpte import read_bundle  # start-up: not loaded by `bundlerun --help`

    sequences = from_manifest(read_bundle(bundle).manifest)
    for method in dict.fromkeys(c.method for c in report.cases):
        failing = {c.case for c in report.cases if c.method == method and c.verdict == Verdict.FAIL}
        first = first_failing_step(sequences, method, failing) if sequences else None
        case = first if first is not None else worst_failing_case(report, method)
        if case is None:
            continue
        source = ("first diverging step of its sequence in this run" if first is not None
                  else "worst failing case of this run")
        try:
            run_debug(bundle, target, case, None, report_dir, None, method, quiet=quiet,
                      case_source=f"{source} (--debug-on-fail)", target_config=target_config)
        except BundlerunError as exc:
            click.echo(f"debug-on-fail: {exc}", err=True)
        return
