// A tokenizer.json from a model directory (untrusted): load it, then encode and decode a text through it.
#include <string>

#include "colibri/tokenizer/tokenizer.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri;
  auto tok = tokenizer::Tokenizer::from_json({reinterpret_cast<const char*>(data), size}, "tokenizer.json");
  if (!tok) return 0;
  for (const bool special : {false, true}) {
    const auto ids = tok->encode("Hello world! 12345 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac  \n\t<s></s>\xff", special);
    for (const auto id : ids) {
      FUZZ_CHECK(id >= 0 && static_cast<std::size_t>(id) < tok->vocab_size(), "id " + std::to_string(id));
    }
    const auto text = tok->decode(ids);
    tokenizer::StreamDecoder stream(*tok);
    std::string streamed;
    for (const auto id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    FUZZ_CHECK(streamed == text, "streamed decoding differs from decode()");
  }
  return 0;
}
