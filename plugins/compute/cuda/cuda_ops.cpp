// compute/cuda: op validation and dispatch. Every op checks shapes, types and ranges on the host (a
// bad shape is an error naming the op and tensor, never a device fault), resolves each tensor to a
// device pointer, launches on the compute stream and waits: run() returns with the outputs written,
// like the CPU and Vulkan backends. Host tensors (data, no buffer) go through pinned staging into a
// device arena and back.
#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_compute.hpp"
#include "cuda_kernels.hpp"

namespace colibri::cuda {

using sdk::DType;
using sdk::Expected;
using sdk::Op;
using sdk::Status;
using sdk::StatusCode;
using sdk::Tensor;

namespace {

constexpr std::int64_t kMaxHeadDim = 256;
constexpr std::int64_t kMaxInt = 0x7FFFFFFF;
constexpr std::int64_t kMaxGridY = 65535;
constexpr std::int64_t kMaxMatmulTokens = kMaxGridY * 8;  // token tiles of 8 on grid.y
constexpr std::size_t kArenaAlign = 256;

bool weight_type_ok(DType t) {
  switch (t) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::q8_0:
    case DType::q4_0:
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k: return true;
    default: return false;
  }
}
bool kv_type_ok(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::q8_0;
}

std::string shape_text(const Tensor& t) {
  std::string s = std::string(sdk::to_string(t.type)) + " {";
  for (std::size_t i = 0; i < 4; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "}";
}
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
  return t == DType::f32 ? 4 : 2;
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
    for (const Tensor& t : call.inputs) {
      if (t.buffer == nullptr && t.data != nullptr) host += align_up(tensor_bytes(t));
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
    const auto* traits = sdk::dtype_traits(t.type);
    if (traits == nullptr) return error(what, "has an unknown type id " + std::to_string(static_cast<int>(t.type)));
    for (std::size_t i = 0; i < 4; ++i) {
      if (t.ne[i] <= 0) return error(what, "has a non-positive dimension: " + shape_text(t));
    }
    const std::size_t rb = sdk::row_bytes(t.type, t.ne[0]);
    if (rb == 0) {
      return error(what, "rows of " + std::to_string(t.ne[0]) + " elements are not whole " + std::string(traits->name) +
                             " blocks of " + std::to_string(traits->block_elems));
    }
    const std::size_t bytes = rb * static_cast<std::size_t>(sdk::row_count(t));
    std::byte* ptr = nullptr;
    if (t.buffer != nullptr) {
      const auto* cb = dynamic_cast<const CudaBuffer*>(t.buffer);
      if (cb == nullptr || cb->device() != c_.dev_.get()) return error(what, "lives in a buffer of another backend");
      if (t.offset > cb->size() || bytes > cb->size() - t.offset) {
        return error(what, shape_text(t) + " needs " + std::to_string(bytes) + " bytes at offset " +
                               std::to_string(t.offset) + " but its buffer holds " + std::to_string(cb->size()));
      }
      ptr = cb->device_pointer() + t.offset;
    } else if (t.data != nullptr) {
      if (used_ + bytes > scratch_at_) return error(what, "was not counted by reserve()");
      ptr = static_cast<std::byte*>(c_.arena_) + used_;
      std::byte* pinned = static_cast<std::byte*>(c_.staging_) + used_;
      // Outputs are uploaded too: scale_add accumulates into its output.
      std::memcpy(pinned, t.data, bytes);
      if (cudaError_t e = cudaMemcpyAsync(ptr, pinned, bytes, cudaMemcpyHostToDevice, c_.dev_->compute);
          e != cudaSuccess) {
        return cuda_status(e, std::string(op_) + ": uploading " + what);
      }
      if (is_output) staged_out_.push_back({t.data, pinned, ptr, bytes});
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

  // After the kernels were queued: downloads staged outputs, waits, copies them to the caller.
  Status finish() {
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
};

Status CudaCompute::grow(void*& ptr, std::size_t& capacity, std::size_t bytes, bool pinned, const char* what) {
  if (capacity >= bytes) return {};
  const std::size_t want = std::max(bytes, capacity + capacity / 2);
  if (ptr != nullptr) {
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
  switch (op) {
    case Op::matmul:
    case Op::expert_ffn:
    case Op::embedding: return weight_type_ok(weight_type);
    case Op::attention: return kv_type_ok(weight_type);
    case Op::rms_norm:
    case Op::rope:
    case Op::swiglu:
    case Op::add:
    case Op::topk_routing:
    case Op::scale_add:
    case Op::sigmoid: return weight_type == DType::f32;
    default: return false;
  }
}

Status CudaCompute::run(const sdk::OpCall& call) noexcept {
  return sdk::guarded(op_name(call.op), [&] {
    std::lock_guard lock(run_mu_);
    if (Status s = dev_->use(); !s) return s;
    return run_impl(call);
  });
}

Status CudaCompute::run_impl(const sdk::OpCall& call) {
  const char* name = op_name(call.op);
  const auto& in = call.inputs;
  const auto& out = call.outputs;
  auto count_error = [&](std::size_t n_in, std::size_t n_out) {
    return Status(StatusCode::invalid_argument, std::string(name) + " takes " + std::to_string(n_in) + " inputs and " +
                                                    std::to_string(n_out) + " outputs; got " +
                                                    std::to_string(in.size()) + " and " + std::to_string(out.size()));
  };
  auto bad = [&](const std::string& m) { return Status(StatusCode::invalid_argument, std::string(name) + ": " + m); };
  auto need = [&](const Tensor& t, DType type, const char* what) -> Status {
    if (t.type != type)
      return bad(std::string(what) + " must be " + std::string(sdk::to_string(type)) + ", got " + shape_text(t));
    if (sdk::element_count(t) > kMaxInt) return bad(std::string(what) + " has more than 2^31 elements; split the call");
    return {};
  };
  auto unsupported_weight = [&](const Tensor& w) {
    return Status(StatusCode::unsupported, std::string(name) + ": weight type " + std::string(sdk::to_string(w.type)) +
                                               " is not supported by cuda");
  };
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
  std::size_t extra_scratch = 0;
  if (call.op == Op::expert_ffn && in.size() == 4) {
    const std::int64_t f = sdk::row_count(in[0]), t = sdk::row_count(in[3]);
    if (f > 0 && t > 0 && f * t <= kMaxInt)
      extra_scratch = 2 * align_up(static_cast<std::size_t>(f * t) * sizeof(float));
  }
  COLIBRI_CUDA_TRY(binder.reserve(call, extra_scratch));
  cudaStream_t st = dev_->compute;

  switch (call.op) {
    case Op::matmul: {
      if ((in.size() != 2 && in.size() != 3) || out.size() != 1) return count_error(2, 1);
      const Tensor &w = in[0], &x = in[1], &y = out[0];
      if (!weight_type_ok(w.type)) return unsupported_weight(w);
      COLIBRI_CUDA_TRY(need(x, DType::f32, "X"));
      COLIBRI_CUDA_TRY(need(y, DType::f32, "Y"));
      const std::int64_t k = w.ne[0], n = sdk::row_count(w), t = sdk::row_count(x);
      if (x.ne[0] != k) return bad("X " + shape_text(x) + " does not match W " + shape_text(w) + " (ne[0] differs)");
      if (y.ne[0] != n || sdk::row_count(y) != t) {
        return bad("Y " + shape_text(y) + " must be {" + std::to_string(n) + ", " + std::to_string(t) + "}");
      }
      if (t > kMaxMatmulTokens) return bad("more than " + std::to_string(kMaxMatmulTokens) + " tokens in one call");
      COLIBRI_CUDA_BIND(wa, const void*, w, "W", false, weight_align(w.type));
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      const float* ba = nullptr;
      if (in.size() == 3) {
        COLIBRI_CUDA_TRY(need(in[2], DType::f32, "bias"));
        if (sdk::element_count(in[2]) != n) return bad("bias must have N = " + std::to_string(n) + " elements");
        COLIBRI_CUDA_BIND(b, const float*, in[2], "bias", false, 4);
        ba = b;
      }
      COLIBRI_CUDA_TRY(launched(
          launch_matmul(st, static_cast<std::uint32_t>(w.type), wa, sdk::row_bytes(w.type, k), xa, ya, ba, k, n, t)));
      break;
    }
    case Op::expert_ffn: {
      if (in.size() != 4 || out.size() != 1) return count_error(4, 1);
      const Tensor &wg = in[0], &wu = in[1], &wd = in[2], &x = in[3], &y = out[0];
      for (const Tensor* w : {&wg, &wu, &wd}) {
        if (!weight_type_ok(w->type)) return unsupported_weight(*w);
      }
      COLIBRI_CUDA_TRY(need(x, DType::f32, "X"));
      COLIBRI_CUDA_TRY(need(y, DType::f32, "Y"));
      const std::int64_t d = wg.ne[0], f = sdk::row_count(wg), t = sdk::row_count(x);
      if (wu.ne[0] != d || sdk::row_count(wu) != f)
        return bad("W_up " + shape_text(wu) + " must match W_gate " + shape_text(wg));
      if (wd.ne[0] != f || sdk::row_count(wd) != d) {
        return bad("W_down " + shape_text(wd) + " must be {" + std::to_string(f) + ", " + std::to_string(d) + "}");
      }
      if (x.ne[0] != d) return bad("X " + shape_text(x) + " must have ne[0] = " + std::to_string(d));
      if (y.ne[0] != d || sdk::row_count(y) != t) return bad("Y " + shape_text(y) + " must match X");
      if (f * t > kMaxInt) return bad("F x T exceeds 2^31; split the call");
      if (t > kMaxMatmulTokens) return bad("more than " + std::to_string(kMaxMatmulTokens) + " tokens in one call");
      COLIBRI_CUDA_BIND(ga, const void*, wg, "W_gate", false, weight_align(wg.type));
      COLIBRI_CUDA_BIND(ua, const void*, wu, "W_up", false, weight_align(wu.type));
      COLIBRI_CUDA_BIND(da, const void*, wd, "W_down", false, weight_align(wd.type));
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      float* gate = binder.scratch(0);
      float* up = binder.scratch(extra_scratch / 2);
      // Same numerics as matmul + swiglu + matmul: the same kernels, in that order.
      COLIBRI_CUDA_TRY(launched(launch_matmul(st, static_cast<std::uint32_t>(wg.type), ga, sdk::row_bytes(wg.type, d),
                                              xa, gate, nullptr, d, f, t)));
      COLIBRI_CUDA_TRY(launched(launch_matmul(st, static_cast<std::uint32_t>(wu.type), ua, sdk::row_bytes(wu.type, d),
                                              xa, up, nullptr, d, f, t)));
      COLIBRI_CUDA_TRY(launched(launch_eltwise(st, Eltwise::swiglu, gate, up, gate, f * t, 1)));
      COLIBRI_CUDA_TRY(launched(launch_matmul(st, static_cast<std::uint32_t>(wd.type), da, sdk::row_bytes(wd.type, f),
                                              gate, ya, nullptr, f, d, t)));
      break;
    }
    case Op::rms_norm: {
      if (in.size() != 2 || out.size() != 1) return count_error(2, 1);
      const Tensor &x = in[0], &w = in[1], &y = out[0];
      COLIBRI_CUDA_TRY(need(x, DType::f32, "X"));
      COLIBRI_CUDA_TRY(need(w, DType::f32, "w"));
      COLIBRI_CUDA_TRY(need(y, DType::f32, "Y"));
      if (sdk::element_count(w) != x.ne[0]) return bad("w must have D = " + std::to_string(x.ne[0]) + " elements");
      if (y.ne[0] != x.ne[0] || sdk::row_count(y) != sdk::row_count(x))
        return bad("Y " + shape_text(y) + " must match X " + shape_text(x));
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(wa, const float*, w, "w", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_rms_norm(st, xa, wa, ya, x.ne[0], sdk::row_count(x), call.params.eps)));
      break;
    }
    case Op::rope: {
      if (in.size() != 3 || out.size() != 1) return count_error(3, 1);
      const Tensor &x = in[0], &pos = in[1], &freq = in[2], &y = out[0];
      COLIBRI_CUDA_TRY(need(x, DType::f32, "X"));
      COLIBRI_CUDA_TRY(need(pos, DType::i32, "positions"));
      COLIBRI_CUDA_TRY(need(freq, DType::f32, "inv_freq"));
      COLIBRI_CUDA_TRY(need(y, DType::f32, "Y"));
      const std::int64_t hd = x.ne[0], nh = x.ne[1], t = x.ne[2] * x.ne[3];
      const std::int32_t rd = call.params.rope_dims;
      if (hd % 2 != 0) return bad("head_dim " + std::to_string(hd) + " must be even");
      if (rd <= 0 || rd % 2 != 0 || rd > hd) {
        return bad("params.rope_dims " + std::to_string(rd) + " must be even and in 2.." + std::to_string(hd));
      }
      if (sdk::element_count(pos) != t) return bad("positions must have T = " + std::to_string(t) + " entries");
      if (sdk::element_count(freq) != rd / 2)
        return bad("inv_freq must have rope_dims / 2 = " + std::to_string(rd / 2) + " entries");
      if (sdk::element_count(y) != sdk::element_count(x) || y.ne[0] != hd)
        return bad("Y " + shape_text(y) + " must match X " + shape_text(x));
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(pa, const std::int32_t*, pos, "positions", false, 4);
      COLIBRI_CUDA_BIND(fa, const float*, freq, "inv_freq", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_rope(st, xa, pa, fa, ya, hd, nh, t, rd,
                                            (call.params.flags & sdk::kRopeInterleaved) != 0, call.params.scale)));
      break;
    }
    case Op::attention: {
      if (in.size() != 3 || out.size() != 1) return count_error(3, 1);
      const Tensor &q = in[0], &k = in[1], &v = in[2], &o = out[0];
      COLIBRI_CUDA_TRY(need(q, DType::f32, "Q"));
      COLIBRI_CUDA_TRY(need(o, DType::f32, "O"));
      if (!kv_type_ok(k.type) || k.type != v.type) {
        return Status(StatusCode::unsupported, "attention: KV cache types " + std::string(sdk::to_string(k.type)) +
                                                   " / " + std::string(sdk::to_string(v.type)) +
                                                   " are not supported by cuda (f32, f16 or q8_0, both the same)");
      }
      const std::int64_t hd = q.ne[0], nh = q.ne[1], t = q.ne[2] * q.ne[3];
      const std::int64_t nkv = k.ne[1], s = k.ne[2] * k.ne[3];
      if (hd > kMaxHeadDim) return bad("head_dim " + std::to_string(hd) + " exceeds 256");
      if (k.ne[0] != hd || v.ne[0] != hd || v.ne[1] != nkv || v.ne[2] * v.ne[3] != s) {
        return bad("K " + shape_text(k) + " and V " + shape_text(v) + " must be {" + std::to_string(hd) +
                   ", n_kv_heads, S} like Q " + shape_text(q));
      }
      if (nkv <= 0 || nh % nkv != 0) {
        return bad(std::to_string(nh) + " query heads are not a multiple of " + std::to_string(nkv) + " KV heads");
      }
      if (call.params.position < 0 || call.params.window < 0)
        return bad("params.position and params.window must be >= 0");
      if (call.params.position + t > s) {
        return bad("queries at positions " + std::to_string(call.params.position) + ".." +
                   std::to_string(call.params.position + t - 1) + " need " + std::to_string(call.params.position + t) +
                   " cached keys; the cache holds " + std::to_string(s));
      }
      if (t > kMaxGridY) return bad("more than 65535 queries in one call");
      if (sdk::element_count(o) != sdk::element_count(q) || o.ne[0] != hd)
        return bad("O " + shape_text(o) + " must match Q " + shape_text(q));
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
      COLIBRI_CUDA_TRY(launched(launch_attention(st, static_cast<std::uint32_t>(k.type), a)));
      break;
    }
    case Op::swiglu:
    case Op::add: {
      if (in.size() != 2 || out.size() != 1) return count_error(2, 1);
      const Tensor &a = in[0], &b = in[1], &y = out[0];
      const bool add = call.op == Op::add;
      COLIBRI_CUDA_TRY(need(a, DType::f32, add ? "A" : "gate"));
      COLIBRI_CUDA_TRY(need(b, DType::f32, add ? "B" : "up"));
      COLIBRI_CUDA_TRY(need(y, DType::f32, "out"));
      if (sdk::element_count(b) != sdk::element_count(a) || b.ne[0] != a.ne[0] ||
          sdk::element_count(y) != sdk::element_count(a) || y.ne[0] != a.ne[0]) {
        return bad("shapes differ: " + shape_text(a) + ", " + shape_text(b) + " -> " + shape_text(y));
      }
      COLIBRI_CUDA_BIND(aa, const float*, a, add ? "A" : "gate", false, 4);
      COLIBRI_CUDA_BIND(bb, const float*, b, add ? "B" : "up", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "out", true, 4);
      COLIBRI_CUDA_TRY(
          launched(launch_eltwise(st, add ? Eltwise::add : Eltwise::swiglu, aa, bb, ya, sdk::element_count(a), 1)));
      break;
    }
    case Op::sigmoid: {
      if (in.size() != 1 || out.size() != 1) return count_error(1, 1);
      const Tensor &x = in[0], &y = out[0];
      COLIBRI_CUDA_TRY(need(x, DType::f32, "X"));
      COLIBRI_CUDA_TRY(need(y, DType::f32, "Y"));
      if (sdk::element_count(y) != sdk::element_count(x) || y.ne[0] != x.ne[0])
        return bad("Y " + shape_text(y) + " must match X " + shape_text(x));
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_eltwise(st, Eltwise::sigmoid, xa, xa, ya, sdk::element_count(x), 1)));
      break;
    }
    case Op::scale_add: {
      if (in.size() != 2 || out.size() != 1) return count_error(2, 1);
      const Tensor &x = in[0], &w = in[1], &y = out[0];
      COLIBRI_CUDA_TRY(need(x, DType::f32, "X"));
      COLIBRI_CUDA_TRY(need(w, DType::f32, "w"));
      COLIBRI_CUDA_TRY(need(y, DType::f32, "Y"));
      if (sdk::element_count(w) != sdk::row_count(x))
        return bad("w must have T = " + std::to_string(sdk::row_count(x)) + " entries");
      if (sdk::element_count(y) != sdk::element_count(x) || y.ne[0] != x.ne[0])
        return bad("Y " + shape_text(y) + " must match X " + shape_text(x));
      COLIBRI_CUDA_BIND(xa, const float*, x, "X", false, 4);
      COLIBRI_CUDA_BIND(wa, const float*, w, "w", false, 4);
      COLIBRI_CUDA_BIND(ya, float*, y, "Y", true, 4);
      COLIBRI_CUDA_TRY(launched(launch_eltwise(st, Eltwise::scale_add, xa, wa, ya, sdk::element_count(x), x.ne[0])));
      break;
    }
    case Op::topk_routing: {
      if (in.size() != 1 || out.size() != 2) return count_error(1, 2);
      const Tensor &l = in[0], &ids = out[0], &wts = out[1];
      COLIBRI_CUDA_TRY(need(l, DType::f32, "logits"));
      COLIBRI_CUDA_TRY(need(ids, DType::i32, "ids"));
      COLIBRI_CUDA_TRY(need(wts, DType::f32, "weights"));
      const std::int64_t e = l.ne[0], t = sdk::row_count(l), k = call.params.top_k;
      if (k < 1 || k > e) return bad("params.top_k " + std::to_string(k) + " must be in 1.." + std::to_string(e));
      if (ids.ne[0] != k || sdk::row_count(ids) != t || wts.ne[0] != k || sdk::row_count(wts) != t) {
        return bad("ids and weights must be {" + std::to_string(k) + ", " + std::to_string(t) + "}");
      }
      const std::int32_t f = call.params.flags;
      if ((f & sdk::kRoutingSoftmax) && (f & sdk::kRoutingSigmoid)) {
        return bad("flags kRoutingSoftmax and kRoutingSigmoid exclude each other");
      }
      COLIBRI_CUDA_BIND(la, const float*, l, "logits", false, 4);
      COLIBRI_CUDA_BIND(ia, std::int32_t*, ids, "ids", true, 4);
      COLIBRI_CUDA_BIND(wa, float*, wts, "weights", true, 4);
      auto sw = status_word();
      if (!sw) return sw.error();
      check_status = true;
      const int mode = (f & sdk::kRoutingSoftmax) ? 1 : (f & sdk::kRoutingSigmoid) ? 2 : 0;
      COLIBRI_CUDA_TRY(launched(launch_topk(st, la, ia, wa, e, t, static_cast<std::int32_t>(k), mode,
                                            (f & sdk::kRoutingRenormalize) != 0, *sw)));
      break;
    }
    case Op::embedding: {
      if (in.size() != 2 || out.size() != 1) return count_error(2, 1);
      const Tensor &table = in[0], &ids = in[1], &y = out[0];
      if (!weight_type_ok(table.type)) {
        return Status(StatusCode::unsupported,
                      "embedding: table type " + std::string(sdk::to_string(table.type)) + " is not supported by cuda");
      }
      COLIBRI_CUDA_TRY(need(ids, DType::i32, "ids"));
      COLIBRI_CUDA_TRY(need(y, DType::f32, "out"));
      const std::int64_t d = table.ne[0], v = sdk::row_count(table), t = sdk::element_count(ids);
      if (v > kMaxInt) return bad("the table has more than 2^31 rows");
      if (t > kMaxGridY) return bad("more than 65535 ids in one call");
      if (y.ne[0] != d || sdk::row_count(y) != t) {
        return bad("out " + shape_text(y) + " must be {" + std::to_string(d) + ", " + std::to_string(t) + "}");
      }
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
    default:
      return Status(StatusCode::unsupported,
                    "op " + std::to_string(static_cast<int>(call.op)) +
                        " is not in the op set this cuda backend was built with (a newer SDK's op?)");
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
  if (Status s = binder.finish(); !s) return s;
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

}  // namespace colibri::cuda
