// colibri-cli profile show [--profile NAME|PATH] [--json]
//   [--model M [--ctx N] [--kv-type T] [--max-batch N] [--draft-model D]];
// profile list
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

#include "colibri/engine/engine.hpp"
#include "colibri/engine/memory_plan.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/registry/plugin_set.hpp"
#include "colibri/util/host_info.hpp"
#include "command.hpp"
#include "engine_cli.hpp"

namespace colibri::cli::profile_command {
namespace {

struct ProfileOptions {
  bool json = false;
  std::string model;            // --model: add the memory plan of this model
  std::int64_t ctx = 0;         // --ctx
  std::string kv_type = "f16";  // --kv-type
  int max_batch = 1;            // --max-batch: the server's KV caches held at once
  std::string draft_model;      // --draft-model: its weights and KV caches beside the model's
};

// What the model takes where under this profile (DESIGN: "reported before loading"); nullopt after printing why,
// with the exit status in `exit_code` (2 for a --ctx past the model's, as run says).
std::optional<nlohmann::json> memory_plan(const profile::Profile& prof, const ProfileOptions& o, int& exit_code) {
  exit_code = 1;
  auto dir = model::resolve_model_path(o.model, prof.get_string("models.dir"));
  if (!dir) {
    fail(dir.error().message());
    return std::nullopt;
  }
  auto man = model::load_manifest(*dir);
  if (!man) {
    fail(man.error().message());
    return std::nullopt;
  }
  if (auto err = apps::context_past_model(&*man, o.ctx); !err.empty()) {
    exit_code = usage_fail(err);
    return std::nullopt;
  }
  auto kv_type = engine::parse_kv_type(o.kv_type);
  if (!kv_type) {
    fail(kv_type.error().message());
    return std::nullopt;
  }
  const auto int_of = [&](const char* key) {
    auto v = prof.get_int(key);
    return v ? static_cast<std::uint64_t>(*v) : 0;
  };
  const std::uint64_t expert_cache =
      prof.get_int("memory.expert_cache") ? int_of("memory.expert_cache") : util::auto_expert_cache_bytes();
  engine::EngineOptions memory;  // the memory.* keys as a run reads them
  if (auto s = engine::Engine::memory_options(prof, memory); !s) {
    fail(s.message());
    return std::nullopt;
  }
  // The forward chunk is a run's --batch; the default here.
  const auto windows =
      engine::kv_windows(man->hparams, memory.ubatch, *memory.kv_sliding_window, *memory.kv_checkpoints);
  // The CPU backend has no device memory: the engine ignores a VRAM budget there (with a warning), and so does the
  // plan. Another backend's device is known only once loaded (an integrated GPU shares host RAM): planned as a GPU.
  const std::string backend = prof.get_string("compute.backend");
  const bool no_device_memory = backend == "cpu";
  const std::uint64_t vram_budget = no_device_memory ? 0 : int_of("memory.vram_budget");
  // A draft model takes its part of the expert cache, RAM for its weights and a KV cache beside each of the model's,
  // as the server and run split them (apps::prepare_draft_model).
  apps::DraftFlags draft;
  draft.model = o.draft_model;
  auto draft_experts = apps::prepare_draft_model(draft, prof, &*man, memory);
  if (!draft_experts) {
    fail(draft_experts.error().message());
    return std::nullopt;
  }
  auto plan = engine::plan_memory(*man, memory.expert_cache_bytes.value_or(expert_cache), vram_budget, o.ctx,
                                  int_of("memory.kv_cache"), *kv_type, util::available_memory_bytes(), windows,
                                  o.max_batch, memory.kv_beside, memory.ram_beside);
  if (!plan) {
    fail(plan.error().message());
    return std::nullopt;
  }
  const auto& p = *plan;
  nlohmann::json j{{"model", dir->string()},
                   {"shared_bytes", p.shared_bytes},
                   {"expert_bytes", p.expert_bytes},
                   {"experts", p.expert_count},
                   {"expert_cache_bytes", p.expert_cache},
                   {"mode", p.resident ? "resident" : "streaming"},
                   {"slot_bytes", p.slot_bytes},
                   {"ram_slots", p.ram_slots},
                   {"ram_expert_bytes", p.ram_bytes},
                   {"vram_budget_bytes", p.vram_budget},
                   {"vram_slots", p.vram_slots},
                   {"vram_expert_bytes", p.vram_bytes},
                   {"context", p.context},
                   {"kv_type", o.kv_type},
                   {"kv_bytes_per_position", p.kv_bytes_per_position},
                   {"kv_bytes", p.kv_bytes},
                   {"kv_sliding_layers", p.kv_sliding_layers},
                   {"kv_sliding_positions", p.kv_sliding_rows},
                   {"kv_checkpoints", windows.checkpoints},
                   {"kv_checkpoint_bytes", p.kv_checkpoint_bytes},
                   {"kv_sequences", p.kv_sequences},
                   {"kv_bytes_all", p.kv_sequences * (p.kv_bytes + p.kv_beside_bytes)},
                   {"host_bytes_at_most", p.shared_bytes + p.ram_bytes + memory.ram_beside +
                                              p.kv_sequences * (p.kv_bytes + p.kv_beside_bytes)},
                   {"compute_backend", backend},
                   {"vram_budget_ignored_bytes", no_device_memory ? int_of("memory.vram_budget") : 0}};
  j["draft_model"] = nullptr;
  if (*draft_experts) {
    auto draft_dir = model::resolve_model_path(o.draft_model, prof.get_string("models.dir"));
    j["draft_model"] = {{"model", draft_dir ? draft_dir->string() : o.draft_model},
                        {"expert_cache_bytes", **draft_experts},
                        {"ram_bytes", memory.ram_beside},
                        {"kv_bytes", p.kv_beside_bytes}};
  } else if (!o.draft_model.empty()) {
    j["draft_model_unused"] =
        "the model drafts nothing here (its recurrent layers cannot step back, or its sliding layers take one "
        "position a write with --batch 1): no draft model opens";
  }
  return j;
}

void print_plan(const nlohmann::json& j) {
  auto sz = [&](const char* key) { return sdk::format_size(j[key].get<std::uint64_t>()); };
  const auto experts = j["experts"].get<std::uint64_t>();
  std::cout << "\nmemory plan for " << j["model"].get<std::string>() << " (before loading; bench --json measures it):\n"
            << "  shared weights  " << sz("shared_bytes")
            << " in host RAM; uploaded once to a discrete GPU instead (memory.shared_on_device)\n"
            << "  routed experts  " << sz("expert_bytes") << " in " << experts << " files\n";
  if (j["mode"] == "resident") {
    std::cout << "  RAM tier        " << sz("ram_expert_bytes") << ": resident, every expert fits memory.expert_cache ("
              << sz("expert_cache_bytes") << ")\n";
  } else {
    const auto slots = j["ram_slots"].get<std::uint64_t>();
    std::cout << "  RAM tier        " << sz("ram_expert_bytes") << ": streaming, " << slots
              << (slots == 1 ? " slot of " : " slots of ") << sz("slot_bytes") << " ("
              << (experts > 0 ? 100 * slots / experts : 0) << "% of the experts) in memory.expert_cache ("
              << sz("expert_cache_bytes") << "); the rest is read from disk as routed\n";
  }
  const auto backend = j["compute_backend"].get<std::string>();
  if (j["vram_slots"].get<std::uint64_t>() > 0) {
    std::cout << "  VRAM tier       " << sz("vram_expert_bytes") << ": " << j["vram_slots"] << " slots of "
              << sz("slot_bytes") << " in memory.vram_budget (" << sz("vram_budget_bytes") << "), if compute backend "
              << backend << "'s device has memory of its own (an integrated GPU shares host RAM: no tier)\n";
  } else if (j["vram_budget_ignored_bytes"].get<std::uint64_t>() > 0) {
    std::cout << "  VRAM tier       none (memory.vram_budget " << sz("vram_budget_ignored_bytes")
              << " ignored: compute backend " << backend << " has no device memory)\n";
  } else {
    std::cout << "  VRAM tier       none (memory.vram_budget 0)\n";
  }
  std::cout << "  KV cache        " << sz("kv_bytes") << ": " << j["context"] << " positions x "
            << sz("kv_bytes_per_position") << " (" << j["kv_type"].get<std::string>() << ")";
  if (j["kv_sliding_layers"].get<std::int64_t>() > 0) {
    std::cout << ", but " << j["kv_sliding_layers"] << " sliding-window or chunked-attention layers keep only "
              << j["kv_sliding_positions"] << " positions (memory.kv_sliding_window)";
  }
  if (j["kv_checkpoint_bytes"].get<std::uint64_t>() > 0) {
    std::cout << "; of it, " << sz("kv_checkpoint_bytes") << " for up to " << j["kv_checkpoints"]
              << " checkpoints (memory.kv_checkpoints)";
  }
  const bool drafts = !j["draft_model"].is_null();
  if (j["kv_sequences"].get<std::uint64_t>() > 1 || drafts) {
    std::cout << (j["kv_sequences"].get<std::uint64_t>() > 1
                      ? "; the server's " + j["kv_sequences"].dump() + " sequences (--max-batch) hold up to "
                      : "; with the draft model's, up to ")
              << sz("kv_bytes_all")
              << (drafts && j["kv_sequences"].get<std::uint64_t>() > 1 ? " with the draft model's" : "");
  }
  std::cout << "; host pages are paid as the context fills; on a discrete GPU it is allocated there"
            << " (memory.kv_on_device)\n";
  if (drafts) {
    const auto& d = j["draft_model"];
    std::cout << "  draft model     " << d["model"].get<std::string>() << ": "
              << sdk::format_size(d["ram_bytes"].get<std::uint64_t>())
              << " of RAM (its shared weights, and its experts within its part of memory.expert_cache, "
              << sdk::format_size(d["expert_cache_bytes"].get<std::uint64_t>()) << "), and a KV cache of "
              << sdk::format_size(d["kv_bytes"].get<std::uint64_t>()) << " beside each of the model's\n";
  } else if (j.contains("draft_model_unused")) {
    std::cout << "  draft model     none: " << j["draft_model_unused"].get<std::string>() << "\n";
  }
  std::cout << "  host RAM        at most " << sz("host_bytes_at_most")
            << (drafts                                       ? " (shared + RAM tier + draft model + KV caches)"
                : j["kv_sequences"].get<std::uint64_t>() > 1 ? " (shared + RAM tier + KV caches)"
                                                             : " (shared + RAM tier + KV cache)")
            << (backend == "cpu" ? "" : "; less where a discrete GPU holds the shared weights and KV cache") << "\n";
}

// What an `auto` resolves to on this machine, shown beside it.
std::string auto_meaning(const std::string& key) {
  if (key == "compute.threads") return std::to_string(util::physical_core_count()) + " threads (physical cores)";
  if (key == "memory.expert_cache") {
    return sdk::format_size(util::auto_expert_cache_bytes()) + " (80% of the RAM available now)";
  }
  if (key == "models.dir") {
    const char* xdg = std::getenv("XDG_DATA_HOME");
    const char* home = std::getenv("HOME");
    return xdg && *xdg ? std::string(xdg) + "/colibri/models"
                       : std::string(home ? home : "~") + "/.local/share/colibri/models";
  }
  return {};
}

// The plugin `auto` created for `kind`, with the higher scores it passed over (their create() failed, or they refuse
// the profile's options), in the order create_selected tried them (PluginRegistry::by_score).
std::string used_by_auto(const registry::PluginRegistry& reg, sdk::PluginKind kind, const std::string& name) {
  std::string text = name, passed;
  for (const auto* p : reg.by_score(kind)) {
    if (p->name == name) {
      text += " (score " + std::to_string(p->score.value) + ")";
      break;
    }
    passed += (passed.empty() ? "" : ", ") + p->name + " (score " + std::to_string(p->score.value) + ")";
  }
  if (!passed.empty())
    text += ", as a run takes it: " + passed + " could not be created with this profile (see the warning)";
  return text;
}

int show(const GlobalOptions& global, const ProfileOptions& opts) {
  auto prof = global.load_profile();
  if (!prof) return global.profile_exit_code;
  std::optional<nlohmann::json> plan;
  if (!opts.model.empty()) {
    int exit_code = 1;
    plan = memory_plan(*prof, opts, exit_code);
    if (!plan) return exit_code;
  }
  const auto reg = registry::scan_for_profile(*prof);
  // Created from the profile before any plugin's schema is applied, as a run's: `auto` falling back past a plugin
  // whose create() fails then checks the values against the plugin taken, not the one passed over.
  profile::Profile as_run = *prof;
  std::vector<std::string> notes;
  for (auto kind : {sdk::PluginKind::compute, sdk::PluginKind::storage, sdk::PluginKind::cache}) {
    auto r = registry::resolve_plugin(*prof, reg, kind);
    if (!r) {
      // A misspelt or ill-typed key is an error; a plugin that is not installed does not stop the display, but
      // the exit code says the profile cannot run here (a script checking a profile must not see success).
      if (r.error().code() == sdk::StatusCode::invalid_argument) return fail(r.error().message());
      notes.push_back(r.error().message());
    }
  }
  // Every plugin found: create them as a run would, so their option checks (and the canonical choices) speak now.
  std::map<std::string, std::string> chosen;  // what `auto` took, by selector key
  if (notes.empty()) {
    engine::EngineOptions eo;
    const auto level = spdlog::get_level();
    spdlog::set_level(std::max(level, spdlog::level::warn));  // the plugins' start-up lines belong to a run
    auto made = engine::Engine::plugins_from_profile(as_run, eo);
    spdlog::set_level(level);
    if (made) {
      *prof = std::move(as_run);
      for (const auto& [kind, name] : {std::pair{sdk::PluginKind::compute, made->compute_name},
                                       std::pair{sdk::PluginKind::storage, made->storage_name},
                                       std::pair{sdk::PluginKind::cache, made->cache_name}}) {
        chosen[std::string(profile::plugin_selector_key(kind))] = used_by_auto(reg, kind, name);
      }
    } else {
      notes.push_back(made.error().message());
    }
  }
  const auto meaning = [&](const std::string& key) {
    const auto it = chosen.find(key);
    return it != chosen.end() ? it->second : auto_meaning(key);
  };
  // A canonical size as bytes, so that "4GB" can be seen to mean 4 GiB; nullopt for other values.
  auto size_bytes = [](const std::string& key, const profile::Entry& e) -> std::optional<std::int64_t> {
    for (const auto& spec : profile::canonical_options()) {
      if (key == spec.name && spec.type == sdk::OptionType::size && !e.value.is_auto) {
        if (const auto* v = std::get_if<std::int64_t>(&e.value.value)) return *v;
      }
    }
    return std::nullopt;
  };
  // A path as colibri reads it (a profile file's relative path starts at that file), where that differs from the text.
  auto resolved = [](const profile::Entry& e) -> std::optional<nlohmann::json> {
    if (e.value.is_auto) return std::nullopt;
    const bool one = std::holds_alternative<std::string>(e.value.value);
    if (!one && !std::holds_alternative<std::vector<std::string>>(e.value.value)) return std::nullopt;
    const sdk::OptionSpec as_written{"", one ? sdk::OptionType::string : sdk::OptionType::string_list, "", ""};
    auto written = sdk::parse_option_value(as_written, e.text);
    if (!written || written->value == e.value.value) return std::nullopt;
    if (one) return nlohmann::json(std::get<std::string>(e.value.value));
    return nlohmann::json(std::get<std::vector<std::string>>(e.value.value));
  };
  if (opts.json) {
    nlohmann::json out;
    out["profile"] = prof->name();
    out["files"] = nlohmann::json::array();
    for (const auto& f : prof->files()) out["files"].push_back(f.string());
    for (const auto& [key, e] : prof->entries()) {
      nlohmann::json v{{"value", e.text}, {"origin", e.origin.describe()}, {"checked", e.validated}};
      if (e.value.is_auto) v["auto"] = meaning(key);
      if (auto b = size_bytes(key, e)) v["bytes"] = *b;
      if (auto r = resolved(e)) v["resolved"] = *r;
      out["values"][key] = v;
    }
    out["problems"] = notes;
    if (plan) out["memory_plan"] = *plan;
    std::cout << out.dump(2) << "\n";
    return notes.empty() ? 0 : 1;
  }
  std::cout << "profile: " << prof->name();
  if (!prof->files().empty()) {
    std::cout << " (" << prof->files().front().string();
    for (std::size_t i = 1; i < prof->files().size(); ++i) std::cout << ", extends " << prof->files()[i].string();
    std::cout << ")";
  }
  std::cout << "\n";
  std::size_t width = 0;
  for (const auto& [key, e] : prof->entries()) width = std::max(width, key.size() + e.text.size() + 3);
  for (const auto& [key, e] : prof->entries()) {
    std::string shown = key + " = " + (e.text.empty() ? "\"\"" : e.text);
    std::cout << std::left << std::setw(static_cast<int>(width) + 2) << shown << "# " << e.origin.describe();
    if (e.value.is_auto) {
      if (auto m = meaning(key); !m.empty()) std::cout << "; auto = " << m;
    }
    if (auto b = size_bytes(key, e); b && e.text != std::to_string(*b)) std::cout << "; " << *b << " bytes";
    if (auto r = resolved(e)) {
      std::string shown_path = r->is_string() ? r->get<std::string>() : "";
      for (const auto& p : r->is_array() ? *r : nlohmann::json::array()) {
        shown_path += (shown_path.empty() ? "[" : ", ") + p.get<std::string>();
      }
      if (r->is_array()) shown_path += shown_path.empty() ? "[]" : "]";
      std::cout << "; read as " << shown_path;
    }
    if (!e.validated) std::cout << "; NOT CHECKED (its plugin was not found)";
    std::cout << "\n";
  }
  if (plan) print_plan(*plan);
  std::cout.flush();
  for (const auto& n : notes) std::cerr << "\nerror: this profile cannot run here: " << n << "\n";
  return notes.empty() ? 0 : 1;
}

// Each profile found, read as `--profile NAME` would (its extends included), so a broken one shows here, not at use.
int list(const GlobalOptions&, bool json) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [name, path] : profile::list_profiles(profile::default_profile_dirs())) {
    profile::LoadOptions lo;
    lo.profile = path.string();
    lo.use_process_environment = false;
    auto loaded = profile::Profile::load(lo);
    const std::string problem = loaded ? "" : loaded.error().message();
    if (json) {
      out.push_back({{"name", name},
                     {"path", path.string()},
                     {"description", loaded ? loaded->description() : ""},
                     {"problem", problem.empty() ? nlohmann::json(nullptr) : nlohmann::json(problem)}});
      continue;
    }
    std::cout << std::left << std::setw(20) << name << path.string() << "\n";
    if (loaded && !loaded->description().empty()) std::cout << std::setw(20) << "" << loaded->description() << "\n";
    if (!problem.empty())
      std::cout << std::setw(20) << ""
                << "invalid: " << problem << "\n";
  }
  if (json) std::cout << out.dump(2) << "\n";
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto* prof = app.add_subcommand("profile", "Show the effective hardware profile, or list profiles");
  prof->require_subcommand(1);
  auto opts = std::make_shared<ProfileOptions>();
  auto* show_cmd = prof->add_subcommand("show", "Every effective value with where it came from");
  show_cmd->add_flag("--json", opts->json, "Machine-readable output");
  auto* model =
      show_cmd->add_option("--model,-m", opts->model,
                           "Also print what this model takes where (shared weights, RAM and VRAM tiers, KV cache)");
  // Both shape the model's plan: without --model they would be ignored silently.
  show_cmd
      ->add_option("--ctx", opts->ctx, "Context for the KV cache line (0 or unset: memory.kv_cache, else the model's)")
      ->check(apps::context_length())
      ->needs(model);
  show_cmd->add_option("--kv-type", opts->kv_type, "KV cache type for the plan: f16 (default), q8_0 or f32")
      ->check(apps::kv_cache_type())
      ->needs(model);
  show_cmd
      ->add_option("--max-batch", opts->max_batch,
                   "The server's sequences: KV caches held at once (an automatic context fits them all; default 1)")
      ->check(apps::integer_at_least(1, "give 1 or more sequences"))
      ->needs(model);
  show_cmd
      ->add_option(
          "--draft-model", opts->draft_model,
          "A draft model beside it (run, chat, colibri-server): its part of the expert cache, its weights' RAM "
          "and its KV cache beside each sequence's, counted as they count them")
      ->needs(model);
  add_profile_options(*show_cmd, global);
  show_cmd->callback([&global, opts] { global.exit_code = show(global, *opts); });
  auto* list_cmd = prof->add_subcommand(
      "list", "Profiles found in the profile directories (.yaml, .yml), each read to say whether it is valid");
  auto list_json = std::make_shared<bool>(false);
  list_cmd->add_flag("--json", *list_json,
                     "Machine-readable output: name, path, description, problem (null when valid)");
  list_cmd->callback([&global, list_json] { global.exit_code = list(global, *list_json); });
}

}  // namespace

COLIBRI_CLI_COMMAND(20, setup);

}  // namespace colibri::cli::profile_command
