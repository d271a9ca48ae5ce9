// AVX2 row kernels (avx2 + fma + f16c; FMA itself is never used so the bits match the scalar path).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "kernels.hpp"

namespace colibri::cpu {
namespace {

#define KTARGET [[maybe_unused]] __attribute__((target("avx2,fma,f16c")))
#define X86_DOT_U8S8 x86_dot_u8s8
#include "kernels_x86.inc"
#undef X86_DOT_U8S8

#define Y_VNNI 0
#include "kernels_x86_tiles.inc"
#undef Y_VNNI
#undef KTARGET

}  // namespace

const KernelSet& avx2_kernels() noexcept {
  static constexpr KernelSet set = x86_kernel_set("avx2");
  // The initializer is positional: a member left out shifts the last one, and the path silently runs scalar code.
  static_assert(set.swiglu == x86_swiglu && set.mxfp4 == x86_dot_mxfp4 &&
                    set.tile_rows_mxfp4 == y_tile_rows<YTile<X86Q32::mxfp4>> &&
                    set.tile_rows_q4_0 == y_tile_rows<YTile<X86Q32::q4_0>> &&
                    set.tile_rows_q6_k == x86_tile_rows_k<X86Q6K, x86_rows_k<XQ6K>> &&
                    set.tile_rows_q8_0 == y_tile_rows<YTile<X86Q32::q8_0>> && set.rows_q4_0 == y_rows_q4_0 &&
                    set.tile_rows_q3_k == x86_tile_rows_k<X86Q3K, x86_rows_k<XQ3K>>,
                "list every KernelSet member");
  return set;
}

}  // namespace colibri::cpu
