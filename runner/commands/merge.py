"""`bundlerun merge REPORT.json... --report DIR`: reports -> one report (the CLI of runner/report/merge.py).

The shards of one bundle on one target (`bundlerun run B --shard i/n`), of a farm (`bundlerun
farm PLAN --shard i/n`) or the reports of `validate --shard` merge into one report; the merge
itself, with its checks (different bundles/targets/overrides, overlapping and missing shards),
is `runner.report.merge.merge_reports` (see its docstring and docs/ci.md). This module reads the
reports, writes the merged one with the usual writers (report.json, junit.xml, summary.md,
report.html), annotates it under GitHub Actions and exits with its code; a refused merge
(`MergeError`) is one line and exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
import click

from bundlerun.runner.report.merge import MergeError, MergeOptions, merge_reports  # noqa: F401 - MergeError re-exported
from bundlerun.runner.report.model import Report, read_report


def write_merged(report: Report, out_dir: Path) -> dict[str, Path]:
    """Every registered format into out_dir (report.json last, with the file list)."""
    from bundlerun.runner.writers import write_reports  # start-up: not loaded by `bundlerun --help`

    out_dir = Path(out_dir)
    bundle_path = report.bundle.get("path")
    return write_reports(report, out_dir, bundle=bundle_path if bundle_path and Path(bundle_path).is_file() else None)


@click.command(name="merge")
@click.argument("reports", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--report", "report_dir", type=click.Path(path_type=Path), required=True,
              help="Folder for the merged report (report.json, junit.xml, summary.md, report.html).")
@click.option("--force", is_flag=True, help="Merge reports of different bundles/targets/overrides, or overlapping shards.")
@click.option("--allow-partial", is_flag=True, help="Merge even if shards are missing: their cases become errors.")
@click.option("--json", "as_json", is_flag=True, help="Print the merged summary as JSON on stdout.")
def command(reports, report_dir, force, allow_partial, as_json):
    """Merge shard reports (REPORT.json files or their folders) into one report in --report DIR.

    Shards of a run or of a farm give the same cases, verdicts and exit code as one unsharded
    run (0 pass, 1 numerical failure, 2 could not run). Different bundles/targets, overlapping
    and missing shards are refused with the cases (or jobs) named.
    """
    import json

    from bundlerun.runner.writers import github  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.safe_text import visible  # start-up: not loaded by `bundlerun --help`

    paths = [p / "report.json" if p.is_dir() else p for p in reports]
    loaded = [read_report(p) for p in paths]
    merged = merge_reports(loaded, MergeOptions(force=force, allow_partial=allow_partial, paths=[str(p) for p in paths]))
    merged.run["command"] = ["bundlerun", "merge", *map(str, reports), "--report", str(report_dir)]
    write_merged(merged, report_dir)
    record = next((u for u in merged.unwritten if Path(u["file"]).name == "report.json"), None)
    if record is not None:  # the merge's record is its report.json: without it the merge did not happen
        click.echo(f"bundlerun: error: could not write {visible(record['file'])}: {visible(record['error'])} (the "
                   "merged report is not recorded)", err=True)
        sys.exit(2)
    github.annotate(merged, report_dir / "report.json", stream=sys.stderr if as_json else None)
    s = merged.summary
    if as_json:
        click.echo(json.dumps({"summary": s.to_json(), "report": str(report_dir / "report.json"),
                               "merged": merged.extras["merged"], "warnings": merged.warnings}, indent=2))
    else:
        counts = ", ".join(f"{k} {v}" for k, v in s.counts.items() if v)
        click.echo(f"merged {len(paths)} report(s): {s.verdict} ({s.cases} cases; {counts or 'no outputs'})")
        for w in merged.warnings:
            click.echo(f"warning: {visible(w)}", err=True)  # warnings come from the merged files
    from bundlerun.runner.report.console import say_report  # start-up: not loaded by `bundlerun --help`

    say_report(merged, report_dir)
    sys.exit(s.exit_code)
