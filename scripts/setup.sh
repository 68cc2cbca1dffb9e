#!/usr/bin/env bash
# Set up bundlerun in ./.venv on a fresh machine (idempotent).
#   - Python venv with torch==2.13.0 (CPU), executorch==1.5.1 (+ethos-u extra: tosa-tools, Vela)
#   - bundlerun installed editable with its test extras
#   - labgrid==26.0.1 in ./.venv-labgrid (kept out of .venv: its pyserial fork overwrites pyserial)
#   - Debian packages the tests drive for real: adb (Android lane), chromium (HTML report check),
#     QEMU (qemu-system-arm for the Arm runner, qemu-user for aarch64) and the cross toolchains
#     that build ExecuTorch's runners from source (gcc-arm-none-eabi, gcc-aarch64-linux-gnu, cmake, ninja)
#   - mlx[cpu] (the [apple] extra) for mlx://cpu
#   - psycopg (the [postgres] extra) and Debian's postgresql (tests/pg_server.py starts a private server)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WITH_SYSTEM_PACKAGES="${WITH_SYSTEM_PACKAGES:-1}"

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned, so no other requirement can pull a CUDA build
.venv/bin/python -m pip install -q "torch==2.13.0"
# Editable, so the tests use this tree; bundlerun installs as bundlerun.{bundles,targets,runner}
# (a wheel works the same: tests/test_packaging.py), clear of tosa-tools' top-level `runner`.
.venv/bin/python -m pip install -q -e ".[arm,test,apple,farm,models,qnn-llm,postgres]"
# Byte-compiled once here: an editable install leaves bundlerun's modules as .py only, and where
# PYTHONDONTWRITEBYTECODE is set (as on the machine these figures come from) every bundlerun process would compile
# them again on import: 83 modules, 0.36 s of each `bundlerun run` (cProfile). A stale .pyc is never used
# (its source's mtime is checked), so this is only ever a cache.
.venv/bin/python -m compileall -q bundles targets runner >/dev/null
# qnn://htp-sim: Qualcomm's x86_64 QNN libraries (HTP simulator) from PyPI's onnxruntime-qnn 2.5.0,
# hash-checked, unpacked to ~/.cache/bundlerun/qnn/2.49.40/ (never committed: Qualcomm's licence)
bash firmware_scripts/qnn/install_htp_sim.sh --python .venv/bin/python >/dev/null
# labgrid (labgrid://) in a venv of its own: its pyserial-labgrid fork installs over pyserial's
# `serial` files, which bundlerun's serial lane needs as they are. bundlerun runs
# targets/labgrid_agent.py with this venv's python; the labgrid:// tests run its coordinator/exporter.
if [ ! -x .venv-labgrid/bin/python ]; then
  "$PY" -m venv .venv-labgrid
fi
.venv-labgrid/bin/python -m pip show labgrid 2>/dev/null | grep -qx 'Version: 26.0.1' \
  || .venv-labgrid/bin/python -m pip install -q "labgrid==26.0.1"

if [ "$WITH_SYSTEM_PACKAGES" = "1" ]; then
  missing=()
  command -v adb >/dev/null 2>&1 || missing+=(adb)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v qemu-system-arm >/dev/null 2>&1 || missing+=(qemu-system-arm)
  command -v qemu-aarch64 >/dev/null 2>&1 || missing+=(qemu-user)
  command -v ssh-keyscan >/dev/null 2>&1 || missing+=(openssh-client)
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)  # the ssh:// tests start their own sshd
  command -v arm-none-eabi-g++ >/dev/null 2>&1 || missing+=(gcc-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib)
  command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu)
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
  command -v gcc >/dev/null 2>&1 || missing+=(gcc)  # the QEMU instruction-count plugin (build_qemu_plugin.sh)
  command -v ccache >/dev/null 2>&1 || missing+=(ccache)  # runner builds share compiles (firmware_scripts/lib/et_sources.sh et_ccache)
  command -v curl >/dev/null 2>&1 || missing+=(curl)  # fetches that plugin's header from Debian's QEMU source
  command -v ser2net >/dev/null 2>&1 || [ -x /usr/sbin/ser2net ] || missing+=(ser2net)  # labgrid exporter in the labgrid:// tests
  [ -f /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || missing+=(mesa-vulkan-drivers)  # vulkan://lavapipe's driver
  [ -e /usr/lib/x86_64-linux-gnu/libvulkan.so.1 ] || missing+=(libvulkan1)  # the Vulkan loader
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)  # tests/pg_server.py: a private server
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = "0" ]; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "note: install ${missing[*]} (sudo apt-get install ${missing[*]}) for the Android and HTML-report tests" >&2
    fi
  fi
fi
# ExecuTorch's own runners, built from source into the content-addressed cache
# (~/.cache/bundlerun/runners/; a second call returns at once): the Arm runner for
# qemu://mps3-an547, the aarch64 executor_runner (portable + quantized kernels + XNNPACK with KleidiAI)
# for qemu-user:// and the Android tests, bundlerun's aarch64 debug runner (`bundlerun debug` on adb:// /
# qemu-user://; made by the same build, so its line is a cache hit) and the QEMU instruction-count plugin.
BUILD_RUNNERS="${BUILD_RUNNERS:-$WITH_SYSTEM_PACKAGES}"
if [ "$BUILD_RUNNERS" = "1" ]; then
  for build in "firmware_scripts/arm/build_qemu_runner.sh --jobs 2" \
               "firmware_scripts/android/build_executor_runner.sh --toolchain gnu --jobs 2" \
               "firmware_scripts/android/build_executor_runner.sh --toolchain gnu --debug-runner --jobs 2" \
               "firmware_scripts/arm/build_qemu_plugin.sh" \
               "firmware_scripts/vulkan/build_vulkan_runner.sh --jobs 2" \
               "firmware_scripts/vulkan/fetch_lavapipe_backports.sh" \
               "firmware_scripts/mlx/build_mlx_runner.sh --jobs 2"; do  # mlx://cpu: ExecuTorch's C++ MLX delegate
    log="$(mktemp)"
    start=$(date +%s)
    if ! PYTHON="$PWD/.venv/bin/python" bash $build >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      echo "setup: building a runner failed: $build" >&2
      exit 1
    fi
    echo "runner ready in $(( $(date +%s) - start )) s: $(tail -n 1 "$log")"
    rm -f "$log"
  done
fi
echo "bundlerun is set up: $(.venv/bin/bundlerun --version)"
