// bench --ops: a compute backend wrapped so that every call the engine makes is counted and timed on the host.
// On a synchronous backend (the CPU) an op's time is its compute; on an asynchronous one (CUDA, Vulkan) it is what
// queueing the op costs the host, and the host's waits show up under synchronize and the event waits. That split is
// the question a slow decode asks: launches, waits, or the kernels themselves.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "colibri/sdk/compute.hpp"

namespace colibri::engine {

struct OpTime {
  std::string name;  // an op's name, or "copy to device", "copy to host", "synchronize", "event wait"
  std::uint64_t calls = 0;
  double seconds = 0;
};

class TimedCompute final : public sdk::Compute {
 public:
  explicit TimedCompute(std::shared_ptr<sdk::Compute> inner) : inner_(std::move(inner)) {}

  // Every op and call with at least one call since the last reset, ops first (in the SDK's order).
  [[nodiscard]] std::vector<OpTime> totals() const;
  void reset();

  [[nodiscard]] void* query_interface(std::string_view id) noexcept override { return inner_->query_interface(id); }
  [[nodiscard]] std::span<const sdk::DeviceInfo> devices() const noexcept override { return inner_->devices(); }
  sdk::Expected<std::unique_ptr<sdk::Buffer>> allocate(std::size_t bytes) noexcept override {
    return inner_->allocate(bytes);
  }
  [[nodiscard]] bool supports(sdk::Op op, sdk::DType type) const noexcept override {
    return inner_->supports(op, type);
  }
  sdk::Status run(const sdk::OpCall& call) noexcept override;
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_device_async(const void* src, sdk::Buffer& dst, std::size_t offset,
                                                                  std::size_t bytes) noexcept override;
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_host_async(const sdk::Buffer& src, std::size_t offset, void* dst,
                                                                std::size_t bytes) noexcept override;
  sdk::Status synchronize() noexcept override;

  // Counters, one per op and per other call; relaxed atomics: uploads run on other threads than the ops.
  struct Counter {
    std::atomic<std::uint64_t> calls{0};
    std::atomic<std::uint64_t> nanoseconds{0};
    void add(std::uint64_t ns) noexcept {
      calls.fetch_add(1, std::memory_order_relaxed);
      nanoseconds.fetch_add(ns, std::memory_order_relaxed);
    }
  };

 private:
  enum Other { kCopyToDevice, kCopyToHost, kSynchronize, kEventWait, kOthers };
  std::shared_ptr<sdk::Compute> inner_;
  std::array<Counter, static_cast<std::size_t>(sdk::Op::count_)> ops_;
  std::array<Counter, kOthers> others_;
};

}  // namespace colibri::engine
