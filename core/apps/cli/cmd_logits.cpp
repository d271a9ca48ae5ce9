// colibri-cli logits --model M --tokens 1,2,3 --out FILE.npy [--trace FILE.jsonl]
// Float32 logits of every position as a NumPy .npy [tokens x vocab]; the routing trace as JSONL.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "colibri/tokenizer/tokenizer.hpp"
#include "colibri/util/output_file.hpp"
#include "engine_cli.hpp"

namespace colibri::cli::logits_command {
namespace {

struct LogitsOptions {
  EngineCliOptions engine;
  std::string tokens;
  std::string prompt;
  std::string out;
  std::string trace;
};

int run_logits(const GlobalOptions& global, const LogitsOptions& o) {
  if (o.tokens.empty() && o.prompt.empty()) {
    return usage_fail("give --tokens IDS or --prompt TEXT (not empty: there must be a token to run)");
  }
  if (!o.tokens.empty() && !o.prompt.empty()) return usage_fail("give one of --tokens and --prompt, not both");
  std::vector<std::int32_t> ids;
  if (!o.tokens.empty()) {
    if (o.tokens.back() == ',')
      return usage_fail("--tokens: '" + o.tokens + "' ends with a comma (write --tokens 1,2,3)");
    std::stringstream ss(o.tokens);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        std::size_t used = 0;
        const long long v = std::stoll(item, &used);
        if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
        ids.push_back(static_cast<std::int32_t>(v));
      } catch (const std::exception&) {
        return usage_fail("--tokens: '" + item + "' is not a token id (write --tokens 1,2,3)");
      }
    }
    if (ids.empty()) return usage_fail("--tokens lists no token ids");
  }
  if (auto e = same_output_error("--trace", o.trace, "--out", o.out); !e.empty()) return fail(e);
  auto opened = open_engine(
      global, o.engine, nullptr,
      [&](const std::filesystem::path& dir, auto) {
        const std::vector<std::pair<std::string, std::string>> inputs = {{"--model", dir.string()}};
        if (auto e = overwrite_error("--out", o.out, inputs); !e.empty()) return e;
        return overwrite_error("--trace", o.trace, inputs);
      },
      [&](const model::Manifest& m) -> std::string {
        for (const auto id : ids) {
          if (id >= m.hparams.vocab_size) {
            return "--tokens: " + std::to_string(id) + " is past the model's vocabulary (ids 0.." +
                   std::to_string(m.hparams.vocab_size - 1) + ")";
          }
        }
        return "";
      });
  if (!opened.engine) return opened.exit_code;
  auto& engine = opened.engine;
  if (!o.prompt.empty()) {
    auto tok = tokenizer::Tokenizer::from_file(engine->model_dir());
    if (!tok) return fail(tok.error().message());
    ids = tok->encode(o.prompt, true);
    if (ids.empty()) return usage_fail("--prompt encodes to no tokens");
  }
  std::vector<float> logits;
  std::vector<engine::RoutingRecord> trace;
  if (auto s = engine->forward(ids, engine::LogitsWanted::all, logits, o.trace.empty() ? nullptr : &trace); !s) {
    return fail(s.message());
  }
  const auto V = engine->vocab_size();
  auto s = util::write_file_atomically(o.out, [&](std::ostream& f) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(ids.size()) + ", " +
                         std::to_string(V) + "), }";
    const std::size_t unpadded = 10 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header.push_back('\n');
    const auto len = static_cast<std::uint16_t>(header.size());
    f.write("\x93NUMPY\x01\x00", 8);
    const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
    f.write(len_bytes, 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
    return static_cast<bool>(f);
  });
  if (!s) return fail(s.message());
  if (!o.trace.empty()) {
    s = util::write_file_atomically(o.trace, [&](std::ostream& f) {
      for (const auto& r : trace) {
        nlohmann::json j = {{"position", r.position},
                            {"token", ids[static_cast<std::size_t>(r.position)]},
                            {"layer", r.layer},
                            {"experts", r.experts},
                            {"weights", r.weights}};
        f << j.dump() << "\n";
      }
      return static_cast<bool>(f);
    });
    if (!s) return fail(s.message());
  }
  std::cerr << "wrote " << ids.size() << " x " << V << " logits to " << o.out << "\n";
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Run tokens through the model and save the logits of every position (.npy)");
  add_engine_options(*cmd, o->engine, global);
  cmd->add_option("--tokens", o->tokens, "Comma-separated token ids, e.g. 1,2,3");
  cmd->add_option("--prompt", o->prompt, "Text to tokenize instead of --tokens (special tokens added)");
  cmd->add_option("--out,-o", o->out, "Output .npy file: float32 [tokens x vocab]")->required();
  cmd->add_option("--trace", o->trace, "JSONL file: per token and sparse layer, expert ids and weights");
  cmd->callback([&global, o] { global.exit_code = run_logits(global, *o); });
}

}  // namespace

COLIBRI_CLI_COMMAND(40, setup);

}  // namespace colibri::cli::logits_command
