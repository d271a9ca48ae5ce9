// AVX2 row kernels with AVX-VNNI (the VEX vpdpbusd of Intel's Alder Lake and later client CPUs, which have no
// AVX-512, and of AMD Zen 5): the AVX2 kernels and tiles with one vpdpbusd for each u8 x s8 dot instead of vpmaddubsw
// and vpmaddwd. Exact integer sums, so the scalar path's bits.
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

#define KTARGET [[maybe_unused]] __attribute__((target("avx2,fma,f16c,avxvnni")))
KTARGET inline __m256i v_dot_u8s8(__m256i u, __m256i s) noexcept {
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
}

#define X86_DOT_U8S8 v_dot_u8s8
#include "kernels_x86.inc"
#undef X86_DOT_U8S8

#define Y_VNNI 1
#include "kernels_x86_tiles.inc"
#undef Y_VNNI
#undef KTARGET

}  // namespace

const KernelSet& avxvnni_kernels() noexcept {
  static constexpr KernelSet set = x86_kernel_set("avxvnni");
  // The initializer is positional: a member left out shifts the last one, and the path silently runs scalar code.
  static_assert(set.swiglu == x86_swiglu && set.mxfp4 == x86_dot_mxfp4 &&
                    set.tile_rows_mxfp4 == y_tile_rows<YTile<X86Q32::mxfp4>> &&
                    set.tile_rows_q8_0 == y_tile_rows<YTile<X86Q32::q8_0>> &&
                    set.tile_rows_q4_0 == y_tile_rows<YTile<X86Q32::q4_0>> &&
                    set.tile_rows_q6_k == x86_tile_rows_k<X86Q6K, x86_rows_k<XQ6K>> && set.rows_q4_0 == y_rows_q4_0 &&
                    set.tile_rows_q3_k == x86_tile_rows_k<X86Q3K, x86_rows_k<XQ3K>>,
                "list every KernelSet member");
  return set;
}

}  // namespace colibri::cpu
