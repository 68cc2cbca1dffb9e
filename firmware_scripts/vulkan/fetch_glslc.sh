#!/usr/bin/env bash
# A glslc that compiles ExecuTorch's Vulkan shaders, unpacked privately; prints its bin folder.
#
#   fetch_glslc.sh            # -> last stdout line: a folder holding `glslc` (put it first on PATH)
#
# Why: Debian 12's glslang 11.13 rejects the GL_EXT_integer_dot_product shaders of
# backends/vulkan/runtime/graph/ops/glsl (q8ta_*); Debian 13 (trixie)'s glslc 2025.2 (shaderc,
# glslang 15.1) compiles all of them. Its libc6/libstdc++6 are newer than this system's, so they
# are unpacked next to it (never installed: firmware_scripts/vulkan/private_apt.sh) and glslc runs
# through trixie's own dynamic loader with --library-path. The wrapper `glslc` script makes that one
# command for CMake's find_program(GLSLC_PATH glslc) (backends/vulkan/cmake/ShaderLibrary.cmake).
#
# Cached in ${BUNDLERUN_CACHE:-~/.cache/bundlerun}/tools/glslc-trixie/ (a second call returns at once).
set -euo pipefail
HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
ET_SCRIPT_NAME="fetch_glslc.sh"
BUNDLERUN_CACHE="${BUNDLERUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bundlerun}"
# shellcheck source=private_apt.sh
source "$HERE/private_apt.sh"

SUITE="trixie"
DEST="$BUNDLERUN_CACHE/tools/glslc-$SUITE"
mkdir -p "$BUNDLERUN_CACHE/tools"
(
  flock 9
  private_apt_unpack "$SUITE" "$DEST" glslc libshaderc1 libc6 libstdc++6 libgcc-s1
) 9>"$BUNDLERUN_CACHE/tools/.glslc-$SUITE.lock"

ROOT="$DEST/root"
LOADER="$ROOT/usr/lib64/ld-linux-x86-64.so.2"
[ -e "$LOADER" ] || LOADER="$ROOT/lib64/ld-linux-x86-64.so.2"
[ -e "$LOADER" ] || private_apt_die "no ld-linux-x86-64.so.2 in $ROOT (libc6 of $SUITE not unpacked?)"
[ -x "$ROOT/usr/bin/glslc" ] || private_apt_die "no usr/bin/glslc in $ROOT"
mkdir -p "$DEST/bin"
if [ ! -x "$DEST/bin/glslc" ]; then
  cat > "$DEST/bin/glslc.tmp" <<EOF
#!/bin/sh
# trixie's glslc through trixie's own loader and libraries (firmware_scripts/vulkan/fetch_glslc.sh)
exec "$LOADER" --library-path "$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu" "$ROOT/usr/bin/glslc" "\$@"
EOF
  chmod +x "$DEST/bin/glslc.tmp"
  mv "$DEST/bin/glslc.tmp" "$DEST/bin/glslc"
fi
"$DEST/bin/glslc" --version >/dev/null 2>&1 || private_apt_die "$DEST/bin/glslc does not run: $("$DEST/bin/glslc" --version 2>&1 | sed -n 1,1p)"
echo "$DEST/bin"
