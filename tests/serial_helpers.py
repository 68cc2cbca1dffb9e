"""Shared pieces of the serial-lane tests: a zoo bundle, leak checks, run helpers."""

from __future__ import annotations

import os
from pathlib import Path

from bundlerun.bundles.bpte import read_bundle, serialize_bundle
from bundlerun.targets import open_target
from bundlerun.targets.base import RunOptions


def open_fds() -> set[str]:
    """This process's open descriptors, as 'fd -> target' strings."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            continue
    return out


def child_pids(exclude: set[int] = frozenset()) -> set[int]:
    """Live (non-zombie-reaped) children of this process, minus `exclude`."""
    me = os.getpid()
    kids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == me:
            kids.add(int(entry))
    return kids - set(exclude)


def run_serial(url: str, config: dict, bundle_path: Path, work: Path, **opts):
    target = open_target(url, config)
    bundle = read_bundle(bundle_path)
    options = RunOptions(work_dir=work, **{"case_timeout_s": 30.0, "retries": 0, **opts})
    return target.run(bundle, bundle_path, options)


def case_bytes(bundle_path: Path, method: str, index: int) -> bytes:
    return serialize_bundle(read_bundle(bundle_path).single_case(method, index))
