"""`bundlerun inspect`: what a bundle holds, including its embedded criteria and
their trails. Works on bundles without a manifest (ExecuTorch's own API)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bundlerun.bundles.bpte import Bundle, read_bundle
from bundlerun.bundles.manifest import CRITERIA_FIELDS, RULE_DEFAULTS, describe_inputs
from bundlerun.runner.report.console import plain, wide_console

# How each rule reads in `inspect` (what the judge will do differently from the default rule).
RULE_TEXT = {
    "mse_max": lambda v: f"MSE <= {v:g}",
    "top1": lambda v: "argmax must equal the reference's (top-1)",
    "top_k": lambda v: f"the reference's argmax must be among the output's {v} largest (top-{v})",
    "nan": lambda v: "a NaN fails (NaN never matches)" if v == "fail" else "NaN matches NaN",
    "sqnr_reference": lambda v: "SQNR = 20*log10(||ref|| / ||a - ref||)" if v == "reference" else "SQNR over ||actual||",
    "sqnr_strict": lambda v: "SQNR must exceed its floor (>)",
    "cast_float": lambda v: "different output dtypes compared as float32",
    "arm_analysis": lambda v: ("Frobenius/cosine as Arm's analysis: reference below one step zeroed, Frobenius skipped "
                               "at noise-scale norm, -0.02 when cosine >= 0.98, all-zero reference passes"),
    "reference_nonzero": lambda v: "an all-zero reference fails",
    "argmax_match": lambda v: "the greedy token (argmax of the last logits row) must be the reference's",
    "kl_max": lambda v: f"KL(reference || output) of the softmax <= {v:g} nats",
    "top_k_overlap_min": lambda v: f"at least {v:.0%} of the reference's top-5 tokens among the output's top-5",
}


def rule_lines(criteria) -> list[str]:
    """The non-default rules of one output's criteria, in words."""
    return [RULE_TEXT[k](getattr(criteria, k)) for k, d in RULE_DEFAULTS.items() if getattr(criteria, k) != d]


def bundle_summary(bundle: Bundle, path: Path) -> dict[str, Any]:
    methods = []
    for suite in bundle.method_test_suites:
        first = suite.test_cases[0] if suite.test_cases else None
        methods.append({
            "method": suite.method_name,
            "cases": len(suite.test_cases),
            "inputs": [v.describe() for v in first.inputs] if first else [],
            "outputs": [v.describe() for v in first.expected_outputs] if first else [],
        })
    return {
        "path": str(path),
        "size": path.stat().st_size,
        "schema_version": bundle.version,
        "program_size": len(bundle.program),
        "program_identifier": bytes(bundle.program[4:8]).decode(errors="replace"),
        "methods": methods,
        "manifest": bundle.manifest_json,  # as stored: `inspect --json` shows the bundle's own JSON
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def inspect_bundle(path: Path, as_json: bool = False) -> None:
    from rich.table import Table

    bundle = read_bundle(path)
    summary = bundle_summary(bundle, Path(path))
    if as_json:
        print(json.dumps(summary, indent=2))
        return

    console = wide_console()
    console.highlighter = None  # bundle text can be long: rich's regex highlighter is quadratic on it
    for warning in bundle.warnings:
        console.print(f"[yellow]warning:[/] {plain(warning)}")
    console.print(f"[bold]{plain(path)}[/]: BundleIO v{bundle.version}, program {plain(summary['program_identifier'])} "
                  f"({summary['program_size']} bytes), file {summary['size']} bytes")
    table = Table(title="methods", title_justify="left")
    for col in ("method", "cases", "inputs", "expected outputs"):
        table.add_column(col)
    for m in summary["methods"]:
        table.add_row(plain(m["method"]), str(m["cases"]), plain(", ".join(m["inputs"])), plain(", ".join(m["outputs"])))
    console.print(table)
    if bundle.manifest is None:
        console.print("[yellow]no bundlerun manifest[/]: made by ExecuTorch's BundledProgram API; "
                      "`bundlerun run` judges it with default tolerances (atol=1e-3, rtol=1e-3)")
        return
    manifest = bundle.manifest
    b = manifest.build
    console.print(
        f"model [bold]{plain(manifest.model.id)}[/] ("
        + plain(f"{manifest.model.source}), backend {b.backend}, "
                f"dtype {b.dtype}, built for {b.target}, reference {b.reference}, "
                f"quantization {b.quantization or '-'}, seed {b.seed}, inputs "
                + ", ".join(f"{i.dtype}{i.shape} ~ {i.distribution}" for i in b.inputs))
    )

    for line in describe_inputs(manifest.model, b):
        console.print(plain(line))
    console.print(plain("versions: " + ", ".join(f"{k} {v}" for k, v in manifest.versions.items())
                        + f"; created {manifest.created}"))
    crit = Table(title="embedded criteria (judged with these, not the installed registry)", title_justify="left")
    for col in ("output", "dtype", "shape", *CRITERIA_FIELDS, "scale", "zero point", "rules"):
        crit.add_column(col)
    for method in manifest.methods.values():
        for out in method.outputs:
            c = out.criteria
            crit.add_row(plain(f"{method.name}.{out.name}"), plain(out.dtype), str(out.shape),
                         *[_fmt(getattr(c, k)) for k in CRITERIA_FIELDS], _fmt(c.scale), _fmt(c.zero_point),
                         plain("; ".join(rule_lines(c)) or "-"))
    console.print(crit)
    for method in manifest.methods.values():
        for out in method.outputs:
            for key, entries in out.criteria.trail.items():
                chain = " <- ".join(f"{_fmt(e.get('value'))} [{e.get('source')}"
                                    + (f"; {e['origin']}" if e.get("origin") else "") + "]" for e in reversed(entries))
                console.print(f"  [dim]{plain(f'{method.name}.{out.name}.{key}')}:[/] {plain(chain)}")
    if manifest.dataset:
        labels = manifest.dataset.labels or []
        console.print(f"dataset {plain(manifest.dataset.name)}: {len(labels)} labelled samples")
    llm = b.llm
    if llm:  # bundles/llm_build.py: how export_llama built it, and whose weights these are
        console.print(plain(f"LLM {llm.arch} ({llm.size}), {llm.dtype}: weights {llm.weights}, "
                            f"max_seq_len {llm.max_seq_len}, dynamic shape {llm.dynamic_shape}, "
                            f"KV cache {llm.use_kv_cache}, quantization {llm.quantization}, "
                            f"tokenizer {llm.tokenizer or 'none (seeded token ids)'}"))
    for seq in manifest.sequences:
        kinds = [s.kind for s in seq.steps]
        console.print(plain(f"sequence {seq.name} ({'stateful' if seq.stateful else 'stateless'}, {seq.mode}): "
                            f"cases {seq.steps[0].case}-{seq.steps[-1].case}, prompt of {len(seq.steps[0].tokens)} "
                            f"tokens + {kinds.count('decode')} decode steps"
                            + (f", prompt {seq.prompt_text!r}" if seq.prompt_text else "")))
