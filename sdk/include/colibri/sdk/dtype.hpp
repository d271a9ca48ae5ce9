// Tensor element types. Numeric ids and block layouts are those of GGML, so a GGUF tensor is
// copied byte for byte and results can be compared with llama.cpp on identical weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace colibri::sdk {

enum class DType : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq4_nl = 20,  // llama.cpp's fallback for rows k-quants do not fit: read (dequantized by convert), not run
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  bf16 = 30,
  mxfp4 = 39,  // OCP microscaling FP4 (gpt-oss's experts): an optional weight type (the CPU backend runs it)
};

struct DTypeTraits {
  DType type;
  std::string_view name;      // "q4_k" (GGML spells it "q4_K"; parse accepts both)
  std::uint32_t block_elems;  // elements per block (1 for plain types)
  std::uint32_t block_bytes;  // bytes per block
  bool quantized;
};

// Traits of the types colibri knows; nullptr for an id it does not.
const DTypeTraits* dtype_traits(DType type) noexcept;
const DTypeTraits* dtype_traits_by_id(std::uint32_t ggml_id) noexcept;
std::optional<DType> parse_dtype(std::string_view name) noexcept;
std::string_view to_string(DType type) noexcept;

// Bytes of a row of n elements; 0 when n is not a whole number of blocks.
std::size_t row_bytes(DType type, std::int64_t n) noexcept;

// The alignment data of `type` must start at, its widest field's: 4 for f32 (and q8_k's f32 scale), 2 for f16, bf16
// and the fp16 scales of GGML blocks, 1 for mxfp4 (bytes only); 1 for an unknown type.
std::size_t data_alignment(DType type) noexcept;

}  // namespace colibri::sdk
