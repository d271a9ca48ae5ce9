// colibri-cli ab replay | import | live: which cache policy and size to run, with numbers (see README "A/B testing").
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "colibri/ab/replay.hpp"
#include "colibri/ab/report.hpp"
#include "colibri/ab/trace.hpp"
#include "colibri/engine/generate.hpp"
#include "colibri/registry/plugin_set.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "colibri/util/output_file.hpp"
#include "engine_cli.hpp"

namespace colibri::cli::ab_command {
namespace {

struct ReplayOptions {
  std::string trace;
  std::vector<std::string> policies;
  std::string cache_experts;
  bool per_layer = false;
  std::string report;
  bool json = false;
  std::string model;
  std::string expert_bytes;  // a size: 4096, 1M, 1.5G
};

// "pinned:0:1,3:2" -> name pinned, cache.pinned_experts=[0:1, 3:2]; "NAME:key=value;key=value" -> cache.key=value.
sdk::Expected<std::pair<std::string, std::vector<profile::Override>>> parse_policy(const std::string& spec) {
  const auto colon = spec.find(':');
  std::string name = spec.substr(0, colon);
  if (name.empty()) return sdk::Status(sdk::StatusCode::invalid_argument, "--policy '" + spec + "' names no policy");
  const std::string flag = "--policy " + spec;  // errors name the whole argument, not one of its parts
  std::vector<profile::Override> ov{{"cache.policy", name, flag}};
  if (colon == std::string::npos) return std::make_pair(spec, ov);
  const std::string rest = spec.substr(colon + 1);
  if (rest.find('=') == std::string::npos) {
    if (name != "pinned") {
      return sdk::Status(sdk::StatusCode::invalid_argument,
                         "--policy '" + spec +
                             "': write settings as NAME:key=value;key=value (a bare list of "
                             "layer:expert is only for pinned)");
    }
    std::string list = "[";
    std::stringstream ss(rest);
    std::string item;
    std::set<std::string> seen;
    while (std::getline(ss, item, ',')) {
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      if (item.empty()) {
        return sdk::Status(sdk::StatusCode::invalid_argument,
                           "--policy '" + spec + "' has an empty item; write pinned:LAYER:EXPERT,LAYER:EXPERT");
      }
      if (!seen.insert(item).second) {
        return sdk::Status(sdk::StatusCode::invalid_argument,
                           "--policy '" + spec + "' pins " + item + " twice; give it once");
      }
      list += (list.size() > 1 ? ", " : "") + item;
    }
    if (seen.empty() || rest.back() == ',') {
      return sdk::Status(sdk::StatusCode::invalid_argument,
                         "--policy '" + spec + "': write the experts to pin as pinned:LAYER:EXPERT,LAYER:EXPERT");
    }
    ov.push_back({"cache.pinned_experts", list + "]", flag});
  } else {
    std::stringstream ss(rest);
    std::string item;
    while (std::getline(ss, item, ';')) {
      const auto eq = item.find('=');
      if (eq == std::string::npos || eq == 0) {
        return sdk::Status(sdk::StatusCode::invalid_argument,
                           "--policy '" + spec + "': '" + item + "' is not key=value");
      }
      const std::string key = "cache." + item.substr(0, eq);
      for (const auto& earlier : ov) {
        if (earlier.key == key) {
          return sdk::Status(sdk::StatusCode::invalid_argument,
                             "--policy '" + spec + "' sets " + item.substr(0, eq) + " twice; give it once");
        }
      }
      ov.push_back({key, item.substr(eq + 1), flag});
    }
  }
  return std::make_pair(spec, ov);
}

sdk::Expected<std::vector<std::uint64_t>> parse_sizes(const std::string& text) {
  std::vector<std::uint64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto too_many = [&] {
      return sdk::Status(sdk::StatusCode::invalid_argument,
                         "--cache-experts: " + item + " is more experts than a cache can hold (at most 4294967296)");
    };
    long long v = 0;
    try {
      std::size_t used = 0;
      v = std::stoll(item, &used);
      if (used != item.size()) v = 0;
    } catch (const std::out_of_range&) {
      if (item.find('-') == std::string::npos) return too_many();
    } catch (const std::exception&) {
    }
    if (v <= 0) {
      return sdk::Status(sdk::StatusCode::invalid_argument,
                         "--cache-experts: '" + item + "' is not a positive expert count (write e.g. 8,16,32)");
    }
    if (v > (1LL << 32)) return too_many();
    out.push_back(static_cast<std::uint64_t>(v));
  }
  if (out.empty()) return sdk::Status(sdk::StatusCode::invalid_argument, "--cache-experts lists no sizes");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * v);
  return buf;
}

nlohmann::json result_json(const ab::ReplayResult& r, bool per_layer) {
  nlohmann::json j = {{"policy", r.policy},
                      {"hit_rate", r.hit_rate()},
                      {"hits", r.stats.hits},
                      {"misses", r.stats.misses},
                      {"preload_loads", r.stats.preload_loads},
                      {"reads", r.reads()},
                      {"evictions", r.stats.evictions},
                      {"bytes_read", r.stats.bytes_read}};
  if (per_layer) {
    j["per_layer"] = nlohmann::json::array();
    for (std::size_t l = 0; l < r.per_layer.size(); ++l) {
      const auto& s = r.per_layer[l];
      j["per_layer"].push_back({{"layer", l}, {"hits", s.hits}, {"misses", s.misses}, {"bytes_read", s.bytes_read}});
    }
  }
  return j;
}

struct PolicySpec {
  std::string name;     // as reported
  std::string profile;  // the profile it comes from ("" : the default)
  std::vector<profile::Override> overrides;
};

// Reads the trace into `seq` and checks that the model has every expert it routes to. Returns an error message, or
// "" on success.
std::string load_trace(const std::string& trace_path, const ab::ExpertSizes& expert_sizes,
                       const std::string& model_name, ab::AccessSequence& seq) {
  auto trace = ab::read_trace(trace_path);
  if (!trace) return trace.error().message();
  seq = ab::AccessSequence::from_trace(*trace);
  for (auto k : seq.keys) {
    if (!expert_sizes.read_bytes(k)) {
      return trace_path + ": the trace routes to L" + std::to_string(k.layer) + "/E" + std::to_string(k.expert) +
             ", which model " + model_name + " does not have (a trace of another model?)";
    }
  }
  return {};
}

// Creates the policy of `spec` once, before the trace is read. Returns 0, or the exit code after printing the error:
// 2 when a value of the command line (--policy's options, --set) is what the plugin refuses, 1 otherwise (a policy
// that is not installed, a profile file's value).
int check_policy(const PolicySpec& spec) {
  profile::LoadOptions lo;
  lo.profile = spec.profile;
  lo.overrides = spec.overrides;
  auto prof = profile::Profile::load(lo);
  if (!prof) {
    const std::string& said = prof.error().message();  // one that names the --policy argument already is as it is
    const std::string m = said.rfind("--policy", 0) == 0 ? said : "--policy " + spec.name + ": " + said;
    return apps::refused_for_command_line(lo) ? usage_fail(m) : fail(m);
  }
  note_profile_files(*prof);
  const auto reg = registry::scan_for_profile(*prof);
  auto policy = registry::create_plugin<sdk::CachePolicy>(*prof, reg, sdk::PluginKind::cache);
  if (policy) return 0;
  const std::string& m = policy.error().message();  // a schema error names the --policy argument already
  const std::string said = m.rfind("--policy", 0) == 0 ? m : "--policy " + spec.name + ": " + m;
  return apps::refused_value_of_command_line(*prof, policy.error()) ? usage_fail(said) : fail(said);
}

// Replays the trace's accesses at every size through every policy and the optimum. Returns an error message, or ""
// on success; `usage` is set when the error is a command-line value's (pins the model lacks given in --policy, a
// --cache-experts too small), which exits 2.
std::string compute_replay(const std::vector<PolicySpec>& specs, const std::string& trace_path,
                           const ab::AccessSequence& seq, const std::vector<std::uint64_t>& sizes,
                           const ab::ExpertSizes& expert_sizes, ab::ReplayReport& report, bool* usage = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto universe = ab::universe_of(seq, expert_sizes);
  std::uint64_t slot = 1;
  for (auto k : universe) slot = std::max(slot, expert_sizes.slot_bytes(k).value_or(1));

  report.trace = trace_path;
  report.experts = universe.size();
  report.experts_of_model = expert_sizes.manifest() != nullptr;
  report.records = seq.records;
  report.accesses = seq.keys.size();
  report.bytes_known = expert_sizes.known();
  for (const auto n : sizes) {
    ab::SizeResults sr;
    sr.cache_experts = n;
    // Past every expert the model has, a larger cache changes nothing (and n * slot could overflow).
    sr.budget_bytes = std::min<std::uint64_t>(n, universe.size()) * slot;
    for (const auto& [name, profile_name, overrides] : specs) {
      profile::LoadOptions lo;
      lo.profile = profile_name;
      lo.overrides = overrides;
      auto prof = profile::Profile::load(lo);
      if (!prof) return prof.error().message();
      const auto reg = registry::scan_for_profile(*prof);
      auto policy = registry::create_plugin<sdk::CachePolicy>(*prof, reg, sdk::PluginKind::cache);
      if (!policy) {
        const std::string& m = policy.error().message();  // a schema error names the --policy argument already
        return m.rfind("--policy", 0) == 0 ? m : "--policy " + name + ": " + m;
      }
      auto r = ab::replay(seq, *policy, name, sr.budget_bytes, expert_sizes, universe);
      if (!r) {
        const bool too_small = r.error().message().find("cannot hold") != std::string::npos &&
                               r.error().message().find("pin fewer") == std::string::npos;
        const bool pins_from_flag = r.error().message().find("cache.pinned_experts") != std::string::npos &&
                                    std::any_of(overrides.begin(), overrides.end(),
                                                [](const auto& ov) { return ov.key == "cache.pinned_experts"; });
        if (usage != nullptr) *usage = too_small || pins_from_flag;
        return ("--policy " + name + " with --cache-experts " + std::to_string(n) + ": " + r.error().message() +
                (too_small ? "; use a larger cache" : ""));
      }
      sr.policies.push_back(std::move(*r));
    }
    auto best = ab::belady(seq, n, expert_sizes);
    if (!best) return ("--cache-experts " + std::to_string(n) + ": " + best.error().message());
    sr.optimal = std::move(*best);
    report.sizes.push_back(std::move(sr));
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The layers the trace routes through (a trace of some layers only is not "max layer + 1" layers).
  std::set<std::uint32_t> layers;
  for (const auto& k : seq.keys) layers.insert(k.layer);
  report.layers = static_cast<std::uint32_t>(layers.size());
  return "";
}

// A replay's results as JSON (ab replay --json, and ab live --json with --trace).
nlohmann::json replay_json(const ab::ReplayReport& report, bool per_layer) {
  nlohmann::json j = {{"trace", report.trace},       {"records", report.records},
                      {"accesses", report.accesses}, {"bytes_known", report.bytes_known},
                      {"seconds", report.seconds},   {"sizes", nlohmann::json::array()}};
  for (const auto& sr : report.sizes) {
    nlohmann::json s = {{"cache_experts", sr.cache_experts}, {"budget_bytes", sr.budget_bytes}};
    s["policies"] = nlohmann::json::array();
    for (const auto& r : sr.policies) s["policies"].push_back(result_json(r, per_layer));
    s["optimal"] = result_json(sr.optimal, per_layer);
    j["sizes"].push_back(s);
  }
  return j;
}

// A replay's results as text: a table per cache size, the optimum last.
void print_replay(const ab::ReplayReport& report, bool per_layer) {
  std::printf("trace %s: %llu records, %llu expert accesses, %zu layers\n", report.trace.c_str(),
              static_cast<unsigned long long>(report.records), static_cast<unsigned long long>(report.accesses),
              static_cast<std::size_t>(report.layers));
  for (const auto& sr : report.sizes) {
    // Rounded up: passed back as --expert-cache-size it holds these experts (rounded down it could hold one fewer).
    std::string size = report.bytes_known ? util::bytes_text(sr.budget_bytes, util::Rounding::up) : "";
    if (sr.cache_experts > report.experts) {  // the replay caps it there: say so rather than show a size it is not
      size += std::string(size.empty() ? "" : "; ") + "more than the " + std::to_string(report.experts) +
              (report.experts_of_model ? " experts the model has" : " experts the trace uses") + ": all fit";
    }
    std::printf("\ncache %llu experts%s\n", static_cast<unsigned long long>(sr.cache_experts),
                size.empty() ? "" : (" (" + size + ")").c_str());
    std::printf("  %-24s %9s %10s %10s %14s\n", "policy", "hit rate", "misses", "preload", "bytes read");
    auto row = [&](const ab::ReplayResult& r) {
      std::printf("  %-24s %9s %10llu %10llu %14s\n", r.policy.c_str(), percent(r.hit_rate()).c_str(),
                  static_cast<unsigned long long>(r.stats.misses),
                  static_cast<unsigned long long>(r.stats.preload_loads),
                  report.bytes_known ? util::bytes_text(r.stats.bytes_read).c_str() : "n/a");
      if (!per_layer) return;
      for (std::size_t l = 0; l < r.per_layer.size(); ++l) {
        const auto& s = r.per_layer[l];
        if (s.hits + s.misses == 0) continue;
        const double hr = static_cast<double>(s.hits) / static_cast<double>(s.hits + s.misses);
        std::printf("    layer %-16zu %9s %10llu %10s %14s\n", l, percent(hr).c_str(),
                    static_cast<unsigned long long>(s.misses), "",
                    report.bytes_known ? util::bytes_text(s.bytes_read).c_str() : "n/a");
      }
    };
    for (const auto& r : sr.policies) row(r);
    auto opt = sr.optimal;
    opt.policy = "optimal (Belady)";
    row(opt);
    // The verdict of this size: fewest reads (misses and preloads, what a slow disk pays for) wins.
    if (!sr.policies.empty()) {
      auto reads = [](const ab::ReplayResult& r) { return r.stats.misses + r.stats.preload_loads; };
      std::uint64_t fewest = reads(sr.policies[0]);
      for (const auto& r : sr.policies) fewest = std::min(fewest, reads(r));
      std::string winners;
      for (const auto& r : sr.policies) {
        if (reads(r) == fewest) winners += (winners.empty() ? "" : " = ") + r.policy;
      }
      const std::uint64_t optimum = reads(sr.optimal);
      std::printf("  fewest reads: %s with %llu", winners.c_str(), static_cast<unsigned long long>(fewest));
      if (optimum > 0) {
        std::printf(" (%.2fx the optimum's %llu)", static_cast<double>(fewest) / static_cast<double>(optimum),
                    static_cast<unsigned long long>(optimum));
      }
      std::printf("\n");
    }
  }
}

int run_replay(const GlobalOptions& global, const ReplayOptions& o) {
  auto sizes = parse_sizes(o.cache_experts);
  if (!sizes) return usage_fail(sizes.error().message());
  if (auto e = overwrite_error("--report", o.report, "--trace", o.trace); !e.empty()) return fail(e);
  std::optional<util::OutputFile> report_file;  // opened first: a path that cannot be written fails before the work
  if (!o.report.empty()) {
    auto f = util::OutputFile::open(o.report);
    if (!f) return fail("report: " + f.error().message());
    report_file.emplace(std::move(*f));
  }
  if (o.policies.empty()) return usage_fail("give at least one --policy (e.g. --policy lru --policy frequency)");
  std::vector<PolicySpec> specs;
  for (const auto& p : o.policies) {
    auto s = parse_policy(p);
    if (!s) return usage_fail(s.error().message());
    auto overrides = global.cli_overrides();
    overrides.insert(overrides.end(), s->second.begin(), s->second.end());
    specs.push_back({s->first, global.profile, overrides});
    if (const int code = check_policy(specs.back()); code != 0) return code;
  }
  // The report was opened above (only NAME.partial so far): it must not then replace a profile just read.
  if (auto e = overwrite_error("--report", o.report, "--trace", o.trace); !e.empty()) return fail(e);
  // One policy given twice (a check that a replay ties with itself): rows named "lru #1", "lru #2".
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::string name = specs[i].name;
    const auto count = std::count_if(specs.begin(), specs.end(), [&](const PolicySpec& sp) { return sp.name == name; });
    if (count < 2) continue;
    int k = 0;
    for (auto& sp : specs) {
      if (sp.name == name) sp.name = name + " #" + std::to_string(++k);
    }
  }
  std::optional<model::Manifest> manifest;
  if (!o.model.empty()) {
    auto prof = global.load_profile();
    if (!prof) return global.profile_exit_code;
    auto dir = model::resolve_model_path(o.model, prof->get_string("models.dir"));
    if (!dir) return fail(dir.error().message());
    if (auto e = overwrite_error("--report", o.report, "--model", dir->string()); !e.empty()) return fail(e);
    auto m = model::load_manifest(*dir);
    if (!m) return fail(m.error().message());
    manifest = std::move(*m);
  }
  if (manifest && !o.expert_bytes.empty()) {
    return usage_fail("give --model or --expert-bytes, not both (the model has sizes)");
  }
  std::uint64_t expert_bytes = 0;
  if (!o.expert_bytes.empty()) {
    auto b = sdk::parse_size(o.expert_bytes);
    if (!b) {
      return usage_fail("--expert-bytes " + o.expert_bytes + ": " + b.error().message() + " (write e.g. 4096 or 1.5M)");
    }
    expert_bytes = *b;
    if (expert_bytes == 0) return usage_fail("--expert-bytes " + o.expert_bytes + ": an expert has at least 1 byte");
  }
  // Expert files are 4 KiB aligned, so a cache holds them in 4 KiB units: a size in between is rounded up, as the
  // engine's slots are.
  const std::uint64_t uniform = (expert_bytes + 4095) / 4096 * 4096;
  const auto expert_sizes = manifest ? ab::ExpertSizes::from_manifest(*manifest) : ab::ExpertSizes::uniform(uniform);

  ab::AccessSequence seq;
  if (auto err = load_trace(o.trace, expert_sizes, o.model, seq); !err.empty()) return fail(err);
  if (manifest) {
    // Every token passes every sparse layer, so a trace of this model routes through all of them; one that skips
    // some fits the model's ids only by chance (a smaller model's trace).
    std::set<std::int64_t> model_layers, trace_layers;
    for (const auto& e : manifest->experts) model_layers.insert(e.layer);
    for (const auto k : seq.keys) trace_layers.insert(k.layer);
    if (trace_layers.size() < model_layers.size()) {
      spdlog::warn(
          "{}: the trace routes through {} of the model's {} sparse layers; a trace of another model? The "
          "replay counts only what the trace holds",
          o.trace, trace_layers.size(), model_layers.size());
    }
  }
  ab::ReplayReport report;
  bool usage = false;
  if (auto err = compute_replay(specs, o.trace, seq, *sizes, expert_sizes, report, &usage); !err.empty()) {
    return usage ? usage_fail(err) : fail(err);
  }

  if (report_file) {
    report_file->stream() << ab::render_html(&report, nullptr);
    if (auto s = report_file->commit(); !s) return fail("report: " + s.message());
  }

  if (o.json) {
    std::cout << replay_json(report, o.per_layer).dump(2) << "\n";
    return 0;
  }
  print_replay(report, o.per_layer);
  std::printf("\nreplayed %llu accesses x %zu %s x %zu %s (+ optimal) in %.2f s\n",
              static_cast<unsigned long long>(report.accesses), report.sizes.size(),
              report.sizes.size() == 1 ? "size" : "sizes", specs.size(), specs.size() == 1 ? "policy" : "policies",
              report.seconds);
  if (!o.report.empty()) std::printf("report: %s\n", o.report.c_str());
  return 0;
}

struct ImportOptions {
  std::string input, format, out;
};

int run_import(const ImportOptions& o) {
  auto fmt = ab::parse_import_format(o.format);
  if (!fmt) return usage_fail(fmt.error().message());
  if (auto e = overwrite_error("-o", o.out, "input", o.input); !e.empty()) return fail(e);
  auto records = ab::import_trace(o.input, *fmt);
  if (!records) return fail(records.error().message());
  if (auto s = ab::write_trace(o.out, *records); !s) return fail(s.message());
  std::cerr << "wrote " << records->size() << " routing records to " << o.out << "\n";
  return 0;
}

struct LiveOptions {
  std::string model;
  std::vector<std::string> profiles;
  std::string prompts;
  int runs = 6;  // the fewest pairs with which the sign test can reach p < 0.05
  bool cold = false, warm = false;
  std::int64_t tokens = 32;
  std::string report;
  bool json = false;
  std::string trace;  // with cache_experts: replay it through both profiles' policies into the report
  std::string cache_experts;
};

struct Side {
  std::string name;
  std::optional<profile::Profile> profile;
  std::unique_ptr<engine::Engine> engine;  // kept between runs with --warm
};

sdk::Expected<std::unique_ptr<engine::Engine>> open_side(Side& s, const std::filesystem::path& dir) {
  return engine::Engine::open(dir, *s.profile, engine::EngineOptions{});
}

// Generates every prompt greedily; returns decode tok/s over all of them, hit rate and bytes read of this run.
// `generated`: the greedy tokens of each prompt, to check that A and B ran the same workload. `since_open`: a cold
// run counts the expert reads its engine made at load too (a resident or pinned profile reads its experts then), as
// `bench` and `run` do, so that bytes read compares what each profile cost from a cold start.
sdk::Status run_once(engine::Engine& e, const tokenizer::Tokenizer& tok, const std::vector<std::string>& prompts,
                     std::int64_t tokens, ab::LiveSide& out, std::vector<std::vector<std::int32_t>>* generated,
                     bool since_open) {
  if (generated != nullptr) generated->clear();
  const auto before = since_open ? engine::ExpertStats{} : e.experts().stats();
  double decode_s = 0, decoded = 0;
  for (const auto& p : prompts) {
    e.reset();
    engine::GenerateOptions g;
    g.max_tokens = tokens;
    g.stop_at_eos = false;
    g.sampling.temperature = 0;
    auto r = engine::generate(e, tok, tok.encode(p, true), g, nullptr);
    if (!r) return r.error();
    if (generated != nullptr) generated->push_back(r->tokens);
    decode_s += r->decode_seconds;
    decoded += r->tokens.size() > 1 ? static_cast<double>(r->tokens.size() - 1) : 0;
  }
  const auto& after = e.experts().stats();
  const double hits = static_cast<double>(after.hits - before.hits);
  const double misses = static_cast<double>(after.misses - before.misses);
  out.decode_tps.push_back(decode_s > 0 ? decoded / decode_s : 0);
  out.hit_rate.push_back(hits + misses > 0 ? hits / (hits + misses) : 1);
  out.bytes_read.push_back(static_cast<double>(after.bytes_read - before.bytes_read));
  return {};
}

int run_live(const LiveOptions& o) {
  if (o.profiles.size() != 2) return usage_fail("give exactly two profiles: --profile A --profile B");
  if (o.cold && o.warm) return usage_fail("give one of --cold and --warm");
  if (o.trace.empty() != o.cache_experts.empty()) return usage_fail("--trace and --cache-experts go together");
  std::vector<std::uint64_t> no_sizes;
  auto sizes =
      o.cache_experts.empty() ? sdk::Expected<std::vector<std::uint64_t>>(no_sizes) : parse_sizes(o.cache_experts);
  if (!sizes) return usage_fail(sizes.error().message());
  if (auto e = overwrite_error("--report", o.report, "--trace", o.trace); !e.empty()) return fail(e);
  std::optional<util::OutputFile> report_file;  // opened before the runs: they may take an hour
  if (!o.report.empty()) {
    auto f = util::OutputFile::open(o.report);
    if (!f) return fail("report: " + f.error().message());
    report_file.emplace(std::move(*f));
  }
  std::vector<std::string> prompts;
  if (o.prompts.empty()) {
    prompts = {"The history of the printing press", "Write a short poem about the sea."};
  } else {
    std::error_code ec;  // a pipe is fine (--prompts <(...)), as run --file takes one
    if (std::filesystem::is_directory(o.prompts, ec)) {
      return fail("--prompts " + o.prompts + " is a directory; give a file of prompts, one per line");
    }
    std::ifstream f(o.prompts);
    if (!f) return fail("cannot read --prompts " + o.prompts + ": " + sdk::os_error_text(errno));
    std::string line;
    while (std::getline(f, line)) {
      if (!line.empty()) prompts.push_back(line);
    }
    if (prompts.empty()) return fail("--prompts " + o.prompts + " holds no prompts (one per line)");
  }
  Side sides[2];
  for (int i = 0; i < 2; ++i) {
    sides[i].name = o.profiles[static_cast<std::size_t>(i)];
    profile::LoadOptions lo;
    lo.profile = sides[i].name;
    auto p = profile::Profile::load(lo);
    if (!p) return fail("--profile " + sides[i].name + ": " + p.error().message());
    note_profile_files(*p);  // the report must not replace them (checked below, before any run)
    sides[i].profile = std::move(*p);
  }
  // Both profiles' plugins are created and checked before any run: a B that cannot run is said before A's runs.
  for (auto& side : sides) {
    engine::EngineOptions checked;
    if (auto pl = engine::Engine::plugins_from_profile(*side.profile, checked); !pl) {
      return fail("--profile " + side.name + ": " + pl.error().message());
    }
  }
  auto dir = model::resolve_model_path(o.model, sides[0].profile->get_string("models.dir"));
  if (!dir) return fail(dir.error().message());
  if (auto e = overwrite_error("--report", o.report, {{"--model", dir->string()}, {"--prompts", o.prompts}});
      !e.empty()) {
    return fail(e);
  }
  // The trace is read before the runs, so that one of another model is refused before them, not after.
  std::optional<model::Manifest> trace_manifest;  // trace_sizes reads it
  std::optional<ab::ExpertSizes> trace_sizes;
  ab::AccessSequence trace_seq;
  if (!o.trace.empty()) {
    auto manifest = model::load_manifest(*dir);
    if (!manifest) return fail(manifest.error().message());
    trace_manifest = std::move(*manifest);
    trace_sizes = ab::ExpertSizes::from_manifest(*trace_manifest);
    if (auto err = load_trace(o.trace, *trace_sizes, o.model, trace_seq); !err.empty()) return fail(err);
  }
  auto tok = tokenizer::Tokenizer::from_file(*dir);
  if (!tok) return fail(tok.error().message());
  ab::LiveReport rep;
  rep.model = o.model;
  rep.mode = o.warm ? "warm" : "cold";
  rep.a.profile = sides[0].name;
  rep.b.profile = sides[1].name;
  ab::LiveSide* out[2] = {&rep.a, &rep.b};
  std::vector<std::vector<std::int32_t>> tokens_of[2];  // the first run's greedy tokens of each side
  for (int run = 0; run < o.runs; ++run) {
    // Interleaved, the order turned every other pair (A B B A A B ...) so that a drift over the session (a warming
    // page cache, a neighbour's load) falls on both sides alike.
    for (int k = 0; k < 2; ++k) {
      const int i = run % 2 == 0 ? k : 1 - k;
      auto& s = sides[i];
      if (!s.engine || !o.warm) {
        s.engine.reset();  // cold: a fresh engine, empty expert cache
        auto e = open_side(s, *dir);
        if (!e) return fail("--profile " + s.name + ": " + e.error().message());
        s.engine = std::move(*e);
        if (o.warm) {
          ab::LiveSide discard;
          if (auto st = run_once(*s.engine, *tok, prompts, o.tokens, discard, nullptr, false); !st) {
            return fail(st.message());
          }
        }
      }
      if (auto st = run_once(*s.engine, *tok, prompts, o.tokens, *out[i], run == 0 ? &tokens_of[i] : nullptr, !o.warm);
          !st) {
        return fail("--profile " + s.name + ": " + st.message());
      }
      if (!o.warm) s.engine.reset();
      std::fprintf(stderr, "run %d %s: %.2f decode tok/s, hit rate %.1f%%\n", run + 1, s.name.c_str(),
                   out[i]->decode_tps.back(), 100 * out[i]->hit_rate.back());
    }
  }
  // Placement never changes the tokens, but a backend or precision change may: then the two sides decoded different
  // text, and their hit rates and bytes read compare workloads as much as cache policies.
  const bool same_tokens = tokens_of[0] == tokens_of[1];
  if (!same_tokens) {
    std::size_t p = 0;
    while (p < prompts.size() && tokens_of[0][p] == tokens_of[1][p]) ++p;
    std::fprintf(stderr,
                 "warning: A and B generated different tokens (prompt %zu): they ran different workloads, so the hit "
                 "rate and bytes read lines compare more than the cache (profiles that differ in backend or "
                 "precision do this; compare policies on one backend)\n",
                 p + 1);
  }
  rep.verdict = ab::compare_paired(rep.a.decode_tps, rep.b.decode_tps);
  // The cache's own measures: on a slow disk fewer bytes read is the answer even where speed is within noise.
  const std::vector<std::string> measures = {
      ab::compare_measure(
          "expert hit rate", rep.a.hit_rate, rep.b.hit_rate,
          [](double x) {
            char b[32];
            std::snprintf(b, sizeof b, "%.1f points", 100 * x);
            return std::string(b);
          },
          true),
      ab::compare_measure(
          "bytes read per run", rep.a.bytes_read, rep.b.bytes_read,
          [](double x) { return util::bytes_text(static_cast<std::uint64_t>(x)); }, false)};
  std::optional<ab::ReplayReport> replayed;
  if (trace_sizes) {
    std::vector<PolicySpec> specs;
    for (const auto& s : sides)
      specs.push_back({s.name + " (" + s.profile->get_string("cache.policy") + ")", s.name, {}});
    replayed.emplace();
    if (auto err = compute_replay(specs, o.trace, trace_seq, *sizes, *trace_sizes, *replayed); !err.empty()) {
      return fail(err);
    }
  }
  if (report_file) {
    report_file->stream() << ab::render_html(replayed ? &*replayed : nullptr, &rep);
    if (auto s = report_file->commit(); !s) return fail("report: " + s.message());
  }
  if (o.json) {
    nlohmann::json j = {{"model", o.model}, {"mode", rep.mode}, {"runs", o.runs}, {"same_tokens", same_tokens}};
    for (const auto* side : {&rep.a, &rep.b}) {
      j[side == &rep.a ? "a" : "b"] = {{"profile", side->profile},
                                       {"decode_tps", side->decode_tps},
                                       {"decode_tps_median", ab::median(side->decode_tps)},
                                       {"hit_rate", side->hit_rate},
                                       {"bytes_read", side->bytes_read}};
    }
    j["measures"] = measures;
    // The numbers behind each measure's line: the paired B - A differences and the sign test.
    for (const auto& [key, a, b] : {std::tuple{"hit_rate", &rep.a.hit_rate, &rep.b.hit_rate},
                                    std::tuple{"bytes_read", &rep.a.bytes_read, &rep.b.bytes_read}}) {
      const auto v = ab::compare_paired(*a, *b);
      j["measure_tests"][key] = {
          {"median_diff", v.median_diff}, {"b_higher", v.b_faster}, {"a_higher", v.a_faster}, {"sign_p", v.sign_p}};
    }
    j["verdict"] = {{"median_diff", rep.verdict.median_diff},   {"ci_low", rep.verdict.ci_low},
                    {"ci_high", rep.verdict.ci_high},           {"sign_p", rep.verdict.sign_p},
                    {"within_noise", rep.verdict.within_noise}, {"text", rep.verdict.text}};
    if (replayed) j["replay"] = replay_json(*replayed, false);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  for (const auto* side : {&rep.a, &rep.b}) {
    const auto& t = side->decode_tps;
    std::printf("%s %-20s decode %.2f tok/s median (min %.2f, max %.2f), hit rate %.1f%%, read %s per run\n",
                side == &rep.a ? "A" : "B", side->profile.c_str(), ab::median(t), *std::min_element(t.begin(), t.end()),
                *std::max_element(t.begin(), t.end()), 100 * ab::median(side->hit_rate),
                util::bytes_text(static_cast<std::uint64_t>(ab::median(side->bytes_read))).c_str());
  }
  std::printf("verdict (decode speed): %s\n", rep.verdict.text.c_str());
  for (const auto& line : measures) std::printf("%s\n", line.c_str());
  if (replayed) {
    std::printf("\nreplay of ");
    print_replay(*replayed, false);
  }
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto* ab_cmd = app.add_subcommand("ab", "A/B test cache policies: replay routing traces, import traces, live runs");
  ab_cmd->require_subcommand(1);

  auto ro = std::make_shared<ReplayOptions>();
  auto* rep = ab_cmd->add_subcommand("replay", "Replay a routing trace through cache policies against the optimum");
  rep->add_option("--trace", ro->trace, "Routing trace (JSONL, see README)")->required();
  rep->add_option("--policy", ro->policies, "Cache policy plugin: NAME, pinned:L:E,L:E or NAME:key=value;key=value")
      ->required();
  rep->add_option("--cache-experts", ro->cache_experts, "Cache sizes in experts, comma-separated (e.g. 8,16,32)")
      ->required();
  rep->add_flag("--per-layer", ro->per_layer, "Break hit rates down by layer");
  rep->add_option("--report", ro->report, "Write a self-contained HTML report");
  rep->add_flag("--json", ro->json, "Print JSON instead of tables");
  rep->add_option("--model,-m", ro->model, "Model whose manifest gives the expert sizes");
  rep->add_option("--expert-bytes", ro->expert_bytes, "Bytes per expert when no --model is given (4096, 1M, 1.5G)");
  add_profile_selection(*rep, global);  // the policy and its options; no tier sizes: --cache-experts gives the size
  rep->callback([&global, ro] { global.exit_code = run_replay(global, *ro); });

  auto io = std::make_shared<ImportOptions>();
  auto* imp = ab_cmd->add_subcommand("import", "Convert a routing trace from another tool into colibri's JSONL");
  imp->add_option("input", io->input, "Input file")->required();
  imp->add_option("--format", io->format,
                  "csv (layer,expert[,request,position,weight,token,step]) or json "
                  "(array of {\"layer\", \"experts\"})")
      ->required();
  imp->add_option("--out,-o", io->out, "Output JSONL trace")->required();
  imp->callback([&global, io] { global.exit_code = run_import(*io); });

  auto lo = std::make_shared<LiveOptions>();
  auto* live =
      ab_cmd->add_subcommand("live", "Interleaved paired runs of two profiles (A B B A A B ...) with a verdict");
  live->add_option("--model,-m", lo->model, "Model directory, or a name under models.dir")->required();
  live->add_option("--profile", lo->profiles, "Profile A, then profile B (NAME or PATH)")->required();
  live->add_option("--prompts", lo->prompts, "Prompts, one per line (default: two built-in prompts)");
  live->add_option("--runs", lo->runs,
                   "Pairs of runs (default 6, the fewest with which the sign test can reach p < 0.05)")
      ->check(apps::integer_at_least(1, "give 1 or more pairs of runs"));
  live->add_option("--tokens,-n", lo->tokens, "Tokens generated per prompt (default 32)")
      ->check(apps::integer_at_least(2, "decode speed needs two generated tokens"));
  live->add_flag("--cold", lo->cold, "A fresh engine (empty expert cache) for every run (default)");
  live->add_flag("--warm", lo->warm, "One engine per profile, warmed by an unmeasured run first");
  live->add_option("--report", lo->report, "Write a self-contained HTML report");
  live->add_flag("--json", lo->json, "Print JSON");
  live->add_option("--trace", lo->trace, "Also replay this trace through both profiles' cache policies (report)");
  live->add_option("--cache-experts", lo->cache_experts, "Cache sizes for --trace, comma-separated");
  live->callback([&global, lo] { global.exit_code = run_live(*lo); });
}

}  // namespace

COLIBRI_CLI_COMMAND(85, setup);

}  // namespace colibri::cli::ab_command
