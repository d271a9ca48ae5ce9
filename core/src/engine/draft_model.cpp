#include "colibri/engine/draft_model.hpp"

#include <algorithm>
#include <cmath>

#include "colibri/engine/memory_plan.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/sdk/config.hpp"

namespace colibri::engine {

using sdk::Status;
using sdk::StatusCode;

namespace {

std::string id_text(const std::optional<tokenizer::TokenId>& id) {
  return id ? std::to_string(*id) : "none";
}

// The tokens one catch-up pass runs for one sequence: what a KV write takes, at most a prefill chunk.
constexpr std::int64_t kCatchUpChunk = 512;

}  // namespace

std::string draft_vocab_problem(const tokenizer::Tokenizer& draft, const tokenizer::Tokenizer& target) {
  const auto nd = draft.vocab_size(), nt = target.vocab_size();
  if (std::max(nd, nt) - std::min(nd, nt) > 128) {
    return "its vocabulary has " + std::to_string(nd) + " tokens and the model's " + std::to_string(nt) +
           " (more than 128 apart)";
  }
  if (draft.bos_id() != target.bos_id() || draft.eos_id() != target.eos_id()) {
    return "its BOS / EOS tokens are " + id_text(draft.bos_id()) + " / " + id_text(draft.eos_id()) +
           " and the model's " + id_text(target.bos_id()) + " / " + id_text(target.eos_id());
  }
  for (std::size_t id = 0; id < std::min(nd, nt); ++id) {
    const auto t = static_cast<tokenizer::TokenId>(id);
    const auto a = draft.token_to_piece(t), b = target.token_to_piece(t);
    if (a != b) {
      return "token " + std::to_string(id) + " is '" + a.value_or("(none)") + "' there and '" + b.value_or("(none)") +
             "' in the model";
    }
  }
  return {};
}

sdk::Expected<ExpertCacheSplit> split_expert_cache(std::uint64_t budget, const model::Manifest& model,
                                                   const model::Manifest& draft) {
  ExpertCacheSplit split;
  split.draft = std::min(draft.expert_bytes(), budget / 2);
  split.model = budget - split.draft;
  // A part below its model's experts streams them through slots of the largest one's size.
  auto short_of = [](std::uint64_t part, const model::Manifest& m) {
    return part < m.expert_bytes() && part < expert_slot_bytes(m);
  };
  const auto size = [](std::uint64_t b) { return sdk::format_size(b); };
  if (short_of(split.model, model) || short_of(split.draft, draft)) {
    const bool model_short = short_of(split.model, model);
    return Status(StatusCode::invalid_argument,
                  "memory.expert_cache (" + size(budget) + ") holds the experts of the model and its draft model " +
                      "together; the " + (model_short ? "model's" : "draft model's") + " part, " +
                      size(model_short ? split.model : split.draft) + ", holds none of its experts (one needs " +
                      size(expert_slot_bytes(model_short ? model : draft)) +
                      "); raise it (--expert-cache-size) or use a smaller draft model");
  }
  return split;
}

sdk::Expected<std::unique_ptr<DraftModel>> DraftModel::open(const std::filesystem::path& dir, profile::Profile& profile,
                                                            EngineOptions options, const Engine& target,
                                                            const tokenizer::Tokenizer& target_tokenizer, double p_min,
                                                            std::size_t keep) {
  if (!(p_min >= 0 && p_min <= 1)) {
    return Status(StatusCode::invalid_argument,
                  "the draft probability floor " + std::to_string(p_min) + " is not between 0 and 1");
  }
  const std::string where = "draft model " + dir.string() + ": ";
  auto manifest = model::load_manifest(dir);
  if (!manifest) return Status(manifest.error().code(), where + manifest.error().message());
  // Its tokenizer first: a model of another vocabulary fails before minutes of loading.
  auto tok = tokenizer::Tokenizer::from_file(dir);
  if (!tok) return Status(tok.error().code(), where + tok.error().message());
  if (auto why = draft_vocab_problem(*tok, target_tokenizer); !why.empty()) {
    return Status(StatusCode::invalid_argument, where + why +
                                                    "; a draft model must share the model's vocabulary (a "
                                                    "smaller model of the same family)");
  }
  // A draft runs every token: its experts stay in RAM where the budget allows (they are few next to the target's).
  options.expert_cache_bytes = std::min(manifest->expert_bytes(), Engine::expert_cache_budget(profile, options));
  options.context = target.context();
  options.time_ops = false;
  options.sequences_only = true;  // acquire() makes its KV caches
  options.kv_sequences = 1;       // the model's engine counted them, with its own
  options.kv_beside = {};
  options.ram_beside = 0;  // its own weights, opened now, are not beside it
  auto engine = Engine::open(dir, profile, std::move(options), std::move(*manifest));
  if (!engine) return Status(engine.error().code(), where + engine.error().message());
  const std::int64_t vocab = std::min((*engine)->vocab_size(), target.vocab_size());
  return std::unique_ptr<DraftModel>(new DraftModel(std::move(*engine), vocab, p_min, std::max<std::size_t>(keep, 1)));
}

sdk::Expected<std::unique_ptr<DraftModel::State>> DraftModel::acquire(std::span<const std::int32_t> prompt) {
  auto shared = [&](const State& s) {
    return static_cast<std::size_t>(
        std::mismatch(s.tokens.begin(), s.tokens.end(), prompt.begin(), prompt.end()).first - s.tokens.begin());
  };
  auto best = kept_.end();
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (best == kept_.end() || shared(**it) >= shared(**best)) best = it;
  }
  if (best != kept_.end()) {
    auto state = std::move(*best);
    kept_.erase(best);
    ++in_use_;
    return state;
  }
  auto sequence = engine_->new_sequence();
  if (!sequence) return sequence.error();
  auto state = std::make_unique<State>();
  state->sequence = std::move(*sequence);
  ++in_use_;
  return state;
}

void DraftModel::release(std::unique_ptr<State> state) {
  if (!state) return;
  in_use_ -= in_use_ > 0 ? 1 : 0;
  kept_.push_back(std::move(state));
  while (!kept_.empty() && kept_.size() + in_use_ > keep_) kept_.erase(kept_.begin());
}

void DraftModel::discard(std::unique_ptr<State> state) {
  if (state) in_use_ -= in_use_ > 0 ? 1 : 0;
}

std::uint64_t DraftModel::kept_bytes() const {
  std::uint64_t n = 0;
  for (const auto& st : kept_) n += engine_->kv_sequence_bytes(st->sequence->kv.reach());
  return n;
}

bool DraftModel::drop_kept() {
  if (kept_.empty()) return false;
  kept_.erase(kept_.begin());
  return true;
}

Status DraftModel::propose(std::span<Request> requests) {
  const auto V = static_cast<std::size_t>(engine_->vocab_size());
  struct Work {
    Request* request;
    std::vector<float> logits;
    std::int32_t fed = 0;
  };
  std::vector<Work> work;
  for (auto& r : requests) {
    r.drafts.clear();
    if (r.count <= 0 || r.history.empty() || r.state == nullptr) continue;
    State& st = *r.state;
    Engine::Sequence& seq = *st.sequence;
    // At most context - 1 positions fed after the history: the last draft is not run.
    const auto len = static_cast<std::int64_t>(r.history.size());
    if (len > seq.kv.context()) continue;
    // Step back to the history's part the state holds, leaving its last token to run (its logits draft the first).
    auto common = static_cast<std::int64_t>(
        std::mismatch(st.tokens.begin(), st.tokens.end(), r.history.begin(), r.history.end()).first -
        st.tokens.begin());
    common = std::min(common, len - 1);
    if (seq.n_past > common) seq.n_past = seq.kv.rewind(common);
    st.tokens.resize(static_cast<std::size_t>(seq.n_past));
    work.push_back({&r, {}, 0});
  }
  auto fail = [&](const Status& s) {
    for (auto& w : work) w.request->drafts.clear();
    return Status(s.code(), "the draft model failed: " + s.message());
  };
  // Catch-up: each sequence runs the history its state lacks, in chunks; the last chunk's logits draft.
  while (true) {
    std::vector<Engine::BatchItem> items;
    std::vector<Work*> members;
    for (auto& w : work) {
      State& st = *w.request->state;
      const auto held = static_cast<std::int64_t>(st.tokens.size());
      const auto len = static_cast<std::int64_t>(w.request->history.size());
      if (held == len) continue;
      const auto n = std::min({len - held, kCatchUpChunk, st.sequence->kv.max_write()});
      Engine::BatchItem item;
      item.sequence = st.sequence.get();
      item.tokens = w.request->history.subspan(static_cast<std::size_t>(held), static_cast<std::size_t>(n));
      if (held + n == len) item.logits = &w.logits;
      items.push_back(item);
      members.push_back(&w);
    }
    if (items.empty()) break;
    if (auto s = engine_->forward_batch(items); !s) return fail(s);
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto& tokens = members[i]->request->state->tokens;
      tokens.insert(tokens.end(), items[i].tokens.begin(), items[i].tokens.end());
    }
  }
  // Greedy drafting, one token per pass for every request still drafting.
  std::vector<Work*> active;
  for (auto& w : work) active.push_back(&w);
  while (!active.empty()) {
    std::vector<Engine::BatchItem> items;
    std::vector<Work*> next;
    for (Work* w : active) {
      const float* row = w->logits.data();
      const auto best = static_cast<std::int32_t>(std::max_element(row, row + vocab_) - row);
      double sum = 0;
      for (std::size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - row[best]);
      Request& r = *w->request;
      if (!(1.0 / sum >= (r.p_min >= 0 ? r.p_min : p_min_))) continue;  // NaN logits draft nothing
      r.drafts.push_back(best);
      const auto fed = static_cast<std::int64_t>(r.history.size() + r.drafts.size());  // positions after this one
      if (static_cast<std::int64_t>(r.drafts.size()) >= r.count || fed > r.state->sequence->kv.context() ||
          std::find(r.end_tokens.begin(), r.end_tokens.end(), best) != r.end_tokens.end()) {
        continue;
      }
      w->fed = best;
      Engine::BatchItem item;
      item.sequence = r.state->sequence.get();
      item.tokens = std::span<const std::int32_t>(&w->fed, 1);
      item.logits = &w->logits;
      items.push_back(item);
      next.push_back(w);
    }
    if (items.empty()) break;
    if (auto s = engine_->forward_batch(items); !s) return fail(s);
    for (Work* w : next) w->request->state->tokens.push_back(w->fed);
    active = std::move(next);
  }
  return {};
}

}  // namespace colibri::engine
