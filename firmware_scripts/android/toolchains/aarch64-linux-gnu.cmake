# CMake toolchain file: aarch64 Linux (glibc) with Debian's gcc-aarch64-linux-gnu /
# g++-aarch64-linux-gnu. Binaries run on an arm64 Linux/Android shell or under qemu-aarch64.
# Modelled on ExecuTorch's examples/riscv/riscv64-linux-gnu-toolchain.cmake.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER "aarch64-linux-gnu-gcc" CACHE FILEPATH "aarch64 cross C compiler")
set(CMAKE_CXX_COMPILER "aarch64-linux-gnu-g++" CACHE FILEPATH "aarch64 cross C++ compiler")
set(CMAKE_AR "aarch64-linux-gnu-ar" CACHE FILEPATH "aarch64 archiver")
set(CMAKE_RANLIB "aarch64-linux-gnu-ranlib" CACHE FILEPATH "aarch64 ranlib")
set(CMAKE_STRIP "aarch64-linux-gnu-strip" CACHE FILEPATH "aarch64 strip")

# Sysroot installed by the Debian package libc6-dev-arm64-cross.
set(CMAKE_FIND_ROOT_PATH "/usr/aarch64-linux-gnu")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Tests that run compiled probes (try_run) execute them under qemu-aarch64.
find_program(_BUNDLERUN_QEMU_AARCH64 qemu-aarch64)
if(_BUNDLERUN_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${_BUNDLERUN_QEMU_AARCH64};-L;/usr/aarch64-linux-gnu")
endif()
