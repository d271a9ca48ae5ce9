// Options shared by the commands that run a model (logits, run, chat, perplexity, bench) and the code that turns
// them into an Engine.
#pragma once

#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../common/cli_values.hpp"
#include "../common/draft_model.hpp"
#include "colibri/engine/engine.hpp"
#include "colibri/engine/generate.hpp"
#include "colibri/engine/sampler.hpp"
#include "colibri/engine/usage_history.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "colibri/util/bytes_text.hpp"
#include "command.hpp"

namespace colibri::cli {

struct EngineCliOptions {
  std::string model;
  std::int64_t ctx = 0;
  std::string kv_type = "f16";
  std::int64_t batch = 512;
  bool exact = false;
  bool time_ops = false;  // bench --ops
};

inline void add_engine_options(CLI::App& cmd, EngineCliOptions& o, GlobalOptions& global) {
  cmd.add_option("--model,-m", o.model, "Model directory, or a name under models.dir")->required();
  cmd.add_option("--ctx", o.ctx, "Context length in tokens (0 or unset: memory.kv_cache, else the model's)")
      ->check(apps::context_length());
  cmd.add_option("--kv-type", o.kv_type, "KV cache type: f16 (default), q8_0 or f32")->check(apps::kv_cache_type());
  cmd.add_option("--batch", o.batch, "Tokens per forward chunk (results do not depend on it)")
      ->check(apps::integer_at_least(1, "give the tokens per forward chunk (default 512)"));
  cmd.add_flag("--exact-activations", o.exact, "Never quantize activations in quantized matmuls");
  add_profile_options(cmd, global);
}

// The engine options the flags give (the KV type parsed from --kv-type).
inline engine::EngineOptions engine_options(const EngineCliOptions& o, sdk::DType kv_type) {
  engine::EngineOptions eo;
  eo.context = o.ctx;
  eo.kv_type = kv_type;
  eo.ubatch = o.batch;
  eo.exact_activations = o.exact;
  eo.time_ops = o.time_ops;
  return eo;
}

// An opened engine, or, when it is null, the exit status of the failure (already printed): 2 for an option value
// the model refuses (--ctx past its context), 1 for the rest.
struct OpenedEngine {
  std::unique_ptr<engine::Engine> engine;
  int exit_code = 1;
  std::optional<std::uint64_t> draft_expert_cache;  // --draft-model: its part of the expert cache budget
};

inline OpenedEngine failed_open(int exit_code) {
  OpenedEngine r;
  r.exit_code = exit_code;
  return r;
}

// `profile_out`: where to keep the profile the engine was opened with. `before_loading`: checks that need the
// model's directory (an output naming one of its files) or its manifest (null when it does not load), run before the
// load, which takes minutes on a real model; a non-empty result is the error. `check_arguments`: the same for a
// command-line value that needs the manifest (a token id past the vocabulary): its error exits 2.
inline OpenedEngine open_engine(
    const GlobalOptions& global, const EngineCliOptions& o, std::optional<profile::Profile>* profile_out = nullptr,
    const std::function<std::string(const std::filesystem::path&, const model::Manifest*)>& before_loading = nullptr,
    const std::function<std::string(const model::Manifest&)>& check_arguments = nullptr,
    const apps::DraftFlags* draft = nullptr) {
  auto prof = global.load_profile();
  if (!prof) return failed_open(global.profile_exit_code);
  auto dir = model::resolve_model_path(o.model, prof->get_string("models.dir"));
  if (!dir) return failed_open(fail(dir.error().message()));
  // Read once, for the checks and the load. One that does not load is left to the load (which reads it with the
  // storage plugin's mirrors) to name what is wrong.
  auto manifest = model::load_manifest(*dir);
  const model::Manifest* read = manifest ? &*manifest : nullptr;
  if (check_arguments && read != nullptr) {
    if (auto err = check_arguments(*read); !err.empty()) return failed_open(usage_fail(err));
  }
  if (before_loading) {
    if (auto err = before_loading(*dir, read); !err.empty()) return failed_open(fail(err));
  }
  auto kv = engine::parse_kv_type(o.kv_type);
  if (!kv) return failed_open(fail(kv.error().message()));
  if (auto err = apps::context_past_model(read, o.ctx); !err.empty()) return failed_open(usage_fail(err));
  auto options = engine_options(o, *kv);
  std::optional<std::uint64_t> draft_expert_cache;
  if (draft != nullptr) {
    auto split = apps::prepare_draft_model(*draft, *prof, read, options);
    if (!split) return failed_open(fail(split.error().message()));
    draft_expert_cache = *split;
  }
  auto e = engine::Engine::open(*dir, *prof, options, manifest ? std::optional(std::move(*manifest)) : std::nullopt);
  if (!e) {
    if (apps::refused_value_of_command_line(*prof, e.error())) return failed_open(usage_fail(e.error().message()));
    return failed_open(fail(e.error().message()));
  }
  if (profile_out != nullptr) *profile_out = std::move(prof);
  OpenedEngine r;
  r.engine = std::move(*e);
  r.exit_code = 0;
  r.draft_expert_cache = draft_expert_cache;
  return r;
}

inline void add_sampling_options(CLI::App& cmd, engine::SamplingOptions& s, bool& seed_given) {
  cmd.add_option("--temperature,--temp", s.temperature, "Sampling temperature (default 0.8 as llama.cpp; 0: greedy)");
  cmd.add_option("--top-k", s.top_k, "Keep the k most likely tokens (default 40; 0 or -1: off)");
  cmd.add_option("--top-p", s.top_p, "Nucleus sampling threshold (default 0.95; 1: off)");
  cmd.add_option("--min-p", s.min_p, "Drop tokens below min-p times the best one's probability (default 0.05; 0: off)");
  cmd.add_option("--repeat-penalty", s.repetition_penalty, "Repetition penalty (default 1: off)");
  cmd.add_option("--presence-penalty", s.presence_penalty, "Presence penalty (default 0: off)");
  cmd.add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty (default 0: off)");
  cmd.add_option("--repeat-last-n", s.penalty_last_n, "Tokens the penalties look back at (default 64; -1: all)");
  // -1 asks for a random seed, as in llama.cpp (it would otherwise wrap to 2^64 - 1).
  cmd.add_option("--seed", s.seed, "Random seed (same seed, same output; -1 or none: a random one, in the stats line)")
      ->each([&seed_given](const std::string& v) {
        if (v.starts_with('-') && v != "-1") {
          throw CLI::ValidationError(v + " is negative; give 0 or more, or -1 for a random seed");
        }
        seed_given = v != "-1";
      })
      ->type_name("INT");
  cmd.add_option_function<std::vector<std::string>>(
      "--logit-bias",
      [&s](const std::vector<std::string>& items) {
        for (const auto& item : items) {
          const auto eq = item.find('=');
          std::int32_t id = 0;
          float bias = 0;
          std::size_t used_id = 0, used_bias = 0;
          try {
            if (eq == std::string::npos) throw std::invalid_argument(item);
            id = std::stoi(item.substr(0, eq), &used_id);
            bias = std::stof(item.substr(eq + 1), &used_bias);
          } catch (const std::exception&) {
            used_id = 0;
          }
          if (used_id == 0 || used_id != eq || used_bias != item.size() - eq - 1) {
            throw CLI::ValidationError("--logit-bias", "'" + item +
                                                           "' is not TOKEN_ID=BIAS (e.g. 13=-100: -100 bans a token, "
                                                           "100 all but forces it; colibri-cli tokenize finds ids)");
          }
          s.logit_bias.emplace_back(id, bias);
        }
      },
      "Add BIAS (-100 to 100) to a token's logit: TOKEN_ID=BIAS, repeatable");
}

// --draft's flags into g, opening --draft-model (into `draft`, which g points to) with the profile the engine was
// opened with; says so where this model's recurrent layers cannot step back (generate() drafts nothing). False when
// the draft model does not open (printed).
inline bool apply_draft(const apps::DraftFlags& d, const EngineCliOptions& o, profile::Profile& prof,
                        const OpenedEngine& opened_engine, const tokenizer::Tokenizer& tok, engine::GenerateOptions& g,
                        std::unique_ptr<engine::DraftModel>& draft) {
  const engine::Engine& e = *opened_engine.engine;
  g.draft_tokens = d.count();
  g.draft_ngram = d.ngram;
  if (d.count() > 0 && e.kv_cache().has_recurrent()) {
    std::cerr << "note: --draft is off for this model: its recurrent layers' states cannot step back over rejected "
                 "drafts\n";
  }
  auto opened =
      apps::open_draft_model(d, prof, engine_options(o, e.kv_cache().type()), e, tok, opened_engine.draft_expert_cache);
  if (!opened) {
    fail(opened.error().message());
    return false;
  }
  draft = std::move(*opened);
  g.draft_model = draft.get();
  if (!d.model.empty() && !draft && d.count() == 0) std::cerr << "note: --draft 0: --draft-model is not opened\n";
  return true;
}
// ", 12 of 30 drafted tokens kept" where --draft ran any; with a draft model, what it read of its experts (a dense
// model's FFNs are its one expert; the stats line's figures are the model's alone).
inline std::string draft_summary(const engine::GenerateResult& r, const engine::DraftModel* draft = nullptr) {
  std::string s;
  if (r.drafted > 0)
    s = ", " + std::to_string(r.accepted) + " of " + std::to_string(r.drafted) + " drafted tokens kept";
  if (draft != nullptr) {
    const auto& st = draft->engine().experts().stats();
    if (st.hits + st.misses > 0) {
      char buf[96];
      std::snprintf(buf, sizeof buf, ", the draft model read %s (expert hit rate %.1f%%)",
                    util::bytes_text(st.bytes_read).c_str(), 100.0 * st.hit_rate());
      s += buf;
    }
  }
  return s;
}

// A --logit-bias token the model does not have would be ignored without a word; an error instead.
inline std::string logit_bias_problem(const engine::SamplingOptions& s, std::int64_t vocab_size) {
  for (const auto& [id, bias] : s.logit_bias) {
    if (id >= vocab_size) {
      return "--logit-bias: token id " + std::to_string(id) + " is outside the model's vocabulary of " +
             std::to_string(vocab_size) + " tokens";
    }
  }
  return {};
}

// One line: mode, plugins, speeds, expert cache and I/O.
inline std::string stats_line(const engine::Engine& e, double prefill_tps, double decode_tps) {
  const auto& st = e.experts().stats();
  // No rate where nothing ran: one generated token comes out of the prefill, with no decode step to time.
  const auto rate = [](double tps) {
    char r[32];
    if (tps > 0) std::snprintf(r, sizeof r, "%.1f tok/s", tps);
    return tps > 0 ? std::string(r) : std::string("n/a");
  };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "[%s | backend %s | storage %s | cache %s | prefill %s | decode %s | expert hit rate "
                "%.1f%% | read %s | I/O stall %.3f s]",
                e.mode().c_str(), e.plugins().compute_name.c_str(), e.plugins().storage_name.c_str(),
                e.plugins().cache_name.c_str(), rate(prefill_tps).c_str(), rate(decode_tps).c_str(),
                100.0 * st.hit_rate(), util::bytes_text(st.bytes_read).c_str(), st.stall_seconds);
  std::string line = buf;
  if (const auto* vram = e.experts().vram()) {
    std::snprintf(buf, sizeof buf,
                  " [vram %zu slots of %s | hit rate %.1f%% | uploaded %s in %llu uploads | %llu run from RAM]",
                  vram->slot_count(), util::bytes_text(vram->slot_bytes()).c_str(), 100.0 * st.vram_hit_rate(),
                  util::bytes_text(st.bytes_uploaded).c_str(), static_cast<unsigned long long>(st.uploads),
                  static_cast<unsigned long long>(st.vram_bypassed));
    line += buf;
  }
  if (e.offload_cost() != nullptr) {
    std::snprintf(buf, sizeof buf, " [cpu fallback %llu experts, %s in %.3f s]",
                  static_cast<unsigned long long>(st.cpu_runs), util::bytes_text(st.cpu_run_bytes).c_str(),
                  st.cpu_run_seconds);
    line += buf;
  }
  if (st.predicted > 0 || st.prefetch_issued > 0) {
    // Precision and recall are of the guesses (a guessed expert already in memory needs no read, so a run may guess
    // well and issue nothing).
    std::snprintf(buf, sizeof buf,
                  " [prefetch %lld layer%s: %llu reads issued, %llu used, %llu wasted, %llu unused at the end | "
                  "guesses: precision %.1f%%, recall %.1f%%]",
                  static_cast<long long>(e.prefetch_layers()), e.prefetch_layers() == 1 ? "" : "s",
                  static_cast<unsigned long long>(st.prefetch_issued),
                  static_cast<unsigned long long>(st.prefetch_used),
                  static_cast<unsigned long long>(st.prefetch_wasted),
                  static_cast<unsigned long long>(e.experts().prefetches_open()), 100.0 * st.prediction_precision(),
                  100.0 * st.prediction_recall());
    line += buf;
  }
  return line;
}

// Adds this run's expert usage to the model's persisted history (what `cache stats|warm` and the pinned policy's
// auto_pin_history read). With `saved`, only what was counted since the last call (a chat saves after every turn).
// A failure costs the history, not the run: warn only.
inline void save_usage(const engine::Engine& e, std::map<std::uint64_t, std::uint64_t>* saved = nullptr) {
  const auto path = engine::usage_history_path(e.model_dir());
  auto usage = e.experts().usage();
  if (saved != nullptr) {
    for (auto& [key, n] : usage) {
      const auto before = (*saved)[key];
      n = n > before ? n - before : 0;
    }
    *saved = e.experts().usage();
  }
  std::erase_if(usage, [](const auto& kv) { return kv.second == 0; });
  if (auto s = engine::merge_usage_history(path, usage, e.model_dir(), e.manifest().identity); !s) {
    std::fprintf(stderr, "warning: expert usage history not saved: %s\n", s.message().c_str());
  }
}

}  // namespace colibri::cli
