// Token sampling: penalties, then greedy or temperature + top-k + top-p + min-p, drawn from a seeded generator
// (same seed, same logits: same token, on every machine).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::engine {

struct SamplingOptions {
  float temperature = 0.8f;          // <= 0: greedy (argmax)
  std::int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;               // >= 1: off
  float min_p = 0.05f;               // <= 0: off; drops tokens below min_p * p(best)
  float repetition_penalty = 1.0f;   // 1: off; CTRL-style (divide positive logits, multiply negative ones)
  float presence_penalty = 0.0f;     // subtracted once per token present in the window
  float frequency_penalty = 0.0f;    // subtracted per occurrence in the window
  std::int32_t penalty_last_n = 64;  // window of recent tokens the penalties look at (0: none, -1: all)
  // Whether presence and frequency penalties count the prompt's tokens too (llama.cpp: yes, within the window) or
  // only the generated ones (OpenAI, vLLM). The repetition penalty counts the prompt either way, as both do.
  bool penalize_prompt = true;
  std::uint64_t seed = 0;
  // Added to a token's logit before anything else (OpenAI's logit_bias: -100 bans a token, 100 all but forces it).
  std::vector<std::pair<std::int32_t, float>> logit_bias;

  // The first out-of-range value with the flag that sets it ("--top-p must be in (0, 1], got 1.5").
  [[nodiscard]] sdk::Status validate() const;
};

// A token's log-probability under the model's own distribution (the raw logits: before logit_bias, penalties and
// temperature), with the `top` most likely tokens (most likely first, ties to the lower id), as OpenAI's logprobs.
struct TokenLogprob {
  std::int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<std::int32_t, float>> top;
};
TokenLogprob token_logprob(std::span<const float> logits, std::int32_t id, std::size_t top);

class Sampler {
 public:
  explicit Sampler(SamplingOptions options);

  // Picks the next token from one row of logits. `history` is every token so far (prompt included), of which the
  // first `prompt_size` are the prompt; penalties look at its last penalty_last_n entries (presence and frequency
  // only at the generated ones unless penalize_prompt). A non-empty `allowed` (one entry per logit, 0 = banned)
  // restricts the choice to the allowed tokens (JSON mode); at least one must be allowed.
  std::int32_t sample(std::span<const float> logits, std::span<const std::int32_t> history,
                      std::span<const std::uint8_t> allowed = {}, std::size_t prompt_size = 0);

  [[nodiscard]] const SamplingOptions& options() const { return options_; }

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<std::int32_t> ids_;
};

}  // namespace colibri::engine
