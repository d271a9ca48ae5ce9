// A GGUF file from a user: the reader, the hyperparameters the converter takes from it, and the tokenizer it rebuilds
// (which must then load and encode).
#include <vector>

#include "colibri/model/gguf.hpp"
#include "colibri/model/gguf_tokenizer.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "fuzz_common.hpp"
#include "model/architecture.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri;
  const auto path = fuzz::write_scratch("input.gguf", {reinterpret_cast<const char*>(data), size});
  auto gguf = model::GgufFile::open(path);
  if (!gguf) return 0;
  for (const auto& [key, value] : gguf->metadata()) {
    (void)gguf->get_int(key);
    (void)gguf->get_float(key);
    (void)gguf->get_string(key);
    (void)value.array_size();
  }
  std::vector<char> bytes(64);
  for (const auto& t : gguf->tensors()) {
    FUZZ_CHECK(t.offset >= gguf->data_offset(), t.name);
    if (t.size == 0) continue;
    const std::size_t n = t.size < bytes.size() ? static_cast<std::size_t>(t.size) : bytes.size();
    (void)gguf->read(t, 0, bytes.data(), n);
    (void)gguf->read(t, t.size - n, bytes.data(), n);
    FUZZ_CHECK(!gguf->read(t, t.size, bytes.data(), 1).is_ok(), "a read past a tensor's end succeeded: " + t.name);
  }
  (void)model::hparams_from_gguf(*gguf);
  if (auto rebuilt = model::rebuild_tokenizer_from_gguf(*gguf)) {
    if (auto tok = tokenizer::Tokenizer::from_json(rebuilt->tokenizer_json, "rebuilt")) {
      const auto ids = tok->encode("Hello world, 1234 éàü 日本語 <s>", true);
      (void)tok->decode(ids);
    }
  }
  return 0;
}
