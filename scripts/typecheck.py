"""Type-check bundlerun with mypy (pinned in the test extra) and allow no new errors.

The tree installs bundles/, targets/ and runner/ as bundlerun.bundles, .targets, .runner
(pyproject.toml), a mapping mypy cannot follow, so mypy runs over a scratch tree of links laid
out as the installed package. Its errors are compared with .ci/mypy-baseline.txt, keyed by file,
message and code (not line numbers, which move with every edit): an error the baseline does not
hold fails the check; one the code no longer has is listed, so the baseline only shrinks.

    python scripts/typecheck.py             # check (exit 1 on a new error)
    python scripts/typecheck.py --update    # rewrite the baseline (after fixing errors)
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy-baseline.txt"
PACKAGES = {"bundles": "bundles", "targets": "targets", "runner": "runner"}  # bundlerun.<name> -> folder
_LINE = re.compile(r"^bundlerun/(?P<path>[^:]+):\d+: error: (?P<message>.*)$")


def _shadow(tmp: Path) -> Path:
    """bundlerun/ as installed: its own modules plus links to bundles/, targets/, runner/."""
    pkg = tmp / "bundlerun"
    pkg.mkdir()
    for module in (ROOT / "bundlerun").glob("*.py"):
        (pkg / module.name).symlink_to(module)
    for name, folder in PACKAGES.items():
        (pkg / name).symlink_to(ROOT / folder, target_is_directory=True)
    return tmp


def _key(line: str) -> str | None:
    """`runner/x.py: message [code]` for one mypy error line (the repository's path, no line number)."""
    match = _LINE.match(line.strip())
    if not match:
        return None
    path = match["path"]
    top, _, rest = path.partition("/")
    path = f"{PACKAGES[top]}/{rest}" if top in PACKAGES else f"bundlerun/{path}"
    return f"{path}: {match['message']}"


def run_mypy() -> tuple[int, list[str]]:
    with tempfile.TemporaryDirectory(prefix="bundlerun-mypy-") as tmp:
        cwd = _shadow(Path(tmp))
        proc = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
             "--cache-dir", str(Path(tmp) / "cache"), "--no-error-summary", "-p", "bundlerun"],
            cwd=cwd, capture_output=True, text=True, env={**os.environ, "MYPY_FORCE_COLOR": "0"})
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (a crash, a bad option)
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"typecheck: mypy failed (exit {proc.returncode})")
    keys = [k for k in (_key(line) for line in proc.stdout.splitlines()) if k]
    return proc.returncode, keys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite .ci/mypy-baseline.txt")
    args = parser.parse_args()
    _, keys = run_mypy()
    found = collections.Counter(keys)
    if args.update:
        BASELINE.write_text("".join(f"{k}\n" for k in sorted(found.elements())))
        print(f"typecheck: baseline rewritten: {sum(found.values())} errors")
        return 0
    known = collections.Counter(BASELINE.read_text().splitlines()) if BASELINE.is_file() else collections.Counter()
    new = found - known
    fixed = known - found
    for key in sorted(new.elements()):
        print(f"new type error: {key}")
    if fixed:
        print(f"typecheck: {sum(fixed.values())} baseline errors are gone: run scripts/typecheck.py --update")
    print(f"typecheck: {sum(found.values())} errors, {sum(new.values())} new (baseline {sum(known.values())})")
    return 1 if new else 0


if __name__ == "__main__":
    raise SystemExit(main())
