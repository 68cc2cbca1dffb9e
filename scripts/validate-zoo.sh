#!/usr/bin/env bash
# The main job: set up, then validate every zoo model on the host target in fp32, fp16 and int8.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_SYSTEM_PACKAGES=0 bash scripts/setup.sh
exec .venv/bin/bundlerun validate zoo --target host://xnnpack --dtype fp32,fp16,int8 --cases 16 --report out/validate "$@"
