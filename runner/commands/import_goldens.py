"""`bundlerun import-goldens DIR -o OUTDIR`: the backend test suite's golden artifacts -> .bpte bundles."""

from __future__ import annotations

from pathlib import Path

import click
from bundlerun.bundles.errors import BundlerunError


@click.command(name="import-goldens")
@click.argument("root", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder for the bundles (<OUT>/<flow>/<name>.bpte).")
@click.option("--target", default=None, metavar="URL",
              help="Target the tolerances are resolved for (default: the flow's, e.g. tosa://int for arm_tosa_int).")
@click.option("--backend", default=None, help="Registry backend (default: the flow's backend).")
@click.option("--dtype", default=None, help="dtype tier (default: int8 for quantizing flows, else fp32).")
def command(root, out_dir, target, backend, dtype):
    """Import a GOLDEN_ARTIFACTS_DIR tree written by ExecuTorch's backend test suite
    (per flow: <name>.pte, <name>_input[_i].bin, <name>_expected_output[_i].bin; dtypes and shapes
    read from the program) into bundles with resolved tolerances, replayable with `bundlerun run`
    on any target. A bad golden is one line naming its file; the others are still imported.
    Exit code 2 when any golden could not be imported."""
    from bundlerun.bundles.goldens import find_goldens, import_golden  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.suite.flows import default_target, numbers_from_name  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.safe_text import visible  # start-up: not loaded by `bundlerun --help`

    try:
        goldens, problems = find_goldens(root)
        from bundlerun.runner.session import Session  # optional: its failure to load is handled here

        registry = Session.load(None).registry
    except BundlerunError as exc:
        raise click.ClickException(visible(exc)) from None
    imported = 0
    for golden in goldens:
        result = import_golden(golden, out_dir, numbers_from_name(golden.flow),
                               target=target or default_target(golden.flow), backend=backend, dtype=dtype,
                               registry=registry)
        if result.error:
            problems.append(result)  # type: ignore[arg-type]
            continue
        imported += 1
        click.echo(f"{visible(result.path)}: {visible(result.criteria)}")
    for problem in problems:
        click.echo("error: " + visible(getattr(problem, "message", None) or getattr(problem, "error", "")), err=True)
    click.echo(f"imported {imported} of {len(goldens)} golden(s) into {visible(out_dir)}"
               + (f"; {len(problems)} problem(s)" if problems else ""))
    if problems:
        raise SystemExit(2)
