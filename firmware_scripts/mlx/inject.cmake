# ExecuTorch's MLX delegate (backends/mlx/runtime), built against an installed MLX (the `mlx` wheel's
# libmlx.so + headers + CMake config) and linked into ExecuTorch's own executor_runner.
#
# build_mlx_runner.sh configures ExecuTorch's top-level CMakeLists.txt with EXECUTORCH_BUILD_MLX=OFF
# and -DCMAKE_PROJECT_executorch_INCLUDE=<this file>. Why not EXECUTORCH_BUILD_MLX=ON: at the pinned
# commit backends/mlx/CMakeLists.txt always builds MLX from its git submodule (not in the source
# tarball) with ExternalProject as a Metal-only static library (MLX_BUILD_METAL=ON,
# MLX_BUILD_CPU=OFF), and has no way to use an installed MLX. CMake includes this file inside
# ExecuTorch's `project(executorch ...)` call, before any library exists, so the delegate is added
# by a deferred call that runs at the end of ExecuTorch's top-level CMakeLists.txt, where
# executorch_core and the executor_runner target exist.
cmake_minimum_required(VERSION 3.24) # cmake_language(DEFER), $<LINK_LIBRARY:WHOLE_ARCHIVE,...>
set(BUNDLERUN_MLX_INJECT_DIR "${CMAKE_CURRENT_LIST_DIR}")
cmake_language(DEFER DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" CALL include
               "${BUNDLERUN_MLX_INJECT_DIR}/mlx_delegate.cmake")
