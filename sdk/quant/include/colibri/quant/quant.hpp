// Block formats bit-compatible with GGML: reference quantizers and dequantizers per type.
// (Interface agreed between the converter and the kernels; see core/src/quant/.)
//
// Compatibility contract: quantize_row produces exactly the bytes of ggml's quantize_row_*_ref (what
// llama-quantize writes without an importance matrix), and dequantize_row exactly the floats of ggml's
// dequantize_row_*. Golden vectors produced by ggml itself are checked in tests/unit/quant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::quant {

using sdk::DType;

// True for the types quantize_row/dequantize_row handle:
// f32, f16, bf16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, mxfp4.
bool is_supported(DType type) noexcept;

// Quantizes n floats (n a multiple of the type's block size) into dst (row_bytes(type, n) bytes),
// exactly as GGML's reference quantize_row_*_ref does. `importance` (n weights, may be empty)
// is reserved for imatrix-style quantization and ignored by the reference path.
// Several rows may be passed at once as one n: blocks never straddle rows when the row length is a
// multiple of the block size. Errors: invalid_argument (n not a whole number of blocks, null
// pointers), unsupported (a type outside the list above).
sdk::Status quantize_row(DType type, const float* src, void* dst, std::int64_t n,
                         std::span<const float> importance = {}) noexcept;

// Types dequantize_row also reads, beyond is_supported's: q4_1, q5_0, q5_1 and iq4_nl (what llama.cpp's quantizer
// writes for rows k-quants do not fit), so that convert can re-quantize them. They are never written or run.
bool can_dequantize(DType type) noexcept;

// Dequantizes n elements of `type` (can_dequantize) from src into dst. Uses the fastest instruction set of this
// CPU; every path gives the same bits as the scalar reference.
sdk::Status dequantize_row(DType type, const void* src, float* dst, std::int64_t n) noexcept;

// Instruction sets the hot paths are written for. AVX2 needs avx2+f16c, AVX-512 needs
// avx512f+avx512bw+avx512vl; FMA is never used, so results do not depend on the path.
enum class Isa : std::uint8_t { scalar, avx2, avx512 };

Isa best_isa() noexcept;                       // the path dequantize_row takes on this CPU
bool isa_available(Isa isa) noexcept;          // whether this CPU can run `isa`
std::string_view to_string(Isa isa) noexcept;  // "scalar", "avx2", "avx512"

// dequantize_row on a chosen path (tests and benchmarks). unsupported when the CPU lacks `isa`.
sdk::Status dequantize_row(DType type, const void* src, float* dst, std::int64_t n, Isa isa) noexcept;

// Bits of storage per weight of a block format (e.g. 4.5 for q4_k); 0 for an unknown type.
double bits_per_weight(DType type) noexcept;

}  // namespace colibri::quant
