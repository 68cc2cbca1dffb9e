"""The Python API: build a bundle, run it on a target, get the typed report back, judge again.

What the CLI, the pytest plugin and the farm do, callable from a Tester-based test or a notebook:

    from bundlerun import api

    bundle = api.build(model, (torch.randn(1, 32),), backend="xnnpack", dtype="fp32", output="mlp.bpte")
    report = api.run(bundle, target="qemu-user://aarch64")        # a Report, nothing written
    assert report.summary.verdict == "PASS", report.failures()

    # a program somebody already lowered (a Tester's artifact, an ExecutorchProgramManager, a .pte):
    bundle = api.bundle_program(manager, {"forward": [(x,)]}, reference=model, backend="xnnpack",
                                output="lowered.bpte")

Every number a bundle carries comes from the tolerance registry (bundles/registry.py) for the
backend, dtype and target given; `report_dir` writes the same report folder the CLI writes.
Heavy imports (torch, executorch) happen inside the functions.

The API is the CLI's library, not a second policy: every argument is checked before any work by
the checks the CLI's options use (runner/arguments.py, bundles/limits.py), every refusal is a
BundlerunError with its `kind`, and an unsealed bundle is refused under $CI as `bundlerun run`
refuses it (runner/seal.py; `require_seal=False` judges it anyway, with the warning).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence
from bundlerun.bundles import limits
from bundlerun.bundles.backends.base import BACKENDS, DTYPES, default_dtype
from bundlerun.bundles.dynamic_shapes import from_exported
from bundlerun.bundles.errors import BuildError, ConfigError, ModelSourceError
from bundlerun.bundles.registry_schema import REFERENCES
from bundlerun.runner import arguments
from bundlerun.targets import default_backend, lowering_info

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

__all__ = ["build", "bundle_program", "run", "judge", "validate", "Report"]


def __getattr__(name: str):  # `api.Report` without importing the report model at `import bundlerun.api`
    if name == "Report":
        from bundlerun.runner.report.model import Report  # late: its name is bound otherwise in this module

        return Report
    raise AttributeError(name)


def build(model: Any, example_inputs: Sequence[Any] | None = None, *, output: str | Path | None = None,
          backend: str | None = None, target: str = "host://xnnpack", dtype: str | None = None, cases: int = 8,
          seed: int = 0, reference: str | None = None, distribution: str | None = None,
          tolerances: Mapping[str, float] | None = None, etrecord: bool = False, config: str | Path | None = None,
          cache: bool = True, inputs: str | Path | None = None, state_dict: str | Path | None = None) -> Path:
    """Lower `model` with bundlerun's recipe for `backend` (default: the target's) and bundle it.

    `inputs`: "images", "mnist" or a folder of images / .npy, as `--inputs`; `state_dict`: the
    weights of an `et:NAME` model (else seeded random), as `--state-dict` (docs/example-models.md).

    `model` is an `nn.Module` with `example_inputs`, a `torch.export.ExportedProgram` (its module
    is lowered, its example inputs are the default), or a zoo name / "path.py:factory" as on the
    command line. Inputs are generated from the examples' shapes and dtypes (`distribution`,
    seeded by `seed`); the expected outputs come from the eager model (`reference` "quantized":
    from the fake-quantized one). Returns the .bpte path (a temporary file when `output` is None)."""
    from bundlerun.bundles.builder import BuildRequest, build_bundle  # start-up: loads flatbuffers, numpy, tomli on use
    from bundlerun.runner.session import Session  # start-up: loads flatbuffers, numpy on use

    tolerances = _check_build(model, output, backend, target, dtype, cases, seed, reference, distribution, tolerances,
                              etrecord, config, cache)

    if inputs is not None:
        arguments.path(inputs, "inputs")
    if state_dict is not None:
        arguments.path(state_dict, "state_dict")
    backend = backend or default_backend(target, dtype)
    with _output_path(output, "bundle.bpte") as out:
        resolved = None
        name = model if isinstance(model, str) else None
        if name is None:
            resolved = _resolved(model, example_inputs, distribution)
            cache = False  # an in-memory module has no source the build cache could key on
        info = lowering_info(target)
        request = BuildRequest(model=name or resolved.name, output=out, backend=backend, target=target,
                               target_info=info, dtype=dtype or default_dtype(backend, info), cases=cases, seed=seed,
                               reference=reference, distribution=distribution, overrides=dict(tolerances or {}),
                               resolved_model=resolved, registry=Session.load(Path(config) if config else None).registry,
                               cache=cache, etrecord=etrecord, inputs=str(inputs) if inputs is not None else None,
                               state_dict=str(state_dict) if state_dict is not None else None)
        return build_bundle(request).path


@contextlib.contextmanager
def _output_path(output: Any, name: str) -> Iterator[Path]:
    """`output`, or `name` in a new temporary folder: the bundle there is the caller's to keep, but a build
    that fails removes the folder, so a failed call leaves nothing behind."""
    if output is not None:
        yield Path(output)
        return
    folder = Path(tempfile.mkdtemp(prefix="bundlerun-"))
    try:
        yield folder / name
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _check_build(model: Any, output: Any, backend: Any, target: Any, dtype: Any, cases: Any, seed: Any,
                 reference: Any, distribution: Any, tolerances: Any, etrecord: Any, config: Any,
                 cache: Any) -> dict[str, float]:
    """build's arguments, by the CLI's own checks (`bundlerun build`'s options), before any work;
    returns the tolerances as numbers."""
    from bundlerun.bundles.inputs import check_distribution  # start-up: loads numpy on use

    if isinstance(model, str):
        arguments.text(model, "model", arguments.MAX_PATH_CHARS)
    elif model is None or isinstance(model, (bytes, int, float, list, tuple, dict)):
        raise ModelSourceError(f"api.build takes an nn.Module, an ExportedProgram or a model name, not "
                               f"{type(model).__name__}")
    if output is not None:
        arguments.output_file(output, "output")
    arguments.target_url(target, "target")
    arguments.choice(backend, "backend", sorted(BACKENDS))
    arguments.choice(dtype, "dtype", DTYPES)
    limits.count(cases, "cases", 1, limits.MAX_CASES)
    limits.count(seed, "seed", 0, limits.MAX_SEED)
    arguments.choice(reference, "reference", REFERENCES)
    if distribution is not None:
        check_distribution(distribution, "distribution")
    checked = arguments.tolerances(tolerances)
    arguments.flag(etrecord, "etrecord")
    arguments.flag(cache, "cache")
    if config is not None:
        arguments.path(config, "config")
    return checked


def _resolved(model: Any, example_inputs: Sequence[Any] | None, distribution: str | None):
    """An nn.Module (or an ExportedProgram's module) as the builder's model record."""
    from bundlerun.bundles.model_source import _from_examples  # start-up: loads numpy on use

    exported = hasattr(model, "graph_module") and hasattr(model, "module")  # torch.export.ExportedProgram
    dynamic_shapes: Any = None  # an ExportedProgram's symbolic dims, honoured in the lowering
    if exported:
        if example_inputs is None and getattr(model, "example_inputs", None):
            args, kwargs = model.example_inputs
            if kwargs:
                raise ModelSourceError("api.build: the ExportedProgram's example inputs have keyword arguments; "
                                       "pass example_inputs as a tuple")
            example_inputs = args
        name = "ExportedProgram"

        dynamic_shapes = from_exported(model)
        # ep.module() refuses .eval()/.train() (torch: "Calling eval() is not supported yet"); it
        # already holds the mode it was exported in
        model = model.module()
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ModelSourceError(f"api.build takes an nn.Module, an ExportedProgram or a model name, not "
                               f"{type(model).__name__}")
    if example_inputs is None:
        raise ModelSourceError("api.build needs example_inputs for an nn.Module (a tuple of tensors)")
    examples = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not exported:
        name = type(model).__name__
        model = model.eval()
    return _from_examples(name, f"python:{type(model).__module__}.{name}", "", model, examples, distribution,
                          dynamic_shapes=dynamic_shapes)


def bundle_program(program: Any, inputs: Mapping[str, Sequence[Sequence[Any]]] | Sequence[Sequence[Any]], *,
                   expected: Mapping[str, Sequence[Any]] | Sequence[Any] | None = None, reference: Any = None,
                   backend: str, dtype: str = "fp32", target: str | None = None, output: str | Path | None = None,
                   output_qparams: Mapping[str, list] | None = None, model_id: str = "program",
                   tolerances: Mapping[str, float] | None = None) -> Path:
    """Bundle a program that is already lowered, with the registry's numbers for `backend`/`dtype`.

    `program`: an `ExecutorchProgramManager`, an `EdgeProgramManager` (made executable here), a
    Tester's serialized artifact, .pte bytes or a .pte path. `inputs`: per method a list of cases,
    each a tuple of inputs (a plain list means "forward"). The expected outputs are `expected`
    (per method, one entry per case) or `reference(*inputs)` (an nn.Module or callable, or a dict
    of them per method): the eager model, never the program itself."""
    from bundlerun.bundles.from_program import ProgramBundleRequest, ProgramCase, bundle_program as _bundle  # start-up: loads flatbuffers, numpy, tomli on use

    arguments.choice(backend, "backend", sorted(BACKENDS), optional=False)
    arguments.choice(dtype, "dtype", DTYPES, optional=False)
    if target is not None:
        arguments.target_url(target, "target")
    folder = arguments.output_file(output, "output").parent if output is not None else None
    arguments.inside(folder or Path("."), model_id, "model_id")
    output_qparams = arguments.mapping(output_qparams, "output_qparams")
    tolerances = arguments.tolerances(tolerances)
    for method, fn in (reference.items() if isinstance(reference, Mapping) else [("forward", reference)]):
        if fn is not None and not callable(fn):
            raise arguments.ConfigError(f"reference[{str(method)[:40]!r}]: expected an nn.Module or a callable, got "
                                        f"{type(fn).__name__}")
    per_method = _per_method(inputs, "inputs")
    want = _per_method(expected, "expected") if expected is not None else None
    if hasattr(program, "to_executorch") and not hasattr(program, "buffer"):  # EdgeProgramManager
        program = program.to_executorch()
    if isinstance(program, (str, Path)):
        where = arguments.path(program, "program")
        try:
            program = where.read_bytes()
        except OSError as exc:
            raise BuildError(f"program: cannot read {where} ({exc.strerror or exc})") from None
    elif not isinstance(program, (bytes, bytearray)) and not hasattr(program, "buffer"):
        raise BuildError(f"program: expected an ExecutorchProgramManager, an EdgeProgramManager, a Tester artifact, "
                         f".pte bytes or a .pte path, not {type(program).__name__}")
    cases: dict[str, list] = {}
    for method, method_inputs in per_method.items():
        rows = []
        for i, case_inputs in enumerate(method_inputs):
            case_inputs = tuple(case_inputs) if isinstance(case_inputs, (tuple, list)) else (case_inputs,)
            if want is not None:
                try:
                    outs = want[method][i]
                except (KeyError, IndexError):
                    raise BuildError(f"expected outputs of {method}[{i}] are missing") from None
            elif reference is not None:
                fn = reference.get(method) if isinstance(reference, Mapping) else (
                    reference if method == "forward" else getattr(reference, method, None))
                if fn is None:
                    raise BuildError(f"no reference for method {method!r}: pass reference={{'{method}': ...}}")
                outs = _eager(fn, case_inputs)
            else:
                raise BuildError("bundle_program needs expected outputs or a reference model to compute them")
            rows.append(ProgramCase(case_inputs, outs if isinstance(outs, (tuple, list)) else (outs,)))
        cases[method] = rows
    request = ProgramBundleRequest(program=program, cases=cases, backend=backend, dtype=dtype,
                                   target=target or f"host://{'portable' if backend == 'portable' else 'xnnpack'}",
                                   output_qparams=dict(output_qparams or {}), model=model_id,
                                   overrides=dict(tolerances or {}))
    with _output_path(output, f"{model_id}.bpte") as out:
        return _bundle(request, out).path


def _per_method(value: Any, what: str) -> dict[str, list]:
    """`inputs` / `expected`: per method a list (a plain list means "forward")."""

    if isinstance(value, Mapping):
        out = {arguments.text(k, f"{what} method"): v for k, v in value.items()}
    else:
        out = {"forward": value}
    for method, rows in out.items():
        if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
            raise arguments.ConfigError(f"{what}[{method!r}]: expected a list (one entry per case), got "
                                        f"{type(rows).__name__}")
    return {k: list(v) for k, v in out.items()}


def _eager(fn: Any, inputs: tuple) -> Any:
    """The reference's outputs; whatever it raises is one BuildError (Ctrl-C stays an interrupt)."""
    import torch

    try:
        with torch.no_grad():
            return fn(*inputs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - user code: SystemExit included
        raise BuildError(f"the reference raised {type(exc).__name__}: {str(exc)[:300]}") from None


def run(bundle: str | Path, target: str = "host://xnnpack", *, report_dir: str | Path | None = None,
        cases: Sequence[int] | None = None, methods: Sequence[str] | None = None,
        overrides: Sequence[str] = (), timeout: float = 120.0, setup_timeout: float = 300.0,
        target_config: Mapping[str, Any] | None = None, config: str | Path | None = None, label: str | None = None,
        save_outputs: bool = False, history: bool = False, require_seal: bool | None = None) -> "Report":
    """Run every case of `bundle` on `target` and judge every output; returns the typed Report.

    Without `report_dir` nothing is kept on disk (the run's scratch folder is removed). With it,
    the folder gets what `bundlerun run --report` writes (report.json, JUnit, Markdown, HTML,
    logs). `overrides` are `out0.atol=0.05` strings as on the command line; history is recorded
    only when asked for. Infrastructure problems are verdicts (ERROR), not exceptions; a bundle
    that cannot be read raises BundleError. `require_seal` None: refused unsealed under $CI, as
    `bundlerun run` does."""
    from bundlerun.bundles.bpte import read_bundle  # start-up: loads flatbuffers, numpy on use
    from bundlerun.runner.session import RunRequest, Session  # start-up: loads flatbuffers, numpy on use

    checked = _check_run(bundle, target, report_dir, cases, methods, overrides, timeout, setup_timeout,
                         target_config, config, label, save_outputs, history, require_seal)
    require_seal = checked["require_seal"]
    parsed = read_bundle(bundle, require_seal=require_seal)  # bad input is an exception here, before anything starts
    scratch = None
    if report_dir is None:
        scratch = tempfile.TemporaryDirectory(prefix="bundlerun-run-")
        out = Path(scratch.name)
    else:
        out = Path(report_dir)
    session = Session.load(Path(config) if config else None, no_history=not history)
    try:
        with session:
            request = RunRequest(bundle_path=Path(bundle), target=target, report_dir=out, case_timeout_s=timeout,
                                 setup_timeout_s=setup_timeout, methods=list(methods) if methods else None,
                                 cases=sorted(set(cases)) if cases is not None else None, overrides=list(overrides),
                                 label=label, target_config=dict(target_config or session.target_config(target)),
                                 save_outputs=save_outputs, require_seal=require_seal)
            return session.run(request, bundle=parsed) if report_dir is not None else session.execute(request, parsed)
    finally:
        if scratch is not None:
            scratch.cleanup()


def judge(report_dir: str | Path, overrides: Sequence[str] = (), bundle: str | Path | None = None,
          out_dir: str | Path | None = None, require_seal: bool | None = None) -> "Report":
    """Judge the outputs a run saved (`run(..., save_outputs=True)` or `bundlerun run --save-outputs`)
    again, with `overrides`; nothing runs. Returns the new Report (written to `out_dir` if given).
    `require_seal` None: refused unsealed under $CI, as `bundlerun judge` does."""
    from bundlerun.runner import arguments, seal  # start-up: loads click on use
    from bundlerun.runner.commands.judge import rejudge  # start-up: loads click on use

    report_dir = arguments.path(report_dir, "report_dir")
    overrides = arguments.overrides(overrides)
    bundle = arguments.path(bundle, "bundle") if bundle is not None else None
    out_dir = arguments.report_folder(out_dir, "out_dir") if out_dir is not None else None
    require_seal = seal.required() if require_seal is None else arguments.flag(require_seal, "require_seal")
    return rejudge(report_dir, overrides, bundle, out_dir, require_seal=require_seal)


def _check_run(bundle: Any, target: Any, report_dir: Any, cases: Any, methods: Any, overrides: Any, timeout: Any,
               setup_timeout: Any, target_config: Any, config: Any, label: Any, save_outputs: Any, history: Any,
               require_seal: Any) -> dict[str, Any]:
    """run's arguments, by the checks `bundlerun run`'s options use, before any work."""
    from bundlerun.runner import arguments, seal  # start-up: loads click on use

    arguments.path(bundle, "bundle")
    arguments.target_url(target, "target")
    if report_dir is not None:
        arguments.report_folder(report_dir, "report_dir")
    arguments.case_indexes(cases, "cases")
    arguments.names(methods, "methods")
    arguments.overrides(overrides)
    arguments.seconds(timeout, "timeout")
    arguments.seconds(setup_timeout, "setup_timeout")
    arguments.mapping(target_config, "target_config")
    if config is not None:
        arguments.path(config, "config")
    arguments.label(label, "label")
    arguments.flag(save_outputs, "save_outputs")
    arguments.flag(history, "history")
    return {"require_seal": seal.required() if require_seal is None else arguments.flag(require_seal, "require_seal")}


def validate(model: Any, example_inputs: Sequence[Any] | None = None, target: str = "host://xnnpack", **kw: Any) -> "Report":
    """`build` for `target` then `run` there (build keywords: backend, dtype, cases, seed, ...;
    run keywords: report_dir, timeout, overrides, ...)."""
    import inspect

    run_keys = {"report_dir", "methods", "overrides", "timeout", "setup_timeout", "target_config", "label",
                "save_outputs", "history", "require_seal"}
    build_keys = set(inspect.signature(build).parameters) - {"model", "example_inputs", "target"}
    unknown = sorted(set(kw) - run_keys - build_keys)
    if unknown:
        raise ConfigError(f"api.validate: unknown argument(s) {', '.join(map(str, unknown))[:200]}")
    run_kw = {k: kw.pop(k) for k in list(kw) if k in run_keys}
    defaults = {k: p.default for k, p in inspect.signature(run).parameters.items() if k in run_keys}
    given = {**defaults, **run_kw}
    _check_run("bundle.bpte", target, given["report_dir"], None, given["methods"], given["overrides"],
               given["timeout"], given["setup_timeout"], given["target_config"], None, given["label"],
               given["save_outputs"], given["history"], given["require_seal"])  # before the build
    with tempfile.TemporaryDirectory(prefix="bundlerun-validate-") as tmp:
        path = build(model, example_inputs, target=target, output=kw.pop("output", Path(tmp) / "bundle.bpte"), **kw)
        return run(path, target, **run_kw)
