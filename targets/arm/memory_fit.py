"""Whether a bundle fits the bare-metal runner's memory, decided before QEMU starts.

ExecuTorch's arm_executor_runner has no heap for the model: it carves everything out of static
pools (examples/arm/executor_runner/arm_executor_runner.cpp): in semihosting mode the bundle file
(and the `-i` file) is read whole into `input_file_allocation_pool` (:164-168, read_binary_file
:549-583), every memory-planned buffer of the method comes out of `method_allocation_pool`
(:233-237, :734-782), kernels' scratch out of `temp_allocation_pool` (:279-283); in uart mode the
bundle is read in place where QEMU's loader put it (the linker script's BUNDLE region,
firmware_scripts/arm/qemu/mps3-an547.ld). A model too big for them fails inside QEMU with a Fatal
line and exit 255 (or, placed past its region, overwrites memory); the pool sizes are read here
from the runner ELF's own symbol table (the symbols' sizes are what was linked, whatever the
build flags said), so the run is refused in one line naming both sizes instead.

What is checked is a lower bound of what the runner needs: the bundle bytes, and the sum of the
planned buffers (each 16-byte aligned, as the runner allocates them). The method's own
metadata and the kernels' scratch are not known before the run; a run that still runs out of a
pool is classified from the runner's log (targets/et_runner/protocol.py, allocation-failure) and
`describe` names the pools beside it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

# The runner's pool symbols (arm_executor_runner.cpp) and the linker script's bundle region size.
FILE_POOL = "input_file_allocation_pool"
METHOD_POOL = "method_allocation_pool"
TEMP_POOL = "temp_allocation_pool"
BUNDLE_REGION = "__bundle_size"
_SYMBOLS = (FILE_POOL, METHOD_POOL, TEMP_POOL, BUNDLE_REGION)
_ALIGN = 16  # the runner allocates each planned buffer with 16-byte alignment (:772)
_MAX_SECTIONS = 1 << 16
_MAX_SYMTAB = 64 << 20  # a runner's symbol table is a few MiB; more is not a runner ELF


@dataclass(frozen=True)
class RunnerMemory:
    """The pools of one runner ELF, in bytes (None: the ELF has no such symbol)."""

    elf: Path
    file_pool: int | None  # semihosting: the bundle and the -i file are read into it
    method_pool: int | None  # planned buffers, the loaded method, its inputs
    temp_pool: int | None  # kernels' scratch, reset after each kernel call
    bundle_region: int | None  # uart: the region QEMU's loader places the bundle in

    def describe(self) -> str:
        """The pools as one phrase: 'method pool 64.0 MiB, file pool 32.0 MiB, scratch pool 2.0 MiB'."""
        parts = [f"{what} {mib(size)}" for what, size in (("method pool", self.method_pool),
                                                          ("file pool", self.file_pool),
                                                          ("scratch pool", self.temp_pool)) if size is not None]
        return ", ".join(parts) or "no pool symbols"


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def elf_symbols(path: Path, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """{name: (value, size)} of the named symbols in a little-endian 32-bit ELF's symbol table;
    {} when the file is not one or is truncated (a stripped or foreign ELF: nothing to check against).
    Reads only the section headers, the symbol table and its string table."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(52)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] != 1 or head[5] != 1:
                return {}
            shoff, = struct.unpack_from("<I", head, 0x20)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x2E)
            if shentsize < 40 or not 0 < shnum <= _MAX_SECTIONS:
                return {}
            fh.seek(shoff)
            table = fh.read(shentsize * shnum)
            if len(table) < shentsize * shnum:
                return {}
            sections = [struct.unpack_from("<10I", table, i * shentsize) for i in range(shnum)]
            for sh in sections:
                if sh[1] != 2:  # SHT_SYMTAB
                    continue
                link = sh[6]
                if link >= shnum or sh[5] > _MAX_SYMTAB or sections[link][5] > _MAX_SYMTAB:
                    return {}
                fh.seek(sh[4])
                symtab = fh.read(sh[5])
                fh.seek(sections[link][4])
                strtab = fh.read(sections[link][5])
                return _find(symtab, strtab, set(names))
    except OSError:
        return {}
    return {}


def _find(symtab: bytes, strtab: bytes, wanted: set[str]) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    encoded = {n.encode(): n for n in wanted}
    for off in range(0, len(symtab) - 15, 16):
        name_off, value, size = struct.unpack_from("<III", symtab, off)
        if name_off >= len(strtab):
            continue
        end = strtab.find(b"\0", name_off)
        name = strtab[name_off:end if end >= 0 else len(strtab)]
        if name in encoded:
            found[encoded[name]] = (value, size)
            if len(found) == len(wanted):
                break
    return found


def runner_memory(elf: Path) -> RunnerMemory | None:
    """The runner's pools read from its ELF, or None when it has no method pool symbol (not an
    arm_executor_runner, or stripped: the run goes ahead unchecked)."""
    syms = elf_symbols(elf, _SYMBOLS)
    if METHOD_POOL not in syms:
        return None

    def size(name: str) -> int | None:
        return syms[name][1] if name in syms else None

    region = syms[BUNDLE_REGION][0] if BUNDLE_REGION in syms else None  # an absolute symbol: its value
    return RunnerMemory(elf, size(FILE_POOL), size(METHOD_POOL), size(TEMP_POOL), region)


def planned_need(buffers: list[int]) -> int:
    """Bytes the method pool gives the planned buffers (each aligned to 16, as the runner asks)."""
    return sum(-(-b // _ALIGN) * _ALIGN for b in buffers)


@dataclass(frozen=True)
class Misfit:
    """Why a bundle cannot fit: the one line a run reports for every case."""

    message: str


def check_fit(memory: RunnerMemory, planned: dict[str, list[int]], case_bundle_bytes: int, mode: str,
              model: str, dummy_input_bytes: int = 4) -> Misfit | None:
    """A Misfit naming the sizes when the bundle cannot fit the runner's pools, else None.
    `case_bundle_bytes`: the bytes the runner reads (one case's bundle); `planned`: per method, its
    planned buffer sizes (bundles.program_meta.planned_buffer_sizes)."""
    problems = []
    if mode == "semihosting" and memory.file_pool is not None:
        need = case_bundle_bytes + dummy_input_bytes
        if need > memory.file_pool:
            problems.append(f"the case's bundle is {mib(case_bundle_bytes)} ({case_bundle_bytes} B), the runner reads "
                            f"it whole into its {FILE_POOL} of {mib(memory.file_pool)} ({memory.file_pool} B)")
    if mode == "uart" and memory.bundle_region is not None and case_bundle_bytes > memory.bundle_region:
        problems.append(f"the case's bundle is {mib(case_bundle_bytes)} ({case_bundle_bytes} B), the runner's bundle "
                        f"region holds {mib(memory.bundle_region)} ({memory.bundle_region} B)")
    if memory.method_pool is not None:
        for method, buffers in sorted(planned.items()):
            need = planned_need(buffers)
            if need > memory.method_pool:
                problems.append(f"method {method!r} plans {mib(need)} ({need} B) of buffers, the runner's "
                                f"{METHOD_POOL} holds {mib(memory.method_pool)} ({memory.method_pool} B; "
                                f"build_qemu_runner.sh --method-pool-size sets it)")
    if not problems:
        return None
    return Misfit(f"{model} does not fit the runner's memory: {'; '.join(problems)} (sizes read from the "
                  f"symbols of {memory.elf}); not run")
