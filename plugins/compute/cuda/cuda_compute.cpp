// compute/cuda: the plugin entry, score() and the Compute object's buffers and copies.
//
// The CUDA runtime is linked statically (cudart_static), and it opens the driver (libcuda.so.1)
// itself at first use, so the plugin loads on machines without a driver. score() looks for the
// driver library and the GPU device nodes and initialises CUDA only where the nodes are hidden
// (sandboxes). Whether a usable device exists is known only in create(), which answers
// `unsupported` with the reason.
#include "cuda_compute.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "cuda_kernels.hpp"

namespace colibri::cuda {

using sdk::Expected;
using sdk::Status;
using sdk::StatusCode;

Status cuda_status(cudaError_t e, const std::string& what, StatusCode code) {
  return Status(code, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

namespace {

// "the NVIDIA driver is not installed" / "cannot be loaded", or empty when libcuda.so.1 opens.
std::string driver_library_problem() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    return std::string("the NVIDIA driver is not installed (libcuda.so.1 cannot be loaded: ") + (e ? e : "not found") +
           "); install the NVIDIA driver to use the CUDA backend";
  }
  dlclose(h);
  return {};
}

std::string driver_version_text() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  std::getline(in, line);
  const auto pos = line.find("Kernel Module");
  if (pos == std::string::npos) return {};
  std::string rest = line.substr(pos + 13);
  rest.erase(0, rest.find_first_not_of(" \t"));
  return rest.substr(0, rest.find_first_of(" \t"));
}

bool gpu_device_node_exists() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it("/dev", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() > 6 && n.rfind("nvidia", 0) == 0 &&
        std::all_of(n.begin() + 6, n.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return true;
    }
  }
  return false;
}

sdk::Score score(const sdk::HostInfo& /*host*/) noexcept {
  try {
    if (std::string p = driver_library_problem(); !p.empty()) return {0, p};
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr && (*v == '\0' || *v == '-')) {
      return {0, std::string("CUDA_VISIBLE_DEVICES=\"") + v + "\" hides every CUDA device"};
    }
    if (!gpu_device_node_exists()) {
      // Sandboxes may hide the device nodes from /dev: only then ask the driver itself.
      int count = 0;
      const cudaError_t e = cudaGetDeviceCount(&count);
      cudaGetLastError();
      if (e != cudaSuccess || count == 0) {
        return {0, std::string("the NVIDIA driver is installed but no CUDA device is present (no /dev/nvidia<N> "
                               "device node; the driver says: ") +
                       (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")"};
      }
    }
    const std::string version = driver_version_text();
    return {500, "NVIDIA GPU with driver " + (version.empty() ? std::string("(version unknown)") : version)};
  } catch (...) {
    return {0, "probing for CUDA failed"};
  }
}

const sdk::OptionSpec kOptions[] = {
    {"routed_experts", sdk::OptionType::boolean, "false",
     "run expert_ffn_routed on the device (the engine's decode then waits for the router's choice once per token, "
     "not once per layer); off until measured on a GPU"},
    {"graphs", sdk::OptionType::boolean, "false",
     "queue the kernels between two waits or copies (a decode layer's) as one CUDA graph launch instead of a launch "
     "each; off until measured on a GPU"},
};

// What plugins list shows (supports() decides): as the ops and types run_impl has kernels for.
const char* const kCapabilities[] = {"matmul",
                                     "expert_ffn",
                                     "expert_ffn_group",
                                     "attention",
                                     "f32",
                                     "f16",
                                     "bf16",
                                     "q8_0",
                                     "q4_0",
                                     "q2_k",
                                     "q3_k",
                                     "q4_k",
                                     "q5_k",
                                     "q6_k",
                                     "mxfp4",
                                     "device_memory",
                                     "batch_invariant"};

}  // namespace

// ---------------------------------------------------------------------------------------- pinned pool

PinnedPool::~PinnedPool() {
  for (auto& [cap, p] : free_) cudaFreeHost(p);
}

Expected<PinnedPool::Block> PinnedPool::take(std::size_t bytes) {
  {
    std::lock_guard lock(mu_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * std::max<std::size_t>(bytes, 1 << 20)) {
      Block b{it->second, it->first};
      kept_ -= it->first;
      free_.erase(it);
      return b;
    }
  }
  // Power-of-two sizes from 64 KiB, so blocks are reused across copies of similar size.
  const std::size_t cap = std::bit_ceil(std::max<std::size_t>(bytes, 64 << 10));
  void* p = nullptr;
  if (cudaError_t e = cudaHostAlloc(&p, cap, cudaHostAllocPortable); e != cudaSuccess) {
    cudaGetLastError();
    return cuda_status(e, "allocating " + std::to_string(cap) + " bytes of pinned host memory",
                       StatusCode::out_of_memory);
  }
  return Block{p, cap};
}

void PinnedPool::give(Block b) noexcept {
  if (b.ptr == nullptr) return;
  std::lock_guard lock(mu_);
  if (kept_ + b.capacity > keep_bytes_) {
    cudaFreeHost(b.ptr);
    return;
  }
  kept_ += b.capacity;
  free_.emplace(b.capacity, b.ptr);
}

// ---------------------------------------------------------------------------------------- device

Device::~Device() {
  (void)use();
  if (graphs.capturing.load()) {  // unreachable while a Compute object lives (its destructor flushes)
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(compute, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  if (compute != nullptr) cudaStreamSynchronize(compute);
  for (auto& [key, exec] : graphs.execs) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : ring) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (compute != nullptr) cudaStreamDestroy(compute);
  if (copy != nullptr) cudaStreamDestroy(copy);
}

std::uint64_t Device::record_ops() {
  std::lock_guard lock(ring_mu);
  const std::uint64_t stamp = stamps + 1;
  if (cudaEventRecord(ring[stamp % kRing], compute) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  stamps = stamp;
  return stamp;
}

cudaError_t Device::after_ops(std::uint64_t stamp, cudaStream_t stream) {
  if (stamp == 0) return cudaSuccess;
  cudaEvent_t e = nullptr;
  {
    std::lock_guard lock(ring_mu);
    e = ring[stamp % kRing];
  }
  // Recorded again meanwhile: the wait is for later ops of the same stream, which end after those of `stamp`. Done
  // already (the usual case for a stamp many calls old): nothing to wait for.
  if (cudaEventQuery(e) == cudaSuccess) return cudaSuccess;  // cudaErrorNotReady is not kept as a last error
  return stream != nullptr ? cudaStreamWaitEvent(stream, e, 0) : cudaEventSynchronize(e);
}

Status Device::use() const {
  if (cudaError_t e = cudaSetDevice(index); e != cudaSuccess) return cuda_status(e, "cudaSetDevice");
  return {};
}

void Device::begin_graph_locked() {
  if (!graphs.enabled || graphs.capturing) return;
  // Relaxed: other threads may allocate, copy and query events while this stream captures (the VRAM tier's uploads).
  if (cudaStreamBeginCapture(compute, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  graphs.capturing = true;
}

namespace {

// The key of a captured segment: its node count, and each node's type and kernel in the order the graph lists them.
// Two segments with the same key take the same instantiation (updated with the new one's parameters). A query that
// fails is an error (the segment is then lost, not mistaken for an empty one).
cudaError_t graph_key(cudaGraph_t graph, std::size_t& nodes, std::uint64_t& key) {
  nodes = 0;
  if (cudaError_t e = cudaGraphGetNodes(graph, nullptr, &nodes); e != cudaSuccess) return e;
  std::vector<cudaGraphNode_t> list(nodes);
  if (nodes > 0) {
    if (cudaError_t e = cudaGraphGetNodes(graph, list.data(), &nodes); e != cudaSuccess) return e;
  }
  key = 0xcbf29ce484222325ULL ^ nodes;
  auto mix = [&](std::uint64_t v) { key = (key ^ v) * 0x100000001b3ULL; };
  for (cudaGraphNode_t node : list) {
    cudaGraphNodeType type{};
    if (cudaError_t e = cudaGraphNodeGetType(node, &type); e != cudaSuccess) return e;
    mix(static_cast<std::uint64_t>(type));
    if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams p{};
      if (cudaError_t e = cudaGraphKernelNodeGetParams(node, &p); e != cudaSuccess) return e;
      mix(reinterpret_cast<std::uintptr_t>(p.func));
    }
  }
  return cudaSuccess;
}

}  // namespace

Status Device::flush_graph_locked() noexcept {
  if (!graphs.capturing.load()) return {};
  graphs.capturing.store(false);
  cudaGraph_t graph = nullptr;
  bool launched = false;
  std::size_t nodes = 0;
  const char* counter = "graph_updates_total";
  // The kernels captured since the last flush belong to calls that have returned: an error here goes to whoever
  // flushes (the next wait, copy or call), as an asynchronous kernel's fault would.
  auto failed = [&](cudaError_t err, const char* what) {
    cudaGetLastError();
    return cuda_status(err, std::string("CUDA graph: ") + what +
                                (launched ? ""
                                          : " (the ops queued since the last wait did not run; compute option "
                                            "graphs: false launches them one by one)"));
  };
  Status result;
  try {
    result = [&]() -> Status {
      if (cudaError_t e = cudaStreamEndCapture(compute, &graph); e != cudaSuccess || graph == nullptr) {
        return failed(e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated, "ending the capture");
      }
      std::uint64_t key = 0;
      if (cudaError_t e = graph_key(graph, nodes, key); e != cudaSuccess) return failed(e, "reading the capture");
      if (nodes == 0) return {};  // calls that answered before queuing anything (unsupported, a bad shape)
      if (graphs.execs.size() >= 256 && !graphs.execs.contains(key)) {
        // Bounded: each instantiation holds device resources. A rare wait, so none is destroyed while queued.
        cudaStreamSynchronize(compute);
        for (auto& [k, exec] : graphs.execs) cudaGraphExecDestroy(exec);
        graphs.execs.clear();
      }
      cudaGraphExec_t& exec = graphs.execs[key];
      if (exec != nullptr) {
        // Launches already queued keep the parameters they were launched with.
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(exec, graph, &info) != cudaSuccess) {
          cudaGetLastError();
          cudaGraphExecDestroy(exec);
          exec = nullptr;
        }
      }
      if (exec == nullptr) {
        counter = "graph_instantiations_total";
        if (cudaError_t e = cudaGraphInstantiate(&exec, graph, 0); e != cudaSuccess) {
          graphs.execs.erase(key);
          return failed(e, "instantiating the captured ops");
        }
      }
      if (cudaError_t e = cudaGraphLaunch(exec, compute); e != cudaSuccess) {
        return failed(e, "launching the captured ops");
      }
      launched = true;
      // Copies into or out of these buffers wait for the graph, as for ops launched one by one (Binder::finish).
      if (const std::uint64_t stamp = record_ops(); stamp != 0) {
        for (const CudaBuffer* b : graphs.bound) b->last_ops.store(stamp);
      } else if (cudaError_t e = cudaStreamSynchronize(compute); e != cudaSuccess) {
        return failed(e, "waiting for the captured ops");
      }
      if (graphs.host != nullptr) {
        graphs.host->counter_add("graph_launches_total", 1);
        graphs.host->counter_add("graph_nodes_total", static_cast<double>(nodes));
        graphs.host->counter_add(counter, 1);
      }
      return {};
    }();
  } catch (...) {  // host memory for the node list, the cache or a message
    result = Status(StatusCode::out_of_memory, "CUDA graph: no host memory to launch the captured ops");
  }
  if (!result && !launched) ++graphs.losses;  // what these kernels wrote (the routed tables' uploads) never happened
  if (graph != nullptr) cudaGraphDestroy(graph);
  graphs.bound.clear();
  return result;
}

Status Device::take_lost_locked() {
  if (!graphs.lost_pending.load()) return {};
  graphs.lost_pending.store(false);
  return std::exchange(graphs.lost, Status{});
}

Status Device::flush_graph() {
  if (!graphs.enabled || (!graphs.capturing.load() && !graphs.lost_pending.load())) return {};
  std::lock_guard lock(graphs.mu);
  if (Status s = flush_graph_locked(); !s) return s;
  return take_lost_locked();
}

void Device::flush_graph_or_keep() noexcept {
  if (!graphs.enabled || !graphs.capturing.load()) return;
  std::lock_guard lock(graphs.mu);
  if (Status s = flush_graph_locked(); !s) {
    graphs.lost = std::move(s);
    graphs.lost_pending.store(true);
  }
}

CudaBuffer::~CudaBuffer() {
  (void)dev_->use();
  dev_->flush_graph_or_keep();                // captured kernels that use it run now, or never
  dev_->after_ops(last_ops.load(), nullptr);  // kernels still reading or writing it
  cudaFree(ptr_);
}

// ---------------------------------------------------------------------------------------- copies

Status PendingCopy::finish(bool block) noexcept {
  std::lock_guard lock(mu);
  if (finished) return status;
  (void)dev->use();
  if (!block) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaErrorNotReady) return {};
    if (q != cudaSuccess) status = cuda_status(q, "copy");
  }
  if (status) {
    if (cudaError_t e = cudaEventSynchronize(done); e != cudaSuccess) status = cuda_status(e, "copy");
  }
  if (status && host_dst != nullptr) std::memcpy(host_dst, staging.ptr, bytes);
  cudaEventDestroy(done);
  dev->pinned.give(staging);
  staging = {};
  finished = true;
  return status;
}

bool PendingCopy::is_finished() noexcept {
  std::lock_guard lock(mu);
  return finished;
}

// ---------------------------------------------------------------------------------------- compute

Expected<std::unique_ptr<CudaCompute>> CudaCompute::create(const sdk::CreateContext& cc) {
  auto index = cc.config->get_int("device", 0);
  if (!index) return index.error();
  auto routed = cc.config->get_bool("routed_experts", false);
  if (!routed) return routed.error();
  auto graphs = cc.config->get_bool("graphs", false);
  if (!graphs) return graphs.error();
  if (std::string p = driver_library_problem(); !p.empty()) return Status(StatusCode::unsupported, p);
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    int driver = 0;
    cudaDriverGetVersion(&driver);
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    return Status(StatusCode::unsupported,
                  std::string("no usable CUDA device: ") + cudaGetErrorString(e) + " (" +
                      (driver > 0 ? "the driver supports CUDA " + version(driver) + ", " : "") +
                      "this plugin was built with CUDA " + version(CUDART_VERSION) + ")");
  }
  if (count == 0) return Status(StatusCode::unsupported, "the NVIDIA driver reports no CUDA device");
  if (*index < 0 || *index >= count) {
    return Status(StatusCode::invalid_argument, "compute.device = " + std::to_string(*index) + " but there are " +
                                                    std::to_string(count) + " CUDA devices (0.." +
                                                    std::to_string(count - 1) + "; see nvidia-smi -L)");
  }
  auto dev = std::make_shared<Device>();
  dev->index = static_cast<int>(*index);
  if (Status s = dev->use(); !s) return Status(StatusCode::unsupported, s.message());
  if (cudaError_t e = cudaGetDeviceProperties(&dev->prop, dev->index); e != cudaSuccess) {
    return cuda_status(e, "cudaGetDeviceProperties", StatusCode::unsupported);
  }
  if (cudaError_t e = kernel_image_status(); e != cudaSuccess) {
    cudaGetLastError();
    return Status(StatusCode::unsupported, std::string(dev->prop.name) + " (sm_" + std::to_string(dev->prop.major) +
                                               std::to_string(dev->prop.minor) + ") cannot run this build's kernels (" +
                                               cudaGetErrorString(e) + "); rebuild with -DCMAKE_CUDA_ARCHITECTURES=" +
                                               std::to_string(dev->prop.major) + std::to_string(dev->prop.minor));
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&dev->compute, cudaStreamNonBlocking); e != cudaSuccess) {
    return cuda_status(e, "creating the compute stream");
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&dev->copy, cudaStreamNonBlocking); e != cudaSuccess) {
    return cuda_status(e, "creating the copy stream");
  }
  for (cudaEvent_t& e : dev->ring) {
    if (cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); r != cudaSuccess) {
      return cuda_status(r, "creating the op stream's events");
    }
  }
  return std::make_unique<CudaCompute>(std::move(dev), *routed, *graphs, cc.host);
}

CudaCompute::CudaCompute(std::shared_ptr<Device> dev, bool routed_experts, bool graphs, sdk::HostServices* host)
    : dev_(std::move(dev)), routed_experts_(routed_experts) {
  dev_->graphs.enabled = graphs;
  dev_->graphs.host = host;
  sdk::DeviceInfo d;
  d.name = dev_->prop.name;
  d.host_memory = false;
  d.capabilities = "sm_" + std::to_string(dev_->prop.major) + std::to_string(dev_->prop.minor);
  d.memory_total = dev_->prop.totalGlobalMem;
  devices_.push_back(std::move(d));
}

CudaCompute::~CudaCompute() {
  (void)synchronize();
  {
    std::lock_guard lock(dev_->graphs.mu);
    dev_->graphs.host = nullptr;  // buffers may outlive this object; the host services do not
  }
  (void)dev_->use();
  cudaFree(arena_);
  cudaFreeHost(staging_);
  cudaFree(status_dev_);
  cudaFreeHost(status_host_);
  for (const TableSlab& slab : table_slabs_) {
    cudaFree(slab.device);
    cudaFreeHost(slab.host);
  }
}

std::span<const sdk::DeviceInfo> CudaCompute::devices() const noexcept {
  std::lock_guard lock(info_mu_);
  std::size_t free_bytes = 0, total = 0;
  if (dev_->use() && cudaMemGetInfo(&free_bytes, &total) == cudaSuccess) {
    devices_.front().memory_total = total;
    devices_.front().memory_available = free_bytes;
  } else {
    cudaGetLastError();
  }
  return devices_;
}

Expected<std::unique_ptr<sdk::Buffer>> CudaCompute::allocate(std::size_t bytes) noexcept {
  try {
    if (Status s = dev_->use(); !s) return s;
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 1)); e != cudaSuccess) {
      cudaGetLastError();
      return cuda_status(e, "allocating " + std::to_string(bytes) + " bytes of device memory on " + dev_->prop.name,
                         StatusCode::out_of_memory);
    }
    return std::unique_ptr<sdk::Buffer>(new CudaBuffer(dev_, p, bytes));
  } catch (...) {
    return Status(StatusCode::out_of_memory, "allocating a buffer object");
  }
}

Expected<const CudaBuffer*> CudaCompute::own_buffer(const sdk::Buffer& b, std::size_t offset, std::size_t bytes,
                                                    const char* what) const {
  return sdk::own_buffer<CudaBuffer>(b, offset, bytes, what, "CUDA",
                                     [&](const CudaBuffer& cb) { return cb.device() == dev_.get(); });
}

Expected<std::unique_ptr<sdk::Event>> CudaCompute::start_copy(std::shared_ptr<PendingCopy> copy,
                                                              const CudaBuffer& buffer, void* to, const void* from,
                                                              cudaMemcpyKind kind, const CudaBuffer* other) {
  const char* what = kind == cudaMemcpyHostToDevice   ? "copy_to_device_async"
                     : kind == cudaMemcpyDeviceToHost ? "copy_to_host_async"
                                                      : "copy_between_async";
  if (cudaError_t e = cudaEventCreateWithFlags(&copy->done, cudaEventDisableTiming); e != cudaSuccess) {
    dev_->pinned.give(copy->staging);
    return cuda_status(e, what);
  }
  // An upload must not overwrite what queued ops still read, a download must see what they write.
  cudaError_t e = dev_->after_ops(buffer.last_ops.load(), dev_->copy);
  if (e == cudaSuccess && other != nullptr) e = dev_->after_ops(other->last_ops.load(), dev_->copy);
  if (e == cudaSuccess) e = cudaMemcpyAsync(to, from, copy->bytes, kind, dev_->copy);
  if (e == cudaSuccess) e = cudaEventRecord(copy->done, dev_->copy);
  if (e != cudaSuccess) {
    cudaStreamSynchronize(dev_->copy);  // the staging block may still be read
    cudaEventDestroy(copy->done);
    dev_->pinned.give(copy->staging);
    return cuda_status(e, what);
  }
  return copies_.track(std::move(copy));
}

Status CudaCompute::register_host(void* ptr, std::size_t bytes) noexcept {
  try {
    if (ptr == nullptr || bytes == 0) return Status(StatusCode::invalid_argument, "register_host: an empty region");
    if (Status s = dev_->use(); !s) return s;
    if (cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable); e != cudaSuccess) {
      cudaGetLastError();
      return cuda_status(e, "registering " + std::to_string(bytes) + " bytes of host memory (cudaHostRegister)",
                         StatusCode::out_of_memory);
    }
    std::lock_guard lock(registered_mu_);
    registered_[static_cast<const std::byte*>(ptr)] = bytes;
    return {};
  } catch (...) {
    return Status(StatusCode::out_of_memory, "register_host");
  }
}

void CudaCompute::unregister_host(void* ptr) noexcept {
  std::lock_guard lock(registered_mu_);
  auto it = registered_.find(static_cast<const std::byte*>(ptr));
  if (it == registered_.end()) return;
  registered_.erase(it);
  (void)dev_->use();
  cudaStreamSynchronize(dev_->copy);  // the caller waited for its copies; this makes sure none still reads it
  cudaHostUnregister(ptr);
  cudaGetLastError();
}

bool CudaCompute::registered(const void* src, std::size_t bytes) const {
  const auto* p = static_cast<const std::byte*>(src);
  std::lock_guard lock(registered_mu_);
  auto it = registered_.upper_bound(p);
  return it != registered_.begin() && p + bytes <= std::prev(it)->first + std::prev(it)->second;
}

Expected<std::unique_ptr<sdk::Event>> CudaCompute::copy_to_device_async(const void* src, sdk::Buffer& dst,
                                                                        std::size_t offset,
                                                                        std::size_t bytes) noexcept {
  try {
    auto cb = own_buffer(dst, offset, bytes, "copy_to_device_async");
    if (!cb) return cb.error();
    if (bytes == 0) return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    if (src == nullptr) return Status(StatusCode::invalid_argument, "copy_to_device_async: null source");
    if (Status s = dev_->use(); !s) return s;
    if (Status s = dev_->flush_graph(); !s) return s;  // the captured kernels may still read the buffer
    if (registered(src, bytes)) {
      // Page-locked already: the copy engine reads it directly while the caller goes on (kHostRegisterInterface).
      auto copy = std::make_shared<PendingCopy>();
      copy->dev = dev_;
      copy->bytes = bytes;
      return start_copy(std::move(copy), **cb, (*cb)->device_pointer() + offset, src, cudaMemcpyHostToDevice);
    }
    auto staging = dev_->pinned.take(bytes);
    if (!staging) {
      // No pinned memory left: a synchronous copy from pageable memory still works, after the copies queued on the
      // copy stream and the ops using the buffer (the legacy stream does not wait for non-blocking ones).
      cudaStreamSynchronize(dev_->copy);
      dev_->after_ops((*cb)->last_ops.load(), nullptr);
      if (cudaError_t e = cudaMemcpy((*cb)->device_pointer() + offset, src, bytes, cudaMemcpyHostToDevice);
          e != cudaSuccess) {
        return cuda_status(e, "copy_to_device_async");
      }
      return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    }
    // The caller's memory is free to reuse as soon as this returns.
    std::memcpy(staging->ptr, src, bytes);
    auto copy = std::make_shared<PendingCopy>();
    copy->dev = dev_;
    copy->staging = *staging;
    copy->bytes = bytes;
    return start_copy(std::move(copy), **cb, (*cb)->device_pointer() + offset, staging->ptr, cudaMemcpyHostToDevice);
  } catch (...) {
    return Status(StatusCode::out_of_memory, "copy_to_device_async");
  }
}

Expected<std::unique_ptr<sdk::Event>> CudaCompute::copy_to_host_async(const sdk::Buffer& src, std::size_t offset,
                                                                      void* dst, std::size_t bytes) noexcept {
  try {
    auto cb = own_buffer(src, offset, bytes, "copy_to_host_async");
    if (!cb) return cb.error();
    if (bytes == 0) return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    if (dst == nullptr) return Status(StatusCode::invalid_argument, "copy_to_host_async: null destination");
    if (Status s = dev_->use(); !s) return s;
    if (Status s = dev_->flush_graph(); !s) return s;  // the captured kernels may still write the buffer
    auto staging = dev_->pinned.take(bytes);
    if (!staging) {
      cudaStreamSynchronize(dev_->copy);  // see copy_to_device_async
      dev_->after_ops((*cb)->last_ops.load(), nullptr);
      if (cudaError_t e = cudaMemcpy(dst, (*cb)->device_pointer() + offset, bytes, cudaMemcpyDeviceToHost);
          e != cudaSuccess) {
        return cuda_status(e, "copy_to_host_async");
      }
      return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    }
    auto copy = std::make_shared<PendingCopy>();
    copy->dev = dev_;
    copy->staging = *staging;
    copy->host_dst = dst;
    copy->bytes = bytes;
    return start_copy(std::move(copy), **cb, staging->ptr, (*cb)->device_pointer() + offset, cudaMemcpyDeviceToHost);
  } catch (...) {
    return Status(StatusCode::out_of_memory, "copy_to_host_async");
  }
}

Expected<std::unique_ptr<sdk::Event>> CudaCompute::copy_between_async(const sdk::Buffer& src, std::size_t src_offset,
                                                                      sdk::Buffer& dst, std::size_t dst_offset,
                                                                      std::size_t bytes) noexcept {
  try {
    auto both = sdk::own_copy_buffers<CudaBuffer>(src, src_offset, dst, dst_offset, bytes, "CUDA",
                                                  [&](const CudaBuffer& cb) { return cb.device() == dev_.get(); });
    if (!both) return both.error();
    const auto [from, to] = *both;
    if (bytes == 0) return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    if (Status s = dev_->use(); !s) return s;
    if (Status s = dev_->flush_graph(); !s) return s;  // the captured kernels may still use either buffer
    auto copy = std::make_shared<PendingCopy>();
    copy->dev = dev_;
    copy->bytes = bytes;
    return start_copy(std::move(copy), *from, to->device_pointer() + dst_offset, from->device_pointer() + src_offset,
                      cudaMemcpyDeviceToDevice, to);
  } catch (...) {
    return Status(StatusCode::out_of_memory, "copy_between_async");
  }
}

Status CudaCompute::synchronize() noexcept {
  Status first = copies_.finish_all();
  if (Status s = dev_->use(); !s) return s;
  // Under graphs.mu: another thread's run() must not start a capture the wait on the op stream would break.
  std::unique_lock<std::mutex> graph_lock;
  if (dev_->graphs.enabled) {
    graph_lock = std::unique_lock(dev_->graphs.mu);
    if (Status s = dev_->flush_graph_locked(); !s && first) first = s;
    if (Status s = dev_->take_lost_locked(); !s && first) first = s;
  }
  for (cudaStream_t st : {dev_->compute, dev_->copy}) {
    if (cudaError_t e = cudaStreamSynchronize(st); e != cudaSuccess && first) first = cuda_status(e, "synchronize");
  }
  return first;
}

}  // namespace colibri::cuda

namespace {

colibri::sdk::Expected<colibri::sdk::PluginObject*> create_cuda(const colibri::sdk::CreateContext& ctx) noexcept {
  return colibri::sdk::create_guarded<colibri::cuda::CudaCompute>(ctx);
}

const colibri::sdk::PluginDescriptor kDescriptor{
    colibri::sdk::make_plugin_header(),
    colibri::sdk::PluginKind::compute,
    "cuda",
    "0.1.0",
    "NVIDIA CUDA kernels: quantized GEMV / tiled matmul, expert FFN, attention over a device KV cache, norms",
    colibri::cuda::kOptions,
    colibri::cuda::kCapabilities,
    &colibri::cuda::score,
    &create_cuda,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
