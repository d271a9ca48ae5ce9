// compute/cpu: the reference backend. Every op of compute.hpp on host memory, with hand-written
// AVX2 / AVX-512 (VNNI) row kernels picked at run time and the scalar path kept selectable
// (`isa: scalar`). Output rows are split across a thread pool; the reduction of one output is
// never split, so neither batch composition nor thread count changes a bit.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "colibri/quant/quant.hpp"
#include "colibri/sdk/cpu_features.hpp"
#include "colibri/sdk/sdk.hpp"
#include "kernels.hpp"
#include "thread_pool.hpp"

namespace colibri::cpu {
namespace {

using namespace colibri::sdk;

// Query heads one attention task takes at most (they share each key and value row it reads).
constexpr std::int64_t kMaxGroupedQueries = 8;

// ------------------------------------------------------------------ CPU features (create time only)

bool cpu_has_avx2() noexcept {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && sdk::cpu_has_f16c();
}

bool cpu_has_avxvnni() noexcept {
  return cpu_has_avx2() && sdk::cpu_has_avx_vnni();
}

bool cpu_has_avx512() noexcept {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

// ------------------------------------------------------------------ host buffers

class HostBuffer final : public Buffer {
 public:
  HostBuffer(HostServices& host, void* data, std::size_t size) : host_(host), data_(data), size_(size) {}
  ~HostBuffer() override { host_.free_aligned(data_); }
  [[nodiscard]] std::size_t size() const noexcept override { return size_; }
  [[nodiscard]] void* host_pointer() noexcept override { return data_; }

 private:
  HostServices& host_;
  void* data_;
  std::size_t size_;
};

// 64-byte aligned scratch that only grows.
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  std::byte* get(std::size_t bytes) {
    if (bytes > size_) {
      std::free(data_);
      size_ = (bytes + 63) / 64 * 64;
      data_ = static_cast<std::byte*>(std::aligned_alloc(64, size_));
      if (data_ == nullptr) {
        size_ = 0;
        throw std::bad_alloc();
      }
    }
    return data_;
  }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// ------------------------------------------------------------------ validation helpers

std::string shape(const Tensor& t) {
  std::string s = std::string(to_string(t.type)) + " {" + std::to_string(t.ne[0]);
  int last = 3;
  while (last > 1 && t.ne[last] == 1) --last;
  for (int i = 1; i <= last; ++i) s += ", " + std::to_string(t.ne[i]);
  return s + "}";
}

Status bad(const char* op, const std::string& what) {
  return Status(StatusCode::invalid_argument, std::string(op) + ": " + what);
}

// Shape sanity and the host address of a tensor.
Status resolve(const char* op, const char* role, const Tensor& t, std::byte*& out) {
  for (int i = 0; i < 4; ++i) {
    if (t.ne[i] < 1)
      return bad(op, std::string(role) + " has ne[" + std::to_string(i) + "] = " + std::to_string(t.ne[i]) +
                         "; every dimension must be >= 1");
  }
  const auto* traits = dtype_traits(t.type);
  if (traits == nullptr)
    return Status(StatusCode::unsupported, std::string(op) + ": " + role + " has an unknown type id " +
                                               std::to_string(static_cast<unsigned>(t.type)));
  const std::size_t rb = row_bytes(t.type, t.ne[0]);
  if (rb == 0) {
    return bad(op, std::string(role) + " " + shape(t) + ": ne[0] must be a multiple of " +
                       std::to_string(traits->block_elems) + " for " + std::string(traits->name));
  }
  const std::size_t bytes = rb * static_cast<std::size_t>(sdk::row_count(t));
  // The kernels read through the type's block struct (or float, uint16_t): a misaligned start is undefined.
  auto aligned = [&](std::byte* p) -> Status {
    const std::size_t need = sdk::data_alignment(t.type);
    if (reinterpret_cast<std::uintptr_t>(p) % need == 0) {
      out = p;
      return {};
    }
    return bad(op, std::string(role) + " " + shape(t) + " starts at an address that is not a multiple of " +
                       std::to_string(need) + ", which " + std::string(traits->name) + " data needs");
  };
  if (t.data != nullptr) return aligned(static_cast<std::byte*>(t.data));
  if (t.buffer == nullptr) return bad(op, std::string(role) + " has neither data nor buffer");
  auto* base = static_cast<std::byte*>(t.buffer->host_pointer());
  if (base == nullptr)
    return Status(StatusCode::unsupported,
                  std::string(op) + ": " + role + " lives in a buffer that is not host-visible");
  if (t.offset > t.buffer->size() || bytes > t.buffer->size() - t.offset) {
    return bad(op, std::string(role) + " " + shape(t) + " needs " + std::to_string(bytes) + " bytes at offset " +
                       std::to_string(t.offset) + " but its buffer holds " + std::to_string(t.buffer->size()));
  }
  return aligned(base + t.offset);
}

Status need_type(const char* op, const char* role, const Tensor& t, DType type) {
  if (t.type != type) {
    return Status(StatusCode::unsupported,
                  std::string(op) + ": " + role + " must be " + std::string(to_string(type)) + ", got " + shape(t));
  }
  return {};
}

Status need_count(const char* op, const OpCall& c, std::size_t min_in, std::size_t max_in, std::size_t outs) {
  if (c.inputs.size() < min_in || c.inputs.size() > max_in) {
    return bad(op, "expects " + std::to_string(min_in) + (max_in != min_in ? ".." + std::to_string(max_in) : "") +
                       " inputs, got " + std::to_string(c.inputs.size()));
  }
  if (c.outputs.size() != outs)
    return bad(op, "expects " + std::to_string(outs) + " outputs, got " + std::to_string(c.outputs.size()));
  return {};
}

#define COLIBRI_TRY(expr)                 \
  do {                                    \
    if (auto _s = (expr); !_s) return _s; \
  } while (0)

// ------------------------------------------------------------------ the backend

struct Options {
  int threads = 1;
  const KernelSet* kernels = nullptr;
  std::string isa;
  // One token's q6_K matmuls through the 8-row kernel, else one row at a time (the same bits either way). From
  // memory on an AMD family 19h (Zen 4: AVX-512 in two halves) guest, 2 threads, the row-at-a-time dot was 1.45x
  // faster (4096 x 4096) and decode 1.08-1.11x; on the Zen 5 guest of 30 Nov the 8-row kernel beat the dot of then.
  bool q6k_rows = true;
};

class CpuCompute final : public ComputeBase {
 public:
  static Expected<std::unique_ptr<CpuCompute>> create(const CreateContext& ctx) {
    auto isa = ctx.config->get_string("isa", "auto");
    if (!isa) return isa.error();
    auto threads = ctx.config->get_int("threads", 0);
    if (!threads) return threads.error();
    if (*threads < 0 || *threads > 1024) {
      return Status(StatusCode::invalid_argument,
                    "compute.threads must be auto, 0 (auto) or 1..1024, got " + std::to_string(*threads));
    }
    Options o;
    const bool has512 = cpu_has_avx512(), has_vnni = cpu_has_avxvnni(), has2 = cpu_has_avx2();
    if (*isa == "auto") {
      o.kernels = has512     ? &avx512_kernels()
                  : has_vnni ? &avxvnni_kernels()
                  : has2     ? &avx2_kernels()
                             : &scalar_kernels();
    } else if (*isa == "scalar") {
      o.kernels = &scalar_kernels();
    } else if (*isa == "avx2") {
      if (!has2)
        return Status(StatusCode::unsupported,
                      "compute.isa=avx2 needs avx2, fma and f16c, which this CPU lacks; use isa: auto");
      o.kernels = &avx2_kernels();
    } else if (*isa == "avxvnni") {
      if (!has_vnni)
        return Status(StatusCode::unsupported,
                      "compute.isa=avxvnni needs avx2, fma, f16c and avxvnni, which this CPU lacks; use isa: auto");
      o.kernels = &avxvnni_kernels();
    } else if (*isa == "avx512") {
      if (!has512)
        return Status(
            StatusCode::unsupported,
            "compute.isa=avx512 needs avx512f, avx512bw, avx512vl and avx512vnni, which this CPU lacks; use isa: auto");
      o.kernels = &avx512_kernels();
    } else {
      return Status(StatusCode::invalid_argument,
                    "compute.isa must be auto, scalar, avx2, avxvnni or avx512, got '" + *isa + "'");
    }
    const KernelSet& ks = *o.kernels;
    const bool complete = ks.f32 && ks.f16 && ks.bf16 && ks.q8_0 && ks.q4_0 && ks.q2_k && ks.q3_k && ks.q4_k &&
                          ks.q5_k && ks.q6_k && ks.mxfp4 && ks.scale_axpy;
    if (!complete)
      return Status(StatusCode::internal, std::string("compute/cpu: kernel set ") + ks.name + " is incomplete");
    o.isa = ks.name;
    auto q6k = ctx.config->get_string("q6k_decode", "auto");
    if (!q6k) return q6k.error();
    if (*q6k != "auto" && *q6k != "rows" && *q6k != "dot") {
      return Status(StatusCode::invalid_argument, "compute.q6k_decode must be auto, rows or dot, got '" + *q6k + "'");
    }
    o.q6k_rows = *q6k == "rows" || (*q6k == "auto" && !__builtin_cpu_is("amdfam19h"));
    auto prefetch = ctx.config->get_string("prefetch", "auto");
    if (!prefetch) return prefetch.error();
    if (*prefetch != "auto" && *prefetch != "l1" && *prefetch != "l2") {
      return Status(StatusCode::invalid_argument, "compute.prefetch must be auto, l1 or l2, got '" + *prefetch + "'");
    }
    // Zen 3/4 (family 19h): the q4_K rows kernel from memory 1.38x with its prefetches to L2 (2 threads, 4096 x
    // 4096), the other formats the same; elsewhere to L1, as the kernels were tuned on Intel.
    prefetch_to_l2.store(*prefetch == "l2" || (*prefetch == "auto" && __builtin_cpu_is("amdfam19h")));
    const unsigned cores = ctx.host_info != nullptr ? ctx.host_info->physical_cores : 1;
    o.threads = *threads > 0 ? static_cast<int>(*threads) : static_cast<int>(std::max(1u, cores));
    return std::make_unique<CpuCompute>(*ctx.host, o);
  }

  CpuCompute(HostServices& host, const Options& o) : host_(host), opt_(o), pool_(o.threads), scratch_(o.threads) {
    DeviceInfo d;
    d.name = "cpu (" + std::to_string(o.threads) + (o.threads == 1 ? " thread, " : " threads, ") + o.isa + ")";
    d.host_memory = true;
    const long pages = ::sysconf(_SC_PHYS_PAGES), avail = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) d.memory_total = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
    if (avail > 0 && page > 0)
      d.memory_available = static_cast<std::uint64_t>(avail) * static_cast<std::uint64_t>(page);
    d.capabilities = o.isa == "avx512"    ? "avx512 vnni avx2 fma f16c"
                     : o.isa == "avxvnni" ? "avxvnni avx2 fma f16c"
                     : o.isa == "avx2"    ? "avx2 fma f16c"
                                          : "scalar";
    devices_.push_back(d);
    host_.info("compute cpu: " + d.name);
  }

  [[nodiscard]] std::span<const DeviceInfo> devices() const noexcept override { return devices_; }

  Expected<std::unique_ptr<Buffer>> allocate(std::size_t bytes) noexcept override {
    void* p = host_.allocate_aligned(bytes == 0 ? 64 : bytes, 64);
    if (p == nullptr)
      return Status(StatusCode::out_of_memory, "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    try {
      return std::unique_ptr<Buffer>(new HostBuffer(host_, p, bytes));
    } catch (...) {
      host_.free_aligned(p);
      return Status(StatusCode::out_of_memory, "cannot allocate a buffer object");
    }
  }

  // Every op, the optional ones too; mxfp4 weights (an optional type) in matmul and the expert ops, not embedding.
  [[nodiscard]] bool supports(Op op, DType weight_type) const noexcept override {
    switch (op) {
      case Op::matmul:
      case Op::expert_ffn:
      case Op::expert_ffn_group:
      case Op::expert_ffn_clamped:
      case Op::expert_ffn_clamped_group:
      case Op::expert_ffn_routed: return matmul_weight(weight_type);
      case Op::attention_sinks: return is_kv_type(weight_type);
      case Op::topk_routing_biased:
      case Op::topk_routing_grouped:
      case Op::concat_rows:
      case Op::mul:
      case Op::causal_conv:
      case Op::gated_delta_rule: return weight_type == DType::f32;
      case Op::matmul_heads: return matmul_weight(weight_type);
      default: return supports_every_op(op, weight_type);
    }
  }

  // Weights of matmul and the expert ops: every required type and mxfp4.
  static bool matmul_weight(DType type) noexcept { return is_weight_type(type) || type == DType::mxfp4; }

  Status run(const OpCall& c) noexcept override {
    return guarded("compute/cpu", [&]() -> Status {
      try {
        std::lock_guard lock(mu_);
        return dispatch(c);
      } catch (const std::bad_alloc&) {
        return Status(StatusCode::out_of_memory, "compute/cpu: out of memory for scratch space");
      }
    });
  }

 private:
  Status dispatch(const OpCall& c) {
    switch (c.op) {
      case Op::matmul: return op_matmul(c);
      case Op::expert_ffn:
      case Op::expert_ffn_group:
      case Op::expert_ffn_clamped:
      case Op::expert_ffn_clamped_group: return op_expert_ffn(c);
      case Op::rms_norm: return op_rms_norm(c);
      case Op::rope: return op_rope(c);
      case Op::attention:
      case Op::attention_sinks: return op_attention(c);
      case Op::swiglu: return op_swiglu(c);
      case Op::add: return op_add(c);
      case Op::topk_routing:
      case Op::topk_routing_biased:
      case Op::topk_routing_grouped: return op_topk(c);
      case Op::embedding: return op_embedding(c);
      case Op::scale_add: return op_scale_add(c);
      case Op::sigmoid: return op_sigmoid(c);
      case Op::store_rows: return op_store_rows(c);
      case Op::expert_ffn_routed: return op_expert_routed(c);
      case Op::concat_rows: return op_concat_rows(c);
      case Op::matmul_heads: return op_matmul_heads(c);
      case Op::mul: return op_mul(c);
      case Op::causal_conv: return op_causal_conv(c);
      case Op::gated_delta_rule: return op_gated_delta_rule(c);
      case Op::count_: break;
    }
    return Status(StatusCode::unsupported,
                  "op id " + std::to_string(static_cast<unsigned>(c.op)) + " is not known to compute/cpu");
  }

  // ---------------------------------------------------------------- matmul

  // One weight matrix of a matmul and its activations: Y[i][r] = dot(W[r], X[i]) (+ bias[r]) for r in [0, n),
  // i in [0, t). Jobs of one pool run may have different weights, K, X and T.
  struct MatJob {
    DType wtype;
    const std::byte* w;
    std::int64_t n;
    const float* bias;
    float* y;
    std::int64_t k;
    const float* x;
    std::int64_t t;
  };

  // An activation of matmul_jobs, quantized to `fmt` at act_scratch_ + at, abytes per token.
  struct Activation {
    const float* x;
    std::int64_t k, t;
    ActFormat fmt;
    std::size_t abytes, at;
  };

  // Activations up to this many floats are quantized by the calling thread: a pool pass costs more than the work.
  static constexpr std::int64_t kInlineQuantizeFloats = 32768;
  static std::int64_t row_tasks(std::int64_t n, std::int64_t per_task) noexcept {
    return (n + per_task - 1) / per_task;
  }

  void matmul_core(DType wtype, const std::byte* w, std::int64_t k, std::int64_t n, const float* x, std::int64_t t,
                   const float* bias, float* y, bool exact) {
    const MatJob job{wtype, w, n, bias, y, k, x, t};
    matmul_jobs({&job, 1}, exact);
  }

  // Several matrices in one pool run: each distinct activation (X, K, T and the format its weights take) is
  // quantized once, and the threads meet once per run instead of once per matrix.
  void matmul_jobs(std::span<const MatJob> jobs, bool exact) {
    std::vector<Activation>& acts = acts_;
    std::vector<std::size_t>& act_of = act_of_job_;
    acts.clear();
    act_of.assign(jobs.size(), 0);
    std::size_t total = 0;
    std::int64_t rows = 0, floats = 0, max_k = 0, tiles = 0;
    bool dequant = false;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      const MatJob& job = jobs[j];
      const ActFormat fmt = act_format(job.wtype, exact);
      std::size_t a = 0;
      while (a < acts.size() && !(acts[a].x == job.x && acts[a].k == job.k && acts[a].t == job.t && acts[a].fmt == fmt))
        ++a;
      if (a == acts.size()) {
        const std::size_t abytes = act_row_bytes(fmt, job.k);
        acts.push_back({job.x, job.k, job.t, fmt, abytes, total});
        total += abytes * static_cast<std::size_t>(job.t);
        rows += job.t;
        floats += job.k * job.t;
      }
      act_of[j] = a;
      max_k = std::max(max_k, job.k);
      dequant = dequant || (exact && dtype_traits(job.wtype)->quantized);
      tiles += row_tasks(job.n, kRowTile);
    }
    std::byte* act = act_scratch_.get(total);
    const auto quantize = opt_.kernels->quantize != nullptr ? opt_.kernels->quantize : &quantize_activations;
    // first_row[a]: the quantize task of activation a's first row; first_task[j]: job j's first row task.
    std::vector<std::int64_t>& first_row = first_row_;
    first_row.clear();
    for (std::int64_t r = 0; const Activation& a : acts) {
      first_row.push_back(r);
      r += a.t;
    }
    const auto quantize_row = [&](std::int64_t row) noexcept {
      const auto a =
          static_cast<std::size_t>(std::upper_bound(first_row.begin(), first_row.end(), row) - first_row.begin() - 1);
      const Activation& v = acts[a];
      row -= first_row[a];
      quantize(v.fmt, v.x + row * v.k, act + v.at + static_cast<std::size_t>(row) * v.abytes, v.k);
    };
    if (floats <= kInlineQuantizeFloats) {
      for (std::int64_t r = 0; r < rows; ++r) quantize_row(r);
    } else {
      pool_.run(rows, [&](std::int64_t r, int) noexcept { quantize_row(r); });
    }
    // Decode: 64 rows of a small matrix are about a microsecond of work, so claiming tasks costs a fair share of
    // it; a task takes up to 4 row tiles as long as every thread still gets 4 tasks. Rows never depend on the split.
    const std::int64_t decode_rows = kRowTile * std::clamp<std::int64_t>(tiles / (4 * pool_.size()), 1, 4);
    const auto per_task = [&](const MatJob& job) { return job.t <= kRowsKernelTokens ? decode_rows : kRowTile; };
    std::vector<std::int64_t>& first_task = first_task_;
    first_task.clear();
    std::int64_t tasks = 0;
    for (const MatJob& j : jobs) {
      first_task.push_back(tasks);
      tasks += row_tasks(j.n, per_task(j));
    }
    if (dequant) {
      for (auto& sc : scratch_) sc.get(static_cast<std::size_t>(max_k) * sizeof(float));
    }
    pool_.run(tasks, [&](std::int64_t task, int worker) noexcept {
      const auto j = static_cast<std::size_t>(std::upper_bound(first_task.begin(), first_task.end(), task) -
                                              first_task.begin() - 1);
      const std::int64_t step = per_task(jobs[j]), r0 = (task - first_task[j]) * step;
      const Activation& a = acts[act_of[j]];
      matmul_rows(jobs[j], r0, std::min(jobs[j].n, r0 + step), act + a.at, a.abytes, exact, worker);
    });
  }

  // Rows [r0, r1) of one matrix for every token.
  void matmul_rows(const MatJob& job, std::int64_t r0, std::int64_t r1, const std::byte* act, std::size_t abytes,
                   bool exact, int worker) noexcept {
    constexpr std::int64_t kTokensPerTile = 8;
    const std::int64_t k = job.k, t = job.t;
    const DType wtype = job.wtype;
    const std::byte* w = job.w;
    const std::int64_t n = job.n;
    const float* bias = job.bias;
    float* y = job.y;
    const DotFn dot = select_dot(*opt_.kernels, wtype, exact);
    const DotRowsFn rows_fn =
        wtype == DType::q6_k && !opt_.q6k_rows ? nullptr : select_rows(*opt_.kernels, wtype, exact);
    const std::size_t wbytes = row_bytes(wtype, k);
    if (exact && dtype_traits(wtype)->quantized) {
      auto* row = reinterpret_cast<float*>(scratch_[static_cast<std::size_t>(worker)].get(0));
      for (std::int64_t r = r0; r < r1; ++r) {
        (void)quant::dequantize_row(wtype, w + static_cast<std::size_t>(r) * wbytes, row, k);
        for (std::int64_t i = 0; i < t; ++i) {
          const float v = dot(row, act + static_cast<std::size_t>(i) * abytes, k);
          y[i * n + r] = bias != nullptr ? v + bias[r] : v;
        }
      }
      return;
    }
    // Several tokens go through the multi-row, multi-token kernel where the type has one (it picks its own path for 2
    // or 3 tokens). One token does not (q8_0 from memory: 1.06x slower through the tile): it takes decode's multi-row
    // kernel where the type has one. Every path gives a token the bits of its DotFn, so the split changes no result.
    const DotRowsTileFn tile_rows = t > 1 ? select_tile_rows(*opt_.kernels, wtype, exact) : nullptr;
    // Up to kRowTile rows decoded once for up to kTokenTile tokens, every token (a remainder too) through it; the rows'
    // codes stay in the caches from one token tile to the next.
    if (tile_rows != nullptr) {
      for (std::int64_t q0 = r0; q0 < r1; q0 += kRowTile) {
        const std::int64_t q1 = std::min(r1, q0 + kRowTile);
        for (std::int64_t i = 0; i < t; i += kTokenTile) {
          const int m = static_cast<int>(std::min<std::int64_t>(kTokenTile, t - i));
          float v[kTokenTile * kRowTile];
          tile_rows(w + static_cast<std::size_t>(q0) * wbytes, wbytes, static_cast<int>(q1 - q0),
                    act + static_cast<std::size_t>(i) * abytes, abytes, m, k, v);
          for (int j = 0; j < m; ++j)
            for (std::int64_t r = q0; r < q1; ++r) {
              const float x = v[j * kRowTile + (r - q0)];
              y[(i + j) * n + r] = bias != nullptr ? x + bias[r] : x;
            }
        }
      }
      return;
    }
    if (rows_fn != nullptr) {  // one token at a time (decode's path)
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t q0 = r0; q0 < r1; q0 += kRowTile) {
          const std::int64_t q1 = std::min(r1, q0 + kRowTile);
          float v[kRowTile];
          rows_fn(w + static_cast<std::size_t>(q0) * wbytes, wbytes, static_cast<int>(q1 - q0),
                  act + static_cast<std::size_t>(i) * abytes, k, v);
          for (std::int64_t r = q0; r < q1; ++r) y[i * n + r] = bias != nullptr ? v[r - q0] + bias[r] : v[r - q0];
        }
      return;
    }
    // The DotFn, kTokensPerTile tokens against each row at a time (their activations stay in the caches).
    for (std::int64_t t0 = 0; t0 < t; t0 += kTokensPerTile) {
      const std::int64_t t1 = std::min(t, t0 + kTokensPerTile);
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::byte* wr = w + static_cast<std::size_t>(r) * wbytes;
        for (std::int64_t i = t0; i < t1; ++i) {
          const float v = dot(wr, act + static_cast<std::size_t>(i) * abytes, k);
          y[i * n + r] = bias != nullptr ? v + bias[r] : v;
        }
      }
    }
  }

  // A weight of matmul and the expert ops (`matmul` true: mxfp4 too) or an embedding table.
  Status check_weight(const char* op, const char* role, const Tensor& w, bool matmul = true) {
    if (!(matmul ? matmul_weight(w.type) : is_weight_type(w.type))) {
      return Status(StatusCode::unsupported,
                    std::string(op) + ": " + role + " type " + std::string(to_string(w.type)) +
                        " is not supported by compute/cpu (f32, f16, bf16, q8_0, q4_0, q2_k..q6_k" +
                        (matmul ? ", mxfp4)" : ")"));
    }
    if (w.ne[2] != 1 || w.ne[3] != 1) return bad(op, std::string(role) + " must be 2-D {K, N}, got " + shape(w));
    return {};
  }

  Status op_matmul(const OpCall& c) {
    const char* op = "matmul";
    COLIBRI_TRY(need_count(op, c, 2, 3, 1));
    const Tensor &W = c.inputs[0], &X = c.inputs[1], &Y = c.outputs[0];
    COLIBRI_TRY(check_weight(op, "W (inputs[0])", W));
    std::byte *w, *x, *y, *b = nullptr;
    COLIBRI_TRY(resolve(op, "W (inputs[0])", W, w));
    COLIBRI_TRY(resolve(op, "X (inputs[1])", X, x));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    COLIBRI_TRY(need_type(op, "X (inputs[1])", X, DType::f32));
    COLIBRI_TRY(need_type(op, "Y (outputs[0])", Y, DType::f32));
    const std::int64_t k = W.ne[0], n = W.ne[1], t = sdk::row_count(X);
    if (X.ne[0] != k)
      return bad(op, "X " + shape(X) + " has ne[0] = " + std::to_string(X.ne[0]) + " but W " + shape(W) +
                         " has K = " + std::to_string(k));
    if (Y.ne[0] != n || sdk::row_count(Y) != t)
      return bad(op, "Y " + shape(Y) + " must be {" + std::to_string(n) + ", " + std::to_string(t) + "} for W " +
                         shape(W) + " and X " + shape(X));
    if (c.inputs.size() == 3) {
      const Tensor& B = c.inputs[2];
      COLIBRI_TRY(resolve(op, "bias (inputs[2])", B, b));
      COLIBRI_TRY(need_type(op, "bias (inputs[2])", B, DType::f32));
      if (sdk::element_count(B) != n)
        return bad(op, "bias " + shape(B) + " must have N = " + std::to_string(n) + " elements");
    }
    matmul_core(W.type, w, k, n, reinterpret_cast<const float*>(x), t, reinterpret_cast<const float*>(b),
                reinterpret_cast<float*>(y), (c.params.flags & kExactActivations) != 0);
    return {};
  }

  // matmul_heads (DeepSeek's latent attention): head h's matrix (W's rows h * N .. h * N + N - 1) times the first K
  // values of each token's head-h row of X, as jobs of matmul_jobs, so every (t, h) has the bits of matmul on that
  // matrix and row. One token reads its rows in place (row h of X is {K, 1} at h * Kx, Y's at h * N); a batch gathers
  // each head's rows into {K, T} and scatters the {N, T} results back, a group of heads at a time so that the
  // scratch stays near kHeadsScratchBytes.
  Status op_matmul_heads(const OpCall& c) {
    const char* op = "matmul_heads";
    COLIBRI_TRY(sdk::check_op_call(c, "cpu"));
    const Tensor &W = c.inputs[0], &X = c.inputs[1], &Y = c.outputs[0];
    std::byte *w, *x, *y;
    COLIBRI_TRY(resolve(op, "W (inputs[0])", W, w));
    COLIBRI_TRY(resolve(op, "X (inputs[1])", X, x));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    const std::int64_t k = W.ne[0], n = W.ne[1], heads = W.ne[2], kx = X.ne[0], t = X.ne[2];
    const std::size_t head_bytes = row_bytes(W.type, k) * static_cast<std::size_t>(n);
    const bool exact = (c.params.flags & kExactActivations) != 0;
    const auto* xs = reinterpret_cast<const float*>(x);
    auto* ys = reinterpret_cast<float*>(y);
    std::vector<MatJob>& jobs = jobs_;
    jobs.clear();
    if (t == 1) {
      for (std::int64_t h = 0; h < heads; ++h)
        jobs.push_back(
            {W.type, w + static_cast<std::size_t>(h) * head_bytes, n, nullptr, ys + h * n, k, xs + h * kx, 1});
      matmul_jobs(jobs, exact);
      return {};
    }
    constexpr std::int64_t kHeadsScratchBytes = std::int64_t{32} << 20;
    const std::int64_t per_head = t * (k + n) * static_cast<std::int64_t>(sizeof(float));
    const std::int64_t group = std::clamp<std::int64_t>(kHeadsScratchBytes / per_head, 1, heads);
    auto* xg = reinterpret_cast<float*>(heads_scratch_.get(static_cast<std::size_t>(group * per_head)));
    float* yg = xg + group * t * k;  // head h0 + j's {K, T} at j * K * T, its {N, T} at j * N * T
    for (std::int64_t h0 = 0; h0 < heads; h0 += group) {
      const std::int64_t g = std::min(group, heads - h0);
      pool_.run(g, [&](std::int64_t j, int) noexcept {
        for (std::int64_t i = 0; i < t; ++i)
          std::memcpy(xg + (j * t + i) * k, xs + (i * heads + h0 + j) * kx,
                      static_cast<std::size_t>(k) * sizeof(float));
      });
      jobs.clear();
      for (std::int64_t j = 0; j < g; ++j) {
        jobs.push_back({W.type, w + static_cast<std::size_t>(h0 + j) * head_bytes, n, nullptr, yg + j * n * t, k,
                        xg + j * k * t, t});
      }
      matmul_jobs(jobs, exact);
      pool_.run(g, [&](std::int64_t j, int) noexcept {
        for (std::int64_t i = 0; i < t; ++i)
          std::memcpy(ys + (i * heads + h0 + j) * n, yg + (j * t + i) * n, static_cast<std::size_t>(n) * sizeof(float));
      });
    }
    return {};
  }

  // concat_rows: each of the R rows of Y is A's row, then B's; a plain copy of the bits.
  Status op_concat_rows(const OpCall& c) {
    const char* op = "concat_rows";
    COLIBRI_TRY(sdk::check_op_call(c, "cpu"));
    const Tensor &A = c.inputs[0], &B = c.inputs[1], &Y = c.outputs[0];
    std::byte *a, *b, *y;
    COLIBRI_TRY(resolve(op, "A (inputs[0])", A, a));
    COLIBRI_TRY(resolve(op, "B (inputs[1])", B, b));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    const auto wa = static_cast<std::size_t>(A.ne[0]) * sizeof(float),
               wb = static_cast<std::size_t>(B.ne[0]) * sizeof(float);
    const std::int64_t rows = sdk::row_count(A);
    constexpr std::int64_t kRowsPerTask = 256;
    pool_.run(row_tasks(rows, kRowsPerTask), [&](std::int64_t task, int) noexcept {
      for (std::int64_t r = task * kRowsPerTask; r < std::min(rows, (task + 1) * kRowsPerTask); ++r) {
        const auto i = static_cast<std::size_t>(r);
        std::memcpy(y + i * (wa + wb), a + i * wa, wa);
        std::memcpy(y + i * (wa + wb) + wa, b + i * wb, wb);
      }
    });
    return {};
  }

  // ---------------------------------------------------------------- expert_ffn

  // One expert of an expert op, checked; the biases are null but for the clamped ops.
  struct ExpertCall {
    DType gtype, utype, dtype;
    const std::byte *g, *u, *d;
    const float* x;
    float* y;
    std::int64_t dm, f, t;
    const float *b_gate = nullptr, *b_up = nullptr, *b_down = nullptr;
  };

  // Expert e of a call whose experts take `stride` inputs each (4, or 7 with the biases).
  Status check_expert(const char* op, const OpCall& c, std::size_t e, std::size_t stride, ExpertCall& out) {
    const bool group = c.op == Op::expert_ffn_group || c.op == Op::expert_ffn_clamped_group;
    const std::string who = group ? "expert " + std::to_string(e) + ": " : "";
    const auto role = [&](const char* name, std::size_t index, bool input) {
      return who + name + (input ? " (inputs[" : " (outputs[") + std::to_string(index) + "])";
    };
    const std::size_t i = stride * e;
    const Tensor &G = c.inputs[i], &U = c.inputs[i + 1], &D = c.inputs[i + 2], &X = c.inputs[i + 3], &Y = c.outputs[e];
    const std::string rg = role("W_gate", i, true), ru = role("W_up", i + 1, true), rd = role("W_down", i + 2, true),
                      rx = role("X", i + 3, true), ry = role("Y", e, false);
    COLIBRI_TRY(check_weight(op, rg.c_str(), G));
    COLIBRI_TRY(check_weight(op, ru.c_str(), U));
    COLIBRI_TRY(check_weight(op, rd.c_str(), D));
    std::byte *g, *u, *d, *x, *y;
    COLIBRI_TRY(resolve(op, rg.c_str(), G, g));
    COLIBRI_TRY(resolve(op, ru.c_str(), U, u));
    COLIBRI_TRY(resolve(op, rd.c_str(), D, d));
    COLIBRI_TRY(resolve(op, rx.c_str(), X, x));
    COLIBRI_TRY(resolve(op, ry.c_str(), Y, y));
    COLIBRI_TRY(need_type(op, rx.c_str(), X, DType::f32));
    COLIBRI_TRY(need_type(op, ry.c_str(), Y, DType::f32));
    const std::int64_t dm = G.ne[0], f = G.ne[1], t = sdk::row_count(X);
    if (U.ne[0] != dm || U.ne[1] != f) return bad(op, who + "W_up " + shape(U) + " must match W_gate " + shape(G));
    if (D.ne[0] != f || D.ne[1] != dm)
      return bad(op, who + "W_down " + shape(D) + " must be {" + std::to_string(f) + ", " + std::to_string(dm) +
                         "} for W_gate " + shape(G));
    if (X.ne[0] != dm) return bad(op, who + "X " + shape(X) + " must have ne[0] = D = " + std::to_string(dm));
    if (Y.ne[0] != dm || sdk::row_count(Y) != t)
      return bad(op, who + "Y " + shape(Y) + " must be {" + std::to_string(dm) + ", " + std::to_string(t) + "}");
    out = {G.type, U.type, D.type, g, u, d, reinterpret_cast<const float*>(x), reinterpret_cast<float*>(y), dm, f, t};
    if (stride == 7) COLIBRI_TRY(check_biases(op, c, i, who, out));
    return {};
  }

  // expert_ffn is a group of one, and expert_ffn_clamped a clamped group of one. Every expert's gate and up
  // projections go through one pool run, the activation through another, the down projections through a third;
  // each row of each matrix is computed as it would be alone, so grouping changes no bit. A clamped expert's three
  // products add its biases as matmul's does, with the clamped activation (one alpha and limit) in place of swiglu.
  Status op_expert_ffn(const OpCall& c) {
    const bool group = c.op == Op::expert_ffn_group || c.op == Op::expert_ffn_clamped_group;
    const bool clamped = c.op == Op::expert_ffn_clamped || c.op == Op::expert_ffn_clamped_group;
    const char* op = op_name(c.op);
    const std::size_t stride = clamped ? 7 : 4;
    if (!group) {
      COLIBRI_TRY(need_count(op, c, stride, stride, 1));
    } else if (c.inputs.empty() || c.inputs.size() % stride != 0 || c.outputs.size() != c.inputs.size() / stride) {
      return bad(op, std::string("expects ") +
                         (clamped ? "7 inputs (W_gate, W_up, W_down, X, b_gate, b_up, b_down)"
                                  : "4 inputs (W_gate, W_up, W_down, X)") +
                         " and 1 output per expert, got " + std::to_string(c.inputs.size()) + " inputs and " +
                         std::to_string(c.outputs.size()) + " outputs");
    }
    std::vector<ExpertCall>& ex = experts_;
    ex.resize(c.outputs.size());
    for (std::size_t e = 0; e < ex.size(); ++e) COLIBRI_TRY(check_expert(op, c, e, stride, ex[e]));
    if (clamped) COLIBRI_TRY(check_clamp(op, c.params));
    const bool exact = (c.params.flags & kExactActivations) != 0;
    std::vector<std::int64_t>& at = hidden_at_;  // expert e's gate and up rows start at at[e] in their halves
    at.clear();
    std::int64_t hidden = 0;
    for (const ExpertCall& x : ex) {
      at.push_back(hidden);
      hidden += x.f * x.t;
    }
    auto* gate = reinterpret_cast<float*>(ffn_scratch_.get(2 * static_cast<std::size_t>(hidden) * sizeof(float)));
    float* up = gate + hidden;
    std::vector<MatJob>& jobs = jobs_;
    jobs.clear();
    for (std::size_t e = 0; e < ex.size(); ++e) {
      const ExpertCall& x = ex[e];
      jobs.push_back({x.gtype, x.g, x.f, x.b_gate, gate + at[e], x.dm, x.x, x.t});
      jobs.push_back({x.utype, x.u, x.f, x.b_up, up + at[e], x.dm, x.x, x.t});
    }
    matmul_jobs(jobs, exact);
    if (clamped) {
      clamped_glu_rows(gate, up, gate, hidden, c.params.scale, c.params.eps);
    } else {
      swiglu_rows(gate, up, gate, hidden);
    }
    jobs.clear();
    for (std::size_t e = 0; e < ex.size(); ++e) {
      const ExpertCall& x = ex[e];
      jobs.push_back({x.dtype, x.d, x.dm, x.b_down, x.y, x.f, gate + at[e], x.t});
    }
    matmul_jobs(jobs, exact);
    return {};
  }

  // A clamped expert's inputs after expert_ffn's (from inputs[i + 4] on): b_gate {F}, b_up {F}, b_down {D}.
  Status check_biases(const char* op, const OpCall& c, std::size_t i, const std::string& who, ExpertCall& x) {
    const struct {
      const char* name;
      std::int64_t n;
      const float** out;
    } biases[] = {{"b_gate", x.f, &x.b_gate}, {"b_up", x.f, &x.b_up}, {"b_down", x.dm, &x.b_down}};
    for (std::size_t b = 0; b < 3; ++b) {
      const Tensor& B = c.inputs[i + 4 + b];
      const std::string role = who + biases[b].name + " (inputs[" + std::to_string(i + 4 + b) + "])";
      std::byte* p;
      COLIBRI_TRY(resolve(op, role.c_str(), B, p));
      COLIBRI_TRY(need_type(op, role.c_str(), B, DType::f32));
      if (B.ne[0] != biases[b].n || sdk::element_count(B) != biases[b].n)
        return bad(op, role + " " + shape(B) + " must have " + std::to_string(biases[b].n) + " elements");
      *biases[b].out = reinterpret_cast<const float*>(p);
    }
    return {};
  }

  // The clamped ops' alpha (params.scale) and limit (params.eps).
  Status check_clamp(const char* op, const OpParams& params) {
    const float alpha = params.scale, limit = params.eps;
    if (!(limit > 0.0f) || !std::isfinite(limit))
      return bad(op, "params.eps (the clamp limit) must be positive and finite, got " + std::to_string(limit));
    if (!std::isfinite(alpha)) return bad(op, "params.scale (alpha) must be finite, got " + std::to_string(alpha));
    return {};
  }

  // ---------------------------------------------------------------- elementwise

  // gpt-oss's activation: g = min(gate, limit), u = clamp(up, -limit, limit), out = g / (1 + e^(-alpha g)) * (u + 1)
  // (g * sigmoid(alpha g) * (u + 1)), per element with the same operations on every path (portable_exp, no FMA).
  void clamped_glu_rows(const float* g, const float* u, float* out, std::int64_t n, float alpha, float limit) {
    constexpr std::int64_t kChunk = 4096;
    pool_.run((n + kChunk - 1) / kChunk, [&](std::int64_t task, int) noexcept {
      const std::int64_t e = std::min(n, (task + 1) * kChunk);
      for (std::int64_t i = task * kChunk; i < e; ++i) {
        const float gi = std::min(g[i], limit), ui = std::clamp(u[i], -limit, limit);
        out[i] = gi / (1.0f + portable_exp(-(alpha * gi))) * (ui + 1.0f);
      }
    });
  }

  void swiglu_rows(const float* g, const float* u, float* out, std::int64_t n) {
    constexpr std::int64_t kChunk = 4096;
    const auto swiglu = opt_.kernels->swiglu != nullptr ? opt_.kernels->swiglu : swiglu_scalar;
    pool_.run((n + kChunk - 1) / kChunk, [&](std::int64_t task, int) noexcept {
      const std::int64_t i = task * kChunk;
      swiglu(g + i, u + i, out + i, std::min(kChunk, n - i));
    });
  }

  Status same_shape(const char* op, const char* ra, const Tensor& a, const char* rb, const Tensor& b) {
    if (a.ne != b.ne)
      return bad(op, std::string(rb) + " " + shape(b) + " must have the shape of " + ra + " " + shape(a));
    return {};
  }

  Status op_swiglu(const OpCall& c) {
    const char* op = "swiglu";
    COLIBRI_TRY(need_count(op, c, 2, 2, 1));
    std::byte *g, *u, *y;
    COLIBRI_TRY(resolve(op, "gate (inputs[0])", c.inputs[0], g));
    COLIBRI_TRY(resolve(op, "up (inputs[1])", c.inputs[1], u));
    COLIBRI_TRY(resolve(op, "out (outputs[0])", c.outputs[0], y));
    for (const Tensor* t : std::initializer_list<const Tensor*>{&c.inputs[0], &c.inputs[1], &c.outputs[0]})
      COLIBRI_TRY(need_type(op, "every tensor", *t, DType::f32));
    COLIBRI_TRY(same_shape(op, "gate", c.inputs[0], "up", c.inputs[1]));
    COLIBRI_TRY(same_shape(op, "gate", c.inputs[0], "out", c.outputs[0]));
    swiglu_rows(reinterpret_cast<const float*>(g), reinterpret_cast<const float*>(u), reinterpret_cast<float*>(y),
                sdk::element_count(c.inputs[0]));
    return {};
  }

  template <typename Fn>
  Status elementwise(const char* op, const OpCall& c, std::size_t n_in, Fn&& fn) {
    COLIBRI_TRY(need_count(op, c, n_in, n_in, 1));
    std::byte* p[3] = {};
    for (std::size_t i = 0; i < n_in; ++i) {
      const std::string role = "inputs[" + std::to_string(i) + "]";
      COLIBRI_TRY(resolve(op, role.c_str(), c.inputs[i], p[i]));
      COLIBRI_TRY(need_type(op, role.c_str(), c.inputs[i], DType::f32));
      COLIBRI_TRY(same_shape(op, "inputs[0]", c.inputs[0], role.c_str(), c.inputs[i]));
    }
    std::byte* y;
    COLIBRI_TRY(resolve(op, "outputs[0]", c.outputs[0], y));
    COLIBRI_TRY(need_type(op, "outputs[0]", c.outputs[0], DType::f32));
    COLIBRI_TRY(same_shape(op, "inputs[0]", c.inputs[0], "outputs[0]", c.outputs[0]));
    const std::int64_t n = sdk::element_count(c.inputs[0]);
    const auto* a = reinterpret_cast<const float*>(p[0]);
    const auto* b = reinterpret_cast<const float*>(p[1]);
    auto* out = reinterpret_cast<float*>(y);
    constexpr std::int64_t kChunk = 8192;
    pool_.run((n + kChunk - 1) / kChunk, [&](std::int64_t task, int) noexcept {
      const std::int64_t e = std::min(n, (task + 1) * kChunk);
      for (std::int64_t i = task * kChunk; i < e; ++i) out[i] = fn(a[i], b != nullptr ? b[i] : 0.0f);
    });
    return {};
  }

  Status op_add(const OpCall& c) {
    return elementwise("add", c, 2, [](float a, float b) noexcept { return a + b; });
  }

  Status op_mul(const OpCall& c) {
    return elementwise("mul", c, 2, [](float a, float b) noexcept { return a * b; });
  }

  // Channels split across the pool; each channel's columns in order, so a column's bits do not depend on T.
  Status op_causal_conv(const OpCall& c) {
    const char* op = "causal_conv";
    COLIBRI_TRY(check_op_call(c, "cpu"));
    std::byte *xp, *wp, *yp, *sp;
    COLIBRI_TRY(resolve(op, "X (inputs[0])", c.inputs[0], xp));
    COLIBRI_TRY(resolve(op, "W (inputs[1])", c.inputs[1], wp));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", c.outputs[0], yp));
    COLIBRI_TRY(resolve(op, "state (outputs[1])", c.outputs[1], sp));
    const auto* x = reinterpret_cast<const float*>(xp);
    const auto* w = reinterpret_cast<const float*>(wp);
    auto* y = reinterpret_cast<float*>(yp);
    auto* state = reinterpret_cast<float*>(sp);
    const std::int64_t ch = c.inputs[0].ne[0], t_count = c.inputs[0].ne[1], k = c.inputs[1].ne[0];
    constexpr std::int64_t kChannelsPerTask = 64;
    pool_.run(row_tasks(ch, kChannelsPerTask), [&](std::int64_t task, int) noexcept {
      std::array<float, 16> small{};
      std::vector<float> big;
      float* window = small.data();
      if (k > static_cast<std::int64_t>(small.size())) {
        big.resize(static_cast<std::size_t>(k));
        window = big.data();
      }
      for (std::int64_t cc = task * kChannelsPerTask; cc < std::min(ch, (task + 1) * kChannelsPerTask); ++cc) {
        for (std::int64_t j = 0; j + 1 < k; ++j) window[j] = state[cc + j * ch];
        const float* wc = w + cc * k;
        for (std::int64_t t = 0; t < t_count; ++t) {
          window[k - 1] = x[cc + t * ch];
          float acc = 0.0f;
          for (std::int64_t j = 0; j < k; ++j) acc += wc[j] * window[j];
          y[cc + t * ch] = acc / (1.0f + std::exp(-acc));
          for (std::int64_t j = 0; j + 1 < k; ++j) window[j] = window[j + 1];
        }
        for (std::int64_t j = 0; j + 1 < k; ++j) state[cc + j * ch] = window[j];
      }
    });
    return {};
  }

  // Value heads split across the pool; each head's tokens in order (the state carries them), so a token's bits do
  // not depend on how many share the call.
  Status op_gated_delta_rule(const OpCall& c) {
    const char* op = "gated_delta_rule";
    COLIBRI_TRY(check_op_call(c, "cpu"));
    std::array<std::byte*, 7> in{};
    static constexpr const char* kIn[] = {"Q (inputs[0])", "K (inputs[1])", "V (inputs[2])",      "a (inputs[3])",
                                          "b (inputs[4])", "A (inputs[5])", "dt_bias (inputs[6])"};
    for (std::size_t i = 0; i < in.size(); ++i) COLIBRI_TRY(resolve(op, kIn[i], c.inputs[i], in[i]));
    std::byte *op_, *sp;
    COLIBRI_TRY(resolve(op, "O (outputs[0])", c.outputs[0], op_));
    COLIBRI_TRY(resolve(op, "state (outputs[1])", c.outputs[1], sp));
    const auto f = [&](std::size_t i) { return reinterpret_cast<const float*>(in[i]); };
    const float *q = f(0), *k = f(1), *v = f(2), *a = f(3), *b = f(4), *A = f(5), *dt = f(6);
    auto* o = reinterpret_cast<float*>(op_);
    auto* state = reinterpret_cast<float*>(sp);
    const std::int64_t dk = c.inputs[0].ne[0], hk = c.inputs[0].ne[1], t_count = c.inputs[0].ne[2];
    const std::int64_t dv = c.inputs[2].ne[0], hv = c.inputs[2].ne[1], group = hv / hk;
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
    pool_.run(hv, [&](std::int64_t h, int) noexcept {
      std::vector<float> qn(static_cast<std::size_t>(dk)), kn(static_cast<std::size_t>(dk)),
          u(static_cast<std::size_t>(dv));
      float* S = state + h * dk * dv;
      const std::int64_t kh = (c.params.flags & sdk::kDeltaTiledHeads) != 0 ? h % hk : h / group;
      for (std::int64_t t = 0; t < t_count; ++t) {
        const float* qt = q + (t * hk + kh) * dk;
        const float* kt = k + (t * hk + kh) * dk;
        const float* vt = v + (t * hv + h) * dv;
        float qq = 0.0f, kk = 0.0f;
        for (std::int64_t i = 0; i < dk; ++i) {
          qq += qt[i] * qt[i];
          kk += kt[i] * kt[i];
        }
        const float q_inv = 1.0f / std::sqrt(qq + 1e-6f), k_inv = 1.0f / std::sqrt(kk + 1e-6f);
        for (std::int64_t i = 0; i < dk; ++i) {
          qn[static_cast<std::size_t>(i)] = qt[i] * q_inv * q_scale;
          kn[static_cast<std::size_t>(i)] = kt[i] * k_inv;
        }
        const float xa = a[t * hv + h] + dt[h];
        const float softplus = xa > 20.0f ? xa : std::log1p(std::exp(xa));
        const float decay = std::exp(A[h] * softplus);
        const float beta = 1.0f / (1.0f + std::exp(-b[t * hv + h]));
        std::fill(u.begin(), u.end(), 0.0f);
        for (std::int64_t i = 0; i < dk; ++i) {
          float* row = S + i * dv;
          const float ki = kn[static_cast<std::size_t>(i)];
          for (std::int64_t j = 0; j < dv; ++j) {
            row[j] *= decay;
            u[static_cast<std::size_t>(j)] += row[j] * ki;
          }
        }
        for (std::int64_t j = 0; j < dv; ++j)
          u[static_cast<std::size_t>(j)] = (vt[j] - u[static_cast<std::size_t>(j)]) * beta;
        float* ot = o + (t * hv + h) * dv;
        std::fill(ot, ot + dv, 0.0f);
        for (std::int64_t i = 0; i < dk; ++i) {
          float* row = S + i * dv;
          const float ki = kn[static_cast<std::size_t>(i)], qi = qn[static_cast<std::size_t>(i)];
          for (std::int64_t j = 0; j < dv; ++j) {
            row[j] += ki * u[static_cast<std::size_t>(j)];
            ot[j] += row[j] * qi;
          }
        }
      }
    });
    return {};
  }

  Status op_sigmoid(const OpCall& c) {
    return elementwise("sigmoid", c, 1, [](float a, float) noexcept { return 1.0f / (1.0f + std::exp(-a)); });
  }

  // The reference encoding itself (colibri::quant), row by row across the pool.
  Status op_store_rows(const OpCall& c) {
    const char* op = "store_rows";
    COLIBRI_TRY(check_op_call(c, "cpu"));
    const Tensor &X = c.inputs[0], &Y = c.outputs[0];
    std::byte *x, *y;
    COLIBRI_TRY(resolve(op, "X (inputs[0])", X, x));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    const std::int64_t d = X.ne[0];
    const std::size_t rb = row_bytes(Y.type, d);
    const auto* xs = reinterpret_cast<const float*>(x);
    pool_.run(sdk::row_count(X), [&](std::int64_t r, int) noexcept {
      if (Y.type == DType::f32) {
        std::memcpy(y + static_cast<std::size_t>(r) * rb, xs + r * d, rb);
      } else {
        (void)quant::quantize_row(Y.type, xs + r * d, y + static_cast<std::size_t>(r) * rb, d);
      }
    });
    return {};
  }

  Status op_scale_add(const OpCall& c) {
    const char* op = "scale_add";
    COLIBRI_TRY(need_count(op, c, 2, 2, 1));
    const Tensor &X = c.inputs[0], &Wt = c.inputs[1], &Y = c.outputs[0];
    std::byte *x, *w, *y;
    COLIBRI_TRY(resolve(op, "X (inputs[0])", X, x));
    COLIBRI_TRY(resolve(op, "w (inputs[1])", Wt, w));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    for (const Tensor* t : std::initializer_list<const Tensor*>{&X, &Wt, &Y})
      COLIBRI_TRY(need_type(op, "every tensor", *t, DType::f32));
    COLIBRI_TRY(same_shape(op, "X", X, "Y", Y));
    const std::int64_t d = X.ne[0], t = sdk::row_count(X);
    if (sdk::element_count(Wt) != t)
      return bad(op, "w " + shape(Wt) + " must have one weight per token (" + std::to_string(t) + ")");
    const auto* xs = reinterpret_cast<const float*>(x);
    const auto* ws = reinterpret_cast<const float*>(w);
    auto* ys = reinterpret_cast<float*>(y);
    pool_.run(t, [&](std::int64_t i, int) noexcept { scale_add_row(ys + i * d, xs + i * d, ws[i], d); });
    return {};
  }

  // One row of scale_add, which expert_ffn_routed's combine shares (the same operations, so the same bits).
  static void scale_add_row(float* y, const float* x, float s, std::int64_t d) noexcept {
    for (std::int64_t j = 0; j < d; ++j) y[j] += s * x[j];
  }

  // Per token: its picks in ascending id through op_expert_ffn as one group on that token's X, then scale_add of
  // each into a column that starts at +0: the engine's own combine, so the same bits. Each token alone is what
  // expert_ffn gives it in any batch (the one promise), so T > 1 runs token by token.
  Status op_expert_routed(const OpCall& c) {
    const char* op = "expert_ffn_routed";
    COLIBRI_TRY(sdk::check_op_call(c, "cpu"));
    const Tensor &X = c.inputs[0], &Ids = c.inputs[1], &Wt = c.inputs[2], &Y = c.outputs[0];
    std::byte *x, *ids, *w, *y;
    COLIBRI_TRY(resolve(op, "X (inputs[0])", X, x));
    COLIBRI_TRY(resolve(op, "ids (inputs[1])", Ids, ids));
    COLIBRI_TRY(resolve(op, "weights (inputs[2])", Wt, w));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    const auto experts = static_cast<std::int32_t>((c.inputs.size() - 3) / 3);
    const std::int64_t d = X.ne[0], t = sdk::row_count(X), k = Ids.ne[0];
    const auto* id = reinterpret_cast<const std::int32_t*>(ids);
    const auto* wt = reinterpret_cast<const float*>(w);
    auto* ys = reinterpret_cast<float*>(y);
    std::vector<std::pair<std::int32_t, float>>& picks = routed_picks_;
    std::vector<Tensor>& in = routed_in_;
    std::vector<Tensor>& out = routed_out_;
    auto* scratch = reinterpret_cast<float*>(routed_scratch_.get(static_cast<std::size_t>(k * d) * sizeof(float)));
    for (std::int64_t i = 0; i < t; ++i) {
      float* col = ys + i * d;
      picks.clear();
      bool marked = false;
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t e = id[i * k + j];
        marked = marked || e < 0 || e >= experts;
        picks.emplace_back(e, wt[i * k + j]);
      }
      if (marked) {  // topk_routing's mark for a NaN logit (or a bad id): the column says so
        std::fill(col, col + d, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      std::sort(picks.begin(), picks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (std::size_t j = 1; j < picks.size(); ++j) {
        if (picks[j].first == picks[j - 1].first) {
          return bad(op, "token " + std::to_string(i) + " picks expert " + std::to_string(picks[j].first) +
                             " twice; a token's ids must be distinct");
        }
      }
      in.clear();
      out.clear();
      Tensor xt = X;
      xt.ne = {d, 1, 1, 1};
      xt.buffer = nullptr;
      xt.offset = 0;
      xt.data = x + static_cast<std::size_t>(i * d) * sizeof(float);
      for (std::size_t j = 0; j < picks.size(); ++j) {
        const auto at = static_cast<std::size_t>(3 + 3 * picks[j].first);
        in.insert(in.end(), {c.inputs[at], c.inputs[at + 1], c.inputs[at + 2], xt});
        Tensor yt = xt;
        yt.data = scratch + static_cast<std::size_t>(j) * static_cast<std::size_t>(d);
        out.push_back(yt);
      }
      OpCall group;
      group.op = Op::expert_ffn_group;
      group.inputs = in;
      group.outputs = out;
      group.params = c.params;
      COLIBRI_TRY(op_expert_ffn(group));
      std::fill(col, col + d, 0.0f);
      for (std::size_t j = 0; j < picks.size(); ++j) {
        scale_add_row(col, scratch + static_cast<std::size_t>(j) * static_cast<std::size_t>(d), picks[j].second, d);
      }
    }
    return {};
  }

  // ---------------------------------------------------------------- rms_norm

  Status op_rms_norm(const OpCall& c) {
    const char* op = "rms_norm";
    COLIBRI_TRY(need_count(op, c, 2, 2, 1));
    const Tensor &X = c.inputs[0], &Wt = c.inputs[1], &Y = c.outputs[0];
    std::byte *x, *w, *y;
    COLIBRI_TRY(resolve(op, "X (inputs[0])", X, x));
    COLIBRI_TRY(resolve(op, "w (inputs[1])", Wt, w));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    for (const Tensor* t : std::initializer_list<const Tensor*>{&X, &Wt, &Y})
      COLIBRI_TRY(need_type(op, "every tensor", *t, DType::f32));
    COLIBRI_TRY(same_shape(op, "X", X, "Y", Y));
    const std::int64_t d = X.ne[0], r = sdk::row_count(X);
    if (sdk::element_count(Wt) != d)
      return bad(op, "w " + shape(Wt) + " must have D = " + std::to_string(d) + " elements");
    if (!(c.params.eps >= 0.0f)) return bad(op, "params.eps must be >= 0, got " + std::to_string(c.params.eps));
    const auto* xs = reinterpret_cast<const float*>(x);
    const auto* ws = reinterpret_cast<const float*>(w);
    auto* ys = reinterpret_cast<float*>(y);
    const double eps = c.params.eps;
    pool_.run(r, [&](std::int64_t i, int) noexcept {
      const float* xr = xs + i * d;
      double ss = 0.0;
      for (std::int64_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
      for (std::int64_t j = 0; j < d; ++j) ys[i * d + j] = static_cast<float>(xr[j] * inv) * ws[j];
    });
    return {};
  }

  // ---------------------------------------------------------------- rope

  Status op_rope(const OpCall& c) {
    const char* op = "rope";
    COLIBRI_TRY(need_count(op, c, 3, 3, 1));
    const Tensor &X = c.inputs[0], &P = c.inputs[1], &F = c.inputs[2], &Y = c.outputs[0];
    std::byte *x, *p, *f, *y;
    COLIBRI_TRY(resolve(op, "X (inputs[0])", X, x));
    COLIBRI_TRY(resolve(op, "positions (inputs[1])", P, p));
    COLIBRI_TRY(resolve(op, "inv_freq (inputs[2])", F, f));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    COLIBRI_TRY(need_type(op, "X (inputs[0])", X, DType::f32));
    COLIBRI_TRY(need_type(op, "positions (inputs[1])", P, DType::i32));
    COLIBRI_TRY(need_type(op, "inv_freq (inputs[2])", F, DType::f32));
    COLIBRI_TRY(need_type(op, "Y (outputs[0])", Y, DType::f32));
    COLIBRI_TRY(same_shape(op, "X", X, "Y", Y));
    const std::int64_t hd = X.ne[0], heads = X.ne[1], t = X.ne[2] * X.ne[3];
    const std::int64_t rd = c.params.rope_dims;
    if (rd <= 0 || rd % 2 != 0 || rd > hd)
      return bad(op, "params.rope_dims = " + std::to_string(rd) + " must be even and in 2.." + std::to_string(hd) +
                         " (head_dim)");
    if (sdk::element_count(P) != t)
      return bad(op, "positions " + shape(P) + " must have one entry per token (" + std::to_string(t) + ")");
    if (sdk::element_count(F) != rd / 2)
      return bad(op, "inv_freq " + shape(F) + " must have rope_dims / 2 = " + std::to_string(rd / 2) + " elements");
    const auto* xs = reinterpret_cast<const float*>(x);
    const auto* pos = reinterpret_cast<const std::int32_t*>(p);
    const auto* inv = reinterpret_cast<const float*>(f);
    auto* ys = reinterpret_cast<float*>(y);
    const bool interleaved = (c.params.flags & kRopeInterleaved) != 0;
    const float scale = c.params.scale;
    const std::int64_t half = rd / 2;
    pool_.run(t, [&](std::int64_t i, int) noexcept {
      float cs[512], sn[512];
      for (std::int64_t base = 0; base < half; base += 512) {
        const std::int64_t m = std::min<std::int64_t>(512, half - base);
        for (std::int64_t j = 0; j < m; ++j) {
          const float theta = static_cast<float>(pos[i]) * inv[base + j];
          cs[j] = static_cast<float>(std::cos(static_cast<double>(theta))) * scale;
          sn[j] = static_cast<float>(std::sin(static_cast<double>(theta))) * scale;
        }
        for (std::int64_t h = 0; h < heads; ++h) {
          const float* xr = xs + (i * heads + h) * hd;
          float* yr = ys + (i * heads + h) * hd;
          for (std::int64_t j = 0; j < m; ++j) {
            const std::int64_t a = interleaved ? 2 * (base + j) : base + j;
            const std::int64_t b = interleaved ? a + 1 : a + half;
            const float x0 = xr[a], x1 = xr[b];
            yr[a] = x0 * cs[j] - x1 * sn[j];
            yr[b] = x0 * sn[j] + x1 * cs[j];
          }
        }
      }
      if (xs != ys) {
        for (std::int64_t h = 0; h < heads; ++h) {
          const float* xr = xs + (i * heads + h) * hd;
          float* yr = ys + (i * heads + h) * hd;
          for (std::int64_t j = rd; j < hd; ++j) yr[j] = xr[j];
        }
      }
    });
    return {};
  }

  // ---------------------------------------------------------------- attention

  // attention, and attention_sinks: its sink is one more key, with value zero, that every query of head h sees with
  // the score sinks[h] (not scaled). The online softmax starts from it (m = sink, l = e^0 = 1, acc = 0) instead of
  // from nothing (m = -inf, l = 0), so every key block then runs as it does without sinks.
  Status op_attention(const OpCall& c) {
    const bool with_sinks = c.op == Op::attention_sinks;
    const char* op = with_sinks ? "attention_sinks" : "attention";
    const std::size_t n_in = with_sinks ? 4 : 3;
    COLIBRI_TRY(need_count(op, c, n_in, n_in, 1));
    const Tensor &Q = c.inputs[0], &K = c.inputs[1], &V = c.inputs[2], &O = c.outputs[0];
    std::byte *q, *k, *v, *o;
    COLIBRI_TRY(resolve(op, "Q (inputs[0])", Q, q));
    COLIBRI_TRY(resolve(op, "K cache (inputs[1])", K, k));
    COLIBRI_TRY(resolve(op, "V cache (inputs[2])", V, v));
    COLIBRI_TRY(resolve(op, "O (outputs[0])", O, o));
    COLIBRI_TRY(need_type(op, "Q (inputs[0])", Q, DType::f32));
    COLIBRI_TRY(need_type(op, "O (outputs[0])", O, DType::f32));
    for (const Tensor* t : std::initializer_list<const Tensor*>{&K, &V}) {
      if (!is_kv_type(t->type))
        return Status(StatusCode::unsupported,
                      std::string(op) + ": KV cache type " + shape(*t) + " is not supported (f32, f16, q8_0)");
    }
    COLIBRI_TRY(same_shape(op, "Q", Q, "O", O));
    const std::int64_t hd = Q.ne[0], heads = Q.ne[1], t = Q.ne[2] * Q.ne[3];
    const std::int64_t kv_heads = K.ne[1], s = K.ne[2];
    if (K.ne[0] != hd || V.ne[0] != hd)
      return bad(op, "K " + shape(K) + " and V " + shape(V) + " must have head_dim = " + std::to_string(hd));
    if (V.ne[1] != kv_heads || V.ne[2] != s || K.ne[3] != 1 || V.ne[3] != 1)
      return bad(op, "V " + shape(V) + " must have the shape of K " + shape(K));
    if (heads % kv_heads != 0)
      return bad(
          op, "n_heads = " + std::to_string(heads) + " is not a multiple of n_kv_heads = " + std::to_string(kv_heads));
    const std::int64_t pos0 = c.params.position;
    if (pos0 < 0 || pos0 + t > s)
      return bad(op, "queries at positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + t - 1) + " need " +
                         std::to_string(pos0 + t) + " cached keys, but the KV cache has S = " + std::to_string(s));
    if (c.params.window < 0) return bad(op, "params.window must be >= 0");
    const float* sinks = nullptr;
    if (with_sinks) {
      const Tensor& Sk = c.inputs[3];
      std::byte* sk;
      COLIBRI_TRY(resolve(op, "sinks (inputs[3])", Sk, sk));
      COLIBRI_TRY(need_type(op, "sinks (inputs[3])", Sk, DType::f32));
      if (Sk.ne[0] != heads || sdk::element_count(Sk) != heads)
        return bad(op, "sinks " + shape(Sk) + " must have n_heads = " + std::to_string(heads) + " elements");
      sinks = reinterpret_cast<const float*>(sk);
    }
    const std::size_t krow = row_bytes(K.type, hd), vrow = row_bytes(V.type, hd);
    const auto* qs = reinterpret_cast<const float*>(q);
    auto* os = reinterpret_cast<float*>(o);
    const float scale = c.params.scale;
    const std::int64_t group = heads / kv_heads, window = c.params.window;
    const KernelSet& ks = *opt_.kernels;
    const auto softmax = ks.softmax_block != nullptr ? ks.softmax_block : softmax_block_scalar;
    // Rows the one-query kernels read as they are; others are dequantized first.
    const bool plain_keys = K.type == DType::f32 || K.type == DType::f16;
    const bool plain_values = V.type == DType::f32 || (V.type == DType::f16 && ks.scale_axpy_f16 != nullptr);
    // A task takes `g` query heads of one position that share a KV head: each key and value row is read
    // once for all of them. g is the largest divisor of the group that still leaves a task per thread;
    // every query's arithmetic is the same whatever g is.
    std::int64_t g = std::min<std::int64_t>(group, kMaxGroupedQueries);
    while (g > 1 && (group % g != 0 || t * heads / g < pool_.size())) --g;
    constexpr std::int64_t kKeyBlock = 64;
    // Per worker: acc (g * hd), scores (g * kKeyBlock), a dequantized key or value row (hd), m, l, corr (g each).
    const std::size_t scratch_floats = static_cast<std::size_t>(g * (hd + kKeyBlock + 3) + hd);
    for (auto& sc : scratch_) sc.get(scratch_floats * sizeof(float));
    pool_.run(t * heads / g, [&](std::int64_t task, int worker) noexcept {
      const std::int64_t i = task / (heads / g), h0 = task % (heads / g) * g, kvh = h0 / group;
      const std::int64_t p = pos0 + i;
      const std::int64_t lo = window > 0 ? std::max<std::int64_t>(0, p - window + 1) : 0;
      auto* buf = reinterpret_cast<float*>(scratch_[static_cast<std::size_t>(worker)].get(0));
      float* acc = buf;                       // g rows of hd
      float* scores = acc + g * hd;           // g rows of kKeyBlock
      float* row_f = scores + g * kKeyBlock;  // one dequantized key or value row
      float* m = row_f + hd;
      float* l = m + g;
      float* corr = l + g;
      const float* qr = qs + (i * heads + h0) * hd;  // the g queries, hd apart
      const int nq = static_cast<int>(g);
      std::fill(acc, acc + g * hd, 0.0f);
      if (sinks != nullptr) {
        // The sink as the first key: m = its score, l = e^(sink - m) = 1, acc += 1 * 0. A sink of -inf is no key.
        for (int n = 0; n < nq; ++n) {
          m[n] = sinks[h0 + n];
          l[n] = m[n] == -std::numeric_limits<float>::infinity() ? 0.0f : 1.0f;
        }
      } else {
        std::fill(m, m + g, -std::numeric_limits<float>::infinity());
        std::fill(l, l + g, 0.0f);
      }
      const std::size_t kstride = static_cast<std::size_t>(kv_heads) * krow;
      const std::size_t vstride = static_cast<std::size_t>(kv_heads) * vrow;
      for (std::int64_t b0 = lo / kKeyBlock * kKeyBlock; b0 <= p; b0 += kKeyBlock) {
        const std::int64_t j0 = std::max(lo, b0), j1 = std::min(p + 1, b0 + kKeyBlock);
        const int nkeys = static_cast<int>(j1 - j0);
        const std::byte* k0 = k + static_cast<std::size_t>(j0 * kv_heads + kvh) * krow;
        const std::byte* v0 = v + static_cast<std::size_t>(j0 * kv_heads + kvh) * vrow;
        if (ks.dot_rows_multi == nullptr ||
            !ks.dot_rows_multi(k0, kstride, nkeys, qr, nq, hd, K.type, scores, kKeyBlock)) {
          for (int j = 0; j < nkeys; ++j) {
            const std::byte* kr = k0 + static_cast<std::size_t>(j) * kstride;
            if (!plain_keys) (void)quant::dequantize_row(K.type, kr, row_f, hd);
            for (int n = 0; n < nq; ++n) {
              const float* qn = qr + n * hd;
              scores[n * kKeyBlock + j] = K.type == DType::f16   ? ks.f16(kr, qn, hd)
                                          : K.type == DType::f32 ? ks.f32(kr, qn, hd)
                                                                 : ks.f32(row_f, qn, hd);
            }
          }
        }
        for (int n = 0; n < nq; ++n) {
          float block_sum;
          const float mn = softmax(scores + n * kKeyBlock, nkeys, scale, m[n], &block_sum);
          corr[n] = portable_exp(m[n] - mn);  // 0 on the first block (m = -inf) unless a sink came first
          l[n] = l[n] * corr[n] + block_sum;
          m[n] = mn;
        }
        if (ks.scale_axpy_rows_multi != nullptr &&
            ks.scale_axpy_rows_multi(acc, corr, scores, kKeyBlock, nq, v0, vstride, nkeys, hd, V.type))
          continue;
        for (int j = 0; j < nkeys; ++j) {
          const std::byte* vr = v0 + static_cast<std::size_t>(j) * vstride;
          if (!plain_values) (void)quant::dequantize_row(V.type, vr, row_f, hd);
          for (int n = 0; n < nq; ++n) {
            // The block's correction is folded into its first value row: acc = acc * corr + p * v.
            const float cn = j == 0 ? corr[n] : 1.0f, pj = scores[n * kKeyBlock + j];
            float* an = acc + n * hd;
            if (V.type == DType::f32)
              ks.scale_axpy(an, cn, pj, reinterpret_cast<const float*>(vr), hd);
            else if (plain_values)
              ks.scale_axpy_f16(an, cn, pj, reinterpret_cast<const std::uint16_t*>(vr), hd);
            else
              ks.scale_axpy(an, cn, pj, row_f, hd);
          }
        }
      }
      for (int n = 0; n < nq; ++n) {
        float* orow = os + (i * heads + h0 + n) * hd;
        const float inv = 1.0f / l[n];
        for (std::int64_t d = 0; d < hd; ++d) orow[d] = acc[n * hd + d] * inv;
      }
    });
    return {};
  }

  // ---------------------------------------------------------------- routing

  // topk_routing, and topk_routing_biased: picks by score + bias (inputs[1]), weights from the scores alone;
  // topk_routing_grouped: as biased, among the experts of the params.groups_used best groups only.
  Status op_topk(const OpCall& c) {
    const bool grouped = c.op == Op::topk_routing_grouped;
    const bool biased = grouped || c.op == Op::topk_routing_biased;
    const char* op = sdk::op_name(c.op);
    if (biased) COLIBRI_TRY(sdk::check_op_call(c, "cpu"));
    COLIBRI_TRY(need_count(op, c, biased ? 2 : 1, biased ? 2 : 1, 2));
    const Tensor &L = c.inputs[0], &I = c.outputs[0], &Wt = c.outputs[1];
    std::byte *l, *ids, *w, *bp = nullptr;
    COLIBRI_TRY(resolve(op, "logits (inputs[0])", L, l));
    if (biased) COLIBRI_TRY(resolve(op, "bias (inputs[1])", c.inputs[1], bp));
    COLIBRI_TRY(resolve(op, "ids (outputs[0])", I, ids));
    COLIBRI_TRY(resolve(op, "weights (outputs[1])", Wt, w));
    COLIBRI_TRY(need_type(op, "logits (inputs[0])", L, DType::f32));
    COLIBRI_TRY(need_type(op, "ids (outputs[0])", I, DType::i32));
    COLIBRI_TRY(need_type(op, "weights (outputs[1])", Wt, DType::f32));
    const std::int64_t e = L.ne[0], t = sdk::row_count(L), kk = c.params.top_k;
    if (kk < 1 || kk > e)
      return bad(op, "params.top_k = " + std::to_string(kk) + " must be in 1.." + std::to_string(e) + " (experts)");
    if (I.ne[0] != kk || sdk::row_count(I) != t)
      return bad(op, "ids " + shape(I) + " must be {" + std::to_string(kk) + ", " + std::to_string(t) + "}");
    if (Wt.ne[0] != kk || sdk::row_count(Wt) != t)
      return bad(op, "weights " + shape(Wt) + " must be {" + std::to_string(kk) + ", " + std::to_string(t) + "}");
    const int flags = c.params.flags;
    if ((flags & kRoutingSoftmax) && (flags & kRoutingSigmoid))
      return bad(op, "kRoutingSoftmax and kRoutingSigmoid exclude each other");
    const auto* ls = reinterpret_cast<const float*>(l);
    for (std::int64_t i = 0; i < e * t; ++i) {
      if (std::isnan(ls[i]))
        return Status(StatusCode::invalid_argument, std::string(op) + ": logit of expert " + std::to_string(i % e) +
                                                        " for token " + std::to_string(i / e) +
                                                        " is NaN (the model produced NaN activations)");
    }
    auto* is = reinterpret_cast<std::int32_t*>(ids);
    auto* ws = reinterpret_cast<float*>(w);
    const auto* bias = reinterpret_cast<const float*>(bp);
    // A NaN bias would break the sort's ordering (a corrupt model file, not activations): refused, named.
    for (std::int64_t j = 0; biased && j < e; ++j) {
      if (std::isnan(bias[j])) return bad(op, "bias of expert " + std::to_string(j) + " is NaN");
    }
    std::vector<float> score(static_cast<std::size_t>(e)), choice(biased ? score.size() : 0), group_score;
    std::vector<std::int32_t> order(static_cast<std::size_t>(e)), group_order;
    for (std::int64_t i = 0; i < t; ++i) {
      const float* x = ls + i * e;
      if (flags & kRoutingSoftmax) {
        float mx = x[0];
        for (std::int64_t j = 1; j < e; ++j) mx = std::max(mx, x[j]);
        float sum = 0.0f;
        for (std::int64_t j = 0; j < e; ++j) sum += (score[static_cast<std::size_t>(j)] = std::exp(x[j] - mx));
        for (auto& s : score) s /= sum;
      } else if (flags & kRoutingSigmoid) {
        for (std::int64_t j = 0; j < e; ++j) score[static_cast<std::size_t>(j)] = 1.0f / (1.0f + std::exp(-x[j]));
      } else {
        for (std::int64_t j = 0; j < e; ++j) score[static_cast<std::size_t>(j)] = x[j];
      }
      for (std::int64_t j = 0; j < e; ++j) order[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
      if (biased) {
        for (std::int64_t j = 0; j < e; ++j)
          choice[static_cast<std::size_t>(j)] = score[static_cast<std::size_t>(j)] + bias[j];
      }
      if (grouped) mask_groups(choice, c.params.groups, c.params.groups_used, flags, group_score, group_order);
      const std::vector<float>& key = biased ? choice : score;
      std::partial_sort(order.begin(), order.begin() + kk, order.end(), [&](std::int32_t a, std::int32_t b) {
        const float sa = key[static_cast<std::size_t>(a)], sb = key[static_cast<std::size_t>(b)];
        return sa > sb || (sa == sb && a < b);
      });
      float sum = 0.0f;
      for (std::int64_t j = 0; j < kk; ++j) sum += score[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
      // HF's biased routers divide by sum + 1e-20 and then scale (routed_scaling_factor).
      if (biased) sum += 1e-20f;
      for (std::int64_t j = 0; j < kk; ++j) {
        const std::int32_t id = order[static_cast<std::size_t>(j)];
        is[i * kk + j] = id;
        const float s = score[static_cast<std::size_t>(id)];
        const float wj = (flags & kRoutingRenormalize) ? s / sum : s;
        ws[i * kk + j] = biased ? wj * c.params.scale : wj;
      }
    }
    return {};
  }

  // topk_routing_grouped's group limit (DeepSeek-V3's noaux_tc): each of the `groups` consecutive groups scores the
  // sum of its two highest choices (f32, the higher first), or its highest with kRoutingGroupMax; the experts outside
  // the `used` best groups (ties to the lower group) become -inf, so they are never picked.
  static void mask_groups(std::vector<float>& choice, std::int32_t groups, std::int32_t used, int flags,
                          std::vector<float>& group_score, std::vector<std::int32_t>& group_order) {
    const std::size_t per = choice.size() / static_cast<std::size_t>(groups);
    group_score.resize(static_cast<std::size_t>(groups));
    group_order.resize(group_score.size());
    for (std::size_t g = 0; g < group_score.size(); ++g) {
      float hi = -std::numeric_limits<float>::infinity(), lo = hi;
      for (std::size_t j = g * per; j < (g + 1) * per; ++j) {
        const float v = choice[j];
        if (v > hi) {
          lo = hi;
          hi = v;
        } else if (v > lo) {
          lo = v;
        }
      }
      group_score[g] = (flags & kRoutingGroupMax) ? hi : hi + lo;
      group_order[g] = static_cast<std::int32_t>(g);
    }
    std::partial_sort(group_order.begin(), group_order.begin() + used, group_order.end(),
                      [&](std::int32_t a, std::int32_t b) {
                        const float sa = group_score[static_cast<std::size_t>(a)];
                        const float sb = group_score[static_cast<std::size_t>(b)];
                        return sa > sb || (sa == sb && a < b);
                      });
    for (std::size_t r = static_cast<std::size_t>(used); r < group_order.size(); ++r) {
      const auto g = static_cast<std::size_t>(group_order[r]);
      std::fill(choice.begin() + static_cast<std::ptrdiff_t>(g * per),
                choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * per), -std::numeric_limits<float>::infinity());
    }
  }

  // ---------------------------------------------------------------- embedding

  Status op_embedding(const OpCall& c) {
    const char* op = "embedding";
    COLIBRI_TRY(need_count(op, c, 2, 2, 1));
    const Tensor &Tb = c.inputs[0], &I = c.inputs[1], &Y = c.outputs[0];
    COLIBRI_TRY(check_weight(op, "table (inputs[0])", Tb, false));
    std::byte *tb, *ids, *y;
    COLIBRI_TRY(resolve(op, "table (inputs[0])", Tb, tb));
    COLIBRI_TRY(resolve(op, "ids (inputs[1])", I, ids));
    COLIBRI_TRY(resolve(op, "Y (outputs[0])", Y, y));
    COLIBRI_TRY(need_type(op, "ids (inputs[1])", I, DType::i32));
    COLIBRI_TRY(need_type(op, "Y (outputs[0])", Y, DType::f32));
    const std::int64_t d = Tb.ne[0], vocab = Tb.ne[1], t = sdk::element_count(I);
    if (Y.ne[0] != d || sdk::row_count(Y) != t)
      return bad(op, "Y " + shape(Y) + " must be {" + std::to_string(d) + ", " + std::to_string(t) + "}");
    const auto* is = reinterpret_cast<const std::int32_t*>(ids);
    for (std::int64_t i = 0; i < t; ++i) {
      if (is[i] < 0 || is[i] >= vocab)
        return bad(op, "token id " + std::to_string(is[i]) + " at position " + std::to_string(i) +
                           " is outside the vocabulary 0.." + std::to_string(vocab - 1));
    }
    const std::size_t rb = row_bytes(Tb.type, d);
    auto* ys = reinterpret_cast<float*>(y);
    pool_.run(t, [&](std::int64_t i, int) noexcept {
      (void)quant::dequantize_row(Tb.type, tb + static_cast<std::size_t>(is[i]) * rb, ys + i * d, d);
    });
    return {};
  }

  HostServices& host_;
  Options opt_;
  std::mutex mu_;
  ThreadPool pool_;
  std::vector<Scratch> scratch_;  // one per worker
  Scratch act_scratch_;
  Scratch ffn_scratch_;
  Scratch heads_scratch_;  // matmul_heads' gathered rows and results (T > 1)
  // matmul_jobs' and expert_ffn's bookkeeping, kept so a decode step does not allocate.
  std::vector<Activation> acts_;
  std::vector<std::size_t> act_of_job_;
  std::vector<std::int64_t> first_row_, first_task_, hidden_at_;
  std::vector<MatJob> jobs_;
  std::vector<ExpertCall> experts_;
  // expert_ffn_routed's: a token's picks, its group call, and the experts' outputs.
  std::vector<std::pair<std::int32_t, float>> routed_picks_;
  std::vector<Tensor> routed_in_, routed_out_;
  Scratch routed_scratch_;
  std::vector<DeviceInfo> devices_;
};

// ------------------------------------------------------------------ descriptor

// No ISA instruction runs here: the host probed the CPU.
Score score(const HostInfo& h) noexcept {
  const bool avx512 = h.avx2 && h.fma && h.f16c && h.avx512f && h.avx512bw && h.avx512vl && h.avx512_vnni;
  if (avx512) return {300, "x86-64 with AVX-512 VNNI kernels"};
  if (h.avx2 && h.fma && h.f16c) return {200, "x86-64 with AVX2 kernels"};
  return {100, "x86-64 scalar kernels (no AVX2 on this CPU)"};
}

const OptionSpec kOptions[] = {
    {"isa", OptionType::string, "auto",
     "row kernels: auto (best this CPU runs), scalar (the reference path), avx2, avxvnni (AVX2 with AVX-VNNI), "
     "avx512 (with VNNI)"},
    {"q6k_decode", OptionType::string, "auto",
     "one token's q6_K matmuls: rows (the 8-row kernel), dot (a row at a time, faster from memory on AMD Zen 3/4), "
     "auto (dot on AMD family 19h, Zen 3/4; rows on others); the same results"},
    {"prefetch", OptionType::string, "auto",
     "where the kernels' software prefetches bring the weights: l1, l2, or auto (l2 on AMD family 19h, Zen 3/4; l1 on "
     "others); the same results"},
};
const char* const kCapabilities[] = {"host_memory", "avx2", "avx512_vnni", "batch_invariant"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::compute,
    "cpu",
    "1.0.0",
    "host CPU: every op, AVX2 / AVX-512 VNNI quantized matvec, batch- and thread-invariant results",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<CpuCompute>,
};

}  // namespace
}  // namespace colibri::cpu

COLIBRI_DEFINE_PLUGIN(colibri::cpu::kDescriptor)
