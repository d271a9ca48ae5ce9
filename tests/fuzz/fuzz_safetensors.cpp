// A safetensors checkpoint file from a user: its JSON header, offsets and ranged reads.
#include <vector>

#include "colibri/model/safetensors.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri;
  const auto path = fuzz::write_scratch("model.safetensors", {reinterpret_cast<const char*>(data), size});
  auto ckpt = model::SafetensorsCheckpoint::open(path);
  if (!ckpt) return 0;
  std::vector<char> bytes(64);
  for (const auto& [name, t] : ckpt->tensors()) {
    FUZZ_CHECK(t.file_index < ckpt->files().size(), name);
    FUZZ_CHECK(t.offset + t.size <= size, "a tensor reaches past the end of the file: " + name);
    if (t.size == 0) continue;
    const std::size_t n = t.size < bytes.size() ? static_cast<std::size_t>(t.size) : bytes.size();
    FUZZ_CHECK(ckpt->read(t, t.size - n, bytes.data(), n).is_ok(), "a read inside a tensor failed: " + name);
    FUZZ_CHECK(!ckpt->read(t, t.size, bytes.data(), 1).is_ok(), "a read past a tensor's end succeeded: " + name);
  }
  return 0;
}
