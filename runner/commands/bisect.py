"""`bundlerun bisect MODEL --target URL [--case N] [--report DIR]`: re-lower MODEL with the delegate
restricted to subsets of the nodes it takes, run the failing case of each candidate on URL, and
name the smallest set of delegated nodes whose delegation makes it fail (runner/debug/bisect.py).
Exit codes: 0 nothing fails, 1 culprit found (or: fails with nothing delegated), 2 could not run,
130/143 interrupted (the report of what was found is written)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bundlerun.runner.cli import _apply, llm_options, _report_dir, llm_request, parse_tolerances, resolve_backend_dtype
from bundlerun.targets import default_backend


def _seconds(ctx, param, value):
    from bundlerun.runner.cli import _positive_seconds  # the one --timeout rule of every command

    return _positive_seconds(ctx, param, value)


@click.command(name="bisect")
@click.argument("model")
@click.option("--target", default="host://xnnpack", show_default=True, help="Target URL the candidates run on.")
@click.option("--case", "case", type=click.IntRange(min=0), default=None,
              help="The failing case index (default 0; for llm:ARCH the first diverging step of its sequences, "
                   "whose earlier steps every candidate replays first).")
@click.option("--method", default="forward", show_default=True)
@click.option("--output", default=None, help="Judge only this output (default: any failing output counts).")
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=None,
              help="Folder for report.json, summary.md and every candidate's bundle and run (default out/bisect-MODEL).")
@click.option("--backend", default=None, help="Lowering backend (default: the one --target declares).")
@click.option("--dtype", default=None, help="As for `build` (default: the backend's default for --target).")
@click.option("--cases", "num_cases", type=click.IntRange(min=1), default=8, show_default=True,
              help="Cases bundled in each candidate (as the failing bundle was built).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--reference", type=click.Choice(["eager-fp32", "eager-dtype", "quantized"]), default=None)
@click.option("--distribution", default=None)
@click.option("--tolerance", "tolerances", multiple=True, metavar="KEY=VALUE", help="As for `build`.")
@click.option("--no-cache", is_flag=True, help="Build every candidate even when the build cache has it.")
@click.option("--timeout", type=float, default=120.0, show_default=True, callback=lambda c, p, v: _seconds(c, p, v),
              help="Seconds for the case on the target.")
@click.option("--max-lowerings", type=click.IntRange(min=2), default=None,
              help="Stop after this many candidates (default: the bound for up to four culprit nodes).")
@click.option("--undelegated-target", default="host://portable", show_default=True,
              help="Where the build with nothing delegated runs when --target refuses a program without its delegate "
                   "(qnn:// does): the same ExecuTorch portable kernels on this host.")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None)
@click.option("--target-opt", "target_opts", multiple=True, metavar="KEY=VALUE", help="Target setting, as for `run`.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@_apply(llm_options)
def command(model, target, case, method, output, report_dir, backend, dtype, num_cases, seed, reference, distribution,
            tolerances, no_cache, timeout, max_lowerings, undelegated_target, config_path, target_opts, as_json,
            size, params, checkpoint, tokenizer, prompts, decode_steps, max_seq_len):
    """Find the delegated node(s) of MODEL (zoo name, path.py:factory or llm:ARCH) that make a case fail on --target."""
    from bundlerun.runner.debug.bisect import BisectRequest, Bisector  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.debug.bisect_report import print_result, write_reports  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.report.console import wide_console  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.session import Session  # start-up: not loaded by `bundlerun --help`

    llm = llm_request(model, size, params, checkpoint, tokenizer, prompts, decode_steps, max_seq_len)
    if llm is not None:  # export_llama's own path for the target's backend, its own dtypes, as `build` does
        from bundlerun.bundles.llm_arch import llm_backend  # start-up: not loaded by `bundlerun --help`

        backend = backend or llm_backend(default_backend(target))
    else:
        backend, dtype = resolve_backend_dtype(target, backend, dtype)
    slug = Path(model.split(":")[0]).stem if ":" in model else model
    report_dir = _report_dir(report_dir or Path("out") / f"bisect-{slug}")
    session = Session.load(config_path, target_opts=tuple(target_opts), no_history=True)
    from bundlerun.runner.debug.bisect import check_request  # start-up: not loaded by `bundlerun --help`

    req = BisectRequest(model=model, target=target, report_dir=report_dir, case=case, method=method, output=output,
                        backend=backend, dtype=dtype, cases=num_cases, seed=seed, reference=reference,
                        distribution=distribution, overrides=parse_tolerances(tolerances), cache=not no_cache,
                        timeout_s=timeout, max_lowerings=max_lowerings, target_config=session.target_config(target),
                        undelegated_target=undelegated_target, llm=llm)
    check_request(req)  # every option, before the first lowering (exit 2)
    console = wide_console(stderr=True)
    with session:
        bisector = Bisector(req, session, progress=lambda m: console.print(m, markup=False, highlight=False))
        result = bisector.run()
    if result.outcome == "fails-undelegated" and not result.interrupted and bisector.model is not None:
        from bundlerun.runner.debug.export_divergence import check_model  # start-up: not loaded by `bundlerun --help`

        result.export_divergence = check_model(bisector.model, result, report_dir)
    files = write_reports(result, report_dir)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, default=str))
    else:
        print_result(result, wide_console())
    click.echo(f"bisect report: {files['json']}", err=True)
    sys.exit(result.exit_code)
