// The colibri model on disk (DESIGN.md, "Model on disk"): manifest.json, shared.bin and one blob per routed
// expert. load_manifest() parses and bounds-checks everything a run relies on, without hashing; verify_model()
// (verify.hpp) also re-hashes every file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::model {

// Version 2 adds what gpt-oss needs (sliding_layers, attention_sinks, router_bias, expert_activation and the
// experts' bias parts); a model that uses none of it is still written as version 1, so older colibri reads it.
inline constexpr int kManifestFormatVersion = 7;
inline constexpr const char* kManifestFormatName = "colibri-model";
inline constexpr std::uint64_t kBlobAlignment = 4096;

// Every hyper-parameter the forward pass needs. Weights are stored in HuggingFace layout ([out, in], rows are
// output features, Q/K rows not permuted), so rope is HF's rotate_half form for every architecture here.
struct HyperParams {
  std::string architecture;     // mixtral | qwen2_moe | qwen3_moe | olmoe | llama | mistral | gpt_oss | glm4_moe
  std::string hf_architecture;  // MixtralForCausalLM, ... (empty when the source was a GGUF)
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  nlohmann::json rope_scaling;  // null, or the HF rope_scaling object (rope_type, factor, ...)
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";
  std::int64_t sliding_window = 0;           // 0: full attention
  std::vector<std::int64_t> sliding_layers;  // the layers sliding_window applies to; empty: all (gpt-oss: even ones)
  bool attention_sinks = false;              // a learned logit per head in each softmax's denominator (gpt-oss)
  bool router_bias = false;                  // the router has a bias (gpt-oss)
  // The router's scores: softmax over the experts, or sigmoid per expert (GLM-4.5, DeepSeek V3). With
  // router_selection_bias a learned bias per expert (HF's e_score_correction_bias) is added to the scores only to
  // pick the experts; the weights are the scores, renormalized (norm_topk_prob), times routed_scaling_factor.
  std::string router_scoring = "softmax";
  bool router_selection_bias = false;
  double routed_scaling_factor = 1.0;
  std::int64_t rotary_dims = 0;   // RoPE rotates the first rotary_dims of each head (GLM: head_dim / 2); 0: head_dim
  bool rope_interleaved = false;  // RoPE pairs (2i, 2i + 1) as GPT-J (ERNIE 4.5); else (i, i + dims / 2)
  // Multi-token-prediction layers stored after the last layer (GLM's num_nextn_predict_layers): the converter skips
  // them. Not in the manifest.
  std::int64_t nextn_layers = 0;
  // Multi-head latent attention (DeepSeek V2/V3, Kimi K2) when kv_lora_rank > 0: each token's keys and values come
  // from one latent of kv_lora_rank (normed) and one RoPE key of rotary_dims shared by the heads; head_dim is the
  // queries' and keys' width (qk_nope + qk_rope), v_head_dim the values'. Queries go through a latent of q_lora_rank
  // when it is > 0. The KV cache holds the latent and the RoPE key, one row per token (the "absorbed" form).
  std::int64_t q_lora_rank = 0;
  std::int64_t kv_lora_rank = 0;
  std::int64_t v_head_dim = 0;
  // Routing within groups (DeepSeek-V3's n_group / topk_group): the experts form router_groups consecutive groups, and
  // only those of the router_groups_used groups with the best group scores compete. A group's score is the sum of its
  // two best biased scores ("top2_sum", DeepSeek-V3), or its best one ("max", DeepSeek-V2's group_limited_greedy).
  // 0 groups: none.
  std::int64_t router_groups = 0;
  std::int64_t router_groups_used = 0;
  std::string router_group_score = "top2_sum";
  // Llama 4. The layers in nope_layers take no RoPE and attend to every earlier position; on them, with
  // attn_temperature_floor > 0, the queries are scaled by log(floor((pos + 1) / floor) + 1) * attn_temperature_scale +
  // 1 (1 below the floor: long contexts only). The layers in chunked_layers attend only within their chunk of
  // attention_chunk positions (query p sees keys from p - p % attention_chunk to p). qk_norm "l2" normalizes each query
  // and key head (RMS, no weight) after RoPE, on the layers with RoPE. router_weight_on_input: the routed expert's
  // weight scales its input, not its output (one expert a token).
  std::vector<std::int64_t> nope_layers;
  std::int64_t attention_chunk = 0;
  std::vector<std::int64_t> chunked_layers;
  double attn_temperature_floor = 0.0;
  double attn_temperature_scale = 0.0;
  bool router_weight_on_input = false;
  // Qwen3-Next. The layers in linear_layers mix tokens with a gated delta rule (linear attention: a recurrent state
  // per head) instead of attention: q and k of linear_k_heads heads of linear_k_dim, v and the output gate z of
  // linear_v_heads heads of linear_v_dim, after a causal depthwise convolution of linear_conv_kernel taps over q, k
  // and v. attn_output_gate: the attention layers' output is multiplied by sigmoid of a gate projection (cut from
  // q_proj's rows, which hold each head's query and then its gate).
  std::vector<std::int64_t> linear_layers;
  std::int64_t linear_conv_kernel = 0;
  std::int64_t linear_k_heads = 0;
  std::int64_t linear_v_heads = 0;
  std::int64_t linear_k_dim = 0;
  std::int64_t linear_v_dim = 0;
  bool attn_output_gate = false;
  // The value heads' order in the linear-attention weights: grouped by key head (value head h reads key head
  // h / (v_heads / k_heads), HF's order) or tiled (h reads key head h % k_heads: llama.cpp's Qwen3.5 GGUFs, and
  // colibri's Qwen3.5 models from either source).
  bool linear_tiled_heads = false;
  // swiglu: down(silu(gate x) * up x). swiglu_clamped (gpt-oss): every projection has a bias, and
  // g = min(gate, limit), u = clamp(up, -limit, limit), down((u + 1) * g * sigmoid(alpha * g)).
  std::string expert_activation = "swiglu";
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;
  bool tie_word_embeddings = false;
  bool attention_qkv_bias = false;  // q/k/v projections have biases (Qwen2-MoE)
  bool attention_out_bias = false;  // o projection has a bias
  // none | per_head (RMSNorm over head_dim: Qwen3) | full (over n_heads*head_dim: OLMoE) | l2 (Llama 4: see above)
  // | per_head_after_rope (per_head, after RoPE: Hunyuan; format version 7)
  std::string qk_norm = "none";
  double clip_qkv = 0.0;  // 0: none (OLMoE option)
  // Feed-forward. Dense models are one always-selected expert per layer (n_experts 1, top-k 1).
  bool dense = false;
  std::int64_t n_experts = 0;
  std::int64_t n_experts_per_tok = 0;
  bool norm_topk_prob = false;
  std::int64_t intermediate_size = 0;                // dense FFN size (dense models, dense layers of a MoE)
  std::int64_t moe_intermediate_size = 0;            // routed expert FFN size
  std::int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool shared_expert_gate = false;                   // sigmoid gate on the shared expert (Qwen2-MoE)
  std::int64_t decoder_sparse_step = 1;
  std::vector<std::int64_t> mlp_only_layers;
  std::int64_t bos_token_id = -1;
  std::vector<std::int64_t> eos_token_ids;

  // True when layer `layer` routes among n_experts (else it has one dense expert).
  [[nodiscard]] bool layer_is_sparse(std::int64_t layer) const;
  [[nodiscard]] std::int64_t layer_experts(std::int64_t layer) const { return layer_is_sparse(layer) ? n_experts : 1; }
  [[nodiscard]] std::int64_t layer_ffn_size(std::int64_t layer) const {
    return layer_is_sparse(layer) ? moe_intermediate_size : intermediate_size;
  }
  [[nodiscard]] std::int64_t layer_top_k(std::int64_t layer) const {
    return layer_is_sparse(layer) ? n_experts_per_tok : 1;
  }
  // The attention window of `layer` (0: full).
  [[nodiscard]] std::int64_t layer_window(std::int64_t layer) const;
  // The attention chunk of `layer` (0: none), and whether it takes RoPE.
  [[nodiscard]] std::int64_t layer_chunk(std::int64_t layer) const;
  [[nodiscard]] bool layer_has_rope(std::int64_t layer) const;
  [[nodiscard]] bool expert_bias() const { return expert_activation == "swiglu_clamped"; }
  // Whether `layer` is a linear-attention layer (Qwen3-Next), and that layer's widths: q/k, v (and z), the
  // convolution's channels (q, k and v), and the floats of its recurrent state (the convolution's last inputs, then
  // the delta rule's {v_dim, k_dim} per value head).
  [[nodiscard]] bool layer_is_linear(std::int64_t layer) const;
  [[nodiscard]] std::int64_t linear_key_width() const { return linear_k_heads * linear_k_dim; }
  [[nodiscard]] std::int64_t linear_value_width() const { return linear_v_heads * linear_v_dim; }
  [[nodiscard]] std::int64_t linear_conv_dim() const { return 2 * linear_key_width() + linear_value_width(); }
  [[nodiscard]] std::int64_t linear_state_floats() const {
    return linear_conv_dim() * (linear_conv_kernel - 1) + linear_v_heads * linear_k_dim * linear_v_dim;
  }
  // Layers that keep KV rows (every layer but the linear-attention ones).
  [[nodiscard]] std::int64_t attention_layers() const {
    return num_layers - static_cast<std::int64_t>(linear_layers.size());
  }
  [[nodiscard]] std::int64_t rope_dims() const { return rotary_dims > 0 ? rotary_dims : head_dim; }
  [[nodiscard]] bool mla() const { return kv_lora_rank > 0; }
  [[nodiscard]] bool grouped_routing() const { return router_groups > 1 && router_groups_used < router_groups; }
  // MLA's widths: the part of a query or key head without RoPE, and a KV cache row (the latent, then the RoPE key).
  [[nodiscard]] std::int64_t qk_nope_dim() const { return head_dim - rope_dims(); }
  [[nodiscard]] std::int64_t mla_cache_dim() const { return kv_lora_rank + rope_dims(); }
  // The KV cache's rows per position and their width: a row per kv head of head_dim, or MLA's one row.
  [[nodiscard]] std::int64_t kv_cache_heads() const { return mla() ? 1 : num_kv_heads; }
  [[nodiscard]] std::int64_t kv_cache_dim() const { return mla() ? mla_cache_dim() : head_dim; }
  // The manifest format version these hyper-parameters need (1; 2 for gpt-oss's features; 3 for GLM's router and
  // partial rotary; 4 for multi-head latent attention and routing within groups; 5 for Llama 4's layers and router; 6
  // for Qwen3-Next's linear attention and gated attention output).
  [[nodiscard]] int format_version() const;

  [[nodiscard]] nlohmann::json to_json() const;
  static sdk::Expected<HyperParams> from_json(const nlohmann::json& j);
  // Consistency checks (positive sizes, heads divide, top-k <= experts); message names the field.
  [[nodiscard]] sdk::Status validate() const;
};

// The rope_scaling types the engine's rope implements (HuggingFace's names), and them as "a, b, c" for messages.
// "freq_factors" is colibri's own: "factors" lists a divisor per rotated pair (inv_freq[i] / factors[i]), what
// llama.cpp stores as the rope_freqs tensor of Llama 3.1-style GGUFs.
inline constexpr const char* kRopeTypes[] = {"default", "linear", "dynamic", "llama3", "yarn", "freq_factors"};
bool is_supported_rope_type(const std::string& type);
std::string rope_types_text();

struct TensorEntry {
  std::string name;          // "blk.3.attn_q.weight", expert parts "blk.3.ffn_gate.5.weight"
  std::string file;          // relative to the model directory
  std::uint64_t offset = 0;  // absolute within the file
  std::uint64_t size = 0;
  sdk::DType type = sdk::DType::f32;
  std::vector<std::int64_t> shape;  // HF order: [rows, row length]
  std::uint64_t checksum = 0;       // xxHash64 of the tensor's bytes
};

struct ExpertEntry {
  std::int64_t layer = 0;
  std::int64_t expert = 0;
  std::string file;
  std::uint64_t offset = 0;  // the blob: one aligned range holding gate, up, down
  std::uint64_t size = 0;
  TensorEntry gate, up, down;  // offsets absolute within `file`
  // f32 biases, present when hparams.expert_bias() (gpt-oss); names empty otherwise. In the same blob.
  TensorEntry gate_bias, up_bias, down_bias;
  [[nodiscard]] bool has_bias() const { return !down_bias.name.empty(); }
  // Every part the blob holds: gate, up, down, then the biases when present.
  [[nodiscard]] std::vector<const TensorEntry*> parts() const;
};

struct FileEntry {
  std::string path;  // relative: "shared.bin", "experts/L007/E003.bin"
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;  // xxHash64 of the whole file
};

// The identity load_manifest gives a manifest.json of these bytes (Manifest::identity).
std::string manifest_identity(std::string_view text);

struct Manifest {
  int format_version = kManifestFormatVersion;
  HyperParams hparams;
  std::vector<FileEntry> files;
  std::vector<TensorEntry> tensors;  // everything in shared.bin
  std::vector<ExpertEntry> experts;  // sorted by (layer, expert)
  std::vector<std::string> tokenizer_files;
  nlohmann::json tokenizer;     // {"source": "copied"|"gguf", "model": ..., "notes": ...}
  nlohmann::json quantization;  // {"preset": ..., "types": {type: count}, "fallbacks": [...]}
  nlohmann::json source;        // {"kind": "safetensors"|"gguf", "path": ...}
  // xxh64 (hex) of manifest.json's bytes as load_manifest read them: which conversion this is (usage histories are
  // kept per identity, so counts of a model converted again are not added to another's). Empty when not loaded.
  std::string identity;

  [[nodiscard]] const TensorEntry* tensor(const std::string& name) const;
  [[nodiscard]] const ExpertEntry* expert(std::int64_t layer, std::int64_t expert) const;
  [[nodiscard]] const FileEntry* file(const std::string& path) const;

  [[nodiscard]] std::uint64_t resident_bytes() const;  // shared tensors
  [[nodiscard]] std::uint64_t expert_bytes() const;    // all expert blobs
  [[nodiscard]] std::uint64_t total_params() const;
  [[nodiscard]] std::uint64_t active_params() const;             // shared + top-k experts in every layer
  [[nodiscard]] std::uint64_t bytes_per_token_all_miss() const;  // top-k expert blobs read per layer

  [[nodiscard]] nlohmann::json to_json() const;
};

// Parses a manifest object; `where` names it in messages.
sdk::Expected<Manifest> parse_manifest(const nlohmann::json& j, const std::string& where);

// Reads <dir>/manifest.json and checks every index entry against the files present: paths inside the model,
// files present with the recorded size, tensors inside their files with the byte size their type and shape need,
// one expert per (layer, expert) of every layer. Does not hash (see verify_model).
sdk::Expected<Manifest> load_manifest(const std::filesystem::path& dir);
// As above; a file missing from `dir`, or of another size, is accepted when a directory of `mirrors` holds it with its
// recorded size at the same relative path (stripe's mirrors, which then serve its reads), with a warning.
sdk::Expected<Manifest> load_manifest(const std::filesystem::path& dir,
                                      const std::vector<std::filesystem::path>& mirrors);

// A tokenizer file against the xxh64 convert recorded for it (manifest tokenizer.xxh64; older manifests have none).
sdk::Status check_tokenizer_file(const Manifest& m, const std::filesystem::path& dir, const std::string& name);

// "L12/E5" for an expert blob path ("experts/L012/E005.bin"), "shared" for shared.bin, the path otherwise.
std::string describe_model_file(const Manifest& m, const std::string& path);

// What a checksum error at run time tells the user to do: the file may be damaged, or the storage plugin the bytes
// came through (`storage`, "" when unknown) may have returned wrong ones; inspect --verify reads the file directly.
std::string checksum_fix(const std::string& storage);

}  // namespace colibri::model
