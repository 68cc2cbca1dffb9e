# bundlerun's debug runner, added to ExecuTorch's own top-level build (no copy of its build logic).
#
# build_executor_runner.sh --debug-runner configures ExecuTorch exactly as for the executor_runner and
# adds -DCMAKE_PROJECT_executorch_INCLUDE=<this file>. CMake includes it inside ExecuTorch's
# `project(executorch ...)` call, before any library exists, so the target itself is added by a
# deferred call that runs at the end of ExecuTorch's top-level CMakeLists.txt, where every library
# target and the executor_runner's link list (_executor_runner_libs) are defined.
cmake_minimum_required(VERSION 3.19) # cmake_language(DEFER)
# (a deferred call's arguments are expanded when it runs, in ExecuTorch's top-level directory scope,
# where this variable is still set)
set(BUNDLERUN_DEBUG_RUNNER_DIR "${CMAKE_CURRENT_LIST_DIR}")
set(BUNDLERUN_LLM_OPS_DIR "${CMAKE_CURRENT_LIST_DIR}/../llm_ops")
# first the LLM custom ops (only with -DBUNDLERUN_LLM_OPS=ON; they add to the runners' link list), then
# the debug runner, which links that list
cmake_language(DEFER DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" CALL include
               "${BUNDLERUN_LLM_OPS_DIR}/llm_ops.cmake")
cmake_language(DEFER DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" CALL include
               "${BUNDLERUN_DEBUG_RUNNER_DIR}/debug_runner.cmake")
