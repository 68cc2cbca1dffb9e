#!/usr/bin/env bash
# Build ExecuTorch's portable executor_runner with BundleIO, the runner bundlerun's
# `executor-runner` profile drives over adb (and the qemu-user://aarch64 target runs locally).
#
# Two toolchains:
#
#   --toolchain ndk (default): Android arm64-v8a with the Android NDK, into a build folder.
#     build_executor_runner.sh --executorch DIR [--backends xnnpack,vulkan,qnn]
#                              [--ndk DIR] [--platform android-30] [--build-dir DIR]
#                              [--build-type Release] [--etdump] [--jobs N] [--dry-run]
#     Needs an ExecuTorch checkout (submodules initialised), the NDK ($ANDROID_NDK_ROOT /
#     $ANDROID_NDK or --ndk), CMake >= 3.24. QNN additionally needs $QNN_SDK_ROOT.
#     Logs go to stderr (-DEXECUTORCH_PAL_DEFAULT=posix) so adb shell captures them.
#     Prints BUILD_DIR/executor_runner last. Point bundlerun at it:
#       [targets.adb] runner = "BUILD_DIR/executor_runner"
#
#   --toolchain gnu: Linux with Debian's gcc (aarch64-linux-gnu-g++ cross, or the host g++
#     for --arch x86_64), a static binary, cached content-addressed:
#     build_executor_runner.sh --toolchain gnu [--arch aarch64|x86_64] [--executorch-src DIR]
#                              [--backends portable|xnnpack|vulkan] [--jobs 2] [--rebuild] [--dry-run]
#                              [--cached-only]   (print the cached folder or exit 3; never build)
#     Sources: --executorch-src DIR (a checkout), else the tarballs of ../shared/third_party
#     (firmware_scripts/lib/et_sources.sh). Kernels: portable + quantized (quantized_decomposed).
#     BundleIO, ETDump (event tracer) and logging on. aarch64 default: + XNNPACK with KleidiAI (cpuinfo,
#     pthreadpool, FP16 from the tarballs; no SME/SME2 kernels), --backends portable for none. Optimized
#     kernels are off (the eigen submodule is not in the tarball set). One build tree makes both the
#     executor_runner and the debug runner (each cached under its own key).
#     Output: ${BUNDLERUN_CACHE:-~/.cache/bundlerun}/runners/<key>/{executor_runner,runner.json};
#     the last stdout line is that folder. A second call with the same inputs prints it at once.
#     --backends vulkan (x86_64 only) links the Vulkan delegate dynamically against libvulkan.
#
#   --debug-runner (either toolchain): build bundlerun's debug runner (debug_runner/debug_runner.cpp)
#     instead of the executor_runner: the same ExecuTorch configure, the same libraries, one more
#     target (bundlerun_debug_runner) added to ExecuTorch's own build by debug_runner/inject.cmake.
#     It runs one bundled test case (--testset_idx) with ETDump + a debug buffer and writes every
#     intermediate output, for `bundlerun debug --target qemu-user://... | adb://...`. gnu: cached as
#     runners/<key>/{debug_runner,runner.json} (kind "debug_runner"); ndk: BUILD_DIR/bundlerun_debug_runner
#     (the event tracer is switched on), pointed at with [targets.adb] debug_runner = PATH.
set -euo pipefail

HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
ET_SCRIPT_NAME="build_executor_runner.sh"

TOOLCHAIN_KIND="ndk"
ET_DIR=""
BACKENDS=""
NDK="${ANDROID_NDK_ROOT:-${ANDROID_NDK:-}}"
PLATFORM="android-30"
BUILD_DIR=""
BUILD_TYPE="Release"
ETDUMP="OFF"
JOBS=""
DRY_RUN=0
ARCH="aarch64"
REBUILD=0
CACHED_ONLY=0
PYTHON_BIN="${PYTHON:-}"
DEBUG_RUNNER=0

die() { echo "build_executor_runner.sh: $*" >&2; exit 2; }
run() { if [ "$DRY_RUN" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi; }
need_arg() { [ $# -ge 2 ] && [ -n "$2" ] && [[ "$2" != --* ]] || die "$1 needs a value (see --help)"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --toolchain) need_arg "$@"; TOOLCHAIN_KIND="$2"; shift 2;;
    --toolchain=*) TOOLCHAIN_KIND="${1#*=}"; shift;;
    --executorch|--executorch-src) need_arg "$@"; ET_DIR="$2"; shift 2;;
    --executorch=*|--executorch-src=*) ET_DIR="${1#*=}"; shift;;
    --backends) need_arg "$@"; BACKENDS="$2"; shift 2;;
    --backends=*) BACKENDS="${1#*=}"; shift;;
    --ndk) need_arg "$@"; NDK="$2"; shift 2;;
    --ndk=*) NDK="${1#*=}"; shift;;
    --platform) need_arg "$@"; PLATFORM="$2"; shift 2;;
    --build-dir) need_arg "$@"; BUILD_DIR="$2"; shift 2;;
    --build-type) need_arg "$@"; BUILD_TYPE="$2"; shift 2;;
    --etdump) ETDUMP="ON"; shift;;
    --jobs) need_arg "$@"; JOBS="$2"; shift 2;;
    --arch) need_arg "$@"; ARCH="$2"; shift 2;;
    --arch=*) ARCH="${1#*=}"; shift;;
    --python) need_arg "$@"; PYTHON_BIN="$2"; shift 2;;
    --rebuild) REBUILD=1; shift;;
    --cached-only) CACHED_ONLY=1; shift;;
    --debug-runner) DEBUG_RUNNER=1; shift;;
    --dry-run) DRY_RUN=1; shift;;
    -h|--help) sed -n '2,38p' "$0"; exit 0;;
    *) die "unknown option $1 (see --help)";;
  esac
done
[[ -z "$JOBS" || "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer, not '$JOBS'"

# ----------------------------------------------------------------------------------------------
# gnu: Debian gcc, static, content-addressed cache
# ----------------------------------------------------------------------------------------------
build_gnu() {
  # shellcheck source=../lib/et_sources.sh
  source "$HERE/../lib/et_sources.sh"
  local vulkan=OFF xnnpack=OFF b default_backends=portable
  [ "$ARCH" != aarch64 ] || default_backends=xnnpack  # aarch64: the Android lane's CPU delegate
  IFS=',' read -r -a _backends <<< "${BACKENDS:-$default_backends}"
  for b in "${_backends[@]}"; do
    case "$b" in
      portable|"") ;;
      vulkan) vulkan=ON;;
      xnnpack) xnnpack=ON;;
      qnn) die "qnn needs the Android NDK and QNN SDK: use --toolchain ndk or build_qnn_executor_runner.sh";;
      *) die "unknown backend '$b' for --toolchain gnu (portable, xnnpack, vulkan)";;
    esac
  done
  local cc cxx tcfile=""
  case "$ARCH" in
    aarch64)
      cc=aarch64-linux-gnu-gcc; cxx=aarch64-linux-gnu-g++
      tcfile="$HERE/toolchains/aarch64-linux-gnu.cmake"
      [ "$vulkan" = OFF ] || die "--backends vulkan is built for --arch x86_64 only (lavapipe runs on the host)";;
    x86_64)
      [ "$(uname -m)" = x86_64 ] || die "--arch x86_64 is the host build; this host is $(uname -m)"
      cc=gcc; cxx=g++;;
    *) die "unknown --arch '$ARCH' (aarch64, x86_64)";;
  esac
  if [ "$DRY_RUN" = 0 ]; then
    command -v "$cxx" >/dev/null || die "$cxx not found: apt-get install g++-aarch64-linux-gnu gcc-aarch64-linux-gnu (or g++ for x86_64)"
    command -v cmake >/dev/null || die "cmake not found: apt-get install cmake"
    command -v ninja >/dev/null || die "ninja not found: apt-get install ninja-build"
  fi

  if [ -z "$PYTHON_BIN" ]; then
    if [ -x "$HERE/../../.venv/bin/python" ]; then PYTHON_BIN="$(cd "$HERE/../.." && pwd)/.venv/bin/python"; else PYTHON_BIN="python3"; fi
  fi
  local et fp flatc compiler_version
  et="$(et_resolve_sources "$ET_DIR")"
  fp="$(et_source_fingerprint "$et")"
  flatc="$(et_wheel_flatc "$PYTHON_BIN")"
  local kleidiai="" kai_fix=""
  if [ "$xnnpack" = ON ]; then
    local dep
    for dep in XNNPACK cpuinfo pthreadpool FP16 FXdiv; do
      [ "$DRY_RUN" = 1 ] || [ -f "$et/backends/xnnpack/third-party/$dep/CMakeLists.txt" ] \
        || die "xnnpack: $et/backends/xnnpack/third-party/$dep is missing (a checkout needs its submodules: git submodule update --init --recursive; the tarball set needs $dep.tar.xz)"
    done
    kleidiai="$(et_kleidiai_dir "$et")"
    kai_fix="$HERE/toolchains/kleidiai-gcc12.cmake"  # GCC 12 vectorizer ICE on KleidiAI's bf16 kernels
  fi
  if command -v "$cxx" >/dev/null; then compiler_version="$("$cxx" --version | sed -n 1,1p)"; else compiler_version="$cxx (not installed)"; fi

  local flags=(
    -DCMAKE_BUILD_TYPE="$BUILD_TYPE"
    "${ET_RUNNER_COMMON_FLAGS[@]}"
    -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON
    -DEXECUTORCH_BUILD_KERNELS_OPTIMIZED=OFF
    -DEXECUTORCH_BUILD_XNNPACK="$xnnpack"
    -DEXECUTORCH_BUILD_PTHREADPOOL="$xnnpack"
    -DEXECUTORCH_BUILD_CPUINFO="$xnnpack"
    -DEXECUTORCH_BUILD_VULKAN="$vulkan"
  )
  if [ "$xnnpack" = ON ]; then
    # As ExecuTorch's Android builds (tools/cmake/preset/android.cmake; KleidiAI is default.cmake's
    # EXECUTORCH_XNNPACK_ENABLE_KLEIDI=ON), for the one CPU emulated here: qemu-aarch64's default
    # (= -cpu max) in QEMU 7.2 has NEON, dotprod, fp16 arithmetic, i8mm, bf16 and SME *1* only, so
    # XNNPACK's SME/SME2 kernels are left out (no SME2 to run them on; SME1-only phones are rare).
    # XNNPACK builds no tests/benchmarks and no non-production kernels under ExecuTorch
    # (backends/xnnpack/cmake/Dependencies.cmake), and only arm64 kernels for an arm64 target.
    flags+=(-DEXECUTORCH_XNNPACK_ENABLE_KLEIDI=ON -DEXECUTORCH_XNNPACK_ENABLE_WEIGHT_CACHE=ON
            -DEXECUTORCH_XNNPACK_SHARED_WORKSPACE=ON -DXNNPACK_ENABLE_ARM_SME=OFF -DXNNPACK_ENABLE_ARM_SME2=OFF)
  fi
  # aarch64 (the qemu-user / adb lane, which runs ExecuTorch's llama exports): ExecuTorch's LLM custom-op
  # kernels linked in (llm_ops/llm_ops.cmake says which and why not EXECUTORCH_BUILD_KERNELS_LLM), and the
  # server-mode patch (a trigger line names the bundled test set: one loaded method, its KV cache kept,
  # across a sequence's cases of any input shape). Their files count in the cache key.
  local llm=OFF llm_files=()
  if [ "$ARCH" = aarch64 ]; then
    llm=ON
    llm_files=("$HERE/llm_ops/llm_ops.cmake" "$HERE/llm_ops/shim/torchao/csrc/cpu/torch_free_kernels/interface/quantized_matmul.h"
               "$HERE/patches/executor_runner-server-testset.patch")
    flags+=(-DBUNDLERUN_LLM_OPS=ON)
  fi
  if [ "$vulkan" = OFF ]; then
    flags+=(-DCMAKE_EXE_LINKER_FLAGS=-static)
    # XNNPACK's CMakeLists.txt find_library(LIBM m)s the shared libm.so, which a static link refuses
    # ("attempted static link of dynamic object libm.so"): give it the compiler's own libm.a
    [ "$xnnpack" = OFF ] || flags+=(-DLIBM="$(realpath -m "$("$cc" -print-file-name=libm.a 2>/dev/null || echo libm.a)")")
  fi
  # The toolchain file and the debug runner's sources count by content (a checkout elsewhere must
  # hit the same cache entry); the executor_runner's key is unchanged by the debug runner's files.
  # One configure and one build tree make both products (they link the same libraries): a cold call
  # builds both and caches each under its own key; a debug-runner edit rebuilds only the debug runner.
  local key_er key_dr key lock kind="executor_runner" target="executor_runner" product="executor_runner"
  key_er="$(et_cache_key executor_runner "$ARCH" "$fp" "${flags[*]}" "$compiler_version" ${tcfile:+"$tcfile"} ${kai_fix:+"$kai_fix"} \
            ${llm_files[@]+"${llm_files[@]}"})"
  key_dr="$(et_cache_key debug_runner "$ARCH" "$fp" "${flags[*]}" "$compiler_version" ${tcfile:+"$tcfile"} ${kai_fix:+"$kai_fix"} \
            "$HERE/debug_runner/inject.cmake" "$HERE/debug_runner/debug_runner.cmake" "$HERE/debug_runner/debug_runner.cpp" \
            ${llm_files[@]+"${llm_files[@]}"})"
  key="$key_er"
  [ "$DEBUG_RUNNER" = 0 ] || { kind="debug_runner"; target="bundlerun_debug_runner"; product="debug_runner"; key="$key_dr"; }
  [ -z "$tcfile" ] || flags=(-DCMAKE_TOOLCHAIN_FILE="$tcfile" "${flags[@]}")
  flags+=(-DCMAKE_PROJECT_executorch_INCLUDE="$HERE/debug_runner/inject.cmake")
  local dest="$BUNDLERUN_CACHE/runners/$key"
  et_ccache
  local all_flags=("${flags[@]}" ${ET_CCACHE_FLAGS[@]+"${ET_CCACHE_FLAGS[@]}"} -DFLATC_EXECUTABLE="$flatc" -DPYTHON_EXECUTABLE="$PYTHON_BIN" -DPython_EXECUTABLE="$PYTHON_BIN")
  [ -z "$kleidiai" ] || all_flags+=(-DKLEIDIAI_SOURCE_DIR="$kleidiai")
  [ -z "$kai_fix" ] || all_flags+=(-DCMAKE_PROJECT_KleidiAI_INCLUDE="$kai_fix")
  local build="$BUNDLERUN_CACHE/runners/$key_er.build"

  if [ "$DRY_RUN" = 1 ]; then
    echo "# sources: a private symlink view of $et in $build/src (et_build_tree)"
    run cmake -S "$build/src/executorch" -B "$build/out" -G Ninja "${all_flags[@]}"
    local other=executor_runner; [ "$kind" = debug_runner ] || other=debug_runner
    run cmake --build "$build/out" --target "$(gnu_target_of "$kind")" "$(gnu_target_of "$other")" -j "${JOBS:-2}"
    echo "$dest"
    return 0
  fi
  if [ "$REBUILD" = 0 ] && [ -f "$dest/runner.json" ] && [ -x "$dest/$product" ]; then
    echo "$dest"
    return 0
  fi
  if [ "$CACHED_ONLY" = 1 ]; then
    echo "build_executor_runner.sh: no cached $product for $ARCH at $dest" >&2
    exit 3
  fi
  mkdir -p "$BUNDLERUN_CACHE/runners"
  lock="$BUNDLERUN_CACHE/runners/.$key_er.lock"  # the build tree's
  (
    flock 9
    # what this build makes: the product asked for, and the other one while it is not cached
    local products=() p
    [ "$REBUILD" = 0 ] && [ -f "$dest/runner.json" ] || products+=("$kind")
    if [ "$kind" = executor_runner ]; then p=debug_runner; else p=executor_runner; fi
    [ -f "$BUNDLERUN_CACHE/runners/$(gnu_key_of "$p")/runner.json" ] || products+=("$p")
    if [ "${#products[@]}" -gt 0 ] && { [ "$REBUILD" = 1 ] || [ ! -f "$dest/runner.json" ]; }; then
      local t0 t1 logf targets=()
      for p in "${products[@]}"; do targets+=("$(gnu_target_of "$p")"); done
      t0="$(date +%s)"
      local tree="$build/src/executorch"
      logf="$build/build.log"
      if [ "$REBUILD" = 0 ] && [ -f "$build/out/build.ninja" ] && [ -d "$tree" ]; then
        echo "resuming the interrupted build in $build (--rebuild starts afresh)" >&2
        mv -f "$logf" "$logf.1" 2>/dev/null || true
      else
        rm -rf "$build" "$dest"
        mkdir -p "$build"
        tree="$(et_build_tree "$et" "$build/src")"  # flatcc writes into its source folder
        [ "$llm" = OFF ] || gnu_patch "$tree" "$HERE/patches/executor_runner-server-testset.patch" \
          examples/portable/executor_runner/executor_runner.cpp
      fi
      echo "building ${products[*]} ($ARCH) in $build; log: $logf" >&2
      if ! { cmake -S "$tree" -B "$build/out" -G Ninja "${all_flags[@]}" \
             && cmake --build "$build/out" --target "${targets[@]}" -j "${JOBS:-2}"; } >"$logf" 2>&1; then
        tail -n 30 "$logf" >&2
        die "build failed (full log: $logf)"
      fi
      t1="$(date +%s)"
      for p in "${products[@]}"; do
        gnu_publish "$p" "$BUNDLERUN_CACHE/runners/$(gnu_key_of "$p")" "$build/out/$(gnu_target_of "$p")" "$logf" "$((t1 - t0))"
      done
      rm -rf "$build"
      echo "built in $((t1 - t0)) s" >&2
    fi
  ) 9>"$lock" || exit $?
  echo "$dest"
}

# Apply patch $2 to file $3 of the private source view $1 (its files are links into the shared tree:
# the one patched becomes a copy first, so the shared tree is never changed).
gnu_patch() {
  local file="$1/$3"
  cp --remove-destination "$(readlink -f "$file")" "$file"
  patch --quiet --forward -p1 -d "$1" < "$2" >&2 || die "patch $2 does not apply to $3 of these sources"
}

gnu_key_of() { if [ "$1" = debug_runner ]; then echo "$key_dr"; else echo "$key_er"; fi; }
gnu_target_of() { if [ "$1" = debug_runner ]; then echo bundlerun_debug_runner; else echo executor_runner; fi; }

# Cache one built product: $1 kind (= its file name), $2 cache folder, $3 the built binary, $4 build
# log, $5 seconds. Uses build_gnu's locals (bash functions see their caller's).
gnu_publish() {
  local kind="$1" to="$2" bin="$3" backends=""
  [ -x "$bin" ] || die "build finished but $bin is missing"
  rm -rf "$to.partial"
  mkdir -p "$to.partial"
  cp "$bin" "$to.partial/$kind"
  cp "$4" "$to.partial/build.log"
  [ "$vulkan" = OFF ] || backends="vulkan"
  [ "$xnnpack" = OFF ] || backends="${backends:+$backends,}xnnpack"
  BR_DEST="$to" BR_ARCH="$ARCH" BR_FP="$fp" BR_ET="$et" BR_CV="$compiler_version" BR_TC="$tcfile" \
  BR_SECS="$5" BR_VULKAN="$vulkan" BR_JOBS="${JOBS:-2}" BR_KIND="$kind" BR_PRODUCT="$kind" \
  BR_BACKENDS="$backends" BR_KLEIDIAI="$kleidiai" BR_LLM="$llm" \
    "$PYTHON_BIN" - "${flags[@]}" > "$to.partial/runner.json" <<'PY'
import json, os, sys, time
e = os.environ
extra = {}
if "xnnpack" in e["BR_BACKENDS"].split(","):  # what the XNNPACK delegate was built with (see the flags)
    extra["xnnpack"] = {"kleidiai": True, "kleidiai_source": e["BR_KLEIDIAI"] or "downloaded by XNNPACK's CMake",
                        "arm_sme": False, "arm_sme2": False, "threadpool": "pthreadpool (--cpu_threads)"}
llm = e["BR_LLM"] == "ON"
if llm:  # llm_ops/llm_ops.cmake; the patch: patches/
    extra["llm_ops"] = ["llama::custom_sdpa.out", "llama::sdpa_with_kv_cache.out", "llama::update_cache.out",
                        "llama::update_cache_with_indices.out", "llama::fallback.out",
                        "llama::fast_hadamard_transform.out"]
    extra["llm_ops_missing"] = {"llama::custom_quantized_sdpa.out": "aborts: torchao is not in the source set",
                                "llama::quantized_moe_ffn": "not built (op_moe.cpp needs torchao)"}
    extra["patches"] = ["executor_runner-server-testset"]
    extra["server_testset"] = True
if e["BR_KIND"] == "debug_runner":  # its command line (firmware_scripts/android/README.md)
    extra["cli"] = {"flags": ["--model_path", "--method_name", "--testset_idx", "--prefix_testset_idx", "--etdump_path",
                              "--dump_intermediate_outputs", "--debug_output_path", "--debug_buffer_size",
                              "--output_folder_path", "--bundleio_rtol", "--bundleio_atol"],
                    "outputs": "output_0_<i>.raw", "exit_debug_buffer_overflow": 3}
print(json.dumps({
    "kind": e["BR_KIND"],
    "arch": e["BR_ARCH"],
    "binary": os.path.join(e["BR_DEST"], e["BR_PRODUCT"]),
    "static": e["BR_VULKAN"] == "OFF",
    "flags": sys.argv[1:],
    "kernels": ["portable", "quantized"] + (["llm"] if llm else []),
    "backends": [b for b in e["BR_BACKENDS"].split(",") if b],
    "bundle_io": True,
    "etdump": True,
    "sources": {"path": e["BR_ET"], "fingerprint": e["BR_FP"]},
    "toolchain": {"compiler": e["BR_CV"], "file": e["BR_TC"] or None},
    "build_seconds": int(e["BR_SECS"]),
    "jobs": int(e["BR_JOBS"]),
    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    **extra,
}, indent=2))
PY
  rm -rf "$to"
  mv "$to.partial" "$to"
}

case "$TOOLCHAIN_KIND" in
  gnu|host) [ "$TOOLCHAIN_KIND" = gnu ] || ARCH="x86_64"; build_gnu; exit 0;;
  ndk) ;;
  *) die "unknown --toolchain '$TOOLCHAIN_KIND' (ndk, gnu, host)";;
esac

# ----------------------------------------------------------------------------------------------
# ndk: Android NDK (unchanged contract)
# ----------------------------------------------------------------------------------------------
BACKENDS="${BACKENDS:-xnnpack}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
[ -n "$ET_DIR" ] || die "--executorch DIR (an ExecuTorch checkout) is required"
[ -f "$ET_DIR/CMakeLists.txt" ] || die "$ET_DIR is not an ExecuTorch checkout (no CMakeLists.txt)"
[ -n "$NDK" ] || die "the Android NDK is needed: set ANDROID_NDK_ROOT or pass --ndk DIR"
TOOLCHAIN="$NDK/build/cmake/android.toolchain.cmake"
[ "$DRY_RUN" = 1 ] || [ -f "$TOOLCHAIN" ] || die "no NDK toolchain file at $TOOLCHAIN"
BUILD_DIR="${BUILD_DIR:-$ET_DIR/cmake-out-android-bundlerun}"

XNNPACK=OFF; VULKAN=OFF; QNN=OFF
NDK_TARGET=executor_runner
IFS=',' read -r -a _backends <<< "$BACKENDS"
for b in "${_backends[@]}"; do
  case "$b" in
    xnnpack) XNNPACK=ON;;
    vulkan) VULKAN=ON;;
    qnn) QNN=ON;;
    portable|"") ;;
    *) die "unknown backend '$b' (xnnpack, vulkan, qnn, portable)";;
  esac
done

EXTRA=()
if [ "$DEBUG_RUNNER" = 1 ]; then  # the debug runner needs the event tracer (ETDump + debug buffer)
  ETDUMP=ON
  NDK_TARGET=bundlerun_debug_runner
  EXTRA+=("-DCMAKE_PROJECT_executorch_INCLUDE=$HERE/debug_runner/inject.cmake")
fi
if [ "$QNN" = ON ]; then
  [ -n "${QNN_SDK_ROOT:-}" ] || die "the qnn backend needs QNN_SDK_ROOT (Qualcomm AI Engine Direct SDK)"
  EXTRA+=("-DQNN_SDK_ROOT=$QNN_SDK_ROOT")
fi

run cmake -S "$ET_DIR" -B "$BUILD_DIR" \
  -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
  -DANDROID_ABI=arm64-v8a \
  -DANDROID_PLATFORM="$PLATFORM" \
  -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
  -DEXECUTORCH_PAL_DEFAULT=posix \
  -DEXECUTORCH_ENABLE_LOGGING=ON \
  -DEXECUTORCH_BUILD_EXECUTOR_RUNNER=ON \
  -DEXECUTORCH_BUILD_EXTENSION_EVALUE_UTIL=ON \
  -DEXECUTORCH_BUILD_EXTENSION_RUNNER_UTIL=ON \
  -DEXECUTORCH_BUILD_EXTENSION_DATA_LOADER=ON \
  -DEXECUTORCH_BUILD_EXTENSION_FLAT_TENSOR=ON \
  -DEXECUTORCH_BUILD_DEVTOOLS=ON \
  -DEXECUTORCH_ENABLE_BUNDLE_IO=ON \
  -DEXECUTORCH_ENABLE_EVENT_TRACER="$ETDUMP" \
  -DEXECUTORCH_BUILD_XNNPACK="$XNNPACK" \
  -DEXECUTORCH_BUILD_VULKAN="$VULKAN" \
  -DEXECUTORCH_BUILD_QNN="$QNN" \
  -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON \
  "${EXTRA[@]}"
run cmake --build "$BUILD_DIR" --target "$NDK_TARGET" -j "$JOBS"

RUNNER="$BUILD_DIR/$NDK_TARGET"
if [ "$DRY_RUN" = 0 ]; then
  [ -x "$RUNNER" ] || die "build finished but $RUNNER is missing"
  if [ "$QNN" = ON ]; then
    echo "QNN: also push libqnn_executorch_backend.so from $BUILD_DIR/backends/qualcomm/ ([targets.adb] libraries)" >&2
  fi
fi
echo "$RUNNER"
