// Quantization presets: which block format each tensor of a model gets, following llama.cpp's
// llama_tensor_get_type() for the presets of the same names (llama-quantize without an importance
// matrix, without --pure and without per-tensor overrides).
//
// What the mixes do (k-quant presets; f32/f16/bf16/q8_0 use one type for every weight matrix):
//  - output.weight (and token_embd when the embeddings are tied): q6_k, or q8_0 when its rows do not
//    divide into 256-element blocks; q8_0 under the q8_0 preset.
//  - attn_v / attn_qkv: q2_k -> q4_k if n_head / n_head_kv >= 4 else q3_k; q3_k_m -> q5_k for layers
//    0-1 then q4_k; q4_k_m / q5_k_m -> q6_k on the layers use_more_bits() picks (the first and last
//    eighth and every third layer between). A "70B" model moves q3_k/q4_k to q5_k. With exactly
//    8 routed experts (Mixtral) attn_v and attn_k become q8_0.
//  - ffn_down (dense, routed experts and shared expert): q2_k -> q3_k; q3_k_m -> q5_k for the first
//    sixteenth of the layers then q4_k; q4_k_m / q5_k_m -> q6_k on use_more_bits() layers.
//  - attn_output: with 8 experts, q2_k / q3_k_m / q4_k_m -> q5_k; otherwise q2_k -> q3_k,
//    q3_k_m -> q4_k.
//  - norms (incl. Q/K norms), biases, the router (ffn_gate_inp) and the shared-expert gate: f32.
//
// Fallback when a row does not divide into the chosen format's blocks (llama.cpp's
// tensor_type_fallback, mapped onto the formats colibri supports): llama.cpp picks q4_0 for
// q2_k/q3_k, q5_0 for q4_k, q5_1 for q5_k and q8_0 for q6_k; colibri lacks q5_0/q5_1 and takes the
// supported 32-element format nearest in bits per weight to llama.cpp's pick, so q2_k, q3_k, q4_k and
// q5_k fall back to q4_0 and q6_k to q8_0. When the row is not a multiple of 32 either, f16 (as
// llama.cpp does). A q8_0/q4_0 tensor whose row is not a multiple of 32 also becomes f16, where
// llama.cpp gives up.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "colibri/quant/quant.hpp"

namespace colibri::quant {

enum class Preset : std::uint8_t { f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q3_k_m, q2_k };

std::span<const Preset> all_presets() noexcept;
std::string_view to_string(Preset preset) noexcept;  // "q4_k_m"
// Case-insensitive ("Q4_K_M" works); nullopt for an unknown name.
std::optional<Preset> parse_preset(std::string_view name) noexcept;
// "f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q3_k_m, q2_k" for error messages.
std::string preset_names();
// The type most tensors get (llama_ftype_get_default_type).
DType preset_base_type(Preset preset) noexcept;

// What a tensor is, in the sense the presets care about.
enum class TensorRole : std::uint8_t {
  token_embd,
  output,
  attn_q,
  attn_k,
  attn_v,
  attn_output,
  attn_qkv,  // fused QKV projection (treated as attn_v, as llama.cpp does)
  ffn_gate,  // dense FFN or one routed expert
  ffn_up,
  ffn_down,
  ffn_gate_shexp,  // shared expert (Qwen2-MoE)
  ffn_up_shexp,
  ffn_down_shexp,
  ffn_gate_inp,        // router
  ffn_gate_inp_shexp,  // shared-expert gate
  norm,                // attn_norm, ffn_norm, output_norm
  attn_q_norm,
  attn_k_norm,
  bias,  // any 1-D bias
};

std::string_view to_string(TensorRole role) noexcept;
// The role of a GGUF / llama.cpp tensor name ("blk.3.ffn_down_exps.weight", "output.weight") and its
// layer (-1 for tensors outside the blocks); nullopt for a name the presets do not know.
std::optional<TensorRole> role_from_gguf_name(std::string_view name, int* layer = nullptr) noexcept;

struct ModelShape {
  int n_layers = 0;
  int n_experts = 0;             // routed experts per layer; 0 or 1 for a dense model
  int n_head = 0;                // attention heads
  int n_head_kv = 0;             // key/value heads (n_head / n_head_kv >= 4 changes q2_k's attn_v)
  bool tied_embeddings = false;  // no output.weight: token_embd is also the output projection
  bool is_70b = false;           // llama.cpp's LLM_TYPE_70B rule for attn_v
};

struct TensorDesc {
  TensorRole role = TensorRole::norm;
  int layer = -1;              // block index for per-layer tensors
  std::int64_t row_elems = 0;  // elements per row (GGUF ne[0], the input dimension)
};

struct TypeChoice {
  DType type = DType::f32;         // what to store
  DType preset_type = DType::f32;  // what the preset's mix asked for before any fallback
  bool fallback = false;           // true when type != preset_type because of the row length
  std::string reason;              // why the fallback happened; empty otherwise
};

// The type of one tensor under `preset`. Errors (invalid_argument): n_layers < 1, a per-layer role
// with layer outside [0, n_layers), row_elems < 1.
sdk::Expected<TypeChoice> choose_type(Preset preset, const ModelShape& model, const TensorDesc& tensor);

// Flat form of the same call.
sdk::Expected<TypeChoice> choose_type(Preset preset, TensorRole role, int layer, int n_layers, int n_experts,
                                      std::int64_t row_elems, int n_head = 0, int n_head_kv = 0,
                                      bool tied_embeddings = false);

// The call shape of llama.cpp's helper: use_more_bits(i_layer, n_layers).
bool use_more_bits(int layer, int n_layers) noexcept;

}  // namespace colibri::quant
