// colibri-cli tokenize (--model DIR | --tokenizer FILE) (--text TEXT | --jsonl FILE) [--add-special] [--decode]
//   encode: each input is a string; prints {"ids":[...]} per input (one line per --jsonl line, a blank one blank).
//   --decode: each input is a JSON array of ids (or {"ids":[...]}); prints {"text":"..."} per input.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "colibri/model/paths.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "command.hpp"

namespace colibri::cli::tokenize_command {
namespace {

using nlohmann::json;

struct TokenizeOptions {
  std::string model;
  std::string tokenizer;
  std::string text;
  std::string jsonl;
  bool decode = false;
  bool add_special = false;
  bool skip_special = false;
};

// One input to one output line; returns an error message or "".
std::string process(const tokenizer::Tokenizer& tok, const TokenizeOptions& o, const json& input, std::string& line) {
  if (!o.decode) {
    if (!input.is_string()) return "expected a JSON string";
    const auto ids = tok.encode(input.get_ref<const std::string&>(), o.add_special);
    line = json{{"ids", ids}}.dump();
    return {};
  }
  const json* ids = &input;
  if (input.is_object() && input.contains("ids")) ids = &input["ids"];
  if (!ids->is_array()) return "expected a JSON array of token ids or {\"ids\": [...]}";
  std::vector<tokenizer::TokenId> values;
  for (std::size_t i = 0; i < ids->size(); ++i) {
    const json& v = (*ids)[i];
    if (!v.is_number_integer()) return "token ids must be integers";
    // The library skips ids it does not know (as HuggingFace's decode does); here they are named instead.
    const auto id = v.get<std::int64_t>();
    if (id < 0 || id > INT32_MAX || !tok.token_to_piece(static_cast<tokenizer::TokenId>(id))) {
      return "id " + std::to_string(id) + " (element " + std::to_string(i) + ") is not in the vocabulary of " +
             std::to_string(tok.vocab_size()) + " tokens";
    }
    values.push_back(static_cast<tokenizer::TokenId>(id));
  }
  line = json{{"text", tok.decode(values, o.skip_special)}}.dump(-1, ' ', false, json::error_handler_t::replace);
  return {};
}

int run_tokenize(const GlobalOptions& global, const TokenizeOptions& o) {
  if (o.skip_special && !o.decode)
    return usage_fail("--skip-special applies to --decode only; encoding keeps every token");
  std::string source = o.tokenizer;
  if (!o.model.empty()) {  // a directory, or a name under models.dir, as every command takes a model
    auto prof = global.load_profile();
    if (!prof) return global.profile_exit_code;
    auto dir = model::resolve_model_path(o.model, prof->get_string("models.dir"));
    if (!dir) return fail(dir.error().message());
    source = dir->string();
  }
  auto tok = tokenizer::Tokenizer::from_file(source);
  if (!tok) return fail(tok.error().message());

  if (o.jsonl.empty()) {
    json input;
    if (o.decode) {
      input = json::parse(o.text, nullptr, false);
      if (input.is_discarded()) return usage_fail("--text: with --decode, expected a JSON array of token ids");
    } else {
      warn_if_not_utf8("--text", o.text);
      input = o.text;
    }
    std::string line;
    if (auto err = process(*tok, o, input, line); !err.empty()) return usage_fail("--text: " + err);
    std::cout << line << "\n";
    return 0;
  }

  std::ifstream file;
  if (o.jsonl != "-") {
    file.open(o.jsonl, std::ios::binary);
    if (!file) return fail("cannot open " + o.jsonl);
  }
  std::istream& in = o.jsonl == "-" ? std::cin : file;  // "-": standard input, as run --file -
  // Validate everything first so a bad line never leaves half an output behind.
  std::vector<std::string> lines;
  std::string raw;
  std::size_t number = 0;
  while (std::getline(in, raw)) {
    ++number;
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    if (raw.find_first_not_of(" \t") == std::string::npos) {  // a blank line answers blank: line N answers line N
      lines.emplace_back();
      continue;
    }
    const json input = json::parse(raw, nullptr, false);
    if (input.is_discarded()) return fail(o.jsonl + ":" + std::to_string(number) + ": not valid JSON");
    std::string line;
    if (auto err = process(*tok, o, input, line); !err.empty()) {
      return fail(o.jsonl + ":" + std::to_string(number) + ": " + err);
    }
    lines.push_back(std::move(line));
  }
  for (const auto& l : lines) std::cout << l << "\n";
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids (or decode ids) with a model's tokenizer.json");
  auto* model =
      cmd->add_option("--model,-m", o->model, "Model directory (or a name under models.dir) containing tokenizer.json");
  auto* file = cmd->add_option("--tokenizer", o->tokenizer,
                               "Path to a tokenizer.json, or to a tiktoken.model or a directory with one (Kimi K2)");
  model->excludes(file);
  auto* text = cmd->add_option("--text", o->text, "One input (a string; with --decode a JSON array of ids)");
  auto* jsonl = cmd->add_option("--jsonl", o->jsonl,
                                "File with one JSON input per line ('-': standard input); prints one JSON per line");
  text->excludes(jsonl);
  cmd->add_flag("--add-special", o->add_special, "Add the post-processor's special tokens (BOS/EOS)");
  cmd->add_flag("--decode", o->decode, "Decode ids to text instead of encoding");
  cmd->add_flag("--skip-special", o->skip_special, "With --decode: drop special tokens from the text");
  cmd->callback([&global, o, model, file, text, jsonl] {
    if (model->count() == 0 && file->count() == 0) {
      global.exit_code = usage_fail("tokenize: give --model DIR or --tokenizer FILE");
      return;
    }
    if (text->count() == 0 && jsonl->count() == 0) {
      global.exit_code = usage_fail("tokenize: give --text TEXT or --jsonl FILE");
      return;
    }
    global.exit_code = run_tokenize(global, *o);
  });
}

}  // namespace

COLIBRI_CLI_COMMAND(50, setup);

}  // namespace colibri::cli::tokenize_command
