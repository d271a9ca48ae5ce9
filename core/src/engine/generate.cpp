#include "colibri/engine/generate.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

#include "colibri/engine/json_constraint.hpp"
#include "colibri/engine/rope.hpp"

namespace colibri::engine {

using sdk::Status;
using sdk::StatusCode;

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  std::size_t first = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    first = std::min(first, held_.find(s));
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  std::size_t keep = 0;
  for (const auto& s : stops_) {
    for (std::size_t n = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

std::vector<std::int32_t> lookup_draft(std::span<const std::int32_t> history, std::int64_t max_ngram,
                                       std::int64_t count) {
  std::vector<std::int32_t> draft;
  const auto len = static_cast<std::int64_t>(history.size());
  if (count <= 0) return draft;
  for (std::int64_t n = std::min(max_ngram, len - 1); n >= 1; --n) {
    const auto key = history.subspan(static_cast<std::size_t>(len - n));
    for (std::int64_t j = len - n - 1; j >= 0; --j) {
      if (!std::equal(key.begin(), key.end(), history.begin() + j)) continue;
      // history + draft at j + n, j + n + 1, ...: always already known, as j + n < len.
      for (std::int64_t m = 0; m < count; ++m) {
        const std::int64_t at = j + n + m;
        draft.push_back(at < len ? history[static_cast<std::size_t>(at)] : draft[static_cast<std::size_t>(at - len)]);
      }
      return draft;
    }
  }
  return draft;
}

std::int64_t draft_limit(const KvCache& kv, std::int64_t asked) {
  return kv.has_recurrent() ? 0 : std::min(asked, kv.max_write() - 1);
}

std::int64_t Speculation::next_length(std::size_t kept, std::int64_t room) {
  if (declined_) {
    backoff_ = std::clamp<std::int64_t>(2 * backoff_, 1, 64);
    pause_ = backoff_;
    declined_ = false;
  } else if (!fed_.empty()) {
    if (kept > 0) backoff_ = 0;
    if (kept == fed_.size()) {
      now_ = std::min(limit_, 2 * now_);
    } else if (kept == 0 && now_ > least_) {
      now_ = std::max(least_, now_ / 2);
    } else if (kept == 0) {
      backoff_ = std::clamp<std::int64_t>(2 * backoff_, 1, 64);
      pause_ = backoff_;
    }
  }
  if (pause_ > 0) {
    --pause_;
    return asked_ = 0;
  }
  const std::int64_t n = std::min(room, now_);
  return asked_ = n >= least_ ? n : 0;
}

const std::vector<std::int32_t>& Speculation::run(std::vector<std::int32_t> drafts, bool costly) {
  if (static_cast<std::int64_t>(drafts.size()) < least_) drafts.clear();
  declined_ = costly && drafts.empty() && asked_ > 0;
  fed_ = std::move(drafts);
  drafted_ += static_cast<std::int64_t>(fed_.size());
  return fed_;
}

sdk::Status check_generate(const Engine& engine, std::span<const std::int32_t> prompt, const GenerateOptions& options) {
  if (auto s = options.sampling.validate(); !s) return s;
  if (prompt.empty()) return Status(StatusCode::invalid_argument, "the prompt is empty (no tokens)");
  if (options.max_tokens < 0) return Status(StatusCode::invalid_argument, "-n must not be negative");
  const std::int64_t room = engine.context() - engine.n_past();
  if (static_cast<std::int64_t>(prompt.size()) > room) {
    // --ctx helps only below the model's own context; past it the prompt must shrink.
    const std::int64_t model_max = engine.hparams().max_position_embeddings;
    const std::string what =
        engine.context() < model_max && static_cast<std::int64_t>(prompt.size()) + engine.n_past() <= model_max
            ? "shorten the prompt or raise --ctx (the model allows " + std::to_string(model_max) + ")"
            : "shorten the prompt (the model's own context is " + std::to_string(model_max) + " positions)";
    return Status(StatusCode::invalid_argument, "the prompt has " + std::to_string(prompt.size()) +
                                                    " tokens but only " + std::to_string(room) + " of the context's " +
                                                    std::to_string(engine.context()) + " positions are free; " + what);
  }
  return {};
}

sdk::Expected<GenerateResult> generate(Engine& engine, const tokenizer::Tokenizer& tok,
                                       std::span<const std::int32_t> prompt, const GenerateOptions& options,
                                       const std::function<bool(std::string_view)>& on_text) {
  if (auto s = check_generate(engine, prompt, options); !s) return s;
  std::vector<std::int64_t> eos = engine.hparams().eos_token_ids;
  if (auto e = tok.eos_id()) eos.push_back(*e);
  eos.insert(eos.end(), options.end_tokens.begin(), options.end_tokens.end());

  GenerateResult r;
  r.prompt_tokens = static_cast<std::int64_t>(prompt.size());
  // What a draft model drafts after: the tokens the engine's KV cache holds before the prompt, the prompt and the
  // answer. The prompt and the answer alone are the history the sampler's penalties and prompt lookup read.
  const bool model_drafts = options.draft_model != nullptr && options.draft_tokens > 0;
  std::vector<std::int32_t> tokens;
  if (model_drafts) tokens.assign(options.draft_context.begin(), options.draft_context.end());
  const std::size_t before_prompt = tokens.size();
  tokens.insert(tokens.end(), prompt.begin(), prompt.end());
  const auto history = [&] { return std::span<const std::int32_t>(tokens).subspan(before_prompt); };
  Sampler sampler(options.sampling);
  tokenizer::StreamDecoder decoder(tok, /*skip_special=*/!options.keep_special,
                                   options.continues_prompt ? prompt : std::span<const std::int32_t>{});
  StopMatcher stops(options.stop);
  std::vector<float> logits;
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  // A next turn returns to the prompt's end when the reply is not in its prompt (sliding-window layers move on and
  // recurrent states sum up the reply meanwhile).
  std::vector<std::int64_t> checkpoints = options.checkpoints;
  checkpoints.push_back(engine.n_past() + static_cast<std::int64_t>(prompt.size()));
  if (auto s = engine.forward(prompt, LogitsWanted::last, logits, nullptr, checkpoints); !s) return s;
  r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  auto emit = [&](const std::string& text) {
    if (text.empty()) return true;
    r.text += text;
    return !on_text || on_text(text);
  };
  r.finish_reason = "length";
  std::optional<JsonTokenMask> json_tokens;
  JsonAnswer json(options.json_schema.get());
  std::vector<std::uint8_t> allowed;
  if (options.json_object) json_tokens.emplace(tok, logits.size(), eos);
  // Speculation: the pass's drafts after its first token, the logits row the next token comes from, and the
  // positions the answer holds (the pass may hold drafts past them, dropped before the next pass and at the end).
  std::int64_t draft_end = engine.context();  // no pass may end past it (dynamic rope)
  if (auto rope = RopeFrequencies::create(engine.hparams())) draft_end = std::min(draft_end, rope->same_kv_up_to());
  Speculation spec(draft_limit(engine.kv_cache(), options.draft_tokens), options.draft_ngram);
  std::unique_ptr<DraftModel::State> own_state;
  DraftModel::State* draft_state = model_drafts ? options.draft_state : nullptr;
  if (model_drafts && draft_state == nullptr) {
    auto state = options.draft_model->acquire(tokens);
    if (!state) return state.error();
    own_state = std::move(*state);
    draft_state = own_state.get();
  }
  std::size_t row = 0;
  std::int64_t kept = engine.n_past();
  const auto vocab = static_cast<std::size_t>(engine.vocab_size());
  t0 = clock::now();
  for (std::int64_t i = 0; i < options.max_tokens; ++i) {
    // Prompt and answer share the context, as the server counts them: no token past its last position.
    if (kept >= engine.context()) {
      r.finish_reason = "context";
      break;
    }
    if (json_tokens) {
      json.allowed(*json_tokens, allowed);
      if (std::find(allowed.begin(), allowed.end(), 1) == allowed.end()) break;  // nothing continues the JSON
    }
    const std::int32_t next =
        sampler.sample(std::span<const float>(logits).subspan(row * vocab, vocab), history(), allowed, prompt.size());
    const bool drafted = spec.matches(row, next);  // its position is in the cache already
    if (options.stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) {
      r.finish_reason = "eos";
      break;
    }
    r.tokens.push_back(next);
    tokens.push_back(next);
    if (!emit(stops.push(decoder.push(next)))) {
      r.finish_reason = "cancelled";
      break;
    }
    if (stops.stopped()) {
      r.finish_reason = "stop";
      break;
    }
    if (json_tokens) json.push(*json_tokens, next);
    if (json_tokens && json.complete()) {
      r.finish_reason = "eos";  // the object is the whole answer, as if the model had ended it
      break;
    }
    if (i + 1 == options.max_tokens) break;
    if (drafted) {
      ++row;
      ++kept;
      continue;
    }
    if (kept >= engine.context()) {
      r.finish_reason = "context";
      break;
    }
    if (engine.n_past() > kept) {  // drafts past the one that differed
      engine.truncate(kept);
      if (engine.n_past() != kept) {
        return Status(StatusCode::internal, "the KV cache could not drop the rejected draft tokens (at " +
                                                std::to_string(kept) + "); run without --draft");
      }
    }
    // The next pass: this token, then what the text's last n-gram was followed by before, where it fits.
    const std::int64_t room = std::min(options.max_tokens - i - 2, draft_end - kept - 1);
    if (draft_state != nullptr) {
      const auto ends = options.stop_at_eos ? std::span<const std::int64_t>(eos) : std::span<const std::int64_t>{};
      DraftModel::Request ask;
      ask.state = draft_state;
      ask.history = tokens;
      ask.count = spec.next_length(row, room);
      ask.end_tokens = ends;
      if (auto s = options.draft_model->propose(std::span(&ask, 1)); !s) return s;
      spec.run(std::move(ask.drafts), /*costly=*/true);
    } else {
      spec.plan(history(), row, room);
    }
    const auto& fed = spec.fed();
    std::vector<std::int32_t> pass{next};
    pass.insert(pass.end(), fed.begin(), fed.end());
    if (auto s = engine.forward(pass, fed.empty() ? LogitsWanted::last : LogitsWanted::all, logits); !s) return s;
    row = 0;
    ++kept;
  }
  if (engine.n_past() > kept) engine.truncate(kept);
  if (own_state) options.draft_model->release(std::move(own_state));
  r.drafted = spec.drafted();
  r.accepted = spec.accepted();
  if (!r.tokens.empty()) r.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (r.finish_reason != "stop" && r.finish_reason != "cancelled") {
    emit(stops.push(decoder.flush()));
    if (stops.stopped()) {
      r.finish_reason = "stop";
    } else {
      emit(stops.flush());
    }
  }
  return r;
}

}  // namespace colibri::engine
