// --draft-model of run, chat and colibri-server: the draft model, opened with the model's profile and options.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>

#include "cli_values.hpp"
#include "colibri/engine/draft_model.hpp"
#include "colibri/engine/generate.hpp"
#include "colibri/engine/memory_plan.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"

namespace colibri::apps {

// Before the model opens (`target`: its manifest, null when it does not load): where a draft model will open, the
// expert cache budget is split between the two (engine::split_expert_cache), `options` given the model's part, the
// draft model's KV cache to count beside each of the model's (an automatic context fits both) and the RAM its weights
// will take (EngineOptions::ram_beside), and the draft model's part returned for open_draft_model. A draft model that
// is not there fails here, before the model's minutes of loading.
inline sdk::Expected<std::optional<std::uint64_t>> prepare_draft_model(const DraftFlags& d,
                                                                       const profile::Profile& profile,
                                                                       const model::Manifest* target,
                                                                       engine::EngineOptions& options) {
  if (d.model.empty() || d.count() == 0 || target == nullptr) return std::optional<std::uint64_t>();
  engine::EngineOptions filled = options;
  if (auto s = engine::Engine::memory_options(profile, filled); !s) return s;
  // Where the model drafts nothing, open_draft_model opens no draft model (engine::draft_limit): its recurrent layers
  // cannot step back, or its sliding layers take one position a write (--batch 1).
  if (const auto w = engine::kv_windows(target->hparams, filled.ubatch, filled.kv_sliding_window.value_or(true));
      !w.state.empty() || (w.max_write > 0 && w.max_write <= 1)) {
    return std::optional<std::uint64_t>();
  }
  auto dir = model::resolve_model_path(d.model, profile.get_string("models.dir"));
  if (!dir) return sdk::Status(dir.error().code(), "--draft-model: " + dir.error().message());
  auto draft = model::load_manifest(*dir);
  if (!draft)
    return sdk::Status(draft.error().code(), "--draft-model " + dir->string() + ": " + draft.error().message());
  auto split = engine::split_expert_cache(engine::Engine::expert_cache_budget(profile, options), *target, *draft);
  if (!split) return split.error();
  // Its KV cache's type, chunk and windows are the model's options'.
  options.kv_beside = engine::Engine::kv_cache_bytes(draft->hparams, filled);
  options.expert_cache_bytes = split->model;
  // Opened after the model: what its weights will take of the RAM is not there for the model's KV caches.
  options.ram_beside = draft->resident_bytes() + std::min(draft->expert_bytes(), split->draft);
  return std::optional<std::uint64_t>(split->draft);
}

// Null without --draft-model, with --draft 0, or where the target drafts nothing (its recurrent layers cannot step
// back). `keep`: draft states kept for later sequences (the server's batch); `expert_cache`: its experts' part of the
// budget (prepare_draft_model).
inline sdk::Expected<std::unique_ptr<engine::DraftModel>> open_draft_model(
    const DraftFlags& d, profile::Profile& profile, engine::EngineOptions options, const engine::Engine& target,
    const tokenizer::Tokenizer& tokenizer, std::optional<std::uint64_t> expert_cache, std::size_t keep = 1) {
  if (d.model.empty() || engine::draft_limit(target.kv_cache(), d.count()) == 0) {
    return std::unique_ptr<engine::DraftModel>();
  }
  auto dir = model::resolve_model_path(d.model, profile.get_string("models.dir"));
  if (!dir) return sdk::Status(dir.error().code(), "--draft-model: " + dir.error().message());
  if (expert_cache) options.expert_cache_bytes = *expert_cache;
  return engine::DraftModel::open(*dir, profile, std::move(options), target, tokenizer, d.p_min, keep);
}

}  // namespace colibri::apps
