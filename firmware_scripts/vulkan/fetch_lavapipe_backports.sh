#!/usr/bin/env bash
# A second Vulkan driver for `vulkan://lavapipe?icd=PATH`: bookworm-backports' lavapipe (Mesa 25.0.x),
# unpacked privately; prints the path of its ICD json (the last stdout line).
#
#   fetch_lavapipe_backports.sh     # -> .../tools/lavapipe-bookworm-backports/lvp_icd.x86_64.json
#
# Why a second driver: the lane's reference driver is this system's own lavapipe (Debian 12's
# mesa-vulkan-drivers 22.3.6, ICD /usr/share/vulkan/icd.d/lvp_icd.x86_64.json); validating the same
# bundles on another driver build by changing only the `icd` setting is what a driver developer does.
# Installing backports' Mesa would replace the system's, so mesa-vulkan-drivers is unpacked with
# firmware_scripts/vulkan/private_apt.sh. Its other dependencies resolve against this system's
# libraries (libLLVM-15, libdrm 2.4.114: every symbol it needs is there, checked below with RTLD_NOW).
# The packaged ICD json names `libvulkan_lvp.so` for the loader's search path (which would find the
# system's), so a private json is written beside it whose library_path is relative to that json
# (`./root/...`: the loader reads a relative path from the json's folder), so the cache can move.
#
# Cached in ${BUNDLERUN_CACHE:-~/.cache/bundlerun}/tools/lavapipe-bookworm-backports/.
set -euo pipefail
HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
ET_SCRIPT_NAME="fetch_lavapipe_backports.sh"
BUNDLERUN_CACHE="${BUNDLERUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bundlerun}"
# shellcheck source=private_apt.sh
source "$HERE/private_apt.sh"

SUITE="bookworm-backports"
DEST="$BUNDLERUN_CACHE/tools/lavapipe-$SUITE"
mkdir -p "$BUNDLERUN_CACHE/tools"
(
  flock 9
  private_apt_unpack "$SUITE" "$DEST" mesa-vulkan-drivers
) 9>"$BUNDLERUN_CACHE/tools/.lavapipe-$SUITE.lock"

LIBDIR="$DEST/root/usr/lib/x86_64-linux-gnu"
LIB="$LIBDIR/libvulkan_lvp.so"
[ -f "$LIB" ] || private_apt_die "no libvulkan_lvp.so in $LIBDIR (mesa-vulkan-drivers of $SUITE not unpacked?)"
SRC_JSON="$(ls "$DEST"/root/usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | sed -n 1p)"
[ -n "$SRC_JSON" ] || private_apt_die "no lvp_icd*.json in $DEST/root/usr/share/vulkan/icd.d"
python3 -c 'import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW)' "$LIB" \
  || private_apt_die "$LIB does not load against this system's libraries (a dependency too old?)"
JSON="$DEST/lvp_icd.x86_64.json"
python3 - "$SRC_JSON" "./${LIB#"$DEST"/}" > "$JSON.tmp" <<'PY'
import json, sys
icd = json.load(open(sys.argv[1]))
icd["ICD"]["library_path"] = sys.argv[2]  # a path, never a bare name the loader would search for
print(json.dumps(icd, indent=4))
PY
if cmp -s "$JSON.tmp" "$JSON"; then rm -f "$JSON.tmp"; else mv "$JSON.tmp" "$JSON"; fi
echo "$JSON"
