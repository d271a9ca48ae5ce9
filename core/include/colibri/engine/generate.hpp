// Text generation on one Engine sequence: prefill, then sample token by token, streaming text through the
// tokenizer's StreamDecoder; stops at EOS, a stop string, max tokens or a full context.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/engine/draft_model.hpp"
#include "colibri/engine/engine.hpp"
#include "colibri/engine/json_constraint.hpp"
#include "colibri/engine/sampler.hpp"
#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::engine {

struct GenerateOptions {
  std::int64_t max_tokens = 128;
  std::vector<std::string> stop;  // generation ends before the first occurrence of any of these
  bool stop_at_eos = true;
  std::vector<std::int64_t> end_tokens;  // ends the answer as EOS does (a chat format's own end markers)
  bool keep_special = false;             // special tokens are decoded into the text (harmony's channel markers)
  // The text continues the prompt's (a completion, not a chat answer): its first token decodes as in the middle of
  // a text, so SentencePiece's leading space stays and prompt + text is the decode of both.
  bool continues_prompt = false;
  SamplingOptions sampling;
  bool json_object = false;  // JSON mode: only tokens that keep the text one valid JSON object; stops when it closes
  std::shared_ptr<const JsonSchema> json_schema;  // with json_object: the object must also conform to this
  // KV cache positions where a next prompt may part from this one (a chat's last message, its system prompt): the
  // cache keeps a checkpoint there, and at the prompt's end, where it keeps any (KvCache::checkpoint).
  std::vector<std::int64_t> checkpoints;
  // Prompt-lookup speculation (llama.cpp's lookup decoding, vLLM's "ngram"): after each token, up to draft_tokens
  // tokens that followed the latest earlier occurrence of the text's last n tokens (n from draft_ngram down to 1) run
  // in the same pass, and are kept as far as the tokens sampled from that pass's logits equal them. The answer is
  // the same token for token, sampled or not: each position's logits have the bits a pass of its own gives (the one
  // promise), and each token is sampled from them in order. 0: off. Not for recurrent layers (a state cannot step
  // back) nor dynamic rope past the original context (a pass's length moves its rotation): there it drafts nothing.
  std::int64_t draft_tokens = 0;
  std::int64_t draft_ngram = 3;
  // Drafts from this model instead (--draft-model), drafting after `draft_context` (the tokens the engine's KV cache
  // holds before the prompt: a chat's earlier turns) and the prompt; `draft_state` keeps its KV cache between calls
  // (null: one for this call).
  DraftModel* draft_model = nullptr;
  DraftModel::State* draft_state = nullptr;
  std::span<const std::int32_t> draft_context;
};

struct GenerateResult {
  std::string text;                  // everything streamed (stop string excluded)
  std::vector<std::int32_t> tokens;  // generated ids (EOS excluded)
  std::string finish_reason;         // "eos" | "stop" | "length" | "context" | "cancelled"
  std::int64_t prompt_tokens = 0;
  std::int64_t drafted = 0;   // draft tokens run (draft_tokens)
  std::int64_t accepted = 0;  // of them, the ones the answer kept
  double prefill_seconds = 0;
  double decode_seconds = 0;
  [[nodiscard]] double prefill_tokens_per_second() const {
    return prefill_seconds > 0 ? static_cast<double>(prompt_tokens) / prefill_seconds : 0;
  }
  [[nodiscard]] double decode_tokens_per_second() const {
    // The first generated token comes out of the prefill; decode time covers the rest.
    const auto n = tokens.size() > 1 ? tokens.size() - 1 : 0;
    return decode_seconds > 0 ? static_cast<double>(n) / decode_seconds : 0;
  }
};

// Keeps back text that may be the start of a stop string; returns what is final.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds text; returns the part safe to emit. After a match, stopped() is true and nothing more is returned.
  std::string push(std::string_view text);
  // End of generation: whatever was held back (no stop string matched).
  std::string flush();
  [[nodiscard]] bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

// Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of `history`'s last n tokens, for
// the largest n <= max_ngram that has one, at most `count` (a continuation that reaches the end goes on with the
// draft itself, so a repeating cycle drafts whole periods); none when no n >= 1 matches.
std::vector<std::int32_t> lookup_draft(std::span<const std::int32_t> history, std::int64_t max_ngram,
                                       std::int64_t count);

// The drafts one pass may run on a KV cache, of `asked`: none for recurrent layers (a state cannot step back), else
// at most one KV write less the pass's first token, so a sliding layer's rows still hold the window of every position
// the pass may step back to.
std::int64_t draft_limit(const KvCache& kv, std::int64_t asked);

// Prompt-lookup speculation for one sequence: the drafts its last pass ran after its first token, and how many to
// draft next. Drafts cost their experts' reads whether kept or not, so the length follows how many the last pass
// kept (halved when none, doubled when all, up to the limit), and after a single draft fails drafting pauses for 1,
// 2, 4 ... 64 steps; so it does after a draft model, asked for drafts, proposed none (its passes cost too).
class Speculation {
 public:
  // `least`: fewer drafts are not worth a pass (llama-server's speculative.n_min): the length never halves below it.
  Speculation(std::int64_t limit, std::int64_t ngram, std::int64_t least = 1)
      : limit_(limit), ngram_(ngram), least_(std::max<std::int64_t>(least, 1)), now_(limit) {}
  // Whether `token`, sampled from row `row` of the last pass's logits, is the draft that pass ran there (its KV
  // position is the answer's already); counts it.
  bool matches(std::size_t row, std::int32_t token) {
    const bool hit = row < fed_.size() && fed_[row] == token;
    accepted_ += hit ? 1 : 0;
    return hit;
  }
  // How many drafts the next pass may run, after the last one's first `kept` drafts were kept: at most `room`, and
  // none rather than fewer than `least`.
  std::int64_t next_length(std::size_t kept, std::int64_t room);
  // The drafts the next pass runs (at most next_length's; none where fewer than `least`); `costly`: a draft model's,
  // whose passes cost even when it proposes none.
  const std::vector<std::int32_t>& run(std::vector<std::int32_t> drafts, bool costly = false);
  // next_length, then prompt lookup's drafts: what followed `history`'s last n-gram (history ends with the token the
  // pass starts with).
  const std::vector<std::int32_t>& plan(std::span<const std::int32_t> history, std::size_t kept, std::int64_t room) {
    return run(lookup_draft(history, ngram_, next_length(kept, room)));
  }
  [[nodiscard]] const std::vector<std::int32_t>& fed() const { return fed_; }
  [[nodiscard]] std::int64_t drafted() const { return drafted_; }
  [[nodiscard]] std::int64_t accepted() const { return accepted_; }

 private:
  std::int64_t limit_, ngram_, least_, now_;
  std::int64_t pause_ = 0, backoff_ = 0;
  std::int64_t asked_ = 0;  // next_length's last answer
  bool declined_ = false;   // a draft model asked for drafts proposed none
  std::int64_t drafted_ = 0, accepted_ = 0;
  std::vector<std::int32_t> fed_;
};

// generate()'s checks of its arguments (sampling, an empty prompt, the room left in the context), for a caller that
// prints before it generates.
sdk::Status check_generate(const Engine& engine, std::span<const std::int32_t> prompt, const GenerateOptions& options);

// Runs `prompt` from the engine's current position (chat turns continue the sequence) and generates. `on_text`
// receives text as it becomes final; returning false cancels. Errors: a prompt that does not fit the context, bad
// tokens, compute or storage failures.
sdk::Expected<GenerateResult> generate(Engine& engine, const tokenizer::Tokenizer& tok,
                                       std::span<const std::int32_t> prompt, const GenerateOptions& options,
                                       const std::function<bool(std::string_view)>& on_text);

}  // namespace colibri::engine
