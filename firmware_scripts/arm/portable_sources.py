#!/usr/bin/env python3
"""The portable-kernel source files (kernels/portable/cpu/op_*.cpp) that define the kernels of an op list.

Why: ExecuTorch's portable_kernels library compiles every op file (172 at the pinned commit,
kernels/portable/CMakeLists.txt GLOB_RECURSE) whatever ops the runner registers; a bare-metal
runner that registers a few dozen needs only theirs. build_qemu_runner.sh passes these names
to firmware_scripts/arm/qemu/CMakeLists.txt, which drops the other op files from the target
(bundlerun's own trim; the registration code is still ExecuTorch's selective-build codegen).

    portable_sources.py ET_ROOT aten::add.out,aten::convolution.out,...

Prints the file names (op_add.cpp;op_convolution.cpp;...), one CMake list on one line. An op of
kernels/portable/functions.yaml whose kernel no op file names is exit 2 with a one-line error;
ops that are not portable ones (cortex_m::, prim ops) are not this script's.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def _entries(functions_yaml: Path) -> dict[str, str]:
    """{"aten::add.out": "add_out", "dim_order_ops::_clone_dim_order.out": "_clone_dim_order_out"}:
    op name (as the selective build names it) -> kernel function, from functions.yaml's
    `- op:` / `- func:` entries and their first `kernel_name:`."""
    out: dict[str, str] = {}
    name = None
    for line in functions_yaml.read_text().splitlines():
        op = re.match(r"^- op: *(\S+)", line)
        func = re.match(r"^- func: *([A-Za-z_][A-Za-z0-9_]*::[^(]+)\(", line)
        if op or func:
            name = f"aten::{op.group(1)}" if op else func.group(1)  # type: ignore[union-attr]
            continue
        kernel = re.match(r"^ +kernel_name: *(\S+)", line)
        if kernel and name and name not in out:
            out[name] = kernel.group(1).split("::")[-1]
    return out


def sources(et_root: Path, ops: list[str]) -> list[str]:
    cpu = et_root / "kernels" / "portable" / "cpu"
    kernels = _entries(et_root / "kernels" / "portable" / "functions.yaml")
    texts = {p.name: p.read_text(errors="replace") for p in sorted(cpu.glob("op_*.cpp"))}
    chosen: set[str] = set()
    for op in ops:
        kernel = kernels.get(op)
        if kernel is None:
            continue  # not a portable op
        # a file that names the kernel function defines it (directly or through a macro such as
        # DEFINE_UNARY_UFUNC); naming it elsewhere too only compiles one file more
        found = [name for name, text in texts.items() if re.search(rf"\b{re.escape(kernel)}\b", text)]
        if not found:
            raise SystemExit(f"portable_sources.py: no file in {cpu} defines {kernel} (the kernel of {op})")
        chosen.update(found)
    return sorted(chosen)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[2].strip(), file=sys.stderr)
        return 2
    try:
        print(";".join(sources(Path(argv[0]), [o for o in argv[1].split(",") if o])))
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"portable_sources.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
