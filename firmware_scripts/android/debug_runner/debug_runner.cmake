# Runs at the end of ExecuTorch's top-level CMakeLists.txt (deferred by inject.cmake): the debug runner
# links exactly what the executor_runner links (runtime, portable + quantized kernels, etdump, flatccrt,
# bundled_program, gflags, the backends built in).
if(NOT EXECUTORCH_BUILD_EXECUTOR_RUNNER OR NOT EXECUTORCH_ENABLE_EVENT_TRACER
   OR NOT EXECUTORCH_ENABLE_BUNDLE_IO)
  message(FATAL_ERROR "bundlerun_debug_runner needs EXECUTORCH_BUILD_EXECUTOR_RUNNER, "
                      "EXECUTORCH_ENABLE_EVENT_TRACER and EXECUTORCH_ENABLE_BUNDLE_IO")
endif()
add_executable(bundlerun_debug_runner "${BUNDLERUN_DEBUG_RUNNER_DIR}/debug_runner.cpp")
if(NOT CMAKE_BUILD_TYPE STREQUAL "Debug")
  target_link_options_gc_sections(bundlerun_debug_runner)
endif()
target_link_libraries(bundlerun_debug_runner PRIVATE ${_executor_runner_libs})
target_compile_options(bundlerun_debug_runner PUBLIC ${_common_compile_options})
message(STATUS "bundlerun: debug runner target bundlerun_debug_runner (${BUNDLERUN_DEBUG_RUNNER_DIR})")
