#include "colibri/engine/kv_cache.hpp"

#include <cstring>
#include <new>

#include "colibri/quant/quant.hpp"

namespace colibri::engine {

using sdk::DType;
using sdk::Status;
using sdk::StatusCode;

std::uint64_t KvCache::bytes_per_position(DType type, std::int64_t layers, std::int64_t kv_heads,
                                          std::int64_t head_dim) {
  return 2ull * static_cast<std::uint64_t>(layers * kv_heads) * sdk::row_bytes(type, head_dim);
}

sdk::Expected<KvCache> KvCache::create(DType type, std::int64_t layers, std::int64_t kv_heads, std::int64_t head_dim,
                                       std::int64_t context) {
  if (type != DType::f16 && type != DType::q8_0 && type != DType::f32) {
    return Status(StatusCode::invalid_argument,
                  "KV cache type " + std::string(sdk::to_string(type)) + " is not supported; use f16, q8_0 or f32");
  }
  if (sdk::row_bytes(type, head_dim) == 0) {
    return Status(StatusCode::invalid_argument, "KV cache type " + std::string(sdk::to_string(type)) +
                                                    " needs head_dim to be a multiple of its block size (head_dim " +
                                                    std::to_string(head_dim) + "); use --kv-type f16");
  }
  if (context <= 0) return Status(StatusCode::invalid_argument, "the context must hold at least one token");
  KvCache c;
  c.type_ = type;
  c.layers_ = layers;
  c.kv_heads_ = kv_heads;
  c.head_dim_ = head_dim;
  c.context_ = context;
  c.row_bytes_ = sdk::row_bytes(type, head_dim);
  const std::size_t per_layer = c.row_bytes_ * static_cast<std::size_t>(kv_heads * context);
  try {
    for (std::int64_t l = 0; l < layers; ++l) {
      c.k_.emplace_back(per_layer);
      c.v_.emplace_back(per_layer);
    }
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_memory, "cannot reserve " + std::to_string(2 * per_layer * layers) +
                                                 " bytes for the KV cache of " + std::to_string(context) +
                                                 " positions; lower --ctx or memory.kv_cache");
  }
  c.total_bytes_ = 2ull * per_layer * static_cast<std::uint64_t>(layers);
  return c;
}

Status KvCache::write(std::int64_t layer, std::int64_t position, std::int64_t count, const float* k, const float* v) {
  if (layer < 0 || layer >= layers_ || position < 0 || count < 0 || position + count > context_) {
    return Status(StatusCode::invalid_argument, "KV cache write outside the context");
  }
  const std::int64_t n = count * kv_heads_ * head_dim_;
  const std::size_t at = static_cast<std::size_t>(position * kv_heads_) * row_bytes_;
  for (int which = 0; which < 2; ++which) {
    std::byte* dst = (which == 0 ? k_ : v_)[static_cast<std::size_t>(layer)].data() + at;
    const float* src = which == 0 ? k : v;
    if (type_ == DType::f32) {
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
    } else if (auto s = quant::quantize_row(type_, src, dst, n); !s) {
      return s.with_context("storing the KV cache");
    }
  }
  return {};
}

sdk::Tensor KvCache::keys(std::int64_t layer, std::int64_t length) const {
  sdk::Tensor t;
  t.type = type_;
  t.ne = {head_dim_, kv_heads_, length, 1};
  t.data = k_[static_cast<std::size_t>(layer)].data();
  return t;
}

sdk::Tensor KvCache::values(std::int64_t layer, std::int64_t length) const {
  sdk::Tensor t = keys(layer, length);
  t.data = v_[static_cast<std::size_t>(layer)].data();
  return t;
}

}  // namespace colibri::engine
