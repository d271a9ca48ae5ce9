// colibri-cli convert: a HuggingFace checkpoint directory or a GGUF file into a colibri model directory
// (DESIGN.md "Model on disk"). Streams one tensor at a time (in row chunks), so peak memory stays bounded
// whatever the model size, and publishes crash-safe: everything is written into a hidden sibling directory,
// fsynced, the manifest last, then renamed into place.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::model {

struct ConvertOptions {
  std::filesystem::path input;   // HF checkpoint directory, or a .gguf file
  std::filesystem::path output;  // the model directory to create
  std::string preset = "f16";    // f32 f16 bf16 q8_0 q6_k q5_k_m q4_k_m q3_k_m q2_k
  bool split_experts = true;     // one file per expert; false packs each layer's experts into experts/L007.bin
  int threads = 0;               // 0: hardware concurrency
  bool force = false;            // replace an existing output (only once the new model is complete)
  // Hears (bytes done, bytes total) after each chunk; may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
  // Asked after each chunk; true stops the conversion (a `cancelled` error; nothing is left behind). May be empty.
  std::function<bool()> stop;
};

struct ConvertFallback {
  std::string tensor;
  std::string wanted;
  std::string used;
  std::string reason;
};

struct ConvertSummary {
  std::string architecture;
  std::size_t files = 0;
  std::uint64_t resident_bytes = 0;
  std::uint64_t expert_bytes = 0;
  std::size_t experts = 0;
  std::uint64_t bytes_per_expert = 0;  // largest routed expert blob
  std::uint64_t bytes_written = 0;
  double seconds = 0;
  std::vector<ConvertFallback> fallbacks;
  std::vector<std::string> warnings;
};

// The presets convert accepts.
std::vector<std::string> convert_presets();

sdk::Expected<ConvertSummary> convert_model(const ConvertOptions& options);

}  // namespace colibri::model
