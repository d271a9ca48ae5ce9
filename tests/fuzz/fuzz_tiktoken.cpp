// A tiktoken tokenizer's files from a checkpoint (untrusted): tiktoken.model, tokenizer_config.json and the tokenizer
// code, separated in the input by "\n--8<--\n". The import must refuse or give a tokenizer.json that loads; that
// tokenizer's ids stay in its vocabulary and decode to the text (every byte has a token).
#include <string>

#include "colibri/tokenizer/tiktoken.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri;
  fuzz::Input in(data, size);
  const std::string_view model = in.until("\n--8<--\n"), config = in.until("\n--8<--\n"), code = in.rest();
  const auto dir = fuzz::write_scratch("tiktoken.model", model).parent_path();
  fuzz::write_scratch("tokenizer_config.json", config);
  if (code.empty()) {
    std::error_code ec;
    std::filesystem::remove(dir / "tokenization_kimi.py", ec);
  } else {
    fuzz::write_scratch("tokenization_kimi.py", code);
  }
  auto imported = tokenizer::import_tiktoken(dir);
  if (!imported) return 0;
  auto tok = tokenizer::Tokenizer::from_json(imported->tokenizer_json, "imported");
  FUZZ_CHECK(tok.has_value(), "the imported tokenizer.json does not load: " + tok.error().message());
  const std::string text = "Hello world! 12345 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe4\xb8\xad  \n\tDON'T x'LL";
  const auto ids = tok->encode(text);
  for (const auto id : ids) {
    FUZZ_CHECK(id >= 0 && static_cast<std::size_t>(id) < tok->vocab_size(), "id " + std::to_string(id));
  }
  FUZZ_CHECK(tok->decode(ids) == text, fuzz::versus(tok->decode(ids), text));
  return 0;
}
