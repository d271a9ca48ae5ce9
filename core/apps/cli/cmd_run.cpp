// colibri-cli run --model M (--prompt TEXT | --file F | --file -) [-n N] [--profile P] [sampling flags]
// Streams the continuation to stdout, then one stats line (stderr).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "colibri/ab/record.hpp"
#include "colibri/engine/generate.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "colibri/util/output_file.hpp"
#include "engine_cli.hpp"
#include "interrupt.hpp"

namespace colibri::cli::run_command {
namespace {

struct RunOptions {
  EngineCliOptions engine;
  std::string prompt;
  std::string prompt_file;  // "-": standard input
  std::int64_t max_tokens = 128;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool no_special = false;
  bool json = false;
  bool no_echo = false;
  std::string json_schema;  // a JSON Schema file
  engine::SamplingOptions sampling;
  bool seed_given = false;
  apps::DraftFlags draft;
  std::string record_trace;
};

int run_run(const GlobalOptions& global, RunOptions& o) {
  if (!o.seed_given) o.sampling.seed = std::random_device{}();
  if (auto s = o.sampling.validate(); !s) return usage_fail(s.message());
  if (o.max_tokens < 0) return usage_fail("-n must not be negative");
  for (const auto& stop : o.stop) {
    if (stop.empty()) return usage_fail("--stop \"\": an empty text stops nothing; give the text to stop before");
  }
  if (!o.prompt_file.empty()) {
    // The whole file, byte for byte (a trailing newline is part of the prompt, as llama.cpp's -f keeps it).
    std::ifstream file;
    if (o.prompt_file != "-") {
      if (std::filesystem::is_directory(o.prompt_file)) {
        return fail("--file " + o.prompt_file + " is a directory; give a text file");
      }
      file.open(o.prompt_file, std::ios::binary);
      if (!file) return fail("--file " + o.prompt_file + ": cannot open the file");
    }
    if (o.prompt_file == "-" && ::fcntl(STDIN_FILENO, F_GETFD) < 0) {  // `<&-`: nothing to read, and not empty
      return fail("--file -: standard input is closed; give the prompt on it, or --prompt TEXT");
    }
    std::istream& in = o.prompt_file == "-" ? std::cin : file;
    o.prompt.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) return fail("--file " + o.prompt_file + ": reading failed");
    warn_if_not_utf8("--file " + o.prompt_file, o.prompt);
  } else {
    warn_if_not_utf8("--prompt", o.prompt);
  }
  std::shared_ptr<const engine::JsonSchema> schema;
  if (!o.json_schema.empty()) {
    std::ifstream in(o.json_schema, std::ios::binary);
    if (!in || std::filesystem::is_directory(o.json_schema)) {
      return fail("--json-schema " + o.json_schema + ": cannot open the file");
    }
    nlohmann::ordered_json doc;  // ordered: the answer writes the properties in the schema's order
    try {
      doc = nlohmann::ordered_json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {  // its words say the line, the column and what was wrong
      std::string why = e.what();
      if (const auto at = why.find("parse error"); at != std::string::npos) why = why.substr(at);
      return fail("--json-schema " + o.json_schema + ": not valid JSON (" + why + ")");
    }
    auto compiled = engine::JsonSchema::compile(doc);
    if (!compiled) return fail("--json-schema " + o.json_schema + ": " + compiled.error().message());
    schema = *compiled;
  }
  // The trace is checked before the model loads (minutes on a real one), not after the work.
  std::optional<profile::Profile> prof;  // --draft-model opens with it too
  auto opened = open_engine(
      global, o.engine, &prof,
      [&](const std::filesystem::path& dir, auto) -> std::string {
        if (o.record_trace.empty()) return {};
        if (auto e = overwrite_error(
                "--record-trace", o.record_trace,
                {{"--model", dir.string()}, {"--file", o.prompt_file}, {"--json-schema", o.json_schema}});
            !e.empty()) {
          return e;
        }
        if (auto f = util::OutputFile::open(o.record_trace); !f) return "--record-trace: " + f.error().message();
        return {};
      },
      nullptr, &o.draft);
  if (!opened.engine) return opened.exit_code;
  auto& engine = opened.engine;
  if (auto bad = logit_bias_problem(o.sampling, engine->hparams().vocab_size); !bad.empty()) return usage_fail(bad);
  auto tok = tokenizer::Tokenizer::from_file(engine->model_dir());
  if (!tok) return fail(tok.error().message());
  const auto ids = tok->encode(o.prompt, !o.no_special);
  if (ids.empty())
    return fail(o.prompt_file.empty() ? "--prompt encodes to no tokens"
                                      : "--file " + o.prompt_file + " encodes to no tokens (is it empty?)");
  engine::GenerateOptions g;
  g.max_tokens = o.max_tokens;
  g.stop = o.stop;
  g.stop_at_eos = !o.ignore_eos;
  g.sampling = o.sampling;
  g.json_object = o.json || schema != nullptr;
  g.json_schema = schema;
  g.continues_prompt = true;  // the text continues the prompt's (a SentencePiece token's leading space stays)
  std::unique_ptr<engine::DraftModel> draft;
  if (!apply_draft(o.draft, o.engine, *prof, opened, *tok, g, draft)) return 1;
  if (auto s = engine::check_generate(*engine, ids, g); !s) return fail(s.message());  // before the prompt is echoed
  // JSON mode prints the object alone, so that the output parses; --no-echo likewise for plain text.
  if (!o.no_echo && !g.json_object) std::cout << o.prompt << std::flush;
  interrupt::Interruptible interruptible;  // Ctrl-C ends the generation; the statistics and history still come
  auto r = engine::generate(*engine, *tok, ids, g, [](std::string_view text) {
    std::cout << text << std::flush;
    return static_cast<bool>(std::cout) && !interrupt::stop_requested();
  });
  std::cout << "\n" << std::flush;
  if (!r) return fail(r.error().message());
  if (r->finish_reason == "context") {
    std::cerr << "stopped: the context of " << engine->context()
              << " positions is full (raise --ctx or memory.kv_cache)\n";
  }
  std::cerr << stats_line(*engine, r->prefill_tokens_per_second(), r->decode_tokens_per_second()) << " ("
            << r->prompt_tokens << " prompt + " << r->tokens.size() << " generated tokens"
            << draft_summary(*r, draft.get()) << ", " << r->finish_reason << ", seed " << o.sampling.seed << ")\n";
  save_usage(*engine);
  const bool interrupted = interrupt::stop_requested();
  if (!o.record_trace.empty()) {
    // After statistics and usage history: recording re-runs the tokens (see ab/record.hpp). An interrupted run's
    // tokens are recorded too (the trace is what the user asked for); a second Ctrl-C skips it, writing nothing.
    if (interrupted) std::cerr << "recording the routing of the tokens so far (Ctrl-C again to skip)\n";
    std::vector<ab::TraceRecord> trace;
    const auto n_decoded = std::min(r->tokens.size(), static_cast<std::size_t>(engine->n_past()) - ids.size());
    const auto decoded = std::span<const std::int32_t>(r->tokens).first(n_decoded);
    if (auto s = ab::record_generation(*engine, ids, decoded, 0, trace); !s) return fail(s.message());
    if (auto s = ab::write_trace(o.record_trace, trace); !s) return fail(s.message());
    std::cerr << "routing trace: " << trace.size() << " records in " << o.record_trace << "\n";
  }
  if (interrupted) return 130;
  // JSON mode promises one object: one cut short does not parse, so the run did not do what was asked.
  // (Not when standard output failed: main says that, and the reason here would be wrong.)
  const bool cut = r->finish_reason == "length" || r->finish_reason == "stop" || r->finish_reason == "context";
  if (g.json_object && cut && std::cout) {
    const std::string cause = r->finish_reason == "length"
                                  ? "the token limit (-n " + std::to_string(o.max_tokens) + ") came first; raise -n"
                              : r->finish_reason == "stop" ? "a --stop text cut it; leave --stop out in JSON mode"
                                                           : "the context filled first; raise --ctx or shorten the "
                                                             "prompt";
    std::cerr << "error: the JSON object is incomplete (it does not parse): " << cause << "\n";
    return 1;
  }
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate a continuation of a prompt, streamed to the terminal");
  add_engine_options(*cmd, o->engine, global);
  auto* text = cmd->add_option("--prompt,-p", o->prompt, "The prompt text");
  auto* file = cmd->add_option("--file,-f", o->prompt_file, "Read the prompt from this file ('-': standard input)");
  text->excludes(file);
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Most tokens to generate (default 128)");
  cmd->add_option("--stop", o->stop, "Stop before this text (repeatable)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after the end-of-sequence token");
  cmd->add_option("--record-trace", o->record_trace, "Write the routing trace (JSONL, see README) to this file");
  cmd->add_flag("--no-echo", o->no_echo,
                "Print only the generated text, not the prompt before it (JSON mode never echoes)");
  cmd->add_flag("--no-special", o->no_special, "Do not add the tokenizer's special tokens (BOS) to the prompt");
  cmd->add_flag("--json", o->json,
                "JSON mode: generate one JSON object (only tokens that keep it valid JSON), stop when it closes");
  cmd->add_option("--json-schema", o->json_schema,
                  "JSON mode with a JSON Schema file: the object must also conform to it (README: JSON Schema)");
  add_sampling_options(*cmd, o->sampling, o->seed_given);
  apps::add_draft_options(*cmd, o->draft);
  cmd->callback([&global, o, text, file] {
    if (text->count() == 0 && file->count() == 0) {
      global.exit_code = fail("give the prompt: --prompt TEXT, or --file FILE ('-' reads standard input)");
      return;
    }
    global.exit_code = run_run(global, *o);
  });
}

}  // namespace

COLIBRI_CLI_COMMAND(41, setup);

}  // namespace colibri::cli::run_command
