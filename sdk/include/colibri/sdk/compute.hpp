// compute kind: devices, buffers, asynchronous copies and the op set the runtime needs. Ops are
// dispatched through one OpCall so new ops extend the enum instead of the vtable. The CPU backend
// is the reference every other backend is tested against.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/plugin.hpp"

namespace colibri::sdk {

struct DeviceInfo {
  std::string name;
  bool host_memory = true;             // buffers are plain host memory (CPU backend, unified iGPU)
  std::uint64_t memory_total = 0;      // bytes of device memory (0 for the host)
  std::uint64_t memory_available = 0;  // free bytes right now
  std::string capabilities;            // "avx512 vnni", "sm_90", ...
};

// The op set. Shapes use GGML order: ne[0] is the contiguous (fastest) dimension, so a weight
// matrix W with N output rows of K inputs has ne = {K, N}, and activations for T tokens of width
// D have ne = {D, T}. Activations are f32 unless stated; weights may be any supported block type.
//
// THE ONE PROMISE applies to every backend: the result for a token must not depend on which other
// tokens share the call (batch composition), on T, or on thread count. Accumulation order per
// output element is fixed.
enum class Op : std::uint32_t {
  // in: W {K, N} (any type), X {K, T} f32 [, bias {N} f32]; out: Y {N, T} f32.
  // Y[t][n] = sum_k W[n][k] * X[t][k] (+ bias[n]). Quantized W may quantize X per token (as
  // GGML's vec_dot does, e.g. to q8_0 / q8_k); flags bit 0 (kExactActivations) forbids that.
  matmul,
  // in: W_gate {D, F}, W_up {D, F}, W_down {F, D} (any types), X {D, T}; out: Y {D, T}.
  // Y = down(silu(gate X) * up X); same numerics as matmul + swiglu + matmul.
  expert_ffn,
  // in: X {D, R} f32, w {D} f32; out: Y {D, R}. y = x / sqrt(mean(x^2) + eps) * w, per row of D.
  // (Per-head q/k norms pass X as {head_dim, n_heads * T}.)
  rms_norm,
  // in: X {head_dim, n_heads, T} f32, positions {T} i32, inv_freq {rope_dims / 2} f32;
  // out: Y same shape. Rotates the first rope_dims of each head by angle pos * inv_freq[i],
  // cos/sin multiplied by params.scale. The angle is float32(pos) * inv_freq[i] rounded to
  // float32, as HuggingFace computes it (at pos 4095 a double angle differs by ~2e-4). flags bit 1 (kRopeInterleaved)
  // rotates pairs (2i, 2i+1)
  // (GPT-J); otherwise pairs (i, i + rope_dims/2) (NeoX / HuggingFace rotate_half). The engine
  // computes inv_freq, including rope scaling, so every scaling type is the same op.
  rope,
  // in: Q {head_dim, n_heads, T} f32, Kc {head_dim, n_kv_heads, S}, Vc {head_dim, n_kv_heads, S}
  // (f32, f16 or q8_0 rows of head_dim); out: O {head_dim, n_heads, T}. Query t sits at position
  // params.position + t and attends keys 0..position+t (causal), and only the last
  // params.window keys when window > 0. Head h reads kv head h / (n_heads / n_kv_heads).
  // Scores scaled by params.scale. Computed in key blocks with an online softmax (no S x T matrix).
  // Needs position + T <= S (the engine writes the new keys first; S may be the filled prefix).
  // With a window, the engine may pass only the rows from a multiple of 64 on (key j is then position first + j, and
  // params.position is given less first): the result must be the bits of the whole cache, e.g. key blocks aligned
  // to key 0 modulo 64, or to each query's window. head_dim <= 576; Kc and Vc may be one tensor (DeepSeek's latent
  // attention passes its one cache as both).
  attention,
  // in: gate {F, T}, up {F, T}; out: silu(gate) * up.
  swiglu,
  // in: A, B same shape; out: A + B.
  add,
  // in: logits {E, T} f32; out: ids {k, T} i32, weights {k, T} f32, k = params.top_k.
  // flags: kRoutingSoftmax (softmax over all E first; else raw logits), kRoutingRenormalize
  // (weights of the chosen k divided by their sum), kRoutingSigmoid (sigmoid scores).
  // Ties go to the lower expert id. Ids are listed by descending weight. A NaN logit fails the call naming token and
  // expert, except where the backend returns without waiting for the device (outputs in its memory): every pick of
  // that token is then id -1 with weight NaN, which whoever reads the outputs must check (the engine does).
  topk_routing,
  // in: table {D, V} (any type), ids {T} i32; out: {D, T} f32, row ids[t] dequantized.
  embedding,
  // in: X {D, T}, w {T} f32; out (in place on outputs[0], {D, T}): Y[:, t] += w[t] * X[:, t].
  // The engine combines experts with this in a fixed order.
  scale_add,
  // in: X; out: 1 / (1 + exp(-x)) elementwise (Qwen2-MoE shared-expert gate).
  sigmoid,
  // in: X {D, R} f32; out: Y {D, R} of a KV cache type (f32, f16, q8_0; D a multiple of its block), usually a view
  // into a cache at the rows of new positions. Each row is encoded exactly as colibri::quant::quantize_row does
  // (ggml's reference: f16 rounds to nearest even; q8_0 takes d = amax / 127 per 32, stored as f16, and
  // round(x / d) half away from zero), so the bytes are the same on every backend. Optional: the engine writes new
  // KV rows with it where the cache lives in device memory and supports(store_rows, type) says so, and otherwise
  // encodes them on the host and uploads them.
  store_rows,
  // Optional. in: W_gate_e, W_up_e, W_down_e, X_e for each of E >= 1 experts (4E tensors, each four as
  // expert_ffn's inputs); out: Y_e {D, T_e} for each (E tensors). Every Y_e has the bits expert_ffn gives for its
  // four inputs: T_e and the weight types may differ between experts, and the X_e may be one tensor. No output may
  // overlap an input. One call lets a backend run a layer's experts together (one pass of its threads or one launch
  // per projection for all of them, activations quantized once); the engine uses it where supports() says so for
  // every weight type and otherwise calls expert_ffn per expert, as it also does after an `unsupported` answer.
  expert_ffn_group,
  // Optional (gpt-oss). As attention, with a 4th input sinks {n_heads} f32: each head's softmax also counts
  // exp(sinks[h]) in its denominator, as one more key whose value is zero (a learned "no-op" the head can attend to).
  attention_sinks,
  // Optional (gpt-oss experts). in: W_gate {D, F}, W_up {D, F}, W_down {F, D} (any types), X {D, T}, b_gate {F},
  // b_up {F}, b_down {D} (f32); out: Y {D, T}. With alpha = params.scale and limit = params.eps:
  // g = min(W_gate X + b_gate, limit), u = clamp(W_up X + b_up, -limit, limit),
  // Y = W_down ((u + 1) * g * sigmoid(alpha * g)) + b_down; each product with matmul's numerics (and its flags).
  expert_ffn_clamped,
  // Optional (gpt-oss experts). in: W_gate_e, W_up_e, W_down_e, X_e, b_gate_e, b_up_e, b_down_e for each of E >= 1
  // experts (7E tensors, each seven as expert_ffn_clamped's), one alpha and limit (params) for all; out: Y_e {D, T_e}
  // for each (E tensors). Every Y_e has the bits expert_ffn_clamped gives for its seven inputs: T_e and the weight
  // types may differ between experts, and the X_e may be one tensor. No output may overlap an input. As
  // expert_ffn_group: the engine uses it where supports() says so for every weight type and otherwise calls
  // expert_ffn_clamped per expert, as it also does after an `unsupported` answer.
  expert_ffn_clamped_group,
  // Optional. in: X {D, T} f32, ids {k, T} i32 and weights {k, T} f32 (topk_routing's outputs, where it left them),
  // then W_gate_e, W_up_e, W_down_e for every expert e = 0..E-1 of a layer (3 + 3E inputs; each three as expert_ffn's
  // weights); out: Y {D, T}. Each token's column is the engine's combine of its experts: Y[:, t] starts at +0, then
  // for its k picks in ascending expert id, Y[:, t] += weights[j, t] * expert_ffn(expert ids[j, t], X[:, t]), each
  // term with scale_add's numerics and each expert_ffn with that op's bits (params.flags as matmul's). A token whose
  // picks include an id outside 0..E-1 (topk_routing's NaN mark) gets a column of NaN. A token's ids are distinct. No
  // output may overlap an input. The backend reads the choice itself, so the host need not wait for topk_routing
  // before the call: the engine uses it in decode where every expert of the layer lies in this backend's memory and
  // supports() says so for each weight type, and otherwise (or after an `unsupported` answer, which a backend may
  // give for shapes or types its kernels do not route) runs the experts and scale_add itself.
  expert_ffn_routed,
  // Optional (GLM-4.5, MiniMax M2, DeepSeek V3-style routers). in: logits {E, T} f32, bias {E} f32; out: ids {k, T}
  // i32, weights {k, T} f32, k = params.top_k. Each expert's score s is sigmoid(logit) with kRoutingSigmoid (softmax
  // over the E with kRoutingSoftmax, the raw logit with neither). The k experts are chosen by s + bias[e] (the bias
  // only picks; ties go to the lower expert id; ids listed by descending s + bias), and each one's weight is its own
  // s, divided by (the sum of the k chosen s + 1e-20) with kRoutingRenormalize, then times params.scale (HF's
  // routed_scaling_factor). Every step in f32, in that order. NaN logits as topk_routing.
  topk_routing_biased,
  // Optional (DeepSeek's multi-head latent attention). in: A {a, R} f32, B {b, R} f32 (R = ne[1] * ne[2] * ne[3]
  // rows, the same count for both); out: Y {a + b, R} f32: each row is A's row followed by B's. A plain copy: the bits.
  concat_rows,
  // Optional (DeepSeek's multi-head latent attention). in: W {K, N, H} (H matrices of N rows of K; a matmul weight
  // type), X {Kx, H, T} f32 with Kx >= K; out: Y {N, H, T} f32. Y[t][h][n] = sum over k < K of W[h][n][k] X[t][h][k]:
  // head h's matrix times the first K values of token t's head-h row of X. Each (t, h) has the bits matmul gives for
  // W[h] and that row alone (params.flags as matmul's), whatever T.
  matmul_heads,
  // Optional (DeepSeek-V3/R1 and V2: routing within groups). As topk_routing_biased (same inputs, outputs, flags and
  // weights), except that the E experts form params.groups consecutive groups of E / groups, and only the experts of
  // the params.groups_used groups with the highest group scores compete (ties go to the lower group): a group's score
  // is the sum of its two highest s + bias (f32, the higher first), or with kRoutingGroupMax its highest s + bias
  // alone (DeepSeek-V2's group_limited_greedy). 2 <= groups, E % groups == 0, 1 <= groups_used <= groups, and
  // k <= groups_used * E / groups.
  topk_routing_grouped,
  // Optional (Qwen3-Next's gated attention output). in: A, B same shape f32; out: Y = A * B elementwise.
  mul,
  // Optional (Qwen3-Next's linear attention). in: X {C, T} f32, W {K, C} f32 (channel c's K taps, oldest first);
  // out: Y {C, T} f32, and state {C, K - 1} f32, read and written: the K - 1 inputs before X's first column, oldest
  // first (zeros before a sequence's first token). Y[t][c] = silu(sum over j < K, ascending, of W[c][j] * in(t - K + 1
  // + j)[c]), in(i) being X's column i, or state column K - 1 + i for i < 0; afterwards the state holds the last K - 1
  // inputs. Every column has the bits it would have in a call of its own (the state carrying the ones before it).
  causal_conv,
  // Optional (Qwen3-Next's linear attention: the gated delta rule). in: Q {dk, Hk, T}, K {dk, Hk, T}, V {dv, Hv, T},
  // a {Hv, T}, b {Hv, T}, A {Hv}, dt_bias {Hv} (all f32; Hv a multiple of Hk); out: O {dv, Hv, T} f32, and state
  // {dv, dk, Hv} f32, read and written (S[h][i][j] at j + dv * (i + dk * h); zeros before a sequence's first token).
  // For each token in order and each value head h, with key head h / (Hv / Hk): q and k divided by sqrt(sum of their
  // squares + 1e-6), q times 1 / sqrt(dk); decay = exp(A[h] * softplus(a + dt_bias[h])), beta = sigmoid(b);
  // S = S * decay; u[j] = (v[j] - sum over i of S[i][j] k[i]) * beta; S[i][j] += k[i] u[j]; O[j] = sum over i of
  // S[i][j] q[i]; sums over i ascending, in f32. Every token has the bits it would have in a call of its own. With
  // flags bit 6 (kDeltaTiledHeads) value head h reads key head h % Hk instead (llama.cpp's Qwen3.5 head order).
  gated_delta_rule,
  count_
};

inline constexpr std::int32_t kExactActivations = 1 << 0;
inline constexpr std::int32_t kRopeInterleaved = 1 << 1;
inline constexpr std::int32_t kRoutingSoftmax = 1 << 2;
inline constexpr std::int32_t kRoutingRenormalize = 1 << 3;
inline constexpr std::int32_t kRoutingSigmoid = 1 << 4;
inline constexpr std::int32_t kRoutingGroupMax = 1 << 5;
inline constexpr std::int32_t kDeltaTiledHeads = 1 << 6;

// A dense or block-quantized tensor of up to 4 dims, ne[0] fastest, rows contiguous
// (row_bytes(type, ne[0]) apart). `data` is a host pointer for host-visible buffers; device
// backends use `buffer` + `offset`.
struct Tensor {
  DType type = DType::f32;
  std::array<std::int64_t, 4> ne{1, 1, 1, 1};
  void* data = nullptr;
  class Buffer* buffer = nullptr;
  std::size_t offset = 0;
};

// Elements of a tensor, and its rows (everything above ne[0]): what every backend's shape checks need.
[[nodiscard]] inline std::int64_t element_count(const Tensor& t) noexcept {
  return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
}
[[nodiscard]] inline std::int64_t row_count(const Tensor& t) noexcept {
  return t.ne[1] * t.ne[2] * t.ne[3];
}

// "matmul", "expert_ffn", ...: the op's name for messages.
[[nodiscard]] constexpr const char* op_name(Op op) noexcept {
  switch (op) {
    case Op::matmul: return "matmul";
    case Op::expert_ffn: return "expert_ffn";
    case Op::rms_norm: return "rms_norm";
    case Op::rope: return "rope";
    case Op::attention: return "attention";
    case Op::swiglu: return "swiglu";
    case Op::add: return "add";
    case Op::topk_routing: return "topk_routing";
    case Op::embedding: return "embedding";
    case Op::scale_add: return "scale_add";
    case Op::sigmoid: return "sigmoid";
    case Op::store_rows: return "store_rows";
    case Op::expert_ffn_group: return "expert_ffn_group";
    case Op::attention_sinks: return "attention_sinks";
    case Op::expert_ffn_clamped: return "expert_ffn_clamped";
    case Op::expert_ffn_clamped_group: return "expert_ffn_clamped_group";
    case Op::expert_ffn_routed: return "expert_ffn_routed";
    case Op::topk_routing_biased: return "topk_routing_biased";
    case Op::concat_rows: return "concat_rows";
    case Op::matmul_heads: return "matmul_heads";
    case Op::topk_routing_grouped: return "topk_routing_grouped";
    case Op::mul: return "mul";
    case Op::causal_conv: return "causal_conv";
    case Op::gated_delta_rule: return "gated_delta_rule";
    default: return "unknown op";
  }
}

struct OpParams {
  float eps = 0.0f;            // rms_norm; expert_ffn_clamped(_group): limit
  std::int32_t rope_dims = 0;  // rope: rotated dims per head
  std::int32_t position = 0;   // attention: position of the first query token
  std::int32_t window = 0;     // attention: sliding window (0: none)
  std::int32_t top_k = 0;      // topk_routing
  std::int32_t flags = 0;      // k* flags above
  float scale = 1.0f;          // attention score scale; rope cos/sin scale; expert_ffn_clamped(_group): alpha;
                               // topk_routing_biased: weight multiplier
  // Appended last, so a plugin built before them still reads the fields above where they were.
  std::int32_t groups = 0;       // topk_routing_grouped: expert groups
  std::int32_t groups_used = 0;  // topk_routing_grouped: groups whose experts compete
};

struct OpCall {
  Op op = Op::matmul;
  std::span<const Tensor> inputs;
  std::span<Tensor> outputs;
  OpParams params;
};

// Destroying a buffer waits for the ops and copies in flight that read or write it (the backend's duty, as cudaFree
// waits for the device): the memory is never given back while the device may still touch it.
class Buffer {
 public:
  virtual ~Buffer() = default;
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
  [[nodiscard]] virtual void* host_pointer() noexcept = 0;  // nullptr when not host-visible
};

class Event {
 public:
  virtual ~Event() = default;
  virtual Status wait() noexcept = 0;
  [[nodiscard]] virtual bool ready() const noexcept = 0;
};

// query_interface id a backend with memory of its own (a GPU's, mapped into the host or not; never the CPU backend,
// whose buffers are host memory) answers non-null to when run() also takes host tensors (`data` set, no `buffer`),
// e.g. by importing or staging them. The engine then keeps activations and shared weights in host memory and, with
// memory.vram_budget, hands it expert weights in buffers from allocate() (the VRAM tier).
inline constexpr std::string_view kHostTensorsInterface = "colibri.compute.host-tensors.v1";

// query_interface id of a backend whose uploads read registered host memory directly (DMA, e.g. cudaHostRegister)
// instead of copying it into a staging buffer first; query_interface returns a ComputeHostRegister*. A
// copy_to_device_async whose source lies in a registered region may read it until its event completes, not only
// until it returns: the caller keeps those bytes unchanged until then. The engine registers its RAM expert slots.
inline constexpr std::string_view kHostRegisterInterface = "colibri.compute.host-register.v1";

class ComputeHostRegister {
 public:
  // Registers [ptr, ptr + bytes); an error leaves it unregistered (copies from it still work, staged).
  virtual Status register_host(void* ptr, std::size_t bytes) noexcept = 0;
  // Ends a registration made with this ptr; every copy from the region has completed.
  virtual void unregister_host(void* ptr) noexcept = 0;

 protected:
  ~ComputeHostRegister() = default;
};

// query_interface id of a backend that copies between two of its own buffers without the host (cudaMemcpyAsync
// device to device, vkCmdCopyBuffer); query_interface returns a ComputeDeviceCopy*. The engine moves KV rows and
// recurrent states within and between caches in device memory with it; without it they go through host memory.
inline constexpr std::string_view kDeviceCopyInterface = "colibri.compute.device-copy.v1";

class ComputeDeviceCopy {
 public:
  // Copies `bytes` from src at src_offset to dst at dst_offset (both this compute object's buffers; they may be one
  // buffer, the two ranges must not overlap). Ordered like copy_to_*_async: after the ops and copies started before
  // it that use either buffer (it reads what they wrote); the event completes when the bytes have arrived, and dst's
  // range is the caller's again only then. invalid_argument for a foreign buffer, a range past a buffer's end or
  // overlapping ranges.
  virtual Expected<std::unique_ptr<Event>> copy_between_async(const Buffer& src, std::size_t src_offset, Buffer& dst,
                                                              std::size_t dst_offset, std::size_t bytes) noexcept = 0;

 protected:
  ~ComputeDeviceCopy() = default;
};

class Compute : public PluginObject {
 public:
  [[nodiscard]] virtual std::span<const DeviceInfo> devices() const noexcept = 0;
  virtual Expected<std::unique_ptr<Buffer>> allocate(std::size_t bytes) noexcept = 0;
  [[nodiscard]] virtual bool supports(Op op, DType weight_type) const noexcept = 0;
  virtual Status run(const OpCall& call) noexcept = 0;
  // Copies between host memory and a buffer; the event completes when the data has arrived. copy_to_device_async
  // is done with `src` when it returns (the caller may reuse it before the event completes) unless `src` lies in
  // memory registered through kHostRegisterInterface; copy_to_host_async writes `dst` until its event completes.
  virtual Expected<std::unique_ptr<Event>> copy_to_device_async(const void* src, Buffer& dst, std::size_t offset,
                                                                std::size_t bytes) noexcept = 0;
  virtual Expected<std::unique_ptr<Event>> copy_to_host_async(const Buffer& src, std::size_t offset, void* dst,
                                                              std::size_t bytes) noexcept = 0;
  virtual Status synchronize() noexcept = 0;
};

// An event that is complete at construction: what synchronous backends return.
class CompletedEvent final : public Event {
 public:
  explicit CompletedEvent(Status status = {}) : status_(std::move(status)) {}
  Status wait() noexcept override { return status_; }
  [[nodiscard]] bool ready() const noexcept override { return true; }

 private:
  Status status_;
};

// Correct defaults for host-memory backends: copies are memcpy and complete immediately.
class ComputeBase : public Compute {
 public:
  Expected<std::unique_ptr<Event>> copy_to_device_async(const void* src, Buffer& dst, std::size_t offset,
                                                        std::size_t bytes) noexcept override;
  Expected<std::unique_ptr<Event>> copy_to_host_async(const Buffer& src, std::size_t offset, void* dst,
                                                      std::size_t bytes) noexcept override;
  Status synchronize() noexcept override { return {}; }
};

}  // namespace colibri::sdk
