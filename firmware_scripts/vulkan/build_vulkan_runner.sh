#!/usr/bin/env bash
# Build ExecuTorch's executor_runner for THIS host (x86_64 Linux) with the Vulkan delegate, BundleIO
# and ETDump, plus bundlerun's debug runner from the same libraries, for `vulkan://lavapipe`.
#
#   build_vulkan_runner.sh [--executorch-src DIR] [--jobs 2] [--rebuild] [--cached-only] [--dry-run]
#                          [--python PY] [--glslc PATH]
#
# Sources: --executorch-src DIR (a checkout), else the tarballs of ../shared/third_party
# (firmware_scripts/lib/et_sources.sh; Vulkan-Headers, VulkanMemoryAllocator and volk included).
# glslc: --glslc PATH, else Debian 13's glslc unpacked privately by fetch_glslc.sh (Debian 12's is too
# old for the GL_EXT_integer_dot_product shaders). PYTHON (the venv) runs gen_vulkan_spv.py: it needs
# pyyaml (executorch's wheel depends on it) and ships flatc.
#
# Built in: the Vulkan delegate (all of its shaders: the partitioner may pick any of its ops), the
# portable kernels (ALL of them: the portable ops between Vulkan subgraphs of a partly delegated user
# model are not known at build time), the quantized kernels (quantize/dequantize between the
# subgraphs of a partly delegated int8 model), BundleIO, the event tracer (ETDump), logging to stderr
# (posix PAL), and bundlerun's server-mode patch (../android/patches/executor_runner-server-testset.patch:
# a trigger line names the bundled test case, so one loaded method serves a whole LLM sequence, its KV
# cache kept, whatever each case's input shape; the Vulkan partitioner delegates export_llama's
# llama::update_cache / llama::custom_sdpa (backends/vulkan/op_registry.py:1088-1099), so no LLM
# custom-op kernels are linked). Not built: optimized kernels, XNNPACK. Dynamically linked (the delegate
# loads libvulkan.so.1 through volk at run time).
#
# Output: ${BUNDLERUN_CACHE:-~/.cache/bundlerun}/runners/<key>/{executor_runner,debug_runner,runner.json,
# build.log,ninja_log}; the last stdout line is that folder; a second call prints it at once. <key> hashes
# the sources, the CMake flags, the compiler, the glslc version and the debug runner's sources.
# --cached-only prints the cached folder or exits 3. Exit 2 with a one-line `build_vulkan_runner.sh: ...`.
set -euo pipefail

HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
ET_SCRIPT_NAME="build_vulkan_runner.sh"
DEBUG_DIR="$HERE/../android/debug_runner"  # bundlerun's debug runner (shared with the aarch64 lane)
SERVER_PATCH="$HERE/../android/patches/executor_runner-server-testset.patch"  # shared with the aarch64 lane

ET_DIR=""; JOBS="2"; REBUILD=0; CACHED_ONLY=0; DRY_RUN=0; PYTHON_BIN="${PYTHON:-}"; GLSLC=""
die() { echo "build_vulkan_runner.sh: $*" >&2; exit 2; }
need_arg() { [ $# -ge 2 ] && [ -n "$2" ] && [[ "$2" != --* ]] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --executorch-src) need_arg "$@"; ET_DIR="$2"; shift 2;;
    --jobs) need_arg "$@"; JOBS="$2"; shift 2;;
    --python) need_arg "$@"; PYTHON_BIN="$2"; shift 2;;
    --glslc) need_arg "$@"; GLSLC="$2"; shift 2;;
    --rebuild) REBUILD=1; shift;;
    --cached-only) CACHED_ONLY=1; shift;;
    --dry-run) DRY_RUN=1; shift;;
    -h|--help) sed -n '2,25p' "$0"; exit 0;;
    *) die "unknown option $1 (see --help)";;
  esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer, not '$JOBS'"
[ "$(uname -m)" = x86_64 ] || die "the Vulkan lane builds for this host and runs on lavapipe x86_64; this host is $(uname -m)"

# shellcheck source=../lib/et_sources.sh
source "$HERE/../lib/et_sources.sh"
if [ -z "$PYTHON_BIN" ]; then
  if [ -x "$HERE/../../.venv/bin/python" ]; then PYTHON_BIN="$(cd "$HERE/../.." && pwd)/.venv/bin/python"; else PYTHON_BIN="python3"; fi
fi
if [ "$DRY_RUN" = 0 ]; then
  for tool in g++ cmake ninja flock; do
    command -v "$tool" >/dev/null || die "$tool not found: apt-get install g++ cmake ninja-build util-linux"
  done
  "$PYTHON_BIN" -c "import yaml" 2>/dev/null || die "$PYTHON_BIN lacks pyyaml, which gen_vulkan_spv.py needs (pip install pyyaml)"
fi
if [ -z "$GLSLC" ]; then
  if [ "$DRY_RUN" = 1 ] || [ "$CACHED_ONLY" = 1 ]; then
    GLSLC="${BUNDLERUN_CACHE}/tools/glslc-trixie/bin/glslc"
  else
    GLSLC="$(bash "$HERE/fetch_glslc.sh" | tail -n 1)/glslc"
  fi
fi
glslc_version="$("$GLSLC" --version 2>/dev/null | sed -n 1,3p | tr '\n' ' ')" || glslc_version=""
if [ -z "$glslc_version" ]; then
  [ "$DRY_RUN" = 1 ] || [ "$CACHED_ONLY" = 1 ] || die "glslc at $GLSLC does not run (firmware_scripts/vulkan/fetch_glslc.sh unpacks one)"
  glslc_version="glslc (not fetched yet)"
fi

et="$(et_resolve_sources "$ET_DIR")"
fp="$(et_source_fingerprint "$et")"
if [ "$DRY_RUN" = 1 ]; then flatc="<executorch wheel>/data/bin/flatc"; else flatc="$(et_wheel_flatc "$PYTHON_BIN")"; fi
compiler_version="$(g++ --version 2>/dev/null | sed -n 1,1p || echo 'g++ (not installed)')"

flags=(
  -DCMAKE_BUILD_TYPE=Release
  "${ET_RUNNER_COMMON_FLAGS[@]}"
  -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON
  -DEXECUTORCH_BUILD_KERNELS_OPTIMIZED=OFF
  -DEXECUTORCH_BUILD_XNNPACK=OFF
  -DEXECUTORCH_BUILD_PTHREADPOOL=OFF
  -DEXECUTORCH_BUILD_CPUINFO=OFF
  -DEXECUTORCH_BUILD_VULKAN=ON
)
key="$(et_cache_key "executor_runner-vulkan" x86_64 "$fp" "${flags[*]}" "$compiler_version" "$glslc_version" \
       "$DEBUG_DIR/inject.cmake" "$DEBUG_DIR/debug_runner.cmake" "$DEBUG_DIR/debug_runner.cpp" "$SERVER_PATCH")"
dest="$BUNDLERUN_CACHE/runners/$key"
build="$dest.build"
et_ccache
all_flags=("${flags[@]}" ${ET_CCACHE_FLAGS[@]+"${ET_CCACHE_FLAGS[@]}"} -DGLSLC_PATH="$GLSLC" -DFLATC_EXECUTABLE="$flatc" -DPYTHON_EXECUTABLE="$PYTHON_BIN"
           -DCMAKE_PROJECT_executorch_INCLUDE="$DEBUG_DIR/inject.cmake")
targets=(executor_runner bundlerun_debug_runner)

if [ "$DRY_RUN" = 1 ]; then
  echo "# sources: a private symlink view of $et in $build/src (et_build_tree)"
  echo "# then: examples/portable/executor_runner/executor_runner.cpp patched with $SERVER_PATCH"
  printf '%q ' cmake -S "$build/src/executorch" -B "$build/out" -G Ninja "${all_flags[@]}"; echo
  printf '%q ' cmake --build "$build/out" --target "${targets[@]}" -j "$JOBS"; echo
  echo "$dest"
  exit 0
fi
if [ "$REBUILD" = 0 ] && [ -f "$dest/runner.json" ] && [ -x "$dest/executor_runner" ] && [ -x "$dest/debug_runner" ]; then
  echo "$dest"
  exit 0
fi
if [ "$CACHED_ONLY" = 1 ]; then
  echo "build_vulkan_runner.sh: no cached Vulkan executor_runner at $dest" >&2
  exit 3
fi
mkdir -p "$BUNDLERUN_CACHE/runners"
(
  flock 9
  if [ "$REBUILD" = 1 ] || [ ! -f "$dest/runner.json" ]; then
    t0="$(date +%s)"
    load0="$(cut -d' ' -f1-3 /proc/loadavg)"
    tree="$build/src/executorch"  # gen_vulkan_spv.py and the includes need the folder named `executorch`
    logf="$build/build.log"
    if [ "$REBUILD" = 0 ] && [ -f "$build/out/build.ninja" ] && [ -d "$tree" ]; then
      echo "resuming the interrupted build in $build (--rebuild starts afresh)" >&2
      mv -f "$logf" "$logf.1" 2>/dev/null || true
    else
      rm -rf "$build" "$dest"
      mkdir -p "$build"
      tree="$(et_build_tree "$et" "$build/src")"
      # the tree's files are links into the shared sources: the one patched becomes a copy first
      runner_cpp="$tree/examples/portable/executor_runner/executor_runner.cpp"
      cp --remove-destination "$(readlink -f "$runner_cpp")" "$runner_cpp"
      patch --quiet --forward -p1 -d "$tree" < "$SERVER_PATCH" >&2 \
        || die "patch $SERVER_PATCH does not apply to these sources"
    fi
    echo "building the Vulkan executor_runner (x86_64) into $dest; log: $logf" >&2
    if ! { nice -n 10 cmake -S "$tree" -B "$build/out" -G Ninja "${all_flags[@]}" \
           && nice -n 10 cmake --build "$build/out" --target "${targets[@]}" -j "$JOBS"; } >"$logf" 2>&1; then
      tail -n 30 "$logf" >&2
      die "build failed (full log: $logf)"
    fi
    for t in "${targets[@]}"; do [ -x "$build/out/$t" ] || die "build finished but $build/out/$t is missing"; done
    t1="$(date +%s)"
    rm -rf "$dest.partial"
    mkdir -p "$dest.partial"
    cp "$build/out/executor_runner" "$dest.partial/executor_runner"
    cp "$build/out/bundlerun_debug_runner" "$dest.partial/debug_runner"
    cp "$logf" "$dest.partial/build.log"
    cp "$build/out/.ninja_log" "$dest.partial/ninja_log" 2>/dev/null || true
    BR_DEST="$dest" BR_FP="$fp" BR_ET="$et" BR_CV="$compiler_version" BR_GLSLC="$GLSLC" BR_GV="$glslc_version" \
    BR_SECS="$((t1 - t0))" BR_JOBS="$JOBS" BR_LOAD="$load0" BR_LOAD1="$(cut -d' ' -f1-3 /proc/loadavg)" \
      "$PYTHON_BIN" - "${flags[@]}" > "$dest.partial/runner.json" <<'PY'
import json, os, sys, time
e = os.environ
print(json.dumps({
    "kind": "executor_runner",
    "arch": "x86_64",
    "binary": os.path.join(e["BR_DEST"], "executor_runner"),
    "debug_runner": os.path.join(e["BR_DEST"], "debug_runner"),
    "static": False,
    "flags": sys.argv[1:],
    "kernels": ["portable", "quantized"],
    "patches": ["executor_runner-server-testset"],
    "server_testset": True,
    "backends": ["vulkan"],
    "bundle_io": True,
    "etdump": True,
    "glslc": {"path": e["BR_GLSLC"], "version": e["BR_GV"].strip()},
    "sources": {"path": e["BR_ET"], "fingerprint": e["BR_FP"]},
    "toolchain": {"compiler": e["BR_CV"], "file": None},
    "build_seconds": int(e["BR_SECS"]),
    "jobs": int(e["BR_JOBS"]),
    "load_average": {"start": e["BR_LOAD"], "end": e["BR_LOAD1"]},
    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "debug_runner_cli": {"flags": ["--model_path", "--method_name", "--testset_idx", "--etdump_path",
                                   "--dump_intermediate_outputs", "--debug_output_path", "--debug_buffer_size",
                                   "--output_folder_path", "--bundleio_rtol", "--bundleio_atol"],
                         "outputs": "output_0_<i>.raw", "exit_debug_buffer_overflow": 3},
}, indent=2))
PY
    mv "$dest.partial" "$dest"
    rm -rf "$build"
    echo "built in $((t1 - t0)) s" >&2
  fi
) 9>"$BUNDLERUN_CACHE/runners/.$key.lock" || exit $?
echo "$dest"
