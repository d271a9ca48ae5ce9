// Per-tensor type selection of the quantization presets (see preset.hpp for the rules and the
// llama.cpp code they follow).
#include "colibri/quant/preset.hpp"

#include <array>
#include <charconv>
#include <string>

namespace colibri::quant {

namespace {

constexpr std::array<Preset, 9> kPresets{Preset::f32,    Preset::f16,    Preset::bf16,   Preset::q8_0, Preset::q6_k,
                                         Preset::q5_k_m, Preset::q4_k_m, Preset::q3_k_m, Preset::q2_k};

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

std::int64_t block_elems(DType type) noexcept {
  const auto* t = sdk::dtype_traits(type);
  return t ? t->block_elems : 1;
}

bool is_per_layer(TensorRole role) noexcept {
  switch (role) {
    case TensorRole::token_embd:
    case TensorRole::output:
    case TensorRole::norm:
    case TensorRole::bias: return false;
    default: return true;
  }
}

bool always_f32(TensorRole role) noexcept {
  switch (role) {
    case TensorRole::norm:
    case TensorRole::attn_q_norm:
    case TensorRole::attn_k_norm:
    case TensorRole::bias:
    case TensorRole::ffn_gate_inp:
    case TensorRole::ffn_gate_inp_shexp: return true;
    default: return false;
  }
}

// llama.cpp's tensor_type_fallback, restricted to the formats colibri has (see preset.hpp).
DType fallback_type(DType wanted, std::int64_t row_elems) noexcept {
  DType out = DType::f16;
  switch (wanted) {
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:  // llama.cpp: q5_0 (5.5 bits), nearest supported: q4_0 (4.5)
    case DType::q5_k:  // llama.cpp: q5_1 (6.0 bits), nearest supported: q4_0 (4.5)
      out = DType::q4_0;
      break;
    case DType::q6_k: out = DType::q8_0; break;
    default:  // q8_0 / q4_0 rows not a multiple of 32
      out = DType::f16;
      break;
  }
  if (row_elems % block_elems(out) != 0) out = DType::f16;
  return out;
}

// The mix of llama_tensor_get_type_impl for the presets colibri offers.
DType mixed_type(Preset preset, DType base, const ModelShape& m, const TensorDesc& t) noexcept {
  const int layer = t.layer;
  const int n_layers = m.n_layers;
  const bool eight_experts = m.n_experts == 8;
  const int n_gqa = m.n_head_kv > 0 ? m.n_head / m.n_head_kv : 0;
  DType type = base;

  const bool output_like = t.role == TensorRole::output || (m.tied_embeddings && t.role == TensorRole::token_embd);
  if (output_like) {
    if (t.row_elems % block_elems(base) != 0) {
      type = DType::q8_0;
    } else if (type != DType::q8_0) {
      type = DType::q6_k;
    }
    return type;
  }
  switch (t.role) {
    case TensorRole::attn_v:
    case TensorRole::attn_qkv:
      if (preset == Preset::q2_k) {
        type = n_gqa >= 4 ? DType::q4_k : DType::q3_k;
      } else if (preset == Preset::q3_k_m) {
        type = layer < 2 ? DType::q5_k : DType::q4_k;
      } else if ((preset == Preset::q4_k_m || preset == Preset::q5_k_m) && use_more_bits(layer, n_layers)) {
        type = DType::q6_k;
      }
      if (m.is_70b && (type == DType::q3_k || type == DType::q4_k)) type = DType::q5_k;
      if (eight_experts) type = DType::q8_0;
      break;
    case TensorRole::attn_k:
      if (eight_experts) type = DType::q8_0;
      break;
    case TensorRole::ffn_down:
    case TensorRole::ffn_down_shexp:
      if (preset == Preset::q2_k) {
        type = DType::q3_k;
      } else if (preset == Preset::q3_k_m) {
        type = layer < n_layers / 16 ? DType::q5_k : DType::q4_k;
      } else if ((preset == Preset::q4_k_m || preset == Preset::q5_k_m) && use_more_bits(layer, n_layers)) {
        type = DType::q6_k;
      }
      break;
    case TensorRole::attn_output:
      if (eight_experts) {
        if (preset == Preset::q2_k || preset == Preset::q3_k_m || preset == Preset::q4_k_m) type = DType::q5_k;
      } else if (preset == Preset::q2_k) {
        type = DType::q3_k;
      } else if (preset == Preset::q3_k_m) {
        type = DType::q4_k;
      }
      break;
    default:  // token_embd (untied), attn_q, ffn_gate / ffn_up (dense, expert or shared) keep the base type
      break;
  }
  return type;
}

}  // namespace

bool use_more_bits(int layer, int n_layers) noexcept {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

std::span<const Preset> all_presets() noexcept {
  return kPresets;
}

std::string_view to_string(Preset preset) noexcept {
  switch (preset) {
    case Preset::f32: return "f32";
    case Preset::f16: return "f16";
    case Preset::bf16: return "bf16";
    case Preset::q8_0: return "q8_0";
    case Preset::q6_k: return "q6_k";
    case Preset::q5_k_m: return "q5_k_m";
    case Preset::q4_k_m: return "q4_k_m";
    case Preset::q3_k_m: return "q3_k_m";
    case Preset::q2_k: return "q2_k";
  }
  return "unknown";
}

std::optional<Preset> parse_preset(std::string_view name) noexcept {
  for (Preset p : kPresets) {
    if (iequals(to_string(p), name)) return p;
  }
  return std::nullopt;
}

std::string preset_names() {
  std::string out;
  for (Preset p : kPresets) {
    if (!out.empty()) out += ", ";
    out += to_string(p);
  }
  return out;
}

DType preset_base_type(Preset preset) noexcept {
  switch (preset) {
    case Preset::f32: return DType::f32;
    case Preset::f16: return DType::f16;
    case Preset::bf16: return DType::bf16;
    case Preset::q8_0: return DType::q8_0;
    case Preset::q6_k: return DType::q6_k;
    case Preset::q5_k_m: return DType::q5_k;
    case Preset::q4_k_m: return DType::q4_k;
    case Preset::q3_k_m: return DType::q3_k;
    case Preset::q2_k: return DType::q2_k;
  }
  return DType::f32;
}

std::string_view to_string(TensorRole role) noexcept {
  switch (role) {
    case TensorRole::token_embd: return "token_embd";
    case TensorRole::output: return "output";
    case TensorRole::attn_q: return "attn_q";
    case TensorRole::attn_k: return "attn_k";
    case TensorRole::attn_v: return "attn_v";
    case TensorRole::attn_output: return "attn_output";
    case TensorRole::attn_qkv: return "attn_qkv";
    case TensorRole::ffn_gate: return "ffn_gate";
    case TensorRole::ffn_up: return "ffn_up";
    case TensorRole::ffn_down: return "ffn_down";
    case TensorRole::ffn_gate_shexp: return "ffn_gate_shexp";
    case TensorRole::ffn_up_shexp: return "ffn_up_shexp";
    case TensorRole::ffn_down_shexp: return "ffn_down_shexp";
    case TensorRole::ffn_gate_inp: return "ffn_gate_inp";
    case TensorRole::ffn_gate_inp_shexp: return "ffn_gate_inp_shexp";
    case TensorRole::norm: return "norm";
    case TensorRole::attn_q_norm: return "attn_q_norm";
    case TensorRole::attn_k_norm: return "attn_k_norm";
    case TensorRole::bias: return "bias";
  }
  return "unknown";
}

std::optional<TensorRole> role_from_gguf_name(std::string_view name, int* layer) noexcept {
  int blk = -1;
  std::string_view rest = name;
  if (rest.starts_with("blk.")) {
    rest.remove_prefix(4);
    const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), blk);
    if (ec != std::errc() || blk < 0 || ptr == rest.data() + rest.size() || *ptr != '.') return std::nullopt;
    rest.remove_prefix(static_cast<std::size_t>(ptr - rest.data()) + 1);
  }
  if (layer != nullptr) *layer = blk;
  if (rest.ends_with(".bias")) return TensorRole::bias;
  if (!rest.ends_with(".weight")) return std::nullopt;
  rest.remove_suffix(7);
  // Old Mixtral GGUFs split experts: "ffn_gate.3".
  if (const auto dot = rest.find('.'); dot != std::string_view::npos) {
    std::string_view idx = rest.substr(dot + 1);
    int e = 0;
    const auto [p, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), e);
    if (ec != std::errc() || p != idx.data() + idx.size()) return std::nullopt;
    rest = rest.substr(0, dot);
  }
  if (blk < 0) {
    if (rest == "token_embd") return TensorRole::token_embd;
    if (rest == "output") return TensorRole::output;
    if (rest == "output_norm") return TensorRole::norm;
    return std::nullopt;
  }
  struct Entry {
    std::string_view name;
    TensorRole role;
  };
  static constexpr Entry kEntries[] = {
      {"attn_q", TensorRole::attn_q},
      {"attn_k", TensorRole::attn_k},
      {"attn_v", TensorRole::attn_v},
      {"attn_output", TensorRole::attn_output},
      {"attn_qkv", TensorRole::attn_qkv},
      {"attn_q_norm", TensorRole::attn_q_norm},
      {"attn_k_norm", TensorRole::attn_k_norm},
      {"ffn_gate", TensorRole::ffn_gate},
      {"ffn_gate_exps", TensorRole::ffn_gate},
      {"ffn_up", TensorRole::ffn_up},
      {"ffn_up_exps", TensorRole::ffn_up},
      {"ffn_down", TensorRole::ffn_down},
      {"ffn_down_exps", TensorRole::ffn_down},
      {"ffn_gate_shexp", TensorRole::ffn_gate_shexp},
      {"ffn_up_shexp", TensorRole::ffn_up_shexp},
      {"ffn_down_shexp", TensorRole::ffn_down_shexp},
      {"ffn_gate_inp", TensorRole::ffn_gate_inp},
      {"ffn_gate_inp_shexp", TensorRole::ffn_gate_inp_shexp},
  };
  for (const auto& e : kEntries) {
    if (rest == e.name) return e.role;
  }
  if (rest.ends_with("_norm")) return TensorRole::norm;
  return std::nullopt;
}

sdk::Expected<TypeChoice> choose_type(Preset preset, const ModelShape& model, const TensorDesc& tensor) {
  if (model.n_layers < 1) {
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           "choose_type: the model has " + std::to_string(model.n_layers) + " layers; need at least 1");
  }
  if (tensor.row_elems < 1) {
    return sdk::make_error(
        sdk::StatusCode::invalid_argument,
        "choose_type: " + std::string(to_string(tensor.role)) + " has row length " + std::to_string(tensor.row_elems));
  }
  if (is_per_layer(tensor.role) && !always_f32(tensor.role) && (tensor.layer < 0 || tensor.layer >= model.n_layers)) {
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           "choose_type: " + std::string(to_string(tensor.role)) + " in layer " +
                               std::to_string(tensor.layer) + ", outside [0, " + std::to_string(model.n_layers) + ")");
  }
  TypeChoice choice;
  const DType base = preset_base_type(preset);
  if (always_f32(tensor.role)) {
    choice.type = choice.preset_type = DType::f32;
    return choice;
  }
  // Like llama.cpp, only the quantized presets mix types.
  const bool quantized = sdk::dtype_traits(base)->quantized;
  choice.preset_type = quantized ? mixed_type(preset, base, model, tensor) : base;
  choice.type = choice.preset_type;
  const std::int64_t block = block_elems(choice.preset_type);
  if (tensor.row_elems % block != 0) {
    choice.type = fallback_type(choice.preset_type, tensor.row_elems);
    choice.fallback = true;
    choice.reason = std::string(to_string(tensor.role)) + ": row length " + std::to_string(tensor.row_elems) +
                    " is not a multiple of " + std::to_string(block) + " (" +
                    std::string(sdk::to_string(choice.preset_type)) + "); stored as " +
                    std::string(sdk::to_string(choice.type));
  }
  return choice;
}

sdk::Expected<TypeChoice> choose_type(Preset preset, TensorRole role, int layer, int n_layers, int n_experts,
                                      std::int64_t row_elems, int n_head, int n_head_kv, bool tied_embeddings) {
  ModelShape model;
  model.n_layers = n_layers;
  model.n_experts = n_experts;
  model.n_head = n_head;
  model.n_head_kv = n_head_kv;
  model.tied_embeddings = tied_embeddings;
  return choose_type(preset, model, TensorDesc{role, layer, row_elems});
}

}  // namespace colibri::quant
