#!/usr/bin/env bash
# Check the Corstone FVP installs bundlerun's fvp:// target uses: `<FVP> --version`.
#
#   check_fvp.sh                 check all three FVPs, exit 0 if at least one works
#   check_fvp.sh --all           exit 0 only if all three work
#   check_fvp.sh FVP_Corstone_SSE-320 ...   check just these
#
# FVPs come from ExecuTorch's examples/arm/setup.sh (then source
# examples/arm/arm-scratch/setup_path.sh) or Arm's Corstone FVP downloads.
set -uo pipefail

require_all=false
names=()
for arg in "$@"; do
    case "$arg" in
        --all) require_all=true ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        FVP_*) names+=("$arg") ;;
        *) echo "check_fvp.sh: unknown argument '$arg'" >&2; exit 2 ;;
    esac
done
((${#names[@]})) || names=(FVP_Corstone_SSE-300_Ethos-U55 FVP_Corstone_SSE-300_Ethos-U65 FVP_Corstone_SSE-320)

ok=0
missing=0
for fvp in "${names[@]}"; do
    path="$(command -v "$fvp" 2>/dev/null || true)"
    if [[ -z "$path" ]]; then
        printf '%-32s MISSING (not on PATH)\n' "$fvp"
        missing=$((missing + 1))
        continue
    fi
    if out="$(timeout 60 "$path" --version 2>&1)"; then
        printf '%-32s OK   %s  [%s]\n' "$fvp" "$(echo "$out" | head -n 1)" "$path"
        ok=$((ok + 1))
    else
        printf '%-32s FAIL (--version exited non-zero)  [%s]\n' "$fvp" "$path"
        echo "$out" | head -n 5 | sed 's/^/    /'
        missing=$((missing + 1))
    fi
done

if $require_all; then
    ((missing == 0))
else
    ((ok > 0))
fi
