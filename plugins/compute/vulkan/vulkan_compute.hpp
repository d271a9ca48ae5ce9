// compute/vulkan: the Compute object, its buffers and copy events.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "colibri/sdk/device_copies.hpp"
#include "colibri/sdk/sdk.hpp"
#include "vulkan_device.hpp"

namespace colibri::vulkan {

class VulkanBuffer final : public sdk::Buffer {
 public:
  VulkanBuffer(std::shared_ptr<Context> ctx, Allocation a, std::size_t size)
      : ctx_(std::move(ctx)), a_(a), size_(size) {}
  ~VulkanBuffer() override {
    // Queued commands and copies in flight may use it: finished first (as cudaFree waits for the device).
    ctx_->wait_deferred();
    std::vector<std::shared_ptr<Submission>> copies;
    {
      std::lock_guard lock(copies_mu_);
      copies.swap(copies_);
    }
    for (auto& c : copies) (void)c->wait();  // the copy's own event reports its failure
    ctx_->release(a_);
  }
  VulkanBuffer(const VulkanBuffer&) = delete;
  VulkanBuffer& operator=(const VulkanBuffer&) = delete;

  [[nodiscard]] std::size_t size() const noexcept override { return size_; }
  [[nodiscard]] void* host_pointer() noexcept override { return a_.mapped; }
  [[nodiscard]] const void* mapped() const noexcept { return a_.mapped; }
  [[nodiscard]] VkBuffer buffer() const noexcept { return a_.buffer; }
  [[nodiscard]] VkDeviceAddress address() const noexcept { return a_.address; }
  [[nodiscard]] const Context* context() const noexcept { return ctx_.get(); }
  // A copy into or out of it, waited for before its memory goes; finished ones are dropped here.
  void copy_started(std::shared_ptr<Submission> copy) const noexcept;

 private:
  std::shared_ptr<Context> ctx_;
  Allocation a_;
  std::size_t size_;
  mutable std::mutex copies_mu_;
  mutable std::vector<std::shared_ptr<Submission>> copies_;
};

// A copy through a staging buffer. Finishing it (wait, ready, or Compute::synchronize) copies
// downloaded bytes to the caller's memory and returns the staging buffer to the pool.
struct PendingCopy {
  std::shared_ptr<Context> ctx;
  std::shared_ptr<Submission> submission;
  Allocation staging;        // none for a copy between two buffers
  void* host_dst = nullptr;  // downloads only
  std::size_t bytes = 0;
  std::mutex mu;
  bool finished = false;
  sdk::Status status;

  sdk::Status finish(bool block) noexcept;
  [[nodiscard]] bool is_finished() noexcept;
};

// One command of an op: a shader, its push constants and its grid. Commands of one run() are
// recorded into one command buffer with a barrier after each.
struct Command {
  std::string shader;
  std::vector<std::byte> push;
  std::uint32_t groups[3] = {1, 1, 1};
};

class VulkanCompute final : public sdk::Compute, public sdk::ComputeDeviceCopy {
 public:
  static sdk::Expected<std::unique_ptr<VulkanCompute>> create(const sdk::CreateContext& ctx);
  explicit VulkanCompute(std::shared_ptr<Context> ctx);
  ~VulkanCompute() override;

  [[nodiscard]] std::span<const sdk::DeviceInfo> devices() const noexcept override;
  sdk::Expected<std::unique_ptr<sdk::Buffer>> allocate(std::size_t bytes) noexcept override;
  [[nodiscard]] bool supports(sdk::Op op, sdk::DType weight_type) const noexcept override;
  sdk::Status run(const sdk::OpCall& call) noexcept override;
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_device_async(const void* src, sdk::Buffer& dst, std::size_t offset,
                                                                  std::size_t bytes) noexcept override;
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_host_async(const sdk::Buffer& src, std::size_t offset, void* dst,
                                                                std::size_t bytes) noexcept override;
  sdk::Status synchronize() noexcept override;
  // vkCmdCopyBuffer on the queue (a memcpy between mapped buffers).
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_between_async(const sdk::Buffer& src, std::size_t src_offset,
                                                                sdk::Buffer& dst, std::size_t dst_offset,
                                                                std::size_t bytes) noexcept override;
  // Host tensors are imported or staged per call (ops.cpp Binder), so the engine may mix them with our buffers.
  [[nodiscard]] void* query_interface(std::string_view id) noexcept override {
    if (id == sdk::kHostTensorsInterface) return this;
    if (id == sdk::kDeviceCopyInterface) return static_cast<sdk::ComputeDeviceCopy*>(this);
    return nullptr;
  }

 private:
  sdk::Status run_impl(const sdk::OpCall& call, bool defer);
  // Whether run() may leave the call's commands to a later submission (Context::defer): memory not mapped, every
  // tensor in a buffer of ours, and nothing to read back (embedding's status word, expert_ffn_routed's choice).
  [[nodiscard]] bool deferrable(const sdk::OpCall& call) const;
  sdk::Expected<const VulkanBuffer*> own_buffer(const sdk::Buffer& b, std::size_t offset, std::size_t bytes,
                                                const char* what) const;
  sdk::Status ensure_scratch(std::size_t bytes);
  // expert_ffn_routed: the address of a NaN followed by d_bytes of zeros (host-visible, written once).
  sdk::Expected<std::uint64_t> routed_constants(std::size_t d_bytes);
  // Room for `count` addresses the shaders read (host pointer, device address): a ring, reused after the queued
  // commands that read it have finished.
  sdk::Expected<std::pair<std::uint64_t*, std::uint64_t>> routed_table_space(std::size_t count);
  // The bytes of a host tensor, or of one in our buffer (a download, waited for).
  sdk::Status read_back(const sdk::Tensor& t, void* dst, std::size_t bytes, const char* what);

  std::shared_ptr<Context> ctx_;
  mutable std::mutex info_mu_;
  mutable std::vector<sdk::DeviceInfo> devices_;
  sdk::CopiesInFlight<PendingCopy> copies_;
  std::mutex run_mu_;  // ops run one at a time: scratch and status buffers are shared
  Allocation scratch_;
  Allocation status_;
  Allocation routed_consts_;  // expert_ffn_routed: a NaN, then D zeros (host-visible, read by the shaders)
  Allocation routed_tables_;  // expert_ffn_routed on the device: each call's expert addresses (host-visible ring)
  std::size_t routed_tables_used_ = 0;
};

}  // namespace colibri::vulkan
