#!/usr/bin/env bash
# Build ExecuTorch's arm_executor_runner for bundlerun's fvp:// (and serial) targets.
#
# Wraps <et-root>/backends/arm/scripts/build_executor_runner.sh (flags checked
# against ExecuTorch's script: --pte= --target= --bundleio --etdump
# --extra_build_flags= --output= --build_type= --toolchain=). Needs an ExecuTorch
# checkout set up with examples/arm/setup.sh and arm-none-eabi-gcc on PATH.
#
#   semihosting BundleIO runner (default; the FVP target's normal mode):
#     build_runner.sh --et-root=~/executorch --target=ethos-u55-128
#   UART-only runner with a bundle linked in, ET_ATOL/ET_RTOL from its manifest:
#     build_runner.sh --et-root=~/executorch --target=ethos-u85-256 --mode=uart --bundle=model.bpte
#   UART-only runner reading the bundle from an address (FVP --data FILE@ADDR, or flashed):
#     build_runner.sh --et-root=~/executorch --target=ethos-u55-128 --mode=uart --model-addr=0x70000000 [--bundle=model.bpte]
#
# Options:
#   --et-root=DIR        ExecuTorch checkout (required; or $EXECUTORCH_ROOT)
#   --target=T           ethos-u55-{32,64,128,256} ethos-u65-{256,512} ethos-u85-{128..2048} cortex-m55 cortex-m85
#   --mode=M             semihosting (default) | uart
#   --bundle=FILE        .bpte to link in (uart) and/or to take ET_ATOL/ET_RTOL from
#   --model-addr=0xADDR  uart: bundle placed at this address instead of linked in
#   --etdump             uart: also dump outputs as an ETDump base64 block (bit exact over UART)
#   --atol=X --rtol=Y    override the compiled tolerances
#   --output=DIR         build folder (default: <et-root>/arm_test/bundlerun_<mode>_<target>)
#   --build-type=TYPE    Release (default) | Debug | RelWithDebInfo
#   --python=PY          python with bundlerun installed (default: python3)
#   --dry-run            print the command instead of running it
set -euo pipefail

et_root="${EXECUTORCH_ROOT:-}"
target="ethos-u55-128"
mode="semihosting"
bundle=""
model_addr=""
etdump=false
atol=""
rtol=""
output=""
build_type="Release"
python_bin="${PYTHON:-python3}"
dry_run=false
here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "build_runner.sh: $*" >&2; exit 2; }

for arg in "$@"; do
    case "$arg" in
        --et-root=*) et_root="${arg#*=}" ;;
        --target=*) target="${arg#*=}" ;;
        --mode=*) mode="${arg#*=}" ;;
        --bundle=*) bundle="${arg#*=}" ;;
        --model-addr=*) model_addr="${arg#*=}" ;;
        --etdump) etdump=true ;;
        --atol=*) atol="${arg#*=}" ;;
        --rtol=*) rtol="${arg#*=}" ;;
        --output=*) output="${arg#*=}" ;;
        --build-type=*) build_type="${arg#*=}" ;;
        --python=*) python_bin="${arg#*=}" ;;
        --dry-run) dry_run=true ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) die "unknown option '$arg' (see --help)" ;;
    esac
done

[[ -n "$et_root" ]] || die "--et-root=DIR (an ExecuTorch checkout) is required"
script="${et_root}/backends/arm/scripts/build_executor_runner.sh"
[[ -f "$script" ]] || die "not an ExecuTorch checkout: missing ${script}"
[[ "$target" =~ ^(ethos-u55-(32|64|128|256)|ethos-u65-(256|512)|ethos-u85-(128|256|512|1024|2048)|cortex-m55|cortex-m85)$ ]] \
    || die "unknown --target '$target'"
case "$mode" in semihosting|uart) ;; *) die "--mode must be semihosting or uart, not '$mode'" ;; esac
if [[ -n "$model_addr" && ! "$model_addr" =~ ^0x[0-9a-fA-F]{1,16}$ ]]; then
    die "--model-addr must be a hex address like 0x70000000"
fi

extra=()
if [[ "$mode" == semihosting ]]; then
    pte="semihosting"
    [[ -z "$model_addr" ]] || die "--model-addr is for --mode=uart"
else
    if [[ -n "$model_addr" ]]; then
        pte="$model_addr"
    else
        [[ -n "$bundle" ]] || die "--mode=uart needs --bundle=FILE (linked in) or --model-addr=0xADDR"
        pte="$(realpath "$bundle")"
    fi
    if [[ -n "$bundle" && ( -z "$atol" || -z "$rtol" ) ]]; then
        [[ -f "$bundle" ]] || die "bundle not found: $bundle"
        read -r m_atol m_rtol < <("$python_bin" "${here}/manifest_tolerance.py" "$bundle") \
            || die "cannot read tolerances from $bundle"
        atol="${atol:-$m_atol}"
        rtol="${rtol:-$m_rtol}"
    fi
    [[ -z "$atol" ]] || extra+=("-DET_ATOL=${atol}")
    [[ -z "$rtol" ]] || extra+=("-DET_RTOL=${rtol}")
    extra+=("-DET_LOG_DUMP_OUTPUT=ON")
    if $etdump; then
        extra+=("-DEXECUTORCH_ENABLE_EVENT_TRACER=ON" "-DET_DUMP_OUTPUTS=ON")
    fi
fi

output="${output:-${et_root}/arm_test/bundlerun_${mode}_${target}}"
cmd=("$script" "--pte=${pte}" "--bundleio" "--target=${target}" "--build_type=${build_type}" "--output=${output}")
if ((${#extra[@]})); then
    cmd+=("--extra_build_flags=${extra[*]}")
fi

# Cortex-M (no NPU) semihosting runners: ExecuTorch builds them with the cortex-m
# kernels and its own op list via backends/cortex_m/test/build_test_runner.sh
# (compiled ET_ATOL=5.0 ET_RTOL=1.0; bundlerun judges on the host anyway).
cortex_script="${et_root}/backends/cortex_m/test/build_test_runner.sh"
if [[ "$target" == cortex-m* && "$mode" == semihosting && -f "$cortex_script" ]]; then
    output="${et_root}/arm_test/arm_semihosting_executor_runner_corstone-300"
    cmd=("$cortex_script" "--target=${target}")
fi

if $dry_run; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi

command -v arm-none-eabi-gcc >/dev/null || die "arm-none-eabi-gcc not on PATH (source <et-root>/examples/arm/arm-scratch/setup_path.sh)"
"${cmd[@]}"

elf="$(find "$output" -name arm_executor_runner -type f | sed -n 1p)"
[[ -n "$elf" ]] || die "build finished but no arm_executor_runner under $output"
board="corstone-300"
[[ "$target" == ethos-u85-* || "$target" == cortex-m85 ]] && board="corstone-320"
key="runner_elf"
[[ "$mode" == uart ]] && key="uart_runner_elf"
echo
echo "Built $elf"
echo "Add to bundlerun.toml:"
echo "[targets.fvp.\"${board}/${target}\"]"
echo "${key} = \"${elf}\""
[[ -z "$model_addr" ]] || echo "model_addr = \"${model_addr}\""
[[ "$mode" == uart ]] && echo "mode = \"uart\""
exit 0
