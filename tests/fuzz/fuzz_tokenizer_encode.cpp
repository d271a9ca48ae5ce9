// Any text a user sends through the shipped tokenizers (../shared/tokenizers, $COLIBRI_TOKENIZERS_DIR or the npm
// fallback; the replay test skips without them). Ids stay in the vocabulary, streamed decoding equals decode(), and
// byte-level tokenizers without a normalizer give back valid UTF-8 exactly.
#include <memory>
#include <string>
#include <vector>

#include "colibri/tokenizer/tokenizer.hpp"
#include "fuzz_common.hpp"
#include "tokenizer/utf8.hpp"
#include "unit/tokenizer/test_paths.hpp"

namespace {
using colibri::tokenizer::Tokenizer;

struct Shipped {
  std::string name;
  const Tokenizer* tokenizer;
  bool round_trips;  // byte-level, no normalizer
};

const std::vector<Shipped>& shipped() {
  static const std::vector<Shipped> all = [] {
    std::vector<Shipped> v;
    for (const auto& [name, round_trips] : std::vector<std::pair<std::string, bool>>{{"qwen3", false},
                                                                                     {"llama3", true},
                                                                                     {"mistral_nemo", true},
                                                                                     {"gptoss", true},
                                                                                     {"deepseek_v3", false},
                                                                                     {"mixtral", false},
                                                                                     {"llama2", false}}) {
      if (const auto* tok = colibri::test::shipped_tokenizer(name)) v.push_back({name, tok, round_trips});
    }
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& all = shipped();
  if (all.empty()) return 0;
  colibri::fuzz::Input in(data, size);
  const std::uint8_t choice = in.byte();
  const Shipped& s = all[choice % all.size()];
  const bool special = (choice & 0x80) != 0;
  const std::string_view text = in.rest();
  const auto ids = s.tokenizer->encode(text, special);
  for (const auto id : ids) {
    FUZZ_CHECK(id >= 0 && static_cast<std::size_t>(id) < s.tokenizer->vocab_size(),
               s.name + " id " + std::to_string(id));
  }
  const auto decoded = s.tokenizer->decode(ids);
  colibri::tokenizer::StreamDecoder stream(*s.tokenizer);
  std::string streamed;
  std::string list;  // each id and what the stream released with it
  for (const auto id : ids) {
    const std::string piece = stream.push(id);
    streamed += piece;
    list += std::to_string(id) + (piece.empty() ? " " : "=" + colibri::fuzz::quote(piece) + " ");
  }
  streamed += stream.flush();
  if (streamed != decoded) {
    FUZZ_CHECK(streamed == decoded, s.name + ": streamed decoding differs from decode() for ids " + list + ": " +
                                        colibri::fuzz::versus(streamed, decoded));
  }
  if (s.round_trips && !special && colibri::tokenizer::utf8::is_valid(text)) {
    FUZZ_CHECK(decoded == text,
               s.name + ": decode(encode(text)) is not the text: " + colibri::fuzz::versus(decoded, text));
  }
  return 0;
}

extern "C" const char* colibri_fuzz_unavailable() {
  return shipped().empty() ? "no shipped tokenizer found (../shared/tokenizers, $COLIBRI_TOKENIZERS_DIR or npm ci in "
                             "tests/js/fallback)"
                           : nullptr;
}
