#!/usr/bin/env bash
# Build ExecuTorch's portable executor_runner for Android (arm64-v8a) with BundleIO,
# the runner bundlerun's `executor-runner` profile drives over adb.
#
#   build_executor_runner.sh --executorch DIR [--backends xnnpack,vulkan,qnn]
#                            [--ndk DIR] [--platform android-30] [--build-dir DIR]
#                            [--build-type Release] [--etdump] [--jobs N] [--dry-run]
#
# Needs: an ExecuTorch checkout (submodules initialised), the Android NDK
# ($ANDROID_NDK_ROOT / $ANDROID_NDK or --ndk), CMake >= 3.24, a host Python with
# ExecuTorch's build requirements. QNN additionally needs $QNN_SDK_ROOT.
# Logs go to stderr (-DEXECUTORCH_PAL_DEFAULT=posix) so adb shell captures them.
# Output: BUILD_DIR/executor_runner (prints its path last). Point bundlerun at it:
#   [targets.adb] runner = "BUILD_DIR/executor_runner"
set -euo pipefail

ET_DIR=""
BACKENDS="xnnpack"
NDK="${ANDROID_NDK_ROOT:-${ANDROID_NDK:-}}"
PLATFORM="android-30"
BUILD_DIR=""
BUILD_TYPE="Release"
ETDUMP="OFF"
JOBS="$(nproc 2>/dev/null || echo 4)"
DRY_RUN=0

die() { echo "build_executor_runner.sh: $*" >&2; exit 2; }
run() { if [ "$DRY_RUN" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi; }

while [ $# -gt 0 ]; do
  case "$1" in
    --executorch) ET_DIR="$2"; shift 2;;
    --executorch=*) ET_DIR="${1#*=}"; shift;;
    --backends) BACKENDS="$2"; shift 2;;
    --backends=*) BACKENDS="${1#*=}"; shift;;
    --ndk) NDK="$2"; shift 2;;
    --ndk=*) NDK="${1#*=}"; shift;;
    --platform) PLATFORM="$2"; shift 2;;
    --build-dir) BUILD_DIR="$2"; shift 2;;
    --build-type) BUILD_TYPE="$2"; shift 2;;
    --etdump) ETDUMP="ON"; shift;;
    --jobs) JOBS="$2"; shift 2;;
    --dry-run) DRY_RUN=1; shift;;
    -h|--help) sed -n '2,16p' "$0"; exit 0;;
    *) die "unknown option $1 (see --help)";;
  esac
done

[ -n "$ET_DIR" ] || die "--executorch DIR (an ExecuTorch checkout) is required"
[ -f "$ET_DIR/CMakeLists.txt" ] || die "$ET_DIR is not an ExecuTorch checkout (no CMakeLists.txt)"
[ -n "$NDK" ] || die "the Android NDK is needed: set ANDROID_NDK_ROOT or pass --ndk DIR"
TOOLCHAIN="$NDK/build/cmake/android.toolchain.cmake"
[ "$DRY_RUN" = 1 ] || [ -f "$TOOLCHAIN" ] || die "no NDK toolchain file at $TOOLCHAIN"
BUILD_DIR="${BUILD_DIR:-$ET_DIR/cmake-out-android-bundlerun}"

XNNPACK=OFF; VULKAN=OFF; QNN=OFF
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
run cmake --build "$BUILD_DIR" --target executor_runner -j "$JOBS"

RUNNER="$BUILD_DIR/executor_runner"
if [ "$DRY_RUN" = 0 ]; then
  [ -x "$RUNNER" ] || die "build finished but $RUNNER is missing"
  if [ "$QNN" = ON ]; then
    echo "QNN: also push libqnn_executorch_backend.so from $BUILD_DIR/backends/qualcomm/ ([targets.adb] libraries)" >&2
  fi
fi
echo "$RUNNER"
