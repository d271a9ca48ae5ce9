// compute kind: devices, buffers, asynchronous copies and the op set the runtime needs. Ops are
// dispatched through one OpCall so new ops extend the enum instead of the vtable. The CPU backend
// is the reference every other backend is tested against.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/plugin.hpp"

namespace colibri::sdk {

struct DeviceInfo {
  std::string name;
  bool host_memory = true;             // buffers are plain host memory (CPU backend, unified iGPU)
  std::uint64_t memory_total = 0;      // bytes of device memory (0 for the host)
  std::uint64_t memory_available = 0;  // free bytes right now
  std::string capabilities;            // "avx512 vnni", "sm_90", ...
};

enum class Op : std::uint32_t {
  matmul,        // out[t, n] = sum_k w[n, k] * x[t, k]; w in any block format, 1..N tokens
  expert_ffn,    // fused down(silu(gate x) * up x) for one expert's tokens
  rms_norm,
  rope,
  attention,     // causal attention of new tokens over the KV cache
  swiglu,
  add,
  topk_routing,  // router logits -> expert ids and weights
  embedding,     // rows of a (quantized) table
  count_
};

// A dense or block-quantized tensor of up to 4 dims, ne[0] fastest. `data` is a host pointer for
// host-visible buffers; device backends use `buffer` + `offset`.
struct Tensor {
  DType type = DType::f32;
  std::array<std::int64_t, 4> ne{1, 1, 1, 1};
  void* data = nullptr;
  class Buffer* buffer = nullptr;
  std::size_t offset = 0;
};

struct OpParams {
  float eps = 0.0f;            // rms_norm
  float rope_theta = 0.0f;     // rope
  std::int32_t rope_dims = 0;  // rope: rotated dims per head
  std::int32_t position = 0;   // rope / attention: first position of the batch
  std::int32_t n_heads = 0;
  std::int32_t n_kv_heads = 0;
  std::int32_t top_k = 0;      // topk_routing
  std::int32_t flags = 0;      // op-specific bit flags
  float scale = 1.0f;
};

struct OpCall {
  Op op = Op::matmul;
  std::span<const Tensor> inputs;
  std::span<Tensor> outputs;
  OpParams params;
};

class Buffer {
 public:
  virtual ~Buffer() = default;
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
  [[nodiscard]] virtual void* host_pointer() noexcept = 0;  // nullptr when not host-visible
};

class Event {
 public:
  virtual ~Event() = default;
  virtual Status wait() noexcept = 0;
  [[nodiscard]] virtual bool ready() const noexcept = 0;
};

class Compute : public PluginObject {
 public:
  [[nodiscard]] virtual std::span<const DeviceInfo> devices() const noexcept = 0;
  virtual Expected<std::unique_ptr<Buffer>> allocate(std::size_t bytes) noexcept = 0;
  [[nodiscard]] virtual bool supports(Op op, DType weight_type) const noexcept = 0;
  virtual Status run(const OpCall& call) noexcept = 0;
  // Copies between host memory and a buffer; the event completes when the data has arrived.
  virtual Expected<std::unique_ptr<Event>> copy_to_device_async(const void* src, Buffer& dst, std::size_t offset,
                                                                std::size_t bytes) noexcept = 0;
  virtual Expected<std::unique_ptr<Event>> copy_to_host_async(const Buffer& src, std::size_t offset, void* dst,
                                                              std::size_t bytes) noexcept = 0;
  virtual Status synchronize() noexcept = 0;
};

// An event that is complete at construction: what synchronous backends return.
class CompletedEvent final : public Event {
 public:
  explicit CompletedEvent(Status status = {}) : status_(std::move(status)) {}
  Status wait() noexcept override { return status_; }
  [[nodiscard]] bool ready() const noexcept override { return true; }

 private:
  Status status_;
};

// Correct defaults for host-memory backends: copies are memcpy and complete immediately.
class ComputeBase : public Compute {
 public:
  Expected<std::unique_ptr<Event>> copy_to_device_async(const void* src, Buffer& dst, std::size_t offset,
                                                        std::size_t bytes) noexcept override;
  Expected<std::unique_ptr<Event>> copy_to_host_async(const Buffer& src, std::size_t offset, void* dst,
                                                      std::size_t bytes) noexcept override;
  Status synchronize() noexcept override { return {}; }
};

}  // namespace colibri::sdk
