// The JSON files a model brings: colibri's manifest.json (loaded as `run` and the server load it) and a HuggingFace
// config.json (read by the converter). The first byte picks which.
#include <nlohmann/json.hpp>

#include "colibri/model/manifest.hpp"
#include "fuzz_common.hpp"
#include "model/architecture.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri;
  fuzz::Input in(data, size);
  const bool manifest = in.byte() % 2 == 0;
  if (manifest) {
    const auto path = fuzz::write_scratch("manifest.json", in.rest());
    (void)model::load_manifest(path.parent_path());
    return 0;
  }
  const auto config = nlohmann::json::parse(in.rest(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  (void)model::hparams_from_hf_config(config, "config.json");
  return 0;
}
