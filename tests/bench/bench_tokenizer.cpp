// Tokenizer encode throughput on one thread (MB/s = input bytes per second). The text is the test corpus
// (tests/data/tokenizer/corpus.jsonl joined by newlines) repeated 48 times (~1 MB); tests/js/tokenizer_bench.mjs
// measures the HuggingFace library on the very same text for a side-by-side comparison.
// Tokenizers are looked up in $COLIBRI_TOKENIZERS_DIR or ../shared/tokenizers next to the repository.
// json_mask/*: the time JSON mode adds to each generated token (one mask over the whole vocabulary), inside a string
// (most tokens pass their first byte) and after a value (most fail there).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "colibri/engine/json_constraint.hpp"
#include "colibri/tokenizer/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
using colibri::tokenizer::Tokenizer;

std::string bench_text() {
  std::ifstream in(fs::path(COLIBRI_BENCH_SOURCE_DIR) / "tests/data/tokenizer/corpus.jsonl");
  std::string once, line;
  while (std::getline(in, line)) {
    if (!line.empty()) once += nlohmann::json::parse(line).get<std::string>() + "\n";
  }
  std::string text;
  for (int i = 0; i < 48; ++i) text += once;
  return text;
}

std::string long_word() {
  std::string w;
  while (w.size() < 100000) w += "antidisestablishmentarianism";
  return w;
}

fs::path tokenizers_root() {
  if (const char* env = std::getenv("COLIBRI_TOKENIZERS_DIR")) return env;
  return fs::path(COLIBRI_BENCH_SOURCE_DIR) / ".." / "shared" / "tokenizers";
}

void encode(benchmark::State& state, const Tokenizer& tok, const std::string& text) {
  std::size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
}

// A schema with the shapes structured outputs use: a closed object, an enum, a nullable field, a list of objects.
const char* const kBenchSchema = R"({"type": "object", "properties": {
    "name": {"type": "string"}, "category": {"enum": ["bird", "insect", "mammal", "reptile"]},
    "weight_grams": {"type": ["number", "null"]},
    "sightings": {"type": "array", "items": {"type": "object", "properties": {"place": {"type": "string"},
                  "count": {"type": "integer"}}, "required": ["place", "count"]}}},
    "required": ["name", "category", "sightings"]})";

// `schema` empty: JSON mode; else JSON Schema mode with that schema.
void json_mask(benchmark::State& state, const Tokenizer& tok, const std::string& prefix,
               const std::string& schema = "") {
  std::vector<std::int64_t> end_tokens;
  if (const auto eos = tok.eos_id()) end_tokens.push_back(*eos);
  const colibri::engine::JsonTokenMask mask(tok, tok.vocab_size(), end_tokens);
  std::shared_ptr<const colibri::engine::JsonSchema> compiled;
  if (!schema.empty()) {
    auto c = colibri::engine::JsonSchema::compile(nlohmann::json::parse(schema));
    if (!c) return state.SkipWithError(c.error().message().c_str());
    compiled = *c;
  }
  colibri::engine::JsonConstraint json(compiled.get());
  if (!json.advance(prefix)) state.SkipWithError("the prefix is not JSON");
  std::vector<std::uint8_t> allowed;
  for (auto _ : state) {
    mask.allowed(json, allowed);
    benchmark::DoNotOptimize(allowed.data());
  }
  state.counters["allowed"] = static_cast<double>(std::count(allowed.begin(), allowed.end(), 1));
}

}  // namespace

int main(int argc, char** argv) {
  static const std::string text = bench_text();
  static const std::string word = long_word();
  static std::vector<std::unique_ptr<Tokenizer>> keep;
  for (const char* name : {"mixtral", "llama2", "mistral_nemo", "qwen3", "llama3", "deepseek_v3", "gptoss"}) {
    auto tok = Tokenizer::from_file(tokenizers_root() / name);
    if (!tok) {
      std::fprintf(stderr, "skip %s: %s\n", name, tok.error().message().c_str());
      continue;
    }
    keep.push_back(std::make_unique<Tokenizer>(std::move(*tok)));
    const Tokenizer* t = keep.back().get();
    benchmark::RegisterBenchmark((std::string("encode_corpus_1MB/") + name).c_str(), [t](benchmark::State& s) {
      encode(s, *t, text);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("encode_100KB_word/") + name).c_str(), [t](benchmark::State& s) {
      encode(s, *t, word);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("json_mask_in_string/") + name).c_str(), [t](benchmark::State& s) {
      json_mask(s, *t, R"({"name": "col)");
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("json_mask_after_value/") + name).c_str(), [t](benchmark::State& s) {
      json_mask(s, *t, R"({"a": [1, 2)");
    })->Unit(benchmark::kMillisecond);
    // JSON Schema mode: a key of a closed object (a few names allowed), an enum value, a free string.
    benchmark::RegisterBenchmark((std::string("json_schema_mask_key/") + name).c_str(), [t](benchmark::State& s) {
      json_mask(s, *t, R"({"name": "Anna", ")", kBenchSchema);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("json_schema_mask_enum/") + name).c_str(), [t](benchmark::State& s) {
      json_mask(s, *t, R"({"category": "b)", kBenchSchema);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("json_schema_mask_in_string/") + name).c_str(), [t](benchmark::State& s) {
      json_mask(s, *t, R"({"name": "col)", kBenchSchema);
    })->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
