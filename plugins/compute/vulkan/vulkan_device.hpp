// One Vulkan device: instance, queue, memory, pipelines and submission. Shared (shared_ptr) by the
// Compute object and every buffer it hands out, so buffers may outlive the Compute safely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/sdk/sdk.hpp"
#include "vulkan_loader.hpp"

namespace colibri::vulkan {

// A VkBuffer with its own memory, mapped when host-visible, reachable by device address.
struct Allocation {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
  VkDeviceAddress address = 0;
  std::size_t size = 0;
  bool device_local_heap = false;  // counted against the device budget
  std::uint64_t charged = 0;       // bytes of device memory it holds
};

struct ContextOptions {
  std::int64_t device_index = 0;
  bool map_device_memory = true;   // map device-local memory on unified-memory devices
  bool import_host_memory = true;  // run host tensors in place (VK_EXT_external_memory_host)
  // Tests only: the n-th submission of queued commands fails as a lost device would (0: none).
  std::int64_t fail_queued_submission = 0;
};

class Context;

// A submitted command buffer and its fence; wait() may be called from any thread, many times.
class Submission {
 public:
  Submission(std::shared_ptr<Context> ctx, VkCommandBuffer cmd, VkFence fence)
      : ctx_(std::move(ctx)), cmd_(cmd), fence_(fence) {}
  ~Submission();
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;

  sdk::Status wait() noexcept;
  [[nodiscard]] bool ready() noexcept;

 private:
  // Marks it done, handing over the command buffer and fence to free (after mu_ is released).
  void finish_locked(VkCommandBuffer& cmd, VkFence& fence) noexcept;
  std::shared_ptr<Context> ctx_;
  std::mutex mu_;
  VkCommandBuffer cmd_;
  VkFence fence_;
  bool done_ = false;
  sdk::Status status_;
};

class Context : public std::enable_shared_from_this<Context> {
 public:
  // Creates the instance and the device; every failure says which device and what is missing.
  static sdk::Expected<std::shared_ptr<Context>> create(const ContextOptions& options, sdk::HostServices* host);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Api& api() const noexcept { return api_; }
  VkDevice device() const noexcept { return device_; }
  // Name, memory (budget-aware) and capabilities of the device in use, refreshed on each call.
  sdk::DeviceInfo info() noexcept;
  [[nodiscard]] bool device_memory_mapped() const noexcept { return device_mapped_; }

  // Device-local memory for Compute::allocate, or host-visible coherent memory for staging.
  sdk::Expected<Allocation> allocate(std::size_t bytes, bool host_visible) noexcept;
  void release(Allocation& a) noexcept;

  // Host memory [ptr, ptr + bytes) wrapped as a buffer the shaders read and write in place
  // (VK_EXT_external_memory_host), so host tensors need no copies; `address` points at ptr.
  // unsupported when the device cannot import; the caller then stages. Release with release().
  sdk::Expected<Allocation> import_host(void* ptr, std::size_t bytes) noexcept;

  // Staging buffers are pooled: take one of at least `bytes`, give it back when the GPU is done.
  sdk::Expected<Allocation> take_staging(std::size_t bytes) noexcept;
  void give_staging(Allocation a) noexcept;

  // The compute pipeline of an embedded shader, created on first use.
  sdk::Expected<VkPipeline> pipeline(std::string_view shader) noexcept;
  VkPipelineLayout pipeline_layout() const noexcept { return layout_; }

  // Records commands with `record`, submits them; the returned submission signals completion.
  sdk::Expected<std::shared_ptr<Submission>> submit(const std::function<void(VkCommandBuffer)>& record) noexcept;

  // Every submission so far has completed.
  sdk::Status wait_idle() noexcept;

  // One compute dispatch of an op: its pipeline, push constants and grid.
  struct Dispatch {
    VkPipeline pipeline = VK_NULL_HANDLE;
    std::vector<std::byte> push;
    std::uint32_t groups[3] = {1, 1, 1};
  };
  // Records dispatches into `cmd`, a barrier between each two (each sees what the one before wrote).
  void record_commands(VkCommandBuffer cmd, const std::vector<Dispatch>& commands) const noexcept;

  // Ops on device buffers alone where buffers are not mapped (a discrete GPU's path): run() leaves their dispatches
  // here instead of submitting and waiting for each, and flush_deferred() submits all of them as one command buffer
  // before anything that must come after them on the queue (another submission: a copy, an op that waits) or see
  // their results. Nothing on the host reads or writes such buffers but through this queue.
  // A failure of queued commands (not submitted, or failed on the GPU) is kept until a caller can be told: the
  // next flush_deferred(), settle_deferred() or take_deferred_error() returns it, once.
  // Appends one op's dispatches.
  void defer(std::vector<Dispatch> commands);
  // Submits what is queued; a failure stays kept (an upload: the prefetch that makes one may not look).
  void submit_deferred() noexcept;
  // Submits what is queued, then returns the failure kept so far, if any (this submission's or an earlier one's).
  sdk::Status flush_deferred() noexcept;
  // flush_deferred, also waiting for every queued submission still running: before memory they use is freed.
  sdk::Status settle_deferred() noexcept;
  // settle_deferred where nobody can be told (a buffer's destructor): a failure stays kept for the next call.
  void wait_deferred() noexcept;
  sdk::Status take_deferred_error() noexcept;

  sdk::HostServices* host() const noexcept { return host_; }

 private:
  friend class Submission;
  Context() = default;
  sdk::Status init(const ContextOptions& options);
  int find_memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags required, VkMemoryPropertyFlags preferred) const;
  void free_command(VkCommandBuffer cmd, VkFence fence) noexcept;
  void keep_deferred_error(sdk::Status s) noexcept;
  // Drops the queued submissions that have finished, keeping a failure; queue_mu_ held.
  void drop_finished_locked() noexcept;

  Api api_;
  sdk::HostServices* host_ = nullptr;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::uint32_t queue_family_ = 0;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props_{};
  VkPhysicalDeviceMemoryProperties mem_props_{};
  bool has_budget_ = false;
  bool has_host_import_ = false;
  VkDeviceSize import_alignment_ = 0;
  bool device_mapped_ = false;
  int device_type_index_ = -1;   // memory type of Compute buffers
  int staging_type_index_ = -1;  // host-visible coherent (cached when possible)
  std::string name_;
  std::string capabilities_;

  std::recursive_mutex queue_mu_;  // the queue and the command pool, and the deferred commands below
  std::vector<Dispatch> deferred_;
  std::vector<std::shared_ptr<Submission>> deferred_running_;  // flushed, maybe not finished (each holds this Context)
  sdk::Status deferred_error_;
  std::int64_t queued_submissions_ = 0;
  std::int64_t fail_queued_submission_ = 0;
  std::mutex mem_mu_;
  std::uint64_t device_bytes_in_use_ = 0;
  std::vector<Allocation> idle_staging_;
  std::size_t idle_staging_bytes_ = 0;
  std::mutex pipe_mu_;
  std::map<std::string, VkPipeline, std::less<>> pipelines_;
};

// "what: VK_ERROR_..." as a Status (out_of_memory for the memory errors).
sdk::Status vk_error(std::string_view what, VkResult result);

}  // namespace colibri::vulkan
