// compute/vulkan: op validation and dispatch. Every call is checked on the host first
// (sdk::check_op_call plus this backend's grid limits: a bad shape is an error naming the op and
// tensor, never a GPU fault); then each tensor is resolved to a device address, the commands are
// recorded into one command buffer and run() waits for it: it returns with the outputs written, like
// the CPU backend. Where buffers are not mapped, a call on them alone is queued instead (Context::defer)
// and submitted with the next submission: nothing on the host can see its outputs before then.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>

#include "vulkan_compute.hpp"

namespace colibri::vulkan {

using sdk::DType;
using sdk::Expected;
using sdk::Op;
using sdk::shape_text;
using sdk::Status;
using sdk::StatusCode;
using sdk::Tensor;

namespace {

constexpr std::uint32_t kMaxGrid = 65535;
constexpr std::uint32_t kGridX = 32768;  // matches common.glsl
constexpr std::uint32_t kMatmulTile = 8;
constexpr std::int64_t kMaxRoutedPicks = 64;  // route_experts.comp's kMaxPicks
constexpr const char* kRoles[] = {"W_gate", "W_up", "W_down"};

// Regions of the scratch and of the address ring start on 256-byte boundaries.
constexpr std::size_t align256(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

const char* type_suffix(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::q8_0: return "q8_0";
    case DType::q4_0: return "q4_0";
    case DType::q2_k: return "q2_k";
    case DType::q3_k: return "q3_k";
    case DType::q5_k: return "q5_k";
    case DType::q4_k: return "q4_k";
    case DType::q6_k: return "q6_k";
    case DType::mxfp4: return "mxfp4";
    default: return "";
  }
}

// Start alignment a weight's shader needs: f32 is read as words, the fp16 scales of GGML blocks as half-words;
// mxfp4 blocks (17 bytes, no fp16 field) are read byte-wise, so a tensor may start anywhere.
std::size_t weight_align(DType t) {
  return sdk::data_alignment(t);
}

// mxfp4: the optional weight type this backend runs in matmul and the expert ops (not embedding, which
// check_op_call refuses it for).
bool matmul_weight(DType t) {
  return sdk::is_weight_type(t) || t == DType::mxfp4;
}

std::uint64_t elems(const Tensor& t) {
  return static_cast<std::uint64_t>(sdk::element_count(t));
}

template <typename T>
std::vector<std::byte> as_bytes(const T& v) {
  std::vector<std::byte> out(sizeof(T));
  std::memcpy(out.data(), &v, sizeof(T));
  return out;
}

std::uint32_t u32(std::int64_t v) {
  return static_cast<std::uint32_t>(v);
}

// Push constants, laid out as in the shaders (std430: u64 first, then 4-byte fields).
struct MatmulPush {
  std::uint64_t w, x, y, bias;
  std::uint32_t k, n, t, w_row_bytes, tpr, w_indirect;
};
struct MatmulHeadsPush {  // matmul_heads_* (matmul.comp with HEADS): MatmulPush, then the heads' layout
  MatmulPush m;
  std::uint64_t w_head_bytes;
  std::uint32_t heads, kx;
};
struct ConcatPush {
  std::uint64_t a, b, y;
  std::uint32_t a_width, b_width, n, pad;
};
struct GetRowsPush {
  std::uint64_t table, ids, out, status;
  std::uint32_t d, rows, t, row_bytes;
};
struct RmsNormPush {
  std::uint64_t x, w, y;
  std::uint32_t d, rows;
  float eps;
  std::uint32_t pad;
};
struct EltwisePush {
  std::uint64_t a, b, y;
  std::uint32_t n, mode, d;
  float alpha, limit;  // mode 4 (clamped GLU)
  std::uint32_t pad;
};
struct StoreRowsPush {
  std::uint64_t x, y;
  std::uint32_t n, mode;
};
struct RopePush {
  std::uint64_t x, positions, inv_freq, y;
  std::uint32_t head_dim, n_heads, t, rope_dims, interleaved;
  float scale;
};
struct AttentionPush {
  std::uint64_t q, k, v, o;
  std::uint32_t head_dim, n_heads, n_kv, t, position, window;
  float scale;
  std::uint32_t kv_row_bytes;
  std::uint64_t sinks;  // attention_sinks_* only (SINKS): {n_heads} f32
};
struct RoutePush {
  std::uint64_t ids, weights, table, slots, sorted;
  std::uint32_t k, e;
};
struct TopkPush {
  std::uint64_t logits, ids, weights;
  std::uint32_t e, t, k, mode, renormalize;
  float scale;                                        // topk_biased and topk_grouped only (BIASED)
  std::uint64_t bias;                                 // topk_biased and topk_grouped only: {E} f32
  std::uint32_t groups, groups_used, group_max, pad;  // topk_grouped only (GROUPED)
};
struct CausalConvPush {
  std::uint64_t x, w, y, state;
  std::uint32_t c, t, k, pad;
};
struct DeltaRulePush {
  std::uint64_t q, k, v, a, b, decay_a, dt_bias, o, state;
  std::uint32_t dk, dv, hk, hv, t, tiled;
};
static_assert(sizeof(CausalConvPush) == 48 && sizeof(DeltaRulePush) == 96);
static_assert(sizeof(MatmulPush) == 56 && sizeof(AttentionPush) == 72 && sizeof(RopePush) == 56 &&
              sizeof(EltwisePush) == 48 && sizeof(RoutePush) == 48 && sizeof(TopkPush) == 72 &&
              sizeof(MatmulHeadsPush) == 72 && sizeof(ConcatPush) == 40);

// Where each tensor of an op lives on the device. Host tensors (data set, no buffer) are copied
// into staging buffers the shaders read directly, and outputs copied back after the run.
class Binder {
 public:
  Binder(Context& ctx, const char* op) : ctx_(ctx), op_(op) {}
  ~Binder() {
    for (auto& s : staged_) ctx_.give_staging(s.staging);
    for (auto& a : imported_) ctx_.release(a);
  }
  Binder(const Binder&) = delete;
  Binder& operator=(const Binder&) = delete;

  // The device address of `t`; `what` names it in errors ("W", "X", ...).
  Expected<std::uint64_t> bind(const Tensor& t, const char* what, bool is_output, std::size_t align) {
    auto checked = sdk::checked_bytes(t, op_, what);
    if (!checked) return checked.error();
    const std::size_t bytes = *checked;
    std::uint64_t addr = 0;
    if (t.buffer != nullptr) {
      const auto* vb = dynamic_cast<const VulkanBuffer*>(t.buffer);
      if (vb == nullptr || vb->context() != &ctx_) return error(what, "lives in a buffer of another compute object");
      if (Status s = sdk::check_buffer_range(t, bytes, op_, what); !s) return s;
      addr = vb->address() + t.offset;
    } else if (t.data != nullptr) {
      // Host memory: used in place when the device can import it, else copied through staging.
      if (auto imported = ctx_.import_host(t.data, bytes); imported) {
        imported_.push_back(*imported);
        addr = imported->address;
        if (addr % align != 0)
          return error(what, "starts at an address not aligned to " + std::to_string(align) + " bytes");
        return addr;
      }
      // An input passed twice (latent attention's cache as keys and values) crosses once.
      const auto same = std::find_if(staged_.begin(), staged_.end(), [&](const Staged& x) {
        return !is_output && x.host_in == t.data && x.bytes == bytes;
      });
      if (same != staged_.end()) return same->staging.address;
      auto s = ctx_.take_staging(bytes);
      if (!s) return s.error().with_context(std::string(op_) + ": staging " + what);
      std::memcpy(s->mapped, t.data, bytes);
      staged_.push_back({*s, is_output ? t.data : nullptr, is_output ? nullptr : t.data, bytes});
      addr = s->address;
    } else {
      return error(what, "has neither a buffer nor host data");
    }
    if (addr % align != 0) {
      return error(what, "starts at an address not aligned to " + std::to_string(align) + " bytes (offset " +
                             std::to_string(t.offset) + ")");
    }
    return addr;
  }

  // Copies staged outputs back to the caller's host memory (after the GPU finished).
  void copy_back() {
    for (auto& s : staged_) {
      if (s.host_out != nullptr) std::memcpy(s.host_out, s.staging.mapped, s.bytes);
    }
  }

  Status error(const char* what, const std::string& message) const {
    return Status(StatusCode::invalid_argument, std::string(op_) + ": " + what + " " + message);
  }

 private:
  struct Staged {
    Allocation staging;
    void* host_out;
    const void* host_in;
    std::size_t bytes;
  };
  Context& ctx_;
  const char* op_;
  std::vector<Staged> staged_;
  std::vector<Allocation> imported_;
};

std::uint32_t groups_for(std::uint64_t items, std::uint32_t per_group) {
  const std::uint64_t g = (items + per_group - 1) / per_group;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(std::max<std::uint64_t>(g, 1), kMaxGrid));
}

// One workgroup per row, spread over x and z (see flat_group() in common.glsl).
void row_grid(Command& c, std::uint64_t n_rows, std::uint32_t y) {
  c.groups[0] = static_cast<std::uint32_t>(std::min<std::uint64_t>(n_rows, kGridX));
  c.groups[1] = y;
  c.groups[2] = static_cast<std::uint32_t>((n_rows + kGridX - 1) / kGridX);
}

// w_indirect: `w` is the address of W's address (an expert picked on the device).
Command matmul_command(DType wtype, std::uint64_t w, std::uint64_t x, std::uint64_t y, std::uint64_t bias,
                       std::int64_t k, std::int64_t n, std::int64_t t, bool w_indirect = false) {
  // Threads per row from K alone (never from T, so the reduction order is fixed per weight):
  // enough for every 32-element unit, at most the 64 of a workgroup.
  const auto units = static_cast<std::uint32_t>((k + 31) / 32);
  const std::uint32_t tpr = std::min<std::uint32_t>(64, std::bit_ceil(units));
  Command c;
  c.shader = std::string("matmul_") + type_suffix(wtype);
  c.push = as_bytes(
      MatmulPush{w, x, y, bias, u32(k), u32(n), u32(t), u32(sdk::row_bytes(wtype, k)), tpr, w_indirect ? 1u : 0u});
  const std::uint64_t rows_per_group = 64 / tpr;
  row_grid(c, (static_cast<std::uint64_t>(n) + rows_per_group - 1) / rows_per_group,
           static_cast<std::uint32_t>((t + kMatmulTile - 1) / kMatmulTile));
  return c;
}

Command eltwise_command(std::uint64_t a, std::uint64_t b, std::uint64_t y, std::uint64_t n, std::uint32_t mode,
                        std::uint32_t d, float alpha = 0.0f, float limit = 0.0f) {
  Command c;
  c.shader = "eltwise";
  c.push = as_bytes(EltwisePush{a, b, y, static_cast<std::uint32_t>(n), mode, d, alpha, limit, 0});
  c.groups[0] = groups_for(n, 256);
  return c;
}

// One expert over T tokens at device addresses: gate and up into their scratch, the activation (swiglu, or the
// clamped GLU with alpha and limit), then down into y: the shaders of matmul + swiglu + matmul, in that order.
struct ExpertCommands {
  DType gate_type, up_type, down_type;
  std::uint64_t w_gate, w_up, w_down, x, y, gate, up;
  std::uint64_t b_gate = 0, b_up = 0, b_down = 0;
  std::int64_t d, f, t;
  bool indirect = false;  // w_gate, w_up and w_down hold the weights' addresses (matmul_command's w_indirect)
};
void append_expert(std::vector<Command>& cmds, const ExpertCommands& e, bool clamped, float alpha, float limit) {
  const auto ft = static_cast<std::uint64_t>(e.f * e.t);
  cmds.push_back(matmul_command(e.gate_type, e.w_gate, e.x, e.gate, e.b_gate, e.d, e.f, e.t, e.indirect));
  cmds.push_back(matmul_command(e.up_type, e.w_up, e.x, e.up, e.b_up, e.d, e.f, e.t, e.indirect));
  cmds.push_back(clamped ? eltwise_command(e.gate, e.up, e.gate, ft, 4, 1, alpha, limit)
                         : eltwise_command(e.gate, e.up, e.gate, ft, 1, 1));
  cmds.push_back(matmul_command(e.down_type, e.w_down, e.gate, e.y, e.b_down, e.f, e.d, e.t, e.indirect));
}

}  // namespace

bool VulkanCompute::supports(Op op, DType weight_type) const noexcept {
  // store_rows: f32 and f16 rows; q8_0 would need correctly rounded divisions, which Vulkan does not promise.
  if (op == Op::store_rows) return weight_type == DType::f32 || weight_type == DType::f16;
  // A layer's experts in one submission: the expert_ffn commands of each, one after another. gpt-oss's
  // expert_ffn_clamped: expert_ffn's commands with the biases in the matmuls and the clamped activation (eltwise
  // mode 4) in place of swiglu. All of them are matmul shaders, so they take the weights matmul takes.
  // expert_ffn_routed: the choice comes back first (run() waits for every op anyway), then the chosen experts and the
  // combine go in one submission.
  if (op == Op::matmul || op == Op::expert_ffn || op == Op::expert_ffn_group || op == Op::expert_ffn_clamped ||
      op == Op::expert_ffn_clamped_group || op == Op::expert_ffn_routed)
    return matmul_weight(weight_type);
  // DeepSeek's latent attention: matmul.comp with HEADS (matmul_heads_*), and a copy shader.
  if (op == Op::matmul_heads) return matmul_weight(weight_type);
  if (op == Op::concat_rows) return weight_type == DType::f32;
  // gpt-oss: attention with the sinks as the softmax's first key (attention_sinks_* shaders).
  if (op == Op::attention_sinks) return sdk::supports_every_op(Op::attention, weight_type);
  // GLM-4.5 / DeepSeek-V3 routers: topk.comp built with BIASED (topk_biased), and GROUPED (topk_grouped).
  if (op == Op::topk_routing_biased || op == Op::topk_routing_grouped)
    return sdk::supports_every_op(Op::topk_routing, weight_type);
  // Qwen3-Next's linear attention: eltwise mode 5, and a shader each for the convolution and the delta rule.
  if (op == Op::mul || op == Op::causal_conv || op == Op::gated_delta_rule) return weight_type == DType::f32;
  return sdk::supports_every_op(op, weight_type);
}

Status VulkanCompute::ensure_scratch(std::size_t bytes) {
  if (scratch_.size >= bytes) return {};
  if (Status s = ctx_->settle_deferred(); !s) return s;  // deferred commands may use the old scratch
  ctx_->release(scratch_);
  auto a = ctx_->allocate(bytes, false);
  if (!a) return a.error().with_context("expert_ffn scratch");
  scratch_ = *a;
  return {};
}

Expected<std::uint64_t> VulkanCompute::routed_constants(std::size_t d_bytes) {
  if (routed_consts_.size < d_bytes + sizeof(float)) {
    if (Status s = ctx_->settle_deferred(); !s) return s;  // queued commands may read the old ones
    ctx_->release(routed_consts_);
    auto c = ctx_->allocate(d_bytes + sizeof(float), true);
    if (!c) return c.error().with_context("zeros");
    routed_consts_ = *c;
    std::memset(routed_consts_.mapped, 0, routed_consts_.size);
    *static_cast<float*>(routed_consts_.mapped) = std::numeric_limits<float>::quiet_NaN();
  }
  return routed_consts_.address;
}

Expected<std::pair<std::uint64_t*, std::uint64_t>> VulkanCompute::routed_table_space(std::size_t count) {
  const std::size_t bytes = align256(count * sizeof(std::uint64_t));
  if (routed_tables_.size < bytes || routed_tables_used_ + bytes > routed_tables_.size) {
    // Queued commands read the tables written so far: they finish before any is overwritten or freed.
    if (Status s = ctx_->settle_deferred(); !s) return s;
    routed_tables_used_ = 0;
    if (routed_tables_.size < bytes) {
      ctx_->release(routed_tables_);
      auto a = ctx_->allocate(std::max<std::size_t>(bytes, std::size_t{1} << 20), true);
      if (!a) return a.error().with_context("the experts' address tables");
      routed_tables_ = *a;
    }
  }
  const std::size_t at = std::exchange(routed_tables_used_, routed_tables_used_ + bytes);
  return std::pair{reinterpret_cast<std::uint64_t*>(static_cast<std::byte*>(routed_tables_.mapped) + at),
                   routed_tables_.address + at};
}

Status VulkanCompute::read_back(const Tensor& t, void* dst, std::size_t bytes, const char* what) {
  if (t.buffer == nullptr) {
    if (t.data == nullptr) return Status(StatusCode::invalid_argument, std::string(what) + " has no data");
    std::memcpy(dst, t.data, bytes);
    return {};
  }
  auto copy = copy_to_host_async(*t.buffer, t.offset, dst, bytes);
  if (!copy) return copy.error().with_context(std::string("reading back ") + what);
  return (*copy)->wait();
}

namespace {

// The device path of expert_ffn_routed (route_experts): one token, a few picks, and experts alike (each role one type
// and shape), so the commands need not know which experts are picked. Anything else reads the choice back.
bool routes_on_device(const sdk::OpCall& call) {
  const auto& in = call.inputs;
  if (in.size() < 6 || (in.size() - 3) % 3 != 0 || call.outputs.size() != 1) return false;
  const std::int64_t k = in[1].ne[0];
  if (sdk::row_count(in[0]) != 1 || k < 1 || k > kMaxRoutedPicks) return false;
  for (std::size_t i = 6; i < in.size(); ++i) {
    if (in[i].type != in[3 + i % 3].type || in[i].ne != in[3 + i % 3].ne) return false;
  }
  return true;
}

}  // namespace

bool VulkanCompute::deferrable(const sdk::OpCall& call) const {
  if (ctx_->device_memory_mapped() || call.op == Op::embedding) return false;
  if (call.op == Op::expert_ffn_routed && !routes_on_device(call)) return false;
  for (const Tensor& t : call.inputs) {
    if (t.buffer == nullptr) return false;
  }
  for (const Tensor& t : call.outputs) {
    if (t.buffer == nullptr) return false;
  }
  return true;
}

Status VulkanCompute::run(const sdk::OpCall& call) noexcept {
  return sdk::guarded(op_name(call.op), [&] {
    std::lock_guard lock(run_mu_);
    const bool defer = deferrable(call);
    // A call that submits (and waits) itself comes after the deferred commands on the queue. Either way a failure of
    // queued commands is reported by this call.
    if (Status s = defer ? ctx_->take_deferred_error() : ctx_->flush_deferred(); !s) return s;
    return run_impl(call, defer);
  });
}

Status VulkanCompute::run_impl(const sdk::OpCall& call, bool defer) {
  const char* name = op_name(call.op);
  const auto& in = call.inputs;
  const auto& out = call.outputs;
  // Shaders index with 32-bit integers: check_op_call refuses tensors of 2^31 elements or more.
  if (Status s = sdk::check_op_call(call, "vulkan"); !s) return s;
  // check_op_call lets mxfp4 weights through for matmul and the expert ops: every one of those this backend has runs
  // them (matmul_mxfp4).
  auto bad = [&](const std::string& m) { return Status(StatusCode::invalid_argument, std::string(name) + ": " + m); };
#define COLIBRI_VK_TRY(expr)       \
  do {                             \
    if (Status s_ = (expr); !s_) { \
      return s_;                   \
    }                              \
  } while (0)
#define COLIBRI_VK_BIND(var, tensor, what, is_out, align) \
  std::uint64_t var = 0;                                  \
  {                                                       \
    auto b_ = binder.bind(tensor, what, is_out, align);   \
    if (!b_) return b_.error();                           \
    var = *b_;                                            \
  }

  Binder binder(*ctx_, name);
  std::vector<Command> cmds;
  bool check_status = false;

  switch (call.op) {
    case Op::matmul: {
      const Tensor &w = in[0], &x = in[1], &y = out[0];
      const std::int64_t k = w.ne[0], n = sdk::row_count(w), t = sdk::row_count(x);
      COLIBRI_VK_BIND(wa, w, "W", false, weight_align(w.type));
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      std::uint64_t ba = 0;
      if (in.size() == 3) {
        COLIBRI_VK_BIND(b, in[2], "bias", false, 4);
        ba = b;
      }
      cmds.push_back(matmul_command(w.type, wa, xa, ya, ba, k, n, t));
      break;
    }
    case Op::matmul_heads: {
      // matmul's shader with a head index on grid y (HEADS): each (token, head) gets the arithmetic of matmul on its
      // matrix and row. Grid y holds (token tile, head) pairs: a batch too large for it goes in token chunks.
      const Tensor &w = in[0], &x = in[1], &y = out[0];
      const std::int64_t k = w.ne[0], n = w.ne[1], heads = w.ne[2], kx = x.ne[0], t = x.ne[2];
      if (heads > kMaxGrid) return bad("more than 65535 heads in one call");
      COLIBRI_VK_BIND(wa, w, "W", false, weight_align(w.type));
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      const std::size_t rb = sdk::row_bytes(w.type, k);
      const std::int64_t chunk = kMaxGrid / heads * kMatmulTile;
      for (std::int64_t t0 = 0; t0 < t; t0 += chunk) {
        const std::int64_t tc = std::min(chunk, t - t0);
        Command c = matmul_command(w.type, wa, xa + static_cast<std::uint64_t>(t0 * heads * kx) * sizeof(float),
                                   ya + static_cast<std::uint64_t>(t0 * heads * n) * sizeof(float), 0, k, n, tc);
        MatmulPush m;
        std::memcpy(&m, c.push.data(), sizeof(m));
        c.shader = std::string("matmul_heads_") + type_suffix(w.type);
        c.push = as_bytes(MatmulHeadsPush{m, rb * static_cast<std::uint64_t>(n), u32(heads), u32(kx)});
        c.groups[1] *= u32(heads);
        cmds.push_back(std::move(c));
      }
      break;
    }
    case Op::concat_rows: {
      const Tensor &a = in[0], &b = in[1], &y = out[0];
      COLIBRI_VK_BIND(aa, a, "A", false, 4);
      COLIBRI_VK_BIND(ba, b, "B", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      Command c;
      c.shader = "concat_rows";
      c.push = as_bytes(ConcatPush{aa, ba, ya, u32(a.ne[0]), u32(b.ne[0]), static_cast<std::uint32_t>(elems(y)), 0});
      c.groups[0] = groups_for(elems(y), 256);
      cmds.push_back(std::move(c));
      break;
    }
    case Op::expert_ffn:
    case Op::expert_ffn_group:
    case Op::expert_ffn_clamped:
    case Op::expert_ffn_clamped_group: {
      // expert_ffn is a group of one. Every expert gets its own gate/up scratch, so a group is one submission of
      // each expert's commands in turn (one wait instead of one per expert), with the bits of expert_ffn alone.
      // expert_ffn_clamped(_group): experts of seven inputs whose matmuls add their biases (inputs 4..6) and whose
      // activation is the clamped GLU (eltwise mode 4) instead of swiglu.
      const bool clamped = call.op == Op::expert_ffn_clamped || call.op == Op::expert_ffn_clamped_group;
      const std::size_t stride = clamped ? 7 : 4;
      const std::size_t experts = out.size();
      auto scratch_of = [&](std::size_t e) {
        const std::size_t ft_bytes =
            static_cast<std::size_t>(sdk::row_count(in[stride * e]) * sdk::row_count(in[stride * e + 3])) *
            sizeof(float);
        return align256(ft_bytes);
      };
      std::size_t scratch_bytes = 0;
      for (std::size_t e = 0; e < experts; ++e) scratch_bytes += 2 * scratch_of(e);
      COLIBRI_VK_TRY(ensure_scratch(scratch_bytes));
      std::uint64_t next = scratch_.address;
      for (std::size_t e = 0; e < experts; ++e) {
        const Tensor &wg = in[stride * e], &wu = in[stride * e + 1], &wd = in[stride * e + 2], &x = in[stride * e + 3],
                     &y = out[e];
        const std::int64_t d = wg.ne[0], f = sdk::row_count(wg), t = sdk::row_count(x);
        std::uint64_t bg = 0, bu = 0, bd = 0;
        if (clamped) {
          COLIBRI_VK_BIND(g_, in[stride * e + 4], "b_gate", false, 4);
          COLIBRI_VK_BIND(u_, in[stride * e + 5], "b_up", false, 4);
          COLIBRI_VK_BIND(d_, in[stride * e + 6], "b_down", false, 4);
          bg = g_;
          bu = u_;
          bd = d_;
        }
        COLIBRI_VK_BIND(ga, wg, "W_gate", false, weight_align(wg.type));
        COLIBRI_VK_BIND(ua, wu, "W_up", false, weight_align(wu.type));
        COLIBRI_VK_BIND(da, wd, "W_down", false, weight_align(wd.type));
        COLIBRI_VK_BIND(xa, x, "X", false, 4);
        COLIBRI_VK_BIND(ya, y, "Y", true, 4);
        const std::size_t aligned = scratch_of(e);
        const std::uint64_t gate = next, up = next + aligned;
        next += 2 * aligned;
        append_expert(cmds, {wg.type, wu.type, wd.type, ga, ua, da, xa, ya, gate, up, bg, bu, bd, d, f, t}, clamped,
                      call.params.scale, call.params.eps);
      }
      break;
    }
    case Op::expert_ffn_routed: {
      if (defer) {
        // Nothing read back (deferrable, routes_on_device): route_experts orders the picks and writes each one's
        // weight addresses, which the expert's matmuls read (w_indirect), and its weight; then the same commands as
        // below, k experts by position in that order. A marked or repeated pick makes the column NaN.
        const Tensor &x = in[0], &ids = in[1], &wts = in[2], &y = out[0];
        const std::int64_t d = x.ne[0], k = ids.ne[0], f = sdk::row_count(in[3]);
        const std::size_t experts = (in.size() - 3) / 3;
        COLIBRI_VK_BIND(xa, x, "X", false, 4);
        COLIBRI_VK_BIND(ia, ids, "ids", false, 4);
        COLIBRI_VK_BIND(wa, wts, "weights", false, 4);
        COLIBRI_VK_BIND(ya, y, "Y", true, 4);
        auto table = routed_table_space(experts * 3);
        if (!table) return table.error().with_context(name);
        for (std::size_t i = 0; i < experts * 3; ++i) {
          const std::string who = "expert " + std::to_string(i / 3) + ": " + kRoles[i % 3];
          COLIBRI_VK_BIND(wi, in[3 + i], who.c_str(), false, weight_align(in[3 + i].type));
          table->first[i] = wi;
        }
        auto nan = routed_constants(static_cast<std::size_t>(d) * sizeof(float));
        if (!nan) return nan.error().with_context(name);
        const std::uint64_t zeros = *nan + sizeof(float);
        const std::size_t half = align256(static_cast<std::size_t>(f) * sizeof(float));
        const std::size_t per_pick = 2 * half + align256(static_cast<std::size_t>(d) * sizeof(float));
        const auto picks = static_cast<std::size_t>(k);
        const std::size_t slot_bytes = align256(picks * 3 * sizeof(std::uint64_t));
        COLIBRI_VK_TRY(ensure_scratch(per_pick * picks + slot_bytes + align256(picks * sizeof(float))));
        const std::uint64_t slots = scratch_.address + per_pick * picks, sorted = slots + slot_bytes;
        Command route;
        route.shader = "route_experts";
        route.push = as_bytes(RoutePush{ia, wa, table->second, slots, sorted, u32(k), u32(experts)});
        cmds.push_back(std::move(route));
        cmds.push_back(eltwise_command(zeros, zeros, ya, static_cast<std::uint64_t>(d), 0, 1));
        for (std::size_t i = 0; i < picks; ++i) {
          const std::uint64_t at = scratch_.address + i * per_pick, slot = slots + i * 3 * sizeof(std::uint64_t);
          append_expert(cmds,
                        {in[3].type, in[4].type, in[5].type, slot, slot + 8, slot + 16, xa, at + 2 * half, at,
                         at + half, 0, 0, 0, d, f, 1, true},
                        false, 0.0f, 0.0f);
        }
        for (std::size_t i = 0; i < picks; ++i) {
          cmds.push_back(eltwise_command(scratch_.address + i * per_pick + 2 * half, sorted + i * sizeof(float), ya,
                                         static_cast<std::uint64_t>(d), 3, u32(d)));
        }
        if (ctx_->host() != nullptr) ctx_->host()->counter_add("routed_on_device_total", 1);
        break;
      }
      // One token (decode). Its choice comes back to the host, as it would for the engine's own routing; then each
      // chosen expert's commands (expert_ffn's), out = zeros + zeros and scale_add of each in ascending id (the
      // engine's combine, the same shaders) go in one submission. A pick outside the experts (topk's NaN mark) makes
      // out NaN: zeros + zeros, then scale_add of the zeros by NaN.
      const Tensor &x = in[0], &ids = in[1], &wts = in[2], &y = out[0];
      const std::int64_t d = x.ne[0], t = sdk::row_count(x), k = ids.ne[0];
      if (t != 1) {
        return Status(StatusCode::unsupported,
                      std::string(name) + ": T = " + std::to_string(t) + "; this backend routes one token (decode)");
      }
      const auto experts = static_cast<std::int32_t>((in.size() - 3) / 3);
      std::vector<std::int32_t> picked(static_cast<std::size_t>(k));
      COLIBRI_VK_TRY(read_back(ids, picked.data(), picked.size() * sizeof(std::int32_t), "ids"));
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(wa, wts, "weights", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      std::vector<std::pair<std::int32_t, std::int64_t>> order;  // (expert, pick) in ascending expert id
      bool marked = false;
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t e = picked[static_cast<std::size_t>(j)];
        marked = marked || e < 0 || e >= experts;
        order.emplace_back(e, j);
      }
      std::sort(order.begin(), order.end());
      const auto d_bytes = static_cast<std::size_t>(d) * sizeof(float);
      auto nan_at = routed_constants(d_bytes);
      if (!nan_at) return nan_at.error().with_context(name);
      const std::uint64_t nan = *nan_at, zeros = nan + sizeof(float);
      cmds.push_back(eltwise_command(zeros, zeros, ya, static_cast<std::uint64_t>(d), 0, 1));
      if (marked) {
        cmds.push_back(eltwise_command(zeros, nan, ya, static_cast<std::uint64_t>(d), 3, u32(d)));
        break;
      }
      for (std::size_t i = 1; i < order.size(); ++i) {
        if (order[i].first == order[i - 1].first) {
          return bad("picks expert " + std::to_string(order[i].first) + " twice; a token's ids must be distinct");
        }
      }
      // Per pick: its gate and up scratch and its output.
      std::size_t per_pick = 0;
      for (const auto& [e, j] : order) {
        const std::int64_t fe = sdk::row_count(in[static_cast<std::size_t>(3 + 3 * e)]);
        per_pick = std::max(per_pick, 2 * align256(static_cast<std::size_t>(fe) * sizeof(float)) + align256(d_bytes));
      }
      COLIBRI_VK_TRY(ensure_scratch(per_pick * order.size()));
      std::uint64_t next = scratch_.address;
      std::vector<std::uint64_t> outputs;
      for (const auto& [e, j] : order) {
        const auto at = static_cast<std::size_t>(3 + 3 * e);
        const Tensor &wg = in[at], &wu = in[at + 1], &wd = in[at + 2];
        const std::string who = "expert " + std::to_string(e) + ": ";
        COLIBRI_VK_BIND(ga, wg, (who + "W_gate").c_str(), false, weight_align(wg.type));
        COLIBRI_VK_BIND(ua, wu, (who + "W_up").c_str(), false, weight_align(wu.type));
        COLIBRI_VK_BIND(da, wd, (who + "W_down").c_str(), false, weight_align(wd.type));
        const std::int64_t fe = sdk::row_count(wg);
        const std::size_t half = align256(static_cast<std::size_t>(fe) * sizeof(float));
        const std::uint64_t gate = next, up = next + half, ye = next + 2 * half;
        next += per_pick;
        append_expert(cmds, {wg.type, wu.type, wd.type, ga, ua, da, xa, ye, gate, up, 0, 0, 0, d, fe, 1}, false, 0.0f,
                      0.0f);
        outputs.push_back(ye);
      }
      for (std::size_t i = 0; i < order.size(); ++i) {
        const std::uint64_t w_j = wa + static_cast<std::uint64_t>(order[i].second) * sizeof(float);
        cmds.push_back(eltwise_command(outputs[i], w_j, ya, static_cast<std::uint64_t>(d), 3, u32(d)));
      }
      break;
    }
    case Op::rms_norm: {
      const Tensor &x = in[0], &w = in[1], &y = out[0];
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(wa, w, "w", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      Command c;
      c.shader = "rms_norm";
      c.push = as_bytes(RmsNormPush{xa, wa, ya, u32(x.ne[0]), u32(sdk::row_count(x)), call.params.eps, 0});
      row_grid(c, static_cast<std::uint64_t>(sdk::row_count(x)), 1);
      cmds.push_back(std::move(c));
      break;
    }
    case Op::rope: {
      const Tensor &x = in[0], &pos = in[1], &freq = in[2], &y = out[0];
      const std::int64_t hd = x.ne[0], nh = x.ne[1], t = x.ne[2] * x.ne[3];
      const std::int32_t rd = call.params.rope_dims;
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(pa, pos, "positions", false, 4);
      COLIBRI_VK_BIND(fa, freq, "inv_freq", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      Command c;
      c.shader = "rope";
      const std::uint32_t interleaved = (call.params.flags & sdk::kRopeInterleaved) ? 1u : 0u;
      c.push = as_bytes(RopePush{xa, pa, fa, ya, u32(hd), u32(nh), u32(t), u32(rd), interleaved, call.params.scale});
      c.groups[0] = groups_for(elems(x) / 2, 256);
      cmds.push_back(std::move(c));
      break;
    }
    case Op::attention:
    case Op::attention_sinks: {
      // attention_sinks: the attention_sinks_* shaders (attention.comp with SINKS), which read the sinks' address
      // after attention's push constants; the plain attention shaders never see it.
      const bool with_sinks = call.op == Op::attention_sinks;
      const Tensor &q = in[0], &k = in[1], &v = in[2], &o = out[0];
      const std::int64_t hd = q.ne[0], nh = q.ne[1], t = q.ne[2] * q.ne[3], nkv = k.ne[1];
      if (t > kMaxGrid || nh > kMaxGrid) return bad("more than 65535 queries or heads in one call");
      COLIBRI_VK_BIND(qa, q, "Q", false, 4);
      COLIBRI_VK_BIND(ka, k, "K", false, k.type == DType::f32 ? 4 : 2);
      COLIBRI_VK_BIND(va, v, "V", false, v.type == DType::f32 ? 4 : 2);
      COLIBRI_VK_BIND(oa, o, "O", true, 4);
      std::uint64_t sa = 0;
      if (with_sinks) {
        COLIBRI_VK_BIND(s_, in[3], "sinks", false, 4);
        sa = s_;
      }
      Command c;
      c.shader = std::string(with_sinks ? "attention_sinks_" : "attention_") + type_suffix(k.type);
      c.push = as_bytes(AttentionPush{qa, ka, va, oa, u32(hd), u32(nh), u32(nkv), u32(t), u32(call.params.position),
                                      u32(call.params.window), call.params.scale, u32(sdk::row_bytes(k.type, hd)), sa});
      c.groups[0] = u32(nh);
      c.groups[1] = u32(t);
      cmds.push_back(std::move(c));
      break;
    }
    case Op::swiglu:
    case Op::add:
    case Op::mul: {
      const Tensor &a = in[0], &b = in[1], &y = out[0];
      COLIBRI_VK_BIND(aa, a, "A", false, 4);
      COLIBRI_VK_BIND(bb, b, "B", false, 4);
      COLIBRI_VK_BIND(ya, y, "out", true, 4);
      cmds.push_back(eltwise_command(aa, bb, ya, elems(a), call.op == Op::add ? 0 : call.op == Op::mul ? 5 : 1, 1));
      break;
    }
    case Op::causal_conv: {
      const Tensor &x = in[0], &w = in[1], &y = out[0], &state = out[1];
      if (w.ne[0] > 16) return bad("convolutions of more than 16 taps are not supported by vulkan");
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(wa, w, "W", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      COLIBRI_VK_BIND(sa, state, "state", true, 4);
      Command c;
      c.shader = "causal_conv";
      c.push = as_bytes(CausalConvPush{xa, wa, ya, sa, u32(x.ne[0]), u32(x.ne[1]), u32(w.ne[0]), 0});
      c.groups[0] = groups_for(static_cast<std::uint64_t>(x.ne[0]), 64);
      cmds.push_back(std::move(c));
      break;
    }
    case Op::gated_delta_rule: {
      const Tensor &q = in[0], &v = in[2], &o = out[0], &state = out[1];
      if (q.ne[0] > 256) return bad("key heads of more than 256 values are not supported by vulkan");
      if (v.ne[1] > kMaxGrid) return bad("more than 65535 value heads in one call");
      static constexpr const char* kIn[] = {"Q", "K", "V", "a", "b", "A", "dt_bias"};
      std::uint64_t addr[7] = {};
      for (std::size_t i = 0; i < 7; ++i) {
        COLIBRI_VK_BIND(a_, in[i], kIn[i], false, 4);
        addr[i] = a_;
      }
      COLIBRI_VK_BIND(oa, o, "O", true, 4);
      COLIBRI_VK_BIND(sa, state, "state", true, 4);
      Command c;
      c.shader = "gated_delta_rule";
      const std::uint32_t tiled = (call.params.flags & sdk::kDeltaTiledHeads) != 0 ? 1u : 0u;
      c.push = as_bytes(DeltaRulePush{addr[0], addr[1], addr[2], addr[3], addr[4], addr[5], addr[6], oa, sa,
                                      u32(q.ne[0]), u32(v.ne[0]), u32(q.ne[1]), u32(v.ne[1]), u32(q.ne[2]), tiled});
      c.groups[0] = groups_for(static_cast<std::uint64_t>(v.ne[0]), 64);
      c.groups[1] = u32(v.ne[1]);
      cmds.push_back(std::move(c));
      break;
    }
    case Op::sigmoid: {
      const Tensor &x = in[0], &y = out[0];
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      cmds.push_back(eltwise_command(xa, xa, ya, elems(x), 2, 1));
      break;
    }
    case Op::scale_add: {
      const Tensor &x = in[0], &w = in[1], &y = out[0];
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(wa, w, "w", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      cmds.push_back(eltwise_command(xa, wa, ya, elems(x), 3, u32(x.ne[0])));
      break;
    }
    case Op::topk_routing:
    case Op::topk_routing_biased:
    case Op::topk_routing_grouped: {
      // topk_routing_biased: the topk_biased shader (topk.comp with BIASED), which reads the bias and scale after
      // topk's push constants; topk_routing_grouped: topk_grouped (also GROUPED), the groups after those. A NaN logit
      // marks the token's picks in all three, as topk.comp does.
      const bool grouped = call.op == Op::topk_routing_grouped;
      const bool biased = grouped || call.op == Op::topk_routing_biased;
      const Tensor &l = in[0], &ids = out[0], &wts = out[1];
      const std::int64_t e = l.ne[0], t = sdk::row_count(l), k = call.params.top_k;
      const std::int32_t f = call.params.flags;
      COLIBRI_VK_BIND(la, l, "logits", false, 4);
      std::uint64_t ba = 0;
      if (biased) {
        COLIBRI_VK_BIND(bias_at, in[1], "bias", false, 4);
        ba = bias_at;
      }
      COLIBRI_VK_BIND(ia, ids, "ids", true, 4);
      COLIBRI_VK_BIND(wa, wts, "weights", true, 4);
      Command c;
      c.shader = grouped ? "topk_grouped" : biased ? "topk_biased" : "topk";
      const std::uint32_t mode = (f & sdk::kRoutingSoftmax) ? 1u : (f & sdk::kRoutingSigmoid) ? 2u : 0u;
      c.push =
          as_bytes(TopkPush{la, ia, wa, u32(e), u32(t), u32(k), mode, (f & sdk::kRoutingRenormalize) ? 1u : 0u,
                            call.params.scale, ba, grouped ? u32(call.params.groups) : 0u,
                            grouped ? u32(call.params.groups_used) : 0u, (f & sdk::kRoutingGroupMax) ? 1u : 0u, 0u});
      c.groups[0] = groups_for(static_cast<std::uint64_t>(t), 64);
      cmds.push_back(std::move(c));
      break;
    }
    case Op::embedding: {
      const Tensor &table = in[0], &ids = in[1], &y = out[0];
      const std::int64_t d = table.ne[0], v = sdk::row_count(table), t = sdk::element_count(ids);
      if (t > kMaxGrid) return bad("more than 65535 ids in one call");
      COLIBRI_VK_BIND(ta, table, "table", false, weight_align(table.type));
      COLIBRI_VK_BIND(ia, ids, "ids", false, 4);
      COLIBRI_VK_BIND(ya, y, "out", true, 4);
      if (status_.buffer == VK_NULL_HANDLE) {
        auto s = ctx_->allocate(16, true);
        if (!s) return s.error().with_context("embedding status word");
        status_ = *s;
      }
      std::memset(status_.mapped, 0, 8);
      check_status = true;
      Command c;
      c.shader = std::string("get_rows_") + type_suffix(table.type);
      c.push = as_bytes(
          GetRowsPush{ta, ia, ya, status_.address, u32(d), u32(v), u32(t), u32(sdk::row_bytes(table.type, d))});
      c.groups[0] = groups_for(static_cast<std::uint64_t>((d + 31) / 32), 64);
      c.groups[1] = u32(t);
      cmds.push_back(std::move(c));
      break;
    }
    case Op::store_rows: {
      const Tensor &x = in[0], &y = out[0];
      if (!supports(Op::store_rows, y.type)) {
        return Status(StatusCode::unsupported, std::string(name) + ": Y type " + std::string(sdk::to_string(y.type)) +
                                                   " is not supported by vulkan (f32 or f16)");
      }
      COLIBRI_VK_BIND(xa, x, "X", false, 4);
      COLIBRI_VK_BIND(ya, y, "Y", true, 4);
      Command c;
      c.shader = "store_rows";
      const std::uint64_t n = elems(x);
      c.push = as_bytes(StoreRowsPush{xa, ya, static_cast<std::uint32_t>(n), y.type == DType::f16 ? 1u : 0u});
      c.groups[0] = groups_for(y.type == DType::f16 ? (n + 1) / 2 : n, 256);
      cmds.push_back(std::move(c));
      break;
    }
    // An optional op this backend does not offer (supports() says no): the caller falls back, as the SDK asks.
    default: return Status(StatusCode::unsupported, std::string(name) + ": not implemented by the vulkan backend");
  }
#undef COLIBRI_VK_BIND
#undef COLIBRI_VK_TRY

  // Each command's pipeline, push constants and grid, recorded now or, deferred, with the next submission.
  std::vector<Context::Dispatch> recorded(cmds.size());
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    auto p = ctx_->pipeline(cmds[i].shader);
    if (!p) return p.error();
    recorded[i].pipeline = *p;
    recorded[i].push = std::move(cmds[i].push);
    std::copy(std::begin(cmds[i].groups), std::end(cmds[i].groups), recorded[i].groups);
  }
  if (defer) {  // submitted with the next submission (Context::flush_deferred): no wait per op
    ctx_->defer(std::move(recorded));
    return {};
  }
  auto sub = ctx_->submit([&](VkCommandBuffer cmd) { ctx_->record_commands(cmd, recorded); });
  if (!sub) return sub.error().with_context(name);
  if (Status s = (*sub)->wait(); !s) return s.with_context(name);
  binder.copy_back();
  if (check_status) {
    std::uint32_t st[2];
    std::memcpy(st, status_.mapped, sizeof(st));
    if (st[0] != 0) {
      return bad("ids[" + std::to_string(st[0] - 1) + "] = " + std::to_string(static_cast<std::int32_t>(st[1])) +
                 " is outside the table of " + std::to_string(sdk::row_count(in[0])) + " rows");
    }
  }
  return {};
}

}  // namespace colibri::vulkan
