#!/usr/bin/env bash
# Set up (including adb and chromium) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the linter (pyflakes' rules, pyproject.toml [tool.ruff]) and the type checker (no mypy error that
# .ci/mypy-baseline.txt does not hold), both pinned in the test extra, before the tests
.venv/bin/ruff check --no-cache .
.venv/bin/python scripts/typecheck.py
# free disk where the suite writes (its temp folders, the build cache): said first, so an ENOSPC later has its cause
df -h "${TMPDIR:-/tmp}" "${BUNDLERUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}}" 2>/dev/null | awk 'NR > 1 {print "disk: " $4 " free on " $6}' | sort -u || true
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=20 "$@"
