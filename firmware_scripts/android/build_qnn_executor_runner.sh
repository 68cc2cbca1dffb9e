#!/usr/bin/env bash
# Build ExecuTorch's qnn_executor_runner for Android (arm64-v8a), the runner of
# bundlerun's `qnn-executor-runner` profile (plain .pte + input_list.txt).
# Mirrors backends/qualcomm/scripts/build.sh (aarch64 half): install the runtime
# with the QNN backend, then build examples/qualcomm against it.
#
#   build_qnn_executor_runner.sh --executorch DIR [--ndk DIR] [--build-dir DIR]
#                                [--build-type Release] [--jobs N] [--dry-run]
#
# Needs $QNN_SDK_ROOT (Qualcomm AI Engine Direct SDK) and the Android NDK.
# Output (printed last): the runner and libqnn_executorch_backend.so. Then:
#   [targets.adb] profile = "qnn-executor-runner"
#                 runner = ".../qnn_executor_runner"
#                 qnn_backend_lib = ".../libqnn_executorch_backend.so"
#                 htp_arch = "75"   # or soc_model = "SM8650"
set -euo pipefail

ET_DIR=""
NDK="${ANDROID_NDK_ROOT:-${ANDROID_NDK:-}}"
PLATFORM="android-30"
BUILD_DIR=""
BUILD_TYPE="Release"
JOBS="$(nproc 2>/dev/null || echo 4)"
DRY_RUN=0

die() { echo "build_qnn_executor_runner.sh: $*" >&2; exit 2; }
run() { if [ "$DRY_RUN" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi; }

while [ $# -gt 0 ]; do
  case "$1" in
    --executorch) ET_DIR="$2"; shift 2;;
    --executorch=*) ET_DIR="${1#*=}"; shift;;
    --ndk) NDK="$2"; shift 2;;
    --platform) PLATFORM="$2"; shift 2;;
    --build-dir) BUILD_DIR="$2"; shift 2;;
    --build-type) BUILD_TYPE="$2"; shift 2;;
    --jobs) JOBS="$2"; shift 2;;
    --dry-run) DRY_RUN=1; shift;;
    -h|--help) sed -n '2,17p' "$0"; exit 0;;
    *) die "unknown option $1 (see --help)";;
  esac
done

[ -n "$ET_DIR" ] || die "--executorch DIR (an ExecuTorch checkout) is required"
[ -f "$ET_DIR/CMakeLists.txt" ] || die "$ET_DIR is not an ExecuTorch checkout (no CMakeLists.txt)"
[ -n "${QNN_SDK_ROOT:-}" ] || die "QNN_SDK_ROOT is not set (Qualcomm AI Engine Direct SDK folder)"
[ -n "$NDK" ] || die "the Android NDK is needed: set ANDROID_NDK_ROOT or pass --ndk DIR"
TOOLCHAIN="$NDK/build/cmake/android.toolchain.cmake"
[ "$DRY_RUN" = 1 ] || [ -f "$TOOLCHAIN" ] || die "no NDK toolchain file at $TOOLCHAIN"
BUILD_DIR="${BUILD_DIR:-$ET_DIR/build-android-bundlerun}"
EXAMPLE_DIR="$BUILD_DIR/examples-qualcomm"
PY="${PYTHON_EXECUTABLE:-python3}"

run cmake -S "$ET_DIR" -B "$BUILD_DIR" \
  -DCMAKE_INSTALL_PREFIX="$BUILD_DIR" \
  -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
  -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
  -DANDROID_ABI=arm64-v8a \
  -DANDROID_PLATFORM="$PLATFORM" \
  -DEXECUTORCH_BUILD_QNN=ON \
  -DQNN_SDK_ROOT="$QNN_SDK_ROOT" \
  -DEXECUTORCH_BUILD_DEVTOOLS=ON \
  -DEXECUTORCH_BUILD_EXTENSION_MODULE=ON \
  -DEXECUTORCH_BUILD_EXTENSION_DATA_LOADER=ON \
  -DEXECUTORCH_BUILD_EXTENSION_FLAT_TENSOR=ON \
  -DEXECUTORCH_BUILD_EXTENSION_TENSOR=ON \
  -DEXECUTORCH_BUILD_EXTENSION_LLM=ON \
  -DEXECUTORCH_BUILD_EXTENSION_LLM_RUNNER=ON \
  -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON \
  -DEXECUTORCH_ENABLE_EVENT_TRACER=ON \
  -DEXECUTORCH_ENABLE_LOGGING=ON \
  -DPYTHON_EXECUTABLE="$PY"
run cmake --build "$BUILD_DIR" -j "$JOBS" --target install

run cmake -S "$ET_DIR/examples/qualcomm" -B "$EXAMPLE_DIR" \
  -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
  -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
  -DANDROID_ABI=arm64-v8a \
  -DANDROID_PLATFORM="$PLATFORM" \
  -DCMAKE_PREFIX_PATH="$BUILD_DIR;$BUILD_DIR/third-party/gflags" \
  -DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=BOTH \
  -DSUPPORT_REGEX_LOOKAHEAD=ON \
  -DBUILD_TESTING=OFF \
  -DEXECUTORCH_ENABLE_LOGGING=ON \
  -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON \
  -DPYTHON_EXECUTABLE="$PY"
run cmake --build "$EXAMPLE_DIR" -j "$JOBS" --target qnn_executor_runner

RUNNER="$EXAMPLE_DIR/executor_runner/qnn_executor_runner"
BACKEND_LIB="$BUILD_DIR/backends/qualcomm/libqnn_executorch_backend.so"
if [ "$DRY_RUN" = 0 ]; then
  [ -x "$RUNNER" ] || RUNNER="$(find "$EXAMPLE_DIR" -name qnn_executor_runner -type f -perm -u+x | sed -n 1p)"
  [ -n "$RUNNER" ] && [ -x "$RUNNER" ] || die "build finished but qnn_executor_runner was not found under $EXAMPLE_DIR"
  [ -f "$BACKEND_LIB" ] || BACKEND_LIB="$(find "$BUILD_DIR" -name libqnn_executorch_backend.so | sed -n 1p)"
fi
echo "$RUNNER"
echo "$BACKEND_LIB"
