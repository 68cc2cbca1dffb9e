"""Install the FVP test double under the real Corstone FVP binary names."""

from __future__ import annotations

import sys
from pathlib import Path

DOUBLE = Path(__file__).with_name("fvp_double.py")
FVP_NAMES = ("FVP_Corstone_SSE-300_Ethos-U55", "FVP_Corstone_SSE-300_Ethos-U65", "FVP_Corstone_SSE-320")


def install_fvp_doubles(bin_dir: Path, names: tuple[str, ...] = FVP_NAMES) -> Path:
    """Copy the double into `bin_dir` under each real name, with a shebang for this
    interpreter (so it can import executorch), and return `bin_dir` for PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    body = DOUBLE.read_text().split("\n", 1)[1]
    for name in names:
        target = bin_dir / name
        target.write_text(f"#!{sys.executable}\n{body}")
        target.chmod(0o755)
    return bin_dir
