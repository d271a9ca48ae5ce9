#include "colibri/sdk/compute_checks.hpp"

#include <cmath>

namespace colibri::sdk {

namespace {

// DeepSeek's multi-head latent attention runs attention at kv_lora_rank + rope dims = 512 + 64.
constexpr std::int64_t kMaxHeadDim = 576;
constexpr std::int64_t kMaxInt = 0x7FFFFFFF;

// Shapes of one call; each method returns the first problem it finds.
class Checker {
 public:
  Checker(const OpCall& call, std::string_view backend) : c_(call), backend_(backend), name_(op_name(call.op)) {}

  Status run() const {
    switch (c_.op) {
      case Op::matmul: return matmul();
      case Op::expert_ffn: return expert_ffn();
      case Op::rms_norm: return rms_norm();
      case Op::rope: return rope();
      case Op::attention: return attention();
      case Op::swiglu:
      case Op::add: return binary();
      case Op::sigmoid: return sigmoid();
      case Op::scale_add: return scale_add();
      case Op::topk_routing: return topk();
      case Op::embedding: return embedding();
      case Op::store_rows: return store_rows();
      case Op::expert_ffn_group: return expert_group(4);
      case Op::attention_sinks: return attention();
      case Op::expert_ffn_clamped: return expert_ffn_clamped();
      case Op::expert_ffn_clamped_group: return expert_group(7);
      case Op::expert_ffn_routed: return expert_routed();
      case Op::topk_routing_biased:
      case Op::topk_routing_grouped: return topk();
      case Op::concat_rows: return concat_rows();
      case Op::matmul_heads: return matmul_heads();
      case Op::mul: return binary();
      case Op::causal_conv: return causal_conv();
      case Op::gated_delta_rule: return gated_delta_rule();
      default:
        return Status(StatusCode::unsupported, "op " + std::to_string(static_cast<int>(c_.op)) +
                                                   " is not in the op set this " + std::string(backend_) +
                                                   " backend was built with (a newer SDK's op?)");
    }
  }

 private:
  [[nodiscard]] Status bad(const std::string& m) const {
    return Status(StatusCode::invalid_argument, std::string(name_) + ": " + m);
  }
  [[nodiscard]] bool counts(std::size_t n_in, std::size_t n_out) const {
    return c_.inputs.size() == n_in && c_.outputs.size() == n_out;
  }
  [[nodiscard]] Status count_error(std::size_t n_in, std::size_t n_out) const {
    return Status(StatusCode::invalid_argument, std::string(name_) + " takes " + std::to_string(n_in) + " inputs and " +
                                                    std::to_string(n_out) + " outputs; got " +
                                                    std::to_string(c_.inputs.size()) + " and " +
                                                    std::to_string(c_.outputs.size()));
  }
  [[nodiscard]] Status need(const Tensor& t, DType type, const char* what) const {
    if (t.type != type)
      return bad(std::string(what) + " must be " + std::string(to_string(type)) + ", got " + shape_text(t));
    if (element_count(t) > kMaxInt) return bad(std::string(what) + " has more than 2^31 elements; split the call");
    return {};
  }
  [[nodiscard]] Status unsupported_weight(const Tensor& w, const char* role) const {
    return Status(StatusCode::unsupported, std::string(name_) + ": " + role + " type " +
                                               std::string(to_string(w.type)) + " is not supported by " +
                                               std::string(backend_));
  }
  [[nodiscard]] Status same_as(const Tensor& y, const char* y_name, const Tensor& x, const char* x_name) const {
    if (element_count(y) != element_count(x) || y.ne[0] != x.ne[0])
      return bad(std::string(y_name) + " " + shape_text(y) + " must match " + x_name + " " + shape_text(x));
    return {};
  }

  Status matmul() const {
    if (!counts(2, 1) && !counts(3, 1)) return count_error(2, 1);
    const Tensor &w = c_.inputs[0], &x = c_.inputs[1], &y = c_.outputs[0];
    if (!is_weight_type(w.type) && !is_optional_weight_type(w.type)) return unsupported_weight(w, "weight");
    if (Status s = need(x, DType::f32, "X"); !s) return s;
    if (Status s = need(y, DType::f32, "Y"); !s) return s;
    const std::int64_t k = w.ne[0], n = row_count(w), t = row_count(x);
    if (x.ne[0] != k) return bad("X " + shape_text(x) + " does not match W " + shape_text(w) + " (ne[0] differs)");
    if (y.ne[0] != n || row_count(y) != t) {
      return bad("Y " + shape_text(y) + " must be {" + std::to_string(n) + ", " + std::to_string(t) + "}");
    }
    if (c_.inputs.size() == 3) {
      if (Status s = need(c_.inputs[2], DType::f32, "bias"); !s) return s;
      if (element_count(c_.inputs[2]) != n) return bad("bias must have N = " + std::to_string(n) + " elements");
    }
    return {};
  }

  // A {a, R}, B {b, R} -> Y {a + b, R}: R rows counted over ne[1..3], which may be laid out differently.
  Status concat_rows() const {
    if (!counts(2, 1)) return count_error(2, 1);
    const Tensor &a = c_.inputs[0], &b = c_.inputs[1], &y = c_.outputs[0];
    if (Status s = need(a, DType::f32, "A"); !s) return s;
    if (Status s = need(b, DType::f32, "B"); !s) return s;
    if (Status s = need(y, DType::f32, "Y"); !s) return s;
    const std::int64_t r = row_count(a);
    if (row_count(b) != r) {
      return bad("B " + shape_text(b) + " has " + std::to_string(row_count(b)) + " rows but A " + shape_text(a) +
                 " has " + std::to_string(r));
    }
    if (y.ne[0] != a.ne[0] + b.ne[0] || row_count(y) != r) {
      return bad("Y " + shape_text(y) + " must have ne[0] = " + std::to_string(a.ne[0] + b.ne[0]) +
                 " (A's + B's) and " + std::to_string(r) + " rows");
    }
    return {};
  }

  // X {C, T}, W {K, C} -> Y {C, T}, state {C, K - 1} (all f32).
  Status causal_conv() const {
    if (!counts(2, 2)) return count_error(2, 2);
    const Tensor &x = c_.inputs[0], &w = c_.inputs[1], &y = c_.outputs[0], &st = c_.outputs[1];
    for (const auto& [t, what] : {std::pair{&x, "X"}, {&w, "W"}, {&y, "Y"}, {&st, "state"}}) {
      if (Status s = need(*t, DType::f32, what); !s) return s;
    }
    const std::int64_t ch = x.ne[0], k = w.ne[0];
    if (x.ne[2] != 1 || x.ne[3] != 1) return bad("X " + shape_text(x) + " must be {C, T, 1, 1}");
    if (k < 2 || row_count(w) != ch || w.ne[2] != 1 || w.ne[3] != 1) {
      return bad("W " + shape_text(w) + " must be {K >= 2, " + std::to_string(ch) + ", 1, 1}");
    }
    if (y.ne[0] != ch || row_count(y) != x.ne[1]) return bad("Y " + shape_text(y) + " must match X " + shape_text(x));
    if (st.ne[0] != ch || row_count(st) != k - 1) {
      return bad("state " + shape_text(st) + " must be {" + std::to_string(ch) + ", " + std::to_string(k - 1) + "}");
    }
    return {};
  }

  // Q {dk, Hk, T}, K {dk, Hk, T}, V {dv, Hv, T}, a {Hv, T}, b {Hv, T}, A {Hv}, dt_bias {Hv} -> O {dv, Hv, T},
  // state {dv, dk, Hv} (all f32).
  Status gated_delta_rule() const {
    if (!counts(7, 2)) return count_error(7, 2);
    static constexpr const char* kIn[] = {"Q", "K", "V", "a", "b", "A", "dt_bias"};
    for (std::size_t i = 0; i < 7; ++i) {
      if (Status s = need(c_.inputs[i], DType::f32, kIn[i]); !s) return s;
    }
    if (Status s = need(c_.outputs[0], DType::f32, "O"); !s) return s;
    if (Status s = need(c_.outputs[1], DType::f32, "state"); !s) return s;
    const Tensor &q = c_.inputs[0], &k = c_.inputs[1], &v = c_.inputs[2], &o = c_.outputs[0], &st = c_.outputs[1];
    const std::int64_t dk = q.ne[0], hk = q.ne[1], t = q.ne[2], dv = v.ne[0], hv = v.ne[1];
    if (q.ne[3] != 1 || k.ne != q.ne) return bad("K " + shape_text(k) + " must match Q " + shape_text(q));
    if (v.ne[2] != t || v.ne[3] != 1 || hv % hk != 0) {
      return bad("V " + shape_text(v) + " must be {dv, Hv, " + std::to_string(t) + ", 1} with Hv a multiple of Q's " +
                 std::to_string(hk) + " heads");
    }
    for (std::size_t i = 3; i < 5; ++i) {
      const Tensor& g = c_.inputs[i];
      if (g.ne[0] != hv || row_count(g) != t) {
        return bad(std::string(kIn[i]) + " " + shape_text(g) + " must be {" + std::to_string(hv) + ", " +
                   std::to_string(t) + "}");
      }
    }
    for (std::size_t i = 5; i < 7; ++i) {
      if (element_count(c_.inputs[i]) != hv) {
        return bad(std::string(kIn[i]) + " " + shape_text(c_.inputs[i]) + " must have " + std::to_string(hv) +
                   " elements");
      }
    }
    if (o.ne != v.ne) return bad("O " + shape_text(o) + " must match V " + shape_text(v));
    if (st.ne[0] != dv || st.ne[1] != dk || st.ne[2] != hv || st.ne[3] != 1) {
      return bad("state " + shape_text(st) + " must be {" + std::to_string(dv) + ", " + std::to_string(dk) + ", " +
                 std::to_string(hv) + ", 1}");
    }
    return {};
  }

  // W {K, N, H} (a matmul weight), X {Kx, H, T} f32 with Kx >= K -> Y {N, H, T} f32.
  Status matmul_heads() const {
    if (!counts(2, 1)) return count_error(2, 1);
    const Tensor &w = c_.inputs[0], &x = c_.inputs[1], &y = c_.outputs[0];
    if (!is_weight_type(w.type) && !is_optional_weight_type(w.type)) return unsupported_weight(w, "weight");
    if (Status s = need(x, DType::f32, "X"); !s) return s;
    if (Status s = need(y, DType::f32, "Y"); !s) return s;
    const std::int64_t k = w.ne[0], n = w.ne[1], h = w.ne[2], t = x.ne[2];
    if (w.ne[3] != 1) return bad("W " + shape_text(w) + " must be {K, N, H, 1}");
    if (x.ne[1] != h || x.ne[3] != 1 || x.ne[0] < k) {
      return bad("X " + shape_text(x) + " must be {Kx >= " + std::to_string(k) + ", " + std::to_string(h) +
                 ", T, 1} for W " + shape_text(w));
    }
    if (y.ne[0] != n || y.ne[1] != h || y.ne[2] != t || y.ne[3] != 1) {
      return bad("Y " + shape_text(y) + " must be {" + std::to_string(n) + ", " + std::to_string(h) + ", " +
                 std::to_string(t) + ", 1}");
    }
    return {};
  }

  Status expert_ffn() const {
    if (!counts(4, 1)) return count_error(4, 1);
    return expert(0, 4, "");
  }

  // expert_ffn's four inputs, then b_gate {F}, b_up {F}, b_down {D} (f32); alpha = params.scale, limit = params.eps.
  Status expert_ffn_clamped() const {
    if (!counts(7, 1)) return count_error(7, 1);
    if (Status s = expert(0, 7, ""); !s) return s;
    return clamp_params();
  }

  // expert_ffn_group (4 inputs per expert) and expert_ffn_clamped_group (7: expert_ffn_clamped's).
  Status expert_group(std::size_t stride) const {
    const std::size_t n = c_.inputs.size();
    if (n == 0 || n % stride != 0 || c_.outputs.size() != n / stride) {
      return bad("takes " + std::to_string(stride) +
                 (stride == 4 ? " inputs (W_gate, W_up, W_down, X)"
                              : " inputs (W_gate, W_up, W_down, X, b_gate, "
                                "b_up, b_down)") +
                 " and 1 output per expert; got " + std::to_string(n) + " inputs and " +
                 std::to_string(c_.outputs.size()) + " outputs");
    }
    for (std::size_t e = 0; e < n / stride; ++e) {
      if (Status s = expert(e, stride, "expert " + std::to_string(e) + ": "); !s) return s;
    }
    return stride == 7 ? clamp_params() : Status{};
  }

  // X {D, T}, ids {k, T} i32, weights {k, T} f32, then W_gate, W_up, W_down of each of E experts; Y {D, T}.
  Status expert_routed() const {
    const std::size_t n = c_.inputs.size();
    if (n < 6 || (n - 3) % 3 != 0 || c_.outputs.size() != 1) {
      return bad("takes X, ids, weights and 3 weights (W_gate, W_up, W_down) per expert, and 1 output; got " +
                 std::to_string(n) + " inputs and " + std::to_string(c_.outputs.size()) + " outputs");
    }
    const Tensor &x = c_.inputs[0], &ids = c_.inputs[1], &w = c_.inputs[2], &y = c_.outputs[0];
    if (Status s = need(x, DType::f32, "X"); !s) return s;
    if (Status s = need(ids, DType::i32, "ids"); !s) return s;
    if (Status s = need(w, DType::f32, "weights"); !s) return s;
    if (Status s = need(y, DType::f32, "Y"); !s) return s;
    const auto experts = static_cast<std::int64_t>((n - 3) / 3);
    const std::int64_t d = x.ne[0], t = row_count(x), k = ids.ne[0];
    if (row_count(ids) != t || k < 1 || k > experts) {
      return bad("ids " + shape_text(ids) + " must be {k, " + std::to_string(t) + "} with k in 1.." +
                 std::to_string(experts) + " (the experts given)");
    }
    if (w.ne[0] != k || row_count(w) != t)
      return bad("weights " + shape_text(w) + " must match ids " + shape_text(ids));
    if (y.ne[0] != d || row_count(y) != t) return bad("Y " + shape_text(y) + " must match X " + shape_text(x));
    for (std::int64_t e = 0; e < experts; ++e) {
      const std::string who = "expert " + std::to_string(e) + ": ";
      const auto i = static_cast<std::size_t>(3 + 3 * e);
      const Tensor &wg = c_.inputs[i], &wu = c_.inputs[i + 1], &wd = c_.inputs[i + 2];
      for (const Tensor* m : {&wg, &wu, &wd}) {
        if (!is_weight_type(m->type) && !is_optional_weight_type(m->type)) {
          return unsupported_weight(*m, (who + "weight").c_str());
        }
      }
      const std::int64_t f = row_count(wg);
      if (wg.ne[0] != d) return bad(who + "W_gate " + shape_text(wg) + " must have ne[0] = D = " + std::to_string(d));
      if (wu.ne[0] != d || row_count(wu) != f)
        return bad(who + "W_up " + shape_text(wu) + " must match W_gate " + shape_text(wg));
      if (wd.ne[0] != f || row_count(wd) != d) {
        return bad(who + "W_down " + shape_text(wd) + " must be {" + std::to_string(f) + ", " + std::to_string(d) +
                   "}");
      }
      if (f * t > kMaxInt) return bad(who + "F x T exceeds 2^31; split the call");
    }
    return {};
  }

  // The clamped experts' alpha = params.scale and limit = params.eps.
  Status clamp_params() const {
    const OpParams& p = c_.params;
    if (!(p.eps > 0.0f) || !std::isfinite(p.eps)) {
      return bad("params.eps (the clamp limit) must be positive and finite, got " + std::to_string(p.eps));
    }
    if (!std::isfinite(p.scale)) return bad("params.scale (alpha) must be finite, got " + std::to_string(p.scale));
    return {};
  }

  // Expert e of an expert op whose experts take `stride` inputs each (4, or 7 with the biases): inputs
  // stride * e.., output e.
  Status expert(std::size_t e, std::size_t stride, const std::string& who) const {
    const std::size_t i = stride * e;
    const Tensor &wg = c_.inputs[i], &wu = c_.inputs[i + 1], &wd = c_.inputs[i + 2], &x = c_.inputs[i + 3],
                 &y = c_.outputs[e];
    for (const Tensor* w : {&wg, &wu, &wd}) {
      if (!is_weight_type(w->type) && !is_optional_weight_type(w->type)) {
        return unsupported_weight(*w, (who + "weight").c_str());
      }
    }
    if (Status s = need(x, DType::f32, (who + "X").c_str()); !s) return s;
    if (Status s = need(y, DType::f32, (who + "Y").c_str()); !s) return s;
    const std::int64_t d = wg.ne[0], f = row_count(wg), t = row_count(x);
    if (wu.ne[0] != d || row_count(wu) != f)
      return bad(who + "W_up " + shape_text(wu) + " must match W_gate " + shape_text(wg));
    if (wd.ne[0] != f || row_count(wd) != d) {
      return bad(who + "W_down " + shape_text(wd) + " must be {" + std::to_string(f) + ", " + std::to_string(d) + "}");
    }
    if (x.ne[0] != d) return bad(who + "X " + shape_text(x) + " must have ne[0] = " + std::to_string(d));
    if (y.ne[0] != d || row_count(y) != t) return bad(who + "Y " + shape_text(y) + " must match X");
    if (f * t > kMaxInt) return bad(who + "F x T exceeds 2^31; split the call");
    if (stride == 7) {
      const struct {
        const char* what;
        std::int64_t n;
      } biases[] = {{"b_gate", f}, {"b_up", f}, {"b_down", d}};
      for (std::size_t b = 0; b < 3; ++b) {
        const Tensor& bt = c_.inputs[i + 4 + b];
        if (Status s = need(bt, DType::f32, (who + biases[b].what).c_str()); !s) return s;
        if (element_count(bt) != biases[b].n || bt.ne[0] != biases[b].n) {
          return bad(who + biases[b].what + " " + shape_text(bt) + " must have " + (b < 2 ? "F" : "D") + " = " +
                     std::to_string(biases[b].n) + " elements");
        }
      }
    }
    return {};
  }

  Status rms_norm() const {
    if (!counts(2, 1)) return count_error(2, 1);
    const Tensor &x = c_.inputs[0], &w = c_.inputs[1], &y = c_.outputs[0];
    if (Status s = need(x, DType::f32, "X"); !s) return s;
    if (Status s = need(w, DType::f32, "w"); !s) return s;
    if (Status s = need(y, DType::f32, "Y"); !s) return s;
    if (element_count(w) != x.ne[0]) return bad("w must have D = " + std::to_string(x.ne[0]) + " elements");
    if (y.ne[0] != x.ne[0] || row_count(y) != row_count(x))
      return bad("Y " + shape_text(y) + " must match X " + shape_text(x));
    if (!(c_.params.eps >= 0.0f)) return bad("params.eps must be >= 0, got " + std::to_string(c_.params.eps));
    return {};
  }

  Status rope() const {
    if (!counts(3, 1)) return count_error(3, 1);
    const Tensor &x = c_.inputs[0], &pos = c_.inputs[1], &freq = c_.inputs[2], &y = c_.outputs[0];
    if (Status s = need(x, DType::f32, "X"); !s) return s;
    if (Status s = need(pos, DType::i32, "positions"); !s) return s;
    if (Status s = need(freq, DType::f32, "inv_freq"); !s) return s;
    if (Status s = need(y, DType::f32, "Y"); !s) return s;
    const std::int64_t hd = x.ne[0], t = x.ne[2] * x.ne[3];
    const std::int32_t rd = c_.params.rope_dims;
    if (hd % 2 != 0) return bad("head_dim " + std::to_string(hd) + " must be even");
    if (rd <= 0 || rd % 2 != 0 || rd > hd) {
      return bad("params.rope_dims " + std::to_string(rd) + " must be even and in 2.." + std::to_string(hd));
    }
    if (element_count(pos) != t) return bad("positions must have T = " + std::to_string(t) + " entries");
    if (element_count(freq) != rd / 2)
      return bad("inv_freq must have rope_dims / 2 = " + std::to_string(rd / 2) + " entries");
    return same_as(y, "Y", x, "X");
  }

  // attention (Q, K, V) and attention_sinks (Q, K, V, sinks {n_heads} f32).
  Status attention() const {
    const bool sinks = c_.op == Op::attention_sinks;
    if (!counts(sinks ? 4 : 3, 1)) return count_error(sinks ? 4 : 3, 1);
    const Tensor &q = c_.inputs[0], &k = c_.inputs[1], &v = c_.inputs[2], &o = c_.outputs[0];
    if (Status s = need(q, DType::f32, "Q"); !s) return s;
    if (Status s = need(o, DType::f32, "O"); !s) return s;
    if (!is_kv_type(k.type) || k.type != v.type) {
      return Status(StatusCode::unsupported, std::string(name_) + ": KV cache types " + std::string(to_string(k.type)) +
                                                 " / " + std::string(to_string(v.type)) + " are not supported by " +
                                                 std::string(backend_) + " (f32, f16 or q8_0, both the same)");
    }
    const std::int64_t hd = q.ne[0], nh = q.ne[1], t = q.ne[2] * q.ne[3];
    const std::int64_t nkv = k.ne[1], s = k.ne[2] * k.ne[3];
    if (hd > kMaxHeadDim) return bad("head_dim " + std::to_string(hd) + " exceeds " + std::to_string(kMaxHeadDim));
    if (k.ne[0] != hd || v.ne[0] != hd || v.ne[1] != nkv || v.ne[2] * v.ne[3] != s) {
      return bad("K " + shape_text(k) + " and V " + shape_text(v) + " must be {" + std::to_string(hd) +
                 ", n_kv_heads, S} like Q " + shape_text(q));
    }
    if (nkv <= 0 || nh % nkv != 0) {
      return bad(std::to_string(nh) + " query heads are not a multiple of " + std::to_string(nkv) + " KV heads");
    }
    if (sinks) {
      const Tensor& sk = c_.inputs[3];
      if (Status s = need(sk, DType::f32, "sinks"); !s) return s;
      if (sk.ne[0] != nh || element_count(sk) != nh)
        return bad("sinks " + shape_text(sk) + " must have n_heads = " + std::to_string(nh) + " elements");
    }
    const OpParams& p = c_.params;
    if (p.position < 0 || p.window < 0) return bad("params.position and params.window must be >= 0");
    if (p.position + t > s) {
      return bad("queries at positions " + std::to_string(p.position) + ".." + std::to_string(p.position + t - 1) +
                 " need " + std::to_string(p.position + t) + " cached keys; the cache holds " + std::to_string(s));
    }
    return same_as(o, "O", q, "Q");
  }

  // swiglu (gate, up) and add (A, B).
  Status binary() const {
    if (!counts(2, 1)) return count_error(2, 1);
    const Tensor &a = c_.inputs[0], &b = c_.inputs[1], &y = c_.outputs[0];
    const bool add = c_.op == Op::add || c_.op == Op::mul;
    if (Status s = need(a, DType::f32, add ? "A" : "gate"); !s) return s;
    if (Status s = need(b, DType::f32, add ? "B" : "up"); !s) return s;
    if (Status s = need(y, DType::f32, "out"); !s) return s;
    if (element_count(b) != element_count(a) || b.ne[0] != a.ne[0] || element_count(y) != element_count(a) ||
        y.ne[0] != a.ne[0]) {
      return bad("shapes differ: " + shape_text(a) + ", " + shape_text(b) + " -> " + shape_text(y));
    }
    return {};
  }

  Status sigmoid() const {
    if (!counts(1, 1)) return count_error(1, 1);
    const Tensor &x = c_.inputs[0], &y = c_.outputs[0];
    if (Status s = need(x, DType::f32, "X"); !s) return s;
    if (Status s = need(y, DType::f32, "Y"); !s) return s;
    return same_as(y, "Y", x, "X");
  }

  Status scale_add() const {
    if (!counts(2, 1)) return count_error(2, 1);
    const Tensor &x = c_.inputs[0], &w = c_.inputs[1], &y = c_.outputs[0];
    if (Status s = need(x, DType::f32, "X"); !s) return s;
    if (Status s = need(w, DType::f32, "w"); !s) return s;
    if (Status s = need(y, DType::f32, "Y"); !s) return s;
    if (element_count(w) != row_count(x)) return bad("w must have T = " + std::to_string(row_count(x)) + " entries");
    return same_as(y, "Y", x, "X");
  }

  // topk_routing (logits), topk_routing_biased and topk_routing_grouped (logits, bias {E} f32; the grouped one also
  // params.groups and params.groups_used).
  Status topk() const {
    const bool grouped = c_.op == Op::topk_routing_grouped;
    const bool biased = grouped || c_.op == Op::topk_routing_biased;
    if (!counts(biased ? 2 : 1, 2)) return count_error(biased ? 2 : 1, 2);
    const Tensor &l = c_.inputs[0], &ids = c_.outputs[0], &wts = c_.outputs[1];
    if (Status s = need(l, DType::f32, "logits"); !s) return s;
    if (Status s = need(ids, DType::i32, "ids"); !s) return s;
    if (Status s = need(wts, DType::f32, "weights"); !s) return s;
    const std::int64_t e = l.ne[0], t = row_count(l), k = c_.params.top_k;
    if (biased) {
      const Tensor& b = c_.inputs[1];
      if (Status s = need(b, DType::f32, "bias"); !s) return s;
      if (b.ne[0] != e || element_count(b) != e)
        return bad("bias " + shape_text(b) + " must have E = " + std::to_string(e) + " elements, one per expert");
    }
    if (grouped) {
      const std::int64_t g = c_.params.groups, used = c_.params.groups_used;
      if (g < 2) return bad("params.groups " + std::to_string(g) + " must be at least 2");
      if (e % g != 0) {
        return bad("params.groups " + std::to_string(g) + " must divide E = " + std::to_string(e) + " (the experts)");
      }
      if (e / g < 2 && !(c_.params.flags & kRoutingGroupMax)) {
        return bad("params.groups " + std::to_string(g) + " leaves one expert per group of E = " + std::to_string(e) +
                   ": a group's score (its two highest) needs two, or flag kRoutingGroupMax");
      }
      if (used < 1 || used > g) {
        return bad("params.groups_used " + std::to_string(used) + " must be in 1.." + std::to_string(g));
      }
      if (k < 1 || k > used * (e / g)) {
        return bad("params.top_k " + std::to_string(k) + " must be in 1.." + std::to_string(used * (e / g)) +
                   " (params.groups_used " + std::to_string(used) + " groups of " + std::to_string(e / g) +
                   " experts)");
      }
    }
    if (k < 1 || k > e) return bad("params.top_k " + std::to_string(k) + " must be in 1.." + std::to_string(e));
    if (ids.ne[0] != k || row_count(ids) != t || wts.ne[0] != k || row_count(wts) != t) {
      return bad("ids and weights must be {" + std::to_string(k) + ", " + std::to_string(t) + "}");
    }
    const std::int32_t f = c_.params.flags;
    if ((f & kRoutingSoftmax) && (f & kRoutingSigmoid)) {
      return bad("flags kRoutingSoftmax and kRoutingSigmoid exclude each other");
    }
    if (biased && !std::isfinite(c_.params.scale)) {
      return bad("params.scale (the routed scaling factor) must be finite, got " + std::to_string(c_.params.scale));
    }
    return {};
  }

  Status embedding() const {
    if (!counts(2, 1)) return count_error(2, 1);
    const Tensor &table = c_.inputs[0], &ids = c_.inputs[1], &y = c_.outputs[0];
    if (!is_weight_type(table.type)) return unsupported_weight(table, "table");
    if (Status s = need(ids, DType::i32, "ids"); !s) return s;
    if (Status s = need(y, DType::f32, "out"); !s) return s;
    const std::int64_t d = table.ne[0], t = element_count(ids);
    if (row_count(table) > kMaxInt) return bad("the table has more than 2^31 rows");
    if (y.ne[0] != d || row_count(y) != t) {
      return bad("out " + shape_text(y) + " must be {" + std::to_string(d) + ", " + std::to_string(t) + "}");
    }
    return {};
  }

  Status store_rows() const {
    if (!counts(1, 1)) return count_error(1, 1);
    const Tensor &x = c_.inputs[0], &y = c_.outputs[0];
    if (Status s = need(x, DType::f32, "X"); !s) return s;
    if (!is_kv_type(y.type)) {
      return Status(StatusCode::unsupported, std::string(name_) + ": Y type " + std::string(to_string(y.type)) +
                                                 " is not a KV cache type (f32, f16, q8_0)");
    }
    if (element_count(y) > kMaxInt) return bad("Y has more than 2^31 elements; split the call");
    if (row_bytes(y.type, y.ne[0]) == 0) {
      return bad("Y " + shape_text(y) + ": ne[0] must be a multiple of the " + std::string(to_string(y.type)) +
                 " block");
    }
    return same_as(y, "Y", x, "X");
  }

  const OpCall& c_;
  std::string_view backend_;
  const char* name_;
};

}  // namespace

bool is_weight_type(DType type) noexcept {
  switch (type) {
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

bool is_optional_weight_type(DType type) noexcept {
  return type == DType::mxfp4;
}

bool is_kv_type(DType type) noexcept {
  return type == DType::f32 || type == DType::f16 || type == DType::q8_0;
}

bool supports_every_op(Op op, DType weight_type) noexcept {
  switch (op) {
    case Op::matmul:
    case Op::expert_ffn:
    case Op::embedding: return is_weight_type(weight_type);
    case Op::attention:
    case Op::store_rows: return is_kv_type(weight_type);
    case Op::rms_norm:
    case Op::rope:
    case Op::swiglu:
    case Op::add:
    case Op::topk_routing:
    case Op::scale_add:
    case Op::sigmoid: return weight_type == DType::f32;
    // Optional: a backend claims these itself once it runs them.
    case Op::expert_ffn_group:
    case Op::attention_sinks:
    case Op::expert_ffn_clamped:
    case Op::expert_ffn_clamped_group:
    case Op::expert_ffn_routed:
    case Op::topk_routing_biased:
    case Op::topk_routing_grouped:
    case Op::concat_rows:
    case Op::matmul_heads:
    case Op::mul:
    case Op::causal_conv:
    case Op::gated_delta_rule: return false;
    default: return false;
  }
}

std::string shape_text(const Tensor& t) {
  std::string s = std::string(to_string(t.type)) + " {";
  for (std::size_t i = 0; i < t.ne.size(); ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "}";
}

Status check_op_call(const OpCall& call, std::string_view backend) {
  return Checker(call, backend).run();
}

namespace {

Status tensor_error(std::string_view op, std::string_view what, const std::string& message) {
  return Status(StatusCode::invalid_argument, std::string(op) + ": " + std::string(what) + " " + message);
}

}  // namespace

Expected<std::size_t> checked_bytes(const Tensor& t, std::string_view op, std::string_view what) {
  const auto* traits = dtype_traits(t.type);
  if (traits == nullptr)
    return tensor_error(op, what, "has an unknown type id " + std::to_string(static_cast<int>(t.type)));
  for (const std::int64_t n : t.ne) {
    if (n <= 0) return tensor_error(op, what, "has a non-positive dimension: " + shape_text(t));
  }
  const std::size_t rb = row_bytes(t.type, t.ne[0]);
  if (rb == 0) {
    return tensor_error(op, what,
                        "rows of " + std::to_string(t.ne[0]) + " elements are not whole " + std::string(traits->name) +
                            " blocks of " + std::to_string(traits->block_elems));
  }
  return rb * static_cast<std::size_t>(row_count(t));
}

Status check_buffer_range(const Tensor& t, std::size_t bytes, std::string_view op, std::string_view what) {
  const std::size_t size = t.buffer->size();
  if (t.offset > size || bytes > size - t.offset) {
    return tensor_error(op, what,
                        shape_text(t) + " needs " + std::to_string(bytes) + " bytes at offset " +
                            std::to_string(t.offset) + " but its buffer holds " + std::to_string(size));
  }
  // Buffers start aligned; a kernel reading the type's fields at an offset that breaks it faults on a device.
  if (const std::size_t align = data_alignment(t.type); t.offset % align != 0) {
    return tensor_error(op, what,
                        shape_text(t) + " starts at offset " + std::to_string(t.offset) + ", not a multiple of " +
                            std::to_string(align) + " as " + std::string(to_string(t.type)) + " data needs");
  }
  return {};
}

}  // namespace colibri::sdk
