// bundlerun: stands in for torchao's header of this name, which ExecuTorch's
// extension/llm/custom_ops/op_sdpa_impl.h includes for its int8 (quantized KV
// cache) SDPA only. torchao (third-party/ao) is not in bundlerun's source set,
// so that path aborts with a clear message instead of computing anything.
// See ../../../../../../llm_ops.cmake.
#pragma once

#include <cstdint>

#include <executorch/runtime/platform/assert.h>

namespace torchao::kernels::cpu::quantized_matmul {

using int8_a_int8_b_channelwise_fp32_c_qmatmul_type = void (*)(
    int, int, int, const void*, int, const void*, int, float*, int,
    const int8_t*, const int8_t*, const float*, const float*, const int,
    const int);

using fp32_a_input_channelwise_8bit_b_f32_c_matmul_type = void (*)(
    int, int, int, const float*, int, const int8_t*, int, float*, int,
    const int8_t*, const float*, const float, const int);

[[noreturn]] inline void bundlerun_no_quantized_sdpa() {
  ET_CHECK_MSG(
      false,
      "llama::custom_quantized_sdpa (int8 KV cache) is not built into this "
      "runner: torchao's kernels are not in bundlerun's source set");
  __builtin_unreachable();
}

inline int8_a_int8_b_channelwise_fp32_c_qmatmul_type
get_int8_a_int8_b_channelwise_qmatmul(int, int, int, bool, bool, int&, int&) {
  bundlerun_no_quantized_sdpa();
}

inline fp32_a_input_channelwise_8bit_b_f32_c_matmul_type
get_fp32_a_input_channelwise_8bit_b_f32_c_matmul(
    int, int, int, bool, bool, int&, int&) {
  bundlerun_no_quantized_sdpa();
}

} // namespace torchao::kernels::cpu::quantized_matmul
