// Reader for HuggingFace safetensors checkpoints: one file or shards listed in model.safetensors.index.json.
// Only headers are parsed up front (bounds-checked); tensor data is read on demand by range.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::model {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;                // as written: "F32", "F16", "BF16", "I64", ...
  std::vector<std::int64_t> shape;  // row-major, outermost first
  std::uint64_t offset = 0;         // absolute byte offset in the file
  std::uint64_t size = 0;           // bytes
  std::size_t file_index = 0;       // index into SafetensorsCheckpoint::files()
};

// Element size of a safetensors dtype name; 0 when unknown.
std::size_t safetensors_dtype_size(const std::string& dtype) noexcept;

class SafetensorsCheckpoint {
 public:
  // `dir` holds model.safetensors or model.safetensors.index.json (+ shards); a single .safetensors file
  // path works too.
  static sdk::Expected<SafetensorsCheckpoint> open(const std::filesystem::path& dir_or_file);

  [[nodiscard]] const std::vector<std::filesystem::path>& files() const noexcept { return files_; }
  [[nodiscard]] const std::map<std::string, SafetensorsTensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const SafetensorsTensor* find(const std::string& name) const;

  // Reads `n` bytes at `offset` within the tensor's data.
  sdk::Status read(const SafetensorsTensor& t, std::uint64_t offset, void* dst, std::size_t n) const;

 private:
  struct Shard;
  std::vector<std::filesystem::path> files_;
  std::vector<std::shared_ptr<Shard>> shards_;
  std::map<std::string, SafetensorsTensor> tensors_;
};

}  // namespace colibri::model
