"""`bundlerun accuracy MODEL --dataset D`: dataset top-1/top-5 on a target vs the float model.

The N labelled samples become the bundle's test cases (labels in the
manifest's `dataset` field), the bundle runs through the same machinery as
`bundlerun run` (so every case is also judged element-wise), and the saved
outputs give top-1/top-5 for the target and for the eager float reference
(the bundle's expected outputs), their paired difference with a confidence
interval, and the agreement rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bundlerun.runner.judging.outcome import EXIT_FAIL, EXIT_INFRA, EXIT_PASS
from bundlerun.targets.base import Verdict
from bundlerun.runner.cli import make_session, parse_tolerances, resolve_backend_dtype
from bundlerun.targets import lowering_info

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report


@dataclass
class AccuracyRequest:
    model: str
    dataset: str
    target: str = "host://xnnpack"
    dtype: str = "fp32"
    samples: int | None = None
    report_dir: Path = Path("out/accuracy")
    backend: str | None = None
    label: str | None = None
    session: Any = None  # runner.session.Session: config, target options, history, baseline (default: an empty one)
    case_timeout_s: float = 120.0
    setup_timeout_s: float = 300.0
    confidence: float = 0.95
    tolerances: dict[str, float] = field(default_factory=dict)
    progress: Any = None
    cache: bool = False  # reuse a build from the build cache (the CLI's default; --no-cache turns it off)


def run_accuracy(req: AccuracyRequest) -> Report:
    """Build, run, measure; write report.json (+ derived reports) and record history. Returns the report."""
    from bundlerun.bundles.builder import BuildRequest, build_bundle  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.datasets import fit_to_inputs, load_dataset  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.model_source import resolve_model  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.session import RunRequest, Session  # start-up: not loaded by `bundlerun --help`

    session = req.session or Session()
    say = req.progress or (lambda _m: None)
    report_dir = Path(req.report_dir)
    say(f"loading dataset {req.dataset}")
    dataset = load_dataset(req.dataset).head(req.samples)
    model = resolve_model(req.model)
    dataset = fit_to_inputs(dataset, model.inputs)
    slug = f"{model.name}-{req.dtype}-{dataset.name}"
    bundle_path = report_dir / f"{slug}.bpte"
    # Real samples give PTQ the real activation ranges (random inputs clip the logits).
    calibrated_on = (f"{len(dataset.calibration)} {dataset.name} training samples" if dataset.calibration
                     else "model input distribution")
    build = build_bundle(
        BuildRequest(
            calibration=dataset.calibration or None,
            model=req.model,
            output=bundle_path,
            backend=req.backend,
            target=req.target,
            target_info=lowering_info(req.target),
            dtype=req.dtype,
            cases=len(dataset.labels),
            dataset=dataset.manifest_entry(),
            resolved_model=model,
            overrides=dict(req.tolerances),
            progress=say,
            registry=session.registry,
            cache=req.cache,
        )
    )
    say(f"running {len(dataset.labels)} samples on {req.target}")
    def amend(report: Report) -> None:
        report.dataset["source"] = dataset.source
        if req.dtype in ("int8", "int16"):
            report.dataset["calibration"] = calibrated_on

    return session.run(
        RunRequest(
            bundle_path=build.path,
            target=req.target,
            report_dir=report_dir,
            case_timeout_s=req.case_timeout_s,
            setup_timeout_s=req.setup_timeout_s,
            save_outputs=True,
            label=req.label,
            confidence=req.confidence,
        ),
        amend=amend,
    )


def print_accuracy(report: Report) -> None:
    ds = report.dataset
    if ds is None:  # not a dataset run: nothing to print
        return
    conf = int(ds["confidence"] * 100)
    lo, hi = ds["top1_diff_ci"]
    bundle = report.bundle
    from bundlerun.runner.report.safe_text import visible  # model id and dataset name come from the bundle

    click.echo(visible(
        f"{bundle.get('model')} {bundle.get('dtype')} on {report.target.get('url')}: "
        f"{ds['name']}, {ds['evaluated']} samples" + (f" ({ds['errored']} errored)" if ds["errored"] else "")
    ))
    if not ds["evaluated"]:  # every case errored on the target: no accuracy to show (the errors are listed)
        click.echo("  no sample was evaluated: every case errored on the target")
        return
    click.echo(f"  {'':18}{'top-1':>9}{'top-5':>9}")
    click.echo(f"  {'target':18}{ds['top1'] * 100:8.2f}%{ds['top5'] * 100:8.2f}%")
    click.echo(f"  {'float reference':18}{ds['reference_top1'] * 100:8.2f}%{ds['reference_top5'] * 100:8.2f}%")
    click.echo(
        f"  top-1 difference {ds['top1_diff'] * 100:+.2f} points, {conf}% CI [{lo * 100:+.2f}, {hi * 100:+.2f}] "
        f"({ds['ci_method']}); agreement {ds['agreement'] * 100:.2f}%"
    )
    s = report.summary
    click.echo(f"  element-wise: {s.verdict} ({', '.join(f'{k} {v}' for k, v in s.counts.items() if v)})")
    if report.regressions is not None:
        from bundlerun.runner.history.regression import format_regressions  # start-up: not loaded by `bundlerun --help`

        click.echo(format_regressions(report.regressions))


@click.command(name="accuracy")
@click.argument("model")
@click.option("--dataset", "dataset", required=True, help="digits, mnist, a folder (samples + labels.txt/.npy) or path.py:fn.")
@click.option("--samples", type=int, default=None, help="Use the first N samples (default: all).")
@click.option("--target", default="host://xnnpack", show_default=True, help="Target URL.")
@click.option("--dtype", default=None, help="fp32, fp16, int8 (PTQ), ... (default: int8 for integer Arm targets, else fp32)")
@click.option("--backend", default=None, help="Lowering backend (default: from --target).")
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=None,
              help="Report folder (default out/accuracy/<model>-<dtype>).")
@click.option("--label", default=None, help="Label recorded with the run (e.g. a git sha).")
@click.option("--baseline", default=None, help="Run id, label or report.json to check for regressions.")
@click.option("--history", "history_db", default=None, help="History database (env BUNDLERUN_HISTORY; 'off' disables).")
@click.option("--no-history", is_flag=True, help="Do not record this run.")
@click.option("--timeout", "case_timeout", type=float, default=120.0, show_default=True, help="Seconds per sample.")
@click.option("--confidence", type=float, default=0.95, show_default=True, help="Confidence level of the intervals.")
@click.option("--tolerance", "tolerances", multiple=True, metavar="KEY=VALUE", help="Element-wise criterion override.")
@click.option("--json", "as_json", is_flag=True, help="Print the dataset section as JSON.")
@click.option("--no-cache", is_flag=True, help="Rebuild the bundle even if the build cache has it.")
def command(model, dataset, samples, target, dtype, backend, report_dir, label, baseline, history_db, no_history,
            case_timeout, confidence, tolerances, as_json, no_cache):
    """Top-1/top-5 of MODEL on --target vs the float reference, over a labelled --dataset.

    Exit code: 0 measured (and no regression against --baseline), 1 regression or
    element-wise failure, 2 could not run.
    """
    import json
    import sys

    if not 0 < confidence < 1:
        raise click.BadParameter("--confidence must be between 0 and 1")
    session = make_session(None, (), history_db, no_history, baseline)
    tol = parse_tolerances(tolerances)
    backend, dtype = resolve_backend_dtype(target, backend, dtype)
    slug = f"{Path(model.split(':')[0]).stem if ':' in model else model}-{dtype}"
    req = AccuracyRequest(
        model=model, dataset=dataset, target=target, dtype=dtype, samples=samples, backend=backend,
        report_dir=report_dir or Path("out") / "accuracy" / slug, label=label, session=session,
        case_timeout_s=case_timeout,
        confidence=confidence, tolerances=tol, progress=lambda m: click.echo(m, err=True), cache=not no_cache,
    )
    report = run_accuracy(req)
    if as_json:
        ds = {k: v for k, v in report.dataset.items() if k not in ("labels", "predictions", "reference_predictions")}
        click.echo(json.dumps(ds, indent=2))
    else:
        print_accuracy(report)
    from bundlerun.runner.report.console import echo_must_show, say_report  # start-up: not loaded by `bundlerun --help`

    echo_must_show(report)  # print_accuracy shows no warnings: a run missing from the history is said anyway
    say_report(report, req.report_dir)
    s = report.summary
    # Accuracy runs judge by the dataset numbers; an element-wise FAIL (e.g. int8 vs float)
    # is expected there and is reported, but only infrastructure errors and regressions set the code.
    code = EXIT_INFRA if s.verdict == Verdict.ERROR and report.dataset["evaluated"] == 0 else (
        EXIT_FAIL if report.regressions else EXIT_PASS)
    if code == EXIT_PASS and any(Path(u["file"]).name == "report.json" for u in report.unwritten):
        code = EXIT_INFRA  # no command says success when its record was not written
    sys.exit(code)
