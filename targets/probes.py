"""Bounded probes for `doctor`: a tool's version line, a distribution's version. Never raise."""

from __future__ import annotations

import shutil
import subprocess

from bundlerun.targets import Check

PROBE_TIMEOUT_S = 30.0


def probe(cmd: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Run a version command; (ok, first non-empty output line or the failure)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout_s,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    except FileNotFoundError:
        return False, "not found"
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout_s:.0f}s"
    except OSError as exc:
        return False, exc.strerror or str(exc)
    text = (proc.stdout or "") + (proc.stderr or "")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if proc.returncode != 0:
        return False, f"exit {proc.returncode}: {first}"[:160]
    return True, first[:160]


def tool_check(name: str, version_args: list[str], missing_hint: str, path: str | None = None) -> Check:
    """A row for a command-line tool found on PATH (or at `path`)."""
    found = path or shutil.which(name)
    if not found:
        return Check(name, False, f"not on PATH ({missing_hint})")
    ok, detail = probe([found, *version_args])
    return Check(name, ok, detail, found)


def dist_check(label: str, dist: str, module: str | None = None, missing_hint: str = "") -> Check:
    """A row for a Python distribution (and, optionally, that its module is importable)."""
    import importlib.util
    from importlib import metadata

    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return Check(label, False, "not installed" + (f" ({missing_hint})" if missing_hint else ""), dist)
    if module:
        try:
            if importlib.util.find_spec(module) is None:
                return Check(label, False, f"{version} (module {module} missing)", dist)
        except (ImportError, ValueError):
            return Check(label, False, f"{version} (module {module} missing)", dist)
    return Check(label, True, version, dist)
