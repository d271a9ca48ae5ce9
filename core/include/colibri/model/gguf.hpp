// Reader for GGUF v2/v3 files: metadata of every value type (arrays included), tensor infos, alignment
// (general.alignment) and the data section. Headers are bounds-checked against the file size; tensor data is
// read on demand by range, never loaded whole. A split GGUF (llama-gguf-split's NAME-00001-of-00003.gguf) opens
// from any of its parts as one file: metadata from the first part, tensors from all.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::model {

enum class GgufType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

const char* to_string(GgufType t) noexcept;

struct GgufValue {
  GgufType type = GgufType::u32;
  GgufType elem_type = GgufType::u32;  // arrays only
  // Scalars: integers in int64 (u64 stored bit-cast), floats in double. Arrays: typed vectors; arrays of arrays
  // in `nested`.
  std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>, std::vector<double>,
               std::vector<std::string>, std::vector<bool>, std::vector<GgufValue>>
      v = std::int64_t{0};

  [[nodiscard]] bool is_integer() const noexcept;
  [[nodiscard]] bool is_float() const noexcept { return type == GgufType::f32 || type == GgufType::f64; }
  [[nodiscard]] bool is_array() const noexcept { return type == GgufType::array; }
  [[nodiscard]] std::size_t array_size() const noexcept;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<std::int64_t> ne;  // GGML order: ne[0] is the row length (innermost)
  sdk::DType type = sdk::DType::f32;
  std::uint64_t offset = 0;  // absolute byte offset in its part's file
  std::uint64_t size = 0;    // bytes
  std::uint32_t part = 0;    // index into parts(): 0 unless the GGUF is split
};

class GgufFile {
 public:
  static sdk::Expected<GgufFile> open(const std::filesystem::path& path);

  // The file given, or a split GGUF's first part.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  // Every file the tensors are in, in order: {path()} unless the GGUF is split.
  [[nodiscard]] const std::vector<std::filesystem::path>& parts() const noexcept { return parts_; }
  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return data_offset_; }
  [[nodiscard]] const std::map<std::string, GgufValue>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] const std::vector<GgufTensorInfo>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const GgufValue* find(const std::string& key) const;
  [[nodiscard]] const GgufTensorInfo* find_tensor(const std::string& name) const;

  // Typed metadata look-ups; nullopt when absent or of another type (integers convert between widths).
  [[nodiscard]] std::optional<std::int64_t> get_int(const std::string& key) const;
  [[nodiscard]] std::optional<double> get_float(const std::string& key) const;  // ints convert too
  [[nodiscard]] std::optional<bool> get_bool(const std::string& key) const;
  [[nodiscard]] std::optional<std::string> get_string(const std::string& key) const;

  sdk::Status read(const GgufTensorInfo& t, std::uint64_t offset, void* dst, std::size_t n) const;

 private:
  struct Impl;
  static sdk::Expected<GgufFile> open_one(const std::filesystem::path& path);
  static sdk::Expected<GgufFile> join_parts(GgufFile given);

  std::filesystem::path path_;
  std::vector<std::filesystem::path> parts_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace colibri::model
