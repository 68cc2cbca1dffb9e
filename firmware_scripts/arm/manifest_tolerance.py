#!/usr/bin/env python3
"""Print the loosest atol/rtol a bundle's manifest allows, for ET_ATOL/ET_RTOL.

The stock arm_executor_runner checks test case 0 against tolerances compiled into
the firmware. A UART-only runner built for one bundle should use the bundle's
own resolved criteria, so its on-device verdict agrees with the host's.

    python firmware_scripts/arm/manifest_tolerance.py model.bpte        -> "0.001 0.001"
    python firmware_scripts/arm/manifest_tolerance.py --cmake model.bpte -> "-DET_ATOL=0.001 -DET_RTOL=0.001"

Exit 2 with a one-line message on a bad bundle.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--cmake", action="store_true", help="print -DET_ATOL=.. -DET_RTOL=.. flags")
    parser.add_argument("--method", default=None, help="only this method's outputs")
    args = parser.parse_args(argv)

    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.errors import BundlerunError
    from bundlerun.targets.arm.fvp import firmware_tolerance

    try:
        bundle = read_bundle(args.bundle)
        atol, rtol, notes = firmware_tolerance(bundle.manifest, args.method)
    except BundlerunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.cmake:
        print(f"-DET_ATOL={atol:g} -DET_RTOL={rtol:g}")
    else:
        print(f"{atol:g} {rtol:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
