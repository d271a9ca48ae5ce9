#include "colibri/sdk/dtype.hpp"

#include <array>

namespace colibri::sdk {

namespace {

// GGML block layouts: QK8_0 = QK4_0 = 32, QK_K = 256.
constexpr std::array<DTypeTraits, 22> kTraits{{
    {DType::f32, "f32", 1, 4, false},      {DType::f16, "f16", 1, 2, false},
    {DType::q4_0, "q4_0", 32, 18, true},   {DType::q4_1, "q4_1", 32, 20, true},
    {DType::q5_0, "q5_0", 32, 22, true},   {DType::q5_1, "q5_1", 32, 24, true},
    {DType::q8_0, "q8_0", 32, 34, true},   {DType::q8_1, "q8_1", 32, 36, true},
    {DType::q2_k, "q2_k", 256, 84, true},  {DType::q3_k, "q3_k", 256, 110, true},
    {DType::q4_k, "q4_k", 256, 144, true}, {DType::q5_k, "q5_k", 256, 176, true},
    {DType::q6_k, "q6_k", 256, 210, true}, {DType::q8_k, "q8_k", 256, 292, true},
    {DType::i8, "i8", 1, 1, false},        {DType::i16, "i16", 1, 2, false},
    {DType::i32, "i32", 1, 4, false},      {DType::i64, "i64", 1, 8, false},
    {DType::f64, "f64", 1, 8, false},      {DType::bf16, "bf16", 1, 2, false},
    {DType::mxfp4, "mxfp4", 32, 17, true}, {DType::iq4_nl, "iq4_nl", 32, 18, true},
}};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

}  // namespace

const DTypeTraits* dtype_traits(DType type) noexcept {
  return dtype_traits_by_id(static_cast<std::uint32_t>(type));
}

const DTypeTraits* dtype_traits_by_id(std::uint32_t ggml_id) noexcept {
  for (const auto& t : kTraits) {
    if (static_cast<std::uint32_t>(t.type) == ggml_id) return &t;
  }
  return nullptr;
}

std::optional<DType> parse_dtype(std::string_view name) noexcept {
  for (const auto& t : kTraits) {
    if (iequals(t.name, name)) return t.type;
  }
  return std::nullopt;
}

std::string_view to_string(DType type) noexcept {
  const auto* t = dtype_traits(type);
  return t ? t->name : "unknown";
}

std::size_t data_alignment(DType type) noexcept {
  const auto* t = dtype_traits(type);
  if (t == nullptr || type == DType::mxfp4) return 1;
  if (!t->quantized) return t->block_bytes;
  return type == DType::q8_k ? 4 : 2;
}

std::size_t row_bytes(DType type, std::int64_t n) noexcept {
  const auto* t = dtype_traits(type);
  if (t == nullptr || n < 0 || n % t->block_elems != 0) return 0;
  return static_cast<std::size_t>(n / t->block_elems) * t->block_bytes;
}

}  // namespace colibri::sdk
