#include "colibri/sdk/testing/reference_ops.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "colibri/quant/quant.hpp"
#include "colibri/sdk/compute.hpp"

namespace colibri::sdk::testing::ref {

std::vector<float> dequantize(DType type, const void* data, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  auto s = quant::dequantize_row(type, data, out.data(), n, quant::Isa::scalar);
  if (!s) throw std::invalid_argument("reference dequantize: " + s.to_string());
  return out;
}

std::vector<double> matmul(DType type, const void* w, std::int64_t k, std::int64_t n, const float* x, std::int64_t t,
                           const float* bias) {
  const std::size_t rb = row_bytes(type, k);
  std::vector<double> y(static_cast<std::size_t>(n * t));
  for (std::int64_t r = 0; r < n; ++r) {
    const auto row = dequantize(type, static_cast<const std::byte*>(w) + static_cast<std::size_t>(r) * rb, k);
    for (std::int64_t i = 0; i < t; ++i) {
      double s = 0.0;
      for (std::int64_t j = 0; j < k; ++j) s += static_cast<double>(row[static_cast<std::size_t>(j)]) * x[i * k + j];
      y[static_cast<std::size_t>(i * n + r)] = s + (bias != nullptr ? bias[r] : 0.0);
    }
  }
  return y;
}

std::vector<float> concat_rows(const float* a, std::int64_t a_width, const float* b, std::int64_t b_width,
                               std::int64_t rows) {
  std::vector<float> y;
  y.reserve(static_cast<std::size_t>((a_width + b_width) * rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    y.insert(y.end(), a + r * a_width, a + (r + 1) * a_width);
    y.insert(y.end(), b + r * b_width, b + (r + 1) * b_width);
  }
  return y;
}

std::vector<double> matmul_heads(DType type, const void* w, std::int64_t k, std::int64_t n, std::int64_t heads,
                                 const float* x, std::int64_t kx, std::int64_t t) {
  const std::size_t head_bytes = row_bytes(type, k) * static_cast<std::size_t>(n);
  std::vector<double> y(static_cast<std::size_t>(n * heads * t));
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t h = 0; h < heads; ++h) {
      // The row gathered alone, then the reference matmul of head h's matrix.
      const float* row = x + (i * heads + h) * kx;
      const std::vector<float> xr(row, row + k);
      const auto yr =
          matmul(type, static_cast<const std::byte*>(w) + static_cast<std::size_t>(h) * head_bytes, k, n, xr.data(), 1);
      std::copy(yr.begin(), yr.end(), y.begin() + (i * heads + h) * n);
    }
  }
  return y;
}

double silu(double x) {
  return x / (1.0 + std::exp(-x));
}
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

namespace {

// An expert's down projection of its activation h {f, t} (double, as the experts compute it) (+ b_down[r]).
std::vector<double> down_projection(DType down_type, const void* down, std::int64_t d, std::int64_t f,
                                    const std::vector<double>& h, std::int64_t t, const float* b_down) {
  const std::size_t rb = row_bytes(down_type, f);
  std::vector<double> y(static_cast<std::size_t>(d * t));
  for (std::int64_t r = 0; r < d; ++r) {
    const auto row = dequantize(down_type, static_cast<const std::byte*>(down) + static_cast<std::size_t>(r) * rb, f);
    for (std::int64_t i = 0; i < t; ++i) {
      double s = 0.0;
      for (std::int64_t j = 0; j < f; ++j)
        s += static_cast<double>(row[static_cast<std::size_t>(j)]) * h[static_cast<std::size_t>(i * f + j)];
      y[static_cast<std::size_t>(i * d + r)] = b_down != nullptr ? s + b_down[r] : s;
    }
  }
  return y;
}

}  // namespace

std::vector<double> expert_ffn(DType gate_type, const void* gate, DType up_type, const void* up, DType down_type,
                               const void* down, std::int64_t d, std::int64_t f, const float* x, std::int64_t t) {
  const auto g = matmul(gate_type, gate, d, f, x, t);
  const auto u = matmul(up_type, up, d, f, x, t);
  std::vector<double> h(g.size());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = silu(g[i]) * u[i];
  return down_projection(down_type, down, d, f, h, t, nullptr);
}

std::vector<double> expert_ffn_clamped(DType gate_type, const void* gate, DType up_type, const void* up,
                                       DType down_type, const void* down, std::int64_t d, std::int64_t f,
                                       const float* x, std::int64_t t, const float* b_gate, const float* b_up,
                                       const float* b_down, float alpha, float limit) {
  const auto g = matmul(gate_type, gate, d, f, x, t, b_gate);
  const auto u = matmul(up_type, up, d, f, x, t, b_up);
  std::vector<double> h(g.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    const double gi = std::min<double>(g[i], limit), ui = std::clamp<double>(u[i], -limit, limit);
    h[i] = (ui + 1.0) * gi * sigmoid(alpha * gi);
  }
  return down_projection(down_type, down, d, f, h, t, b_down);
}

std::vector<double> rms_norm(const float* x, std::int64_t d, std::int64_t rows, const float* w, float eps) {
  std::vector<double> y(static_cast<std::size_t>(d * rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (std::int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[r * d + j]) * x[r * d + j];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (std::int64_t j = 0; j < d; ++j) y[static_cast<std::size_t>(r * d + j)] = x[r * d + j] * inv * w[j];
  }
  return y;
}

std::vector<double> rope(const float* x, std::int64_t head_dim, std::int64_t heads, std::int64_t t,
                         const std::int32_t* positions, const float* inv_freq, int rope_dims, bool interleaved,
                         float scale) {
  std::vector<double> y(x, x + head_dim * heads * t);
  const int half = rope_dims / 2;
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t base = (i * heads + h) * head_dim;
      for (int j = 0; j < half; ++j) {
        const float theta = static_cast<float>(positions[i]) * inv_freq[j];
        const double c = std::cos(static_cast<double>(theta)) * scale;
        const double s = std::sin(static_cast<double>(theta)) * scale;
        const std::int64_t a = interleaved ? 2 * j : j;
        const std::int64_t b = interleaved ? a + 1 : a + half;
        const double x0 = x[base + a], x1 = x[base + b];
        y[static_cast<std::size_t>(base + a)] = x0 * c - x1 * s;
        y[static_cast<std::size_t>(base + b)] = x0 * s + x1 * c;
      }
    }
  }
  return y;
}

std::vector<double> attention(const float* q, std::int64_t head_dim, std::int64_t heads, std::int64_t t, const float* k,
                              const float* v, std::int64_t kv_heads, std::int64_t s, std::int32_t position,
                              std::int32_t window, float scale, const float* sinks) {
  (void)s;
  std::vector<double> o(static_cast<std::size_t>(head_dim * heads * t));
  const std::int64_t group = heads / kv_heads;
  for (std::int64_t i = 0; i < t; ++i) {
    const std::int64_t p = position + i;
    const std::int64_t lo = window > 0 ? std::max<std::int64_t>(0, p - window + 1) : 0;
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t kvh = h / group;
      const float* qr = q + (i * heads + h) * head_dim;
      std::vector<double> sc;
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = lo; j <= p; ++j) {
        const float* kr = k + (j * kv_heads + kvh) * head_dim;
        double d = 0.0;
        for (std::int64_t e = 0; e < head_dim; ++e) d += static_cast<double>(qr[e]) * kr[e];
        sc.push_back(d * scale);
        mx = std::max(mx, sc.back());
      }
      if (sinks != nullptr) mx = std::max<double>(mx, sinks[h]);
      double sum = sinks != nullptr ? std::exp(sinks[h] - mx) : 0.0;
      for (auto& e : sc) sum += (e = std::exp(e - mx));
      double* orow = o.data() + (i * heads + h) * head_dim;
      for (std::int64_t j = lo; j <= p; ++j) {
        const float* vr = v + (j * kv_heads + kvh) * head_dim;
        const double pj = sc[static_cast<std::size_t>(j - lo)] / sum;
        for (std::int64_t e = 0; e < head_dim; ++e) orow[e] += pj * vr[e];
      }
    }
  }
  return o;
}

namespace {

// One token's routing scores: softmax over the experts, sigmoids or the raw logits.
std::vector<double> routing_scores(const float* x, std::int64_t experts, int flags) {
  std::vector<double> score(static_cast<std::size_t>(experts));
  if (flags & kRoutingSoftmax) {
    const double mx = *std::max_element(x, x + experts);
    double sum = 0.0;
    for (std::int64_t j = 0; j < experts; ++j) sum += (score[static_cast<std::size_t>(j)] = std::exp(x[j] - mx));
    for (auto& s : score) s /= sum;
  } else if (flags & kRoutingSigmoid) {
    for (std::int64_t j = 0; j < experts; ++j) score[static_cast<std::size_t>(j)] = sigmoid(x[j]);
  } else {
    for (std::int64_t j = 0; j < experts; ++j) score[static_cast<std::size_t>(j)] = x[j];
  }
  return score;
}

}  // namespace

namespace {

// Both routers: experts picked by score (+ bias[e], which only picks), weights the scores, over (their sum + eps)
// with kRoutingRenormalize, times scale. groups > 0 (topk_routing_grouped): only the experts of the groups_used
// groups with the highest group scores (their two highest score + bias, or the highest with kRoutingGroupMax; ties
// to the lower group) compete.
Routing route(const float* logits, const float* bias, std::int64_t experts, std::int64_t t, int k, int flags,
              double scale, double eps, int groups = 0, int groups_used = 0) {
  Routing r;
  for (std::int64_t i = 0; i < t; ++i) {
    const std::vector<double> score = routing_scores(logits + i * experts, experts, flags);
    std::vector<double> choice(score.size());
    for (std::size_t j = 0; j < score.size(); ++j) choice[j] = score[j] + (bias != nullptr ? bias[j] : 0.0f);
    if (groups > 0) {
      const auto per = static_cast<std::size_t>(experts / groups);
      std::vector<double> group_score(static_cast<std::size_t>(groups));
      for (std::size_t g = 0; g < group_score.size(); ++g) {
        std::vector<double> c(choice.begin() + static_cast<std::ptrdiff_t>(g * per),
                              choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * per));
        std::sort(c.begin(), c.end(), std::greater<>());
        group_score[g] = (flags & kRoutingGroupMax) ? c[0] : c[0] + c[1];
      }
      std::vector<std::int32_t> group_order(group_score.size());
      std::iota(group_order.begin(), group_order.end(), 0);
      std::stable_sort(group_order.begin(), group_order.end(), [&](std::int32_t a, std::int32_t b) {
        return group_score[static_cast<std::size_t>(a)] > group_score[static_cast<std::size_t>(b)];
      });
      for (std::size_t rank = static_cast<std::size_t>(groups_used); rank < group_order.size(); ++rank) {
        const auto g = static_cast<std::size_t>(group_order[rank]);
        std::fill(choice.begin() + static_cast<std::ptrdiff_t>(g * per),
                  choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * per),
                  -std::numeric_limits<double>::infinity());
      }
    }
    std::vector<std::int32_t> order(static_cast<std::size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      return choice[static_cast<std::size_t>(a)] > choice[static_cast<std::size_t>(b)];
    });
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += score[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
    for (int j = 0; j < k; ++j) {
      const std::int32_t id = order[static_cast<std::size_t>(j)];
      r.ids.push_back(id);
      const double s = score[static_cast<std::size_t>(id)];
      r.weights.push_back(((flags & kRoutingRenormalize) ? s / (sum + eps) : s) * scale);
    }
  }
  return r;
}

}  // namespace

Routing topk_routing(const float* logits, std::int64_t experts, std::int64_t t, int k, int flags) {
  return route(logits, nullptr, experts, t, k, flags, 1.0, 0.0);
}

Routing topk_routing_biased(const float* logits, const float* bias, std::int64_t experts, std::int64_t t, int k,
                            int flags, float scale) {
  return route(logits, bias, experts, t, k, flags, scale, 1e-20);
}

Routing topk_routing_grouped(const float* logits, const float* bias, std::int64_t experts, std::int64_t t, int k,
                             int flags, float scale, int groups, int groups_used) {
  return route(logits, bias, experts, t, k, flags, scale, 1e-20, groups, groups_used);
}

std::vector<double> causal_conv(const std::vector<float>& x, const std::vector<float>& w, std::vector<double>& state,
                                std::int64_t ch, std::int64_t k, std::int64_t t) {
  std::vector<double> y(static_cast<std::size_t>(ch * t));
  for (std::int64_t c = 0; c < ch; ++c) {
    std::vector<double> in;
    for (std::int64_t j = 0; j + 1 < k; ++j) in.push_back(state[static_cast<std::size_t>(c + j * ch)]);
    for (std::int64_t i = 0; i < t; ++i) in.push_back(x[static_cast<std::size_t>(c + i * ch)]);
    for (std::int64_t i = 0; i < t; ++i) {
      double acc = 0;
      for (std::int64_t j = 0; j < k; ++j)
        acc += w[static_cast<std::size_t>(c * k + j)] * in[static_cast<std::size_t>(i + j)];
      y[static_cast<std::size_t>(c + i * ch)] = silu(acc);
    }
    for (std::int64_t j = 0; j + 1 < k; ++j)
      state[static_cast<std::size_t>(c + j * ch)] = in[static_cast<std::size_t>(t + j)];
  }
  return y;
}

std::vector<double> gated_delta_rule(const DeltaShape& d, const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, const std::vector<float>& a,
                                     const std::vector<float>& b, const std::vector<float>& A,
                                     const std::vector<float>& dt, std::vector<double>& state, bool tiled) {
  std::vector<double> o(static_cast<std::size_t>(d.dv * d.hv * d.t));
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  for (std::int64_t t = 0; t < d.t; ++t) {
    for (std::int64_t h = 0; h < d.hv; ++h) {
      const std::int64_t kh = tiled ? h % d.hk : h / (d.hv / d.hk);
      const float* qt = q.data() + (t * d.hk + kh) * d.dk;
      const float* kt = k.data() + (t * d.hk + kh) * d.dk;
      double qq = 0, kk = 0;
      for (std::int64_t i = 0; i < d.dk; ++i) {
        qq += double(qt[i]) * qt[i];
        kk += double(kt[i]) * kt[i];
      }
      std::vector<double> qn(at(d.dk)), kn(at(d.dk));
      for (std::int64_t i = 0; i < d.dk; ++i) {
        qn[at(i)] = qt[i] / std::sqrt(qq + 1e-6) / std::sqrt(double(d.dk));
        kn[at(i)] = kt[i] / std::sqrt(kk + 1e-6);
      }
      const double x = double(a[at(t * d.hv + h)]) + dt[at(h)];
      const double decay = std::exp(A[at(h)] * std::log1p(std::exp(x)));
      const double beta = sigmoid(b[at(t * d.hv + h)]);
      double* S = state.data() + h * d.dk * d.dv;
      for (std::int64_t i = 0; i < d.dk * d.dv; ++i) S[i] *= decay;
      for (std::int64_t j = 0; j < d.dv; ++j) {
        double mem = 0;
        for (std::int64_t i = 0; i < d.dk; ++i) mem += S[i * d.dv + j] * kn[at(i)];
        const double u = (v[at((t * d.hv + h) * d.dv + j)] - mem) * beta;
        for (std::int64_t i = 0; i < d.dk; ++i) S[i * d.dv + j] += kn[at(i)] * u;
      }
      for (std::int64_t j = 0; j < d.dv; ++j) {
        double out = 0;
        for (std::int64_t i = 0; i < d.dk; ++i) out += S[i * d.dv + j] * qn[at(i)];
        o[at((t * d.hv + h) * d.dv + j)] = out;
      }
    }
  }
  return o;
}

}  // namespace colibri::sdk::testing::ref
