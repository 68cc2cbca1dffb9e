#!/usr/bin/env bash
# Build ExecuTorch's own arm_executor_runner (unmodified, BundleIO) for QEMU's mps3-an547
# (Corstone SSE-300, Cortex-M55) from source, into a content-addressed cache.
#
#   build_qemu_runner.sh                                 zoo ops, semihosting runner
#   build_qemu_runner.sh --ops-from a.bpte b.bpte        exactly the ops of these bundles
#   build_qemu_runner.sh --mode uart                     bundle read from 0x7C000000, log on UART0
#   build_qemu_runner.sh --fault hardfault               a runner that faults in execute()
#   build_qemu_runner.sh --etdump --ops-from a.bpte      the debug runner of `bundlerun debug`:
#                                                        ETDump + every intermediate output
#
# Options (--opt VALUE and --opt=VALUE both work):
#   --executorch-src DIR     ExecuTorch checkout with submodules (default: the tarballs in
#                            ../shared/third_party, extracted once into the cache)
#   --cmsis-nn DIR           CMSIS-NN sources (default: beside/inside the ExecuTorch tree)
#   --ops-from BUNDLE...     register exactly the operators of these .pte/.bpte files
#   --ops LIST               comma-separated operators, e.g. aten::add.out,cortex_m::quantized_linear.out
#                            (default: qemu/zoo_ops.txt, every zoo model in portable fp32 and
#                            cortex-m int8; --ops and --ops-from add up)
#   --mode M                 semihosting (default: -m/-i/-o files on the host, outputs as
#                            out-N.bin) | uart (bundle at --model-addr, log + printed outputs on UART0)
#   --model-addr 0xADDR      uart mode: where QEMU's -device loader places the bundle (0x7C000000)
#   --method-pool-size N     method allocator pool in bytes (default 0x4000000 = 64 MiB; with
#                            --etdump 64 MiB + the debug buffer)
#   --etdump                 event tracer + intermediate outputs: the runtime built with
#                            -DEXECUTORCH_ENABLE_EVENT_TRACER=ON (its own library tree) and the runner
#                            with ET_EVENT_TRACER_ENABLED, ET_DUMP_INTERMEDIATE_OUTPUTS and
#                            ET_DEBUG_BUFFER_SIZE. Semihosting: etdump.bin + debug_buffer.bin in the
#                            cwd; uart: a '#[RUN THIS]' ... base64 ... '#[END]' block on UART0
#   --debug-buffer-size N    with --etdump: ET_DEBUG_BUFFER_SIZE in bytes, decimal or 0x hex
#                            (default 0x200000 = 2 MiB, the runner's own default); it is taken
#                            from the method pool, so it must fit there with room to spare
#   --fault F                none (default) | spin | hardfault | short-output: test runners
#   --print-ops              print the resolved operator list and exit
#   --dry-run                print what would be built (commands, cache folder) and exit
#   --force                  rebuild even when the cache has this runner
#   --jobs N                 parallel build jobs (default 2)
#   --python PY              Python with torch + executorch (default: the repo's .venv)
#
# Output: the last stdout line is the runner folder ($BUNDLERUN_CACHE/runners/<key>/, holding
# arm_executor_runner.elf and runner.json). The ExecuTorch libraries are built once per
# source tree + toolchain under $BUNDLERUN_CACHE/build/arm-qemu-<key>/; runner variants
# (mode, fault, pool size, op set) reuse that tree and rebuild only what differs. --etdump
# builds use a second tree (its key adds the event-tracer flags), configured from a private
# symlink view of the sources in <tree>/src; every debug buffer size shares it.
#
# Run it on QEMU (semihosting; the semihosting cwd is QEMU's cwd):
#   qemu-system-arm -M mps3-an547 -nographic -monitor none -serial none \
#     -semihosting-config enable=on,target=native,arg=runner,arg=-m,arg=model.bpte,arg=-i,arg=unused.bin,arg=-o,arg=out \
#     -kernel RUNNER/arm_executor_runner.elf
set -euo pipefail

ET_SCRIPT_NAME="build_qemu_runner.sh"
here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd -- "$here/../.." && pwd)"
# shellcheck source=../lib/et_sources.sh
source "$here/../lib/et_sources.sh"
die() { et_die "$*"; }

et_src=""
cmsis=""
ops_from=()
ops_arg=""
mode="semihosting"
model_addr="0x7C000000"
uart_base="0x49303000"
method_pool="0x4000000"
file_pool="0x2000000"
temp_pool="0x200000"
fault="none"
etdump=false
debug_buffer_size=""
method_pool_given=false
print_ops=false
dry_run=false
force=false
jobs=2
python_bin="${PYTHON:-}"
build_type="Release"

need_value() { [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value (see --help)"; }

while (($#)); do
  arg="$1"
  if [[ "$arg" == --*=* ]]; then
    set -- "${arg%%=*}" "${arg#*=}" "${@:2}"
    arg="$1"
  fi
  case "$arg" in
    --executorch-src) need_value "$@"; et_src="$2"; shift 2 ;;
    --cmsis-nn) need_value "$@"; cmsis="$2"; shift 2 ;;
    --ops) need_value "$@"; ops_arg="${ops_arg:+$ops_arg,}$2"; shift 2 ;;
    --ops-from)
      shift
      [[ $# -ge 1 && "$1" != --* ]] || die "--ops-from needs at least one bundle"
      while (($#)) && [[ "$1" != --* ]]; do ops_from+=("$1"); shift; done ;;
    --mode) need_value "$@"; mode="$2"; shift 2 ;;
    --model-addr) need_value "$@"; model_addr="$2"; shift 2 ;;
    --method-pool-size) need_value "$@"; method_pool="$2"; method_pool_given=true; shift 2 ;;
    --etdump) etdump=true; shift ;;
    --debug-buffer-size) need_value "$@"; debug_buffer_size="$2"; shift 2 ;;
    --fault) need_value "$@"; fault="$2"; shift 2 ;;
    --jobs|-j) need_value "$@"; jobs="$2"; shift 2 ;;
    --python) need_value "$@"; python_bin="$2"; shift 2 ;;
    --print-ops) print_ops=true; shift ;;
    --dry-run) dry_run=true; shift ;;
    --force) force=true; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$arg' (see --help)" ;;
  esac
done

case "$mode" in semihosting|uart) ;; *) die "--mode must be semihosting or uart, not '$mode'" ;; esac
case "$fault" in none|spin|hardfault|short-output) ;; *) die "--fault must be none, spin, hardfault or short-output, not '$fault'" ;; esac
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer, not '$jobs'"
[[ "$model_addr" =~ ^0x[0-9a-fA-F]{1,8}$ ]] || die "--model-addr must be a hex address like 0x7C000000, not '$model_addr'"
if [[ "$method_pool" =~ ^0x[0-9a-fA-F]{1,8}$ ]]; then method_pool=$((method_pool)); fi
[[ "$method_pool" =~ ^[0-9]+$ ]] && ((method_pool >= 16 && method_pool <= 0x8000000)) \
  || die "--method-pool-size must be 16..134217728 bytes (decimal or 0x hex), not '$method_pool'"
# ETDump: the debug buffer comes out of the method allocator pool (runner_init allocates it there
# before loading the method), so the pool grows by the buffer unless it was given.
if [[ -n "$debug_buffer_size" ]] && ! $etdump; then
  die "--debug-buffer-size needs --etdump"
fi
if $etdump; then
  debug_buffer_size="${debug_buffer_size:-0x200000}"
  if [[ "$debug_buffer_size" =~ ^0x[0-9a-fA-F]{1,8}$ ]]; then debug_buffer_size=$((debug_buffer_size)); fi
  [[ "$debug_buffer_size" =~ ^[0-9]+$ ]] && ((debug_buffer_size >= 16 && debug_buffer_size <= 0x8000000)) \
    || die "--debug-buffer-size must be 16..134217728 bytes (decimal or 0x hex), not '$debug_buffer_size'"
  if ! $method_pool_given; then
    method_pool=$((method_pool + debug_buffer_size))
    ((method_pool <= 0x8000000)) || die "--debug-buffer-size $debug_buffer_size does not fit the method pool: the default pool (64 MiB) plus the buffer exceeds the 128 MiB maximum; pass a smaller buffer (at most 67108864 bytes)"
  fi
  # the program's planned memory and the method's own tables come from the same pool
  ((debug_buffer_size + 0x10000 <= method_pool)) \
    || die "--debug-buffer-size $debug_buffer_size does not fit the method pool ($method_pool bytes, which also holds the program's planned memory): pass a larger --method-pool-size or a smaller buffer"
fi
if [[ "$fault" == short-output && "$mode" != semihosting ]]; then
  die "--fault short-output needs --mode semihosting (it shortens output files)"
fi

if [[ -z "$python_bin" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then python_bin="$repo/.venv/bin/python"; else python_bin="python3"; fi
fi

# ---- sources ---------------------------------------------------------------------------
et_root="$(et_resolve_sources "$et_src")" || exit 2
cmsis_dir="$(et_cmsis_nn_dir "$et_root" "$cmsis")" || exit 2
[[ -f "$et_root/examples/arm/executor_runner/arm_executor_runner.cpp" ]] \
  || die "$et_root has no examples/arm/executor_runner/arm_executor_runner.cpp"

# ---- operator set ----------------------------------------------------------------------
ops_text=""
if ((${#ops_from[@]})); then
  for b in "${ops_from[@]}"; do [[ -f "$b" ]] || die "bundle not found: $b"; done
  ops_text="$("$python_bin" "$here/bundle_ops.py" "${ops_from[@]}" 2>/tmp/bundle_ops.$$.err)" \
    || { msg="$(tail -n 1 /tmp/bundle_ops.$$.err)"; rm -f /tmp/bundle_ops.$$.err; die "cannot list ops: ${msg:-bundle_ops.py failed}"; }
  rm -f /tmp/bundle_ops.$$.err
fi
if [[ -n "$ops_arg" ]]; then ops_text+=$'\n'"$(tr ', ' '\n\n' <<<"$ops_arg")"; fi
if [[ -z "$ops_text" ]]; then ops_text="$(grep -v '^#' "$here/qemu/zoo_ops.txt")"; fi
mapfile -t ops < <(grep -v '^[[:space:]]*$' <<<"$ops_text" | sort -u)
((${#ops[@]})) || die "no operators selected"

# Every op must name a kernel this tree has: portable, cortex_m or a prim op.
known_ops() {
  sed -n 's/^- op: *\([^ ]*\).*/aten::\1/p' "$et_root/kernels/portable/functions.yaml"
  # namespaced portable kernels are '- func:' entries (e.g. dim_order_ops::_clone_dim_order.out)
  sed -n 's/^- func: *\([a-z_]*::[^(]*\)(.*/\1/p' "$et_root/kernels/portable/functions.yaml"
  sed -n 's/^- func: *\([^(]*\)(.*/\1/p' "$et_root/backends/cortex_m/ops/operators.yaml"
  grep -o '"[a-z_]*::[A-Za-z0-9_.]*"' "$et_root/kernels/prim_ops/register_prim_ops.cpp" | tr -d '"'
}
known="$(known_ops | sort -u)"
for op in "${ops[@]}"; do
  [[ "$op" =~ ^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?$ ]] || die "bad operator name '$op' (want ns::name.overload)"
  grep -qxF "$op" <<<"$known" || die "operator $op has no kernel in $et_root (portable, cortex_m or prim ops)"
done
ops_csv="$(IFS=,; echo "${ops[*]}")"
max_kernels=${#ops[@]}

if $print_ops; then
  printf '%s\n' "${ops[@]}"
  exit 0
fi

# ---- tools -----------------------------------------------------------------------------
missing=()
for tool in arm-none-eabi-gcc arm-none-eabi-g++ cmake ninja; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib cmake ninja-build)"
for lib in librdimon.a libstdc++.a; do
  [[ "$(arm-none-eabi-gcc -print-file-name="$lib")" == /* ]] \
    || die "arm-none-eabi toolchain has no $lib (apt-get install libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib)"
done
toolchain="$(arm-none-eabi-gcc --version | sed -n 1,1p)"
flatc="$(et_wheel_flatc "$python_bin")" || exit 2
python_abs="$(command -v "$python_bin")"

# the portable kernel files of those ops: only they compile (portable_sources.py says why)
portable_srcs="$("$python_bin" "$here/portable_sources.py" "$et_root" "$ops_csv")" || die "cannot map the ops to portable kernel files"

# ---- cache keys ------------------------------------------------------------------------
fingerprint="$(et_source_fingerprint "$et_root")"
# The event tracer changes the compile flags of the whole runtime (ET_EVENT_TRACER_ENABLED): an
# --etdump build has its own library tree (its key adds the flags; the plain key is unchanged).
lib_flags=()
runner_flags=()
if $etdump; then
  lib_flags=("etdump=1" "EXECUTORCH_BUILD_ARM_ETDUMP=ON" "EXECUTORCH_ENABLE_EVENT_TRACER=ON")
  runner_flags=("etdump=1" "ET_EVENT_TRACER_ENABLED" "ET_DUMP_INTERMEDIATE_OUTPUTS" "ET_DEBUG_BUFFER_SIZE=$debug_buffer_size")
fi
# CMSIS-NN by its fingerprint, not its path (the tarball set's, for the copy extracted beside ExecuTorch's):
# a cache at another path computes the same keys and reuses its entries
cmsis_fingerprint="$(et_source_fingerprint "$cmsis_dir")"
lib_key="$(et_cache_key "arm-qemu-lib-v2" "$fingerprint" "$toolchain" "$build_type" "cmsis-nn=$cmsis_fingerprint" "$flatc" "$python_abs" ${lib_flags[@]+"${lib_flags[@]}"})"
lib_dir="$BUNDLERUN_CACHE/build/arm-qemu-$lib_key"
build_dir="$lib_dir/build"
runner_key="$(et_cache_key "arm-qemu-runner-v1" "$lib_key" "mode=$mode" "fault=$fault" \
  "method_pool=$method_pool" "file_pool=$file_pool" "temp_pool=$temp_pool" "model_addr=$model_addr" \
  "uart_base=$uart_base" "max_kernels=$max_kernels" "ops=$ops_csv" ${runner_flags[@]+"${runner_flags[@]}"} \
  "$here/qemu/CMakeLists.txt" "$here/portable_sources.py" "$here/qemu/startup.c" "$here/qemu/faults.c" "$here/qemu/printf_z.c" "$here/qemu/mps3-an547.ld" \
  ${runner_flags[@]+"$here/qemu/newlib_compat.c"})"
runner_dir="$BUNDLERUN_CACHE/runners/$runner_key"
# flatcc writes libflatccrt.a into its *source* folder and every ExecuTorch configure deletes that
# folder: the --etdump tree (the only one here that builds flatccrt, for the Cortex-M55) configures
# from a private symlink view of the sources (et_build_tree), so no other build can take it away.
src_root="$et_root"
if $etdump; then src_root="$lib_dir/src/executorch"; fi

semihosting=ON
[[ "$mode" == uart ]] && semihosting=OFF
etdump_on=OFF
if $etdump; then etdump_on=ON; fi
# CMake ties a build tree to the path of its sources: the runner's sources are configured from a copy
# in the cached tree, so a second checkout of bundlerun (a CI clone elsewhere) reuses the cached
# libraries instead of failing with "does not match the source ... used to generate cache".
runner_src="$lib_dir/runner-src"
cmake_cmd=(cmake -S "$runner_src" -B "$build_dir" -G Ninja -Wno-dev
  -DCMAKE_BUILD_TYPE="$build_type"
  -DCMAKE_TOOLCHAIN_FILE="$src_root/examples/arm/ethos-u-setup/arm-none-eabi-gcc.cmake"
  -DEXECUTORCH_ROOT="$src_root"
  -DEXECUTORCH_BUILD_DEVTOOLS=ON -DEXECUTORCH_BUILD_ARM_ETDUMP="$etdump_on" -DEXECUTORCH_BUILD_ARM_BAREMETAL=OFF
  -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=OFF -DEXECUTORCH_BUILD_PTHREADPOOL=OFF -DEXECUTORCH_BUILD_CPUINFO=OFF
  -DEXECUTORCH_BUILD_CORTEX_M=ON -DCMSIS_NN_LOCAL_PATH="$cmsis_dir"
  -DFLATC_EXECUTABLE="$flatc" -DPYTHON_EXECUTABLE="$python_abs"
  -UMAX_KERNEL_NUM -DBUNDLERUN_MAX_KERNEL_NUM="$max_kernels" -DSEMIHOSTING="$semihosting"
  -DBUNDLERUN_MODE="$mode" -DBUNDLERUN_FAULT="$fault" -DBUNDLERUN_OPS="$ops_csv" -DBUNDLERUN_PORTABLE_SRCS="$portable_srcs"
  -DBUNDLERUN_METHOD_POOL_SIZE="$method_pool" -DBUNDLERUN_FILE_POOL_SIZE="$file_pool"
  -DBUNDLERUN_TEMP_POOL_SIZE="$temp_pool" -DBUNDLERUN_MODEL_ADDR="$model_addr"
  -DBUNDLERUN_UART_BASE="$uart_base")
if $etdump; then
  cmake_cmd+=(-DEXECUTORCH_ENABLE_EVENT_TRACER=ON -DBUNDLERUN_ETDUMP=ON -DBUNDLERUN_DEBUG_BUFFER_SIZE="$debug_buffer_size")
else
  cmake_cmd+=(-DBUNDLERUN_ETDUMP=OFF)
fi
et_ccache  # compiles through $BUNDLERUN_CACHE/ccache (firmware_scripts/lib/et_sources.sh)
cmake_cmd+=(${ET_CCACHE_FLAGS[@]+"${ET_CCACHE_FLAGS[@]}"})
ninja_cmd=(ninja -C "$build_dir" -j "$jobs" arm_executor_runner)

if $dry_run; then
  echo "# ExecuTorch: $et_root ($fingerprint); CMSIS-NN: $cmsis_dir; $toolchain"
  echo "# ${#ops[@]} ops, kernel registry of $max_kernels; libraries: $lib_dir"
  if $etdump; then
    echo "# etdump: debug buffer $debug_buffer_size bytes, method pool $method_pool bytes; sources: a private view of $et_root in $lib_dir/src (et_build_tree)"
  fi
  printf '%q ' "${cmake_cmd[@]}"; echo
  printf '%q ' "${ninja_cmd[@]}"; echo
  echo "$runner_dir"
  exit 0
fi

if ! $force && [[ -f "$runner_dir/runner.json" && -f "$runner_dir/arm_executor_runner.elf" ]]; then
  echo "$runner_dir"
  exit 0
fi

# ---- build (one variant at a time per library tree) ------------------------------------
mkdir -p "$lib_dir" "$BUNDLERUN_CACHE/runners"
exec 8>"$lib_dir/.lock"
flock 8
if ! $force && [[ -f "$runner_dir/runner.json" && -f "$runner_dir/arm_executor_runner.elf" ]]; then
  echo "$runner_dir"   # built by a concurrent call while we waited
  exit 0
fi
lib_cached=false
[[ -f "$lib_dir/.libs-built" ]] && lib_cached=true
if $etdump && [[ ! -f "$lib_dir/src/.view-complete" ]]; then
  rm -f "$lib_dir/.libs-built"
  lib_cached=false
  et_build_tree "$et_root" "$lib_dir/src" >/dev/null
  touch "$lib_dir/src/.view-complete"
fi
# the runner's sources into the tree's own copy: only changed files, so ninja rebuilds only what changed
mkdir -p "$runner_src"
for f in "$here"/qemu/*; do
  [[ -f "$f" ]] || continue
  cmp -s "$f" "$runner_src/${f##*/}" || cp -p "$f" "$runner_src/${f##*/}"
done
if [[ -f "$build_dir/CMakeCache.txt" ]] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$runner_src" "$build_dir/CMakeCache.txt"; then
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"   # a tree configured from elsewhere (older layout)
fi
log="$lib_dir/build-$runner_key.log"
start=$(date +%s)
what="$mode runner (fault=$fault, ${#ops[@]} ops)"
if $etdump; then what="$mode runner (fault=$fault, ${#ops[@]} ops, etdump, debug buffer $debug_buffer_size B)"; fi
echo "build_qemu_runner.sh: building $what in $build_dir$($lib_cached && echo ' (libraries cached)'); log: $log" >&2
if ! { "${cmake_cmd[@]}" && "${ninja_cmd[@]}"; } >"$log" 2>&1; then
  echo "---- last lines of $log ----" >&2
  tail -n 25 "$log" >&2
  die "build failed (full log: $log)"
fi
touch "$lib_dir/.libs-built"
seconds=$(( $(date +%s) - start ))

tmp="$runner_dir.partial.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
cp "$build_dir/arm_executor_runner.elf" "$tmp/"
cp "$build_dir/arm_executor_runner.map" "$tmp/" 2>/dev/null || true
cp "$log" "$tmp/build.log"
size_line="$(arm-none-eabi-size "$tmp/arm_executor_runner.elf" | tail -n 1)"
# the portable kernel files this runner's archive holds (read under the tree's lock: what was compiled for it)
portable_objs="$(arm-none-eabi-ar t "$build_dir/executorch/kernels/portable/libportable_kernels.a" 2>/dev/null \
  | sed -n 's/^\(op_.*\.cpp\)\.obj$/\1/p' | sort | paste -sd, -)"
PORTABLE_OBJS="$portable_objs" RUNNER_DIR="$runner_dir" MODE="$mode" FAULT="$fault" OPS="$ops_csv" METHOD_POOL="$method_pool" \
FILE_POOL="$file_pool" TEMP_POOL="$temp_pool" MODEL_ADDR="$model_addr" UART_BASE="$uart_base" \
MAX_KERNELS="$max_kernels" BUILD_TYPE="$build_type" ET_ROOT="$et_root" FINGERPRINT="$fingerprint" \
CMSIS="$cmsis_dir" TOOLCHAIN="$toolchain" SECONDS_="$seconds" LIB_CACHED="$lib_cached" \
LIB_DIR="$lib_dir" SIZE_LINE="$size_line" ETDUMP="$etdump" DEBUG_BUFFER_SIZE="$debug_buffer_size" \
OUT="$tmp/runner.json" "$python_bin" - <<'PY' || die "cannot write runner.json"
import datetime, json, os
e = os.environ
text, data, bss = (int(x) for x in e["SIZE_LINE"].split()[:3])
semihosting = e["MODE"] == "semihosting"
etdump = e["ETDUMP"] == "true"
debug_buffer_size = int(e["DEBUG_BUFFER_SIZE"]) if etdump else None
etdump_defines = (["ET_EVENT_TRACER_ENABLED", "ET_DUMP_INTERMEDIATE_OUTPUTS",
                   f"ET_DEBUG_BUFFER_SIZE={debug_buffer_size}"] if etdump else [])
record = {
    "kind": "arm-qemu",
    "machine": "mps3-an547",
    "cpu": "cortex-m55",
    "mode": e["MODE"],
    "elf": os.path.join(e["RUNNER_DIR"], "arm_executor_runner.elf"),
    "ops": e["OPS"].split(","),
    "portable_kernel_files": [f for f in e["PORTABLE_OBJS"].split(",") if f],
    "etdump": etdump,
    "debug_buffer_size": debug_buffer_size,
    "flags": {
        "fault": e["FAULT"],
        "etdump": etdump,
        "debug_buffer_size": debug_buffer_size,
        "method_pool_size": int(e["METHOD_POOL"]),
        "semihosting_file_pool_size": int(e["FILE_POOL"], 0),
        "scratch_temp_pool_size": int(e["TEMP_POOL"], 0),
        "max_kernel_num": int(e["MAX_KERNELS"]),
        "model_addr": None if semihosting else e["MODEL_ADDR"],
        "uart_base": None if semihosting else e["UART_BASE"],
        "build_type": e["BUILD_TYPE"],
        "defines": ["ET_BUNDLE_IO"] + (["SEMIHOSTING"] if semihosting else
                                       ["ET_MODEL_PTE_ADDR=" + e["MODEL_ADDR"], "ET_LOG_DUMP_OUTPUT"])
                   + etdump_defines,
        "cmake": ["-DEXECUTORCH_BUILD_ARM_ETDUMP=ON", "-DEXECUTORCH_ENABLE_EVENT_TRACER=ON"] if etdump else [],
    },
    "sources": {"executorch": e["ET_ROOT"], "fingerprint": e["FINGERPRINT"], "cmsis_nn": e["CMSIS"]},
    "toolchain": e["TOOLCHAIN"],
    "size": {"text": text, "data": data, "bss": bss},
    "qemu": (["-M", "mps3-an547", "-nographic", "-monitor", "none", "-serial", "none",
              "-semihosting-config", "enable=on,target=native,arg=arm_executor_runner,arg=-m,arg=BUNDLE,arg=-i,arg=INPUT,arg=-o,arg=out"]
             if semihosting else
             ["-M", "mps3-an547", "-nographic", "-monitor", "none", "-serial", "stdio",
              "-device", "loader,file=BUNDLE,addr=" + e["MODEL_ADDR"]]),
    "library_build": {"dir": e["LIB_DIR"], "cached": e["LIB_CACHED"] == "true"},
    "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "build_seconds": int(e["SECONDS_"]),
}
with open(e["OUT"], "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
PY
rm -rf "$runner_dir"
mv "$tmp" "$runner_dir"
echo "build_qemu_runner.sh: built in ${seconds}s: $size_line" >&2
echo "$runner_dir"
