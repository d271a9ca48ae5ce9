// colibri-server --model M [--profile P] [--host 127.0.0.1] [--port 8080] [--api-key KEY] ...
// Opens the model once and serves the OpenAI-compatible API until SIGTERM/SIGINT.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "../common/cli_values.hpp"
#include "../common/draft_model.hpp"
#include "../common/output_checks.hpp"
#include "colibri/ab/trace_writer.hpp"
#include "colibri/chat/template.hpp"
#include "colibri/engine/engine.hpp"
#include "colibri/engine/usage_history.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/profile/profile.hpp"
#include "colibri/sdk/config.hpp"
#include "colibri/sdk/version.hpp"
#include "colibri/server/server.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "colibri/util/host_info.hpp"
#include "colibri/util/log.hpp"

namespace {

using namespace colibri;

int fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return 1;
}

// An option value refused after parsing (one the model cannot take): exit 2, as for the values the parser refuses.
int usage_fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return 2;
}

struct Flags {
  std::vector<std::string> allowed_origins;
  std::string model, profile, host, api_key, served_name, kv_type = "f16", chat_template, usage_history, record_trace,
                                                          reasoning_format = "separate", sampling_defaults = "model";
  std::string expert_cache_size, vram_budget, prefetch_layers, max_body = "4M", log_level = "info";
  std::vector<std::string> sets;
  int port = -1;
  std::int64_t ctx = 0, ubatch = 512;
  std::int64_t max_queue = 64, max_connections = 256;
  int max_batch = 8, io_threads = 2;
  std::uint32_t max_header = 16384;
  double request_timeout = 15, idle_timeout = 60, write_timeout = 60, drain_timeout = 10, sse_keepalive = 15;
  bool exact = false, exclude_tools_when_none = false;
  apps::DraftFlags draft;
};

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

int serve(Flags& f) {
  if (auto st = util::set_log_level(f.log_level); !st) return fail(st.message());
  profile::LoadOptions lo;
  lo.profile = f.profile;
  if (!f.expert_cache_size.empty())
    lo.overrides.push_back({"memory.expert_cache", f.expert_cache_size, "--expert-cache-size"});
  if (!f.vram_budget.empty()) lo.overrides.push_back({"memory.vram_budget", f.vram_budget, "--vram-budget"});
  if (!f.prefetch_layers.empty()) lo.overrides.push_back({"prefetch.layers", f.prefetch_layers, "--prefetch-layers"});
  for (const auto& s : f.sets) {
    const auto eq = s.find('=');
    lo.overrides.push_back({s.substr(0, eq), s.substr(eq + 1), "--set"});
  }
  auto prof = profile::Profile::load(lo);
  if (!prof) {
    return apps::refused_for_command_line(lo) ? usage_fail(prof.error().message()) : fail(prof.error().message());
  }

  server::ServerOptions so;
  so.host = !f.host.empty() ? f.host : prof->get_string("server.host");
  if (so.host.empty()) so.host = "127.0.0.1";
  std::int64_t port = f.port;
  if (port < 0) port = prof->get_int("server.port").value_or(8080);
  if (port < 0 || port > 65535) return fail("--port " + std::to_string(port) + " is not a TCP port (0..65535)");
  so.port = static_cast<std::uint16_t>(port);
  so.api_key = f.api_key;
  if (so.api_key.empty() && !(so.host == "localhost" || so.host == "::1" || so.host.starts_with("127."))) {
    spdlog::warn(
        "listening on {} without --api-key: anyone who can reach this address can use the model and its "
        "/admin routes (COLIBRI_API_KEY, or --host 127.0.0.1)",
        so.host);
  }
  so.allowed_origins = f.allowed_origins;
  so.max_body_bytes = *sdk::parse_size(f.max_body);  // checked by the parser
  so.max_header_bytes = f.max_header;
  so.request_timeout = ms(f.request_timeout);
  so.idle_timeout = ms(f.idle_timeout);
  so.write_timeout = ms(f.write_timeout);
  so.drain_timeout = ms(f.drain_timeout);
  so.sse_keepalive = ms(f.sse_keepalive);
  so.separate_reasoning = f.reasoning_format == "separate";
  so.exclude_tools_when_tool_choice_none = f.exclude_tools_when_none;
  so.max_connections = static_cast<std::size_t>(f.max_connections);
  // Each connection holds a descriptor, and so does each expert read in flight: beyond the limit, accepts wait and
  // expert reads fail (503). Said now, not found under load.
  constexpr std::uint64_t kEngineDescriptors = 64;
  if (const auto limit = util::raise_open_file_limit(); so.max_connections + kEngineDescriptors > limit) {
    spdlog::warn(
        "--max-connections {} with an open-file limit of {} (ulimit -n; LimitNOFILE= in a systemd unit): "
        "keep the connections about {} below the limit, or raise it",
        so.max_connections, limit, kEngineDescriptors);
  }
  so.io_threads = f.io_threads;
  so.scheduler.max_queue = static_cast<std::size_t>(f.max_queue);
  so.scheduler.max_batch = f.max_batch;
  if (auto every = prof->get_int("memory.kv_checkpoint_every")) so.scheduler.checkpoint_every = *every;
  so.scheduler.prefill_chunk = f.ubatch;
  so.scheduler.draft_tokens = f.draft.count();
  so.scheduler.draft_ngram = f.draft.ngram;
  so.scheduler.usage_history = !f.usage_history.empty() ? f.usage_history : prof->get_path("cache.auto_pin_history");
  // Written at exit: a path that cannot take it is said now, not after a day's counts are lost.
  if (const std::filesystem::path history = so.scheduler.usage_history; !history.empty()) {
    const std::string named = !f.usage_history.empty() ? "--usage-history" : "cache.auto_pin_history";
    std::error_code ec;
    if (std::filesystem::is_directory(history, ec)) {
      return fail(named + " " + history.string() + " is a directory; name a JSON file in it");
    }
    const auto parent = history.has_parent_path() ? history.parent_path() : std::filesystem::path(".");
    if (!std::filesystem::is_directory(parent, ec)) {
      return fail(named + " " + history.string() + ": the directory " + parent.string() +
                  " does not exist; create it or name another file");
    }
  }

  auto dir = model::resolve_model_path(f.model, prof->get_string("models.dir"));
  if (!dir) return fail(dir.error().message());
  // The trace is written from the start: one that names a profile file or a model file would destroy it.
  if (auto e = apps::output_error("--record-trace", f.record_trace, {{"--model", dir->string()}}, prof->files());
      !e.empty()) {
    return fail(e);
  }
  // A named history file is merged into at exit: one that could not be (malformed, or another model's counts, which
  // are never replaced) is said now. --usage-history stops the start; a profile's cache.auto_pin_history (which may
  // be shared on purpose: the pinned policy reads it for any model) is warned about, and this server's counts are
  // then not saved there.
  if (const std::filesystem::path history = so.scheduler.usage_history;
      !history.empty() && !engine::is_own_history_file(history, *dir)) {
    std::string problem;
    if (auto h = engine::load_usage_history(history); !h) {
      problem = h.error().message();
    } else if (!engine::history_mismatch(*h, history, *dir).empty()) {
      problem = engine::other_model_history(history, *dir).message();
    }
    if (!problem.empty() && !f.usage_history.empty()) return fail("--usage-history: " + problem);
    if (!problem.empty())
      spdlog::warn("cache.auto_pin_history: {}; this server's expert use is not saved there", problem);
  }
  auto kv = engine::parse_kv_type(f.kv_type);
  if (!kv) return fail(kv.error().message());
  // Read once, for the check and the load (which reads one that does not load itself, with the storage's mirrors).
  auto manifest = model::load_manifest(*dir);
  if (auto err = apps::context_past_model(manifest ? &*manifest : nullptr, f.ctx); !err.empty()) {
    return usage_fail(err);
  }
  engine::EngineOptions eo;
  eo.context = f.ctx;
  eo.kv_type = *kv;
  eo.ubatch = f.ubatch;
  eo.exact_activations = f.exact;
  eo.sequences_only = true;  // every request's KV cache is a sequence's
  eo.kv_sequences = f.max_batch;
  eo.kv_admission = true;  // the scheduler holds requests back rather than let the caches outgrow the RAM
  auto draft_experts = apps::prepare_draft_model(f.draft, *prof, manifest ? &*manifest : nullptr, eo);
  if (!draft_experts) return fail(draft_experts.error().message());
  auto tok = tokenizer::Tokenizer::from_file(*dir);
  if (!tok) return fail(tok.error().message());

  // Chat template: --chat-template (a built-in family or a file), else tokenizer_config.json, else none. A
  // tokenizer_config.json without one: the architecture's built-in family, as `colibri-cli chat` picks it ("" lets
  // the special tokens decide).
  const std::string family = manifest ? chat::family_for_architecture(manifest->hparams.architecture) : "";
  std::optional<chat::Template> tmpl;
  chat::ChatConfig cc;
  if (!f.chat_template.empty()) {
    auto named = chat::chat_config_override(f.chat_template);
    if (!named) return fail(named.error().message());
    auto t = chat::Template::parse(named->template_source, f.chat_template);
    if (!t) return fail(t.error().message());
    tmpl = std::move(*t);
    cc = std::move(*named);
    cc.bos_token = tok->bos_token();
    cc.eos_token = tok->eos_token();
  } else if (auto c = chat::load_chat_config(*dir / "tokenizer_config.json", family); c) {
    cc = *c;
    // The model's own template not parsing ends chat, not completions: served without it, said now and per request.
    if (auto t = chat::Template::parse(cc.template_source, cc.template_origin); t) {
      tmpl = std::move(*t);
      spdlog::info("chat template: {}", cc.template_origin);
    } else {
      spdlog::warn(
          "the model's chat template does not parse ({}); /v1/chat/completions will answer 400 (start with "
          "--chat-template to give one)",
          t.error().message());
    }
  } else {
    spdlog::warn("no chat template ({}); /v1/chat/completions will answer 400", c.error().message());
  }

  std::shared_ptr<ab::TraceWriter> trace;
  if (!f.record_trace.empty()) {
    auto w = ab::TraceWriter::open(f.record_trace);
    if (!w) return fail("--record-trace: " + w.error().message());
    trace = std::move(*w);
    so.scheduler.trace = trace;
  }

  if (f.sampling_defaults == "model") {
    auto d = server::read_sampling_defaults(*dir / "generation_config.json");
    if (!d) return fail(d.error().message());
    so.sampling_defaults = *d;
    if (!d->empty()) {
      spdlog::info(
          "sampling defaults from the model's generation_config.json: {} (a request's own values win; "
          "--sampling-defaults openai for OpenAI's)",
          d->describe());
    }
  }
  if (auto st = server::Server::check_address(so.host, so.port); !st) return fail(st.message());  // before loading
  auto eng = engine::Engine::open(*dir, *prof, eo, manifest ? std::optional(std::move(*manifest)) : std::nullopt);
  if (!eng) {
    return apps::refused_value_of_command_line(*prof, eng.error()) ? usage_fail(eng.error().message())
                                                                   : fail(eng.error().message());
  }
  auto draft =
      apps::open_draft_model(f.draft, *prof, eo, **eng, *tok, *draft_experts, static_cast<std::size_t>(f.max_batch));
  if (!draft) return fail(draft.error().message());
  so.scheduler.draft_model = std::move(*draft);
  if (!f.draft.model.empty() && !so.scheduler.draft_model && f.draft.count() == 0) {
    spdlog::warn("--draft 0: --draft-model is not opened");
  }
  if (so.scheduler.draft_model) {
    spdlog::info("draft model: {} (up to {} drafts a step, while its top token is at least {} likely)",
                 so.scheduler.draft_model->engine().model_dir().string(), f.draft.count(), f.draft.p_min);
  }
  if (auto budget = prof->get_int("memory.kv_budget")) {
    so.scheduler.kv_budget = static_cast<std::uint64_t>(*budget);
  } else {
    so.scheduler.kv_budget = (*eng)->kv_host_budget();
  }
  if (const auto whole = (*eng)->kv_sequence_bytes((*eng)->context());
      so.scheduler.kv_budget > 0 && whole > 0 &&
      static_cast<std::uint64_t>(f.max_batch) * whole > so.scheduler.kv_budget) {
    spdlog::info(
        "KV budget {} (memory.kv_budget): {} caches of the whole context fit it, of --max-batch {}; past it requests "
        "wait in the queue and the newest running sequences are paused, to run their tokens again when there is room",
        sdk::format_size(so.scheduler.kv_budget), so.scheduler.kv_budget / whole, f.max_batch);
  }
  const auto context = (*eng)->context();
  const auto mode = (*eng)->mode();
  so.model_name = f.served_name;
  auto srv = server::Server::create(std::move(*eng), std::move(*tok), std::move(tmpl), cc, so);
  if (!srv) return fail(srv.error().message());
  // One line on stdout that scripts can wait for (the port matters with --port 0).
  std::printf("colibri-server listening on http://%s:%u (model %s, %s, context %lld)\n", so.host.c_str(),
              static_cast<unsigned>((*srv)->port()), (*srv)->model_name().c_str(), mode.c_str(),
              static_cast<long long>(context));
  std::fflush(stdout);
  (*srv)->run();
  if (trace) spdlog::info("routing trace: {} records in {}", trace->records_written(), f.record_trace);
  spdlog::info("colibri-server stopped");
  // The trace was asked for: one cut short by a write error (logged when it happened) makes the exit status say so.
  if (trace && trace->failed()) {
    return fail("the routing trace " + f.record_trace + " stopped at a write error (above); it holds the " +
                std::to_string(trace->records_written()) + " records before it");
  }
  return 0;
}

}  // namespace

// CLI11 exits with its own code per kind of mistake (104, 105, 109...); a usage error is exit status 2, as in
// getopt's tools and Python's argparse, so that scripts can tell it from a failed run (1). --help stays 0.
static int usage_exit(const CLI::App& app, const CLI::ParseError& e) {
  return app.exit(e) == 0 ? 0 : 2;
}

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"colibri-server: OpenAI-compatible HTTP API for a colibri model", "colibri-server"};
  app.set_version_flag("--version", std::string("colibri ") + COLIBRI_SDK_VERSION_STRING);
  Flags f;
  app.add_option("--model,-m", f.model, "Model directory, or a name under models.dir")->required();
  app.add_option("--profile", f.profile, "Hardware profile: a name or a YAML path")->envname("COLIBRI_PROFILE");
  app.add_option("--set", f.sets, "Set any profile key: --set storage.plugin=io_uring (repeatable)")
      ->check(apps::profile_setting());
  app.add_option("--expert-cache-size", f.expert_cache_size, "RAM tier for experts, e.g. 8G (memory.expert_cache)");
  app.add_option("--vram-budget", f.vram_budget, "VRAM tier for experts, e.g. 6G (memory.vram_budget)");
  app.add_option("--prefetch-layers", f.prefetch_layers, "Layers ahead to prefetch experts for (prefetch.layers)");
  app.add_option("--host", f.host, "Address to listen on (default: server.host, 127.0.0.1)");
  app.add_option("--port", f.port, "TCP port (default: server.port, 8080; 0 picks a free one)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--api-key", f.api_key,
                 "Require 'Authorization: Bearer KEY' on /v1, /admin, /tokenize and /detokenize")
      ->envname("COLIBRI_API_KEY");
  app.add_option("--allow-origin", f.allowed_origins,
                 "Let browser pages from this origin call the API (CORS), e.g. http://localhost:3000; '*' for any "
                 "(repeatable; default: none)");
  app.add_option("--served-model-name", f.served_name,
                 "Model name clients must send (default: the model directory's name)");
  app.add_option("--chat-template", f.chat_template,
                 "Chat template: a built-in family or a Jinja file (default: the model's chat_template.jinja, else "
                 "tokenizer_config.json's)");
  app.add_option("--ctx", f.ctx, "Context length per sequence (0 or unset: memory.kv_cache, else the model's)")
      ->check(apps::context_length());
  app.add_option("--kv-type", f.kv_type, "KV cache type: f16 (default), q8_0 or f32")->check(apps::kv_cache_type());
  app.add_option("--batch", f.ubatch, "Prompt tokens per forward chunk (results do not depend on it)")
      ->check(apps::integer_at_least(1, "give the tokens per forward chunk (default 512)"));
  app.add_flag("--exact-activations", f.exact, "Never quantize activations in quantized matmuls");
  apps::add_draft_options(app, f.draft);
  app.add_option("--max-batch", f.max_batch, "Sequences decoding together (default 8)")
      ->check(apps::integer_at_least(1, "give 1 or more sequences"));
  app.add_option("--max-queue", f.max_queue,
                 "Requests that may wait beyond the free --max-batch slots; more get 429 (default 64; 0: none wait)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  app.add_option("--max-body-size", f.max_body, "Largest request body (default 4M); larger gets 413")
      ->check(CLI::Validator(
          [](std::string& value) {
            auto size = sdk::parse_size(value);
            return size && *size > 0 ? std::string() : value + " is not a size; give one such as 4M or 65536";
          },
          ""));
  app.add_option("--max-header-size", f.max_header, "Largest request header block in bytes (default 16384)")
      ->check(apps::integer_at_least(1024, "give 1024 bytes or more"));
  app.add_option("--max-connections", f.max_connections,
                 "Open connections at most (default 256); beyond, a 503 with Retry-After, and idle keep-alive "
                 "connections are closed to make room")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  const auto seconds = apps::number_between(0, 86400, "give 0 to 86400 seconds");
  app.add_option("--request-timeout", f.request_timeout, "Seconds to receive a request (default 15)")->check(seconds);
  app.add_option("--idle-timeout", f.idle_timeout,
                 "Seconds a keep-alive connection may wait for a request (default 60)")
      ->check(seconds);
  app.add_option("--write-timeout", f.write_timeout, "Seconds one response write may take (default 60)")
      ->check(seconds);
  app.add_option("--drain-timeout", f.drain_timeout, "SIGTERM: seconds streams get to finish (default 10)")
      ->check(seconds);
  app.add_option("--sse-keepalive", f.sse_keepalive,
                 "Seconds a stream may send nothing before an SSE comment line (': keep-alive', which clients ignore) "
                 "keeps proxies from timing it out during a long prompt or a queue (default 15; 0: never)")
      ->check(seconds);
  app.add_option("--io-threads", f.io_threads, "HTTP threads (default 2)")
      ->check(apps::integer_between(1, 64, "give 1 to 64 threads"));
  app.add_option(
      "--usage-history", f.usage_history,
      "Expert usage counts are merged into this JSON file on exit (default: cache.auto_pin_history, else the "
      "model's history that run and bench write)");
  app.add_option("--reasoning-format", f.reasoning_format,
                 "separate: a reasoning model's <think> block is returned as reasoning_content; inline: left in the "
                 "content (gpt-oss's analysis channel is always reasoning_content)")
      ->check(CLI::IsMember({"separate", "inline"}));
  app.add_flag("--exclude-tools-when-tool-choice-none", f.exclude_tools_when_none,
               "tool_choice \"none\": leave the tools out of the prompt (default: shown to the template, as vLLM)");
  app.add_option("--sampling-defaults", f.sampling_defaults,
                 "Sampling fields a request leaves out: model (the model's generation_config.json temperature, top_p, "
                 "top_k, min_p, repetition_penalty, as vLLM; OpenAI's where it has none) or openai (temperature 1, "
                 "the rest off)")
      ->check(CLI::IsMember({"model", "openai"}));
  app.add_option("--record-trace", f.record_trace,
                 "Write the routing of every request to this JSONL file (README: Routing traces)");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error or off (env COLIBRI_LOG_LEVEL)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  apps::refuse_silently_changed_values(app, {});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return usage_exit(app, e);
  }
  if (apps::log_level_from_environment(app, f.log_level)) {
    if (auto st = util::set_log_level(f.log_level); !st) return fail("COLIBRI_LOG_LEVEL: " + st.message());
  }
  try {
    return serve(f);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
