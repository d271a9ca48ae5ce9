// A compute backend with device memory for unit tests of what the engine keeps there (VRAM tier, KV cache).
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "colibri/quant/quant.hpp"
#include "colibri/sdk/compute.hpp"
#include "colibri/sdk/device_copies.hpp"

namespace colibri::testing {

// A compute backend with device memory: buffers are not host-visible (unless `mapped`) and uploads land only when
// their event is waited on, so weights used before the wait would show the old bytes. Like the real backends it
// stages the source at the call, which may then be reused (sdk/compute.hpp), unless the source lies in memory
// registered through kHostRegisterInterface (offered when `offer_register`): that is read only at the wait, like
// DMA, so a source reused before then shows.
// With `offer_device_copy` it also copies between its buffers (kDeviceCopyInterface), reading the source at the wait.
class DeviceCompute final : public sdk::Compute, public sdk::ComputeHostRegister, public sdk::ComputeDeviceCopy {
 public:
  class DeviceBuffer final : public sdk::Buffer {
   public:
    DeviceBuffer(DeviceCompute& owner, std::size_t n) : owner_(owner), bytes(n) {}
    ~DeviceBuffer() override { owner_.allocated -= bytes.size(); }
    std::size_t size() const noexcept override { return bytes.size(); }
    void* host_pointer() noexcept override { return owner_.mapped ? bytes.data() : nullptr; }
    DeviceCompute& owner_;
    std::vector<std::byte> bytes;
  };
  class LateCopy final : public sdk::Event {
   public:
    LateCopy(const void* src, std::byte* dst, std::size_t n, bool direct)
        : dst_(dst), n_(n), direct_(direct ? static_cast<const std::byte*>(src) : nullptr) {
      if (!direct) staged_.assign(static_cast<const std::byte*>(src), static_cast<const std::byte*>(src) + n);
    }
    sdk::Status wait() noexcept override {
      if (!done_) std::memcpy(dst_, direct_ != nullptr ? direct_ : staged_.data(), n_);
      done_ = true;
      return {};
    }
    bool ready() const noexcept override { return done_; }

   private:
    std::vector<std::byte> staged_;
    std::byte* dst_;
    std::size_t n_;
    const std::byte* direct_;
    bool done_ = false;
  };

  bool offer_register = false;
  bool refuse_register = false;
  int register_calls = 0;
  int direct_copies = 0;
  std::map<const std::byte*, std::size_t> registered;
  bool offer_device_copy = false;
  int device_copies = 0;
  void* query_interface(std::string_view id) noexcept override {
    if (offer_register && id == sdk::kHostRegisterInterface) return static_cast<sdk::ComputeHostRegister*>(this);
    if (offer_device_copy && id == sdk::kDeviceCopyInterface) return static_cast<sdk::ComputeDeviceCopy*>(this);
    return nullptr;
  }
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_between_async(const sdk::Buffer& src, std::size_t src_offset,
                                                                sdk::Buffer& dst, std::size_t dst_offset,
                                                                std::size_t bytes) noexcept override {
    auto both = sdk::own_copy_buffers<DeviceBuffer>(src, src_offset, dst, dst_offset, bytes, "fake",
                                                    [this](const DeviceBuffer& b) { return &b.owner_ == this; });
    if (!both) return both.error();
    ++device_copies;
    auto& to = static_cast<DeviceBuffer&>(dst);
    return std::unique_ptr<sdk::Event>(
        std::make_unique<LateCopy>(both->first->bytes.data() + src_offset, to.bytes.data() + dst_offset, bytes, true));
  }
  sdk::Status register_host(void* ptr, std::size_t bytes) noexcept override {
    ++register_calls;
    if (refuse_register) return sdk::Status(sdk::StatusCode::out_of_memory, "no pinnable memory (test)");
    registered[static_cast<const std::byte*>(ptr)] = bytes;
    return {};
  }
  void unregister_host(void* ptr) noexcept override { registered.erase(static_cast<const std::byte*>(ptr)); }
  bool in_registered(const void* p, std::size_t n) const {
    const auto* b = static_cast<const std::byte*>(p);
    auto it = registered.upper_bound(b);
    return it != registered.begin() && b + n <= std::prev(it)->first + std::prev(it)->second;
  }

  bool mapped = false;
  std::uint64_t allocated = 0, peak_allocated = 0;
  int copies = 0;
  std::vector<sdk::DeviceInfo> info{{"fake gpu", false, 1ull << 30, 1ull << 30, ""}};

  std::span<const sdk::DeviceInfo> devices() const noexcept override { return info; }
  std::uint64_t allocate_limit = ~0ull;  // allocations past this many bytes in all fail, like a full GPU
  sdk::Expected<std::unique_ptr<sdk::Buffer>> allocate(std::size_t bytes) noexcept override {
    if (allocated + bytes > allocate_limit) return sdk::Status(sdk::StatusCode::out_of_memory, "device full (test)");
    allocated += bytes;
    peak_allocated = std::max(peak_allocated, allocated);
    return std::unique_ptr<sdk::Buffer>(std::make_unique<DeviceBuffer>(*this, bytes));
  }
  bool supports(sdk::Op, sdk::DType) const noexcept override { return true; }
  // Ops do nothing, except store_rows (KV rows encoded in device memory), which encodes as the SDK states.
  int store_rows_calls = 0;
  sdk::Status run(const sdk::OpCall& call) noexcept override {
    if (call.op != sdk::Op::store_rows) return {};
    ++store_rows_calls;
    const sdk::Tensor &x = call.inputs[0], &y = call.outputs[0];
    auto bytes_of = [](const sdk::Tensor& t) -> std::byte* {
      if (t.buffer == nullptr) return static_cast<std::byte*>(t.data);
      return static_cast<DeviceBuffer*>(t.buffer)->bytes.data() + t.offset;
    };
    const auto* src = reinterpret_cast<const float*>(bytes_of(x));
    const std::int64_t n = sdk::element_count(x);
    if (y.type == sdk::DType::f32) {
      std::memcpy(bytes_of(y), src, static_cast<std::size_t>(n) * sizeof(float));
      return {};
    }
    return quant::quantize_row(y.type, src, bytes_of(y), n);
  }
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_device_async(const void* src, sdk::Buffer& dst, std::size_t offset,
                                                                  std::size_t bytes) noexcept override {
    auto& b = static_cast<DeviceBuffer&>(dst);
    if (offset + bytes > b.bytes.size()) return sdk::Status(sdk::StatusCode::invalid_argument, "overrun");
    ++copies;
    const bool direct = in_registered(src, bytes);
    direct_copies += direct ? 1 : 0;
    return std::unique_ptr<sdk::Event>(std::make_unique<LateCopy>(src, b.bytes.data() + offset, bytes, direct));
  }
  int downloads = 0;
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_host_async(const sdk::Buffer& src, std::size_t offset, void* dst,
                                                                std::size_t bytes) noexcept override {
    const auto& b = static_cast<const DeviceBuffer&>(src);
    if (offset + bytes > b.bytes.size()) return sdk::Status(sdk::StatusCode::invalid_argument, "overrun");
    ++downloads;
    return std::unique_ptr<sdk::Event>(
        std::make_unique<LateCopy>(b.bytes.data() + offset, static_cast<std::byte*>(dst), bytes, false));
  }
  sdk::Status synchronize() noexcept override { return {}; }
};

}  // namespace colibri::testing
