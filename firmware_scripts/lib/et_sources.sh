# Shared by the firmware build scripts (source it, do not run it).
#
# Where ExecuTorch's sources come from, in this order:
#   1. --executorch-src DIR: a user's checkout (submodules initialised; CMSIS-NN found under
#      it or given with --cmsis-nn DIR);
#   2. the upstream tarballs in ../shared/third_party (or $BUNDLERUN_THIRD_PARTY), extracted
#      once into the cache and laid out as ExecuTorch expects;
#   3. otherwise: git clone --recursive of the pinned ExecuTorch commit (ET_PINNED_COMMIT).
#      Not possible on machines without a git host; the error says how to do it by hand.
#
# Builds are cached content-addressed under ${BUNDLERUN_CACHE:-~/.cache/bundlerun}:
#   src/<sha of the tarball set>/executorch      extracted sources
#   runners/<key>/                                one built runner + runner.json
# where <key> hashes the sources, the flags, the op set and the toolchain version.

ET_PINNED_COMMIT="cff6f4dd32e630945b7188512c1f2b4f102b05ad"
BUNDLERUN_CACHE="${BUNDLERUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bundlerun}"

et_die() { echo "${ET_SCRIPT_NAME:-firmware}: $*" >&2; exit 2; }

# The folder holding the tarballs + SHA256SUMS, or empty.
et_third_party_dir() {
  local here cand
  here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
  for cand in "${BUNDLERUN_THIRD_PARTY:-}" "$here/../../../shared/third_party" "$here/../../../../shared/third_party"; do
    if [ -n "$cand" ] && [ -f "$cand/SHA256SUMS" ] && [ -f "$cand/executorch.tar.xz" ]; then
      (cd "$cand" && pwd)
      return 0
    fi
  done
  return 0
}

# Extract the tarballs (checksums verified) into the cache once; print the executorch folder.
# Layout: executorch/, executorch/third-party/{flatbuffers,flatcc,gflags,json},
# executorch/backends/xnnpack/third-party/{FXdiv,XNNPACK,cpuinfo,pthreadpool,FP16},
# executorch/backends/vulkan/third-party/{...}, and CMSIS-NN/, kleidiai/ beside executorch/.
et_extract_tarballs() {
  local tp="$1" sums key dest lock
  sums="$(sha256sum "$tp/SHA256SUMS" | cut -c1-16)"
  dest="$BUNDLERUN_CACHE/src/$sums"
  if [ -f "$dest/.complete" ]; then
    et_extract_xnnpack_family "$tp" "$dest"
    echo "$dest/executorch"
    return 0
  fi
  mkdir -p "$BUNDLERUN_CACHE/src"
  lock="$BUNDLERUN_CACHE/src/.$sums.lock"
  (
    flock 9
    if [ ! -f "$dest/.complete" ]; then
      (cd "$tp" && sha256sum --quiet -c SHA256SUMS) >&2 || et_die "checksums in $tp/SHA256SUMS do not match"
      rm -rf "$dest.partial"
      mkdir -p "$dest.partial"
      tar -xJf "$tp/executorch.tar.xz" -C "$dest.partial"
      tar -xJf "$tp/CMSIS-NN.tar.xz" -C "$dest.partial"
      local et="$dest.partial/executorch" name
      for name in flatbuffers flatcc gflags json; do
        rm -rf "$et/third-party/$name"
        tar -xJf "$tp/$name.tar.xz" -C "$et/third-party"
      done
      rm -rf "$et/backends/xnnpack/third-party/FXdiv"
      tar -xJf "$tp/FXdiv.tar.xz" -C "$et/backends/xnnpack/third-party"
      for name in Vulkan-Headers VulkanMemoryAllocator volk; do
        if [ -f "$tp/$name.tar.xz" ]; then
          rm -rf "$et/backends/vulkan/third-party/$name"
          tar -xJf "$tp/$name.tar.xz" -C "$et/backends/vulkan/third-party"
        fi
      done
      rm -rf "$dest"
      mv "$dest.partial" "$dest"
      touch "$dest/.complete"
    fi
  ) 9>"$lock" || exit $?
  et_extract_xnnpack_family "$tp" "$dest"
  echo "$dest/executorch"
}

# XNNPACK and its dependencies, from the tarballs when the set has them, where ExecuTorch's CMake
# looks (backends/xnnpack/third-party/{XNNPACK,cpuinfo,pthreadpool,FP16}) and KleidiAI beside
# executorch/ (XNNPACK takes -DKLEIDIAI_SOURCE_DIR=, else it downloads it). Its own marker, so a
# tree extracted before these tarballs existed gets them too (the set's checksum already covers them).
et_extract_xnnpack_family() {
  local tp="$1" dest="$2" lock name et="$2/executorch"
  [ -f "$dest/.xnnpack-family" ] && return 0
  [ -f "$tp/XNNPACK.tar.xz" ] || return 0
  lock="$dest.xnnpack.lock"
  (
    flock 9
    if [ ! -f "$dest/.xnnpack-family" ]; then
      for name in XNNPACK cpuinfo pthreadpool FP16 kleidiai; do
        local into="$et/backends/xnnpack/third-party"
        [ "$name" != kleidiai ] || into="$dest"
        rm -rf "$into/$name" "$dest/.x.partial"
        mkdir -p "$dest/.x.partial"
        tar -xJf "$tp/$name.tar.xz" -C "$dest/.x.partial" || et_die "cannot extract $tp/$name.tar.xz"
        mv "$dest/.x.partial/$name" "$into/$name"
      done
      rm -rf "$dest/.x.partial"
      touch "$dest/.xnnpack-family"
    fi
  ) 9>"$lock" || exit $?
}

# KleidiAI for XNNPACK's -DKLEIDIAI_SOURCE_DIR: beside tarball-extracted sources, or $2 when given;
# empty when absent (XNNPACK then downloads it at configure time, as in a plain checkout).
et_kleidiai_dir() {
  local et="$1" given="${2:-}" cand
  for cand in "$given" "$et/../kleidiai" "$et/backends/xnnpack/third-party/kleidiai"; do
    if [ -n "$cand" ] && [ -f "$cand/CMakeLists.txt" ] && [ -d "$cand/kai" ]; then
      (cd "$cand" && pwd)
      return 0
    fi
  done
  return 0
}

# Print the ExecuTorch source folder to build from. $1: the user's --executorch-src (may be empty).
et_resolve_sources() {
  local user="${1:-}" tp
  if [ -n "$user" ]; then
    [ -f "$user/CMakeLists.txt" ] && [ -d "$user/runtime" ] || et_die "$user is not an ExecuTorch checkout (no CMakeLists.txt / runtime/)"
    (cd "$user" && pwd)
    return 0
  fi
  tp="$(et_third_party_dir)"
  if [ -n "$tp" ]; then
    et_extract_tarballs "$tp"
    return 0
  fi
  et_die "no ExecuTorch sources: pass --executorch-src DIR (a checkout with submodules), set BUNDLERUN_THIRD_PARTY to the tarball folder, or run: git clone --recursive https://github.com/pytorch/executorch && git -C executorch checkout $ET_PINNED_COMMIT && git -C executorch submodule update --init --recursive"
}

# CMSIS-NN beside tarball-extracted sources, or inside a checkout, or $1 when given.
et_cmsis_nn_dir() {
  local et="$1" given="${2:-}" cand
  for cand in "$given" "$et/../CMSIS-NN" "$et/backends/cortex_m/third-party/CMSIS-NN" "$et/examples/arm/arm-scratch/cmsis-nn"; do
    if [ -n "$cand" ] && [ -f "$cand/CMakeLists.txt" ]; then
      (cd "$cand" && pwd)
      return 0
    fi
  done
  et_die "CMSIS-NN not found (looked beside and inside $et); pass --cmsis-nn DIR"
}

# A stable fingerprint of a source tree: the tarball set's checksum, or the checkout's git HEAD
# plus its dirty diff, or (last resort) the file list with sizes and mtimes.
et_source_fingerprint() {
  local et="$1"
  if [ -f "$et/../.complete" ]; then
    basename "$(cd "$et/.." && pwd)"
  elif git -C "$et" rev-parse HEAD >/dev/null 2>&1; then
    { git -C "$et" rev-parse HEAD; git -C "$et" diff HEAD 2>/dev/null; git -C "$et" submodule status 2>/dev/null; } | sha256sum | cut -c1-16
  else
    find "$et" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.c' -o -name 'CMakeLists.txt' -o -name '*.cmake' -o -name '*.yaml' \) -printf '%P %s %T@\n' | sort | sha256sum | cut -c1-16
  fi
}

# Content-addressed cache key: hash of every argument (strings or files) given.
# Usage: et_cache_key "fingerprint" "flags..." "ops" "$(arm-none-eabi-gcc --version | sed -n 1,1p)" [FILE...]
et_cache_key() {
  local part
  for part in "$@"; do
    if [ -f "$part" ]; then sha256sum "$part" | cut -c1-64; else printf '%s\n' "$part"; fi
  done | sha256sum | cut -c1-20
}

# A private view of a source tree for ONE build: the folder structure is copied, every file is a
# symlink into the shared tree (about 1 s, no file contents copied). Why: ExecuTorch's flatcc
# writes libflatccrt.a into its *source* folder (third-party/flatcc/lib, `dist_dir` is hard-set
# to PROJECT_SOURCE_DIR) and every configure deletes that folder, so two builds from one shared
# tree (aarch64 + x86_64, or the Arm runner at the same time) link each other's flatccrt
# ("Relocations in generic ELF (EM: 62)"). Prints the executorch folder inside $2.
et_build_tree() {
  local et="$1" dest="$2"
  rm -rf "$dest"
  mkdir -p "$dest"
  cp -rs "$(cd "$et" && pwd)" "$dest/executorch" || et_die "cannot make a private source view in $dest"
  rm -rf "$dest/executorch/third-party/flatcc/lib"  # never link another build's archive
  echo "$dest/executorch"
}

# The flatc that ships in the executorch wheel of the given python. (executorch is a namespace
# package in the wheel: __file__ is None, so use __path__.)
et_wheel_flatc() {
  local py="$1" flatc
  flatc="$("$py" -c 'import executorch, os; print(os.path.join(list(executorch.__path__)[0], "data", "bin", "flatc"))' 2>/dev/null)" \
    || et_die "$py cannot import executorch (pip install executorch==1.5.1), which ships flatc"
  [ -x "$flatc" ] || et_die "no flatc at $flatc"
  echo "$flatc"
}

# ccache as the compiler launcher, when it is installed (scripts/setup.sh installs it): a compile another
# runner's build already made comes from $BUNDLERUN_CACHE/ccache. ExecuTorch's portable kernels (about
# 220 of each build's compiles) are the same objects in the x86_64 Vulkan and MLX runners. Paths under
# the cache are hashed relative to the build folder, so two builds' private source views (et_build_tree,
# <key>.build/src beside <key>.build/out) share entries. In no cache key: the launcher changes how long
# a build takes, not what it makes. BUNDLERUN_CCACHE=0 builds without it: CCACHE_DISABLE too, since
# ExecuTorch's own CMakeLists.txt:235 makes ccache the launcher of its targets whenever it is installed
# (with ccache's default folder, outside bundlerun's cache, unless this has run). Sets ET_CCACHE_FLAGS.
et_ccache() {
  ET_CCACHE_FLAGS=()
  if [ "${BUNDLERUN_CCACHE:-1}" = 0 ]; then export CCACHE_DISABLE=1; return 0; fi
  if ! command -v ccache >/dev/null 2>&1; then return 0; fi
  export CCACHE_DIR="${CCACHE_DIR:-$BUNDLERUN_CACHE/ccache}" CCACHE_BASEDIR="$BUNDLERUN_CACHE" CCACHE_NOHASHDIR=1
  ET_CCACHE_FLAGS=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
}

# The CMake options every bundlerun executor_runner build shares (examples/portable/executor_runner
# with BundleIO, ETDump and logging, the portable kernels): each lane adds its kernels and backends.
# Cache keys hash the full flag list, so this list keeps its order.
ET_RUNNER_COMMON_FLAGS=(
  -DEXECUTORCH_BUILD_EXECUTOR_RUNNER=ON
  -DEXECUTORCH_ENABLE_BUNDLE_IO=ON
  -DEXECUTORCH_BUILD_DEVTOOLS=ON
  -DEXECUTORCH_ENABLE_EVENT_TRACER=ON
  -DEXECUTORCH_ENABLE_LOGGING=ON
  -DEXECUTORCH_PAL_DEFAULT=posix
  -DEXECUTORCH_BUILD_EXTENSION_DATA_LOADER=ON
  -DEXECUTORCH_BUILD_EXTENSION_FLAT_TENSOR=ON
  -DEXECUTORCH_BUILD_EXTENSION_EVALUE_UTIL=ON
  -DEXECUTORCH_BUILD_EXTENSION_RUNNER_UTIL=ON
  -DEXECUTORCH_BUILD_PORTABLE_OPS=ON
)
