#!/usr/bin/env bash
# Run one bundle on a runner built by build_qemu_runner.sh, by hand (the qemu:// target does
# the same per case). Prints QEMU's output; exit status is QEMU's (= the runner's), 124 on timeout.
#
#   run.sh RUNNER_DIR BUNDLE [WORKDIR] [TIMEOUT_S]
#
# semihosting runner: WORKDIR (default: a new temp dir) becomes QEMU's cwd and gets
#   model.bpte and the runner's out-0.bin, out-1.bin, ...
# uart runner: the bundle is placed at the runner's model_addr with -device loader and UART0
#   is QEMU's stdout; the run ends at TIMEOUT_S (the firmware idles after its "\x04" line).
set -euo pipefail
die() { echo "run.sh: $*" >&2; exit 2; }
[[ $# -ge 2 ]] || die "usage: run.sh RUNNER_DIR BUNDLE [WORKDIR] [TIMEOUT_S]"
runner="$(cd -- "$1" 2>/dev/null && pwd)" || die "no runner folder $1"
bundle="$(realpath -- "$2" 2>/dev/null)" && [[ -f "$bundle" ]] || die "bundle not found: $2"
work="${3:-$(mktemp -d)}"
limit="${4:-60}"
elf="$runner/arm_executor_runner.elf"
[[ -f "$elf" && -f "$runner/runner.json" ]] || die "$runner has no arm_executor_runner.elf/runner.json"
command -v qemu-system-arm >/dev/null || die "qemu-system-arm not found (apt-get install qemu-system-arm)"
mode="$(sed -n 's/.*"mode": "\([a-z]*\)".*/\1/p' "$runner/runner.json" | sed -n 1p)"
mkdir -p "$work"
cd "$work"
if [[ "$mode" == uart ]]; then
  addr="$(sed -n 's/.*"model_addr": "\(0x[0-9a-fA-F]*\)".*/\1/p' "$runner/runner.json")"
  exec timeout --foreground -k 5 "$limit" qemu-system-arm -M mps3-an547 -nographic -monitor none \
    -serial stdio -device "loader,file=$bundle,addr=$addr" -kernel "$elf"
fi
cp "$bundle" model.bpte
printf '\0\0\0\0' > unused.bin
echo "run.sh: cwd $work" >&2
exec timeout -k 5 "$limit" qemu-system-arm -M mps3-an547 -nographic -monitor none -serial none \
  -semihosting-config "enable=on,target=native,arg=arm_executor_runner,arg=-m,arg=model.bpte,arg=-i,arg=unused.bin,arg=-o,arg=out" \
  -kernel "$elf"
