"""`bundlerun tolerance explain|suggest`: see and calibrate the tolerance registry.

`explain` prints the resolution chain for one output (most specific level first)
and the winning value of each criterion with where it came from. `suggest` looks
at the errors actually observed (a fresh run of a bundle, or saved outputs of
earlier runs), says how close each current criterion is to failing, and proposes
criteria with a margin as a ready-to-paste `bundlerun.toml` block.
"""

from __future__ import annotations


from pathlib import Path

import click

from bundlerun.bundles.manifest_records import BuildInfo, BuildInput
from bundlerun.bundles.errors import BundlerunError, BundleFormatError, ConfigError
from bundlerun.bundles.manifest import RULE_DEFAULTS
from bundlerun.targets import lowering_info, parse_target_url


@click.group(name="tolerance")
def command() -> None:
    """Inspect and calibrate the tolerance registry."""


# --------------------------------------------------------------------------- explain


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _short(file: str | None) -> str:
    if not file:
        return "-"
    from bundlerun.bundles.registry import BUILTIN_NAME  # start-up: not loaded by `bundlerun --help`

    path = Path(file)
    if file.startswith(BUILTIN_NAME) and "/" not in file[len(BUILTIN_NAME):] and path.name.startswith("tolerances"):
        return "built-in" if path.name == "tolerances.toml" else f"built-in:{path.name[len('tolerances.'):-len('.toml')]}"
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name if path.name == "tolerances.toml" else str(path)


def _origin_text(origin: str | None) -> str:
    """'executorch@cff6f4dd:path:lines; ...' -> one line per citation; bundlerun's own flagged."""
    if not origin:
        return "-"
    if origin.startswith("bundlerun"):
        return f"[yellow]{origin}[/]"
    import re

    return "\n".join(re.sub(r"^executorch@\w+:", "", part.strip()) for part in origin.split(";"))


def _origin_lines(origins: dict[str, str]) -> str:
    """A step's origins, grouped: one line per distinct origin with the keys it backs."""
    by_origin: dict[str, list[str]] = {}
    for key, origin in origins.items():
        by_origin.setdefault(origin, []).append(key)
    return "\n".join(f"{','.join(keys)}: {_origin_text(o)}" for o, keys in by_origin.items()) or "-"


def _from_build(ctx, explicit: dict, registry, distribution_given: bool):
    """Build `ctx.model` as `bundlerun build` would (through the build cache, into a scratch file)
    and fill `ctx` with what the build knew of the output: the model's ops, the quantization
    scheme, the input distribution, the output's dtype and quantization parameters, and the
    reference outputs (data-dependent rules such as XNNPACK's fp16 eps). Returns the criteria the
    build embedded for that output."""
    import tempfile

    from bundlerun.bundles.bpte import read_bundle  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.builder import BuildRequest, build_bundle  # start-up: not loaded by `bundlerun --help`

    target = ctx.target or "host://xnnpack"
    parse_target_url(target)
    with tempfile.TemporaryDirectory(prefix="bundlerun-explain-") as tmp:
        built = build_bundle(BuildRequest(
            model=ctx.model, output=Path(tmp) / "explain.bpte", backend=ctx.backend, target=target,
            target_info=lowering_info(target), dtype=ctx.dtype,
            reference=ctx.reference, distribution=ctx.input_distribution if distribution_given else None,
            overrides=explicit, registry=registry, cache=True))
        bundle = read_bundle(built.path)
    for method, index, built_ctx, criteria in contexts_from_bundle(bundle):
        if (method, index) == (ctx.method, ctx.output_index):
            for name in ("ops", "quantization", "input_distribution", "output_dtype", "scale", "zero_point",
                         "expected", "reference_dtype", "target"):
                setattr(ctx, name, getattr(built_ctx, name))
            return criteria
    raise ConfigError(f"{ctx.model} has no output {ctx.method}.{ctx.output_name}")


def _buildable(model: str) -> bool:
    """A model `build` can build (a zoo name or path.py:factory), not only a name that registry
    model overrides match (ExecuTorch's `mobilenet_v2`, `lstm`)."""
    from bundlerun.bundles.zoo import ZOO  # start-up: not loaded by `bundlerun --help`

    return model in ZOO or (":" in model and model.rsplit(":", 1)[0].endswith(".py"))


def _comparable(criteria) -> dict:
    """Criteria without their trail: what judging uses."""
    return {k: v for k, v in criteria.to_dict().items() if k != "trail"}


def _check_explain_args(registry, backend: str, target: str | None, distribution: str, scale: float | None) -> None:
    """Refuse what `build` would refuse (one line, exit 2): an unknown target URL or variant, an
    input distribution that does not parse, a scale that is not a positive finite number."""
    import math

    from bundlerun.bundles.inputs import check_distribution  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.registry import suggest as did_you_mean  # start-up: not loaded by `bundlerun --help`

    if backend not in registry.backends():
        raise ConfigError(f"unknown backend {backend!r}{did_you_mean(backend, registry.backends())}; "
                          f"known: {', '.join(registry.backends())}")
    if target:
        if "://" in target:
            from bundlerun.targets import open_target  # late: looked up at call time (tests replace it)

            try:
                open_target(target, {})  # checks scheme, variant and options; opens nothing
            except BundlerunError as exc:
                if "needs a Mac" not in str(exc):  # a Mac-only target is still worth explaining elsewhere
                    raise ConfigError(f"--target {target}: {exc}") from None
        elif target not in registry.variants(backend):
            variants = registry.variants(backend)
            known = f"{backend} variants: {', '.join(variants)}" if variants else f"{backend} has no variants"
            raise ConfigError(f"unknown target {target!r}: not a target URL (scheme://...) nor a variant name"
                              f"{did_you_mean(target, variants)}; {known}")
    check_distribution(distribution)
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"--scale must be a positive finite number (one quantization step), got {scale!r}")


@command.command()
@click.option("--backend", required=True, help="xnnpack, portable, arm, cortex-m, qnn, vulkan, mlx, metal, coreml, mps, nxp, "
              "samsung, mediatek, openvino, cadence, webgpu, cuda.")
@click.option("--target", default=None, help="Target URL (tosa://int, fvp://corstone-300/ethos-u55-128, ...) or variant name.")
@click.option("--dtype", required=True, help="fp32, fp16, bf16, int8 or int16.")
@click.option("--model", default=None, help="Model name (per-model overrides).")
@click.option("--op", "ops", multiple=True, help="aten op the model contains (op rules); repeatable.")
@click.option("--reference", type=click.Choice(["eager-fp32", "eager-dtype", "quantized"]), default="eager-fp32", show_default=True)
@click.option("--distribution", default="randn", show_default=True, help="Input distribution (randn, rand, ...).")
@click.option("--output-dtype", default="float32", show_default=True, help="dtype of the output tensor.")
@click.option("--output", "output_name", default="out0", show_default=True, help="Output name (outN).")
@click.option("--method", default="forward", show_default=True)
@click.option("--scale", type=float, default=None, help="Output quantization scale (qtol is counted in it).")
@click.option("--zero-point", type=int, default=None, help="Output quantization zero point (recorded only).")
@click.option("--quantization", default=None, help="Quantization scheme text (groupwise, int4 op rules).")
@click.option("--host-arch", default=None, help="Host that judges/simulates (default: this machine).")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE", help="Explicit criterion, e.g. atol=0.05.")
@click.option("--no-project", is_flag=True, help="Ignore bundlerun.toml / [tool.bundlerun].")
@click.option("--no-build", is_flag=True,
              help="With --model: explain from these options alone, without building the model (through the build "
                   "cache) for its ops, output dtypes and reference outputs.")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved criteria (with trail) as JSON.")
def explain(backend, target, dtype, model, ops, reference, distribution, output_dtype, output_name, method, scale,
            zero_point, quantization, host_arch, overrides, no_project, as_json, no_build=False):
    """Show how the criteria of one output are resolved, level by level.

    With --model naming a model `build` builds (a zoo name or path.py:factory; no --op) it is built as
    `bundlerun build` builds it, through the build
    cache, so the op rules, the output's dtype and quantization and the reference outputs the
    data-dependent rules read are the build's own: what is shown is what `build` embeds."""
    import json

    from bundlerun.bundles.project_config import default_registry  # start-up: not loaded by `bundlerun --help`

    from bundlerun.bundles.registry import LEVELS, Registry  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.tolerances import ToleranceContext, explain as resolve  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.judging.overrides import as_build_overrides, parse_overrides  # start-up: not loaded by `bundlerun --help`

    registry = Registry.builtin() if no_project else default_registry()
    _check_explain_args(registry, backend, target, distribution, scale)
    index = int(output_name[3:]) if output_name.startswith("out") and output_name[3:].isdigit() else 0
    ctx = ToleranceContext(
        backend=backend, target=target or "", dtype=dtype, model=model, method=method, output_index=index,
        output_name=output_name, output_dtype=output_dtype, ops=list(ops), reference=reference,
        input_distribution=distribution, host_arch=host_arch, scale=scale, zero_point=zero_point,
        quantization=quantization,
    )
    explicit = as_build_overrides(parse_overrides(list(overrides)))
    embedded = None
    if model and not ops and not no_build and _buildable(model) and (not target or "://" in target):
        embedded = _from_build(ctx, explicit, registry, distribution_given=distribution != "randn")
    res = resolve(ctx, explicit, registry)
    crit = res.criteria
    if embedded is not None and _comparable(embedded) != _comparable(crit):
        raise BundlerunError(f"explain resolved {_comparable(crit)} but the build embeds {_comparable(embedded)} for "
                             f"{method}.{output_name}: a bundlerun bug, please report it")
    if as_json:
        click.echo(json.dumps({"tier": res.tier, "variant": res.variant, "host_arch": res.host_arch,
                               "executorch_commit": res.commit, "criteria": crit.to_dict()}, indent=2))
        return

    from bundlerun.runner.report.console import wide_console  # start-up: not loaded by `bundlerun --help`
    from rich.table import Table

    console = wide_console()
    console.print(
        f"[bold]{backend}[/] variant [bold]{res.variant or '-'}[/], dtype tier [bold]{res.tier}[/] "
        f"(reference {reference}), model {model or '-'}, host {res.host_arch}, inputs {distribution}"
    )
    if res.commit:
        console.print(f"[dim]origins: ExecuTorch source at commit {res.commit} (executorch@{res.commit[:8]}:path:lines)[/]")
    chain = Table(title="resolution chain (most specific first)", title_justify="left")
    for col in ("level", "entry", "sets", "origin", "file"):
        chain.add_column(col, overflow="fold")
    by_level: dict[str, list] = {}
    for step in res.steps:
        by_level.setdefault(step.level, []).append(step)
    for level in reversed(LEVELS):
        steps = by_level.get(level, [])
        if not steps:
            chain.add_row(level, "[dim]no entry[/]", "", "")
        for step in reversed(steps):
            parts = [f"{k}={_fmt(v)}" if k in step.applied else f"[dim]{k}={_fmt(v)} ({step.skipped.get(k, 'not applied')})[/]"
                     for k, v in step.values.items()]
            origins = _origin_lines(step.origins)
            extra = []
            if step.note:
                extra.append(f"[dim]note: {step.note}[/]")
            if step.merged:
                extra.append("[dim]other tests of this key (tighter, the loosest applies): " + "; ".join(step.merged) + "[/]")
            chain.add_row(level, step.source, "\n".join([", ".join(parts) or "-", *extra]), origins, _short(step.file))
    console.print(chain)

    result = Table(title="resolved criteria and rules (all that are set must hold)", title_justify="left")
    for col in ("criterion", "value", "from", "origin", "file"):
        result.add_column(col, overflow="fold")
    for key in ("atol", "rtol", "qtol", "scale", "sqnr_min_db", "cosine_min", "rel_frobenius_max", "exact",
                *RULE_DEFAULTS):
        trail = crit.trail.get(key) or []
        value = getattr(crit, key)
        if (value is None or value is False or (key in RULE_DEFAULTS and value == RULE_DEFAULTS[key])) and not trail:
            continue
        last = trail[-1] if trail else {"source": "-", "file": None}
        result.add_row(key, _fmt(value), last["source"], _origin_text(last.get("origin")), _short(last.get("file")))
    console.print(result)
    if not crit.has_any:
        console.print("[yellow]no criterion is set: ExecuTorch's test turns every check of this tier off; "
                      "`build` refuses this (use --reference quantized, or --tolerance / --override)[/]")
    if crit.qtol and crit.scale is None:
        console.print("[yellow]qtol has no output scale here: pass --scale (build reads it from the lowered graph)[/]")
    if crit.elementwise:
        console.print(f"element-wise: |a - r| <= {_fmt(crit.effective_atol)} + {_fmt(crit.rtol or 0.0)}*|r|")


# --------------------------------------------------------------------------- suggest


@command.command()
@click.argument("bundle", required=False, type=click.Path(path_type=Path))
@click.option("--target", default=None, help="Run BUNDLE on this target URL now (e.g. host://xnnpack).")
@click.option("--from", "run_dirs", multiple=True, type=click.Path(path_type=Path),
              help="Report directory of an earlier `run --save-outputs`; repeatable.")
@click.option("--margin", type=float, default=1.5, show_default=True, help="Safety factor over the worst observed error.")
@click.option("--criteria", "criteria_names", default=None,
              help="Comma-separated criteria to propose (default: the signal criteria already set, "
                   "plus qtol for quantized outputs or atol otherwise). At most one of atol, rtol, qtol.")
@click.option("--timeout", "case_timeout", type=float, default=120.0, show_default=True, help="Seconds per case (--target).")
@click.option("--json", "as_json", is_flag=True, help="Print observations and proposals as JSON.")
def suggest(bundle, target, run_dirs, margin, criteria_names, case_timeout, as_json):
    """Propose criteria from observed errors and show each criterion's headroom.

    Headroom ratio: measured/limit for ceilings (atol, rtol, qtol: the element-wise
    bound; relative Frobenius), limit/measured for the SQNR floor and
    (1-cosine)/(1-floor) for the cosine floor: below 1 passes, above 1 fails.
    """
    import json

    from bundlerun.bundles.registry import CRITERIA  # start-up: not loaded by `bundlerun --help`
    from bundlerun.runner.judging.calibrate import collect_from_run_dirs, propose, run_and_collect, toml_block  # start-up: not loaded by `bundlerun --help`

    if margin < 1.0:
        raise ConfigError(f"--margin must be at least 1.0, got {margin}")
    wanted = None
    if criteria_names:
        wanted = [c.strip() for c in criteria_names.split(",") if c.strip()]
        for c in wanted:
            if c not in CRITERIA:
                from bundlerun.bundles.registry import suggest as did_you_mean  # start-up: not loaded by `bundlerun --help`

                raise ConfigError(f"unknown criterion {c!r}{did_you_mean(c, CRITERIA)}; known: {', '.join(CRITERIA)}")
        if len([c for c in wanted if c in ("atol", "rtol", "qtol")]) > 1:
            raise ConfigError("calibrate one element-wise criterion at a time (atol, rtol or qtol): "
                              "each proposal holds the others at their current values")
    if run_dirs and target:
        raise ConfigError("use either BUNDLE --target or --from RUN_DIR, not both")
    if run_dirs:
        obs = collect_from_run_dirs(list(run_dirs), bundle)
    elif bundle is not None and target:
        obs = run_and_collect(bundle, target, case_timeout)
    else:
        raise ConfigError("give BUNDLE --target URL (run it now) or --from RUN_DIR (saved outputs)")
    proposals = propose(obs, margin, wanted)
    if as_json:
        click.echo(json.dumps({"margin": margin, "runs": obs.runs, "outputs": [p.to_dict() for p in proposals]}, indent=2))
        return
    from bundlerun.runner.report.console import wide_console  # start-up: not loaded by `bundlerun --help`
    from rich.table import Table

    console = wide_console()
    for p in proposals:
        from bundlerun.runner.report.console import plain  # names come from the bundle

        table = Table(title=plain(f"{p.method}.{p.output}: {p.cases} case(s) from {obs.runs} run(s)"),
                      title_justify="left")
        for col in ("criterion", "current", "measured (worst)", "headroom", "proposed"):
            table.add_column(col, justify="left" if col == "criterion" else "right")
        for row in p.rows:
            ratio = row["headroom"]
            style = "" if ratio is None else ("red" if ratio > 1 else ("yellow" if ratio > 0.8 else "green"))
            table.add_row(plain(row["criterion"]), _fmt(row["current"]), _fmt(row["measured"]),
                          "-" if ratio is None else f"[{style}]{ratio:.3g}[/]", _fmt(row["proposed"]))
        console.print(table)
    click.echo(toml_block(obs, proposals, margin))


# --------------------------------------------------------------------------- check


def contexts_from_bundle(bundle, extra_ops: list[str] | tuple[str, ...] = ()) -> list[tuple]:
    """(method, index, ToleranceContext, embedded Criteria) per output, rebuilt from the manifest
    and the bundle's expected outputs the way `build` made them."""
    import numpy as np

    import re

    from bundlerun.bundles.tolerances import ToleranceContext  # start-up: not loaded by `bundlerun --help`

    m = bundle.manifest
    if m is None:
        raise BundleFormatError("bundle has no bundlerun manifest: nothing was resolved at build time")
    b = m.build
    inputs = b.inputs or [BuildInput()]
    out = []
    for method in m.methods.values():
        suite = bundle.suite(method.name)
        for j, spec in enumerate(method.outputs):
            expected = np.stack([tc.expected_outputs[j].to_array() for tc in suite.test_cases]) if suite.test_cases else None
            c = spec.criteria
            integer = spec.dtype not in ("float16", "float32", "float64", "bfloat16", "bool")
            # what build knew and the manifest keeps only in the trail: an integer output's graph
            # scale, and integers the model returned where the program returns floats
            graph = [float(v) for t in c.trail.get("scale", []) for v in re.findall(r"graph scale (\S+)", str(t.get("source")))]
            ints = [v for t in c.trail.get("exact", []) for v in re.findall(r"^integer output \((\w+)\)", str(t.get("source")))]
            ctx = ToleranceContext(
                backend=b.backend or "", target=b.target or "", dtype=b.dtype or "fp32",
                model=m.model.id, method=method.name, output_index=j, output_name=spec.name,
                output_dtype=spec.dtype, ops=list(b.ops or []) + list(extra_ops),
                reference=b.reference or "eager-fp32",
                input_distribution=str(inputs[0].distribution or "randn") if isinstance(inputs[0], BuildInput) else "randn",
                host_arch=m.versions.get("host"), scale=(graph[-1] if graph else None) if integer else c.scale,
                zero_point=c.zero_point, expected=expected, quantization=b.quantization,
                reference_dtype=ints[-1] if ints and not integer else None,
            )
            out.append((method.name, j, ctx, c))
    return out


@command.command()
@click.argument("bundle_path", type=click.Path(path_type=Path))
@click.option("--op", "ops", multiple=True, help="aten op of the model, when the manifest does not record them.")
@click.option("--no-project", is_flag=True, help="Ignore bundlerun.toml / [tool.bundlerun].")
@click.option("--json", "as_json", is_flag=True)
def check(bundle_path, ops, no_project, as_json):
    """Compare BUNDLE's embedded criteria with what the installed registry resolves now.

    The verdict always uses the embedded numbers; this shows the drift (exit 1 when any
    criterion differs), e.g. after upgrading bundlerun or editing bundlerun.toml.
    """
    import json

    from bundlerun.bundles.bpte import read_bundle  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.project_config import default_registry  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.registry import CRITERIA, Registry  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.tolerances import resolve_criteria  # start-up: not loaded by `bundlerun --help`

    bundle = read_bundle(bundle_path)
    registry = Registry.builtin() if no_project else default_registry()
    rows, drift = [], False
    build = bundle.manifest.build if bundle.manifest else BuildInfo()
    for method, j, ctx, embedded in contexts_from_bundle(bundle, ops):
        now = resolve_criteria(ctx, build.overrides or None, registry)
        for key in (*CRITERIA, "scale", "exact"):
            a, b = getattr(embedded, key), getattr(now, key)
            same = a == b or (isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-12 * max(abs(a), abs(b)))
            if a is None and b is None or (key == "exact" and not a and not b):
                continue
            drift |= not same
            rows.append({"output": f"{method}.{ctx.output_name}", "criterion": key, "embedded": a, "installed": b,
                         "same": same, "installed_source": (now.trail.get(key) or [{}])[-1].get("source")})
    notes = [] if build.ops or ops else ["the manifest records no model ops: op rules were not replayed (pass --op)"]
    if as_json:
        click.echo(json.dumps({"drift": drift, "rows": rows, "notes": notes}, indent=2))
    else:
        from bundlerun.runner.report.console import wide_console  # start-up: not loaded by `bundlerun --help`
        from rich.table import Table

        from bundlerun.runner.report.console import plain  # output names and sources come from the bundle

        table = Table(title=plain(f"{bundle_path}: embedded vs installed registry"), title_justify="left")
        for col in ("output", "criterion", "embedded", "installed now", "", "installed source"):
            table.add_column(col)
        for r in rows:
            table.add_row(plain(r["output"]), plain(r["criterion"]), _fmt(r["embedded"]), _fmt(r["installed"]),
                          "[green]same[/]" if r["same"] else "[red]differs[/]", plain(r["installed_source"] or "-"))
        console = wide_console()
        console.print(table)
        for n in notes:
            console.print(f"[yellow]note:[/] {n}")
        console.print("verdicts use the embedded criteria" + ("; rebuild to adopt the installed ones" if drift else ""))
    raise SystemExit(1 if drift else 0)


# --------------------------------------------------------------------------- audit


@command.command()
@click.option("--executorch-src", type=click.Path(path_type=Path), default=None,
              help="ExecuTorch checkout at the pinned commit (default: $BUNDLERUN_EXECUTORCH_SRC, else the "
                   "executorch.tar.xz of $BUNDLERUN_THIRD_PARTY / ../shared/third_party).")
@click.option("--backend", "backends", multiple=True, help="Only these backends (registry names); repeatable.")
@click.option("--uncovered", is_flag=True, help="List the tolerance lines the registry does not hold.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Re-read every cited line range and check it holds the cited value.")
@click.option("--no-project", is_flag=True, help="Ignore bundlerun.toml / [tool.bundlerun].")
@click.option("--json", "as_json", is_flag=True)
def audit(executorch_src, backends, uncovered, check, no_project, as_json):
    """Scan ExecuTorch's tests for tolerance lines and show which the registry holds.

    Lines are found by reading the tests' source (bundles/tolerance_audit.py): keyword
    arguments and defaults named atol/rtol/qtol/frobenius_threshold/cosine_threshold/...,
    assignments to them, tolerances passed by position to allclose, per-dtype presets and
    SQNR / cosine comparisons. A line is held when a citation of the registry data covers it.
    Exit 1 when --check finds a citation whose lines do not hold its value.
    """
    import json

    from bundlerun.bundles import et_source  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.project_config import default_registry  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.registry import Registry  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.registry_schema import parse_citation  # start-up: not loaded by `bundlerun --help`
    from bundlerun.bundles.tolerance_audit import Citation, check_citations, held, scan  # start-up: not loaded by `bundlerun --help`

    root = et_source.source_tree(executorch_src)
    registry = Registry.builtin() if no_project else default_registry()
    result = scan(root)
    cites = []
    for text, _ in registry.citations():
        parsed = parse_citation(text)
        if parsed:
            cites.append(Citation(*parsed[:3]))
    sites = [s for s in result.sites if not backends or s.backend in backends]
    marks = held(sites, cites)
    per: dict[str, list[int]] = {}
    for site, ok in zip(sites, marks):
        row = per.setdefault(site.backend, [0, 0])
        row[0] += 1
        row[1] += int(ok)
    checked, problems = check_citations(registry, root) if check else (0, [])
    total, covered = len(sites), sum(marks)
    summary = {
        "executorch": str(root), "commit": registry.commit, "files": result.files, "sites": total, "held": covered,
        "coverage": round(covered / total, 4) if total else None, "forwarded": result.forwarded,
        "cited_values": checked, "problems": problems,
        "backends": {b: {"sites": n, "held": h} for b, (n, h) in sorted(per.items())},
    }
    if uncovered:
        summary["uncovered"] = [s.to_dict() for s, ok in zip(sites, marks) if not ok]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        from rich.table import Table

        from bundlerun.runner.report.console import wide_console  # start-up: not loaded by `bundlerun --help`

        console = wide_console()
        console.print(f"ExecuTorch tests in {root} (registry citations refer to {registry.commit or 'no pinned commit'}): "
                      f"{result.files} files, {total} tolerance-setting lines ({result.forwarded} forwarded values not counted)")
        table = Table(title="tolerance lines per backend", title_justify="left")
        for col in ("backend", "lines", "held by the registry", "coverage"):
            table.add_column(col, justify="left" if col == "backend" else "right")
        for b, (n, h) in sorted(per.items()):
            table.add_row(b, str(n), str(h), f"{100 * h / n:.0f}%" if n else "-")
        table.add_row("[bold]all[/]", str(total), str(covered), f"{100 * covered / total:.1f}%" if total else "-")
        console.print(table)
        if check:
            console.print(f"{checked} cited values re-read from the source: "
                          + ("[green]every cited range holds its value[/]" if not problems
                             else f"[red]{len(problems)} do not[/]"))
            for p in problems:
                console.print(f"  [red]{p}[/]", highlight=False)
        if uncovered:
            for s, ok in zip(sites, marks):
                if not ok:
                    values = ", ".join("None" if v is None else f"{v:g}" for v in s.values)
                    console.print(f"  {s.where}  {s.kind}={values}  [dim]{s.context}: {s.text[:100]}[/]", highlight=False)
    raise SystemExit(1 if problems else 0)
