// compute/cuda: op validation and dispatch. Every call is checked on the host first (sdk::check_op_call
// plus this backend's grid limits: a bad shape is an error naming the op and tensor, never a device
// fault); then each tensor is resolved to a device pointer and the kernels launch on the compute stream.
// A call on device buffers alone returns once its kernels are queued: later ops follow them on the same
// stream, and a copy into or out of a buffer waits for the ops that used it (Device::record_ops), so to
// the caller the outputs are written when run() returns, as on the CPU and Vulkan backends. A call with
// host tensors (data, no buffer: staged through pinned memory into a device arena and back) or a status
// word (bad token ids, NaN logits) waits for its kernels and reports what they found.
#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_compute.hpp"
#include "cuda_kernels.hpp"
#include "cuda_linear_attention.cuh"

namespace colibri::cuda {

using sdk::DType;
using sdk::Expected;
using sdk::Op;
using sdk::shape_text;
using sdk::Status;
using sdk::StatusCode;
using sdk::Tensor;

namespace {

constexpr std::int64_t kMaxInt = 0x7FFFFFFF;
constexpr std::int64_t kMaxGridY = 65535;
constexpr std::int64_t kMaxMatmulTokens = kMaxGridY * 8;  // token tiles of 8 on grid.y
constexpr std::int64_t kMaxGridZ = 65535;
constexpr std::size_t kArenaAlign = 256;

// Bytes of a tensor; 0 when its shape is not valid (bind() reports why).
std::size_t tensor_bytes(const Tensor& t) {
  if (sdk::dtype_traits(t.type) == nullptr) return 0;
  for (auto n : t.ne) {
    if (n <= 0) return 0;
  }
  return sdk::row_bytes(t.type, t.ne[0]) * static_cast<std::size_t>(sdk::row_count(t));
}
std::size_t align_up(std::size_t v) {
  return (v + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}
std::size_t weight_align(DType t) {
  return t == DType::f32 ? 4 : t == DType::mxfp4 ? 1 : 2;  // mxfp4's 17-byte blocks are read byte-wise
}
bool is_expert_op(sdk::Op op) {
  return op == Op::expert_ffn || op == Op::expert_ffn_group || op == Op::expert_ffn_clamped ||
         op == Op::expert_ffn_clamped_group;
}

}  // namespace

// Where each tensor of an op lives on the device. Host tensors get a slice of the arena, filled
// from pinned staging before the kernels and copied back (outputs) after them.
class Binder {
 public:
  Binder(CudaCompute& c, const char* op) : c_(c), op_(op) {}

  // Sizes the arena and the staging mirror for every host tensor of the call, plus `extra` bytes of
  // device scratch (expert_ffn), before anything is bound (growing later would move them).
  Status reserve(const sdk::OpCall& call, std::size_t extra) {
    std::size_t host = 0;
    for (std::size_t i = 0; i < call.inputs.size(); ++i) {
      const Tensor& t = call.inputs[i];
      if (t.buffer == nullptr && t.data != nullptr && !repeats_input(call, i)) host += align_up(tensor_bytes(t));
    }
    for (const Tensor& t : call.outputs) {
      if (t.buffer == nullptr && t.data != nullptr) host += align_up(tensor_bytes(t));
    }
    scratch_at_ = host;
    if (Status s = c_.grow(c_.arena_, c_.arena_size_, host + extra, false, "device arena"); !s) return s;
    if (host > 0) {
      if (Status s = c_.grow(c_.staging_, c_.staging_size_, host, true, "pinned staging"); !s) return s;
    }
    return {};
  }
  [[nodiscard]] float* scratch(std::size_t offset) const {
    return reinterpret_cast<float*>(static_cast<std::byte*>(c_.arena_) + scratch_at_ + offset);
  }

  // The device address of `t`; `what` names it in errors ("W", "X", ...).
  Expected<void*> bind(const Tensor& t, const char* what, bool is_output, std::size_t align) {
    auto checked = sdk::checked_bytes(t, op_, what);
    if (!checked) return checked.error();
    const std::size_t bytes = *checked;
    std::byte* ptr = nullptr;
    if (t.buffer != nullptr) {
      const auto* cb = dynamic_cast<const CudaBuffer*>(t.buffer);
      if (cb == nullptr || cb->device() != c_.dev_.get()) return error(what, "lives in a buffer of another backend");
      if (Status s = sdk::check_buffer_range(t, bytes, op_, what); !s) return s;
      ptr = cb->device_pointer() + t.offset;
      bound_.push_back(cb);
    } else if (t.data != nullptr) {
      staged_ = true;
      if (!is_output) {
        // The same host input again (DeepSeek's latent cache, passed as keys and values): one slice, one upload.
        for (const StagedInput& s : staged_in_) {
          if (s.host == t.data && s.bytes == bytes) return static_cast<void*>(s.device);
        }
      }
      if (used_ + bytes > scratch_at_) return error(what, "was not counted by reserve()");
      ptr = static_cast<std::byte*>(c_.arena_) + used_;
      std::byte* pinned = static_cast<std::byte*>(c_.staging_) + used_;
      // Outputs are uploaded too: scale_add accumulates into its output.
      std::memcpy(pinned, t.data, bytes);
      if (cudaError_t e = cudaMemcpyAsync(ptr, pinned, bytes, cudaMemcpyHostToDevice, c_.dev_->compute);
          e != cudaSuccess) {
        return cuda_status(e, std::string(op_) + ": uploading " + what);
      }
      if (is_output) {
        staged_out_.push_back({t.data, pinned, ptr, bytes});
      } else {
        staged_in_.push_back({t.data, ptr, bytes});
      }
      used_ += align_up(bytes);
    } else {
      return error(what, "has neither a buffer nor host data");
    }
    if (reinterpret_cast<std::uintptr_t>(ptr) % align != 0) {
      return error(what, "starts at an address not aligned to " + std::to_string(align) + " bytes (offset " +
                             std::to_string(t.offset) + ")");
    }
    return static_cast<void*>(ptr);
  }

  // After the kernels were queued. Without host tensors or a status word to read: stamps the bound buffers with the
  // queued ops (copies of them wait for those) and returns. Otherwise downloads staged outputs, waits, copies them
  // to the caller.
  Status finish(bool read_status) {
    if (c_.dev_->graphs.capturing.load()) {
      // Captured, not launched (run() captures only calls on device buffers without a status word): the flush that
      // launches them stamps these buffers.
      auto& bound = c_.dev_->graphs.bound;
      bound.insert(bound.end(), bound_.begin(), bound_.end());
      return {};
    }
    if (!staged_ && !read_status) {
      if (const std::uint64_t stamp = c_.dev_->record_ops(); stamp != 0) {
        for (const CudaBuffer* b : bound_) b->last_ops.store(stamp);
        return {};
      }
    }
    for (const auto& s : staged_out_) {
      if (cudaError_t e = cudaMemcpyAsync(s.pinned, s.device, s.bytes, cudaMemcpyDeviceToHost, c_.dev_->compute);
          e != cudaSuccess) {
        return cuda_status(e, std::string(op_) + ": downloading an output");
      }
    }
    if (cudaError_t e = cudaStreamSynchronize(c_.dev_->compute); e != cudaSuccess) {
      return cuda_status(e, std::string(op_) + " failed on the device");
    }
    for (const auto& s : staged_out_) std::memcpy(s.host, s.pinned, s.bytes);
    return {};
  }

  [[nodiscard]] Status error(const char* what, const std::string& message) const {
    return Status(StatusCode::invalid_argument, std::string(op_) + ": " + what + " " + message);
  }

 private:
  // Whether input i is a host tensor an earlier input already stages (bind() gives it that slice).
  static bool repeats_input(const sdk::OpCall& call, std::size_t i) {
    const Tensor& t = call.inputs[i];
    for (std::size_t j = 0; j < i; ++j) {
      const Tensor& u = call.inputs[j];
      if (u.buffer == nullptr && u.data == t.data && tensor_bytes(u) == tensor_bytes(t)) return true;
    }
    return false;
  }
  struct StagedInput {
    const void* host;
    std::byte* device;
    std::size_t bytes;
  };
  struct Staged {
    void* host;
    std::byte* pinned;
    std::byte* device;
    std::size_t bytes;
  };
  CudaCompute& c_;
  const char* op_;
  std::size_t used_ = 0;
  std::size_t scratch_at_ = 0;
  std::vector<Staged> staged_out_;
  std::vector<StagedInput> staged_in_;
  bool staged_ = false;  // a host tensor went through the pinned staging, which the next call reuses
  std::vector<const CudaBuffer*> bound_;
};

Status CudaCompute::grow(void*& ptr, std::size_t& capacity, std::size_t bytes, bool pinned, const char* what) {
  if (capacity >= bytes) return {};
  const std::size_t want = std::max(bytes, capacity + capacity / 2);
  if (ptr != nullptr) {
    // Captured kernels may use the old block: launched first, then waited for (run() holds graphs.mu).
    if (Status s = dev_->flush_graph_locked(); !s) return s;
    cudaStreamSynchronize(dev_->compute);
    pinned ? cudaFreeHost(ptr) : cudaFree(ptr);
    ptr = nullptr;
    capacity = 0;
  }
  const cudaError_t e = pinned ? cudaHostAlloc(&ptr, want, cudaHostAllocPortable) : cudaMalloc(&ptr, want);
  if (e != cudaSuccess) {
    cudaGetLastError();
    ptr = nullptr;
    return cuda_status(e, std::string("allocating ") + std::to_string(want) + " bytes of " + what,
                       StatusCode::out_of_memory);
  }
  capacity = want;
  return {};
}

bool CudaCompute::supports(Op op, DType weight_type) const noexcept {
  // expert_ffn_routed: the formats with a path on 8-bit activations (q8_block; every one of them takes K = 256).
  if (op == Op::expert_ffn_routed)
    return routed_experts_ && q8_block(static_cast<std::uint32_t>(weight_type), 256) != 0;
  // The expert ops and their groups are matmul kernels in a row, so they take matmul's weights, and mxfp4 (gpt-oss's
  // experts: the chunk path) too; attention_sinks is attention with the sinks as its first key.
  if (op == Op::matmul || is_expert_op(op))
    return sdk::supports_every_op(Op::matmul, weight_type) || weight_type == DType::mxfp4;
  if (op == Op::attention_sinks) return sdk::supports_every_op(Op::attention, weight_type);
  // GLM-4.5 / DeepSeek-V3 routers: topk_kernel<true, false>, and <true, true> for the group-limited one.
  if (op == Op::topk_routing_biased || op == Op::topk_routing_grouped)
    return sdk::supports_every_op(Op::topk_routing, weight_type);
  // DeepSeek's latent attention: matmul with the head on grid.z, and a row copy.
  if (op == Op::matmul_heads) return sdk::supports_every_op(Op::matmul, weight_type) || weight_type == DType::mxfp4;
  if (op == Op::concat_rows) return weight_type == DType::f32;
  // Qwen3-Next's linear attention: eltwise's mul, and a kernel each for the convolution and the delta rule.
  if (op == Op::mul || op == Op::causal_conv || op == Op::gated_delta_rule) return weight_type == DType::f32;
  return sdk::supports_every_op(op, weight_type);
}

namespace {

// Whether run() may capture the call's kernels into a CUDA graph: every tensor in a device buffer (host tensors are
// staged through memory the next call reuses, and waited for) and no status word to read back (embedding's ids).
bool capturable(const sdk::OpCall& call) {
  if (call.op == Op::embedding) return false;
  for (const Tensor& t : call.inputs) {
    if (t.buffer == nullptr) return false;
  }
  for (const Tensor& t : call.outputs) {
    if (t.buffer == nullptr) return false;
  }
  return true;
}

}  // namespace

Status CudaCompute::run(const sdk::OpCall& call) noexcept {
  return sdk::guarded(op_name(call.op), [&] {
    std::lock_guard lock(run_mu_);
    if (Status s = dev_->use(); !s) return s;
    // Graphs on: the whole call under graphs.mu, so no other thread's flush lands between two of its launches.
    std::unique_lock<std::mutex> graph_lock;
    if (dev_->graphs.enabled) {
      graph_lock = std::unique_lock(dev_->graphs.mu);
      if (Status s = dev_->take_lost_locked(); !s) return s;  // earlier calls' kernels never ran
      if (capturable(call)) {
        dev_->begin_graph_locked();
      } else if (Status s = dev_->flush_graph_locked(); !s) {
        return s;
      }
    }
    cudaGetLastError();  // an error handled before (a failed copy or allocation) is not this call's launch error
    Status s;
    try {  // here, not only in guarded(): a call that throws part way must not leave its kernels for later
      s = run_impl(call);
    } catch (const std::bad_alloc&) {
      s = Status(StatusCode::out_of_memory, std::string(op_name(call.op)) + ": out of host memory");
    } catch (const std::exception& e) {
      s = Status(StatusCode::internal, std::string(op_name(call.op)) + ": " + e.what());
    }
    // An `unsupported` answer comes before anything is queued (check_op_call, expert_ffn_routed's checks): no wait,
    // since the engine then runs the op its own way.
    if (!s && s.code() != StatusCode::unsupported) {
      // Kernels queued before the failure must not write the outputs after run() has returned: captured ones are
      // launched (as they would have been without graphs), then waited for. Their loss is the worse news.
      if (Status f = dev_->flush_graph_locked(); !f) s = f;
      cudaStreamSynchronize(dev_->compute);
      cudaGetLastError();
    }
    return s;
  });
}

Status CudaCompute::run_impl(const sdk::OpCall& call) {
  const char* name = op_name(call.op);
  const auto& in = call.inputs;
  const auto& out = call.outputs;
  if (call.op == Op::expert_ffn_routed && !routed_experts_) {
    return Status(StatusCode::unsupported,
                  std::string(name) + ": off in this backend (compute option routed_experts: false)");
  }
  if (Status s = sdk::check_op_call(call, "cuda"); !s) return s;
  if (call.op == Op::expert_ffn_routed) return run_routed(call);
  auto bad = [&](const std::string& m) { return Status(StatusCode::invalid_argument, std::string(name) + ": " + m); };
  auto launched = [&](cudaError_t e) -> Status {
    if (e != cudaSuccess) return cuda_status(e, std::string(name) + ": launching a kernel");
    return {};
  };
  // The status word (embedding ids, topk NaNs): cleared before the kernel, read after it.
  auto status_word = [&]() -> Expected<std::int32_t*> {
    if (status_dev_ == nullptr) {
      void *dev = nullptr, *host = nullptr;
      cudaError_t e = cudaMalloc(&dev, 2 * sizeof(std::int32_t));
      if (e == cudaSuccess) e = cudaHostAlloc(&host, 2 * sizeof(std::int32_t), cudaHostAllocPortable);
      if (e != cudaSuccess) {
        cudaFree(dev);
        return cuda_status(e, "allocating the status word", StatusCode::out_of_memory);
      }
      status_dev_ = static_cast<std::int32_t*>(dev);
      status_host_ = static_cast<std::int32_t*>(host);
    }
    if (cudaError_t e = cudaMemsetAsync(status_dev_, 0, 2 * sizeof(std::int32_t), dev_->compute); e != cudaSuccess) {
      return cuda_status(e, "clearing the status word");
    }
    return status_dev_;
  };
  bool check_status = false;

#define COLIBRI_CUDA_TRY(expr)     \
  do {                             \
    if (Status s_ = (expr); !s_) { \
      return s_;                   \
    }                              \
  } while (0)
#define COLIBRI_CUDA_BIND(var, type, tensor, what, is_out, align) \
  type var = nullptr;                                             \
  {                                                               \
    auto b_ = binder.bind(tensor, what, is_out, align);           \
    if (!b_) return b_.error();                                   \
    var = static_cast<type>(*b_);                                 \
  }

  Binder binder(*this, name);
  // The expert ops (a group runs its experts one after another on the stream): gate/up scratch for the largest
  // expert, which each expert reuses once the one before it is done.
  const bool expert = is_expert_op(call.op);
  const bool clamped = call.op == Op::expert_ffn_clamped || call.op == Op::expert_ffn_clamped_group;
  const std::size_t stride = clamped ? 7 : 4;
  const std::size_t n_experts = expert ? out.size() : 0;
  std::size_t extra_scratch = 0;
  for (std::size_t e = 0; e < n_experts; ++e) {
    const std::int64_t f = sdk::row_count(in[e * stride]), t = sdk::row_count(in[e * stride + 3]);
    if (f * t > kMaxInt) return bad("expert " + std::to_string(e) + ": F x T is more than 2^31 - 1 elements");
    extra_scratch = std::max(extra_scratch, 2 * align_up(static_cast<std::size_t>(f * t) * sizeof(float)));
  }
  // 8-bit activations for the matmuls that take them (sdk: quantized W may quantize X unless kExactActivations),
  // after the experts' gate/up scratch. One region, laid out for the largest K x T that takes them, serves X (gate,
  // up) and then the gate output (down) of every expert in turn; a matmul whose K does not take them leaves it alone.
  const std::size_t ffn_scratch = extra_scratch;
  std::int64_t q8_k = 0, q8_t = 0;
  const auto consider = [&](std::int64_t k, std::int64_t t) {
    if (q8_scratch_bytes(k, t) > 0 && q8_scratch_bytes(k, t) > q8_scratch_bytes(q8_k, q8_t)) {
      q8_k = k;
      q8_t = t;
    }
  };
  if ((call.params.flags & sdk::kExactActivations) == 0) {
    if (call.op == Op::matmul && in.size() >= 2) consider(in[0].ne[0], sdk::row_count(in[1]));
    if (call.op == Op::matmul_heads) consider(in[0].ne[0], in[0].ne[2] * in[1].ne[2]);  // every head's X in turn
    for (std::size_t e = 0; e < n_experts; ++e) {
      const Tensor& wg = in[e * stride];
      const std::int64_t t = sdk::row_count(in[e * stride + 3]);
      consider(wg.ne[0], t);
      consider(sdk::row_count(wg), t);
    }
  }
  // The expert ops get a second region, which keeps X's 8-bit copy while the first takes each gate output in turn:
  // gate and up, and every expert of a group given the same X, then quantize X once.
  const std::size_t q8_bytes = q8_k > 0 ? q8_scratch_bytes(q8_k, q8_t) : 0;
  extra_scratch += align_up(q8_bytes) * (expert ? 2 : 1);
  COLIBRI_CUDA_TRY(binder.reserve(call, extra_scratch));
  Q8Scratch q8_scratch{}, q8_x_scratch{};
  const Q8Scratch *q8 = nullptr, *q8_x = nullptr;
  if (q8_bytes > 0) {
    q8_scratch = q8_scratch_at(binder.scratch(ffn_scratch), q8_k, q8_t);
    q8 = &q8_scratch;
    q8_x = q8;
    if (expert) {
      q8_x_scratch = q8_scratch_at(binder.scratch(ffn_scratch + align_up(q8_bytes)), q8_k, q8_t);
      q8_x = &q8_x_scratch;
    }
  }
  cudaStream_t st = dev_->compute;

  switch (call.op) {
    case Op::matmul: {
      const Tensor &w = in[0], &x = in[1], &y = out[0];
      const std::int64_t k = w.ne[0], n = sdk::row_count(w), t = sdk::row_count(x);
      if (t > kMaxMatmulTokens) return bad("more than " + std::to_string(kMaxMatmulTokens) + " tokens in one call");
      COLIBRI_CUDA_BIND(wa, const void*, w, "W", false, weight_align(w.type));
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      const float* ba = nullptr;
      if (in.size() == 3) {
        COLIBRI_CUDA_BIND(b, const float*, in[2], "bias", false, 4);
        ba = b;
      }
      COLIBRI_CUDA_TRY(launched(launch_matmul(st, static_cast<std::uint32_t>(w.type), wa, sdk::row_bytes(w.type, k), xa,
                                              ya, ba, k, n, t, q8)));
      break;
    }
    case Op::matmul_heads: {
      // One launch, the head on grid.z, reading each head's rows where they lie ({K} of every {Kx} of X) and writing
      // its results in place: each (token, head) has the bits of matmul on its matrix and row.
      const Tensor &w = in[0], &x = in[1], &y = out[0];
      const std::int64_t k = w.ne[0], n = w.ne[1], heads = w.ne[2], kx = x.ne[0], t = x.ne[2];
      if (t > kMaxMatmulTokens) return bad("more than " + std::to_string(kMaxMatmulTokens) + " tokens in one call");
      if (heads > kMaxGridZ) return bad("more than " + std::to_string(kMaxGridZ) + " heads in one call");
      COLIBRI_CUDA_BIND(wa, const void*, w, "W", false, weight_align(w.type));
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_matmul_heads(st, static_cast<std::uint32_t>(w.type), wa,
                                                    sdk::row_bytes(w.type, k), xa, ya, k, n, heads, kx, t, q8)));
      break;
    }
    case Op::concat_rows: {
      const Tensor &a = in[0], &b = in[1], &y = out[0];
      const std::int64_t wa_ = a.ne[0], wb_ = b.ne[0], rows = sdk::row_count(a);
      COLIBRI_CUDA_BIND(aa, const float*, a, "A", false, 4);
      COLIBRI_CUDA_BIND(ba, const float*, b, "B", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_copy_rows(st, aa, ya, wa_, rows, 1, wa_, 0, wa_ + wb_, 0)));
      COLIBRI_CUDA_TRY(launched(launch_copy_rows(st, ba, ya + wa_, wb_, rows, 1, wb_, 0, wa_ + wb_, 0)));
      break;
    }
    case Op::expert_ffn:
    case Op::expert_ffn_group:
    case Op::expert_ffn_clamped:
    case Op::expert_ffn_clamped_group: {
      // Each expert: the kernels of matmul (+ bias) + swiglu or the clamped GLU + matmul (+ bias), in that order,
      // so its bits are those of the single op on its own inputs, whatever the other experts of a group.
      const float alpha = call.params.scale, limit = call.params.eps;
      float* gate = binder.scratch(0);
      float* up = binder.scratch(ffn_scratch / 2);
      // What q8_x holds: X, quantized in blocks of `block` for k x t (block 0: nothing yet).
      struct {
        const float* x = nullptr;
        int block = 0;
        std::int64_t k = 0, t = 0;
      } held;
      // Whether q8_x holds x for a matmul of this weight type, k and t; notes what it will hold after the launch.
      const auto reuse_x = [&](const float* x, const Tensor& w, std::int64_t k, std::int64_t t) {
        const int block = q8_x != nullptr ? q8_block(static_cast<std::uint32_t>(w.type), k) : 0;
        if (block == 0) return false;  // X stays f32: q8_x is left as it is
        const bool same = held.block == block && held.x == x && held.k == k && held.t == t;
        held = {x, block, k, t};
        return same;
      };
      for (std::size_t e = 0; e < n_experts; ++e) {
        const Tensor* ex = &in[e * stride];
        const Tensor &wg = ex[0], &wu = ex[1], &wd = ex[2], &x = ex[3], &y = out[e];
        const std::int64_t d = wg.ne[0], f = sdk::row_count(wg), t = sdk::row_count(x);
        if (t > kMaxMatmulTokens) return bad("more than " + std::to_string(kMaxMatmulTokens) + " tokens in one call");
        COLIBRI_CUDA_BIND(ga, const void*, wg, "W_gate", false, weight_align(wg.type));
        COLIBRI_CUDA_BIND(ua, const void*, wu, "W_up", false, weight_align(wu.type));
        COLIBRI_CUDA_BIND(da, const void*, wd, "W_down", false, weight_align(wd.type));
        COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
        COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
        const float *bg = nullptr, *bu = nullptr, *bd = nullptr;
        if (clamped) {
          COLIBRI_CUDA_BIND(bga, const float*, ex[4], "b_gate", false, 4);
          COLIBRI_CUDA_BIND(bua, const float*, ex[5], "b_up", false, 4);
          COLIBRI_CUDA_BIND(bda, const float*, ex[6], "b_down", false, 4);
          bg = bga, bu = bua, bd = bda;
        }
        bool x_in_q8 = reuse_x(xa, wg, d, t);
        COLIBRI_CUDA_TRY(launched(launch_matmul(st, static_cast<std::uint32_t>(wg.type), ga, sdk::row_bytes(wg.type, d),
                                                xa, gate, bg, d, f, t, q8_x, x_in_q8)));
        x_in_q8 = reuse_x(xa, wu, d, t);
        COLIBRI_CUDA_TRY(launched(launch_matmul(st, static_cast<std::uint32_t>(wu.type), ua, sdk::row_bytes(wu.type, d),
                                                xa, up, bu, d, f, t, q8_x, x_in_q8)));
        COLIBRI_CUDA_TRY(launched(clamped ? launch_clamped_glu(st, gate, up, gate, f * t, alpha, limit)
                                          : launch_eltwise(st, Eltwise::swiglu, gate, up, gate, f * t, 1)));
        COLIBRI_CUDA_TRY(launched(launch_matmul(st, static_cast<std::uint32_t>(wd.type), da, sdk::row_bytes(wd.type, f),
                                                gate, ya, bd, f, d, t, q8)));
      }
      break;
    }
    case Op::rms_norm: {
      const Tensor &x = in[0], &w = in[1], &y = out[0];
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(wa, const float*, w, "w", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_rms_norm(st, xa, wa, ya, x.ne[0], sdk::row_count(x), call.params.eps)));
      break;
    }
    case Op::rope: {
      const Tensor &x = in[0], &pos = in[1], &freq = in[2], &y = out[0];
      const std::int64_t hd = x.ne[0], nh = x.ne[1], t = x.ne[2] * x.ne[3];
      const std::int32_t rd = call.params.rope_dims;
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(pa, const std::int32_t*, pos, "positions", false, 4);
      COLIBRI_CUDA_BIND(fa, const float*, freq, "inv_freq", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_rope(st, xa, pa, fa, ya, hd, nh, t, rd,
                                            (call.params.flags & sdk::kRopeInterleaved) != 0, call.params.scale)));
      break;
    }
    case Op::attention:
    case Op::attention_sinks: {
      const Tensor &q = in[0], &k = in[1], &v = in[2], &o = out[0];
      const std::int64_t hd = q.ne[0], nh = q.ne[1], t = q.ne[2] * q.ne[3], nkv = k.ne[1];
      if (t > kMaxGridY) return bad("more than 65535 queries in one call");
      COLIBRI_CUDA_BIND(qa, const float*, q, "Q", false, 4);
      COLIBRI_CUDA_BIND(ka, const void*, k, "K", false, weight_align(k.type));
      COLIBRI_CUDA_BIND(va, const void*, v, "V", false, weight_align(v.type));
      COLIBRI_CUDA_BIND(oa, float*, o, "O", true, 4);
      AttentionArgs a{qa,
                      ka,
                      va,
                      oa,
                      static_cast<std::int32_t>(hd),
                      static_cast<std::int32_t>(nh),
                      static_cast<std::int32_t>(nkv),
                      static_cast<std::int32_t>(t),
                      call.params.position,
                      call.params.window,
                      call.params.scale,
                      sdk::row_bytes(k.type, hd)};
      if (call.op == Op::attention_sinks) {
        COLIBRI_CUDA_BIND(sa, const float*, in[3], "sinks", false, 4);
        a.sinks = sa;
      }
      COLIBRI_CUDA_TRY(launched(launch_attention(st, static_cast<std::uint32_t>(k.type), a)));
      break;
    }
    case Op::swiglu:
    case Op::add:
    case Op::mul: {
      const Tensor &a = in[0], &b = in[1], &y = out[0];
      const bool swiglu = call.op == Op::swiglu;
      COLIBRI_CUDA_BIND(aa, const float*, a, swiglu ? "gate" : "A", false, 4);
      COLIBRI_CUDA_BIND(bb, const float*, b, swiglu ? "up" : "B", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "out", true, 4);
      const Eltwise mode = swiglu ? Eltwise::swiglu : call.op == Op::add ? Eltwise::add : Eltwise::mul;
      COLIBRI_CUDA_TRY(launched(launch_eltwise(st, mode, aa, bb, ya, sdk::element_count(a), 1)));
      break;
    }
    case Op::causal_conv: {
      const Tensor &x = in[0], &w = in[1], &y = out[0], &state = out[1];
      if (w.ne[0] > linear::kMaxTaps) {
        return bad("W " + shape_text(w) + ": convolutions of more than " + std::to_string(linear::kMaxTaps) +
                   " taps are not supported by cuda");
      }
      if (x.ne[0] * x.ne[1] > kMaxInt) return bad("X " + shape_text(x) + " is more than 2^31 - 1 elements");
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(wa, const float*, w, "W", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_BIND(sa, float*, state, "state", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_causal_conv(st, xa, wa, ya, sa, x.ne[0], x.ne[1], w.ne[0])));
      break;
    }
    case Op::gated_delta_rule: {
      const Tensor &q = in[0], &v = in[2], &o = out[0], &state = out[1];
      if (q.ne[0] > linear::kMaxDeltaDk) {
        return bad("Q " + shape_text(q) + ": key heads of more than " + std::to_string(linear::kMaxDeltaDk) +
                   " values are not supported by cuda");
      }
      if (v.ne[1] > kMaxGridY) return bad("V " + shape_text(v) + ": more than 65535 value heads in one call");
      if (sdk::element_count(v) > kMaxInt || sdk::element_count(state) > kMaxInt) {
        return bad("V " + shape_text(v) + " or the state " + shape_text(state) + " is more than 2^31 - 1 elements");
      }
      static constexpr const char* kIn[] = {"Q", "K", "V", "a", "b", "A", "dt_bias"};
      const float* ia[7] = {};
      for (std::size_t i = 0; i < 7; ++i) {
        COLIBRI_CUDA_BIND(p_, const float*, in[i], kIn[i], false, 4);
        ia[i] = p_;
      }
      COLIBRI_CUDA_BIND(oa, float*, o, "O", true, 4);
      COLIBRI_CUDA_BIND(sa, float*, state, "state", true, 4);
      const DeltaRuleArgs d{ia[0],   ia[1],   ia[2],   ia[3],   ia[4],
                            ia[5],   ia[6],   oa,      sa,      q.ne[0],
                            v.ne[0], q.ne[1], v.ne[1], q.ne[2], (call.params.flags & sdk::kDeltaTiledHeads) != 0};
      COLIBRI_CUDA_TRY(launched(launch_gated_delta_rule(st, d)));
      break;
    }
    case Op::sigmoid: {
      const Tensor &x = in[0], &y = out[0];
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_eltwise(st, Eltwise::sigmoid, xa, xa, ya, sdk::element_count(x), 1)));
      break;
    }
    case Op::scale_add: {
      const Tensor &x = in[0], &w = in[1], &y = out[0];
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(wa, const float*, w, "w", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_eltwise(st, Eltwise::scale_add, xa, wa, ya, sdk::element_count(x), x.ne[0])));
      break;
    }
    case Op::topk_routing:
    case Op::topk_routing_biased:
    case Op::topk_routing_grouped: {
      const bool grouped = call.op == Op::topk_routing_grouped;
      const bool biased = grouped || call.op == Op::topk_routing_biased;
      const Tensor &l = in[0], &ids = out[0], &wts = out[1];
      const std::int64_t e = l.ne[0], t = sdk::row_count(l), k = call.params.top_k;
      const std::int32_t f = call.params.flags;
      COLIBRI_CUDA_BIND(la, const float*, l, "logits", false, 4);
      const float* ba = nullptr;
      if (biased) {
        COLIBRI_CUDA_BIND(bias_at, const float*, in[1], "bias", false, 4);
        ba = bias_at;
      }
      COLIBRI_CUDA_BIND(ia, std::int32_t*, ids, "ids", true, 4);
      COLIBRI_CUDA_BIND(wa, float*, wts, "weights", true, 4);
      auto sw = status_word();
      if (!sw) return sw.error();
      // Outputs in device memory (the engine's decode): no wait here. A NaN logit marks the token's picks (id -1,
      // weight NaN), which the engine checks when it downloads them; host outputs wait and report it here.
      check_status = ids.buffer == nullptr || wts.buffer == nullptr;
      const int mode = (f & sdk::kRoutingSoftmax) ? 1 : (f & sdk::kRoutingSigmoid) ? 2 : 0;
      const bool renormalize = (f & sdk::kRoutingRenormalize) != 0;
      const auto kk = static_cast<std::int32_t>(k);
      const float scale = call.params.scale;
      COLIBRI_CUDA_TRY(launched(
          grouped  ? launch_topk_grouped(st, la, ba, ia, wa, e, t, kk, mode, renormalize, scale, call.params.groups,
                                         call.params.groups_used, (f & sdk::kRoutingGroupMax) != 0, *sw)
          : biased ? launch_topk_biased(st, la, ba, ia, wa, e, t, kk, mode, renormalize, scale, *sw)
                   : launch_topk(st, la, ia, wa, e, t, kk, mode, renormalize, *sw)));
      break;
    }
    case Op::embedding: {
      const Tensor &table = in[0], &ids = in[1], &y = out[0];
      const std::int64_t d = table.ne[0], v = sdk::row_count(table), t = sdk::element_count(ids);
      if (t > kMaxGridY) return bad("more than 65535 ids in one call");
      COLIBRI_CUDA_BIND(ta, const void*, table, "table", false, weight_align(table.type));
      COLIBRI_CUDA_BIND(ia, const std::int32_t*, ids, "ids", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "out", true, 4);
      auto sw = status_word();
      if (!sw) return sw.error();
      check_status = true;
      COLIBRI_CUDA_TRY(launched(launch_embedding(st, static_cast<std::uint32_t>(table.type), ta,
                                                 sdk::row_bytes(table.type, d), ia, ya, d, v, t, *sw)));
      break;
    }
    case Op::store_rows: {
      const Tensor &x = in[0], &y = out[0];
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(ya, void*, y, "Y", true, weight_align(y.type));
      COLIBRI_CUDA_TRY(
          launched(launch_store_rows(st, static_cast<std::uint32_t>(y.type), xa, ya, sdk::element_count(x))));
      break;
    }
    default: return Status(StatusCode::internal, std::string(name) + ": passed check_op_call but has no kernel");
  }
#undef COLIBRI_CUDA_BIND
#undef COLIBRI_CUDA_TRY

  if (check_status) {
    if (cudaError_t e =
            cudaMemcpyAsync(status_host_, status_dev_, 2 * sizeof(std::int32_t), cudaMemcpyDeviceToHost, st);
        e != cudaSuccess) {
      return cuda_status(e, std::string(name) + ": reading the status word");
    }
  }
  if (Status s = binder.finish(check_status); !s) return s;
  if (check_status && status_host_[0] != 0) {
    const std::int32_t at = status_host_[0] - 1, value = status_host_[1];
    if (call.op == Op::embedding) {
      return bad("token id " + std::to_string(value) + " at position " + std::to_string(at) +
                 " is outside the vocabulary 0.." + std::to_string(sdk::row_count(in[0]) - 1));
    }
    return bad("logit of expert " + std::to_string(value) + " for token " + std::to_string(at) +
               " is NaN (the model produced NaN activations)");
  }
  return {};
}

// expert_ffn_routed for one token: the choice (ids, weights) stays on the device and the kernels read it, so nothing
// here waits for the router. Per call: X quantized once (twice where up's block differs from gate's), gate and up
// each one matmul launch over all k picks, one swiglu over the k columns, their quantization as k tokens, down one
// launch, then the combine: 6 to 7 launches, each element with the operations of expert_ffn at T = 1 followed by the
// engine's add(zeros, zeros) and scale_add per expert in ascending id, so the same bits.
Status CudaCompute::run_routed(const sdk::OpCall& call) {
  const char* name = op_name(call.op);
  const auto& in = call.inputs;
  auto unsupported = [&](const std::string& why) {
    return Status(StatusCode::unsupported, std::string(name) + ": " + why + " (the engine runs the experts itself)");
  };
  auto launched = [&](cudaError_t e) -> Status {
    if (e != cudaSuccess) return cuda_status(e, std::string(name) + ": launching a kernel");
    return {};
  };
  const Tensor &x = in[0], &ids = in[1], &wts = in[2], &y = call.outputs[0];
  const std::size_t experts = (in.size() - 3) / 3;
  const std::int64_t d = x.ne[0], t = sdk::row_count(x), picks = ids.ne[0];
  // What the kernels do not route: the engine falls back, so these come before anything is bound or queued.
  if (t != 1) return unsupported("T = " + std::to_string(t) + "; the routed kernels take one token (decode)");
  if ((call.params.flags & sdk::kExactActivations) != 0) {
    return unsupported("kExactActivations; the routed kernels take 8-bit activations only");
  }
  if (picks > kMaxRoutedPicks) {
    return unsupported("k = " + std::to_string(picks) + " picks; at most " + std::to_string(kMaxRoutedPicks));
  }
  static const char* const kProjection[] = {"W_gate", "W_up", "W_down"};
  for (std::size_t e = 1; e < experts; ++e) {
    for (std::size_t p = 0; p < 3; ++p) {
      const Tensor &a = in[3 + p], &b = in[3 + 3 * e + p];
      if (a.type != b.type || a.ne != b.ne) {
        return unsupported("expert " + std::to_string(e) + "'s " + kProjection[p] + " is " +
                           std::string(to_string(b.type)) + " " + shape_text(b) + " but expert 0's is " +
                           std::string(to_string(a.type)) + " " + shape_text(a) +
                           "; the routed kernels take one type and shape per projection");
      }
    }
  }
  const Tensor &wg = in[3], &wu = in[4], &wd = in[5];
  const std::int64_t f = sdk::row_count(wg);
  const auto gtype = static_cast<std::uint32_t>(wg.type), utype = static_cast<std::uint32_t>(wu.type),
             dtype = static_cast<std::uint32_t>(wd.type);
  const int gate_block = q8_block(gtype, d), up_block = q8_block(utype, d);
  // launch_matmul's own test (takes_q8): the projections the routed matmul takes are those on 8-bit activations.
  for (const auto& [w, k] : {std::pair{&wg, d}, std::pair{&wu, d}, std::pair{&wd, f}}) {
    if (q8_block(static_cast<std::uint32_t>(w->type), k) == 0) {
      return unsupported(std::string(to_string(w->type)) + " weights with rows of " + std::to_string(k) +
                         " take f32 activations, not the routed kernels' 8-bit ones");
    }
  }

  // Scratch after the staged host tensors: gate and up {F, k}, down's outputs {D, k}, X's 8-bit copy (1 token) and
  // the swiglu outputs' (k tokens), each region laid out for its own K and T.
  Binder binder(*this, name);
  const std::size_t col_f = align_up(static_cast<std::size_t>(f * picks) * sizeof(float));
  const std::size_t col_d = align_up(static_cast<std::size_t>(d * picks) * sizeof(float));
  const std::size_t q8x_bytes = align_up(q8_scratch_bytes(d, 1)), q8h_bytes = align_up(q8_scratch_bytes(f, picks));
  if (Status s = binder.reserve(call, 2 * col_f + col_d + q8x_bytes + q8h_bytes); !s) return s;
  float* gate = binder.scratch(0);
  float* up = binder.scratch(col_f);
  float* down = binder.scratch(2 * col_f);
  const Q8Scratch q8x = q8_scratch_at(binder.scratch(2 * col_f + col_d), d, 1);
  const Q8Scratch q8h = q8_scratch_at(binder.scratch(2 * col_f + col_d + q8x_bytes), f, picks);

  auto xa = binder.bind(x, "X", false, 4);
  if (!xa) return xa.error();
  auto ia = binder.bind(ids, "ids", false, 4);
  if (!ia) return ia.error();
  auto wa = binder.bind(wts, "weights", false, 4);
  if (!wa) return wa.error();
  auto ya = binder.bind(y, "Y", true, 4);
  if (!ya) return ya.error();
  routed_key_.assign(3 * experts, nullptr);
  for (std::size_t e = 0; e < experts; ++e) {
    for (std::size_t p = 0; p < 3; ++p) {
      const Tensor& w = in[3 + 3 * e + p];
      const std::string what = "expert " + std::to_string(e) + ": " + kProjection[p];
      auto wp = binder.bind(w, what.c_str(), false, weight_align(w.type));
      if (!wp) return wp.error();
      routed_key_[p * experts + e] = *wp;
    }
  }
  auto table = routed_table();
  if (!table) return table.error();
  const auto* id = static_cast<const std::int32_t*>(*ia);
  const auto e32 = static_cast<std::int32_t>(experts);
  const auto* xf = static_cast<const float*>(*xa);
  const auto n_experts = static_cast<std::ptrdiff_t>(experts);
  cudaStream_t st = dev_->compute;
  // gate and up: X quantized once where their blocks agree, as expert_ffn's reuse of X's 8-bit copy.
  if (Status s = launched(launch_quantize_q8(st, gtype, xf, q8x, d, 1)); !s) return s;
  if (Status s = launched(launch_matmul_q8_routed(st, gtype, *table, id, e32, sdk::row_bytes(wg.type, d), q8x, false,
                                                  gate, d, f, picks));
      !s) {
    return s;
  }
  if (up_block != gate_block) {
    if (Status s = launched(launch_quantize_q8(st, utype, xf, q8x, d, 1)); !s) return s;
  }
  if (Status s = launched(launch_matmul_q8_routed(st, utype, *table + n_experts, id, e32, sdk::row_bytes(wu.type, d),
                                                  q8x, false, up, d, f, picks));
      !s) {
    return s;
  }
  if (Status s = launched(launch_eltwise(st, Eltwise::swiglu, gate, up, gate, f * picks, 1)); !s) return s;
  // down: pick j's swiglu output is token j of k, quantized per token (the integers it has alone).
  if (Status s = launched(launch_quantize_q8(st, dtype, gate, q8h, f, picks)); !s) return s;
  if (Status s = launched(launch_matmul_q8_routed(st, dtype, *table + 2 * n_experts, id, e32,
                                                  sdk::row_bytes(wd.type, f), q8h, true, down, f, d, picks));
      !s) {
    return s;
  }
  if (Status s = launched(
          launch_routed_combine(st, down, id, static_cast<const float*>(*wa), static_cast<float*>(*ya), d, picks, e32));
      !s) {
    return s;
  }
  return binder.finish(false);
}

Expected<const void* const*> CudaCompute::routed_table() {
  // A lost graph segment took table uploads with it: every table is made again (its upload may be among them).
  const bool lost = dev_->graphs.losses != tables_losses_;
  if (!lost) {
    if (auto it = tables_.find(routed_key_); it != tables_.end()) return it->second;
  }
  const std::size_t n = routed_key_.size();
  // Bounded: past a few thousand tables (experts moving between slots, say) every table goes at once, after the
  // queued kernels that read them and the uploads from their pinned slots (a rare wait).
  constexpr std::size_t kMaxTables = 4096, kMaxPointers = std::size_t{1} << 20, kSlabPointers = std::size_t{1} << 16;
  if (lost || tables_.size() >= kMaxTables || table_pointers_ + n > kMaxPointers) {
    if (Status s = dev_->flush_graph_locked(); !s) return s;  // captured kernels read tables too
    tables_losses_ = dev_->graphs.losses;
    if (cudaError_t e = cudaStreamSynchronize(dev_->compute); e != cudaSuccess) {
      return cuda_status(e, "expert_ffn_routed: waiting to drop the experts' pointer tables");
    }
    tables_.clear();
    table_pointers_ = 0;
    for (TableSlab& slab : table_slabs_) slab.used = 0;
  }
  TableSlab* slab = nullptr;
  for (TableSlab& s : table_slabs_) {
    if (s.capacity - s.used >= n) {
      slab = &s;
      break;
    }
  }
  if (slab == nullptr) {
    TableSlab fresh;
    fresh.capacity = std::max(n, kSlabPointers);
    const std::size_t bytes = fresh.capacity * sizeof(void*);
    void *host = nullptr, *device = nullptr;
    cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocPortable);
    if (e == cudaSuccess) e = cudaMalloc(&device, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaFreeHost(host);
      return cuda_status(e, "expert_ffn_routed: allocating " + std::to_string(bytes) + " bytes for pointer tables",
                         StatusCode::out_of_memory);
    }
    fresh.host = static_cast<const void**>(host);
    fresh.device = static_cast<const void**>(device);
    table_slabs_.push_back(fresh);
    slab = &table_slabs_.back();
  }
  const void** host = slab->host + slab->used;
  const void** device = slab->device + slab->used;
  std::copy(routed_key_.begin(), routed_key_.end(), host);
  // On the op stream, so the kernels after it see the table; its pinned source is never rewritten before the
  // eviction above has waited for it.
  if (cudaError_t e = cudaMemcpyAsync(device, host, n * sizeof(void*), cudaMemcpyHostToDevice, dev_->compute);
      e != cudaSuccess) {
    return cuda_status(e, "expert_ffn_routed: uploading the experts' pointer table");
  }
  slab->used += n;
  table_pointers_ += n;
  tables_.emplace(routed_key_, device);
  return static_cast<const void* const*>(device);
}

}  // namespace colibri::cuda
