# Runs at the end of ExecuTorch's top-level CMakeLists.txt (deferred by inject.cmake).
#
# The library is what backends/mlx/CMakeLists.txt's `mlxdelegate` compiles (MLXLoader.cpp,
# MLXBackend.cpp, mlx_mutable_state.cpp, with the generated MLXLoader.{h,cpp} + schema_generated.h
# that build_mlx_runner.sh made with the source's own generate.py), plus the KV-cache registry
# MLXBackend.cpp binds to (extension/llm/cache/cache_registry.cpp; ExecuTorch builds it only under
# EXECUTORCH_BUILD_EXTENSION_LLM, which also wants the tokenizers submodule). Differences from
# ExecuTorch's own target, each for a reason:
#   * MLX is the installed wheel's shared libmlx.so (find_package(MLX) in BUNDLERUN_MLX_CMAKE_DIR),
#     not a static Metal build of the submodule;
#   * C++20 for these four files only: the mlx 0.32 headers need it (`bool operator==(...) const =
#     default` in mlx/device.h:29); the rest of ExecuTorch stays at its C++17;
#   * -Wall without -Werror: ExecuTorch's flags are tuned for Apple clang, this is GCC.
# The executor_runner links the library whole-archive (its static registration of "MLXBackend" has
# no other reference) and finds libmlx.so through RUNPATH $ORIGIN/mlx/lib, where
# build_mlx_runner.sh copies the wheel's library (and its bundled BLAS/LAPACK beside, in the
# wheel's own relative layout), so the cached runner does not depend on the venv staying as it is.
if(NOT TARGET executor_runner)
  message(FATAL_ERROR "bundlerun MLX: EXECUTORCH_BUILD_EXECUTOR_RUNNER=ON is required")
endif()
if(NOT BUNDLERUN_MLX_CMAKE_DIR)
  message(FATAL_ERROR "bundlerun MLX: pass -DBUNDLERUN_MLX_CMAKE_DIR=<mlx wheel>/share/cmake/MLX")
endif()
find_package(MLX CONFIG REQUIRED PATHS "${BUNDLERUN_MLX_CMAKE_DIR}" NO_DEFAULT_PATH)

set(_bundlerun_mlx_rt "${CMAKE_CURRENT_SOURCE_DIR}/backends/mlx/runtime")
foreach(_generated MLXLoader.h MLXLoader.cpp schema_generated.h)
  if(NOT EXISTS "${_bundlerun_mlx_rt}/${_generated}")
    message(FATAL_ERROR "bundlerun MLX: ${_bundlerun_mlx_rt}/${_generated} is missing: run "
                        "backends/mlx/serialization/generate.py --flatc FLATC first (build_mlx_runner.sh does)")
  endif()
endforeach()

set(_bundlerun_mlx_srcs
    "${_bundlerun_mlx_rt}/MLXLoader.cpp"
    "${_bundlerun_mlx_rt}/MLXBackend.cpp"
    "${_bundlerun_mlx_rt}/mlx_mutable_state.cpp"
)
if(NOT TARGET extension_llm_cache)
  list(APPEND _bundlerun_mlx_srcs "${CMAKE_CURRENT_SOURCE_DIR}/extension/llm/cache/cache_registry.cpp")
endif()
add_library(bundlerun_mlxdelegate STATIC ${_bundlerun_mlx_srcs})
set_target_properties(bundlerun_mlxdelegate PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON
                                                       POSITION_INDEPENDENT_CODE ON)
target_include_directories(bundlerun_mlxdelegate PRIVATE "${_bundlerun_mlx_rt}"
                           "${CMAKE_CURRENT_SOURCE_DIR}/third-party/flatbuffers/include")
target_compile_options(bundlerun_mlxdelegate PRIVATE -Wall -Wno-deprecated-declarations)
target_link_libraries(bundlerun_mlxdelegate PRIVATE executorch_core mlx)
if(TARGET extension_llm_cache)
  target_link_libraries(bundlerun_mlxdelegate PRIVATE extension_llm_cache)
endif()

target_link_libraries(executor_runner PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,bundlerun_mlxdelegate>" mlx)
set_target_properties(executor_runner PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH "\$ORIGIN/mlx/lib")
message(STATUS "bundlerun: MLX delegate linked into executor_runner (MLX ${MLX_VERSION} from ${BUNDLERUN_MLX_CMAKE_DIR})")
