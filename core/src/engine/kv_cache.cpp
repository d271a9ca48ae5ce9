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
                                       std::int64_t context, std::shared_ptr<sdk::Compute> device) {
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
  c.total_bytes_ = 2ull * per_layer * static_cast<std::uint64_t>(layers);
  if (device) {
    for (std::int64_t l = 0; l < layers; ++l) {
      for (auto* list : {&c.k_dev_, &c.v_dev_}) {
        auto buf = device->allocate(per_layer);
        if (!buf) {
          return buf.error().with_context("allocating the KV cache of " + std::to_string(context) + " positions (" +
                                          std::to_string(c.total_bytes_) + " bytes) in device memory");
        }
        list->push_back(std::move(*buf));
      }
    }
    c.device_ = std::move(device);
    return c;
  }
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
  return c;
}

Status KvCache::check_range(std::int64_t layer, std::int64_t position, std::int64_t count) const {
  if (layer < 0 || layer >= layers_ || position < 0 || count < 0 || position + count > context_) {
    return Status(StatusCode::invalid_argument, "KV cache write outside the context");
  }
  return {};
}

Status KvCache::copy_prefix_from(const KvCache& src, std::int64_t count) {
  if (on_device() || src.on_device()) {
    return Status(StatusCode::unsupported, "copying KV rows between caches in device memory");
  }
  if (src.type_ != type_ || src.layers_ != layers_ || src.kv_heads_ != kv_heads_ || src.head_dim_ != head_dim_) {
    return Status(StatusCode::invalid_argument, "copying KV rows between caches of different shapes");
  }
  if (count < 0 || count > context_ || count > src.context_) {
    return Status(StatusCode::invalid_argument,
                  "copying " + std::to_string(count) + " KV positions into a context of " + std::to_string(context_));
  }
  const std::size_t bytes = static_cast<std::size_t>(count * kv_heads_) * row_bytes_;
  for (std::size_t l = 0; l < k_.size(); ++l) {
    std::memcpy(k_[l].data(), src.k_[l].data(), bytes);
    std::memcpy(v_[l].data(), src.v_[l].data(), bytes);
  }
  return {};
}

Status KvCache::write(std::int64_t layer, std::int64_t position, std::int64_t count, const float* k, const float* v) {
  if (auto s = check_range(layer, position, count); !s) return s;
  if (count == 0) return {};
  const std::int64_t n = count * kv_heads_ * head_dim_;
  const std::size_t at = static_cast<std::size_t>(position * kv_heads_) * row_bytes_;
  const std::size_t bytes = static_cast<std::size_t>(count * kv_heads_) * row_bytes_;
  const auto L = static_cast<std::size_t>(layer);
  auto encode = [&](const float* src, std::byte* dst) -> Status {
    if (type_ == DType::f32) {
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return {};
    }
    if (auto s = quant::quantize_row(type_, src, dst, n); !s) return s.with_context("storing the KV cache");
    return {};
  };
  for (int which = 0; which < 2; ++which) {
    const float* src = which == 0 ? k : v;
    sdk::Buffer* buffer = device_ ? (which == 0 ? k_dev_ : v_dev_)[L].get() : nullptr;
    std::byte* rows = nullptr;  // where attention reads them, when the host can write there
    if (buffer == nullptr) {
      rows = (which == 0 ? k_ : v_)[L].data() + at;
    } else if (auto* mapped = static_cast<std::byte*>(buffer->host_pointer())) {
      rows = mapped + at;
    }
    if (rows != nullptr) {
      if (auto s = encode(src, rows); !s) return s;
      continue;
    }
    // Unmapped device memory: encode the new rows in staging (f32 rows go as they are) and send only them up.
    const void* up = src;
    if (type_ != DType::f32) {
      staging_.resize(bytes);
      if (auto s = encode(src, staging_.data()); !s) return s;
      up = staging_.data();
    }
    auto ev = device_->copy_to_device_async(up, *buffer, at, bytes);
    if (!ev) return ev.error().with_context("uploading KV cache rows");
    // Waited here: the attention that reads these rows is the next op (copy_to_device_async is done with `up` at
    // return, so staging may be reused for V at once).
    if (auto s = (*ev)->wait(); !s) return s.with_context("uploading KV cache rows");
  }
  return {};
}

bool KvCache::stores_on_device() const {
  return device_ != nullptr && device_->supports(sdk::Op::store_rows, type_);
}

Status KvCache::store(std::int64_t layer, std::int64_t position, std::int64_t count, const sdk::Tensor& k,
                      const sdk::Tensor& v) {
  if (auto s = check_range(layer, position, count); !s) return s;
  if (!stores_on_device()) return Status(StatusCode::internal, "KV cache store() without a device that encodes rows");
  if (count == 0) return {};
  const auto L = static_cast<std::size_t>(layer);
  for (int which = 0; which < 2; ++which) {
    sdk::Tensor rows;
    rows.type = type_;
    rows.ne = {kv_heads_ * head_dim_, count, 1, 1};
    rows.buffer = (which == 0 ? k_dev_ : v_dev_)[L].get();
    rows.offset = static_cast<std::size_t>(position * kv_heads_) * row_bytes_;
    if (auto* mapped = static_cast<std::byte*>(rows.buffer->host_pointer())) rows.data = mapped + rows.offset;
    const sdk::Tensor& src = which == 0 ? k : v;
    sdk::OpCall call{sdk::Op::store_rows, std::span<const sdk::Tensor>(&src, 1), std::span<sdk::Tensor>(&rows, 1), {}};
    if (auto s = device_->run(call); !s) return s.with_context("storing the KV cache");
  }
  return {};
}

sdk::Tensor KvCache::keys(std::int64_t layer, std::int64_t length) const {
  return rows(k_, k_dev_, layer, length);
}

sdk::Tensor KvCache::values(std::int64_t layer, std::int64_t length) const {
  return rows(v_, v_dev_, layer, length);
}

sdk::Tensor KvCache::rows(const std::vector<AlignedBuffer>& host, const std::vector<std::unique_ptr<sdk::Buffer>>& dev,
                          std::int64_t layer, std::int64_t length) const {
  sdk::Tensor t;
  t.type = type_;
  t.ne = {head_dim_, kv_heads_, length, 1};
  const auto L = static_cast<std::size_t>(layer);
  if (device_) {
    t.buffer = dev[L].get();
    t.data = t.buffer->host_pointer();
  } else {
    t.data = host[L].data();
  }
  return t;
}

}  // namespace colibri::engine
