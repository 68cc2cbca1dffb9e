# Included inside KleidiAI's project() call (-DCMAKE_PROJECT_KleidiAI_INCLUDE=<this file>, passed by
# build_executor_runner.sh when XNNPACK is built with KleidiAI).
#
# Why: Debian 12's aarch64-linux-gnu-gcc 12.2 dies with an internal compiler error in its loop
# vectorizer on KleidiAI's bf16 packing kernels, e.g.
#   kai_lhs_quant_pack_qai8dxp_bf16_neon.c:64:6: internal compiler error: in vect_transform_reduction,
#   at tree-vect-loop.cc:7457
# KleidiAI's kernels are hand-written intrinsics/assembly, and KleidiAI itself compiles its SME files with
# -fno-tree-vectorize (kleidiai/CMakeLists.txt): the same flag for the bf16 C files, with GCC < 13 only.
# Deferred to the end of KleidiAI's CMakeLists.txt, after it set each file's COMPILE_OPTIONS.
if(CMAKE_C_COMPILER_ID STREQUAL "GNU" AND CMAKE_C_COMPILER_VERSION VERSION_LESS 13)
  cmake_language(DEFER CALL cmake_language EVAL CODE [[
    get_target_property(_bundlerun_kai_srcs kleidiai SOURCES)
    foreach(_src IN LISTS _bundlerun_kai_srcs)
      if(_src MATCHES "bf16[^/]*\\.c$")
        set_property(SOURCE "${_src}" APPEND PROPERTY COMPILE_OPTIONS "-fno-tree-vectorize")
      endif()
    endforeach()
    message(STATUS "bundlerun: KleidiAI bf16 C kernels built with -fno-tree-vectorize (GCC ${CMAKE_C_COMPILER_VERSION} vectorizer ICE)")
  ]])
endif()
