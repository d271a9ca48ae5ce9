#include "colibri/model/manifest.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>
#include <vector>

#include "colibri/model/paths.hpp"
#include "colibri/sdk/os_error.hpp"
#include "model/architecture.hpp"
#include "model/file_io.hpp"

namespace colibri::model {

namespace fs = std::filesystem;
using nlohmann::json;
using sdk::Status;
using sdk::StatusCode;

bool HyperParams::layer_is_sparse(std::int64_t layer) const {
  if (dense || n_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return decoder_sparse_step <= 1 || (layer + 1) % decoder_sparse_step == 0;
}

std::int64_t HyperParams::layer_window(std::int64_t layer) const {
  if (sliding_window <= 0) return 0;
  if (sliding_layers.empty()) return sliding_window;
  return std::find(sliding_layers.begin(), sliding_layers.end(), layer) != sliding_layers.end() ? sliding_window : 0;
}

std::int64_t HyperParams::layer_chunk(std::int64_t layer) const {
  if (attention_chunk <= 0) return 0;
  return std::find(chunked_layers.begin(), chunked_layers.end(), layer) != chunked_layers.end() ? attention_chunk : 0;
}

bool HyperParams::layer_has_rope(std::int64_t layer) const {
  return std::find(nope_layers.begin(), nope_layers.end(), layer) == nope_layers.end();
}

bool HyperParams::layer_is_linear(std::int64_t layer) const {
  return std::find(linear_layers.begin(), linear_layers.end(), layer) != linear_layers.end();
}

int HyperParams::format_version() const {
  if (qk_norm == "per_head_after_rope") return 7;
  if (!linear_layers.empty() || attn_output_gate) return 6;
  const bool v5 = !nope_layers.empty() || attention_chunk > 0 || router_weight_on_input || qk_norm == "l2";
  if (v5) return 5;
  const bool v3 = router_scoring != "softmax" || router_selection_bias || routed_scaling_factor != 1.0 ||
                  (rotary_dims != 0 && rotary_dims != head_dim) || rope_interleaved;
  const bool v2 = !sliding_layers.empty() || attention_sinks || router_bias || expert_activation != "swiglu";
  return mla() || grouped_routing() ? 4 : v3 ? 3 : v2 ? 2 : 1;
}

std::vector<const TensorEntry*> ExpertEntry::parts() const {
  if (!has_bias()) return {&gate, &up, &down};
  return {&gate, &up, &down, &gate_bias, &up_bias, &down_bias};
}

json HyperParams::to_json() const {
  json j;
  j["architecture"] = architecture;
  j["hf_architecture"] = hf_architecture;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_layers"] = num_layers;
  j["num_heads"] = num_heads;
  j["num_kv_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = rope_scaling;
  j["rope_layout"] = rope_interleaved ? "interleaved" : "hf_rotate_half";
  j["rms_norm_eps"] = rms_norm_eps;
  j["hidden_act"] = hidden_act;
  j["sliding_window"] = sliding_window;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_qkv_bias"] = attention_qkv_bias;
  j["attention_out_bias"] = attention_out_bias;
  j["qk_norm"] = qk_norm;
  j["clip_qkv"] = clip_qkv;
  j["dense"] = dense;
  j["n_experts"] = n_experts;
  j["n_experts_per_tok"] = n_experts_per_tok;
  j["norm_topk_prob"] = norm_topk_prob;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
  j["shared_expert_gate"] = shared_expert_gate;
  j["decoder_sparse_step"] = decoder_sparse_step;
  j["mlp_only_layers"] = mlp_only_layers;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_ids"] = eos_token_ids;
  if (format_version() >= 2) {
    j["sliding_layers"] = sliding_layers;
    j["attention_sinks"] = attention_sinks;
    j["router_bias"] = router_bias;
    j["expert_activation"] = expert_activation;
    j["swiglu_alpha"] = swiglu_alpha;
    j["swiglu_limit"] = swiglu_limit;
  }
  if (format_version() >= 3) {
    j["router_scoring"] = router_scoring;
    j["router_selection_bias"] = router_selection_bias;
    j["routed_scaling_factor"] = routed_scaling_factor;
    j["rotary_dims"] = rotary_dims;
    j["rope_interleaved"] = rope_interleaved;
  }
  if (format_version() >= 4) {
    j["q_lora_rank"] = q_lora_rank;
    j["kv_lora_rank"] = kv_lora_rank;
    j["v_head_dim"] = v_head_dim;
    j["router_groups"] = router_groups;
    j["router_groups_used"] = router_groups_used;
    j["router_group_score"] = router_group_score;
  }
  if (format_version() >= 5) {
    j["nope_layers"] = nope_layers;
    j["attention_chunk"] = attention_chunk;
    j["chunked_layers"] = chunked_layers;
    j["attn_temperature_floor"] = attn_temperature_floor;
    j["attn_temperature_scale"] = attn_temperature_scale;
    j["router_weight_on_input"] = router_weight_on_input;
  }
  if (format_version() >= 6) {
    j["linear_layers"] = linear_layers;
    j["linear_conv_kernel"] = linear_conv_kernel;
    j["linear_k_heads"] = linear_k_heads;
    j["linear_v_heads"] = linear_v_heads;
    j["linear_k_dim"] = linear_k_dim;
    j["linear_v_dim"] = linear_v_dim;
    j["attn_output_gate"] = attn_output_gate;
    j["linear_tiled_heads"] = linear_tiled_heads;
  }
  return j;
}

namespace {

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

// What `v` must be to hold a T exactly, or nullptr when it does.
template <typename T>
const char* mismatch(const json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean() ? nullptr : "true or false";
  } else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
    return v.is_number_unsigned() ? nullptr : "a whole number of 0 or more";
  } else if constexpr (std::is_integral_v<T>) {
    return v.is_number_integer() ? nullptr : "a whole number";
  } else if constexpr (std::is_floating_point_v<T>) {
    return v.is_number() ? nullptr : "a number";
  } else if constexpr (IsVector<T>::value) {
    if (!v.is_array()) return "a list";
    const bool all_fit =
        std::all_of(v.begin(), v.end(), [](const json& e) { return mismatch<typename T::value_type>(e) == nullptr; });
    if (all_fit) return nullptr;
    return std::is_integral_v<typename T::value_type> ? "a list of whole numbers" : "a list of the right type";
  } else {
    return nullptr;  // strings and the rest: nlohmann's own check
  }
}

// Typed field access with messages naming the field.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  [[nodiscard]] const Status& status() const { return status_; }

  template <typename T>
  T get(const char* key) {
    if (!status_) return T{};
    if (!j_.is_object() || !j_.contains(key)) {
      status_ = Status(StatusCode::corrupt_data, where_ + ": missing field \"" + key + "\"");
      return T{};
    }
    const json& v = j_.at(key);
    // nlohmann converts 2.5 to 2 and -1 to 2^64-1 without a word; a manifest with either is damaged.
    if (const char* want = mismatch<T>(v)) {
      status_ = Status(StatusCode::corrupt_data,
                       where_ + ": field \"" + key + "\" must be " + want + ", not " + v.dump().substr(0, 80));
      return T{};
    }
    try {
      return v.get<T>();
    } catch (const std::exception&) {
      status_ = Status(StatusCode::corrupt_data, where_ + ": field \"" + key + "\" has the wrong type");
      return T{};
    }
  }
  const json& raw(const char* key) {
    static const json null_json;
    if (!j_.is_object() || !j_.contains(key)) return null_json;
    return j_.at(key);
  }

 private:
  const json& j_;
  std::string where_;
  Status status_;
};

Status bad(const std::string& msg) {
  return Status(StatusCode::corrupt_data, msg);
}

// The hparams fields of manifest format 2 (gpt-oss).
const char* const kV2Fields[] = {"sliding_layers",    "attention_sinks", "router_bias",
                                 "expert_activation", "swiglu_alpha",    "swiglu_limit"};
// Format 3 (GLM-4.5's router, partial rotary).
const char* const kV3Fields[] = {"router_scoring", "router_selection_bias", "routed_scaling_factor", "rotary_dims",
                                 "rope_interleaved"};
// Format 4 (multi-head latent attention).
const char* const kV4Fields[] = {"q_lora_rank",   "kv_lora_rank",       "v_head_dim",
                                 "router_groups", "router_groups_used", "router_group_score"};
// Format 5 (Llama 4).
const char* const kV5Fields[] = {
    "nope_layers",           "attention_chunk", "chunked_layers", "attn_temperature_floor", "attn_temperature_scale",
    "router_weight_on_input"};
// Format 6 (Qwen3-Next).
const char* const kV6Fields[] = {"linear_layers", "linear_conv_kernel", "linear_k_heads",  "linear_v_heads",
                                 "linear_k_dim",  "linear_v_dim",       "attn_output_gate"};

}  // namespace

sdk::Expected<HyperParams> HyperParams::from_json(const json& j) {
  Fields f(j, "manifest hparams");
  HyperParams h;
  h.architecture = f.get<std::string>("architecture");
  h.hf_architecture = f.get<std::string>("hf_architecture");
  h.vocab_size = f.get<std::int64_t>("vocab_size");
  h.hidden_size = f.get<std::int64_t>("hidden_size");
  h.num_layers = f.get<std::int64_t>("num_layers");
  h.num_heads = f.get<std::int64_t>("num_heads");
  h.num_kv_heads = f.get<std::int64_t>("num_kv_heads");
  h.head_dim = f.get<std::int64_t>("head_dim");
  h.max_position_embeddings = f.get<std::int64_t>("max_position_embeddings");
  h.rope_theta = f.get<double>("rope_theta");
  h.rope_scaling = f.raw("rope_scaling");
  h.rms_norm_eps = f.get<double>("rms_norm_eps");
  h.hidden_act = f.get<std::string>("hidden_act");
  h.sliding_window = f.get<std::int64_t>("sliding_window");
  h.tie_word_embeddings = f.get<bool>("tie_word_embeddings");
  h.attention_qkv_bias = f.get<bool>("attention_qkv_bias");
  h.attention_out_bias = f.get<bool>("attention_out_bias");
  h.qk_norm = f.get<std::string>("qk_norm");
  h.clip_qkv = f.get<double>("clip_qkv");
  h.dense = f.get<bool>("dense");
  h.n_experts = f.get<std::int64_t>("n_experts");
  h.n_experts_per_tok = f.get<std::int64_t>("n_experts_per_tok");
  h.norm_topk_prob = f.get<bool>("norm_topk_prob");
  h.intermediate_size = f.get<std::int64_t>("intermediate_size");
  h.moe_intermediate_size = f.get<std::int64_t>("moe_intermediate_size");
  h.shared_expert_intermediate_size = f.get<std::int64_t>("shared_expert_intermediate_size");
  h.shared_expert_gate = f.get<bool>("shared_expert_gate");
  h.decoder_sparse_step = f.get<std::int64_t>("decoder_sparse_step");
  h.mlp_only_layers = f.get<std::vector<std::int64_t>>("mlp_only_layers");
  h.bos_token_id = f.get<std::int64_t>("bos_token_id");
  h.eos_token_ids = f.get<std::vector<std::int64_t>>("eos_token_ids");
  // Format 2 (gpt-oss): one of its fields present asks for all of them (none is dropped silently).
  const bool v2_fields =
      std::any_of(std::begin(kV2Fields), std::end(kV2Fields), [&f](const char* key) { return !f.raw(key).is_null(); });
  if (v2_fields) {
    h.sliding_layers = f.get<std::vector<std::int64_t>>("sliding_layers");
    h.attention_sinks = f.get<bool>("attention_sinks");
    h.router_bias = f.get<bool>("router_bias");
    h.expert_activation = f.get<std::string>("expert_activation");
    h.swiglu_alpha = f.get<double>("swiglu_alpha");
    h.swiglu_limit = f.get<double>("swiglu_limit");
  }
  const bool v3_fields =
      std::any_of(std::begin(kV3Fields), std::end(kV3Fields), [&f](const char* key) { return !f.raw(key).is_null(); });
  if (v3_fields) {
    h.router_scoring = f.get<std::string>("router_scoring");
    h.router_selection_bias = f.get<bool>("router_selection_bias");
    h.routed_scaling_factor = f.get<double>("routed_scaling_factor");
    h.rotary_dims = f.get<std::int64_t>("rotary_dims");
    h.rope_interleaved = f.get<bool>("rope_interleaved");
  }
  const bool v4_fields =
      std::any_of(std::begin(kV4Fields), std::end(kV4Fields), [&f](const char* key) { return !f.raw(key).is_null(); });
  if (v4_fields) {
    h.q_lora_rank = f.get<std::int64_t>("q_lora_rank");
    h.kv_lora_rank = f.get<std::int64_t>("kv_lora_rank");
    h.v_head_dim = f.get<std::int64_t>("v_head_dim");
    h.router_groups = f.get<std::int64_t>("router_groups");
    h.router_groups_used = f.get<std::int64_t>("router_groups_used");
    h.router_group_score = f.get<std::string>("router_group_score");
  }
  const bool v5_fields =
      std::any_of(std::begin(kV5Fields), std::end(kV5Fields), [&f](const char* key) { return !f.raw(key).is_null(); });
  if (v5_fields) {
    h.nope_layers = f.get<std::vector<std::int64_t>>("nope_layers");
    h.attention_chunk = f.get<std::int64_t>("attention_chunk");
    h.chunked_layers = f.get<std::vector<std::int64_t>>("chunked_layers");
    h.attn_temperature_floor = f.get<double>("attn_temperature_floor");
    h.attn_temperature_scale = f.get<double>("attn_temperature_scale");
    h.router_weight_on_input = f.get<bool>("router_weight_on_input");
  }
  const bool v6_fields =
      std::any_of(std::begin(kV6Fields), std::end(kV6Fields), [&f](const char* key) { return !f.raw(key).is_null(); });
  if (v6_fields) {
    h.linear_layers = f.get<std::vector<std::int64_t>>("linear_layers");
    h.linear_conv_kernel = f.get<std::int64_t>("linear_conv_kernel");
    h.linear_k_heads = f.get<std::int64_t>("linear_k_heads");
    h.linear_v_heads = f.get<std::int64_t>("linear_v_heads");
    h.linear_k_dim = f.get<std::int64_t>("linear_k_dim");
    h.linear_v_dim = f.get<std::int64_t>("linear_v_dim");
    h.attn_output_gate = f.get<bool>("attn_output_gate");
    // Added within format 6 (Qwen3.5): absent, the grouped order of the models written before it.
    if (!f.raw("linear_tiled_heads").is_null()) h.linear_tiled_heads = f.get<bool>("linear_tiled_heads");
  }
  if (!f.status()) return f.status();
  if (auto s = h.validate(); !s) return bad(s.message() + " (in hparams); re-run convert");
  return h;
}

namespace {

// Caps well above any real model (largest today: ~128 layers, 512 experts, hidden 16k, 10M context) that keep
// everything sized by them (the conversion plan, the expert index, per-layer loops) small: a corrupt or
// hostile count fails here, before any allocation or loop, instead of exhausting memory or time.
constexpr std::int64_t kMaxLayers = 4096;
constexpr std::int64_t kMaxExperts = 65535;           // per layer (expert ids are packed into 16 bits)
constexpr std::int64_t kMaxExpertsTotal = 1ll << 17;  // layers x experts: one file and three index entries each
constexpr std::int64_t kMaxDim = 1ll << 20;           // hidden, FFN and attention widths
constexpr std::int64_t kMaxHeads = 1ll << 16;
constexpr std::int64_t kMaxContext = 1ll << 30;  // max_position_embeddings, rope original context

std::string range_text(std::int64_t lo, std::int64_t hi) {
  return std::to_string(lo) + ".." + std::to_string(hi);
}

// rope_scaling: numbers the rope code divides by or takes logs of must be finite and in range, else the run
// produces NaN logits far from the cause.
Status validate_rope_scaling(const json& rs) {
  auto need = [](bool ok, const std::string& what) {
    return ok ? Status{} : bad("hyper-parameter rope_scaling." + what);
  };
  if (rs.is_null()) return {};
  if (!rs.is_object()) return bad("hyper-parameter rope_scaling must be an object or null");
  for (const char* key : {"rope_type", "type"}) {
    if (rs.contains(key) && !rs[key].is_null() && !rs[key].is_string()) {
      return need(false, std::string(key) + " must be a string such as \"linear\", \"llama3\" or \"yarn\"");
    }
  }
  for (const char* key : {"rope_type", "type"}) {
    if (!rs.contains(key) || !rs[key].is_string()) continue;
    const std::string type = rs[key].get<std::string>();
    if (!is_supported_rope_type(type)) {
      return need(false, std::string(key) + " '" + type + "' is not supported (supported: " + rope_types_text() + ")");
    }
    break;  // rope_type wins over the older "type", as in transformers
  }
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
                          "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"}) {
    if (!rs.contains(key) || rs[key].is_null()) continue;
    const json& v = rs[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      return need(false, std::string(key) + " is " + (v.is_number() ? "not finite" : v.dump()) +
                             "; it must be a finite number");
    }
  }
  if (rs.contains("factors")) {
    const json& f = rs["factors"];
    if (!f.is_array() || f.empty() || f.size() > 65536) return need(false, "factors must be a non-empty array");
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (!f[i].is_number() || !std::isfinite(f[i].get<double>()) || f[i].get<double>() <= 0) {
        return need(false, "factors[" + std::to_string(i) + "] is " + f[i].dump() + "; it must be a number > 0");
      }
    }
  }
  auto positive = [&](const char* key) -> Status {
    if (!rs.contains(key) || rs[key].is_null() || rs[key].get<double>() > 0) return {};
    return need(false, std::string(key) + " is " + rs[key].dump() + "; it must be > 0");
  };
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "attention_factor"}) {
    if (auto s = positive(key); !s) return s;
  }
  // yarn's mscale enters 0.1 * mscale * ln(factor) + 1, squared in DeepSeek's softmax scale: a negative or huge one
  // (real models: 0.707 to 1) flips or overflows every score.
  for (const char* key : {"mscale", "mscale_all_dim"}) {
    if (!rs.contains(key) || rs[key].is_null()) continue;
    const double m = rs[key].get<double>();
    if (auto s = need(m >= 0 && m <= 100, std::string(key) + " is " + rs[key].dump() + "; it must be in 0..100"); !s)
      return s;
  }
  if (rs.contains("original_max_position_embeddings") && !rs["original_max_position_embeddings"].is_null()) {
    const double o = rs["original_max_position_embeddings"].get<double>();
    if (auto s = need(o >= 1 && o <= static_cast<double>(kMaxContext),
                      "original_max_position_embeddings is " + rs["original_max_position_embeddings"].dump() +
                          "; it must be in " + range_text(1, kMaxContext));
        !s)
      return s;
  }
  return {};
}

}  // namespace

bool is_supported_rope_type(const std::string& type) {
  return std::find(std::begin(kRopeTypes), std::end(kRopeTypes), type) != std::end(kRopeTypes);
}

std::string rope_types_text() {
  std::string text;
  for (const char* t : kRopeTypes) text += (text.empty() ? "" : ", ") + std::string(t);
  return text;
}

Status HyperParams::validate() const {
  auto need = [](bool ok, const std::string& what) { return ok ? Status{} : bad("hyper-parameter " + what); };
  // "key is N; it must be in lo..hi" for the count and size fields.
  auto in_range = [&](std::int64_t v, std::int64_t lo, std::int64_t hi, const std::string& key) {
    return need(v >= lo && v <= hi, key + " is " + std::to_string(v) + "; it must be in " + range_text(lo, hi));
  };
  // Counts first: the checks below loop over the layers.
  if (auto s = in_range(num_layers, 1, kMaxLayers, "num_layers (config num_hidden_layers, GGUF block_count)"); !s)
    return s;
  if (auto s = in_range(vocab_size, 1, (1ll << 31) - 1, "vocab_size"); !s) return s;
  if (auto s = in_range(hidden_size, 1, kMaxDim, "hidden_size"); !s) return s;
  // An end id outside the vocabulary is never sampled: every answer would run to max_tokens.
  for (const std::int64_t e : eos_token_ids) {
    if (auto s = need(e >= 0 && e < vocab_size, "eos_token_id " + std::to_string(e) +
                                                    " is outside the vocabulary (vocab_size " +
                                                    std::to_string(vocab_size) + ")");
        !s)
      return s;
  }
  if (auto s = need(bos_token_id >= -1 && bos_token_id < vocab_size, "bos_token_id " + std::to_string(bos_token_id) +
                                                                         " is outside the vocabulary (vocab_size " +
                                                                         std::to_string(vocab_size) + ")");
      !s)
    return s;
  if (auto s = in_range(num_heads, 1, kMaxHeads, "num_heads"); !s) return s;
  if (auto s = need(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
      !s)
    return s;
  if (auto s = need(head_dim > 0 && head_dim % 2 == 0 && head_dim <= kMaxDim, "head_dim must be positive and even"); !s)
    return s;
  if (auto s = in_range(num_heads * head_dim, 1, kMaxDim, "num_heads x head_dim"); !s) return s;
  if (auto s = in_range(max_position_embeddings, 1, kMaxContext, "max_position_embeddings"); !s) return s;
  if (auto s = need(rms_norm_eps > 0 && std::isfinite(rms_norm_eps), "rms_norm_eps must be positive"); !s) return s;
  // Real models use 1e4..1e8; at 1 or below the frequencies stop falling and yarn's log(theta) is 0 or negative.
  if (auto s = need(rope_theta > 1 && rope_theta <= 1e12,
                    "rope_theta is " + json(rope_theta).dump() + "; it must be above 1 and at most 1e12");
      !s)
    return s;
  if (auto s = validate_rope_scaling(rope_scaling); !s) return s;
  // 0 is off (HF's null); a negative bound would be read as off too, silently.
  if (auto s = need(clip_qkv >= 0 && std::isfinite(clip_qkv),
                    "clip_qkv is " + json(clip_qkv).dump() + "; it must be 0 (off) or a positive bound");
      !s)
    return s;
  if (auto s = need(qk_norm == "none" || qk_norm == "per_head" || qk_norm == "full" || qk_norm == "l2" ||
                        qk_norm == "per_head_after_rope",
                    "qk_norm must be none, per_head, full, l2 or per_head_after_rope");
      !s)
    return s;
  if (auto s = need(hidden_act == "silu", "hidden_act '" + hidden_act + "' is not supported (silu only)"); !s) return s;
  if (auto s =
          need(sliding_window >= 0 && decoder_sparse_step >= 1, "sliding_window / decoder_sparse_step out of range");
      !s)
    return s;
  if (auto s = need(std::all_of(sliding_layers.begin(), sliding_layers.end(),
                                [&](std::int64_t l) { return l >= 0 && l < num_layers; }),
                    "sliding_layers lists a layer outside 0..num_layers-1");
      !s)
    return s;
  const auto layers_in_range = [&](const std::vector<std::int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [&](std::int64_t l) { return l >= 0 && l < num_layers; });
  };
  if (auto s = need(layers_in_range(nope_layers) && layers_in_range(chunked_layers),
                    "nope_layers / chunked_layers list a layer outside 0..num_layers-1");
      !s)
    return s;
  if (auto s = in_range(attention_chunk, 0, kMaxContext, "attention_chunk"); !s) return s;
  if (!linear_layers.empty()) {
    if (auto s = need(layers_in_range(linear_layers) && static_cast<std::int64_t>(linear_layers.size()) < num_layers,
                      "linear_layers lists a layer outside 0..num_layers-1, or every layer");
        !s)
      return s;
    if (auto s = in_range(linear_conv_kernel, 2, 64, "linear_conv_kernel (config linear_conv_kernel_dim)"); !s)
      return s;
    if (auto s = in_range(linear_k_heads, 1, kMaxHeads, "linear_k_heads (config linear_num_key_heads)"); !s) return s;
    if (auto s = in_range(linear_v_heads, 1, kMaxHeads, "linear_v_heads (config linear_num_value_heads)"); !s) return s;
    if (auto s = need(linear_v_heads % linear_k_heads == 0,
                      "linear_v_heads (config linear_num_value_heads) must be a multiple of linear_k_heads "
                      "(linear_num_key_heads)");
        !s)
      return s;
    if (auto s = in_range(linear_k_dim, 1, 1024, "linear_k_dim (config linear_key_head_dim)"); !s) return s;
    if (auto s = in_range(linear_v_dim, 1, 1024, "linear_v_dim (config linear_value_head_dim)"); !s) return s;
    if (auto s = need(sliding_window == 0 && attention_chunk == 0 && !mla(),
                      "linear_layers excludes sliding windows, chunked and latent attention");
        !s)
      return s;
  }
  if (auto s = need(chunked_layers.empty() || attention_chunk > 0, "chunked_layers needs attention_chunk > 0"); !s)
    return s;
  // A chunked layer with a sliding window too would need both rules in one attention call.
  if (auto s =
          need(chunked_layers.empty() || sliding_window == 0, "attention_chunk and sliding_window exclude each other");
      !s)
    return s;
  if (auto s = need(
          attn_temperature_floor >= 0 && std::isfinite(attn_temperature_floor) && std::isfinite(attn_temperature_scale),
          "attn_temperature_floor must be 0 (off) or positive, and attn_temperature_scale finite");
      !s)
    return s;
  // The weight scales the one expert's input: with several a token, each would need its own input.
  if (auto s = need(!router_weight_on_input || n_experts_per_tok == 1,
                    "router_weight_on_input needs one expert a token (n_experts_per_tok " +
                        std::to_string(n_experts_per_tok) + ")");
      !s)
    return s;
  if (auto s = need(expert_activation == "swiglu" || expert_activation == "swiglu_clamped",
                    "expert_activation '" + expert_activation + "' is not supported (swiglu, swiglu_clamped)");
      !s)
    return s;
  if (auto s = need(std::isfinite(swiglu_alpha) && swiglu_limit > 0 && std::isfinite(swiglu_limit),
                    "swiglu_alpha must be finite and swiglu_limit positive and finite");
      !s)
    return s;
  if (auto s = need(router_scoring == "softmax" || router_scoring == "sigmoid",
                    "router_scoring '" + router_scoring + "' is not supported (softmax, sigmoid)");
      !s)
    return s;
  // A factor of 0 or below silences or flips every expert; HF's models use 1 to 16 (DeepSeek-V2).
  if (auto s = need(routed_scaling_factor > 0 && routed_scaling_factor <= 1000,
                    "routed_scaling_factor is " + json(routed_scaling_factor).dump() + "; it must be in (0, 1000]");
      !s)
    return s;
  if (auto s = need(rotary_dims >= 0 && rotary_dims <= head_dim && rotary_dims % 2 == 0,
                    "rotary_dims is " + std::to_string(rotary_dims) + "; it must be even and in 0..head_dim (" +
                        std::to_string(head_dim) + ")");
      !s)
    return s;
  if (kv_lora_rank != 0 || q_lora_rank != 0 || v_head_dim != 0) {
    if (auto s = in_range(kv_lora_rank, 1, kMaxDim, "kv_lora_rank"); !s) return s;
    if (auto s = in_range(q_lora_rank, 0, kMaxDim, "q_lora_rank"); !s) return s;
    if (auto s = in_range(v_head_dim, 1, kMaxDim, "v_head_dim"); !s) return s;
    if (auto s = in_range(num_heads * v_head_dim, 1, kMaxDim, "num_heads x v_head_dim"); !s) return s;
    // Every head has a RoPE part and a part without (DeepSeek: 64 and 128).
    if (auto s = need(rotary_dims > 0 && rotary_dims < head_dim,
                      "rotary_dims (qk_rope_head_dim) is " + std::to_string(rotary_dims) +
                          "; multi-head latent attention needs it in 2..head_dim - 2 (head_dim " +
                          std::to_string(head_dim) + " = qk_nope_head_dim + qk_rope_head_dim)");
        !s)
      return s;
  }
  if (router_groups != 0 || router_groups_used != 0) {
    // Each group holds as many experts, two at least where its score is the sum of its best two.
    const std::int64_t per_group = router_groups > 0 ? n_experts / router_groups : 0;
    if (auto s = need(
            router_groups > 1 && n_experts % router_groups == 0 && per_group >= (router_group_score == "max" ? 1 : 2),
            "router_groups is " + std::to_string(router_groups) + "; it must divide n_experts (" +
                std::to_string(n_experts) + ") into groups of " +
                (router_group_score == "max" ? "one expert" : "two experts") + " or more");
        !s)
      return s;
    if (auto s = need(router_groups_used >= 1 && router_groups_used <= router_groups &&
                          n_experts_per_tok <= router_groups_used * per_group,
                      "router_groups_used is " + std::to_string(router_groups_used) + "; it must be in 1.." +
                          std::to_string(router_groups) + " and its groups must hold n_experts_per_tok (" +
                          std::to_string(n_experts_per_tok) + ") experts");
        !s)
      return s;
    if (auto s = need(router_group_score == "top2_sum" || router_group_score == "max",
                      "router_group_score '" + router_group_score + "' is not supported (top2_sum, max)");
        !s)
      return s;
  }
  if (auto s = need(mlp_only_layers.size() <= static_cast<std::size_t>(num_layers),
                    "mlp_only_layers lists more layers than num_layers");
      !s)
    return s;
  if (dense) {
    if (auto s = in_range(intermediate_size, 1, kMaxDim, "intermediate_size"); !s) return s;
  } else {
    if (auto s = in_range(n_experts, 1, kMaxExperts, "n_experts (config num_local_experts / num_experts)"); !s)
      return s;
    if (auto s = in_range(num_layers * n_experts, 1, kMaxExpertsTotal, "num_layers x n_experts"); !s) return s;
    if (auto s =
            need(n_experts_per_tok > 0 && n_experts_per_tok <= n_experts, "n_experts_per_tok must be in 1..n_experts");
        !s)
      return s;
    if (auto s = in_range(moe_intermediate_size, 1, kMaxDim, "moe_intermediate_size"); !s) return s;
    for (std::int64_t l = 0; l < num_layers; ++l) {
      if (!layer_is_sparse(l)) {
        if (auto s = in_range(intermediate_size, 1, kMaxDim, "intermediate_size (of the dense layers)"); !s) return s;
        break;
      }
    }
  }
  if (auto s = in_range(shared_expert_intermediate_size, 0, kMaxDim, "shared_expert_intermediate_size"); !s) return s;
  return {};
}

const TensorEntry* Manifest::tensor(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const ExpertEntry* Manifest::expert(std::int64_t layer, std::int64_t e) const {
  auto it =
      std::lower_bound(experts.begin(), experts.end(), std::make_pair(layer, e),
                       [](const ExpertEntry& x, const auto& key) { return std::make_pair(x.layer, x.expert) < key; });
  if (it == experts.end() || it->layer != layer || it->expert != e) return nullptr;
  return &*it;
}

const FileEntry* Manifest::file(const std::string& path) const {
  for (const auto& f : files) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

namespace {

std::uint64_t elements(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

}  // namespace

std::uint64_t Manifest::resident_bytes() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors) n += t.size;
  return n;
}

std::uint64_t Manifest::expert_bytes() const {
  std::uint64_t n = 0;
  for (const auto& e : experts) n += e.size;
  return n;
}

std::uint64_t Manifest::total_params() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors) n += elements(t.shape);
  for (const auto& e : experts) {
    for (const auto* part : e.parts()) n += elements(part->shape);
  }
  return n;
}

std::uint64_t Manifest::active_params() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors) n += elements(t.shape);
  for (std::int64_t l = 0; l < hparams.num_layers; ++l) {
    const auto* e = expert(l, 0);
    if (e == nullptr) continue;
    n += static_cast<std::uint64_t>(hparams.layer_top_k(l)) *
         (elements(e->gate.shape) + elements(e->up.shape) + elements(e->down.shape));
  }
  return n;
}

std::uint64_t Manifest::bytes_per_token_all_miss() const {
  std::uint64_t n = 0;
  for (std::int64_t l = 0; l < hparams.num_layers; ++l) {
    const auto* e = expert(l, 0);
    if (e != nullptr) n += static_cast<std::uint64_t>(hparams.layer_top_k(l)) * e->size;
  }
  return n;
}

namespace {

json tensor_json(const TensorEntry& t, bool with_file) {
  json j;
  j["name"] = t.name;
  if (with_file) j["file"] = t.file;
  j["offset"] = t.offset;
  j["size"] = t.size;
  j["type"] = std::string(sdk::to_string(t.type));
  j["shape"] = t.shape;
  j["xxh64"] = io::hex64(t.checksum);
  return j;
}

Status parse_tensor(const json& j, TensorEntry& t, const std::string& where, const std::string& file) {
  Fields f(j, where);
  t.name = f.get<std::string>("name");
  t.file = file.empty() ? f.get<std::string>("file") : file;
  t.offset = f.get<std::uint64_t>("offset");
  t.size = f.get<std::uint64_t>("size");
  auto type = f.get<std::string>("type");
  t.shape = f.get<std::vector<std::int64_t>>("shape");
  auto sum = f.get<std::string>("xxh64");
  if (!f.status()) return f.status();
  auto dt = sdk::parse_dtype(type);
  if (!dt) return bad(where + ": unknown type '" + type + "'");
  t.type = *dt;
  if (!io::parse_hex64(sum, t.checksum)) return bad(where + ": xxh64 '" + sum + "' is not 16 hex digits");
  if (t.shape.empty() || t.shape.size() > 4) return bad(where + ": shape must have 1 to 4 dimensions");
  for (auto d : t.shape) {
    if (d <= 0 || d > (1ll << 40)) return bad(where + ": shape has a dimension of " + std::to_string(d));
  }
  std::uint64_t rows = elements(t.shape) / static_cast<std::uint64_t>(t.shape.back());
  std::size_t row = sdk::row_bytes(t.type, t.shape.back());
  if (row == 0) {
    return bad(where + ": rows of " + std::to_string(t.shape.back()) + " elements do not fit " + type + " blocks");
  }
  if (row * rows != t.size) {
    return bad(where + ": size " + std::to_string(t.size) + " does not match " + type + " of this shape (" +
               std::to_string(row * rows) + " bytes)");
  }
  return {};
}

bool safe_relative(const std::string& p) {
  if (p.empty() || p.front() == '/') return false;
  fs::path path(p);
  for (const auto& part : path) {
    if (part == ".." || part == ".") return false;
  }
  return true;
}

}  // namespace

json Manifest::to_json() const {
  json j;
  j["format"] = kManifestFormatName;
  j["format_version"] = hparams.format_version();
  j["architecture"] = hparams.architecture;
  j["hparams"] = hparams.to_json();
  j["source"] = source;
  j["quantization"] = quantization;
  j["tokenizer"] = tokenizer;
  j["tokenizer"]["files"] = tokenizer_files;
  json files_j = json::array();
  for (const auto& f : files) files_j.push_back({{"path", f.path}, {"size", f.size}, {"xxh64", io::hex64(f.checksum)}});
  j["files"] = files_j;
  json tensors_j = json::array();
  for (const auto& t : tensors) tensors_j.push_back(tensor_json(t, true));
  j["tensors"] = tensors_j;
  json experts_j = json::array();
  for (const auto& e : experts) {
    experts_j.push_back({{"layer", e.layer},
                         {"expert", e.expert},
                         {"file", e.file},
                         {"offset", e.offset},
                         {"size", e.size},
                         {"gate", tensor_json(e.gate, false)},
                         {"up", tensor_json(e.up, false)},
                         {"down", tensor_json(e.down, false)}});
    if (e.has_bias()) {
      experts_j.back()["gate_bias"] = tensor_json(e.gate_bias, false);
      experts_j.back()["up_bias"] = tensor_json(e.up_bias, false);
      experts_j.back()["down_bias"] = tensor_json(e.down_bias, false);
    }
  }
  j["experts"] = experts_j;
  return j;
}

sdk::Expected<Manifest> parse_manifest(const json& j, const std::string& where) {
  if (!j.is_object()) return bad(where + ": not a JSON object");
  Fields f(j, where);
  auto format = f.get<std::string>("format");
  auto version = f.get<int>("format_version");
  if (!f.status()) return f.status();
  if (format != kManifestFormatName) return bad(where + ": format is '" + format + "', not a colibri model");
  if (version < 1 || version > kManifestFormatVersion) {
    return bad(where + ": format_version " + std::to_string(version) + " is not supported (this colibri reads " +
               "1 to " + std::to_string(kManifestFormatVersion) + "); re-run convert with this colibri");
  }
  Manifest m;
  m.format_version = version;
  auto hp = HyperParams::from_json(f.raw("hparams"));
  if (!hp) return hp.error().with_context(where);
  m.hparams = std::move(*hp);
  m.source = f.raw("source");
  m.quantization = f.raw("quantization");
  m.tokenizer = f.raw("tokenizer");
  if (m.tokenizer.is_object() && m.tokenizer.contains("files")) {
    try {
      m.tokenizer_files = m.tokenizer["files"].get<std::vector<std::string>>();
    } catch (const std::exception&) {
      return bad(where + ": tokenizer.files must be a list of file names");
    }
  }
  for (const auto& t : m.tokenizer_files) {
    if (!safe_relative(t)) return bad(where + ": tokenizer file '" + t + "' is not a path inside the model");
  }
  const json& files = f.raw("files");
  const json& tensors = f.raw("tensors");
  const json& experts = f.raw("experts");
  if (!files.is_array() || !tensors.is_array() || !experts.is_array()) {
    return bad(where + ": files, tensors and experts must be arrays");
  }
  std::set<std::string> file_set;
  for (std::size_t i = 0; i < files.size(); ++i) {
    Fields ff(files[i], where + " files[" + std::to_string(i) + "]");
    FileEntry fe;
    fe.path = ff.get<std::string>("path");
    fe.size = ff.get<std::uint64_t>("size");
    auto sum = ff.get<std::string>("xxh64");
    if (!ff.status()) return ff.status();
    if (!safe_relative(fe.path)) return bad(where + ": file '" + fe.path + "' is not a path inside the model");
    if (!io::parse_hex64(sum, fe.checksum)) return bad(where + ": file '" + fe.path + "' has a bad xxh64");
    if (!file_set.insert(fe.path).second) return bad(where + ": file '" + fe.path + "' listed twice");
    m.files.push_back(fe);
  }
  auto within = [&](const TensorEntry& t, const std::string& what) -> Status {
    const auto* fe = m.file(t.file);
    if (fe == nullptr) return bad(where + ": " + what + " is in '" + t.file + "', which is not in the file list");
    if (t.offset > fe->size || t.size > fe->size - t.offset) {
      return bad(where + ": " + what + " [" + std::to_string(t.offset) + ", +" + std::to_string(t.size) +
                 ") lies outside " + t.file + " (" + std::to_string(fe->size) + " bytes)");
    }
    return {};
  };
  // A tensor's data is used where it lies in its buffer (shared.bin read whole, an expert blob read into a slot,
  // both aligned), so its offset there must suit its type; convert aligns every tensor to 256 bytes or more.
  auto aligned = [&](const TensorEntry& t, std::uint64_t in_buffer, const std::string& what) -> Status {
    const std::size_t need = sdk::data_alignment(t.type);
    if (in_buffer % need == 0) return {};
    return bad(where + ": " + what + " starts at offset " + std::to_string(t.offset) + " of " + t.file + ", which " +
               std::string(sdk::to_string(t.type)) + " data cannot start at (it needs a multiple of " +
               std::to_string(need) + (in_buffer == t.offset ? "" : " from its blob's start") + "); re-run convert");
  };
  std::set<std::string> names;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    TensorEntry t;
    if (auto s = parse_tensor(tensors[i], t, where + " tensors[" + std::to_string(i) + "]", ""); !s) return s;
    if (auto s = within(t, "tensor '" + t.name + "'"); !s) return s;
    if (auto s = aligned(t, t.offset, "tensor '" + t.name + "'"); !s) return s;
    if (!names.insert(t.name).second) return bad(where + ": tensor '" + t.name + "' listed twice");
    m.tensors.push_back(std::move(t));
  }
  for (std::size_t i = 0; i < experts.size(); ++i) {
    const std::string ew = where + " experts[" + std::to_string(i) + "]";
    Fields ef(experts[i], ew);
    ExpertEntry e;
    e.layer = ef.get<std::int64_t>("layer");
    e.expert = ef.get<std::int64_t>("expert");
    e.file = ef.get<std::string>("file");
    e.offset = ef.get<std::uint64_t>("offset");
    e.size = ef.get<std::uint64_t>("size");
    if (!ef.status()) return ef.status();
    const std::string name = "L" + std::to_string(e.layer) + "/E" + std::to_string(e.expert);
    if (auto s = parse_tensor(ef.raw("gate"), e.gate, ew + ".gate", e.file); !s) return s;
    if (auto s = parse_tensor(ef.raw("up"), e.up, ew + ".up", e.file); !s) return s;
    if (auto s = parse_tensor(ef.raw("down"), e.down, ew + ".down", e.file); !s) return s;
    if (m.hparams.expert_bias()) {
      if (auto s = parse_tensor(ef.raw("gate_bias"), e.gate_bias, ew + ".gate_bias", e.file); !s) return s;
      if (auto s = parse_tensor(ef.raw("up_bias"), e.up_bias, ew + ".up_bias", e.file); !s) return s;
      if (auto s = parse_tensor(ef.raw("down_bias"), e.down_bias, ew + ".down_bias", e.file); !s) return s;
    }
    TensorEntry blob;
    blob.file = e.file;
    blob.offset = e.offset;
    blob.size = e.size;
    if (auto s = within(blob, "expert " + name); !s) return s;
    // Written without offset + size: a huge offset would wrap and pass, and the run would read out of bounds.
    static const char* const kLabels[] = {"gate", "up", "down", "gate_bias", "up_bias", "down_bias"};
    const auto parts = e.parts();
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const TensorEntry* part = parts[i];
      const std::string label = kLabels[i];
      if (part->offset < e.offset || part->size > e.size || part->offset - e.offset > e.size - part->size) {
        return bad(ew + "." + label + ": part [" + std::to_string(part->offset) + ", +" + std::to_string(part->size) +
                   ") of expert " + name + " lies outside its blob [" + std::to_string(e.offset) + ", +" +
                   std::to_string(e.size) + ") in " + e.file + "; re-run convert");
      }
      if (auto s = aligned(*part, part->offset - e.offset, "expert " + name + " " + label); !s) return s;
    }
    m.experts.push_back(std::move(e));
  }
  std::sort(m.experts.begin(), m.experts.end(), [](const ExpertEntry& a, const ExpertEntry& b) {
    return std::tie(a.layer, a.expert) < std::tie(b.layer, b.expert);
  });
  // Every layer has exactly its experts, each once.
  std::size_t idx = 0;
  for (std::int64_t l = 0; l < m.hparams.num_layers; ++l) {
    for (std::int64_t e = 0; e < m.hparams.layer_experts(l); ++e, ++idx) {
      if (idx >= m.experts.size() || m.experts[idx].layer != l || m.experts[idx].expert != e) {
        return bad(where + ": expert L" + std::to_string(l) + "/E" + std::to_string(e) +
                   " is missing from the expert index; re-run convert");
      }
      const auto& ex = m.experts[idx];
      const std::int64_t ff = m.hparams.layer_ffn_size(l), hid = m.hparams.hidden_size;
      const bool bias_ok =
          !ex.has_bias() ||
          (ex.gate_bias.shape == std::vector<std::int64_t>{ff} && ex.up_bias.shape == std::vector<std::int64_t>{ff} &&
           ex.down_bias.shape == std::vector<std::int64_t>{hid} && ex.gate_bias.type == sdk::DType::f32 &&
           ex.up_bias.type == sdk::DType::f32 && ex.down_bias.type == sdk::DType::f32);
      if (ex.gate.shape != std::vector<std::int64_t>{ff, hid} || ex.up.shape != std::vector<std::int64_t>{ff, hid} ||
          ex.down.shape != std::vector<std::int64_t>{hid, ff} || !bias_ok) {
        return bad(where + ": expert L" + std::to_string(l) + "/E" + std::to_string(e) +
                   " has shapes that do not match the hyper-parameters");
      }
    }
  }
  if (idx != m.experts.size()) return bad(where + ": the expert index lists experts the hyper-parameters do not have");
  // Every shared tensor the hyper-parameters call for (convert's plan), with the shape they imply: an edited
  // hparams entry is caught here, so verify refuses what a run would.
  auto shape_text = [](const std::vector<std::int64_t>& shape) {
    std::string t = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
    return t + "]";
  };
  auto planned = build_plan(m.hparams).shared;
  if (m.hparams.tie_word_embeddings && m.tensor("output.weight") != nullptr) {
    PlannedTensor output;
    output.name = "output.weight";
    output.shape = {m.hparams.vocab_size, m.hparams.hidden_size};
    planned.push_back(std::move(output));
  }
  for (const auto& want : planned) {
    const TensorEntry* t = m.tensor(want.name);
    if (t == nullptr) return bad(where + ": tensor '" + want.name + "' is missing; re-run convert");
    if (t->shape != want.shape) {
      return bad(where + ": tensor '" + want.name + "' has shape " + shape_text(t->shape) +
                 " but the hyper-parameters imply " + shape_text(want.shape) +
                 "; the manifest was edited or is damaged: re-run convert");
    }
  }
  return m;
}

std::string manifest_identity(std::string_view text) {
  return io::hex64(XXH64(text.data(), text.size(), 0));
}

sdk::Expected<Manifest> load_manifest(const fs::path& dir) {
  return load_manifest(dir, {});
}

sdk::Expected<Manifest> load_manifest(const fs::path& dir, const std::vector<fs::path>& mirrors) {
  const fs::path path = dir / "manifest.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status(StatusCode::not_found, io::path_text(dir) + " is not a model directory");
  auto text = io::read_text(path);
  if (!text && text.error().code() == StatusCode::corrupt_data) return bad(text.error().message() + "; re-run convert");
  if (!text && fs::is_regular_file(dir / "config.json", ec)) {
    return Status(StatusCode::not_found, io::path_text(dir) +
                                             " is a HuggingFace checkpoint (config.json, no manifest.json); convert "
                                             "it first: colibri-cli convert -i " +
                                             io::path_text(dir) + " -o MODEL_DIR");
  }
  if (!text && text.error().code() != StatusCode::not_found) {
    return text.error();  // there, but the OS refused (limits, rights), or not a regular file
  }
  if (!text) {
    return Status(StatusCode::not_found, io::path_text(path) +
                                             " is missing: not a colibri model, or its conversion did not finish; "
                                             "re-run convert");
  }
  json j;
  try {
    j = json::parse(*text);
  } catch (const std::exception& e) {
    return bad(io::path_text(path) + ": not valid JSON (" + e.what() + "); re-run convert");
  }
  auto m = parse_manifest(j, io::path_text(path));
  if (!m) return m;
  m->identity = manifest_identity(*text);
  // Files present with their recorded sizes (a cheap check; verify_model hashes).
  for (const auto& fe : m->files) {
    struct stat st {};
    const fs::path p = dir / fe.path;
    const bool whole =
        ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) == fe.size;
    if (!whole) {
      bool mirrored = false;
      for (const auto& mirror : mirrors) {
        struct stat ms {};
        const fs::path mp = mirror / fe.path;
        if (::stat(mp.c_str(), &ms) == 0 && S_ISREG(ms.st_mode) && static_cast<std::uint64_t>(ms.st_size) == fe.size) {
          spdlog::warn("{}: {} is missing or damaged; its mirror {} serves it (copy it back)",
                       describe_model_file(*m, fe.path), io::path_text(p), io::path_text(mp));
          mirrored = true;
          break;
        }
      }
      if (mirrored) continue;
    }
    if (::stat(p.c_str(), &st) != 0) {
      return Status(StatusCode::corrupt_data,
                    describe_model_file(*m, fe.path) + ": file " + fe.path + missing_file_reason(p));
    }
    if (!S_ISREG(st.st_mode)) {
      return Status(StatusCode::corrupt_data, describe_model_file(*m, fe.path) + ": " + fe.path + " is " +
                                                  sdk::file_kind_text(st.st_mode) +
                                                  ", not a file; put the file back, or re-run convert");
    }
    if (static_cast<std::uint64_t>(st.st_size) != fe.size) {
      return Status(
          StatusCode::corrupt_data,
          describe_model_file(*m, fe.path) + ": file " + fe.path + " is " + std::to_string(st.st_size) +
              " bytes, expected " + std::to_string(fe.size) +
              (static_cast<std::uint64_t>(st.st_size) < fe.size ? " (truncated?)" : " (written to since convert?)") +
              "; re-run convert");
    }
    if (const auto why = unreadable_file_reason(p); !why.empty()) {
      return Status(StatusCode::io_error, describe_model_file(*m, fe.path) + ": file " + fe.path + why);
    }
  }
  for (const auto& t : m->tokenizer_files) {
    if (!fs::is_regular_file(dir / t, ec)) {
      const bool there = fs::exists(dir / t, ec);  // a directory, FIFO or device in its place: said so, not read
      return Status(StatusCode::corrupt_data, "tokenizer file " + t +
                                                  (there ? " in " + io::path_text(dir) + " is " +
                                                               sdk::path_kind_text((dir / t).string()) + ", not a file"
                                                         : " is missing from " + io::path_text(dir)) +
                                                  "; put the file back, or re-run convert");
    }
    if (auto s = check_tokenizer_file(*m, dir, t); !s) return s;
  }
  return m;
}

Status check_tokenizer_file(const Manifest& m, const fs::path& dir, const std::string& name) {
  // Manifests from before the checksums were recorded have none: nothing to compare.
  if (!m.tokenizer.is_object() || !m.tokenizer.contains("xxh64") || !m.tokenizer["xxh64"].is_object()) return {};
  const json& sums = m.tokenizer["xxh64"];
  if (!sums.contains(name)) return {};
  std::uint64_t want = 0;
  if (!sums[name].is_string() || !io::parse_hex64(sums[name].get<std::string>(), want)) {
    return Status(StatusCode::corrupt_data, "manifest.json tokenizer.xxh64." + name + " is not a 16-digit hex hash");
  }
  auto got = io::hash_file(dir / name);
  if (!got) return got.error();
  if (*got != want) {
    return Status(StatusCode::corrupt_data, "tokenizer: checksum mismatch in " + name +
                                                " (it changed since convert); restore it or re-run convert");
  }
  return {};
}

std::string checksum_fix(const std::string& storage) {
  if (storage.empty()) return "; re-run convert (colibri-cli inspect --verify lists every bad file)";
  return ", as read through storage plugin '" + storage +
         "'; colibri-cli inspect --verify reads the files directly: if it lists this one, restore it or re-run "
         "convert, else the storage plugin returned wrong bytes";
}

std::string describe_model_file(const Manifest& m, const std::string& path) {
  if (path == "shared.bin") return "shared";
  std::vector<const ExpertEntry*> in_file;
  for (const auto& e : m.experts) {
    if (e.file == path) in_file.push_back(&e);
  }
  if (in_file.empty()) return path;
  // Built by appending: GCC 12 warns (-Wrestrict, falsely) on "literal" + std::string chains here.
  std::string label("L");
  label.append(std::to_string(in_file[0]->layer));
  if (in_file.size() == 1) {
    label.append("/E").append(std::to_string(in_file[0]->expert));
  } else {
    label.append(" (").append(std::to_string(in_file.size())).append(" experts)");
  }
  return label;
}

}  // namespace colibri::model
