// Architectures the converter understands: HF config.json / GGUF metadata -> HyperParams, and the canonical
// list of tensors (names, HF names, GGUF names, shapes) each architecture has.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/model/gguf.hpp"
#include "colibri/model/manifest.hpp"

namespace colibri::model {

enum class TensorKind {
  embedding,
  output,
  norm,
  attn_q,
  attn_k,
  attn_v,
  attn_o,
  bias,
  router,
  shared_expert_gate,
  shared_expert,
  expert_gate,
  expert_up,
  expert_down,
};

const char* to_string(TensorKind k);

// Rows cut out of a source tensor (multi-head latent attention's fused projections): for each of `blocks` blocks of
// `block` source rows, rows [first, first + count); with `transpose`, each cut [count, cols] is stored transposed as
// [cols, count] (kv_b_proj's key part, which the absorbed form multiplies from the other side). blocks 0: no cut.
struct RowPick {
  std::int64_t blocks = 0, block = 0, first = 0, count = 0;
  bool transpose = false;
};

// A change of the values read from a HF checkpoint (a GGUF holds them changed already): Qwen3-Next's RMS norms
// multiply by 1 + w (stored as w + 1, computed in f32 as transformers does), and its decay rate is kept as
// -exp(A_log).
enum class ValueTransform { none, add_one, neg_exp };

// Qwen3.5's language models, MoE and dense: Qwen3-Next's layers with their projections apart and value heads tiled.
inline bool is_qwen3_5(std::string_view architecture) {
  return architecture == "qwen3_5_moe" || architecture == "qwen3_5";
}

// Value heads stored grouped by key head (HF: groups x per heads of `width` rows or columns, head g * per + j) that
// colibri keeps tiled (head j * groups + g), as llama.cpp's Qwen3.5 GGUFs hold them. groups 0: none.
struct HeadTiling {
  std::int64_t groups = 0, per = 0, width = 0;
  bool columns = false;  // the heads are columns (out_proj's inputs, A_log and dt_bias), else rows
  // The grouped index holding tiled index i.
  [[nodiscard]] std::int64_t source(std::int64_t i) const {
    const std::int64_t head = i / width;
    return ((head % groups) * per + head / groups) * width + i % width;
  }
};

struct PlannedTensor {
  std::string name;                     // canonical (llama.cpp-style) name
  std::string hf_name;                  // name in a HF checkpoint
  std::string gguf_name;                // name in a GGUF file (merged *_exps tensor for routed experts)
  std::string gguf_alt_name;            // older per-expert GGUF name ("blk.L.ffn_gate.E.weight"), or empty
  std::int64_t gguf_expert = -1;        // slice of the merged GGUF tensor
  std::int64_t gguf_permute_heads = 0;  // llama.cpp permuted these rows for its rope (llama arch Q/K)
  // gpt-oss keeps a layer's experts in fused tensors [E, ...]: hf_name is that tensor, hf_expert the slice, and
  // hf_fused_part 0 / 1 the even (gate) / odd (up) outputs of gate_up_proj (-1: all). convert.cpp cuts the part out.
  std::int64_t hf_expert = -1;
  int hf_fused_part = -1;
  // Llama 4: gate and up are the first and second halves of gate_up_proj's outputs, not its even and odd ones.
  bool hf_fused_halves = false;
  RowPick hf_pick, gguf_pick;  // the cut out of hf_name / gguf_name, if any
  ValueTransform hf_transform = ValueTransform::none;
  HeadTiling hf_tiling;  // Qwen3.5's value heads, reordered from a HF checkpoint
  // Qwen3.5: fused experts output-major, gate_up_proj [E, 2F, D] (gate the first half) and down_proj [E, D, F].
  bool hf_fused_output_major = false;
  std::vector<std::int64_t> shape;  // HF order
  TensorKind kind = TensorKind::norm;
  std::int64_t layer = -1;
  std::int64_t expert = -1;
};

struct ModelPlan {
  std::vector<PlannedTensor> shared;
  // experts[layer][expert] = {gate, up, down}
  std::vector<std::vector<std::vector<PlannedTensor>>> experts;  // [layer][expert]: gate, up, down [, their biases]
};

// HF architectures (config.json "architectures") and GGUF general.architecture values supported.
std::vector<std::string> supported_hf_architectures();
std::vector<std::string> supported_gguf_architectures();

sdk::Expected<HyperParams> hparams_from_hf_config(const nlohmann::json& config, const std::string& where);
sdk::Expected<HyperParams> hparams_from_gguf(const GgufFile& gguf);

ModelPlan build_plan(const HyperParams& hp, const std::string& gguf_arch = "");

}  // namespace colibri::model
