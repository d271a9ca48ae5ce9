// Speculation's drafts from a smaller model with the target's vocabulary (llama.cpp's --model-draft, vLLM's draft
// model): it runs greedily ahead of the target, which keeps a draft only where its own sampled token equals it, so
// the answer is the target's whatever the draft model proposes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "colibri/engine/engine.hpp"
#include "colibri/profile/profile.hpp"
#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::engine {

// Why `draft`'s token ids do not mean `target`'s ("" when they do): the same piece for every id both have, the same
// BOS and EOS, vocabularies at most 128 ids apart (llama.cpp's rule).
std::string draft_vocab_problem(const tokenizer::Tokenizer& draft, const tokenizer::Tokenizer& target);

// memory.expert_cache is the RAM every model's experts take together: a draft model's experts get min(theirs, half of
// `budget`), the model the rest. Errors name the key where either part cannot hold one of its model's experts.
struct ExpertCacheSplit {
  std::uint64_t model = 0, draft = 0;
};
sdk::Expected<ExpertCacheSplit> split_expert_cache(std::uint64_t budget, const model::Manifest& model,
                                                   const model::Manifest& draft);

class DraftModel {
 public:
  // Opens the draft model in `dir` with the profile's plugins and the target's context, KV type and chunk; its
  // experts (a MoE draft) may all stay in RAM, within options.expert_cache_bytes (split_expert_cache's draft part),
  // else the profile's expert cache budget. Errors name the directory
  // and, for a vocabulary that differs, the first id that does. `p_min`: drafting stops where the draft model's top
  // token has a lower probability (llama.cpp's --draft-p-min); `keep`: states in use and kept for later sequences
  // together (each holds a KV cache of the whole context), past which released ones are dropped.
  static sdk::Expected<std::unique_ptr<DraftModel>> open(const std::filesystem::path& dir, profile::Profile& profile,
                                                         EngineOptions options, const Engine& target,
                                                         const tokenizer::Tokenizer& target_tokenizer, double p_min,
                                                         std::size_t keep = 1);

  // One sequence's KV cache in the draft model and the tokens it holds.
  struct State {
    std::unique_ptr<Engine::Sequence> sequence;
    std::vector<std::int32_t> tokens;
  };
  // A state for a sequence that starts with `prompt`: the kept one sharing the longest prefix with it, else a new one.
  sdk::Expected<std::unique_ptr<State>> acquire(std::span<const std::int32_t> prompt);
  // Keeps `state` for a later sequence (the least recently released ones go past `keep`, counting those in use).
  void release(std::unique_ptr<State> state);
  // Gives `state` up without keeping it (its sequence was paused and will run its tokens again).
  void discard(std::unique_ptr<State> state);
  // What the kept states' KV caches took (the positions they reached), and giving up the least recently released one
  // (false: none kept): the server's KV budget counts and frees them beside its own kept caches.
  [[nodiscard]] std::uint64_t kept_bytes() const;
  bool drop_kept();

  struct Request {
    State* state = nullptr;
    std::span<const std::int32_t> history;     // the sequence's tokens so far (the KV cache's and the next one)
    std::int64_t count = 0;                    // drafts wanted
    std::span<const std::int64_t> end_tokens;  // drafting stops after one of these (nothing after it is kept)
    double p_min = -1;                         // >= 0: this request's floor instead of the draft model's
    std::vector<std::int32_t> drafts;          // out: at most count, each the draft model's top token after the last
  };
  // Fills each request's drafts: the draft model first runs the history its state does not hold (stepping back over
  // tokens the target rejected), then one token at a time for all requests together, stopping a request where its
  // top token's probability is below p_min. Errors (the draft model failed to run) leave the requests' drafts empty.
  sdk::Status propose(std::span<Request> requests);

  [[nodiscard]] const Engine& engine() const { return *engine_; }
  [[nodiscard]] double p_min() const { return p_min_; }

 private:
  DraftModel(std::unique_ptr<Engine> engine, std::int64_t vocab, double p_min, std::size_t keep)
      : engine_(std::move(engine)), vocab_(vocab), p_min_(p_min), keep_(keep) {}
  std::unique_ptr<Engine> engine_;
  std::int64_t vocab_;  // ids a draft may be: both models' logits have them
  double p_min_;
  std::size_t keep_;
  std::vector<std::unique_ptr<State>> kept_;  // least recently released first
  std::size_t in_use_ = 0;                    // acquired and not released
};

}  // namespace colibri::engine
