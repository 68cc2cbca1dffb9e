#!/usr/bin/env bash
# Build ExecuTorch's executor_runner (BundleIO + ETDump) with ExecuTorch's own MLX delegate
# (backends/mlx/runtime) linked against the installed `mlx` wheel (libmlx.so, include/mlx,
# share/cmake/MLX) on Linux x86_64: the runtime `mlx://cpu` runs bundles on.
#
#   build_mlx_runner.sh [--executorch-src DIR] [--python PY] [--jobs 2] [--rebuild] [--dry-run]
#                       [--cached-only]   (print the cached folder or exit 3; never build)
#
# Sources: --executorch-src DIR (a checkout), else the tarballs of ../shared/third_party
# (firmware_scripts/lib/et_sources.sh). MLX: the `mlx` package importable by PY (default: the
# repo's .venv), which also gives flatc (the executorch wheel's) for the generated files.
# What is built, and why it is not `-DEXECUTORCH_BUILD_MLX=ON`: see inject.cmake. Steps:
#   1. a private symlink view of the sources (et_build_tree), where two small patches are applied
#      to copies of MLXBackend.cpp and MLXInterpreter.h (patches/*.patch: the Linux CPU device and
#      two mlx 0.32 signatures; each file says why), and the server-mode patch to a copy of
#      executor_runner.cpp (../android/patches/executor_runner-server-testset.patch: a trigger line
#      names the bundled test set, so an LLM sequence runs on one loaded method), never to the
#      shared tree;
#   2. the source's own backends/mlx/serialization/generate.py writes MLXLoader.{h,cpp} and
#      schema_generated.h from the source's schema.fbs (as backends/mlx/CMakeLists.txt does at
#      build time), with the wheel's flatc (24.3.25, the same version as third-party/flatbuffers);
#   3. ExecuTorch's top-level CMake with portable kernels, BundleIO, ETDump, logging, and the
#      delegate added by inject.cmake; target executor_runner;
#   4. the binary + the wheel's libmlx.so (mlx/lib/) and its bundled BLAS/LAPACK (mlx_cpu.libs/),
#      in the wheel's relative layout, into
#      ${BUNDLERUN_CACHE:-~/.cache/bundlerun}/runners/<key>/{executor_runner,runner.json}, where
#      <key> hashes the sources, flags, patches, compiler and libmlx.so. The last stdout line is that
#      folder; a second call with the same inputs prints it at once.
set -euo pipefail

HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
ET_SCRIPT_NAME="build_mlx_runner.sh"
# shellcheck source=../lib/et_sources.sh
source "$HERE/../lib/et_sources.sh"

ET_DIR=""
JOBS=2
REBUILD=0
CACHED_ONLY=0
DRY_RUN=0
PYTHON_BIN="${PYTHON:-}"

die() { echo "build_mlx_runner.sh: $*" >&2; exit 2; }
need_arg() { [ $# -ge 2 ] && [ -n "$2" ] && [[ "$2" != --* ]] || die "$1 needs a value (see --help)"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --executorch|--executorch-src) need_arg "$@"; ET_DIR="$2"; shift 2;;
    --executorch=*|--executorch-src=*) ET_DIR="${1#*=}"; shift;;
    --python) need_arg "$@"; PYTHON_BIN="$2"; shift 2;;
    --jobs) need_arg "$@"; JOBS="$2"; shift 2;;
    --rebuild) REBUILD=1; shift;;
    --cached-only) CACHED_ONLY=1; shift;;
    --dry-run) DRY_RUN=1; shift;;
    -h|--help) sed -n '2,26p' "$0"; exit 0;;
    *) die "unknown option $1 (see --help)";;
  esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer, not '$JOBS'"
[ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ] \
  || die "this builds the Linux x86_64 runner (host: $(uname -s) $(uname -m)); on a Mac use ExecuTorch's own mlx preset"

if [ -z "$PYTHON_BIN" ]; then
  if [ -x "$HERE/../../.venv/bin/python" ]; then PYTHON_BIN="$(cd "$HERE/../.." && pwd)/.venv/bin/python"; else PYTHON_BIN="python3"; fi
fi
command -v g++ >/dev/null || die "g++ not found: apt-get install g++"
command -v cmake >/dev/null || die "cmake not found: apt-get install cmake"
command -v ninja >/dev/null || die "ninja not found: apt-get install ninja-build"
command -v patch >/dev/null || die "patch not found: apt-get install patch"

# The mlx wheel: its folder, version, and the library's hash (the cache key follows the library).
MLX_INFO="$("$PYTHON_BIN" - <<'PY' 2>/dev/null
import importlib.metadata as md, os
import mlx
root = list(mlx.__path__)[0]
print(root)
print(md.version("mlx"))
try:
    print(md.version("mlx-cpu"))
except md.PackageNotFoundError:
    print("")
PY
)" || die "$PYTHON_BIN cannot import mlx: pip install 'mlx[cpu]' (bundlerun's [apple] extra)"
MLX_ROOT="$(sed -n 1p <<< "$MLX_INFO")"
MLX_VERSION="$(sed -n 2p <<< "$MLX_INFO")"
MLX_CPU_VERSION="$(sed -n 3p <<< "$MLX_INFO")"
MLX_LIB="$MLX_ROOT/lib/libmlx.so"
MLX_CMAKE_DIR="$MLX_ROOT/share/cmake/MLX"
MLX_LIBS_DIR="$(cd "$MLX_ROOT/.." && pwd)/mlx_cpu.libs"
[ -f "$MLX_LIB" ] || die "no $MLX_LIB: plain 'mlx' has no Linux library; pip install 'mlx[cpu]'"
[ -f "$MLX_CMAKE_DIR/MLXConfig.cmake" ] || die "no $MLX_CMAKE_DIR/MLXConfig.cmake in the mlx wheel"
[ -f "$MLX_ROOT/include/mlx/mlx.h" ] || die "no $MLX_ROOT/include/mlx/mlx.h in the mlx wheel"
MLX_SHA="$(sha256sum "$MLX_LIB" | cut -c1-64)"

ET="$(et_resolve_sources "$ET_DIR")"
FP="$(et_source_fingerprint "$ET")"
FLATC="$(et_wheel_flatc "$PYTHON_BIN")"
COMPILER="$(g++ --version | sed -n 1,1p)"
for f in runtime/MLXBackend.cpp runtime/MLXInterpreter.h serialization/generate.py serialization/schema.fbs \
         serialization/MLXLoader.h.tmpl serialization/MLXLoader.cpp.tmpl; do
  [ -f "$ET/backends/mlx/$f" ] || die "$ET has no backends/mlx/$f: an ExecuTorch without the MLX backend"
done

FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  "${ET_RUNNER_COMMON_FLAGS[@]}"
  -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=OFF
  -DEXECUTORCH_BUILD_KERNELS_OPTIMIZED=OFF
  -DEXECUTORCH_BUILD_XNNPACK=OFF
  -DEXECUTORCH_BUILD_PTHREADPOOL=OFF
  -DEXECUTORCH_BUILD_CPUINFO=OFF
  -DEXECUTORCH_BUILD_MLX=OFF
)
PATCHES=("$HERE"/patches/*.patch)
# The served runner keeps one loaded method across a sequence's cases (an LLM's KV cache): each
# stdin trigger names the bundled test set (the same patch as the aarch64 runner's; see
# firmware_scripts/android/README.md and targets/et_runner/server.py). Part of the cache key.
SERVER_PATCH="$HERE/../android/patches/executor_runner-server-testset.patch"
[ -f "$SERVER_PATCH" ] || die "missing $SERVER_PATCH"
KEY="$(et_cache_key mlx_executor_runner x86_64 "$FP" "${FLAGS[*]}" "$COMPILER" "mlx $MLX_VERSION $MLX_SHA" \
        "$HERE/inject.cmake" "$HERE/mlx_delegate.cmake" "${PATCHES[@]}" "$SERVER_PATCH")"
DEST="$BUNDLERUN_CACHE/runners/$KEY"
BUILD="$DEST.build"
et_ccache
ALL_FLAGS=("${FLAGS[@]}" ${ET_CCACHE_FLAGS[@]+"${ET_CCACHE_FLAGS[@]}"} -DCMAKE_PROJECT_executorch_INCLUDE="$HERE/inject.cmake"
           -DBUNDLERUN_MLX_CMAKE_DIR="$MLX_CMAKE_DIR" -DFLATC_EXECUTABLE="$FLATC" -DPYTHON_EXECUTABLE="$PYTHON_BIN")

if [ "$DRY_RUN" = 1 ]; then
  echo "# sources: a private symlink view of $ET in $BUILD/src (et_build_tree), patched with ${PATCHES[*]}"
  printf '%q ' "$PYTHON_BIN" "$BUILD/src/executorch/backends/mlx/serialization/generate.py" --flatc "$FLATC"; echo
  printf '%q ' cmake -S "$BUILD/src/executorch" -B "$BUILD/out" -G Ninja "${ALL_FLAGS[@]}"; echo
  printf '%q ' cmake --build "$BUILD/out" --target executor_runner -j "$JOBS"; echo
  echo "$DEST"
  exit 0
fi
if [ "$REBUILD" = 0 ] && [ -f "$DEST/runner.json" ] && [ -x "$DEST/executor_runner" ]; then
  echo "$DEST"
  exit 0
fi
if [ "$CACHED_ONLY" = 1 ]; then
  echo "build_mlx_runner.sh: no cached MLX executor_runner at $DEST" >&2
  exit 3
fi

# A private, patched copy of the two delegate files in the symlink view (never the shared tree).
prepare_tree() {
  local tree="$1" p f
  for f in backends/mlx/runtime/MLXBackend.cpp backends/mlx/runtime/MLXInterpreter.h \
           examples/portable/executor_runner/executor_runner.cpp; do
    cp --remove-destination "$(readlink -f "$tree/$f")" "$tree/$f"
    chmod u+w "$tree/$f"
  done
  for p in "${PATCHES[@]}"; do
    patch --batch --forward --silent -p1 -d "$tree" < "$p" \
      || die "$(basename "$p") does not apply to $ET (another ExecuTorch version?): update firmware_scripts/mlx/patches"
  done
  patch --batch --forward --silent -p1 -d "$tree" < "$SERVER_PATCH" \
    || die "$(basename "$SERVER_PATCH") does not apply to $ET's executor_runner.cpp"
  # the source's own generator, outputs into the private view (generate.py writes beside itself)
  (cd "$tree" && "$PYTHON_BIN" backends/mlx/serialization/generate.py --flatc "$FLATC") >&2 \
    || die "backends/mlx/serialization/generate.py failed"
  for f in MLXLoader.h MLXLoader.cpp schema_generated.h; do
    [ -f "$tree/backends/mlx/runtime/$f" ] || die "generate.py did not write backends/mlx/runtime/$f"
  done
}

mkdir -p "$BUNDLERUN_CACHE/runners"
LOCK="$BUNDLERUN_CACHE/runners/.$KEY.lock"
(
  flock 9
  if [ "$REBUILD" = 1 ] || [ ! -f "$DEST/runner.json" ]; then
    t0="$(date +%s)"
    tree="$BUILD/src/executorch"
    logf="$BUILD/build.log"
    if [ "$REBUILD" = 0 ] && [ -f "$BUILD/out/build.ninja" ] && [ -d "$tree" ]; then
      echo "resuming the interrupted build in $BUILD (--rebuild starts afresh)" >&2
      mv -f "$logf" "$logf.1" 2>/dev/null || true
    else
      rm -rf "$BUILD" "$DEST"
      mkdir -p "$BUILD"
      tree="$(et_build_tree "$ET" "$BUILD/src")"
      prepare_tree "$tree" 2>"$BUILD/prepare.log" || { cat "$BUILD/prepare.log" >&2; exit 2; }
    fi
    echo "building the MLX executor_runner into $DEST; log: $logf" >&2
    if ! { cmake -S "$tree" -B "$BUILD/out" -G Ninja "${ALL_FLAGS[@]}" \
           && cmake --build "$BUILD/out" --target executor_runner -j "$JOBS"; } >"$logf" 2>&1; then
      tail -n 30 "$logf" >&2
      die "build failed (full log: $logf)"
    fi
    [ -x "$BUILD/out/executor_runner" ] || die "build finished but $BUILD/out/executor_runner is missing"
    t1="$(date +%s)"
    rm -rf "$DEST.partial"
    mkdir -p "$DEST.partial/mlx/lib"
    cp "$BUILD/out/executor_runner" "$DEST.partial/executor_runner"
    cp "$MLX_LIB" "$DEST.partial/mlx/lib/libmlx.so"
    if [ -d "$MLX_LIBS_DIR" ]; then cp -r "$MLX_LIBS_DIR" "$DEST.partial/mlx_cpu.libs"; fi
    cp "$logf" "$DEST.partial/build.log"
    # the runner must start with only its own folder: a library it cannot find is a broken build
    probe="$("$DEST.partial/executor_runner" --model_path /nonexistent.pte 2>&1 || true)"
    if grep -q "error while loading shared libraries" <<< "$probe"; then
      die "the built runner does not start: $(grep -m1 'error while loading shared libraries' <<< "$probe")"
    fi
    BR_DEST="$DEST" BR_FP="$FP" BR_ET="$ET" BR_CV="$COMPILER" BR_SECS="$((t1 - t0))" BR_JOBS="$JOBS" \
    BR_MLX_VERSION="$MLX_VERSION" BR_MLX_CPU_VERSION="$MLX_CPU_VERSION" BR_MLX_SHA="$MLX_SHA" BR_MLX_ROOT="$MLX_ROOT" \
    BR_PATCHES="$(for p in "${PATCHES[@]}" "$SERVER_PATCH"; do basename "$p"; done)" BR_SCHEMA="$(sha256sum "$ET/backends/mlx/serialization/schema.fbs" | cut -c1-16)" \
      "$PYTHON_BIN" - "${FLAGS[@]}" > "$DEST.partial/runner.json" <<'PY'
import json, os, sys, time
e = os.environ
print(json.dumps({
    "kind": "mlx_executor_runner",
    "arch": "x86_64",
    "binary": os.path.join(e["BR_DEST"], "executor_runner"),
    "static": False,
    "flags": sys.argv[1:],
    "kernels": ["portable"],
    "backends": ["mlx"],
    "bundle_io": True,
    "etdump": True,
    "mlx": {"version": e["BR_MLX_VERSION"], "mlx_cpu": e["BR_MLX_CPU_VERSION"] or None,
            "libmlx_sha256": e["BR_MLX_SHA"], "from": e["BR_MLX_ROOT"],
            "library": os.path.join(e["BR_DEST"], "mlx", "lib", "libmlx.so")},
    "patches": [p for p in e["BR_PATCHES"].splitlines() if p],
    "server_testset": True,
    "schema_fbs_sha256": e["BR_SCHEMA"],
    "sources": {"path": e["BR_ET"], "fingerprint": e["BR_FP"]},
    "toolchain": {"compiler": e["BR_CV"]},
    "build_seconds": int(e["BR_SECS"]),
    "jobs": int(e["BR_JOBS"]),
    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
}, indent=2))
PY
    mv "$DEST.partial" "$DEST"
    rm -rf "$BUILD"
    echo "built in $((t1 - t0)) s" >&2
  fi
) 9>"$LOCK" || exit $?
echo "$DEST"
