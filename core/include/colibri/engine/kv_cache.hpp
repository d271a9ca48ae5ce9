// The KV cache: per layer, K and V rows of head_dim for every (position, kv head), stored as f16 (default), q8_0 or
// f32. The attention op reads it as {head_dim, n_kv_heads, positions}. In host memory, or in a compute backend's
// buffers (a discrete GPU's memory): attention then reads it in place instead of receiving the whole prefix over the
// bus at every layer of every token; a write sends only the new rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "colibri/engine/memory.hpp"
#include "colibri/sdk/compute.hpp"
#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::engine {

class KvCache {
 public:
  // Bytes one position takes over all layers (K and V).
  static std::uint64_t bytes_per_position(sdk::DType type, std::int64_t layers, std::int64_t kv_heads,
                                          std::int64_t head_dim);
  // type: f16, q8_0 (head_dim a multiple of 32) or f32; errors name the type and why. With `device`, the rows live
  // in buffers from device->allocate() (one per layer for K and one for V); an allocation that fails is an error.
  static sdk::Expected<KvCache> create(sdk::DType type, std::int64_t layers, std::int64_t kv_heads,
                                       std::int64_t head_dim, std::int64_t context,
                                       std::shared_ptr<sdk::Compute> device = nullptr);

  // Stores T positions starting at `position`: k and v are f32 {head_dim, kv_heads, T}.
  sdk::Status write(std::int64_t layer, std::int64_t position, std::int64_t count, const float* k, const float* v);
  // Whether store() can run: the cache is in device memory whose backend encodes rows there (Op::store_rows).
  [[nodiscard]] bool stores_on_device() const;
  // Stores T positions starting at `position` from k and v {head_dim * kv_heads, T} f32 tensors the cache's backend
  // reads (its device buffers): encoded there by store_rows, so nothing crosses the bus. Same bytes as write().
  sdk::Status store(std::int64_t layer, std::int64_t position, std::int64_t count, const sdk::Tensor& k,
                    const sdk::Tensor& v);
  // Views of positions [0, length) of a layer: host data, or a device buffer (data set only when it is mapped).
  [[nodiscard]] sdk::Tensor keys(std::int64_t layer, std::int64_t length) const;
  [[nodiscard]] sdk::Tensor values(std::int64_t layer, std::int64_t length) const;

  // Copies positions [0, count) of every layer from `src`, a cache of the same shape and type; both in host memory
  // (a device cache answers unsupported). The rows are the bytes `src` holds, so attention over them gives the bits
  // running those positions again would.
  sdk::Status copy_prefix_from(const KvCache& src, std::int64_t count);

  [[nodiscard]] std::int64_t context() const { return context_; }
  [[nodiscard]] sdk::DType type() const { return type_; }
  [[nodiscard]] std::uint64_t bytes() const { return total_bytes_; }
  [[nodiscard]] bool on_device() const { return device_ != nullptr; }

 private:
  // write() and store(): positions [position, position + count) of a layer fit the cache.
  [[nodiscard]] sdk::Status check_range(std::int64_t layer, std::int64_t position, std::int64_t count) const;
  // keys() or values(): one layer's rows in host memory or in its device buffer.
  [[nodiscard]] sdk::Tensor rows(const std::vector<AlignedBuffer>& host,
                                 const std::vector<std::unique_ptr<sdk::Buffer>>& dev, std::int64_t layer,
                                 std::int64_t length) const;

  sdk::DType type_ = sdk::DType::f16;
  std::int64_t layers_ = 0, kv_heads_ = 0, head_dim_ = 0, context_ = 0;
  std::size_t row_bytes_ = 0;
  std::uint64_t total_bytes_ = 0;
  std::vector<AlignedBuffer> k_, v_;
  std::shared_ptr<sdk::Compute> device_;                     // keeps the buffers' backend alive
  std::vector<std::unique_ptr<sdk::Buffer>> k_dev_, v_dev_;  // per layer, when on a device
  std::vector<std::byte> staging_;                           // new rows in the cache's type, on their way up
};

}  // namespace colibri::engine
