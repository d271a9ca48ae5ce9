// compute/cuda: the Compute object, its device buffers, pinned staging and copy events.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "colibri/sdk/device_copies.hpp"
#include "colibri/sdk/sdk.hpp"

namespace colibri::cuda {

sdk::Status cuda_status(cudaError_t e, const std::string& what, sdk::StatusCode code = sdk::StatusCode::internal);

// Page-locked host memory, pooled: cudaHostAlloc is slow (it maps pages for the device), so freed
// blocks are kept (up to a cap) and reused by later copies.
class PinnedPool {
 public:
  struct Block {
    void* ptr = nullptr;
    std::size_t capacity = 0;
  };
  explicit PinnedPool(std::size_t keep_bytes) : keep_bytes_(keep_bytes) {}
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  sdk::Expected<Block> take(std::size_t bytes);
  void give(Block b) noexcept;

 private:
  std::mutex mu_;
  std::multimap<std::size_t, void*> free_;  // capacity -> block
  std::size_t kept_ = 0;
  std::size_t keep_bytes_;
};

class CudaBuffer;

// What every object of one Compute shares; buffers and events keep it alive.
struct Device {
  int index = 0;
  cudaDeviceProp prop{};
  cudaStream_t compute = nullptr;  // ops
  cudaStream_t copy = nullptr;     // copy_to_*_async, so uploads overlap ops
  PinnedPool pinned{std::size_t{512} << 20};

  // Copies after ops. run() does not wait for kernels that touch only device buffers; it records the op stream in
  // ring[stamp % kRing] and stamps the buffers it bound. A copy into or out of a buffer first makes the copy stream
  // wait for the buffer's stamp (a later record of the same slot is later work on the same stream: still safe).
  static constexpr std::uint64_t kRing = 64;
  std::array<cudaEvent_t, kRing> ring{};
  std::mutex ring_mu;
  std::uint64_t stamps = 0;

  // CUDA graphs (compute option `graphs`). run() captures the kernels of a call on device buffers alone instead of
  // launching them, and whatever must see their effects launches what was captured first (flush_graph): a copy, a
  // wait, a call with host tensors or a status word, a buffer freed. The kernels between two such points (a decode
  // layer's) are one graph launch; a later segment with the same nodes updates that graph's instantiation
  // (cudaGraphExecUpdate: new pointers and positions) instead of instantiating it again.
  struct Graphs {
    bool enabled = false;
    std::mutex mu;                         // run() holds it for the whole call while enabled; every flush takes it
    std::atomic<bool> capturing{false};    // written under mu; read without it to skip the lock when false
    std::vector<const CudaBuffer*> bound;  // used by the captured kernels: stamped when the graph is launched
    std::unordered_map<std::uint64_t, cudaGraphExec_t> execs;  // by the segment's node types and kernels
    std::uint64_t losses = 0;  // segments whose kernels never ran (a capture or launch that failed)
    // A loss found where nobody could be told (a buffer's destructor): the next run(), copy or synchronize says it.
    sdk::Status lost;
    std::atomic<bool> lost_pending{false};
    sdk::HostServices* host = nullptr;  // counters; null once the Compute object is gone
  } graphs;

  ~Device();
  // Makes this device current for the calling thread (the CUDA runtime's current device is per thread).
  [[nodiscard]] sdk::Status use() const;
  // Starts capturing the op stream (graphs on, not capturing yet); a failure leaves the ops to run as they come.
  void begin_graph_locked();
  // Launches what was captured since begin_graph_locked (nothing when not capturing); an error means those kernels
  // did not run (counted in graphs.losses) or could not be waited for. The caller holds graphs.mu where graphs are on.
  sdk::Status flush_graph_locked() noexcept;
  // The loss kept for later (flush_graph_or_keep), once. Under graphs.mu.
  sdk::Status take_lost_locked();
  // Copies and synchronize(): flush_graph_locked under graphs.mu, then any loss kept for later.
  sdk::Status flush_graph();
  // Buffer destructors: as flush_graph, a loss kept for the next call to report.
  void flush_graph_or_keep() noexcept;
  // Records the ops queued so far; returns their stamp (0 if recording failed: the caller then waits for them).
  std::uint64_t record_ops();
  // Makes `stream` wait for the ops of `stamp` (0: none); with a null stream, the calling thread waits.
  cudaError_t after_ops(std::uint64_t stamp, cudaStream_t stream);
};

class CudaBuffer final : public sdk::Buffer {
 public:
  CudaBuffer(std::shared_ptr<Device> dev, void* ptr, std::size_t size) : dev_(std::move(dev)), ptr_(ptr), size_(size) {}
  ~CudaBuffer() override;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  [[nodiscard]] std::size_t size() const noexcept override { return size_; }
  [[nodiscard]] void* host_pointer() noexcept override { return nullptr; }
  [[nodiscard]] std::byte* device_pointer() const noexcept { return static_cast<std::byte*>(ptr_); }
  [[nodiscard]] const Device* device() const noexcept { return dev_.get(); }
  // The stamp of the last run() that bound this buffer and did not wait for its kernels (Device::record_ops).
  mutable std::atomic<std::uint64_t> last_ops{0};

 private:
  std::shared_ptr<Device> dev_;
  void* ptr_;
  std::size_t size_;
};

// A copy in flight on the copy stream. Finishing it (wait, ready, or synchronize) copies a download
// from staging to the caller's memory and returns the staging block.
struct PendingCopy {
  std::shared_ptr<Device> dev;
  cudaEvent_t done = nullptr;
  PinnedPool::Block staging;
  void* host_dst = nullptr;  // downloads only
  std::size_t bytes = 0;
  std::mutex mu;
  bool finished = false;
  sdk::Status status;

  sdk::Status finish(bool block) noexcept;
  [[nodiscard]] bool is_finished() noexcept;
};

class CudaCompute final : public sdk::Compute, public sdk::ComputeHostRegister, public sdk::ComputeDeviceCopy {
 public:
  static sdk::Expected<std::unique_ptr<CudaCompute>> create(const sdk::CreateContext& ctx);
  explicit CudaCompute(std::shared_ptr<Device> dev, bool routed_experts = false, bool graphs = false,
                       sdk::HostServices* host = nullptr);
  ~CudaCompute() override;

  [[nodiscard]] std::span<const sdk::DeviceInfo> devices() const noexcept override;
  sdk::Expected<std::unique_ptr<sdk::Buffer>> allocate(std::size_t bytes) noexcept override;
  [[nodiscard]] bool supports(sdk::Op op, sdk::DType weight_type) const noexcept override;
  sdk::Status run(const sdk::OpCall& call) noexcept override;
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_device_async(const void* src, sdk::Buffer& dst, std::size_t offset,
                                                                  std::size_t bytes) noexcept override;
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_host_async(const sdk::Buffer& src, std::size_t offset, void* dst,
                                                                std::size_t bytes) noexcept override;
  sdk::Status synchronize() noexcept override;
  // run() stages host tensors through pinned memory, so the engine may keep activations on the host; registered
  // host memory (cudaHostRegister) is uploaded straight from where it is, without the staging copy.
  [[nodiscard]] void* query_interface(std::string_view id) noexcept override {
    if (id == sdk::kHostTensorsInterface) return this;
    if (id == sdk::kHostRegisterInterface) return static_cast<sdk::ComputeHostRegister*>(this);
    if (id == sdk::kDeviceCopyInterface) return static_cast<sdk::ComputeDeviceCopy*>(this);
    return nullptr;
  }
  // cudaMemcpyAsync device to device on the copy stream.
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_between_async(const sdk::Buffer& src, std::size_t src_offset,
                                                                sdk::Buffer& dst, std::size_t dst_offset,
                                                                std::size_t bytes) noexcept override;
  sdk::Status register_host(void* ptr, std::size_t bytes) noexcept override;
  void unregister_host(void* ptr) noexcept override;

 private:
  friend class Binder;
  sdk::Status run_impl(const sdk::OpCall& call);
  sdk::Status run_routed(const sdk::OpCall& call);
  // The device copy of routed_key_ (every expert's W_gate, then W_up, then W_down pointers), uploaded if not cached.
  sdk::Expected<const void* const*> routed_table();
  sdk::Expected<const CudaBuffer*> own_buffer(const sdk::Buffer& b, std::size_t offset, std::size_t bytes,
                                              const char* what) const;
  // Queues the copy on the copy stream after the ops using `buffer` (and `other`, a device-to-device copy's second
  // buffer).
  sdk::Expected<std::unique_ptr<sdk::Event>> start_copy(std::shared_ptr<PendingCopy> copy, const CudaBuffer& buffer,
                                                        void* to, const void* from, cudaMemcpyKind kind,
                                                        const CudaBuffer* other = nullptr);
  sdk::Status grow(void*& ptr, std::size_t& capacity, std::size_t bytes, bool pinned, const char* what);

  std::shared_ptr<Device> dev_;
  mutable std::mutex info_mu_;
  mutable std::vector<sdk::DeviceInfo> devices_;
  sdk::CopiesInFlight<PendingCopy> copies_;
  // Host regions registered with cudaHostRegister: start -> bytes.
  [[nodiscard]] bool registered(const void* src, std::size_t bytes) const;
  mutable std::mutex registered_mu_;
  std::map<const std::byte*, std::size_t> registered_;
  // Ops run one at a time: the arenas and the status word are shared.
  std::mutex run_mu_;
  void* arena_ = nullptr;  // device copies of host tensors, and expert_ffn's intermediates
  std::size_t arena_size_ = 0;
  void* staging_ = nullptr;  // pinned mirror of the host tensors of one call
  std::size_t staging_size_ = 0;
  std::int32_t* status_dev_ = nullptr;  // error word of embedding / topk
  std::int32_t* status_host_ = nullptr;
  // expert_ffn_routed (option routed_experts). Its kernels read each expert's weights through a device table of
  // pointers. A layer passes the same experts every token, so tables are kept, keyed by their contents, in slabs of
  // device memory each mirrored by pinned memory that stays the source of its tables' uploads: no slot is written
  // twice while its slab is in use, so an upload still queued never sees its source change.
  bool routed_experts_ = false;
  struct TableSlab {
    const void** host = nullptr;  // pinned
    const void** device = nullptr;
    std::size_t used = 0, capacity = 0;  // pointers
  };
  std::vector<TableSlab> table_slabs_;
  std::uint64_t tables_losses_ = 0;  // graphs.losses when the tables were last known uploaded
  std::map<std::vector<const void*>, const void* const*> tables_;
  std::size_t table_pointers_ = 0;
  std::vector<const void*> routed_key_;
};

}  // namespace colibri::cuda
