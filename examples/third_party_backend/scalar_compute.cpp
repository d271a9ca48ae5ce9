// compute/scalar: a toy third-party backend built only against the installed SDK. It computes a
// subset of the op set in plain scalar C++ (f32 weights and KV cache only)
// and answers supports() = false for the rest, which is how a partial backend tells the engine
// and the conformance suite what it can do. Single-threaded, so results never depend on batch
// or thread count (THE ONE PROMISE of compute.hpp).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "colibri/sdk/sdk.hpp"

namespace {

using namespace colibri::sdk;

class HostBuffer final : public Buffer {
 public:
  HostBuffer(void* data, std::size_t size) : data_(data), size_(size) {}
  ~HostBuffer() override { std::free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  [[nodiscard]] std::size_t size() const noexcept override { return size_; }
  [[nodiscard]] void* host_pointer() noexcept override { return data_; }

 private:
  void* data_;
  std::size_t size_;
};

Status bad(const std::string& what) {
  return Status(StatusCode::invalid_argument, "scalar: " + what);
}

bool same_shape(const Tensor& a, const Tensor& b) {
  return a.ne == b.ne;
}

// A tensor's host address: its own pointer, or its host buffer plus offset.
template <typename T>
T* host(const Tensor& t) {
  if (t.data != nullptr) return static_cast<T*>(t.data);
  if (t.buffer == nullptr || t.buffer->host_pointer() == nullptr) return nullptr;
  return reinterpret_cast<T*>(static_cast<std::byte*>(t.buffer->host_pointer()) + t.offset);
}

// Checks arity, that every tensor is f32 (except the listed i32 positions) and has data.
Status check(const OpCall& c, const char* name, std::size_t n_in, std::size_t n_in_max, std::size_t n_out,
             std::vector<std::pair<bool, std::size_t>> i32 = {}) {
  if (c.inputs.size() < n_in || c.inputs.size() > n_in_max || c.outputs.size() != n_out) {
    return bad(std::string(name) + ": expected " + std::to_string(n_in) + " inputs and " + std::to_string(n_out) +
               " outputs, got " + std::to_string(c.inputs.size()) + " and " + std::to_string(c.outputs.size()));
  }
  auto want = [&](bool output, std::size_t i) {
    return std::find(i32.begin(), i32.end(), std::make_pair(output, i)) != i32.end() ? DType::i32 : DType::f32;
  };
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.inputs[i].type != want(false, i))
      return bad(std::string(name) + ": input " + std::to_string(i) + " has an unsupported type");
    if (host<void>(c.inputs[i]) == nullptr)
      return bad(std::string(name) + ": input " + std::to_string(i) + " has no data");
  }
  for (std::size_t i = 0; i < c.outputs.size(); ++i) {
    if (c.outputs[i].type != want(true, i))
      return bad(std::string(name) + ": output " + std::to_string(i) + " has an unsupported type");
    if (host<void>(c.outputs[i]) == nullptr)
      return bad(std::string(name) + ": output " + std::to_string(i) + " has no data");
  }
  return {};
}

class ScalarCompute final : public ComputeBase {
 public:
  static Expected<std::unique_ptr<ScalarCompute>> create(const CreateContext& ctx) {
    // `threads` is accepted for profile compatibility; this backend always uses one.
    auto threads = ctx.config->get_int("threads", 1);
    if (!threads) return threads.error();
    return std::make_unique<ScalarCompute>();
  }

  [[nodiscard]] std::span<const DeviceInfo> devices() const noexcept override { return {&device_, 1}; }

  Expected<std::unique_ptr<Buffer>> allocate(std::size_t bytes) noexcept override {
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr)
      return Status(StatusCode::out_of_memory, "scalar: cannot allocate " + std::to_string(bytes) + " bytes");
    std::unique_ptr<Buffer> b(new (std::nothrow) HostBuffer(p, bytes));
    if (!b) {
      std::free(p);
      return Status(StatusCode::out_of_memory, "scalar: cannot allocate a buffer object");
    }
    return b;
  }

  // The ops run() implements, f32 only. Any other (store_rows, the group and routed ops, the gpt-oss and Qwen3-Next
  // ops, or an op of a newer SDK) is optional: the engine then does without it, or refuses the model at load by name.
  [[nodiscard]] bool supports(Op op, DType weight_type) const noexcept override {
    switch (op) {
      case Op::matmul:
      case Op::rms_norm:
      case Op::rope:
      case Op::swiglu:
      case Op::add:
      case Op::sigmoid:
      case Op::scale_add:
      case Op::topk_routing:
      case Op::topk_routing_biased:
      case Op::topk_routing_grouped:
      case Op::embedding:
      case Op::attention:
      case Op::expert_ffn:
      case Op::concat_rows:
      case Op::matmul_heads: return weight_type == DType::f32;
      default: return false;
    }
  }

  Status run(const OpCall& c) noexcept override {
    try {
      switch (c.op) {
        case Op::matmul: return matmul(c);
        case Op::rms_norm: return rms_norm(c);
        case Op::rope: return rope(c);
        case Op::swiglu:
        case Op::add:
        case Op::sigmoid: return elementwise(c);
        case Op::scale_add: return scale_add(c);
        case Op::topk_routing: return topk(c);
        case Op::topk_routing_biased:
        case Op::topk_routing_grouped: return topk_biased(c);
        case Op::embedding: return embedding(c);
        case Op::attention: return attention(c);
        case Op::expert_ffn: return expert_ffn(c);
        case Op::concat_rows: return concat_rows(c);
        case Op::matmul_heads: return matmul_heads(c);
        default:  // store_rows, the group and routed ops, the gpt-oss ops, or a newer SDK's op: supports() said no
          return Status(StatusCode::unsupported,
                        "scalar: op " + std::to_string(static_cast<std::uint32_t>(c.op)) + " is not implemented");
      }
    } catch (const std::exception& e) {
      return Status(StatusCode::internal, std::string("scalar: ") + e.what());
    }
  }

 private:
  static Status matmul(const OpCall& c) {
    if (!c.inputs.empty() && c.inputs[0].type != DType::f32) {
      return Status(StatusCode::unsupported, "scalar: matmul supports f32 weights only");
    }
    if (auto s = check(c, "matmul", 2, 3, 1); !s) return s;
    const Tensor &w = c.inputs[0], &x = c.inputs[1], &y = c.outputs[0];
    const std::int64_t k = w.ne[0], n = w.ne[1], t = row_count(x);
    if (x.ne[0] != k) return bad("matmul: X has K=" + std::to_string(x.ne[0]) + ", W has K=" + std::to_string(k));
    if (y.ne[0] != n || row_count(y) != t) return bad("matmul: output must be {N, T}");
    if (c.inputs.size() == 3 && element_count(c.inputs[2]) != n) return bad("matmul: bias must have N elements");
    const float *wp = host<float>(w), *xp = host<float>(x);
    const float* bias = c.inputs.size() == 3 ? host<float>(c.inputs[2]) : nullptr;
    float* yp = host<float>(y);
    for (std::int64_t ti = 0; ti < t; ++ti) {
      for (std::int64_t ni = 0; ni < n; ++ni) {
        double acc = 0.0;
        for (std::int64_t ki = 0; ki < k; ++ki) acc += static_cast<double>(wp[ni * k + ki]) * xp[ti * k + ki];
        if (bias != nullptr) acc += bias[ni];
        yp[ti * n + ni] = static_cast<float>(acc);
      }
    }
    return {};
  }

  // matmul_heads (DeepSeek's latent attention): for each token and head, matmul on views of head h's matrix and the
  // first K values of that row (rows are contiguous, so no copy), which gives matmul's bits by construction.
  static Status matmul_heads(const OpCall& c) {
    if (auto s = check_op_call(c, "scalar"); !s) return s;
    if (c.inputs[0].type != DType::f32) {
      return Status(StatusCode::unsupported, "scalar: matmul_heads supports f32 weights only");
    }
    if (auto s = check(c, "matmul_heads", 2, 2, 1); !s) return s;
    const Tensor &w = c.inputs[0], &x = c.inputs[1], &y = c.outputs[0];
    const std::int64_t k = w.ne[0], n = w.ne[1], heads = w.ne[2], kx = x.ne[0], t = x.ne[2];
    for (std::int64_t ti = 0; ti < t; ++ti) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const Tensor in[] = {Tensor{DType::f32, {k, n, 1, 1}, host<float>(w) + h * n * k},
                             Tensor{DType::f32, {k, 1, 1, 1}, host<float>(x) + (ti * heads + h) * kx}};
        Tensor out{DType::f32, {n, 1, 1, 1}, host<float>(y) + (ti * heads + h) * n};
        if (auto s = matmul(OpCall{Op::matmul, in, {&out, 1}, c.params}); !s) return s;
      }
    }
    return {};
  }

  // concat_rows: each row of Y is A's row followed by B's (the SDK's shared checks name a mismatched tensor).
  static Status concat_rows(const OpCall& c) {
    if (auto s = check_op_call(c, "scalar"); !s) return s;
    if (auto s = check(c, "concat_rows", 2, 2, 1); !s) return s;
    const Tensor &a = c.inputs[0], &b = c.inputs[1];
    const auto wa = static_cast<std::size_t>(a.ne[0]), wb = static_cast<std::size_t>(b.ne[0]);
    const float *ap = host<float>(a), *bp = host<float>(b);
    float* yp = host<float>(c.outputs[0]);
    for (std::size_t r = 0; r < static_cast<std::size_t>(row_count(a)); ++r) {
      std::memcpy(yp + r * (wa + wb), ap + r * wa, wa * sizeof(float));
      std::memcpy(yp + r * (wa + wb) + wa, bp + r * wb, wb * sizeof(float));
    }
    return {};
  }

  // down(silu(gate X) * up X), composed from the ops above exactly as the contract describes.
  static Status expert_ffn(const OpCall& c) {
    for (const Tensor& t : c.inputs) {
      if (t.type != DType::f32) return Status(StatusCode::unsupported, "scalar: expert_ffn supports f32 weights only");
    }
    if (auto s = check(c, "expert_ffn", 4, 4, 1); !s) return s;
    const Tensor &gate = c.inputs[0], &up = c.inputs[1], &down = c.inputs[2], &x = c.inputs[3];
    const std::int64_t d = gate.ne[0], f = gate.ne[1], t = row_count(x);
    if (up.ne != gate.ne || down.ne[0] != f || down.ne[1] != d || x.ne[0] != d) {
      return bad("expert_ffn: expects gate and up {D, F}, down {F, D}, X {D, T}");
    }
    std::vector<float> g(static_cast<std::size_t>(f * t)), u(g.size()), h(g.size());
    const Tensor gt{DType::f32, {f, t, 1, 1}, g.data()}, ut{DType::f32, {f, t, 1, 1}, u.data()};
    Tensor outs[] = {gt, ut, Tensor{DType::f32, {f, t, 1, 1}, h.data()}};
    const Tensor in_gate[] = {gate, x}, in_up[] = {up, x}, in_act[] = {gt, ut}, in_down[] = {down, outs[2]};
    if (auto s = matmul(OpCall{Op::matmul, in_gate, {&outs[0], 1}, c.params}); !s) return s;
    if (auto s = matmul(OpCall{Op::matmul, in_up, {&outs[1], 1}, c.params}); !s) return s;
    if (auto s = elementwise(OpCall{Op::swiglu, in_act, {&outs[2], 1}, c.params}); !s) return s;
    return matmul(OpCall{Op::matmul, in_down, c.outputs, c.params});
  }

  static Status rms_norm(const OpCall& c) {
    if (auto s = check(c, "rms_norm", 2, 2, 1); !s) return s;
    const Tensor &x = c.inputs[0], &w = c.inputs[1], &y = c.outputs[0];
    const std::int64_t d = x.ne[0];
    if (element_count(w) != d || !same_shape(x, y)) return bad("rms_norm: w must have D elements and Y the shape of X");
    if (!(c.params.eps >= 0.0f)) return bad("rms_norm: params.eps must be >= 0");
    const float *xp = host<float>(x), *wp = host<float>(w);
    float* yp = host<float>(y);
    for (std::int64_t r = 0; r < row_count(x); ++r) {
      double ss = 0.0;
      for (std::int64_t j = 0; j < d; ++j) ss += static_cast<double>(xp[r * d + j]) * xp[r * d + j];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + c.params.eps);
      for (std::int64_t j = 0; j < d; ++j) yp[r * d + j] = static_cast<float>(xp[r * d + j] * inv * wp[j]);
    }
    return {};
  }

  static Status rope(const OpCall& c) {
    if (auto s = check(c, "rope", 3, 3, 1, {{false, 1}}); !s) return s;
    const Tensor &x = c.inputs[0], &pos = c.inputs[1], &inv = c.inputs[2], &y = c.outputs[0];
    const std::int64_t hd = x.ne[0], heads = x.ne[1], t = x.ne[2] * x.ne[3];
    const int dims = c.params.rope_dims, half = dims / 2;
    if (dims <= 0 || dims % 2 != 0 || dims > hd) return bad("rope: rope_dims must be even and in 1..head_dim");
    if (element_count(pos) != t || element_count(inv) != half || !same_shape(x, y))
      return bad("rope: shapes do not match");
    const float *xp = host<float>(x), *ip = host<float>(inv);
    const std::int32_t* pp = host<std::int32_t>(pos);
    float* yp = host<float>(y);
    if (yp != xp) std::memcpy(yp, xp, static_cast<std::size_t>(element_count(x)) * sizeof(float));
    const bool interleaved = (c.params.flags & kRopeInterleaved) != 0;
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t h = 0; h < heads; ++h) {
        float* row = yp + (i * heads + h) * hd;
        for (int j = 0; j < half; ++j) {
          const float theta = static_cast<float>(pp[i]) * ip[j];  // float32 angle, as HuggingFace
          const double cs = std::cos(static_cast<double>(theta)) * c.params.scale;
          const double sn = std::sin(static_cast<double>(theta)) * c.params.scale;
          const int a = interleaved ? 2 * j : j, b = interleaved ? a + 1 : a + half;
          const double x0 = row[a], x1 = row[b];
          row[a] = static_cast<float>(x0 * cs - x1 * sn);
          row[b] = static_cast<float>(x0 * sn + x1 * cs);
        }
      }
    }
    return {};
  }

  static Status elementwise(const OpCall& c) {
    const bool unary = c.op == Op::sigmoid;
    const char* name = c.op == Op::add ? "add" : unary ? "sigmoid" : "swiglu";
    if (auto s = check(c, name, unary ? 1 : 2, unary ? 1 : 2, 1); !s) return s;
    const Tensor& a = c.inputs[0];
    if (!same_shape(a, c.outputs[0]) || (!unary && !same_shape(a, c.inputs[1]))) {
      return bad(std::string(name) + ": inputs and output must have the same shape");
    }
    const float* ap = host<float>(a);
    const float* bp = unary ? nullptr : host<float>(c.inputs[1]);
    float* yp = host<float>(c.outputs[0]);
    for (std::int64_t i = 0; i < element_count(a); ++i) {
      const double x = ap[i];
      if (c.op == Op::add) {
        yp[i] = ap[i] + bp[i];
      } else if (unary) {
        yp[i] = static_cast<float>(1.0 / (1.0 + std::exp(-x)));
      } else {
        yp[i] = static_cast<float>(x / (1.0 + std::exp(-x)) * bp[i]);
      }
    }
    return {};
  }

  static Status scale_add(const OpCall& c) {
    if (auto s = check(c, "scale_add", 2, 2, 1); !s) return s;
    const Tensor &x = c.inputs[0], &w = c.inputs[1], &y = c.outputs[0];
    if (!same_shape(x, y) || element_count(w) != row_count(x))
      return bad("scale_add: Y must have X's shape and w one weight per token");
    const float *xp = host<float>(x), *wp = host<float>(w);
    float* yp = host<float>(y);
    const std::int64_t d = x.ne[0];
    for (std::int64_t t = 0; t < row_count(x); ++t) {
      for (std::int64_t j = 0; j < d; ++j) yp[t * d + j] += wp[t] * xp[t * d + j];
    }
    return {};
  }

  static Status topk(const OpCall& c) {
    if (auto s = check(c, "topk_routing", 1, 1, 2, {{true, 0}}); !s) return s;
    const Tensor &logits = c.inputs[0], &ids = c.outputs[0], &weights = c.outputs[1];
    const std::int64_t e = logits.ne[0], t = row_count(logits), k = c.params.top_k;
    if (k < 1 || k > e) return bad("topk_routing: top_k must be in 1..experts (" + std::to_string(e) + ")");
    if (ids.ne[0] != k || row_count(ids) != t || !same_shape(ids, weights))
      return bad("topk_routing: outputs must be {k, T}");
    const float* lp = host<float>(logits);
    auto* ip = host<std::int32_t>(ids);
    float* wp = host<float>(weights);
    const int flags = c.params.flags;
    std::vector<double> score(static_cast<std::size_t>(e));
    std::vector<std::int32_t> order(static_cast<std::size_t>(e));
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const float* x = lp + ti * e;
      // A NaN would be routed as if it were a score (and breaks the sort's ordering): the SDK says fail, naming it.
      if (const float* nan = std::find_if(x, x + e, [](float v) { return std::isnan(v); }); nan != x + e) {
        return bad("topk_routing: the logit of expert " + std::to_string(nan - x) + " for token " + std::to_string(ti) +
                   " is NaN");
      }
      if (flags & kRoutingSoftmax) {
        const double mx = *std::max_element(x, x + e);
        double sum = 0.0;
        for (std::int64_t j = 0; j < e; ++j) sum += (score[static_cast<std::size_t>(j)] = std::exp(x[j] - mx));
        for (auto& s : score) s /= sum;
      } else {
        for (std::int64_t j = 0; j < e; ++j) {
          score[static_cast<std::size_t>(j)] = (flags & kRoutingSigmoid) ? 1.0 / (1.0 + std::exp(-double{x[j]})) : x[j];
        }
      }
      std::iota(order.begin(), order.end(), 0);
      // stable_sort keeps the lower id first among equal scores.
      std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
        return score[static_cast<std::size_t>(a)] > score[static_cast<std::size_t>(b)];
      });
      double sum = 0.0;
      for (std::int64_t j = 0; j < k; ++j) sum += score[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
      for (std::int64_t j = 0; j < k; ++j) {
        const double s = score[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
        ip[ti * k + j] = order[static_cast<std::size_t>(j)];
        wp[ti * k + j] = static_cast<float>((flags & kRoutingRenormalize) ? s / sum : s);
      }
    }
    return {};
  }

  // topk_routing_biased (GLM-4.5, DeepSeek-V3 routers): picked by score + bias, weighted by the score alone, every
  // step in f32 as compute.hpp asks. topk_routing_grouped (DeepSeek-V3) picks the same way among the experts of the
  // best params.groups_used groups only. The SDK's shared checks give the shape and parameter errors.
  static Status topk_biased(const OpCall& c) {
    if (auto s = check_op_call(c, "scalar"); !s) return s;
    const std::string op = op_name(c.op);
    if (auto s = check(c, op.c_str(), 2, 2, 2, {{true, 0}}); !s) return s;
    const Tensor &logits = c.inputs[0], &ids = c.outputs[0], &weights = c.outputs[1];
    const std::int64_t e = logits.ne[0], t = row_count(logits), k = c.params.top_k;
    const float* lp = host<float>(logits);
    const float* bias = host<float>(c.inputs[1]);
    auto* ip = host<std::int32_t>(ids);
    float* wp = host<float>(weights);
    const int flags = c.params.flags;
    std::vector<float> score(static_cast<std::size_t>(e)), choice(score.size());
    std::vector<std::int32_t> order(static_cast<std::size_t>(e));
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const float* x = lp + ti * e;
      if (const float* nan = std::find_if(x, x + e, [](float v) { return std::isnan(v); }); nan != x + e) {
        return bad(op + ": the logit of expert " + std::to_string(nan - x) + " for token " + std::to_string(ti) +
                   " is NaN");
      }
      const float mx = *std::max_element(x, x + e);
      float total = 0.0f;
      for (std::int64_t j = 0; j < e; ++j) {
        float& s = score[static_cast<std::size_t>(j)];
        s = (flags & kRoutingSoftmax)   ? std::exp(x[j] - mx)
            : (flags & kRoutingSigmoid) ? 1.0f / (1.0f + std::exp(-x[j]))
                                        : x[j];
        total += s;
      }
      for (std::int64_t j = 0; j < e; ++j) {
        float& s = score[static_cast<std::size_t>(j)];
        if (flags & kRoutingSoftmax) s /= total;
        choice[static_cast<std::size_t>(j)] = s + bias[j];
      }
      if (c.op == Op::topk_routing_grouped) limit_groups(choice, c.params.groups, c.params.groups_used, flags);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
        return choice[static_cast<std::size_t>(a)] > choice[static_cast<std::size_t>(b)];
      });
      float sum = 0.0f;
      for (std::int64_t j = 0; j < k; ++j) sum += score[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
      for (std::int64_t j = 0; j < k; ++j) {
        const float s = score[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
        ip[ti * k + j] = order[static_cast<std::size_t>(j)];
        wp[ti * k + j] = ((flags & kRoutingRenormalize) ? s / (sum + 1e-20f) : s) * c.params.scale;
      }
    }
    return {};
  }

  // The group limit: each group of E / groups consecutive experts scores its two best choices' sum (or its best
  // with kRoutingGroupMax); the experts of all but the `used` best groups (ties to the lower group) are left out.
  static void limit_groups(std::vector<float>& choice, std::int32_t groups, std::int32_t used, int flags) {
    const auto per = static_cast<std::ptrdiff_t>(choice.size()) / groups;
    std::vector<float> group_score(static_cast<std::size_t>(groups));
    for (std::int32_t g = 0; g < groups; ++g) {
      std::vector<float> mine(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(mine.begin(), mine.end(), std::greater<>());
      group_score[static_cast<std::size_t>(g)] = (flags & kRoutingGroupMax) ? mine[0] : mine[0] + mine[1];
    }
    std::vector<std::int32_t> rank(group_score.size());
    std::iota(rank.begin(), rank.end(), 0);
    std::stable_sort(rank.begin(), rank.end(), [&](std::int32_t a, std::int32_t b) {
      return group_score[static_cast<std::size_t>(a)] > group_score[static_cast<std::size_t>(b)];
    });
    for (std::size_t r = static_cast<std::size_t>(used); r < rank.size(); ++r) {
      std::fill(choice.begin() + rank[r] * per, choice.begin() + (rank[r] + 1) * per,
                -std::numeric_limits<float>::infinity());
    }
  }

  // Plain causal softmax attention in double over f32 K/V rows (no online softmax needed here).
  static Status attention(const OpCall& c) {
    if (c.inputs.size() == 3 && (c.inputs[1].type != DType::f32 || c.inputs[2].type != DType::f32)) {
      return Status(StatusCode::unsupported, "scalar: attention supports an f32 KV cache only");
    }
    if (auto s = check(c, "attention", 3, 3, 1); !s) return s;
    const Tensor &q = c.inputs[0], &kc = c.inputs[1], &vc = c.inputs[2], &o = c.outputs[0];
    const std::int64_t hd = q.ne[0], heads = q.ne[1], t = q.ne[2], kv_heads = kc.ne[1], s_len = kc.ne[2];
    if (kc.ne[0] != hd || !same_shape(kc, vc) || !same_shape(q, o)) return bad("attention: shapes do not match");
    if (kv_heads < 1 || heads % kv_heads != 0) return bad("attention: heads must be a multiple of kv heads");
    if (c.params.position < 0 || c.params.position + t > s_len) {
      return bad("attention: position + T (" + std::to_string(c.params.position + t) + ") exceeds the KV cache (" +
                 std::to_string(s_len) + ")");
    }
    const float *qp = host<float>(q), *kp = host<float>(kc), *vp = host<float>(vc);
    float* op = host<float>(o);
    std::vector<double> w(static_cast<std::size_t>(s_len)), acc(static_cast<std::size_t>(hd));
    for (std::int64_t i = 0; i < t; ++i) {
      const std::int64_t last = c.params.position + i;
      const std::int64_t first = c.params.window > 0 ? std::max<std::int64_t>(0, last - c.params.window + 1) : 0;
      for (std::int64_t h = 0; h < heads; ++h) {
        const float* qrow = qp + (i * heads + h) * hd;
        const std::int64_t kvh = h / (heads / kv_heads);
        double mx = -INFINITY;
        for (std::int64_t j = first; j <= last; ++j) {
          const float* krow = kp + (j * kv_heads + kvh) * hd;
          double dot = 0.0;
          for (std::int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qrow[d]) * krow[d];
          w[static_cast<std::size_t>(j)] = dot * c.params.scale;
          mx = std::max(mx, w[static_cast<std::size_t>(j)]);
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::int64_t j = first; j <= last; ++j) {
          const double e = std::exp(w[static_cast<std::size_t>(j)] - mx);
          sum += e;
          const float* vrow = vp + (j * kv_heads + kvh) * hd;
          for (std::int64_t d = 0; d < hd; ++d) acc[static_cast<std::size_t>(d)] += e * vrow[d];
        }
        float* orow = op + (i * heads + h) * hd;
        for (std::int64_t d = 0; d < hd; ++d) orow[d] = static_cast<float>(acc[static_cast<std::size_t>(d)] / sum);
      }
    }
    return {};
  }

  static Status embedding(const OpCall& c) {
    if (!c.inputs.empty() && c.inputs[0].type != DType::f32) {
      return Status(StatusCode::unsupported, "scalar: embedding supports f32 tables only");
    }
    if (auto s = check(c, "embedding", 2, 2, 1, {{false, 1}}); !s) return s;
    const Tensor &table = c.inputs[0], &ids = c.inputs[1], &y = c.outputs[0];
    const std::int64_t d = table.ne[0], v = row_count(table), t = element_count(ids);
    if (y.ne[0] != d || row_count(y) != t) return bad("embedding: output must be {D, T}");
    const float* tp = host<float>(table);
    const auto* ip = host<const std::int32_t>(ids);
    for (std::int64_t i = 0; i < t; ++i) {
      if (ip[i] < 0 || ip[i] >= v)
        return bad("embedding: id " + std::to_string(ip[i]) + " outside the vocabulary of " + std::to_string(v));
    }
    float* yp = host<float>(y);
    for (std::int64_t i = 0; i < t; ++i)
      std::memcpy(yp + i * d, tp + ip[i] * d, static_cast<std::size_t>(d) * sizeof(float));
    return {};
  }

  DeviceInfo device_{"scalar (host, one thread)", true, 0, 0, "scalar f32"};
};

// Low score: never picked over the real backends unless a profile names it (compute.backend: scalar).
Score score(const HostInfo&) noexcept {
  return {1, ""};
}

const OptionSpec kOptions[] = {{"threads", OptionType::integer, "1", "accepted for compatibility; always 1", true}};
const char* const kCapabilities[] = {"f32"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::compute,
    "scalar",
    "0.1.0",
    "scalar f32 subset of the op set (example third-party backend)",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<ScalarCompute>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
