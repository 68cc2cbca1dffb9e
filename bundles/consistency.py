"""A bundle's test cases must match what its program returns and what its manifest
describes: every expected value where the program returns a tensor is a tensor
of the program's dtype and shape, every output has criteria, every method tested
exists. Checked by every reader before anything runs, on any target, so a
swapped or missing expected output is a broken bundle (exit 2, named) and never
a SKIP inside a passing run.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from bundlerun.bundles import scalar_types as st
from bundlerun.bundles.errors import BundleError
from bundlerun.bundles.program_meta import DeclaredOutput, method_inputs, method_outputs
from bundlerun.bundles.sequence import from_manifest, kv_link_problem, kv_links

if TYPE_CHECKING:
    from bundlerun.bundles.bpte import Bundle, BundledValue


def _what(value: "BundledValue") -> str:
    if value.kind == "tensor":
        return f"a {st.name(value.scalar_type)}{list(value.sizes)} tensor"
    return f"{'an' if value.kind == 'int' else 'a'} {value.kind} ({value.scalar!r})"


def check_consistency(bundle: "Bundle", source: str) -> list[str]:
    """Raise BundleError naming the method, case and output of the first mismatch.

    A program whose output declarations cannot be read is left to the runtime (it
    refuses to load a malformed program) with a warning; the manifest check still applies."""
    if not bundle.method_test_suites or not any(s.test_cases for s in bundle.method_test_suites):
        raise BundleError(f"{source}: bundle has no test cases: there is nothing to validate")
    names = [s.method_name for s in bundle.method_test_suites]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise BundleError(f"{source}: bundle has two test suites for method {dup!r}")
    warnings: list[str] = []
    try:
        declared = method_outputs(bundle.program, source)
        declared_inputs = method_inputs(bundle.program, source)
    except BundleError as exc:
        declared = declared_inputs = None
        warnings.append(f"{exc}; expected outputs were not checked against the program's declarations")
    methods = (bundle.manifest_json or {}).get("methods")  # a checker: the stored JSON, before it is typed
    if methods is not None:
        _methods_match(source, names, methods)
    for suite in bundle.method_test_suites:
        if declared is not None and suite.method_name not in declared:
            raise BundleError(f"{source}: bundle tests method {suite.method_name!r}, which the program does not have "
                              f"(it has {', '.join(map(repr, declared)) or 'none'})")
        outs = declared[suite.method_name] if declared is not None else None
        spec = methods.get(suite.method_name) if methods is not None else None
        for i, case in enumerate(suite.test_cases):
            where = f"{source}: method {suite.method_name!r} case {i}"
            if outs is not None:
                _against_program(where, case.expected_outputs, outs)
            if declared_inputs is not None:
                _inputs_within_bounds(where, case.inputs, declared_inputs.get(suite.method_name) or [])
            if spec is not None:
                _against_manifest(where, "expected output", case.expected_outputs, spec["outputs"])
                if spec.get("inputs"):
                    _against_manifest(where, "input", case.inputs, spec["inputs"])
    _kv_io_fits(bundle, source)
    return warnings


def _kv_io_fits(bundle: "Bundle", source: str) -> None:
    """Every step of a sequence whose state is threaded through inputs and outputs (`state: "io"`) has
    the outputs and inputs `build.llm.kv_io` names, of one dtype and shape, with room at the step's
    position: a manifest naming a value the cases lack is a broken bundle before anything runs."""

    manifest = bundle.manifest_json
    sequences = [s for s in from_manifest(manifest) if s.state == "io"] if manifest else []
    if not sequences:
        return
    links = kv_links(manifest)
    suites = {s.method_name: s for s in bundle.method_test_suites}
    for seq in sequences:
        cases = suites[seq.method].test_cases if seq.method in suites else []
        for step in seq.steps:
            if step.case >= len(cases):
                raise BundleError(f"{source}: sequence {seq.name!r} names case {step.case}, which the bundle lacks")
            case = cases[step.case]
            problem = kv_link_problem(links, _layout(case.inputs), _layout(case.expected_outputs), step.start_pos)
            if problem:
                raise BundleError(f"{source}: sequence {seq.name!r} step at case {step.case}: {problem}")


def _layout(values: list["BundledValue"]) -> list[tuple[str, list[int]] | None]:
    return [(_dtype(v.scalar_type), list(v.sizes)) if v.kind == "tensor" else None for v in values]


def _methods_match(source: str, names: list[str], methods: dict[str, Any]) -> None:
    for name in names:
        if name not in methods:
            raise BundleError(f"{source}: method {name!r} has test cases but no criteria in the manifest")
    for name in methods:
        if name not in names:
            raise BundleError(f"{source}: the manifest has criteria for method {name!r}, which has no test cases")


def _against_program(where: str, values: list["BundledValue"], outs: list[DeclaredOutput]) -> None:
    if len(values) != len(outs):
        raise BundleError(f"{where}: has {len(values)} expected outputs, the program returns {len(outs)}")
    for j, (value, decl) in enumerate(zip(values, outs)):
        if decl.kind != "tensor":
            continue
        returns = f"the program returns a {_dtype(decl.scalar_type)}{decl.sizes} tensor"
        if value.kind != "tensor":
            raise BundleError(f"{where}: expected output {j} is {_what(value)}, but {returns}")
        if value.scalar_type != decl.scalar_type:
            raise BundleError(f"{where}: expected output {j} is {_what(value)}, but {returns}")
        sizes = decl.sizes or []
        fits = (list(value.sizes) == sizes if decl.static else
                len(value.sizes) == len(sizes) and math.prod(value.sizes) <= math.prod(sizes))
        if not fits:
            raise BundleError(f"{where}: expected output {j} is {_what(value)}, but {returns}")


def _inputs_within_bounds(where: str, values: list["BundledValue"], ins: list[DeclaredOutput]) -> None:
    """Every tensor input fits the program's declared input: the same rank, and sizes equal to a
    static declaration or at most a bounded-dynamic one's upper bound. The runtime would otherwise
    be handed a tensor it cannot take: a static [1, 1] program given [1, 5] segfaults through the
    pybindings' run_method (executorch 1.5.1), a prompt past export_llama's max_seq_len - 1 is a
    runtime error."""
    for j, (value, decl) in enumerate(zip(values, ins)):
        if value.kind != "tensor" or decl.kind != "tensor" or decl.sizes is None:
            continue
        sizes, bound = list(value.sizes), decl.sizes
        if len(sizes) != len(bound):
            raise BundleError(f"{where}: input {j} is {_what(value)}, but the program's input {j} has "
                              f"{len(bound)} dimensions ({bound})")
        if decl.static and sizes != bound:
            raise BundleError(f"{where}: input {j} is {_what(value)}, but the program's input {j} is static "
                              f"{bound}: the runtime cannot resize it")
        if not decl.static and any(s > b for s, b in zip(sizes, bound)):
            raise BundleError(f"{where}: input {j} is {_what(value)}, past the program's upper bound {bound} "
                              "for that input (e.g. a prompt longer than export_llama's max_seq_len - 1)")


def _against_manifest(where: str, label: str, values: list["BundledValue"], specs: list[dict[str, Any]]) -> None:
    if len(values) != len(specs):
        raise BundleError(f"{where}: has {len(values)} {label}s, the manifest describes {len(specs)}")
    for j, (value, spec) in enumerate(zip(values, specs)):
        if value.kind != "tensor" or st.name(value.scalar_type) != spec["dtype"] or not _fits(list(value.sizes), spec):
            dynamic = f" (dims {spec['dynamic']} at most that size)" if spec.get("dynamic") else ""
            raise BundleError(f"{where}: {label} {j} ({spec['name']}) is {_what(value)}, but the manifest "
                              f"describes a {spec['dtype']}{spec['shape']} tensor{dynamic}")


def _fits(sizes: list[int], spec: dict[str, Any]) -> bool:
    """The manifest's shape, except that a dim it lists as dynamic may be smaller (it records the
    largest size of any case)."""
    shape, dynamic = spec["shape"], set(spec.get("dynamic", []))
    return len(sizes) == len(shape) and all(s == b or (d in dynamic and s <= b)
                                            for d, (s, b) in enumerate(zip(sizes, shape)))


def _dtype(code: int | None) -> str:
    try:
        return st.name(code) if code is not None else "?"
    except st.UnsupportedScalarType:
        return f"scalar type {code}"
