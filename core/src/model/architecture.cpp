#include "model/architecture.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

namespace colibri::model {

using nlohmann::json;
using sdk::Status;
using sdk::StatusCode;

const char* to_string(TensorKind k) {
  switch (k) {
    case TensorKind::embedding: return "embedding";
    case TensorKind::output: return "output";
    case TensorKind::norm: return "norm";
    case TensorKind::attn_q: return "attn_q";
    case TensorKind::attn_k: return "attn_k";
    case TensorKind::attn_v: return "attn_v";
    case TensorKind::attn_o: return "attn_output";
    case TensorKind::bias: return "bias";
    case TensorKind::router: return "router";
    case TensorKind::shared_expert_gate: return "shared_expert_gate";
    case TensorKind::shared_expert: return "shared_expert";
    case TensorKind::expert_gate: return "expert_gate";
    case TensorKind::expert_up: return "expert_up";
    case TensorKind::expert_down: return "expert_down";
  }
  return "?";
}

namespace {

const std::map<std::string, std::string>& hf_arch_map() {
  static const std::map<std::string, std::string> m{{"MixtralForCausalLM", "mixtral"},
                                                    {"Qwen2MoeForCausalLM", "qwen2_moe"},
                                                    {"Qwen3MoeForCausalLM", "qwen3_moe"},
                                                    {"OlmoeForCausalLM", "olmoe"},
                                                    {"LlamaForCausalLM", "llama"},
                                                    {"MistralForCausalLM", "mistral"},
                                                    {"GptOssForCausalLM", "gpt_oss"},
                                                    {"Glm4MoeForCausalLM", "glm4_moe"},
                                                    {"MiniMaxM2ForCausalLM", "minimax_m2"},
                                                    {"Ernie4_5_MoeForCausalLM", "ernie4_5_moe"},
                                                    {"DeepseekV2ForCausalLM", "deepseek_v2"},
                                                    {"DeepseekV3ForCausalLM", "deepseek_v3"},
                                                    // GLM-4.7-Flash: DeepSeek-V3's attention and GLM-4.5's router
                                                    {"Glm4MoeLiteForCausalLM", "deepseek_v3"},
                                                    {"Dots1ForCausalLM", "dots1"},
                                                    {"BailingMoeV2ForCausalLM", "bailing_moe_v2"},
                                                    {"HunYuanMoEV1ForCausalLM", "hunyuan_moe"},
                                                    {"Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe"},
                                                    {"Qwen3NextForCausalLM", "qwen3_next"},
                                                    {"Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"},
                                                    {"Qwen3_5ForConditionalGeneration", "qwen3_5"},
                                                    {"Llama4ForConditionalGeneration", "llama4"},
                                                    {"Llama4ForCausalLM", "llama4"}};
  return m;
}

// GGUF general.architecture -> colibri's name ("llama" is "mixtral" when it has experts).
const std::map<std::string, std::string>& gguf_arch_map() {
  static const std::map<std::string, std::string> m{{"bailingmoe2", "bailing_moe_v2"},
                                                    {"deepseek2", "deepseek_v2"},
                                                    {"dots1", "dots1"},
                                                    {"ernie4_5-moe", "ernie4_5_moe"},
                                                    {"glm4moe", "glm4_moe"},
                                                    {"hunyuan-moe", "hunyuan_moe"},
                                                    {"gpt-oss", "gpt_oss"},
                                                    {"llama", "llama"},
                                                    {"llama4", "llama4"},
                                                    {"minimax-m2", "minimax_m2"},
                                                    {"olmoe", "olmoe"},
                                                    {"qwen2moe", "qwen2_moe"},
                                                    {"qwen3moe", "qwen3_moe"},
                                                    {"qwen3vlmoe", "qwen3_vl_moe"},
                                                    {"qwen3next", "qwen3_next"},
                                                    {"qwen35moe", "qwen3_5_moe"},
                                                    {"qwen35", "qwen3_5"}};
  return m;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

Status bad_config(const std::string& where, const std::string& what) {
  return Status(StatusCode::invalid_argument, where + ": " + what);
}

Status bad_gguf_hparams(const std::string& where, const Status& s) {
  return Status(StatusCode::invalid_argument,
                where + ": metadata " + s.message() + "; the GGUF's metadata is damaged, re-export it");
}

// n shared experts of a routed expert's width, as one FFN. A width validate() will refuse (a damaged config) gives
// 0 here rather than an overflowing product.
std::int64_t shared_width(std::int64_t moe_width, std::int64_t n) {
  return moe_width > 0 && moe_width <= (std::int64_t{1} << 20) ? moe_width * n : 0;
}

// The dims a partial_rotary_factor rotates, as HF computes them (int(head_dim * factor)); 0 for a factor outside
// (0, 1], checked before the cast (1e300 would not fit an int64).
std::int64_t rotated_dims(std::int64_t head_dim, double factor) {
  return factor > 0 && factor <= 1 ? static_cast<std::int64_t>(static_cast<double>(head_dim) * factor) : 0;
}

}  // namespace

// transformers' layer_types: each layer "full_attention" or `kind` (gpt-oss's sliding, Llama 4's chunked layers);
// the layers of `kind` are appended to `out`.
static Status layers_of_type(const json& types, std::int64_t layers, const std::string& kind, const std::string& where,
                             std::vector<std::int64_t>& out) {
  if (!types.is_array() || static_cast<std::int64_t>(types.size()) != layers) {
    return bad_config(where, "layer_types must list one entry per layer (num_hidden_layers)");
  }
  for (std::size_t l = 0; l < types.size(); ++l) {
    const std::string t = types[l].is_string() ? types[l].get<std::string>() : types[l].dump().substr(0, 40);
    if (t == kind) {
      out.push_back(static_cast<std::int64_t>(l));
    } else if (t != "full_attention") {
      return bad_config(where, "layer_types[" + std::to_string(l) + "] is " + t + "; it must be \"" + kind +
                                   "\" or \"full_attention\"");
    }
  }
  return {};
}

// Llama 4's per-layer choices from its config (transformers' Llama4TextConfig and its defaults): which layers take
// RoPE (no_rope_layers: 1 = RoPE), which attend within chunks (layer_types, else the RoPE layers), which are MoE
// (moe_layers, else every interleave_moe_layer_step-th), and its query scaling on the others.
static Status llama4_layers(const json& c, const std::string& where, HyperParams& h) {
  const std::int64_t L = h.num_layers;
  if (L <= 0 || L > 4096) return {};  // validate() names the layer count
  const auto is_true = [](const json& v) { return v.is_boolean() ? v.get<bool>() : v.is_number() && v != 0; };
  const auto field = [&](const char* key) -> const json* {
    return c.contains(key) && !c[key].is_null() ? &c[key] : nullptr;
  };
  if (const json* b = field("attention_bias"); b != nullptr && is_true(*b)) {
    return Status(StatusCode::unsupported,
                  where + ": attention_bias=true is not supported; the released Llama 4 models have none");
  }
  h.rope_interleaved = true;  // transformers' complex form: pairs (2i, 2i + 1), the checkpoint's rows as they are
  h.router_scoring = "sigmoid";
  h.router_weight_on_input = true;
  const auto layer_list = [&](const char* key, const json& v, std::vector<std::int64_t>& out) -> Status {
    if (!v.is_array()) return bad_config(where, std::string(key) + " must list layer numbers");
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<std::int64_t>() < 0 || x.get<std::int64_t>() >= L) {
        return bad_config(where, std::string(key) + " lists " + x.dump().substr(0, 20) + "; layers are 0.." +
                                     std::to_string(L - 1) + "; fix it in config.json");
      }
      out.push_back(x.get<std::int64_t>());
    }
    return {};
  };
  std::vector<bool> rope(static_cast<std::size_t>(L));
  if (const json* v = field("no_rope_layers")) {
    if (!v->is_array() || static_cast<std::int64_t>(v->size()) != L ||
        !std::all_of(v->begin(), v->end(), [](const json& x) { return x == 0 || x == 1; })) {
      return bad_config(where, "no_rope_layers must hold one 0 or 1 per layer (num_hidden_layers " + std::to_string(L) +
                                   "; 1: the layer takes RoPE); fix it in config.json");
    }
    for (std::int64_t l = 0; l < L; ++l) rope[static_cast<std::size_t>(l)] = (*v)[static_cast<std::size_t>(l)] == 1;
  } else {
    const json* iv = field("no_rope_layer_interval");
    const std::int64_t every = iv != nullptr && iv->is_number_integer() ? iv->get<std::int64_t>() : 4;
    if (every < 1) return bad_config(where, "no_rope_layer_interval must be 1 or more; fix it in config.json");
    for (std::int64_t l = 0; l < L; ++l) rope[static_cast<std::size_t>(l)] = (l + 1) % every != 0;
  }
  for (std::int64_t l = 0; l < L; ++l) {
    if (!rope[static_cast<std::size_t>(l)]) h.nope_layers.push_back(l);
  }
  const json* chunk = field("attention_chunk_size");
  if (chunk != nullptr && (!chunk->is_number_integer() || chunk->get<std::int64_t>() < 1)) {
    return bad_config(where, "attention_chunk_size is " + chunk->dump().substr(0, 20) +
                                 "; it must be a whole number of 1 or more, or null; fix it in config.json");
  }
  h.attention_chunk = chunk != nullptr ? chunk->get<std::int64_t>() : 0;
  if (h.attention_chunk > 0) {
    if (const json* types = field("layer_types")) {
      if (auto s = layers_of_type(*types, L, "chunked_attention", where, h.chunked_layers); !s) return s;
    } else {
      for (std::int64_t l = 0; l < L; ++l) {
        if (rope[static_cast<std::size_t>(l)]) h.chunked_layers.push_back(l);
      }
    }
    if (h.chunked_layers.empty()) h.attention_chunk = 0;
  }
  const json* qk = field("use_qk_norm");
  if (qk == nullptr || is_true(*qk)) h.qk_norm = "l2";
  // Published configs write attn_temperature_tuning as 4 (truthy), transformers' default is true.
  const json* tuning = field("attn_temperature_tuning");
  if (tuning == nullptr || is_true(*tuning)) {
    const json* floor = field("floor_scale");
    const json* scale = field("attn_scale");
    if ((floor != nullptr && !floor->is_number()) || (scale != nullptr && !scale->is_number())) {
      return bad_config(where, "floor_scale and attn_scale must be numbers; fix them in config.json");
    }
    h.attn_temperature_floor = floor != nullptr ? floor->get<double>() : 8192.0;
    h.attn_temperature_scale = scale != nullptr ? scale->get<double>() : 0.1;
    if (!(h.attn_temperature_floor > 0)) {
      return bad_config(where, "floor_scale must be positive; fix it in config.json");
    }
  }
  if (const json* v = field("moe_layers")) {
    std::vector<std::int64_t> moe;
    if (auto s = layer_list("moe_layers", *v, moe); !s) return s;
    for (std::int64_t l = 0; l < L; ++l) {
      if (std::find(moe.begin(), moe.end(), l) == moe.end()) h.mlp_only_layers.push_back(l);
    }
  } else {
    const json* step = field("interleave_moe_layer_step");
    if (step != nullptr && (!step->is_number_integer() || step->get<std::int64_t>() < 1)) {
      return bad_config(where, "interleave_moe_layer_step must be a whole number of 1 or more; fix it in config.json");
    }
    h.decoder_sparse_step = step != nullptr ? step->get<std::int64_t>() : 1;
  }
  return {};
}

std::vector<std::string> supported_hf_architectures() {
  std::vector<std::string> v;
  for (const auto& [k, _] : hf_arch_map()) v.push_back(k);
  return v;
}

std::vector<std::string> supported_gguf_architectures() {
  std::vector<std::string> v;
  for (const auto& [k, _] : gguf_arch_map()) v.push_back(k);
  return v;
}

sdk::Expected<HyperParams> hparams_from_hf_config(const json& c, const std::string& where) {
  if (!c.is_object()) return bad_config(where, "not a JSON object");
  if (!c.contains("architectures") || !c["architectures"].is_array() || c["architectures"].empty() ||
      !c["architectures"][0].is_string()) {
    return bad_config(where, "has no \"architectures\" list; supported: " + join(supported_hf_architectures()));
  }
  HyperParams h;
  h.hf_architecture = c["architectures"][0].get<std::string>();
  auto it = hf_arch_map().find(h.hf_architecture);
  if (it == hf_arch_map().end()) {
    return Status(StatusCode::unsupported, where + ": architecture '" + h.hf_architecture +
                                               "' is not supported; supported: " + join(supported_hf_architectures()));
  }
  h.architecture = it->second;
  // Llama 4's, Qwen3-VL's and Qwen3.5's image-text checkpoints nest the language model's fields in text_config
  // (transformers' Llama4Config, Qwen3VLMoeConfig, Qwen3_5MoeConfig, Qwen3_5Config).
  if ((h.architecture == "llama4" || h.architecture == "qwen3_vl_moe" || is_qwen3_5(h.architecture)) &&
      c.contains("text_config") && c["text_config"].is_object()) {
    json text = c["text_config"];
    text.erase("text_config");  // one level: a nested one again is no config transformers writes
    text["architectures"] = c["architectures"];
    for (const char* key : {"tie_word_embeddings", "bos_token_id", "eos_token_id"}) {
      if (!text.contains(key) && c.contains(key)) text[key] = c[key];
    }
    return hparams_from_hf_config(text, where + " (text_config)");
  }
  const bool glm_lite = h.hf_architecture == "Glm4MoeLiteForCausalLM";
  const std::string& a = h.architecture;
  Status err;
  auto get_int = [&](const char* key, std::int64_t def, bool required) -> std::int64_t {
    if (!c.contains(key) || c[key].is_null()) {
      if (required && err) err = bad_config(where, std::string("missing required field \"") + key + "\"");
      return def;
    }
    if (!c[key].is_number_integer()) {
      if (err) err = bad_config(where, std::string("field \"") + key + "\" must be an integer");
      return def;
    }
    return c[key].get<std::int64_t>();
  };
  auto get_float = [&](const char* key, double def) -> double {
    if (!c.contains(key) || c[key].is_null()) return def;
    if (!c[key].is_number()) {
      if (err) err = bad_config(where, std::string("field \"") + key + "\" must be a number");
      return def;
    }
    return c[key].get<double>();
  };
  auto get_bool = [&](const char* key, bool def) -> bool {
    if (!c.contains(key) || c[key].is_null()) return def;
    if (!c[key].is_boolean()) {
      if (err) err = bad_config(where, std::string("field \"") + key + "\" must be true or false");
      return def;
    }
    return c[key].get<bool>();
  };
  // partial_rotary_factor, where transformers >= 4.56 may keep it in rope_parameters; `factor` keeps its default.
  auto read_partial_rotary = [&](double& factor) -> Status {
    factor = get_float("partial_rotary_factor", factor);
    if (c.contains("rope_parameters") && c["rope_parameters"].is_object() &&
        c["rope_parameters"].contains("partial_rotary_factor")) {
      const auto& f = c["rope_parameters"]["partial_rotary_factor"];
      if (!f.is_number()) return bad_config(where, "rope_parameters.partial_rotary_factor must be a number");
      factor = f.get<double>();
    }
    return {};
  };
  // RoPE on partial_rotary_factor of each head (`factor` its default): rotary_dims, an even count of 2 or more.
  auto read_partial_rotary_dims = [&](double factor) -> Status {
    if (auto st = read_partial_rotary(factor); !st) return st;
    const std::int64_t dims = rotated_dims(h.head_dim, factor);
    if (h.head_dim > 0 && (dims < 2 || dims % 2 != 0)) {
      return bad_config(where, "partial_rotary_factor " + json(factor).dump() + " gives " + std::to_string(dims) +
                                   " rotated dims of head_dim " + std::to_string(h.head_dim) +
                                   "; it must be in (0, 1] and give an even count; fix it in config.json");
    }
    h.rotary_dims = dims == h.head_dim ? 0 : dims;
    return {};
  };

  h.vocab_size = get_int("vocab_size", 0, true);
  h.hidden_size = get_int("hidden_size", 0, true);
  h.num_layers = get_int("num_hidden_layers", 0, true);
  h.num_heads = get_int("num_attention_heads", 0, true);
  // A key config.json leaves out takes its transformers config class's default, as HF would load it (save_pretrained
  // writes every key, so this is for hand-written configs).
  struct Defaults {
    std::int64_t kv_heads;  // 0: num_attention_heads
    std::int64_t max_positions;
    double rms_norm_eps, rope_theta;
  };
  const Defaults d = a == "mixtral"                   ? Defaults{8, 4096 * 32, 1e-5, 1e6}
                     : a == "mistral"                 ? Defaults{8, 4096 * 32, 1e-6, 10000.0}
                     : a == "qwen2_moe"               ? Defaults{16, 32768, 1e-6, 10000.0}
                     : a == "qwen3_moe"               ? Defaults{4, 32768, 1e-6, 10000.0}
                     : a == "qwen3_vl_moe"            ? Defaults{16, 128000, 1e-6, 500000.0}
                     : a == "qwen3_next"              ? Defaults{2, 32768, 1e-6, 10000.0}
                     : a == "qwen3_5_moe"             ? Defaults{2, 32768, 1e-6, 10000.0}
                     : a == "qwen3_5"                 ? Defaults{4, 32768, 1e-6, 10000.0}
                     : a == "olmoe"                   ? Defaults{0, 4096, 1e-5, 10000.0}
                     : a == "gpt_oss"                 ? Defaults{8, 131072, 1e-5, 150000.0}
                     : a == "glm4_moe"                ? Defaults{8, 131072, 1e-5, 10000.0}
                     : a == "minimax_m2"              ? Defaults{8, 196608, 1e-6, 5e6}
                     : a == "ernie4_5_moe"            ? Defaults{4, 131072, 1e-5, 500000.0}
                     : a == "deepseek_v2"             ? Defaults{0, 2048, 1e-6, 10000.0}
                     : a == "deepseek_v3" && glm_lite ? Defaults{0, 202752, 1e-5, 10000.0}
                     : a == "deepseek_v3"             ? Defaults{0, 4096, 1e-6, 10000.0}
                     : a == "llama4"                  ? Defaults{8, 4096 * 32, 1e-5, 500000.0}
                     : a == "dots1"                   ? Defaults{0, 2048, 1e-6, 10000.0}
                     : a == "bailing_moe_v2"          ? Defaults{0, 16384, 1e-5, 10000.0}
                     : a == "hunyuan_moe"             ? Defaults{0, 2048, 1e-5, 10000.0}
                                                      : Defaults{0, 2048, 1e-6, 10000.0};  // llama
  h.num_kv_heads = get_int("num_key_value_heads", d.kv_heads > 0 ? d.kv_heads : h.num_heads, false);
  if (!c.contains("num_key_value_heads") && h.num_heads > 0 && h.num_kv_heads > 0 &&
      h.num_heads % h.num_kv_heads != 0) {
    // The default was taken, not written: say so, or the user looks for a value config.json does not hold.
    return bad_config(where, "has no num_key_value_heads, and its architecture's default (" +
                                 std::to_string(h.num_kv_heads) +
                                 ", as transformers has it) does not divide "
                                 "num_attention_heads " +
                                 std::to_string(h.num_heads) + "; add num_key_value_heads to config.json");
  }
  h.head_dim = get_int("head_dim",
                       a == "gpt_oss"                       ? 64
                       : a == "llama4"                      ? 128
                       : a == "qwen3_next" || is_qwen3_5(a) ? 256
                       : a == "hunyuan_moe"
                           ? get_int("attention_head_dim", h.num_heads > 0 ? h.hidden_size / h.num_heads : 0, false)
                       : h.num_heads > 0 ? h.hidden_size / h.num_heads
                                         : 0,
                       false);
  h.max_position_embeddings = get_int("max_position_embeddings", d.max_positions, false);
  h.rms_norm_eps = get_float("rms_norm_eps", d.rms_norm_eps);
  h.rope_theta = get_float("rope_theta", d.rope_theta);
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) h.rope_scaling = c["rope_scaling"];
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_object() && !c["rope_scaling"].is_null()) {
    // Ignoring it would run a long-context model with plain RoPE: wrong answers past the original context.
    return bad_config(where, "field \"rope_scaling\" is " + c["rope_scaling"].dump().substr(0, 80) +
                                 "; it must be an object such as {\"rope_type\": \"linear\", \"factor\": 2.0}, "
                                 "or null; fix it in config.json");
  }
  // transformers >= 4.56 may write rope_parameters {rope_theta, rope_type, ...} instead.
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    const auto& rp = c["rope_parameters"];
    if (rp.contains("rope_theta") && rp["rope_theta"].is_number()) h.rope_theta = rp["rope_theta"].get<double>();
    if (rp.contains("rope_type") && !rp["rope_type"].is_string()) {
      return bad_config(where,
                        "rope_parameters.rope_type is " + rp["rope_type"].dump() +
                            "; it must be a string such as \"default\", \"linear\" or \"yarn\"; fix it in config.json");
    }
    if (rp.contains("rope_type") && rp["rope_type"].get<std::string>() != "default") h.rope_scaling = rp;
  }
  if (c.contains("hidden_act") && !c["hidden_act"].is_null()) {
    if (!c["hidden_act"].is_string()) {
      return bad_config(where, "field \"hidden_act\" is " + c["hidden_act"].dump().substr(0, 80) +
                                   "; it must be a string such as \"silu\"; fix it in config.json");
    }
    h.hidden_act = c["hidden_act"].get<std::string>();
  }
  if (h.hidden_act == "silu" || h.hidden_act == "swish") h.hidden_act = "silu";
  h.tie_word_embeddings = get_bool("tie_word_embeddings", a == "qwen3_vl_moe");  // Qwen3VLMoeTextConfig: true
  if (a == "mistral" || a == "mixtral") h.sliding_window = get_int("sliding_window", a == "mistral" ? 4096 : 0, false);
  if ((a == "qwen2_moe" || a == "qwen3_moe") && get_bool("use_sliding_window", false)) {
    return Status(StatusCode::unsupported,
                  where + ": use_sliding_window=true (per-layer sliding windows) is not supported");
  }
  if (a == "llama" && get_bool("mlp_bias", false)) {
    return Status(StatusCode::unsupported, where + ": mlp_bias=true is not supported");
  }
  if (a == "llama" || a == "qwen3_moe" || a == "olmoe" || a == "gpt_oss" || a == "dots1") {
    h.attention_qkv_bias = h.attention_out_bias = get_bool("attention_bias", a == "gpt_oss");
  }
  if (a == "dots1") {
    // Qwen 3's attention: q/k RMS norms per head. Dots1Config slides a window (4096 unless sliding_window is null)
    // over the layers layer_types names, by default those from max_window_layers on; the released models' 62 of 62
    // leave none sliding.
    h.qk_norm = "per_head";
    h.sliding_window =
        c.contains("sliding_window") && c["sliding_window"].is_null() ? 0 : get_int("sliding_window", 4096, false);
    if (c.contains("layer_types") && !c["layer_types"].is_null()) {
      if (auto s = layers_of_type(c["layer_types"], h.num_layers, "sliding_attention", where, h.sliding_layers); !s)
        return s;
    } else {
      const std::int64_t from = get_int("max_window_layers", 62, false);
      for (std::int64_t l = std::max<std::int64_t>(from, 0); l < h.num_layers && h.num_layers <= 4096; ++l)
        h.sliding_layers.push_back(l);
    }
    if (h.sliding_window <= 0 || h.sliding_layers.empty()) {
      h.sliding_window = 0;
      h.sliding_layers.clear();
    }
  }
  if (a == "bailing_moe_v2") {
    // Ling 2.0: q, k and v in one query_key_value projection (cut apart at convert time), per-head q/k norms, RoPE
    // (NeoX pairs) on the first rotary_dim (Ling-1T) or partial_rotary_factor of each head. The config classes that
    // ship with the checkpoints disagree on the defaults of these switches, so config.json must say them.
    for (const char* key : {"use_qkv_bias", "use_bias", "use_qk_norm"}) {
      if (!c.contains(key) || !c[key].is_boolean()) {
        return bad_config(where, std::string("field \"") + key +
                                     "\" must be true or false (the released Ling 2.0 configs write it); fix it in "
                                     "config.json");
      }
    }
    if (c["use_qkv_bias"].get<bool>()) {
      return Status(StatusCode::unsupported, where +
                                                 ": use_qkv_bias=true is not supported; the released Ling 2.0 "
                                                 "models have no q/k/v biases");
    }
    h.attention_out_bias = c["use_bias"].get<bool>();
    if (c["use_qk_norm"].get<bool>()) h.qk_norm = "per_head";
    double factor = 0.5;
    if (auto st = read_partial_rotary(factor); !st) return st;
    const std::int64_t rotary = get_int("rotary_dim", 0, false);
    const std::int64_t dims = rotary > 0 ? rotary : rotated_dims(h.head_dim, factor);
    if (h.head_dim > 0 && (dims < 2 || dims > h.head_dim || dims % 2 != 0)) {
      return bad_config(where, "rotary_dim / partial_rotary_factor give " + std::to_string(dims) +
                                   " rotated dims of head_dim " + std::to_string(h.head_dim) +
                                   "; it must be even and in 2..head_dim; fix it in config.json");
    }
    h.rotary_dims = dims == h.head_dim ? 0 : dims;
  }
  if (a == "hunyuan_moe") {
    // Hunyuan-A13B (its own modeling_hunyuan.py, as vLLM and llama.cpp run it): per-head q/k RMS norms after RoPE
    // (transformers' port norms before; the checkpoints were trained with their own code), and NTK-alpha RoPE: the
    // base times alpha^(d / (d - 2)) at every position, as llama.cpp folds it into rope.freq_base.
    for (const char* key : {"use_cla", "use_mla", "attention_bias", "mlp_bias"}) {
      if (get_bool(key, false)) {
        return Status(StatusCode::unsupported, where + ": " + key +
                                                   "=true is not supported; the released Hunyuan-A13B models have "
                                                   "none (Hunyuan-Large's cross-layer attention is another layout)");
      }
    }
    if (get_int("moe_layer_num_skipped", 0, false) != 0) {
      return Status(StatusCode::unsupported,
                    where + ": moe_layer_num_skipped other than 0 is not supported; Hunyuan-A13B routes every layer");
    }
    if (get_bool("use_qk_norm", false)) h.qk_norm = "per_head_after_rope";
    const auto& rs = h.rope_scaling;
    const json type = rs.is_object() ? (rs.contains("rope_type") ? rs["rope_type"]
                                        : rs.contains("type")    ? rs["type"]
                                                                 : json())
                                     : json();
    if (type == "dynamic" && rs.contains("alpha") && !rs["alpha"].is_null() && rs["alpha"] != json(0)) {
      const double alpha = rs["alpha"].is_number() ? rs["alpha"].get<double>() : 0.0;
      if (!(alpha > 0 && alpha < 1e9) || h.head_dim <= 2) {
        return bad_config(where,
                          "rope_scaling.alpha is " + rs["alpha"].dump().substr(0, 40) +
                              "; it must be a positive number (Hunyuan-A13B writes 1000), with head_dim above 2");
      }
      const double d = static_cast<double>(h.head_dim);
      h.rope_theta *= std::pow(alpha, d / (d - 2));
      h.rope_scaling = nullptr;
      // The released config says 32768, while the model is trained to 256K with this RoPE (its report; llama.cpp
      // writes 262144 too).
      h.max_position_embeddings = std::max<std::int64_t>(h.max_position_embeddings, 262144);
    }
  }
  if (a == "gpt_oss") {
    h.sliding_window = get_int("sliding_window", 128, false);
    // transformers' default: even layers slide, odd ones attend to everything.
    if (c.contains("layer_types") && !c["layer_types"].is_null()) {
      if (auto s = layers_of_type(c["layer_types"], h.num_layers, "sliding_attention", where, h.sliding_layers); !s)
        return s;
    } else {
      // Bounded: validate() refuses an absurd layer count only after this.
      for (std::int64_t l = 0; l < h.num_layers && h.num_layers <= 4096; l += 2) h.sliding_layers.push_back(l);
    }
    // No layer slides: the window must not fall back to applying to every layer (an empty list's meaning).
    if (h.sliding_layers.empty()) h.sliding_window = 0;
    h.attention_sinks = true;
    h.router_bias = true;
    h.expert_activation = "swiglu_clamped";
    h.swiglu_alpha = get_float("swiglu_alpha", 1.702);
    h.swiglu_limit = get_float("swiglu_limit", 7.0);
  }
  if (a == "glm4_moe") {
    // GLM: q/k/v have biases, o_proj never; per-head q/k norms in GLM-4.5 (355B), not in Air.
    h.attention_qkv_bias = get_bool("attention_bias", false);
    if (get_bool("use_qk_norm", false)) h.qk_norm = "per_head";
    // RoPE on the first half of each head (NeoX pairs within it). transformers >= 4.56 moves the factor into
    // rope_parameters.
    if (auto st = read_partial_rotary_dims(0.5); !st) return st;
  }
  if (a == "minimax_m2") {
    // RoPE on the first rotary_dim of each head; q/k norms over the whole projection ("per_layer"), before the split
    // into heads, as OLMoE's.
    // transformers' own port writes partial_rotary_factor instead of rotary_dim.
    const std::int64_t rotary =
        get_int("rotary_dim", rotated_dims(h.head_dim, get_float("partial_rotary_factor", 1.0)), false);
    if (h.head_dim > 0 && (rotary < 2 || rotary > h.head_dim || rotary % 2 != 0)) {
      return bad_config(where, "rotary_dim is " + std::to_string(rotary) + "; it must be even and in 2..head_dim (" +
                                   std::to_string(h.head_dim) + "); fix it in config.json");
    }
    h.rotary_dims = rotary == h.head_dim ? 0 : rotary;
    if (get_bool("use_qk_norm", true)) {
      if (c.contains("qk_norm_type") && !c["qk_norm_type"].is_null() && !c["qk_norm_type"].is_string()) {
        return bad_config(where, "qk_norm_type is " + c["qk_norm_type"].dump().substr(0, 40) +
                                     "; it must be \"per_layer\" or \"per_head\"");
      }
      const std::string type = c.contains("qk_norm_type") && c["qk_norm_type"].is_string()
                                   ? c["qk_norm_type"].get<std::string>()
                                   : "per_layer";
      if (type != "per_layer" && type != "per_head") {
        return bad_config(where, "qk_norm_type '" + type + "' is not supported (per_layer, per_head)");
      }
      h.qk_norm = type == "per_layer" ? "full" : "per_head";
    }
    // MiniMax-Text-01's lightning (linear) attention layers are attn_type 0; M2's are all 1 (softmax attention).
    if (c.contains("attn_type_list") && c["attn_type_list"].is_array()) {
      for (const auto& t : c["attn_type_list"]) {
        if (!t.is_number_integer() || t.get<std::int64_t>() != 1) {
          return Status(StatusCode::unsupported, where + ": attn_type_list holds " + t.dump().substr(0, 20) +
                                                     "; only softmax attention layers (1) are supported");
        }
      }
    }
    // Sliding windows per layer (attn_window_size) have their own rope base (swa_rope_theta): not run here.
    if (c.contains("attn_window_size") && !c["attn_window_size"].is_null()) {
      const auto& w = c["attn_window_size"];
      const bool any = w.is_array() ? std::any_of(w.begin(), w.end(),
                                                  [](const json& x) { return x.is_number() && x.get<double>() > 0; })
                                    : w.is_number() && w.get<double>() > 0;
      if (any) {
        return Status(StatusCode::unsupported,
                      where + ": attn_window_size (sliding-window layers) is not supported; MiniMax-M2 has none");
      }
    }
  }
  if (a == "ernie4_5_moe") {
    h.rope_interleaved = true;  // HF's rotate_half takes x[0::2] and x[1::2]
    if (get_bool("use_bias", false)) {
      return Status(StatusCode::unsupported, where +
                                                 ": use_bias=true (biases on every projection) is not supported; "
                                                 "the released ERNIE 4.5 models have none");
    }
  }
  const bool deepseek = a == "deepseek_v2" || a == "deepseek_v3";
  if (deepseek) {
    // Multi-head latent attention. Its keys' RoPE part is one head shared by all, so num_key_value_heads is moot.
    if (get_bool("attention_bias", false)) {
      return Status(StatusCode::unsupported, where +
                                                 ": attention_bias=true is not supported; the released DeepSeek "
                                                 "and Kimi models have no attention biases");
    }
    h.q_lora_rank = get_int("q_lora_rank", 0, false);  // null: queries straight from the hidden state (V2-Lite)
    // GLM-4.7-Flash's RoPE rotates qk_rope_head_dim x partial_rotary_factor (1 unless rope_parameters says).
    if (glm_lite && c.contains("rope_parameters") && c["rope_parameters"].is_object() &&
        c["rope_parameters"].contains("partial_rotary_factor") &&
        c["rope_parameters"]["partial_rotary_factor"] != json(1.0)) {
      return Status(StatusCode::unsupported, where + ": rope_parameters.partial_rotary_factor " +
                                                 c["rope_parameters"]["partial_rotary_factor"].dump().substr(0, 20) +
                                                 " is not supported with multi-head latent attention (1: the whole "
                                                 "qk_rope_head_dim)");
    }
    h.kv_lora_rank = get_int("kv_lora_rank", 0, true);
    const std::int64_t nope = get_int("qk_nope_head_dim", 0, true), rope = get_int("qk_rope_head_dim", 0, true);
    h.v_head_dim = get_int("v_head_dim", 0, true);
    if (err && (nope < 2 || rope < 2 || rope % 2 != 0 || nope % 2 != 0 || nope > (1 << 20) || rope > (1 << 20))) {
      return bad_config(where, "qk_nope_head_dim " + std::to_string(nope) + " and qk_rope_head_dim " +
                                   std::to_string(rope) + " must be even and 2 or more; fix them in config.json");
    }
    h.head_dim = nope + rope;
    h.rotary_dims = rope;
    h.num_kv_heads = h.num_heads;
    // DeepSeek's checkpoints pair (2i, 2i + 1): transformers de-interleaves first, unless V3's rope_interleave is
    // false (V2's code always pairs so).
    h.rope_interleaved = a == "deepseek_v2" || get_bool("rope_interleave", true);
    // DeepSeek's softmax scale needs yarn's factor (transformers infers it for the frequencies only).
    if (h.rope_scaling.is_object() &&
        (h.rope_scaling.contains("mscale_all_dim") || h.rope_scaling.contains("mscale")) &&
        !(h.rope_scaling.contains("factor") && h.rope_scaling["factor"].is_number())) {
      return bad_config(where,
                        "rope_scaling has mscale but no \"factor\"; DeepSeek's attention needs it (e.g. 40 "
                        "for DeepSeek-V3); fix it in config.json");
    }
  }
  if (a == "llama4") {
    if (auto s = llama4_layers(c, where, h); !s) return s;
  }
  const bool qwen3_5 = is_qwen3_5(a);
  if (a == "qwen3_next" || qwen3_5) {
    // Qwen3-Next: every full_attention_interval-th layer attends (q/k norms per head, RoPE on partial_rotary_factor of
    // each head, the output gated by a projection q_proj also holds); the others are gated-delta-rule layers.
    // Qwen3.5 the same, its projections apart, its value heads kept in llama.cpp's tiled order (from either source,
    // so both give the same model), its multimodal RoPE plain for text; Qwen3.5-MoE's every layer MoE, always
    // renormalized, Qwen3.5's every layer dense.
    if (get_bool("attention_bias", false)) {
      return Status(StatusCode::unsupported,
                    where +
                        ": attention_bias=true is not supported for Qwen3-Next and Qwen3.5 (the released models "
                        "have none)");
    }
    h.qk_norm = "per_head";
    h.attn_output_gate = true;
    h.linear_tiled_heads = qwen3_5;
    if (qwen3_5 && h.rope_scaling.is_object()) {
      // Multimodal RoPE (mrope_section): a text token's position components are its one position.
      const auto& rs = h.rope_scaling;
      const json type = rs.contains("rope_type") ? rs["rope_type"] : rs.contains("type") ? rs["type"] : json("default");
      if (type == "default" || type == "mrope") h.rope_scaling = nullptr;
    }
    if (auto st = read_partial_rotary_dims(0.25); !st) return st;
    h.linear_conv_kernel = get_int("linear_conv_kernel_dim", 4, false);
    h.linear_k_dim = get_int("linear_key_head_dim", 128, false);
    h.linear_v_dim = get_int("linear_value_head_dim", 128, false);
    h.linear_k_heads = get_int("linear_num_key_heads", 16, false);
    h.linear_v_heads = get_int("linear_num_value_heads", 32, false);
    if (c.contains("layer_types") && !c["layer_types"].is_null()) {
      if (auto st = layers_of_type(c["layer_types"], h.num_layers, "linear_attention", where, h.linear_layers); !st)
        return st;
    } else {
      const std::int64_t interval = get_int("full_attention_interval", 4, false);
      if (interval < 1) {
        return bad_config(where, "full_attention_interval is " + std::to_string(interval) +
                                     "; it must be 1 or more; fix it in config.json");
      }
      for (std::int64_t l = 0; l < h.num_layers && h.num_layers <= 4096; ++l) {
        if ((l + 1) % interval != 0) h.linear_layers.push_back(l);
      }
    }
  }
  if (a == "qwen2_moe") h.attention_qkv_bias = get_bool("qkv_bias", true);
  if (a == "qwen3_moe" || a == "qwen3_vl_moe") h.qk_norm = "per_head";
  if (a == "qwen3_vl_moe" && h.rope_scaling.is_object()) {
    // Qwen3-VL's multimodal RoPE (mrope_section, interleaved): a text token's three position components are its one
    // position, so it is plain RoPE for text, which is all colibri reads.
    const auto& rs = h.rope_scaling;
    const json type = rs.contains("rope_type") ? rs["rope_type"] : rs.contains("type") ? rs["type"] : json("default");
    if (type == "default" || type == "mrope") h.rope_scaling = nullptr;
  }
  if (a == "olmoe") {
    h.qk_norm = "full";
    h.clip_qkv = get_float("clip_qkv", 0.0);
  }
  // Routing within the best topk_group of n_group groups, a group scored by its best two (DeepSeek-V3's rule).
  auto read_groups = [&](std::int64_t default_groups, std::int64_t default_used) -> Status {
    const std::int64_t groups = get_int("n_group", default_groups, false);
    const std::int64_t used = get_int("topk_group", default_used, false);
    if (groups < 1 || used < 1 || used > groups) {
      return bad_config(where, "n_group " + std::to_string(groups) + " and topk_group " + std::to_string(used) +
                                   " must be 1 or more, topk_group at most n_group; fix them in config.json");
    }
    if (groups > 1 && used < groups) {
      h.router_groups = groups;
      h.router_groups_used = used;
    }
    return {};
  };
  // The first first_k_dense_replace layers have a dense FFN.
  auto read_dense_first = [&](std::int64_t default_dense, bool required) -> Status {
    const std::int64_t dense_first = get_int("first_k_dense_replace", default_dense, required);
    if (dense_first < 0 || dense_first > h.num_layers) {
      return bad_config(where, "first_k_dense_replace is " + std::to_string(dense_first) +
                                   "; it must be in 0..num_hidden_layers (" + std::to_string(h.num_layers) +
                                   "); fix it in config.json");
    }
    // Bounded: validate() refuses an absurd layer count only after this.
    for (std::int64_t l = 0; l < dense_first && h.num_layers <= 4096; ++l) h.mlp_only_layers.push_back(l);
    return {};
  };
  // The multi-token-prediction layers follow the last layer in the checkpoint; colibri does not draft with them.
  auto read_nextn = [&]() -> Status {
    h.nextn_layers = get_int("num_nextn_predict_layers", 0, false);
    if (h.nextn_layers < 0 || h.nextn_layers > h.num_layers) {
      return bad_config(where, "num_nextn_predict_layers is " + std::to_string(h.nextn_layers) +
                                   "; it must be in 0..num_hidden_layers (" + std::to_string(h.num_layers) +
                                   "); fix it in config.json");
    }
    return {};
  };
  if (a == "llama" || a == "mistral" || a == "qwen3_5") {
    h.dense = true;
    h.n_experts = 1;
    h.n_experts_per_tok = 1;
    h.intermediate_size = get_int("intermediate_size", 0, true);
  } else if (a == "glm4_moe" || a == "dots1") {
    // dots.llm1 routes as DeepSeek-V3 (transformers' Dots1MoE is DeepseekV3MoE), GLM-4.5 the same way; their
    // config classes' defaults differ.
    const bool dots = a == "dots1";
    if (dots && c.contains("scoring_func") && !c["scoring_func"].is_null() &&
        !(c["scoring_func"].is_string() &&
          (c["scoring_func"].get<std::string>() == "noaux_tc" || c["scoring_func"].get<std::string>() == "sigmoid"))) {
      return bad_config(where, "scoring_func is " + c["scoring_func"].dump().substr(0, 40) +
                                   "; dots.llm1 scores its experts by sigmoid (\"noaux_tc\")");
    }
    h.n_experts = get_int("n_routed_experts", 0, true);
    h.n_experts_per_tok = get_int("num_experts_per_tok", 0, true);
    h.moe_intermediate_size = get_int("moe_intermediate_size", 0, true);
    h.intermediate_size = get_int("intermediate_size", 0, true);
    h.norm_topk_prob = get_bool("norm_topk_prob", !dots);
    h.router_scoring = "sigmoid";
    h.router_selection_bias = true;  // HF registers e_score_correction_bias whatever the config says
    h.routed_scaling_factor = get_float("routed_scaling_factor", 1.0);
    // Dots1Config has no default (DeepseekV3MoE would fail on None).
    const std::int64_t shared = get_int("n_shared_experts", dots ? 0 : 1, dots);
    if (shared < 0 || shared > 64) {
      return bad_config(where, "n_shared_experts is " + std::to_string(shared) + "; it must be in 0..64");
    }
    h.shared_expert_intermediate_size = shared_width(h.moe_intermediate_size, shared);
    // Within the best groups as DeepSeek-V3 (GLM's released models have one group).
    if (auto s = read_groups(1, 1); !s) return s;
    if (auto s = read_dense_first(dots ? 0 : 1, false); !s) return s;
    if (auto s = read_nextn(); !s) return s;
  } else if (a == "bailing_moe_v2") {
    // BailingMoeV2Gate: sigmoid scores, expert_bias picks within the best topk_group of n_group groups (always: the
    // gate runs group_limited_topk), the picked scores renormalized whenever it picks several (norm_topk_prob is not
    // read), then x routed_scaling_factor; shared experts moe_intermediate_size x num_shared_experts wide.
    if (c.contains("score_function") && !c["score_function"].is_null() &&
        !(c["score_function"].is_string() && c["score_function"].get<std::string>() == "sigmoid")) {
      return bad_config(where, "score_function is " + c["score_function"].dump().substr(0, 40) +
                                   "; Ling 2.0 scores its experts by \"sigmoid\"");
    }
    if (!c.contains("routed_scaling_factor") || !c["routed_scaling_factor"].is_number()) {
      return bad_config(where,
                        "missing required field \"routed_scaling_factor\" (a number; the released Ling 2.0 "
                        "configs write 2.5)");
    }
    h.n_experts = get_int("num_experts", 0, true);
    h.n_experts_per_tok = get_int("num_experts_per_tok", 0, true);
    h.moe_intermediate_size = get_int("moe_intermediate_size", 0, true);
    h.intermediate_size = get_int("intermediate_size", 0, true);
    h.norm_topk_prob = h.n_experts_per_tok > 1;
    h.router_scoring = "sigmoid";
    h.router_selection_bias = true;  // a registered buffer whatever moe_router_enable_expert_bias says
    h.routed_scaling_factor = get_float("routed_scaling_factor", 1.0);
    const std::int64_t shared = get_int("num_shared_experts", 0, true);
    if (shared < 0 || shared > 64) {
      return bad_config(where, "num_shared_experts is " + std::to_string(shared) + "; it must be in 0..64");
    }
    h.shared_expert_intermediate_size = shared_width(h.moe_intermediate_size, shared);
    if (auto s = read_groups(8, 4); !s) return s;
    if (auto s = read_dense_first(0, true); !s) return s;
    // As llama.cpp reads the checkpoints: the MTP layers follow the last layer (none in the released models).
    if (auto s = read_nextn(); !s) return s;
  } else if (a == "hunyuan_moe") {
    // HunYuanMoE: a softmax over the float32 router's logits (mlp.gate.wg), the top moe_topk renormalized when it
    // picks several (topkgating; top-1 keeps its probability), without the capacity limit its training code puts on
    // a pass of many tokens (as vLLM and llama.cpp run it, so a token's answer never depends on the others in its
    // pass); the shared MLP (use_mixed_mlp_moe) intermediate_size x num_shared_expert wide, always added.
    // moe_topk, num_experts, moe_intermediate_size and num_shared_expert may be one number or one per layer.
    auto per_layer = [&](const char* key, std::int64_t def, bool required) -> std::int64_t {
      if (!c.contains(key) || !c[key].is_array()) return get_int(key, def, required);
      const auto& v = c[key];
      if (v.empty() || !std::all_of(v.begin(), v.end(), [&](const json& x) { return x == v[0]; }) ||
          !v[0].is_number_integer()) {
        if (err) {
          err = bad_config(where, std::string("field \"") + key + "\" is " + v.dump().substr(0, 60) +
                                      "; colibri runs the same whole number for every layer, as the released models "
                                      "have it");
        }
        return def;
      }
      return v[0].get<std::int64_t>();
    };
    h.n_experts = per_layer("num_experts", 0, true);
    h.n_experts_per_tok = per_layer("moe_topk", 0, true);
    h.intermediate_size = get_int("intermediate_size", 0, true);
    h.moe_intermediate_size = per_layer("moe_intermediate_size", h.intermediate_size, false);
    h.norm_topk_prob = h.n_experts_per_tok > 1;
    const std::int64_t shared = get_bool("use_mixed_mlp_moe", false) ? per_layer("num_shared_expert", 1, false) : 0;
    if (shared < 0 || shared > 64) {
      return bad_config(where, "num_shared_expert is " + std::to_string(shared) + "; it must be in 0..64");
    }
    h.shared_expert_intermediate_size = shared_width(h.intermediate_size, shared);
  } else if (a == "llama4") {
    // transformers' names: intermediate_size is each expert's width (and the shared expert's), intermediate_size_mlp
    // the dense layers'.
    h.n_experts = get_int("num_local_experts", 16, false);
    h.n_experts_per_tok = get_int("num_experts_per_tok", 1, false);
    h.moe_intermediate_size = get_int("intermediate_size", 8192, false);
    h.shared_expert_intermediate_size = h.moe_intermediate_size;
    h.intermediate_size = get_int("intermediate_size_mlp", 16384, false);
  } else if (deepseek) {
    h.n_experts = get_int("n_routed_experts", 0, true);
    h.n_experts_per_tok = get_int("num_experts_per_tok", 0, true);
    h.moe_intermediate_size = get_int("moe_intermediate_size", 0, true);
    h.intermediate_size = get_int("intermediate_size", 0, true);
    const bool v3 = a == "deepseek_v3";
    // V2's code renormalizes only several picks.
    h.norm_topk_prob = get_bool("norm_topk_prob", v3) && (v3 || h.n_experts_per_tok > 1);
    const double scale = get_float("routed_scaling_factor", glm_lite ? 1.8 : v3 ? 2.5 : 1.0);
    // V3 scores by sigmoid, V2 by softmax; DeepSeek's code refuses the other.
    const std::string scoring = v3 ? "sigmoid" : "softmax";
    if (c.contains("scoring_func") && !c["scoring_func"].is_null() &&
        !(c["scoring_func"].is_string() && c["scoring_func"].get<std::string>() == scoring)) {
      return bad_config(where, "scoring_func is " + c["scoring_func"].dump().substr(0, 40) + "; " + h.hf_architecture +
                                   " scores its experts by \"" + scoring + "\"");
    }
    h.router_scoring = scoring;
    // V3's gate always has e_score_correction_bias; V2's only picks by its scores. V2 scales the weights only
    // when it does not renormalize them, V3 after renormalizing.
    h.router_selection_bias = v3;
    h.routed_scaling_factor = v3 || !(h.norm_topk_prob && h.n_experts_per_tok > 1) ? scale : 1.0;
    // Routing within the best groups: V3 always (transformers' DeepseekV3TopkRouter reads no topk_method) scores a
    // group by its best two biased scores; V2's topk_method says: group_limited_greedy by its best one, greedy none.
    const std::int64_t groups = get_int("n_group", 1, false), topk_groups = get_int("topk_group", 1, false);
    std::string method = v3 ? "noaux_tc" : "greedy";
    if (!v3 && c.contains("topk_method") && !c["topk_method"].is_null()) {
      method = c["topk_method"].is_string() ? c["topk_method"].get<std::string>() : "";
      if (method != "greedy" && method != "group_limited_greedy") {
        return bad_config(where, "topk_method is " + c["topk_method"].dump().substr(0, 40) +
                                     "; DeepseekV2ForCausalLM's must be \"greedy\" or \"group_limited_greedy\"");
      }
    }
    if (groups < 1 || topk_groups < 1 || topk_groups > groups) {
      return bad_config(where, "n_group " + std::to_string(groups) + " and topk_group " + std::to_string(topk_groups) +
                                   " must be 1 or more, topk_group at most n_group; fix them in config.json");
    }
    if (method != "greedy" && groups > 1 && topk_groups < groups) {
      h.router_groups = groups;
      h.router_groups_used = topk_groups;
      h.router_group_score = method == "noaux_tc" ? "top2_sum" : "max";
    }
    const std::int64_t shared = get_int("n_shared_experts", 0, false);
    if (shared < 0 || shared > 64) {
      return bad_config(where, "n_shared_experts is " + std::to_string(shared) + "; it must be in 0..64");
    }
    h.shared_expert_intermediate_size = shared_width(h.moe_intermediate_size, shared);
    // GLM-4.7-Flash: mlp_layer_types says per layer ("dense" / "sparse"; transformers' default: the first dense).
    const bool listed = glm_lite && c.contains("mlp_layer_types") && !c["mlp_layer_types"].is_null();
    if (listed) {
      const auto& types = c["mlp_layer_types"];
      if (!types.is_array() || static_cast<std::int64_t>(types.size()) != h.num_layers) {
        return bad_config(where, "mlp_layer_types must list \"dense\" or \"sparse\" for each of the " +
                                     std::to_string(h.num_layers) +
                                     " layers (num_hidden_layers); fix it in config.json");
      }
      for (std::int64_t l = 0; l < h.num_layers; ++l) {
        const auto& t = types[static_cast<std::size_t>(l)];
        if (t != "dense" && t != "sparse") {
          return bad_config(where, "mlp_layer_types[" + std::to_string(l) + "] is " + t.dump().substr(0, 40) +
                                       "; it must be \"dense\" or \"sparse\"; fix it in config.json");
        }
        if (t == "dense") h.mlp_only_layers.push_back(l);
      }
    }
    // Layer l routes when l >= first_k_dense_replace and l % moe_layer_freq == 0.
    const std::int64_t dense_first = get_int("first_k_dense_replace", glm_lite ? 1 : 0, false);
    const std::int64_t freq = get_int("moe_layer_freq", 1, false);
    if (dense_first < 0 || dense_first > h.num_layers || freq < 1) {
      return bad_config(where, "first_k_dense_replace " + std::to_string(dense_first) + " and moe_layer_freq " +
                                   std::to_string(freq) + " must be in 0..num_hidden_layers (" +
                                   std::to_string(h.num_layers) + ") and 1 or more; fix them in config.json");
    }
    for (std::int64_t l = 0; l < h.num_layers && h.num_layers <= 4096 && !listed; ++l) {
      if (l < dense_first || l % freq != 0) h.mlp_only_layers.push_back(l);
    }
    if (auto s = read_nextn(); !s) return s;
  } else if (a == "minimax_m2") {
    h.n_experts = get_int("num_local_experts", 0, true);
    h.n_experts_per_tok = get_int("num_experts_per_tok", 0, true);
    h.moe_intermediate_size = get_int("intermediate_size", 0, true);
    h.norm_topk_prob = true;  // MiniMax always divides by the chosen scores' sum
    if (c.contains("scoring_func") && !c["scoring_func"].is_null()) {
      const std::string f = c["scoring_func"].is_string() ? c["scoring_func"].get<std::string>() : "";
      if (f != "sigmoid" && f != "softmax") {
        return bad_config(where, "scoring_func is " + c["scoring_func"].dump().substr(0, 40) +
                                     "; it must be \"sigmoid\" or \"softmax\"");
      }
      h.router_scoring = f;
    } else {
      h.router_scoring = "sigmoid";
    }
    h.router_selection_bias = get_bool("use_routing_bias", true);
    h.routed_scaling_factor = get_float("routed_scaling_factor", 1.0);
    if (get_bool("use_grouped_topk", false) && get_int("num_expert_group", 1, false) > 1 &&
        get_int("topk_group", 1, false) < get_int("num_expert_group", 1, false)) {
      return Status(StatusCode::unsupported, where +
                                                 ": use_grouped_topk (routing within the best groups only) is "
                                                 "not supported; MiniMax-M2 does not use it");
    }
  } else if (a == "ernie4_5_moe") {
    h.n_experts = get_int("moe_num_experts", 0, true);
    h.n_experts_per_tok = get_int("moe_k", 0, true);
    h.moe_intermediate_size = get_int("moe_intermediate_size", 0, true);
    h.intermediate_size = get_int("intermediate_size", 0, true);
    h.norm_topk_prob = true;         // over max(sum, moe_norm_min)
    h.router_selection_bias = true;  // moe_statics.e_score_correction_bias picks; the softmax weighs
    const std::int64_t shared = get_int("moe_num_shared_experts", 2, false);
    if (shared < 0 || shared > 64) {
      return bad_config(where, "moe_num_shared_experts is " + std::to_string(shared) + "; it must be in 0..64");
    }
    h.shared_expert_intermediate_size = shared_width(h.moe_intermediate_size, shared);
    // Layer l routes when l is in [moe_layer_start_index, moe_layer_end_index] and (l + 1) % moe_layer_interval is 0.
    const std::int64_t first = get_int("moe_layer_start_index", 1, false);
    std::int64_t last = get_int("moe_layer_end_index", -1, false);
    const std::int64_t interval = get_int("moe_layer_interval", 1, false);
    if (last == -1) last = h.num_layers - 1;
    if (interval < 1 || first < 0 || last >= h.num_layers) {
      return bad_config(where, "moe_layer_start_index " + std::to_string(first) + ", moe_layer_end_index " +
                                   std::to_string(last) + " and moe_layer_interval " + std::to_string(interval) +
                                   " must name layers of the model's " + std::to_string(h.num_layers) +
                                   " with an interval of 1 or more; fix them in config.json");
    }
    for (std::int64_t l = 0; l < h.num_layers && h.num_layers <= 4096; ++l) {
      if (!(l >= first && l <= last && (l + 1) % interval == 0)) h.mlp_only_layers.push_back(l);
    }
  } else if (a == "mixtral" || a == "gpt_oss") {
    h.n_experts = get_int("num_local_experts", 0, true);
    h.n_experts_per_tok = get_int("num_experts_per_tok", 2, false);
    h.moe_intermediate_size = get_int("intermediate_size", 0, true);
    // Mixtral renormalizes over the chosen experts; gpt-oss takes a softmax over the chosen logits, the same.
    h.norm_topk_prob = true;
  } else {
    h.n_experts = get_int("num_experts", 0, true);
    h.n_experts_per_tok = get_int("num_experts_per_tok", 0, true);
    // Qwen3-VL's router always renormalizes (its text config has no norm_topk_prob).
    h.norm_topk_prob = a == "qwen3_vl_moe" || qwen3_5 || get_bool("norm_topk_prob", a == "qwen3_next");
    if (a == "olmoe") {
      h.moe_intermediate_size = get_int("intermediate_size", 0, true);
    } else {
      h.moe_intermediate_size = get_int("moe_intermediate_size", 0, true);
      h.intermediate_size = get_int("intermediate_size", 0, false);
      h.decoder_sparse_step = get_int("decoder_sparse_step", 1, false);
      if (c.contains("mlp_only_layers") && !c["mlp_only_layers"].is_null()) {
        // A layer listed that the model does not have would be dropped without a word, or a list not read at all:
        // either changes which layers are dense.
        if (!c["mlp_only_layers"].is_array()) return bad_config(where, "mlp_only_layers must list layer numbers");
        for (const auto& l : c["mlp_only_layers"]) {
          if (!l.is_number_integer()) return bad_config(where, "mlp_only_layers must list layer numbers");
          const auto layer = l.get<std::int64_t>();
          if (layer < 0 || layer >= h.num_layers) {
            return bad_config(where, "mlp_only_layers lists layer " + std::to_string(layer) + ", but the model has " +
                                         std::to_string(h.num_layers) + " (num_hidden_layers); fix it in config.json");
          }
          h.mlp_only_layers.push_back(layer);
        }
      }
    }
    if (qwen3_5) {  // Qwen3_5MoeTextConfig has no dense layers (its class deletes these keys)
      h.mlp_only_layers.clear();
      h.decoder_sparse_step = 1;
    }
    if (a == "qwen2_moe" || a == "qwen3_next" || qwen3_5) {
      h.shared_expert_intermediate_size = get_int("shared_expert_intermediate_size", a == "qwen2_moe" ? 0 : 512, false);
      h.shared_expert_gate = h.shared_expert_intermediate_size > 0;
    }
  }
  h.bos_token_id = get_int("bos_token_id", -1, false);
  if (c.contains("eos_token_id") && !c["eos_token_id"].is_null()) {
    // Dropping a malformed id would make generation run past the end of every answer.
    const auto& e = c["eos_token_id"];
    const json ids = e.is_array() ? e : json::array({e});
    for (const auto& x : ids) {
      if (!x.is_number_integer() || x.get<std::int64_t>() < 0) {
        if (err) {
          err = bad_config(where, "field \"eos_token_id\" is " + e.dump().substr(0, 80) +
                                      "; it must be a token id or a list of token ids (whole numbers of 0 or more)");
        }
        break;
      }
      h.eos_token_ids.push_back(x.get<std::int64_t>());
    }
  }
  if (!err) return err;
  if (auto s = h.validate(); !s) {
    return Status(StatusCode::invalid_argument, where + ": " + s.message() + "; fix it in config.json");
  }
  return h;
}

namespace {

// Every metadata key colibri reads from a GGUF, with the kind of value it takes. An optional key that is there with
// another type is a damaged file: read as absent, its default (rope_theta 10000, no EOS, no BOS...) would silently
// change the model's answers.
Status check_metadata_types(const GgufFile& g, const std::string& arch, const std::string& where) {
  enum class Kind { integer, number, boolean, string };
  static constexpr std::pair<const char*, Kind> kArchKeys[] = {
      {"context_length", Kind::integer},
      {"embedding_length", Kind::integer},
      {"block_count", Kind::integer},
      {"feed_forward_length", Kind::integer},
      {"vocab_size", Kind::integer},
      {"attention.head_count", Kind::integer},
      {"attention.head_count_kv", Kind::integer},
      {"attention.key_length", Kind::integer},
      {"attention.sliding_window", Kind::integer},
      {"attention.layer_norm_rms_epsilon", Kind::number},
      {"rope.freq_base", Kind::number},
      {"rope.scaling.type", Kind::string},
      {"rope.scaling.factor", Kind::number},
      {"rope.scaling.original_context_length", Kind::integer},
      {"rope.scaling.yarn_beta_fast", Kind::number},
      {"rope.scaling.yarn_beta_slow", Kind::number},
      {"expert_count", Kind::integer},
      {"expert_used_count", Kind::integer},
      {"expert_feed_forward_length", Kind::integer},
      {"expert_shared_feed_forward_length", Kind::integer},
      {"expert_weights_norm", Kind::boolean},
      {"expert_weights_scale", Kind::number},
      {"expert_gating_func", Kind::integer},
      {"expert_shared_count", Kind::integer},
      {"leading_dense_block_count", Kind::integer},
      {"nextn_predict_layers", Kind::integer},
      {"expert_group_count", Kind::integer},
      {"expert_group_used_count", Kind::integer},
      {"rope.dimension_count", Kind::integer},
      {"attention.q_lora_rank", Kind::integer},
      {"attention.kv_lora_rank", Kind::integer},
      {"attention.value_length", Kind::integer},
      {"attention.key_length_mla", Kind::integer},
      {"attention.value_length_mla", Kind::integer},
      {"rope.scaling.yarn_log_multiplier", Kind::number},
      {"rope.scaling.yarn_attn_factor", Kind::number},
      {"interleave_moe_layer_step", Kind::integer},
      {"attention.sliding_window_pattern", Kind::integer},
      {"ssm.conv_kernel", Kind::integer},
      {"ssm.state_size", Kind::integer},
      {"ssm.group_count", Kind::integer},
      {"ssm.time_step_rank", Kind::integer},
      {"ssm.inner_size", Kind::integer},
      {"full_attention_interval", Kind::integer},
  };
  static constexpr std::pair<const char*, Kind> kKeys[] = {
      {"tokenizer.ggml.model", Kind::string},
      {"tokenizer.ggml.pre", Kind::string},
      {"tokenizer.ggml.bos_token_id", Kind::integer},
      {"tokenizer.ggml.eos_token_id", Kind::integer},
      {"tokenizer.ggml.unknown_token_id", Kind::integer},
      {"tokenizer.ggml.padding_token_id", Kind::integer},
      {"tokenizer.ggml.add_bos_token", Kind::boolean},
      {"tokenizer.ggml.add_eos_token", Kind::boolean},
      {"tokenizer.ggml.add_space_prefix", Kind::boolean},
      {"tokenizer.chat_template", Kind::string},
  };
  auto check = [&](const std::string& key, Kind kind) -> Status {
    const GgufValue* v = g.find(key);
    if (v == nullptr) return {};
    const bool ok = kind == Kind::integer   ? g.get_int(key).has_value()
                    : kind == Kind::number  ? g.get_float(key).has_value()
                    : kind == Kind::boolean ? g.get_bool(key).has_value()
                                            : g.get_string(key).has_value();
    if (ok) return {};
    const char* want = kind == Kind::integer   ? "an integer"
                       : kind == Kind::number  ? "a number"
                       : kind == Kind::boolean ? "a bool"
                                               : "a string";
    return bad_config(where, "metadata " + key + " is " + to_string(v->type) + ", not " + want +
                                 "; the GGUF is damaged (or its writer got the type wrong): re-export it, or "
                                 "convert from the HF checkpoint");
  };
  for (const auto& [key, kind] : kArchKeys) {
    if (auto s = check(arch + "." + key, kind); !s) return s;
  }
  for (const auto& [key, kind] : kKeys) {
    if (auto s = check(key, kind); !s) return s;
  }
  return {};
}

}  // namespace

sdk::Expected<HyperParams> hparams_from_gguf(const GgufFile& g) {
  const std::string where = g.path().string();
  auto ga = g.get_string("general.architecture");
  if (!ga) return bad_config(where, "has no general.architecture");
  const auto supported = supported_gguf_architectures();
  if (std::find(supported.begin(), supported.end(), *ga) == supported.end()) {
    return Status(StatusCode::unsupported,
                  where + ": GGUF architecture '" + *ga + "' is not supported; supported: " + join(supported));
  }
  if (auto s = check_metadata_types(g, *ga, where); !s) return s;
  HyperParams h;
  Status err;
  static constexpr const char* kMissingFix =
      " (llama.cpp needs it too); the GGUF is incomplete: re-export it, or convert the HF checkpoint";
  auto req = [&](const std::string& key) -> std::int64_t {
    auto v = g.get_int(*ga + "." + key);
    if (!v) {
      // A key of the wrong type is named as such: "missing" would send the user looking for a key that is there.
      if (err) {
        err = bad_config(where, g.find(*ga + "." + key) != nullptr
                                    ? "metadata " + *ga + "." + key + " is not an integer; the GGUF is damaged"
                                    : "missing metadata " + *ga + "." + key + kMissingFix);
      }
      return 0;
    }
    return *v;
  };
  auto opt = [&](const std::string& key, std::int64_t def) { return g.get_int(*ga + "." + key).value_or(def); };
  h.hidden_size = req("embedding_length");
  h.num_layers = req("block_count");
  // GLM's multi-token-prediction layers are counted in block_count (llama.cpp loads and skips them).
  h.nextn_layers = opt("nextn_predict_layers", 0);
  if (h.nextn_layers < 0 || (h.num_layers > 0 && h.nextn_layers >= h.num_layers)) {
    return bad_config(where, "metadata " + *ga + ".nextn_predict_layers is " + std::to_string(h.nextn_layers) +
                                 ", but block_count is " + std::to_string(h.num_layers) + "; the GGUF is damaged");
  }
  h.num_layers -= h.nextn_layers;
  h.num_heads = req("attention.head_count");
  h.num_kv_heads = opt("attention.head_count_kv", h.num_heads);
  h.head_dim = opt("attention.key_length", h.num_heads > 0 ? h.hidden_size / h.num_heads : 0);
  if (*ga == "deepseek2") {
    // Multi-head latent attention: llama.cpp writes the absorbed form's widths as key_length (latent + RoPE) and
    // value_length (latent), the heads' as key_length_mla and value_length_mla, and one kv head.
    if (g.find_tensor("blk.0.attn_kv_b.weight") != nullptr) {
      return Status(StatusCode::unsupported, where +
                                                 ": this deepseek2 GGUF keeps attn_kv_b whole (llama.cpp's layout "
                                                 "before its MLA split); re-export it with a newer llama.cpp, or "
                                                 "convert the HF checkpoint");
    }
    h.kv_lora_rank = req("attention.kv_lora_rank");
    h.head_dim = req("attention.key_length_mla");
    h.v_head_dim = req("attention.value_length_mla");
    const std::int64_t rope = req("rope.dimension_count");
    if (!err) return err;
    h.num_kv_heads = h.num_heads;
    // llama.cpp guesses the query latent from the layer count; the tensor says it.
    h.q_lora_rank = opt("attention.q_lora_rank", 0);
    if (const auto* qa = g.find_tensor("blk.0.attn_q_a.weight"); qa != nullptr && qa->ne.size() == 2) {
      h.q_lora_rank = qa->ne[1];
    }
    // The absorbed form's widths llama.cpp writes beside the heads' must agree with them.
    const std::int64_t key = opt("attention.key_length", h.kv_lora_rank + rope);
    const std::int64_t value = opt("attention.value_length", h.kv_lora_rank);
    if (h.head_dim % 2 != 0 || rope < 2 || rope % 2 != 0 || rope >= h.head_dim || key != h.kv_lora_rank + rope ||
        value != h.kv_lora_rank) {
      return bad_config(where, "metadata " + *ga + ".attention.key_length_mla " + std::to_string(h.head_dim) +
                                   ", rope.dimension_count " + std::to_string(rope) + ", attention.kv_lora_rank " +
                                   std::to_string(h.kv_lora_rank) + ", key_length " + std::to_string(key) +
                                   " and value_length " + std::to_string(value) +
                                   " disagree (key_length_mla even and above the RoPE dims, key_length = "
                                   "kv_lora_rank + RoPE dims, value_length = kv_lora_rank); the GGUF is damaged: "
                                   "re-export it");
    }
    // llama.cpp reads yarn_attn_factor into its RoPE; HF's DeepSeek configs have no such factor.
    if (auto f = g.get_float(*ga + ".rope.scaling.yarn_attn_factor"); f && *f != 1.0) {
      return Status(StatusCode::unsupported, where + ": " + *ga + ".rope.scaling.yarn_attn_factor " + json(*f).dump() +
                                                 " is not supported; convert the HF checkpoint instead");
    }
  }
  // Required as llama.cpp requires them: a default would change every answer (eps) or the usable context.
  h.max_position_embeddings = req("context_length");
  h.rope_theta = g.get_float(*ga + ".rope.freq_base").value_or(10000.0);  // llama.cpp's default too
  if (auto eps = g.get_float(*ga + ".attention.layer_norm_rms_epsilon")) {
    h.rms_norm_eps = *eps;
  } else if (err) {
    err = bad_config(where, "missing metadata " + *ga + ".attention.layer_norm_rms_epsilon" + kMissingFix);
  }
  h.sliding_window = opt("attention.sliding_window", 0);
  if (auto st = g.get_string(*ga + ".rope.scaling.type"); st && *st != "none") {
    // The types llama.cpp writes; Llama 3's scaling comes as the rope_freqs tensor instead (below).
    if (*st != "linear" && *st != "yarn") {
      return Status(StatusCode::unsupported, where + ": " + *ga + ".rope.scaling.type '" + *st +
                                                 "' is not supported (linear, yarn, or none with a rope_freqs "
                                                 "tensor); convert from the HF checkpoint instead");
    }
    h.rope_scaling = {{"rope_type", *st}, {"factor", g.get_float(*ga + ".rope.scaling.factor").value_or(1.0)}};
    if (auto o = g.get_int(*ga + ".rope.scaling.original_context_length")) {
      h.rope_scaling["original_max_position_embeddings"] = *o;
    }
    if (auto b = g.get_float(*ga + ".rope.scaling.yarn_beta_fast")) h.rope_scaling["beta_fast"] = *b;
    if (auto b = g.get_float(*ga + ".rope.scaling.yarn_beta_slow")) h.rope_scaling["beta_slow"] = *b;
    // gpt-oss was trained with HF's truncate: false (llama.cpp's rope rounds the ramp's ends; GGUF has no key).
    if (*st == "yarn" && *ga == "gpt-oss") h.rope_scaling["truncate"] = false;
    // DeepSeek's mscale_all_dim, stored as 0.1 x it; llama.cpp's rope keeps cos and sin unscaled (mscale equal).
    if (auto m = g.get_float(*ga + ".rope.scaling.yarn_log_multiplier"); m && *ga == "deepseek2") {
      h.rope_scaling["mscale"] = h.rope_scaling["mscale_all_dim"] = *m / 0.1;
    }
  }
  // llama.cpp rotates n_rot dims of each head (GLM: half of them).
  if (auto rot = g.get_int(*ga + ".rope.dimension_count"); rot && *rot != h.head_dim) {
    // 0 would read as "the whole head" (rotary_dims' default) and rotate dims the model never rotated.
    if (*rot < 2 || *rot > h.head_dim || *rot % 2 != 0) {
      return bad_config(where, "metadata " + *ga + ".rope.dimension_count is " + std::to_string(*rot) +
                                   "; it must be even and in 2.." + std::to_string(h.head_dim) +
                                   " (attention.key_length); the GGUF is damaged: re-export it");
    }
    h.rotary_dims = *rot;
  }
  if (const auto* rf = g.find_tensor("rope_freqs.weight")) {
    // llama.cpp's Llama 3.1 layout: a divisor per rotated pair of every head's frequencies.
    const std::int64_t pairs = h.rope_dims() / 2;
    if (!h.rope_scaling.is_null()) {
      return Status(StatusCode::unsupported, where + ": rope_freqs.weight together with " + *ga +
                                                 ".rope.scaling.type is not supported; convert from the HF "
                                                 "checkpoint instead");
    }
    if (rf->type != sdk::DType::f32 || rf->ne.size() != 1 || rf->ne[0] != pairs) {
      return Status(StatusCode::invalid_argument, where + ": rope_freqs.weight must be f32 [" + std::to_string(pairs) +
                                                      "] (one factor per rotated pair of each head); the file is "
                                                      "damaged or from an unknown converter");
    }
    std::vector<float> f(static_cast<std::size_t>(pairs));
    if (auto s = g.read(*rf, 0, f.data(), f.size() * sizeof(float)); !s) return s;
    nlohmann::json factors = nlohmann::json::array();
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (!(f[i] > 0) || !std::isfinite(f[i])) {
        return Status(StatusCode::corrupt_data, where + ": rope_freqs.weight[" + std::to_string(i) + "] is " +
                                                    std::to_string(f[i]) + "; factors must be finite and > 0");
      }
      factors.push_back(f[i]);
    }
    h.rope_scaling = {{"rope_type", "freq_factors"}, {"factors", std::move(factors)}};
  }
  const std::int64_t n_exp = opt("expert_count", 0);
  h.architecture = *ga == "llama" && n_exp > 0 ? "mixtral" : gguf_arch_map().at(*ga);
  const std::string& a = h.architecture;
  const bool deepseek = *ga == "deepseek2";
  // llama.cpp: rope type NORM, the HF layout (no permutation).
  h.rope_interleaved = a == "ernie4_5_moe" || deepseek || a == "llama4";
  if (a == "llama" || a == "qwen3_5") {
    h.dense = true;
    h.n_experts = h.n_experts_per_tok = 1;
    h.intermediate_size = req("feed_forward_length");
  } else {
    h.n_experts = n_exp;
    h.n_experts_per_tok = req("expert_used_count");
    h.moe_intermediate_size = opt("expert_feed_forward_length", 0);
    if (h.moe_intermediate_size == 0) h.moe_intermediate_size = req("feed_forward_length");
    h.intermediate_size = opt("feed_forward_length", 0);
    // What llama.cpp assumes without the key.
    const bool default_norm = a == "mixtral" || a == "qwen3_moe" || a == "qwen3_vl_moe";
    h.norm_topk_prob = g.get_bool(*ga + ".expert_weights_norm").value_or(default_norm);
    if (a == "gpt_oss") h.norm_topk_prob = true;  // a softmax over the chosen logits (llama.cpp: SOFTMAX_WEIGHT)
    h.shared_expert_intermediate_size = opt("expert_shared_feed_forward_length", 0);
    // llama.cpp renormalizes MiniMax's and ERNIE's weights whatever the key says.
    if (a == "minimax_m2" || a == "ernie4_5_moe") h.norm_topk_prob = true;
    // Hunyuan's code renormalizes several picks (llama.cpp's loader always, whatever the key says).
    if (a == "hunyuan_moe") h.norm_topk_prob = h.n_experts_per_tok > 1;
    if (a == "ernie4_5_moe" || a == "bailing_moe_v2" || a == "hunyuan_moe") {
      // llama.cpp's converter writes intermediate_size / num_key_value_heads as ERNIE's shared expert's width, and
      // Hunyuan's intermediate_size whatever num_shared_expert is; its bailingmoe2 loader multiplies the written
      // width by the shared count again (right for the released models only, one shared expert): the tensor's own
      // width is the truth.
      for (const auto& t : g.tensors()) {
        if (t.name.ends_with(".ffn_gate_shexp.weight") && t.ne.size() == 2) {
          h.shared_expert_intermediate_size = t.ne[1];
          break;
        }
      }
    }
    if (a == "glm4_moe" || a == "minimax_m2" || a == "ernie4_5_moe" || a == "dots1" || a == "bailing_moe_v2" ||
        deepseek) {
      // Any layer's (ERNIE's softmax router has one where the file has it): a sparse layer without it is then named
      // by the converter as a missing tensor.
      for (const auto& t : g.tensors()) {
        if (t.name.ends_with(".exp_probs_b.bias")) h.router_selection_bias = true;
      }
    }
    if ((a == "glm4_moe" || a == "minimax_m2" || a == "ernie4_5_moe" || a == "dots1" || a == "bailing_moe_v2" ||
         deepseek) &&
        h.shared_expert_intermediate_size == 0) {
      const std::int64_t shared = opt("expert_shared_count", 0);
      if (shared < 0 || shared > 64) {
        return bad_config(where, "metadata " + *ga + ".expert_shared_count is " + std::to_string(shared) +
                                     "; it must be in 0..64; the GGUF is damaged: re-export it");
      }
      h.shared_expert_intermediate_size = shared_width(h.moe_intermediate_size, shared);
    }
    if (a == "glm4_moe" || a == "minimax_m2" || a == "dots1" || a == "bailing_moe_v2" || deepseek) {
      // llama.cpp's gating: 1 softmax, 2 sigmoid; without the key (0) GLM, MiniMax and dots.llm1 route by sigmoid,
      // DeepSeek (V2's files) by softmax.
      const std::int64_t gating = opt("expert_gating_func", 0);
      if (gating < 0 || gating > 2) {
        return Status(StatusCode::unsupported, where + ": " + *ga + ".expert_gating_func " + std::to_string(gating) +
                                                   " is not supported (1 softmax, 2 sigmoid)");
      }
      h.router_scoring = gating == 1 || (gating == 0 && deepseek) ? "softmax" : "sigmoid";
      if (deepseek && h.router_scoring == "sigmoid") h.architecture = "deepseek_v3";
      // llama.cpp: 0 (or no key) means no scale; its minimax-m2 loader never reads the key.
      h.routed_scaling_factor = a == "minimax_m2" ? 1.0 : g.get_float(*ga + ".expert_weights_scale").value_or(1.0);
      if (h.routed_scaling_factor == 0) h.routed_scaling_factor = 1.0;
      // llama.cpp routes within the best groups when there are several, a group scored by its best two. A deepseek2
      // GGUF with softmax gating is DeepSeek-V2 / V2.5, whose group_limited_greedy scores a group by its best one
      // (llama.cpp's top-2 sum approximates it): colibri runs the model's own rule.
      const std::int64_t groups = opt("expert_group_count", 1), used_groups = opt("expert_group_used_count", groups);
      if (groups < 1 || used_groups < 1 || used_groups > groups) {
        return bad_config(where, "metadata " + *ga + ".expert_group_count " + std::to_string(groups) +
                                     " and expert_group_used_count " + std::to_string(used_groups) +
                                     " must be 1 or more, the used count at most the count; the GGUF is damaged: "
                                     "re-export it");
      }
      if (groups > 1 && used_groups < groups) {
        h.router_groups = groups;
        h.router_groups_used = used_groups;
        if (deepseek && h.router_scoring == "softmax") h.router_group_score = "max";
      }
    }
  }
  h.attention_qkv_bias = g.find_tensor("blk.0.attn_q.bias") != nullptr;
  h.attention_out_bias = g.find_tensor("blk.0.attn_output.bias") != nullptr;
  if (a == "qwen3_moe" || a == "qwen3_vl_moe" || a == "dots1") h.qk_norm = "per_head";
  if (a == "olmoe") h.qk_norm = "full";
  if ((a == "glm4_moe" || a == "bailing_moe_v2") && g.find_tensor("blk.0.attn_q_norm.weight") != nullptr)
    h.qk_norm = "per_head";
  if (a == "hunyuan_moe" && g.find_tensor("blk.0.attn_q_norm.weight") != nullptr) h.qk_norm = "per_head_after_rope";
  if (const auto* qn = g.find_tensor("blk.0.attn_q_norm.weight"); a == "minimax_m2" && qn != nullptr) {
    h.qk_norm = !qn->ne.empty() && qn->ne[0] == h.head_dim ? "per_head" : "full";  // MiniMax: over the projection
  }
  h.shared_expert_gate = g.find_tensor("blk.0.ffn_gate_inp_shexp.weight") != nullptr;
  if (a == "qwen3_next" || is_qwen3_5(a)) {
    // llama.cpp's qwen3next (and qwen35moe and qwen35, their value heads tiled): every full_attention_interval-th
    // layer attends, the others run the gated delta rule (ssm.state_size: the key heads' width, ssm.group_count: key
    // heads, ssm.time_step_rank: value heads); the router always renormalizes; the shared expert's gate is there
    // whatever layer 0 is.
    h.qk_norm = "per_head";
    h.attn_output_gate = true;
    h.linear_tiled_heads = is_qwen3_5(a);
    h.norm_topk_prob = !h.dense;
    h.shared_expert_gate = h.shared_expert_intermediate_size > 0;
    h.linear_conv_kernel = req("ssm.conv_kernel");
    h.linear_k_dim = req("ssm.state_size");
    h.linear_k_heads = req("ssm.group_count");
    h.linear_v_heads = req("ssm.time_step_rank");
    const std::int64_t inner = req("ssm.inner_size"), interval = req("full_attention_interval");
    if (!err) return err;
    if (h.linear_v_heads <= 0 || inner <= 0 || inner % h.linear_v_heads != 0 || interval < 1) {
      return bad_config(where, "metadata " + *ga + ".ssm.inner_size " + std::to_string(inner) +
                                   ", ssm.time_step_rank " + std::to_string(h.linear_v_heads) +
                                   " and full_attention_interval " + std::to_string(interval) +
                                   " must be positive, the first a multiple of the second; the GGUF is damaged: "
                                   "re-export it");
    }
    h.linear_v_dim = inner / h.linear_v_heads;
    for (std::int64_t l = 0; l < h.num_layers && h.num_layers <= 4096; ++l) {
      if ((l + 1) % interval != 0) h.linear_layers.push_back(l);
    }
  }
  if (a == "llama4" && h.num_layers > 0 && h.num_layers <= 4096) {
    // llama.cpp fixes Llama 4's rules in its loader (its converter writes none of them): chunks of 8192 on three
    // layers of four (attention.sliding_window_pattern), no RoPE and position-scaled queries (8192, 0.1) on every
    // 4th, q/k norms unless the model has 128 experts (Maverick), sigmoid weights on the expert's input, and a shared
    // expert as wide as the routed ones. A sliding_window of 0 (MobileLLM's files) turns chunks off, leaving the last
    // layer alone without RoPE.
    h.router_scoring = "sigmoid";
    h.router_weight_on_input = true;
    h.norm_topk_prob = false;
    h.shared_expert_intermediate_size = h.moe_intermediate_size;
    const auto window = g.get_int(*ga + ".attention.sliding_window");
    h.sliding_window = 0;
    if (window && *window == 0) {
      h.nope_layers = {h.num_layers - 1};
    } else {
      const std::int64_t pattern = opt("attention.sliding_window_pattern", 4);
      if (pattern < 1) {
        return bad_config(where, "metadata " + *ga + ".attention.sliding_window_pattern is " + std::to_string(pattern) +
                                     "; it must be 1 or more; the GGUF is damaged");
      }
      h.attention_chunk = 8192;
      h.attn_temperature_floor = 8192;
      h.attn_temperature_scale = 0.1;
      for (std::int64_t l = 0; l < h.num_layers; ++l) {
        if (l % pattern < pattern - 1) h.chunked_layers.push_back(l);
        if ((l + 1) % 4 == 0) h.nope_layers.push_back(l);
      }
    }
    if (n_exp != 128) h.qk_norm = "l2";
  }
  if (a == "gpt_oss") {
    // llama.cpp fixes gpt-oss's pattern (even layers slide) and its SwiGLU constants; the GGUF carries neither.
    for (std::int64_t l = 0; l < h.num_layers && h.num_layers <= 4096 && h.sliding_window > 0; l += 2) {
      h.sliding_layers.push_back(l);
    }
    h.attention_sinks = true;
    h.router_bias = g.find_tensor("blk.0.ffn_gate_inp.bias") != nullptr;
    h.expert_activation = "swiglu_clamped";
  }
  h.tie_word_embeddings = g.find_tensor("output.weight") == nullptr;
  if (auto v = g.get_int(*ga + ".vocab_size")) {
    h.vocab_size = *v;
  } else if (const auto* t = g.find_tensor("token_embd.weight"); t != nullptr && t->ne.size() == 2) {
    h.vocab_size = t->ne[1];
  } else if (const auto* toks = g.find("tokenizer.ggml.tokens")) {
    h.vocab_size = static_cast<std::int64_t>(toks->array_size());
  }
  h.bos_token_id = g.get_int("tokenizer.ggml.bos_token_id").value_or(-1);
  if (auto e = g.get_int("tokenizer.ggml.eos_token_id")) h.eos_token_ids.push_back(*e);
  if (!err) return err;
  // Validated before the loop over the layers below, which an absurd block_count would make endless.
  if (auto s = h.validate(); !s) return bad_gguf_hparams(where, s);
  // GLM's MTP layers hold nextn.* tensors: a count that disagrees would run one as a decoder layer or drop a real one.
  for (std::int64_t l = 0; l < h.num_layers + h.nextn_layers; ++l) {
    const bool nextn = g.find_tensor("blk." + std::to_string(l) + ".nextn.eh_proj.weight") != nullptr;
    if (nextn == (l >= h.num_layers)) continue;
    return bad_config(where, "layer " + std::to_string(l) + (nextn ? " holds" : " lacks") +
                                 " multi-token-prediction tensors (nextn.eh_proj), but " + *ga +
                                 ".nextn_predict_layers " + std::to_string(h.nextn_layers) + " and block_count " +
                                 std::to_string(h.num_layers + h.nextn_layers) + " make it " +
                                 (nextn ? "a decoder layer" : "one") +
                                 "; the GGUF's metadata is damaged: re-export it");
  }
  if (!h.dense) {
    // GGUF has no decoder_sparse_step: a layer without a router is dense.
    for (std::int64_t l = 0; l < h.num_layers; ++l) {
      if (g.find_tensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight") == nullptr) h.mlp_only_layers.push_back(l);
    }
    // The dense first layers the metadata names must be the layers without a router.
    if (auto dense = g.get_int(*ga + ".leading_dense_block_count")) {
      const bool agrees = *dense >= 0 && *dense <= h.num_layers &&
                          static_cast<std::int64_t>(h.mlp_only_layers.size()) >= *dense &&
                          (*dense == 0 || h.mlp_only_layers[static_cast<std::size_t>(*dense - 1)] == *dense - 1) &&
                          (static_cast<std::int64_t>(h.mlp_only_layers.size()) == *dense ||
                           h.mlp_only_layers[static_cast<std::size_t>(*dense)] != *dense);
      if (!agrees) {
        return bad_config(where, "metadata " + *ga + ".leading_dense_block_count is " + std::to_string(*dense) +
                                     ", but the layers without a router (ffn_gate_inp) are not exactly the first " +
                                     std::to_string(std::max<std::int64_t>(*dense, 0)) +
                                     "; the GGUF is damaged: re-export it");
      }
    }
    if (auto s = h.validate(); !s) return bad_gguf_hparams(where, s);
  }
  return h;
}

ModelPlan build_plan(const HyperParams& hp, const std::string& gguf_arch) {
  ModelPlan plan;
  const bool llama_rope_permute = gguf_arch == "llama";
  const std::int64_t hid = hp.hidden_size, q_dim = hp.num_heads * hp.head_dim, kv_dim = hp.num_kv_heads * hp.head_dim;
  auto add = [&](std::string name, std::string hf, std::vector<std::int64_t> shape, TensorKind kind, std::int64_t layer,
                 std::int64_t permute = 0) {
    PlannedTensor t;
    t.gguf_name = name;
    t.name = std::move(name);
    t.hf_name = std::move(hf);
    t.shape = std::move(shape);
    t.kind = kind;
    t.layer = layer;
    t.gguf_permute_heads = llama_rope_permute ? permute : 0;
    plan.shared.push_back(std::move(t));
  };
  // Multi-head attention: q, k, v, o (llama.cpp's permuted Q/K rows undone for its llama GGUFs).
  const bool bailing = hp.architecture == "bailing_moe_v2";
  auto add_attention = [&](const std::string& b, const std::string& p, std::int64_t l) {
    if (bailing) {
      // Ling 2.0: [q; k; v] rows in attention.query_key_value (llama.cpp's attn_qkv the same), cut apart here.
      const std::int64_t all = q_dim + 2 * kv_dim;
      const std::string hf = p + "attention.query_key_value.weight", gguf = b + "attn_qkv.weight";
      const auto cut = [&](const char* name, std::int64_t first, std::int64_t rows, TensorKind kind) {
        add(b + name, hf, {rows, hid}, kind, l);
        plan.shared.back().gguf_name = gguf;
        plan.shared.back().hf_pick = plan.shared.back().gguf_pick = RowPick{1, all, first, rows, false};
      };
      cut("attn_q.weight", 0, q_dim, TensorKind::attn_q);
      cut("attn_k.weight", q_dim, kv_dim, TensorKind::attn_k);
      cut("attn_v.weight", q_dim + kv_dim, kv_dim, TensorKind::attn_v);
      add(b + "attn_output.weight", p + "attention.dense.weight", {hid, q_dim}, TensorKind::attn_o, l);
      if (hp.attention_out_bias) add(b + "attn_output.bias", p + "attention.dense.bias", {hid}, TensorKind::bias, l);
      if (hp.qk_norm == "per_head") {
        add(b + "attn_q_norm.weight", p + "attention.query_layernorm.weight", {hp.head_dim}, TensorKind::norm, l);
        add(b + "attn_k_norm.weight", p + "attention.key_layernorm.weight", {hp.head_dim}, TensorKind::norm, l);
      }
      return;
    }
    if (hp.attn_output_gate) {
      // Qwen3-Next: q_proj's rows hold each head's query, then its output gate (llama.cpp's attn_q the same).
      const RowPick query{hp.num_heads, 2 * hp.head_dim, 0, hp.head_dim, false};
      const RowPick gate{hp.num_heads, 2 * hp.head_dim, hp.head_dim, hp.head_dim, false};
      add(b + "attn_q.weight", p + "self_attn.q_proj.weight", {q_dim, hid}, TensorKind::attn_q, l);
      plan.shared.back().hf_pick = plan.shared.back().gguf_pick = query;
      add(b + "attn_q_gate.weight", p + "self_attn.q_proj.weight", {q_dim, hid}, TensorKind::attn_q, l);
      plan.shared.back().gguf_name = b + "attn_q.weight";
      plan.shared.back().hf_pick = plan.shared.back().gguf_pick = gate;
    } else {
      add(b + "attn_q.weight", p + "self_attn.q_proj.weight", {q_dim, hid}, TensorKind::attn_q, l, hp.num_heads);
    }
    add(b + "attn_k.weight", p + "self_attn.k_proj.weight", {kv_dim, hid}, TensorKind::attn_k, l, hp.num_kv_heads);
    add(b + "attn_v.weight", p + "self_attn.v_proj.weight", {kv_dim, hid}, TensorKind::attn_v, l);
    if (hp.attention_qkv_bias) {
      add(b + "attn_q.bias", p + "self_attn.q_proj.bias", {q_dim}, TensorKind::bias, l, hp.num_heads);
      add(b + "attn_k.bias", p + "self_attn.k_proj.bias", {kv_dim}, TensorKind::bias, l, hp.num_kv_heads);
      add(b + "attn_v.bias", p + "self_attn.v_proj.bias", {kv_dim}, TensorKind::bias, l);
    }
    add(b + "attn_output.weight", p + "self_attn.o_proj.weight", {hid, q_dim}, TensorKind::attn_o, l);
    if (hp.attention_out_bias) add(b + "attn_output.bias", p + "self_attn.o_proj.bias", {hid}, TensorKind::bias, l);
    if (hp.attention_sinks) add(b + "attn_sinks.weight", p + "self_attn.sinks", {hp.num_heads}, TensorKind::bias, l);
    if (hp.qk_norm == "per_head_after_rope") {  // Hunyuan's names
      add(b + "attn_q_norm.weight", p + "self_attn.query_layernorm.weight", {hp.head_dim}, TensorKind::norm, l);
      add(b + "attn_k_norm.weight", p + "self_attn.key_layernorm.weight", {hp.head_dim}, TensorKind::norm, l);
    }
    if (hp.qk_norm == "per_head") {
      add(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", {hp.head_dim}, TensorKind::norm, l);
      add(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", {hp.head_dim}, TensorKind::norm, l);
    } else if (hp.qk_norm == "full") {
      add(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", {q_dim}, TensorKind::norm, l);
      add(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", {kv_dim}, TensorKind::norm, l);
    }
  };
  // Multi-head latent attention, split for the absorbed form: the queries' parts with and without RoPE, the latent
  // and the RoPE key, kv_b_proj's key part transposed per head (k_b) and its value part (v_b). llama.cpp's deepseek2
  // GGUFs hold the same cuts of q and kv_a_mqa, and k_b / v_b already split.
  auto add_mla = [&](const std::string& b, const std::string& p, std::int64_t l) {
    const std::int64_t nh = hp.num_heads, dn = hp.qk_nope_dim(), dr = hp.rope_dims(), dc = hp.kv_lora_rank;
    const std::int64_t dv = hp.v_head_dim, ql = hp.q_lora_rank, q_in = ql > 0 ? ql : hid;
    const std::string a = p + "self_attn.";
    if (ql > 0) {
      add(b + "attn_q_a.weight", a + "q_a_proj.weight", {ql, hid}, TensorKind::attn_q, l);
      add(b + "attn_q_a_norm.weight", a + "q_a_layernorm.weight", {ql}, TensorKind::norm, l);
    }
    const std::string q_hf = a + (ql > 0 ? "q_b_proj.weight" : "q_proj.weight");
    const std::string q_gguf = b + (ql > 0 ? "attn_q_b.weight" : "attn_q.weight");
    const auto cut = [&](std::string name, const std::string& hf, const std::string& gguf, std::int64_t rows,
                         std::int64_t cols, TensorKind kind, RowPick pick, RowPick gguf_pick) {
      add(std::move(name), hf, {rows, cols}, kind, l);
      plan.shared.back().gguf_name = gguf;
      plan.shared.back().hf_pick = pick;
      plan.shared.back().gguf_pick = gguf_pick;
    };
    const RowPick q_nope{nh, dn + dr, 0, dn, false}, q_rope{nh, dn + dr, dn, dr, false};
    cut(b + "attn_q_nope.weight", q_hf, q_gguf, nh * dn, q_in, TensorKind::attn_q, q_nope, q_nope);
    cut(b + "attn_q_rope.weight", q_hf, q_gguf, nh * dr, q_in, TensorKind::attn_q, q_rope, q_rope);
    const RowPick latent{1, dc + dr, 0, dc, false}, k_rope{1, dc + dr, dc, dr, false};
    const std::string kv_a = a + "kv_a_proj_with_mqa.weight", kv_a_gguf = b + "attn_kv_a_mqa.weight";
    cut(b + "attn_kv_a.weight", kv_a, kv_a_gguf, dc, hid, TensorKind::attn_k, latent, latent);
    cut(b + "attn_k_rope.weight", kv_a, kv_a_gguf, dr, hid, TensorKind::attn_k, k_rope, k_rope);
    add(b + "attn_kv_a_norm.weight", a + "kv_a_layernorm.weight", {dc}, TensorKind::norm, l);
    cut(b + "attn_k_b.weight", a + "kv_b_proj.weight", b + "attn_k_b.weight", nh * dc, dn, TensorKind::attn_k,
        RowPick{nh, dn + dv, 0, dn, true}, RowPick{});
    cut(b + "attn_v_b.weight", a + "kv_b_proj.weight", b + "attn_v_b.weight", nh * dv, dc, TensorKind::attn_v,
        RowPick{nh, dn + dv, dn, dv, false}, RowPick{});
    add(b + "attn_output.weight", a + "o_proj.weight", {hid, nh * dv}, TensorKind::attn_o, l);
  };
  // Qwen3-Next's gated-delta-rule layers. in_proj_qkvz's rows come in groups, one per key head: its q, k, v (the
  // group's value heads) and z; in_proj_ba's so with b and a. They are cut into q, k, v and z (and b, a) of every
  // head, as is the convolution's weight; llama.cpp's qwen3next GGUFs hold q, k and v of every head in attn_qkv (and
  // the convolution likewise), z in attn_gate and b, a in ssm_ba by group.
  const bool qwen3_5 = is_qwen3_5(hp.architecture);
  auto add_linear = [&](const std::string& b, const std::string& p, std::int64_t l) {
    const std::int64_t nk = hp.linear_k_heads, dk = hp.linear_k_dim, dv = hp.linear_v_dim;
    const std::int64_t r = hp.linear_v_heads / nk, kd = hp.linear_key_width(), vd = hp.linear_value_width();
    const std::int64_t group = 2 * dk + 2 * r * dv, conv = hp.linear_conv_dim(), K = hp.linear_conv_kernel;
    const std::string a = p + "linear_attn.";
    const auto cut = [&](const std::string& name, const std::string& hf, const std::string& gguf, std::int64_t rows,
                         std::int64_t cols, TensorKind kind, RowPick hf_pick, RowPick gguf_pick) {
      add(name, hf, {rows, cols}, kind, l);
      plan.shared.back().gguf_name = gguf;
      plan.shared.back().hf_pick = hf_pick;
      plan.shared.back().gguf_pick = gguf_pick;
    };
    const std::int64_t nv = hp.linear_v_heads;
    // Qwen3.5: q, k and v of every head in in_proj_qkv, z, b and a apart, the value heads tiled on the way
    // (HeadTiling).
    const auto tiled = [&](std::int64_t width, bool columns) {
      if (!qwen3_5) return;
      plan.shared.back().hf_tiling = HeadTiling{nk, r, width, columns};
    };
    const std::string cw = a + "conv1d.weight", cw_gguf = b + "ssm_conv1d.weight", qkv = b + "attn_qkv.weight";
    if (qwen3_5) {
      const std::string in_qkv = a + "in_proj_qkv.weight";
      cut(b + "ssm_q.weight", in_qkv, qkv, kd, hid, TensorKind::attn_q, {1, conv, 0, kd}, {1, conv, 0, kd});
      cut(b + "ssm_k.weight", in_qkv, qkv, kd, hid, TensorKind::attn_k, {1, conv, kd, kd}, {1, conv, kd, kd});
      cut(b + "ssm_v.weight", in_qkv, qkv, vd, hid, TensorKind::attn_v, {1, conv, 2 * kd, vd}, {1, conv, 2 * kd, vd});
      tiled(dv, false);
      add(b + "ssm_z.weight", a + "in_proj_z.weight", {vd, hid}, TensorKind::attn_v, l);
      plan.shared.back().gguf_name = b + "attn_gate.weight";
      tiled(dv, false);
      add(b + "ssm_beta.weight", a + "in_proj_b.weight", {nv, hid}, TensorKind::attn_v, l);
      tiled(1, false);
      add(b + "ssm_alpha.weight", a + "in_proj_a.weight", {nv, hid}, TensorKind::attn_v, l);
      tiled(1, false);
    } else {
      const std::string qkvz = a + "in_proj_qkvz.weight";
      cut(b + "ssm_q.weight", qkvz, qkv, kd, hid, TensorKind::attn_q, {nk, group, 0, dk}, {1, conv, 0, kd});
      cut(b + "ssm_k.weight", qkvz, qkv, kd, hid, TensorKind::attn_k, {nk, group, dk, dk}, {1, conv, kd, kd});
      cut(b + "ssm_v.weight", qkvz, qkv, vd, hid, TensorKind::attn_v, {nk, group, 2 * dk, r * dv},
          {1, conv, 2 * kd, vd});
      cut(b + "ssm_z.weight", qkvz, b + "attn_gate.weight", vd, hid, TensorKind::attn_v,
          {nk, group, 2 * dk + r * dv, r * dv}, {});
      const std::string ba = a + "in_proj_ba.weight", ba_gguf = b + "ssm_ba.weight";
      cut(b + "ssm_beta.weight", ba, ba_gguf, nv, hid, TensorKind::attn_v, {nk, 2 * r, 0, r}, {nk, 2 * r, 0, r});
      cut(b + "ssm_alpha.weight", ba, ba_gguf, nv, hid, TensorKind::attn_v, {nk, 2 * r, r, r}, {nk, 2 * r, r, r});
    }
    cut(b + "ssm_conv1d_q.weight", cw, cw_gguf, kd, K, TensorKind::norm, {1, conv, 0, kd}, {1, conv, 0, kd});
    cut(b + "ssm_conv1d_k.weight", cw, cw_gguf, kd, K, TensorKind::norm, {1, conv, kd, kd}, {1, conv, kd, kd});
    cut(b + "ssm_conv1d_v.weight", cw, cw_gguf, vd, K, TensorKind::norm, {1, conv, 2 * kd, vd}, {1, conv, 2 * kd, vd});
    tiled(dv, false);
    add(b + "ssm_a", a + "A_log", {nv}, TensorKind::bias, l);
    plan.shared.back().hf_transform = ValueTransform::neg_exp;
    tiled(1, true);
    add(b + "ssm_dt.bias", a + "dt_bias", {nv}, TensorKind::bias, l);
    tiled(1, true);
    add(b + "ssm_norm.weight", a + "norm.weight", {dv}, TensorKind::norm, l);
    add(b + "ssm_out.weight", a + "out_proj.weight", {hid, vd}, TensorKind::attn_o, l);
    tiled(dv, true);
  };
  add("token_embd.weight", bailing ? "model.word_embeddings.weight" : "model.embed_tokens.weight", {hp.vocab_size, hid},
      TensorKind::embedding, -1);
  // Mixtral's names (block_sparse_moe, w1/w3/w2), which MiniMax-M2 keeps.
  const bool mixtral = hp.architecture == "mixtral" || hp.architecture == "minimax_m2";
  const bool gpt_oss = hp.architecture == "gpt_oss";
  const bool llama4 = hp.architecture == "llama4";  // feed_forward.*, experts fused as gate_up_proj [E, D, 2F]
  // Experts fused as gate_up_proj [E, D, 2F], gate the first half, and down_proj [E, F, D]: Llama 4, Qwen3-VL.
  const bool fused_halves = llama4 || hp.architecture == "qwen3_vl_moe" || qwen3_5;
  for (std::int64_t l = 0; l < hp.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".", p = "model.layers." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", p + "input_layernorm.weight", {hid}, TensorKind::norm, l);
    if (hp.mla()) {
      add_mla(b, p, l);
    } else if (hp.layer_is_linear(l)) {
      add_linear(b, p, l);
    } else {
      add_attention(b, p, l);
    }
    add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", {hid}, TensorKind::norm, l);
    if (gguf_arch == "gpt-oss" || gguf_arch == "glm4moe" || gguf_arch == "qwen3next" || gguf_arch == "qwen35moe" ||
        gguf_arch == "qwen35")
      plan.shared.back().gguf_name = b + "post_attention_norm.weight";
    const bool sparse = hp.layer_is_sparse(l);
    if (sparse) {
      const std::string router = mixtral                            ? "block_sparse_moe.gate"
                                 : gpt_oss                          ? "mlp.router"
                                 : llama4                           ? "feed_forward.router"
                                 : hp.architecture == "hunyuan_moe" ? "mlp.gate.wg"
                                                                    : "mlp.gate";
      add(b + "ffn_gate_inp.weight", p + router + ".weight", {hp.n_experts, hid}, TensorKind::router, l);
      if (hp.router_bias) add(b + "ffn_gate_inp.bias", p + router + ".bias", {hp.n_experts}, TensorKind::bias, l);
      if (hp.router_selection_bias) {
        const std::string hf = hp.architecture == "minimax_m2"     ? p + "block_sparse_moe.e_score_correction_bias"
                               : hp.architecture == "ernie4_5_moe" ? p + "mlp.moe_statics.e_score_correction_bias"
                               : bailing                           ? p + "mlp.gate.expert_bias"
                                                                   : p + router + ".e_score_correction_bias";
        add(b + "exp_probs_b.bias", hf, {hp.n_experts}, TensorKind::bias, l);
      }
      if (hp.shared_expert_intermediate_size > 0) {
        const std::int64_t sff = hp.shared_expert_intermediate_size;
        const bool plural = hp.architecture == "glm4_moe" || hp.architecture == "ernie4_5_moe" ||
                            hp.architecture == "dots1" || bailing || hp.architecture == "deepseek_v2" ||
                            hp.architecture == "deepseek_v3";
        const std::string shared = p + (plural                             ? "mlp.shared_experts."
                                        : llama4                           ? "feed_forward.shared_expert."
                                        : hp.architecture == "hunyuan_moe" ? "mlp.shared_mlp."
                                                                           : "mlp.shared_expert.");
        add(b + "ffn_gate_shexp.weight", shared + "gate_proj.weight", {sff, hid}, TensorKind::shared_expert, l);
        add(b + "ffn_up_shexp.weight", shared + "up_proj.weight", {sff, hid}, TensorKind::shared_expert, l);
        add(b + "ffn_down_shexp.weight", shared + "down_proj.weight", {hid, sff}, TensorKind::shared_expert, l);
        if (hp.shared_expert_gate) {
          add(b + "ffn_gate_inp_shexp.weight", p + "mlp.shared_expert_gate.weight", {1, hid},
              TensorKind::shared_expert_gate, l);
        }
      }
    }
    // Experts: routed ones, or the dense FFN as expert 0.
    const std::int64_t ff = hp.layer_ffn_size(l);
    std::vector<std::vector<PlannedTensor>> layer;
    for (std::int64_t e = 0; e < hp.layer_experts(l); ++e) {
      std::vector<PlannedTensor> parts(hp.expert_bias() ? 6 : 3);
      static const char* kPart[3] = {"gate", "up", "down"};
      static const char* kMixtral[3] = {"w1", "w3", "w2"};
      static const TensorKind kKind[3] = {TensorKind::expert_gate, TensorKind::expert_up, TensorKind::expert_down};
      for (int i = 0; i < 3; ++i) {
        PlannedTensor& t = parts[static_cast<std::size_t>(i)];
        t.name = b + "ffn_" + kPart[i] + "." + std::to_string(e) + ".weight";
        t.kind = kKind[i];
        t.layer = l;
        t.expert = e;
        t.shape = i == 2 ? std::vector<std::int64_t>{hid, ff} : std::vector<std::int64_t>{ff, hid};
        if (!sparse) {
          t.hf_name = p + (llama4 ? "feed_forward." : "mlp.") + kPart[i] + "_proj.weight";
          t.gguf_name = b + "ffn_" + kPart[i] + ".weight";
        } else {
          t.hf_name = mixtral ? p + "block_sparse_moe.experts." + std::to_string(e) + "." + kMixtral[i] + ".weight"
                              : p + "mlp.experts." + std::to_string(e) + "." + kPart[i] + "_proj.weight";
          t.gguf_name = b + "ffn_" + kPart[i] + "_exps.weight";
          t.gguf_expert = e;
          t.gguf_alt_name = b + "ffn_" + kPart[i] + "." + std::to_string(e) + ".weight";
        }
        if (gpt_oss || (fused_halves && sparse)) {
          const std::string experts = p + (llama4 ? "feed_forward.experts." : "mlp.experts.");
          t.hf_name = experts + (i == 2 ? "down_proj" : "gate_up_proj");
          t.hf_expert = e;
          t.hf_fused_part = i == 2 ? -1 : i;
          t.hf_fused_halves = fused_halves;
          t.hf_fused_output_major = qwen3_5;
        }
      }
      if (hp.expert_bias()) {  // gpt-oss: a bias per projection, cut from [E, 2F] / [E, D] tensors
        for (int i = 0; i < 3; ++i) {
          PlannedTensor& t = parts[static_cast<std::size_t>(3 + i)];
          t.name = b + "ffn_" + kPart[i] + "." + std::to_string(e) + ".bias";
          t.kind = TensorKind::bias;
          t.layer = l;
          t.expert = e;
          t.shape = {i == 2 ? hid : ff};
          t.hf_name = p + (i == 2 ? "mlp.experts.down_proj_bias" : "mlp.experts.gate_up_proj_bias");
          t.hf_expert = e;
          t.hf_fused_part = i == 2 ? -1 : i;
          t.gguf_name = b + "ffn_" + kPart[i] + "_exps.bias";  // llama.cpp: [E, F] / [E, D]
          t.gguf_expert = e;
        }
      }
      layer.push_back(std::move(parts));
    }
    plan.experts.push_back(std::move(layer));
  }
  add("output_norm.weight", "model.norm.weight", {hid}, TensorKind::norm, -1);
  if (!hp.tie_word_embeddings) add("output.weight", "lm_head.weight", {hp.vocab_size, hid}, TensorKind::output, -1);
  if (hp.architecture == "qwen3_next" || qwen3_5) {  // Qwen3NextRMSNorm: x * (1 + w), the weights stored around 0
    for (auto& t : plan.shared) {
      if (t.kind == TensorKind::norm && !t.name.ends_with("ssm_norm.weight") &&
          t.name.find("ssm_conv1d") == std::string::npos)
        t.hf_transform = ValueTransform::add_one;
    }
  }
  // Image-text checkpoints hold the language model under a prefix (their vision tower is not read): Llama 4's all of
  // it under language_model., Qwen3-VL's model. under model.language_model. (its lm_head where it was).
  const bool llama4_vision = hp.hf_architecture == "Llama4ForConditionalGeneration";
  if (llama4_vision || hp.hf_architecture == "Qwen3VLMoeForConditionalGeneration" ||
      hp.hf_architecture == "Qwen3_5MoeForConditionalGeneration" ||
      hp.hf_architecture == "Qwen3_5ForConditionalGeneration") {
    const auto move = [&](PlannedTensor& t) {
      if (llama4_vision) {
        t.hf_name = "language_model." + t.hf_name;
      } else if (t.hf_name.starts_with("model.")) {
        t.hf_name = "model.language_model." + t.hf_name.substr(6);
      }
    };
    for (auto& t : plan.shared) move(t);
    for (auto& layer : plan.experts) {
      for (auto& parts : layer) {
        for (auto& t : parts) move(t);
      }
    }
  }
  return plan;
}

}  // namespace colibri::model
