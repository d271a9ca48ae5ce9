// Rotary position embedding frequencies as HuggingFace computes them (modeling_rope_utils): default, linear,
// dynamic (NTK), llama3 and yarn. The compute op only rotates; every scaling type is a different inv_freq (and, for
// yarn, a cos/sin scale), computed here once.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "colibri/model/manifest.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::engine {

class RopeFrequencies {
 public:
  // Fails (naming the field) for an unknown rope_type or a missing/invalid parameter. `source`: where rope_scaling
  // was read (convert's config.json or GGUF; empty: the model's manifest.json).
  static sdk::Expected<RopeFrequencies> create(const model::HyperParams& hp, std::string_view source = {});

  // inv_freq for a forward pass whose last position is seq_len - 1. Only "dynamic" depends on seq_len (HF
  // recomputes the base once the sequence outgrows the original context).
  [[nodiscard]] const std::vector<float>& inv_freq(std::int64_t seq_len);
  // cos/sin multiplier (yarn's attention factor; 1 otherwise).
  [[nodiscard]] float attention_scaling() const { return attention_scaling_; }
  [[nodiscard]] std::int32_t rope_dims() const { return dims_; }
  [[nodiscard]] const std::string& type() const { return type_; }
  // KV entries are the same bits whichever forward passes computed them only while every such pass ends at or
  // before this sequence length ("dynamic" rotates by the pass's length past the original context); no limit
  // (INT64_MAX) for the other types.
  [[nodiscard]] std::int64_t same_kv_up_to() const {
    return type_ == "dynamic" ? original_max_ : std::numeric_limits<std::int64_t>::max();
  }

 private:
  std::string type_ = "default";
  std::int32_t dims_ = 0;
  double theta_ = 10000.0;
  double factor_ = 1.0;
  std::int64_t original_max_ = 0;
  float attention_scaling_ = 1.0f;
  std::vector<float> base_;     // inv_freq without dynamic growth
  std::vector<float> current_;  // what inv_freq() returned last
  std::int64_t current_len_ = 0;
};

}  // namespace colibri::engine
