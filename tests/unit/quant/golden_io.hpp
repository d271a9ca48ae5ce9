// Reader for the GGML golden vectors in tests/data/quant (format in its README.md).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace colibri::quant::testing {

inline std::string golden_dir() {
  return std::string(COLIBRI_TEST_SOURCE_DIR) + "/tests/data/quant";
}

class ByteReader {
 public:
  explicit ByteReader(const std::string& path) : path_(path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open golden file " + path);
    bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  void expect_magic(const char* magic) {
    if (take_bytes(4) != std::vector<std::uint8_t>(magic, magic + 4)) throw std::runtime_error(path_ + ": bad magic");
  }
  std::uint32_t u32() {
    std::uint32_t v;
    const auto b = take_bytes(4);
    std::memcpy(&v, b.data(), 4);
    return v;
  }
  std::vector<float> floats(std::size_t n) {
    const auto b = take_bytes(n * 4);
    std::vector<float> v(n);
    if (n) std::memcpy(v.data(), b.data(), n * 4);
    return v;
  }
  std::vector<std::uint8_t> take_bytes(std::size_t n) {
    if (pos_ + n > bytes_.size()) throw std::runtime_error(path_ + ": truncated");
    std::vector<std::uint8_t> v(bytes_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                bytes_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return v;
  }
  [[nodiscard]] bool at_end() const { return pos_ == bytes_.size(); }

 private:
  std::string path_;
  std::vector<std::uint8_t> bytes_;
  std::size_t pos_ = 0;
};

struct GoldenInput {
  std::string name;
  std::vector<float> values;
};

inline std::vector<GoldenInput> read_inputs() {
  ByteReader r(golden_dir() + "/inputs.bin");
  r.expect_magic("CQIN");
  if (r.u32() != 1) throw std::runtime_error("inputs.bin: unknown version");
  std::vector<GoldenInput> out(r.u32());
  for (auto& in : out) {
    const auto name = r.take_bytes(r.u32());
    in.name.assign(name.begin(), name.end());
    in.values = r.floats(r.u32());
  }
  return out;
}

struct GoldenEntry {
  std::uint32_t input_index = 0;        // into read_inputs(); unused for random blocks
  std::uint32_t n = 0;                  // elements
  std::vector<std::uint8_t> quantized;  // ggml's bytes
  std::vector<float> dequantized;       // ggml's dequantization of those bytes
};

struct GoldenType {
  std::uint32_t ggml_type = 0;
  std::vector<GoldenEntry> cases;          // quantize_row_*_ref + dequantize_row_* of an input
  std::vector<GoldenEntry> random_blocks;  // dequantize_row_* of random block bytes
};

inline GoldenType read_golden(const std::string& type_name) {
  ByteReader r(golden_dir() + "/" + type_name + ".bin");
  r.expect_magic("CQGV");
  if (r.u32() != 1) throw std::runtime_error(type_name + ".bin: unknown version");
  GoldenType g;
  g.ggml_type = r.u32();
  g.cases.resize(r.u32());
  for (auto& c : g.cases) {
    c.input_index = r.u32();
    c.n = r.u32();
    c.quantized = r.take_bytes(r.u32());
    c.dequantized = r.floats(c.n);
  }
  g.random_blocks.resize(r.u32());
  for (auto& c : g.random_blocks) {
    c.n = r.u32();
    c.quantized = r.take_bytes(r.u32());
    c.dequantized = r.floats(c.n);
  }
  if (!r.at_end()) throw std::runtime_error(type_name + ".bin: trailing bytes");
  return g;
}

}  // namespace colibri::quant::testing
