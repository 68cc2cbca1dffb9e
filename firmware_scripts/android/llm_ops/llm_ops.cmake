# Runs at the end of ExecuTorch's top-level CMakeLists.txt (deferred by ../debug_runner/inject.cmake),
# when the build script passes -DBUNDLERUN_LLM_OPS=ON: ExecuTorch's LLM custom-op kernels
# (extension/llm/custom_ops: llama::custom_sdpa.out, llama::sdpa_with_kv_cache.out,
# llama::update_cache.out, llama::fallback.out, llama::fast_hadamard_transform.out), linked whole-archive
# into the executor_runner (and the debug runner) as ExecuTorch's own CMakeLists.txt does for
# EXECUTORCH_BUILD_KERNELS_LLM (`$<LINK_LIBRARY:WHOLE_ARCHIVE,custom_ops>`: their registration is static).
#
# Why not EXECUTORCH_BUILD_KERNELS_LLM itself: it requires EXECUTORCH_BUILD_KERNELS_OPTIMIZED
# (tools/cmake/preset/default.cmake), whose eigen_blas builds third-party/eigen/blas, and its custom_ops
# library compiles op_moe.cpp against third-party/ao (torchao); neither submodule is in the source set
# (../../shared/third_party/SOURCES.md). So this compiles the same sources as custom_ops
# (shim_et/xplat/executorch/build/build_variables.bzl EXTENSION_LLM_CUSTOM_OPS_BUCK_SRCS + spinquant)
# without op_moe.cpp (llama::quantized_moe_ffn, MoE models only), and ExecuTorch's cpublas
# (kernels/optimized/blas) without -DET_BUILD_WITH_BLAS, i.e. its own portable gemm_impl in place of
# Eigen's sgemm. op_sdpa_impl.h includes one torchao header for the int8-KV-cache SDPA
# (llama::custom_quantized_sdpa.out): shim/ stands in for it and aborts with a clear message if that
# op is ever run (a program exported with a quantized KV cache cannot run on this runner).
if(NOT BUNDLERUN_LLM_OPS)
  return()
endif()
if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
  message(FATAL_ERROR "bundlerun LLM ops: built for aarch64 only (FFHT's fht_neon.c), not ${CMAKE_SYSTEM_PROCESSOR}")
endif()
set(_bundlerun_llm_srcs
    extension/llm/custom_ops/op_fallback.cpp
    extension/llm/custom_ops/op_fast_hadamard_transform.cpp
    extension/llm/custom_ops/op_sdpa.cpp
    extension/llm/custom_ops/op_update_cache.cpp
    extension/llm/custom_ops/spinquant/fast_hadamard_transform.cpp
    extension/llm/custom_ops/spinquant/third-party/FFHT/fht_neon.c
    kernels/optimized/blas/BlasKernel.cpp
    kernels/optimized/blas/CPUBlas.cpp
)
list(TRANSFORM _bundlerun_llm_srcs PREPEND "${EXECUTORCH_ROOT}/")
add_library(bundlerun_llm_ops STATIC ${_bundlerun_llm_srcs})
find_package_torch_headers()  # ATen/cpu/vec headers, as custom_ops does (tools/cmake/Utils.cmake)
target_include_directories(bundlerun_llm_ops PRIVATE "${BUNDLERUN_LLM_OPS_DIR}/shim"
                                                     ${TORCH_INCLUDE_DIRS})
target_link_libraries(bundlerun_llm_ops PUBLIC executorch_core kernels_util_all_deps extension_threadpool
                                               pthreadpool cpuinfo)
# custom_ops' and cpublas' own options (extension/llm/custom_ops/CMakeLists.txt, kernels/optimized/CMakeLists.txt)
target_compile_options(bundlerun_llm_ops PRIVATE -Wno-deprecated-declarations -Wno-psabi
                                                 "-march=armv8.2-a+dotprod")
target_link_libraries(executor_runner PRIVATE $<LINK_LIBRARY:WHOLE_ARCHIVE,bundlerun_llm_ops>)
list(APPEND _executor_runner_libs $<LINK_LIBRARY:WHOLE_ARCHIVE,bundlerun_llm_ops>)  # the debug runner's too
message(STATUS "bundlerun: LLM custom ops linked into executor_runner (bundlerun_llm_ops)")
