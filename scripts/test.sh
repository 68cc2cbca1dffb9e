#!/usr/bin/env bash
# Set up (including adb and chromium) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=20 "$@"
