// AVX2 row kernels (avx2 + fma + f16c; FMA itself is never used so the bits match the scalar path).
#include <immintrin.h>

#include <cstring>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "kernels.hpp"

namespace colibri::cpu {
namespace {

#define KTARGET [[maybe_unused]] __attribute__((target("avx2,fma,f16c")))
#include "kernels_x86.inc"
#undef KTARGET

}  // namespace

const KernelSet& avx2_kernels() noexcept {
  static constexpr KernelSet set{"avx2",       x86_dot_f32,  x86_dot_f16,  x86_dot_bf16, x86_dot_q8_0, x86_dot_q4_0,
                                 x86_dot_q2_k, x86_dot_q3_k, x86_dot_q4_k, x86_dot_q5_k, x86_dot_q6_k};
  return set;
}

}  // namespace colibri::cpu
