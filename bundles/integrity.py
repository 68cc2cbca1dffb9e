"""Program and test-case integrity, and the one validation every bundle reader runs.

At write time (`bpte.write_bundle`) the manifest is *sealed*: it records the
sha256 of the program bytes, of each test case (inputs and expected outputs:
kind, dtype, sizes, dim order, data) and of the manifest itself. Readers
recompute them and refuse a mismatch, so a program swapped by another tool, an
edited expected output or a flipped digit in a tolerance is an error, not a
verdict. This detects changes made outside bundlerun's writer; it is not a
signature (anyone can re-seal an edited file): see docs/security.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bundlerun.bundles.errors import IntegrityError
from bundlerun.bundles.manifest_schema import validate_manifest

if TYPE_CHECKING:
    from bundlerun.bundles.bpte import Bundle, BundledTestCase, BundledValue
    from bundlerun.bundles.manifest import Manifest

ALGORITHM = "sha256"
UNSEALED_WARNING = ("bundle predates integrity hashes (its manifest records no sha256 of the program and test "
                    "cases): changes made after it was built cannot be detected; rebuild it to add them")


def program_digest(program: bytes) -> str:
    return hashlib.sha256(program).hexdigest()


def _value_bytes(h: Any, tag: bytes, value: "BundledValue") -> None:
    dim_order = list(value.dim_order) or list(range(len(value.sizes)))
    sizes = list(value.sizes)
    if value.kind == "tensor" and type(value.scalar_type) is int and all(type(v) is int for v in (*sizes, *dim_order)):
        # json.dumps's bytes for this list, written directly (a digest's framing is fixed: sealed bundles
        # hold it); 1.5 of the 3 ms a 192-step LLM bundle's 960 values took to frame
        head = f'["tensor",{value.scalar_type},[{",".join(map(str, sizes))}],[{",".join(map(str, dim_order))}],' \
               f'{len(value.data)},null]'
    else:
        head = json.dumps([value.kind, value.scalar_type, sizes, dim_order, len(value.data),
                           repr(value.scalar) if value.kind != "tensor" else None], separators=(",", ":"))
    h.update(tag + struct.pack("<I", len(head)) + head.encode())
    h.update(value.data)


def case_digest(case: "BundledTestCase") -> str:
    """sha256 over every input and expected output of one test case, unambiguously framed."""
    h = hashlib.sha256()
    h.update(struct.pack("<II", len(case.inputs), len(case.expected_outputs)))
    for value in case.inputs:
        _value_bytes(h, b"I", value)
    for value in case.expected_outputs:
        _value_bytes(h, b"O", value)
    return h.hexdigest()


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the manifest, its own digest left out."""
    body = dict(manifest)
    integrity = dict(body.get("integrity") or {})
    integrity.pop("manifest", None)
    body["integrity"] = integrity
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def is_bundlerun_manifest(manifest: Any) -> bool:
    return isinstance(manifest, dict) and str(manifest.get("schema", "")).startswith("bundlerun.manifest/")


def seal(bundle: "Bundle") -> "Bundle":
    """A copy whose manifest records the digests of this bundle's program, cases and manifest."""
    if not is_bundlerun_manifest(bundle.manifest_json):
        return bundle
    manifest = copy.deepcopy(bundle.manifest_json)
    manifest["integrity"] = {
        "algorithm": ALGORITHM,
        "program": program_digest(bundle.program),
        "cases": {s.method_name: [case_digest(c) for c in s.test_cases] for s in bundle.method_test_suites},
    }
    manifest["integrity"]["manifest"] = manifest_digest(manifest)
    return replace(bundle, manifest_json=manifest)


SEAL_REQUIRED = ("--require-seal (on by default when $CI is set) refuses it; rebuild it with `bundlerun build` "
                 "to seal it, or pass --no-require-seal to judge it anyway")


def require_sealed(bundle: "Bundle", source: str) -> None:
    """IntegrityError unless the bundle carries a seal (its digests are checked by `verify`).
    An unsealed bundle (no `integrity` section, or no bundlerun manifest at all: ExecuTorch's own
    BundledProgram API) cannot show that its expected outputs and criteria are the ones it was
    built with: an `"integrity": {...}` section overwritten with spaces reads as unsealed."""
    if bundle.manifest_json is None:
        raise IntegrityError(f"{source}: the bundle has no bundlerun manifest, so no seal: its expected outputs and "
                             f"criteria cannot be checked against tampering; {SEAL_REQUIRED}")
    if bundle.manifest_json.get("integrity") is None:
        raise IntegrityError(f"{source}: the bundle is not sealed (its manifest records no sha256 of the program, "
                             f"test cases and criteria): changes to it cannot be detected; {SEAL_REQUIRED}")


def verify(bundle: "Bundle", source: str, require_seal: bool = False) -> list[str]:
    """Raise IntegrityError on any mismatch (and, with `require_seal`, on a bundle without a
    seal); warnings (an unsealed bundle) otherwise."""
    if require_seal:
        require_sealed(bundle, source)
    if bundle.manifest_json is None:
        return []
    integrity = bundle.manifest_json.get("integrity")
    if integrity is None:
        return [f"{source}: {UNSEALED_WARNING}"]
    got = program_digest(bundle.program)
    if got != integrity["program"]:
        raise IntegrityError(f"{source}: the program was changed after the bundle was built "
                             f"(sha256 {got[:16]}..., the manifest records {integrity['program'][:16]}...)")
    cases = integrity["cases"]
    names = {s.method_name for s in bundle.method_test_suites}
    if set(cases) != names:
        raise IntegrityError(f"{source}: the bundle's methods ({', '.join(sorted(names))}) are not the ones it was "
                             f"sealed with ({', '.join(sorted(cases)) or 'none'})")
    for suite in bundle.method_test_suites:
        recorded = cases[suite.method_name]
        if len(recorded) != len(suite.test_cases):
            raise IntegrityError(f"{source}: method {suite.method_name!r} has {len(suite.test_cases)} test cases, "
                                 f"it was sealed with {len(recorded)}")
        for i, case in enumerate(suite.test_cases):
            if case_digest(case) != recorded[i]:
                raise IntegrityError(f"{source}: method {suite.method_name!r} case {i} (inputs or expected outputs) "
                                     "was changed after the bundle was built")
    if manifest_digest(bundle.manifest_json) != integrity["manifest"]:
        raise IntegrityError(f"{source}: the manifest (criteria or provenance) was changed after the bundle was built")
    return []


def validate_bundle(bundle: "Bundle", source: str, require_seal: bool = False) -> "Bundle":
    """The checks every reader runs after parsing: manifest schema, consistency of test cases
    with the program and manifest, integrity (`require_seal`: an unsealed bundle is an error).
    Returns the bundle with its warnings set."""
    from bundlerun.bundles.consistency import check_consistency  # start-up: loads numpy on use

    if bundle.manifest_json is not None:
        validate_manifest(bundle.manifest_json, source)
    warnings = check_consistency(bundle, source)
    return replace(bundle, warnings=list(bundle.warnings) + warnings + verify(bundle, source, require_seal))


# what a report names a run's bundle by (runner/report/record.py): its cases' inputs and its program
def inputs_digest(bundle: Any) -> str | None:
    """sha256 over the inputs of every test case of every method (expected outputs left out:
    they change with the reference, the inputs say which cases these are)."""
    suites = getattr(bundle, "method_test_suites", None)
    if suites is None:
        return None
    if getattr(bundle, "inputs_sha256_hex", None):  # bundles/on_file.py: taken when its bytes were read
        return str(bundle.inputs_sha256_hex)
    h = hashlib.sha256()
    for suite in sorted(suites, key=lambda s: s.method_name):
        name = suite.method_name.encode()
        h.update(struct.pack("<II", len(name), len(suite.test_cases)) + name)
        for case in suite.test_cases:
            h.update(struct.pack("<I", len(case.inputs)))
            for value in case.inputs:
                _value_bytes(h, b"I", value)
    return h.hexdigest()


def program_sha256(manifest: Manifest | None, bundle: Any = None) -> str | None:
    """The program's sha256: the sealed one from the manifest, else computed from the bundle."""
    sealed = (manifest.integrity or {}).get("program") if manifest is not None else None
    if sealed:
        return str(sealed)
    if getattr(bundle, "program_sha256_hex", None):  # bundles/on_file.py: taken when its bytes were read
        return str(bundle.program_sha256_hex)
    program = getattr(bundle, "program", None)
    if program is None:
        return None
    return hashlib.sha256(program).hexdigest()
