"""The Arm platform table, once: Corstone boards, their cores and NPUs, FVP binaries, Vela defaults.

The build side (bundles/backends/arm.py: what to lower for) and the run side
(targets/arm/: which FVP or emulator to start) both read it. No torch here.

    corstone-300  Cortex-M55 (+ Ethos-U55 or U65)   FVP_Corstone_SSE-300_Ethos-U55 / _U65, QEMU mps3-an547 (no NPU)
    corstone-320  Cortex-M85 (+ Ethos-U85)          FVP_Corstone_SSE-320
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

FVP_300_U55 = "FVP_Corstone_SSE-300_Ethos-U55"
FVP_300_U65 = "FVP_Corstone_SSE-300_Ethos-U65"
FVP_320 = "FVP_Corstone_SSE-320"
FVP_BINARIES = (FVP_300_U55, FVP_300_U65, FVP_320)


@dataclass(frozen=True)
class NpuFamily:
    """An Ethos-U family: valid MAC counts, its Corstone board, FVP and Vela defaults
    (as in executorch/backends/arm/test/common.py)."""

    name: str
    macs: tuple[int, ...]
    board: str
    fvp: str
    system_config: str
    memory_mode: str
    extra_flags: tuple[str, ...] = field(default_factory=tuple)


NPU_FAMILIES: dict[str, NpuFamily] = {
    "ethos-u55": NpuFamily("ethos-u55", (32, 64, 128, 256), "corstone-300", FVP_300_U55,
                           "Ethos_U55_High_End_Embedded", "Shared_Sram", ("--arena-cache-size=2097152",)),
    "ethos-u65": NpuFamily("ethos-u65", (256, 512), "corstone-300", FVP_300_U65,
                           "Ethos_U65_High_End", "Dedicated_Sram_384KB", ("--arena-cache-size=393216",)),
    "ethos-u85": NpuFamily("ethos-u85", (128, 256, 512, 1024, 2048), "corstone-320", FVP_320,
                           "Ethos_U85_SYS_DRAM_Mid", "Shared_Sram", ("--arena-cache-size=2097152",)),
}

# Cortex-M core -> (board, CMSIS cpu name, FVP binary that carries it).
CORTEX_M_CORES: dict[str, tuple[str, str, str]] = {
    "cortex-m55": ("corstone-300", "M55", FVP_300_U55),
    "cortex-m85": ("corstone-320", "M85", FVP_320),
}
BOARDS = ("corstone-300", "corstone-320")
EXAMPLES = ("corstone-300/ethos-u55-128, corstone-300/ethos-u65-256, corstone-320/ethos-u85-256, "
            "corstone-300/cortex-m55, corstone-320/cortex-m85")


@dataclass(frozen=True)
class Platform:
    """One board + processor, e.g. corstone-300/ethos-u55-128."""

    key: str  # "corstone-300/ethos-u55-128"
    board: str  # "corstone-300" | "corstone-320"
    processor: str  # "ethos-u55" | "ethos-u65" | "ethos-u85" | "cortex-m55" | "cortex-m85"
    num_macs: int  # NPU MACs (128 for a Cortex-M platform: the FVP's NPU sits idle)
    fvp: str  # FVP binary name

    @property
    def has_npu(self) -> bool:
        return self.processor.startswith("ethos-u")

    @property
    def accelerator(self) -> str | None:
        """Vela's accelerator config, e.g. "ethos-u55-128"; None for a Cortex-M platform."""
        return f"{self.processor}-{self.num_macs}" if self.has_npu else None

    @property
    def build_target(self) -> str:
        """The `--target=` of ExecuTorch's build_executor_runner.sh."""
        return self.accelerator or self.processor

    @property
    def cpu(self) -> str:
        """CMSIS name of the platform's CPU (M55 on Corstone-300, M85 on Corstone-320)."""
        return "M55" if self.board == "corstone-300" else "M85"

    def vela_defaults(self) -> dict[str, Any]:
        fam = NPU_FAMILIES[self.processor]
        return {"system_config": fam.system_config, "memory_mode": fam.memory_mode, "extra_flags": list(fam.extra_flags)}


def parse_platform(board: str, processor: str) -> Platform:
    """`corstone-300` + `ethos-u55-128` -> Platform; ValueError with a one-line reason otherwise."""
    board, proc = board.lower().strip("/"), processor.lower().strip("/")
    key = f"{board}/{proc}"
    if board not in BOARDS:
        raise ValueError(f"unknown Corstone platform {board!r} in {key}; expected one of {EXAMPLES}")
    if proc in CORTEX_M_CORES:
        want, _cpu, fvp = CORTEX_M_CORES[proc]
        if board != want:
            raise ValueError(f"{proc} lives on {want}, not {board}: use {want}/{proc}")
        return Platform(key, board, proc, 128, fvp)
    m = re.fullmatch(r"(ethos-u55|ethos-u65|ethos-u85)-(\d+)", proc)
    if not m:
        raise ValueError(f"unknown processor {proc!r} in {key}; expected one of {EXAMPLES}")
    fam = NPU_FAMILIES[m.group(1)]
    macs = int(m.group(2))
    if macs not in fam.macs:
        raise ValueError(f"{fam.name} has no {macs}-MAC configuration; valid: {', '.join(map(str, fam.macs))}")
    if board != fam.board:
        raise ValueError(f"{fam.name} is on {fam.board}, not {board}: use {fam.board}/{proc}")
    return Platform(key, board, fam.name, macs, fam.fvp)
