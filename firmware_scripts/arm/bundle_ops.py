#!/usr/bin/env python3
"""List the operators a .pte / .bpte needs, as ExecuTorch's selective build names them.

Why: a bare-metal runner registers only the kernels it was built with; building it from
exactly the ops of the bundles it will run keeps the image small and the kernel registry
sized to fit (EXECUTORCH_SELECT_OPS_LIST wants "namespace::name.overload").

    bundle_ops.py model.bpte [more.pte ...]        one op per line, sorted, deduplicated
    bundle_ops.py --comma model.bpte               one comma-separated line
    bundle_ops.py --per-file a.bpte b.bpte         "file: op,op,..." lines

Exit status 2 with a one-line error for unreadable or non-ExecuTorch files.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path


class BundleOpsError(Exception):
    """A file that is not a readable ExecuTorch program or bundle."""


@dataclass(frozen=True)
class ProgramOps:
    """The operators of every method of one program file."""

    path: Path
    ops: tuple[str, ...]


def _program_bytes(data: bytes, path: Path) -> bytes:
    """The embedded program of a BundleIO file, or the data itself for a plain .pte."""
    if len(data) < 8:
        raise BundleOpsError(f"{path}: too short to be an ExecuTorch program ({len(data)} bytes)")
    ident = data[4:8]
    if ident.startswith(b"ET"):
        return data
    if ident.startswith(b"BP"):
        from executorch.devtools.bundled_program.serialize import (
            deserialize_from_flatbuffer_to_bundled_program,
        )

        try:
            return bytes(deserialize_from_flatbuffer_to_bundled_program(data).program)
        except Exception as exc:  # flatbuffer parse errors have no common base class
            raise BundleOpsError(f"{path}: corrupt BundleIO file ({type(exc).__name__}: {exc})") from None
    raise BundleOpsError(f"{path}: not a .pte or .bpte (file identifier {ident!r})")


def program_ops(path: Path) -> ProgramOps:
    """Read one .pte/.bpte and return its operator names ("aten::add.out")."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BundleOpsError(f"{path}: {exc.strerror or exc}") from None
    program = _program_bytes(data, path)
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        pte = deserialize_pte_binary(program)
    except Exception as exc:
        raise BundleOpsError(f"{path}: corrupt program ({type(exc).__name__}: {exc})") from None
    prog = getattr(pte, "program", pte)
    names: set[str] = set()
    for plan in prog.execution_plan:
        for op in plan.operators:
            names.add(f"{op.name}.{op.overload}" if op.overload else op.name)
    return ProgramOps(path, tuple(sorted(names)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help=".pte or .bpte files")
    parser.add_argument("--comma", action="store_true", help="print one comma-separated line")
    parser.add_argument("--per-file", action="store_true", help="print the ops of each file")
    args = parser.parse_args(argv)
    try:
        results = [program_ops(p) for p in args.files]
    except BundleOpsError as exc:
        print(f"bundle_ops.py: {exc}", file=sys.stderr)
        return 2
    if args.per_file:
        for res in results:
            print(f"{res.path}: {','.join(res.ops)}")
        return 0
    ops = sorted({op for res in results for op in res.ops})
    print(",".join(ops) if args.comma else "\n".join(ops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
