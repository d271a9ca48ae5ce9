// --draft-model of run, chat and colibri-server: the draft model, opened with the model's profile and options.
#pragma once

#include <memory>

#include "cli_values.hpp"
#include "colibri/engine/draft_model.hpp"
#include "colibri/engine/generate.hpp"
#include "colibri/model/paths.hpp"

namespace colibri::apps {

// Null without --draft-model, with --draft 0, or where the target drafts nothing (its recurrent layers cannot step
// back). `keep`: draft states kept for later sequences (the server's batch).
inline sdk::Expected<std::unique_ptr<engine::DraftModel>> open_draft_model(
    const DraftFlags& d, profile::Profile& profile, engine::EngineOptions options, const engine::Engine& target,
    const tokenizer::Tokenizer& tokenizer, std::size_t keep = 1) {
  if (d.model.empty() || engine::draft_limit(target.kv_cache(), d.count()) == 0) {
    return std::unique_ptr<engine::DraftModel>();
  }
  auto dir = model::resolve_model_path(d.model, profile.get_string("models.dir"));
  if (!dir) return sdk::Status(dir.error().code(), "--draft-model: " + dir.error().message());
  return engine::DraftModel::open(*dir, profile, std::move(options), target, tokenizer, d.p_min, keep);
}

}  // namespace colibri::apps
