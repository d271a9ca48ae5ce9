#include "colibri/model/convert.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <stdio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "colibri/chat/template.hpp"
#include "colibri/engine/rope.hpp"
#include "colibri/model/gguf.hpp"
#include "colibri/model/gguf_tokenizer.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/model/safetensors.hpp"
#include "colibri/quant/float16.hpp"
#include "colibri/quant/preset.hpp"
#include "colibri/quant/quant.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/server/api.hpp"
#include "colibri/tokenizer/tiktoken.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "colibri/util/output_file.hpp"
#include "model/architecture.hpp"
#include "model/file_io.hpp"

namespace colibri::model {

namespace fs = std::filesystem;
using nlohmann::json;
using sdk::DType;
using sdk::Status;
using sdk::StatusCode;

std::vector<std::string> convert_presets() {
  std::vector<std::string> names;
  for (auto p : quant::all_presets()) names.emplace_back(quant::to_string(p));
  return names;
}

namespace {

// "3.4e+38", "inf": a value for a message.
std::string shortest(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(v));
  return b;
}

// ------------------------------------------------------------------------------------------------------------
// Input: where each planned tensor's bytes are.

struct SourceRef {
  DType type = DType::f32;
  std::uint64_t base = 0;  // byte offset of this tensor (or expert slice) within the source tensor
  std::uint64_t size = 0;
  std::int64_t rows = 0, cols = 0;
  std::int64_t permute_heads = 0;
  // Set for cuts (RowPick without transpose): the source row holding each row of this tensor; rows in `type`.
  std::function<std::int64_t(std::int64_t)> row_map;
  const SafetensorsTensor* st = nullptr;
  const GgufTensorInfo* gg = nullptr;
  std::string name;  // source name for messages
  // Set for parts cut out of fused tensors (gpt-oss experts): produces f32 rows [row0, row0 + n) of the part.
  // Rows in `type` (f32, or mxfp4 for HF MXFP4 experts).
  std::function<Status(std::int64_t row0, std::int64_t n, void* dst)> gather;
  std::vector<std::string> also_read;               // further input tensors the gather reads (MXFP4 scales)
  ValueTransform transform = ValueTransform::none;  // applied to the decoded values (HF Qwen3-Next's norms, A_log)
  // Set for columns taken from other columns (Qwen3.5's value heads): the source column of each column.
  std::function<std::int64_t(std::int64_t)> col_map;
};

struct Input {
  bool is_gguf = false;
  fs::path path;
  std::optional<SafetensorsCheckpoint> st;
  std::optional<GgufFile> gguf;
  std::optional<tokenizer::TiktokenImport> tiktoken;  // a checkpoint with a tiktoken file and no tokenizer.json
  json config;

  Status read(const SourceRef& r, std::uint64_t offset, void* dst, std::size_t n) const {
    if (r.gather) {  // callers read whole rows
      const std::uint64_t row = sdk::row_bytes(r.type, r.cols);
      return r.gather(static_cast<std::int64_t>(offset / row), static_cast<std::int64_t>(n / row), dst);
    }
    if (r.st != nullptr) return st->read(*r.st, r.base + offset, dst, n);
    return gguf->read(*r.gg, r.base + offset, dst, n);
  }
};

std::uint64_t elements(const std::vector<std::int64_t>& s) {
  std::uint64_t n = 1;
  for (auto d : s) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Status bad_source_shape(const Input& in, const SafetensorsTensor& t, const std::vector<std::int64_t>& want) {
  return Status(StatusCode::invalid_argument, in.st->files()[t.file_index].string() + ": tensor '" + t.name +
                                                  "' has shape " + shape_text(t.shape) + " but config.json implies " +
                                                  shape_text(want));
}

// MXFP4 (OCP microscaling FP4, how openai/gpt-oss ships its experts) as HF stores it: 16 bytes of e2m1 codes per 32
// values, element 2k in the low nibble of byte k and 2k+1 in the high one, and a separate e8m0 scale byte per block.
// GGML's block (colibri's mxfp4) is the scale byte, then qs[j] = code(j) | code(j + 16) << 4: the same codes and
// scale, so the weights stay bit-exact.
void repack_hf_mxfp4_row(const std::uint8_t* blocks, const std::uint8_t* scales, std::int64_t n_blocks,
                         std::uint8_t* out) {
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::uint8_t* in = blocks + b * 16;
    auto code = [in](int i) { return (in[i / 2] >> (4 * (i % 2))) & 0x0F; };
    std::uint8_t* blk = out + b * 17;
    blk[0] = scales[b];
    for (int j = 0; j < 16; ++j) blk[1 + j] = static_cast<std::uint8_t>(code(j) | code(j + 16) << 4);
  }
}

// A gpt-oss expert part (see PlannedTensor::hf_expert). Weights come as bf16 gate_up_proj [E, D, 2F] / down_proj
// [E, F, D] (input-major: the part is transposed, gate and up interleaved) or as MXFP4 *_blocks [E, rows, D/32, 16]
// + *_scales [E, rows, D/32] (output-major); biases as [E, 2F] (interleaved) / [E, D].
sdk::Expected<SourceRef> locate_hf_fused(const Input& in, const PlannedTensor& p) {
  const std::int64_t e = p.hf_expert, part = p.hf_fused_part;
  const std::int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1, cols = p.shape.back();
  // Output o of the part is the source's output o * stride + first: gpt-oss interleaves gate and up (even, odd),
  // Llama 4 puts them in halves.
  const bool halves = p.hf_fused_halves && part >= 0;
  const std::int64_t stride = part >= 0 && !halves ? 2 : 1;
  const std::int64_t first = halves ? part * (p.shape.size() == 2 ? rows : cols) : part >= 0 ? part : 0;
  const std::int64_t parts = part >= 0 ? 2 : 1;  // the source's outputs: parts x rows
  SourceRef r;
  r.type = DType::f32;
  r.rows = rows;
  r.cols = cols;
  r.size = static_cast<std::uint64_t>(rows * cols) * sizeof(float);
  const SafetensorsTensor* t = in.st->find(p.hf_name);
  const SafetensorsTensor* blocks = t == nullptr ? in.st->find(p.hf_name + "_blocks") : nullptr;
  const SafetensorsTensor* scales = t == nullptr ? in.st->find(p.hf_name + "_scales") : nullptr;
  if (blocks != nullptr && scales != nullptr && p.shape.size() == 2) {
    const std::int64_t n_blocks = cols / 32, src_rows = rows * parts;
    const std::int64_t n_experts = blocks->shape.empty() ? 0 : blocks->shape[0];
    if (cols % 32 != 0 || blocks->dtype != "U8" || scales->dtype != "U8" ||
        blocks->shape != std::vector<std::int64_t>{n_experts, src_rows, n_blocks, 16} ||
        scales->shape != std::vector<std::int64_t>{n_experts, src_rows, n_blocks} || e >= n_experts) {
      return Status(StatusCode::invalid_argument,
                    in.st->files()[blocks->file_index].string() + ": MXFP4 tensors '" + blocks->name + "' " +
                        shape_text(blocks->shape) + " " + blocks->dtype + " and '" + scales->name + "' " +
                        shape_text(scales->shape) + " " + scales->dtype +
                        " do not fit config.json, which implies U8 [E, " + std::to_string(src_rows) + ", " +
                        std::to_string(n_blocks) + ", 16] and [E, " + std::to_string(src_rows) + ", " +
                        std::to_string(n_blocks) + "]");
    }
    r.name = blocks->name;
    r.also_read = {scales->name};
    r.type = DType::mxfp4;
    r.size = static_cast<std::uint64_t>(rows) * sdk::row_bytes(DType::mxfp4, cols);
    r.gather = [&in, blocks, scales, e, src_rows, n_blocks, stride, first](std::int64_t row0, std::int64_t n,
                                                                           void* dst) -> Status {
      std::vector<std::uint8_t> b(static_cast<std::size_t>(n_blocks * 16)), s(static_cast<std::size_t>(n_blocks));
      auto* out = static_cast<std::uint8_t*>(dst);
      for (std::int64_t i = 0; i < n; ++i) {
        const auto src = static_cast<std::uint64_t>(e * src_rows + (row0 + i) * stride + first);
        if (auto st = in.st->read(*blocks, src * b.size(), b.data(), b.size()); !st) return st;
        if (auto st = in.st->read(*scales, src * s.size(), s.data(), s.size()); !st) return st;
        repack_hf_mxfp4_row(b.data(), s.data(), n_blocks, out + i * n_blocks * 17);
      }
      return {};
    };
    return r;
  }
  if (t == nullptr && (blocks != nullptr) != (scales != nullptr)) {
    return Status(StatusCode::not_found, "the checkpoint " + in.path.string() + " has '" + p.hf_name +
                                             (blocks != nullptr ? "_blocks' but not '" + p.hf_name + "_scales'"
                                                                : "_scales' but not '" + p.hf_name + "_blocks'") +
                                             " (MXFP4 needs both); the download is incomplete");
  }
  if (t == nullptr) {
    return Status(StatusCode::not_found, "tensor '" + p.hf_name + "' (or MXFP4 '" + p.hf_name + "_blocks' and '" +
                                             p.hf_name + "_scales', needed by " + (in.path / "config.json").string() +
                                             ") is missing from the checkpoint " + in.path.string());
  }
  DType type = DType::f32;
  if (t->dtype == "F16") {
    type = DType::f16;
  } else if (t->dtype == "BF16") {
    type = DType::bf16;
  } else if (t->dtype != "F32") {
    return Status(StatusCode::unsupported, in.st->files()[t->file_index].string() + ": tensor '" + p.hf_name +
                                               "' has dtype " + t->dtype +
                                               "; colibri converts F32, F16 and BF16 weights (and MXFP4 experts)");
  }
  const std::int64_t n_experts = t->shape.empty() ? 0 : t->shape[0];
  if (p.hf_fused_output_major && p.shape.size() == 2 && (halves || part < 0)) {
    // Qwen3.5: expert e's part is rows [first, first + rows) of its [rows * parts, cols] slice, read as they are.
    const std::vector<std::int64_t> want{n_experts, rows * parts, cols};
    if (t->shape != want || e >= n_experts) return bad_source_shape(in, *t, want);
    const std::uint64_t row_bytes = sdk::row_bytes(type, cols);
    r.st = t;
    r.type = type;
    r.name = t->name;
    r.base = static_cast<std::uint64_t>(e * rows * parts + first) * row_bytes;
    r.size = static_cast<std::uint64_t>(rows) * row_bytes;
    return r;
  }
  // The source slice of expert e: [cols * parts] for a bias; [cols, rows * parts] for a weight (input-major).
  const std::vector<std::int64_t> want = p.shape.size() == 1 ? std::vector<std::int64_t>{n_experts, cols * parts}
                                                             : std::vector<std::int64_t>{n_experts, cols, rows * parts};
  if (t->shape != want || e >= n_experts) return bad_source_shape(in, *t, want);
  r.name = t->name;
  const std::uint64_t slice_elems =
      static_cast<std::uint64_t>(t->shape[1]) * static_cast<std::uint64_t>(t->shape.size() > 2 ? t->shape[2] : 1);
  // The whole slice is read once per part (a real gpt-oss expert: 2880 x 5760 bf16, 33 MB): its columns are the
  // part's rows, so reading row by row would read the slice once per row.
  auto slice = std::make_shared<std::vector<float>>();
  r.gather = [&in, t, type, e, slice_elems, slice, rows, cols, stride, first, parts, bias = p.shape.size() == 1](
                 std::int64_t row0, std::int64_t n, void* out) -> Status {
    auto* dst = static_cast<float*>(out);
    if (slice->empty()) {
      const std::size_t elem = sdk::row_bytes(type, 1);
      std::vector<char> raw(static_cast<std::size_t>(slice_elems) * elem);
      if (auto s = in.st->read(*t, static_cast<std::uint64_t>(e) * raw.size(), raw.data(), raw.size()); !s) return s;
      slice->resize(static_cast<std::size_t>(slice_elems));
      if (auto s = quant::dequantize_row(type, raw.data(), slice->data(), static_cast<std::int64_t>(slice_elems)); !s)
        return s;
    }
    const std::int64_t width = (bias ? cols : rows) * parts;  // the source row length
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t o = row0 + i;  // the part's row
      for (std::int64_t c = 0; c < cols; ++c) {
        dst[i * cols + c] = bias ? (*slice)[static_cast<std::size_t>(c * stride + first)]
                                 : (*slice)[static_cast<std::size_t>(c * width + o * stride + first)];
      }
    }
    if (row0 + n >= rows) std::vector<float>().swap(*slice);  // the last rows: free the slice
    return {};
  };
  return r;
}

// float8_e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities; S.1111.111 is NaN.
float e4m3_to_float(std::uint8_t b) {
  const int exp = (b >> 3) & 0xF, man = b & 7;
  float v = 0.0f;
  if (exp == 0xF && man == 7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man) / 8.0f, -6);
  } else {
    v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  }
  return (b & 0x80) != 0 ? -v : v;
}

// An FP8 weight: F8_E4M3 values and a multiplier per block beside them. DeepSeek V3, MiniMax-M2 and Qwen3's -FP8
// releases store NAME_scale_inv, one per block of config.json's quantization_config.weight_block_size (default
// 128 x 128); compressed-tensors' FP8 stores NAME_scale, one per row ([rows, 1]) or one for the tensor. Read as f32
// rows, value x its block's multiplier, and quantized to the preset like any f32.
sdk::Expected<SourceRef> locate_hf_fp8(const Input& in, const PlannedTensor& p, const SafetensorsTensor* t) {
  const std::string where = in.st->files()[t->file_index].string();
  if (t->shape != p.shape || p.shape.size() != 2) return bad_source_shape(in, *t, p.shape);
  const std::int64_t rows = p.shape[0], cols = p.shape[1];
  const SafetensorsTensor* sc = in.st->find(p.hf_name + "_scale_inv");
  std::int64_t block_rows = 128, block_cols = 128;
  std::vector<std::int64_t> want;
  if (sc != nullptr) {
    if (const auto& q = in.config.value("quantization_config", json::object()); q.is_object()) {
      if (q.contains("weight_block_size")) {
        const auto& b = q["weight_block_size"];
        constexpr std::int64_t kMaxBlock = 1 << 20;  // far above any release's 128; keeps the sizes below exact
        auto fits = [&](const json& x) {
          return x.is_number_integer() && x.get<std::int64_t>() >= 1 && x.get<std::int64_t>() <= kMaxBlock;
        };
        if (!b.is_array() || b.size() != 2 || !fits(b[0]) || !fits(b[1])) {
          return Status(StatusCode::invalid_argument,
                        (in.path / "config.json").string() + ": quantization_config.weight_block_size is " +
                            b.dump().substr(0, 40) + "; it must be two block sizes of 1 to 1048576");
        }
        block_rows = b[0].get<std::int64_t>();
        block_cols = b[1].get<std::int64_t>();
      }
    }
    want = {(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols};
  } else if ((sc = in.st->find(p.hf_name + "_scale")) != nullptr) {
    const std::uint64_t n = elements(sc->shape);
    if (n == 1) {  // one for the tensor
      block_rows = rows;
      block_cols = cols;
    } else {  // one per row
      block_rows = 1;
      block_cols = cols;
    }
    want = n == 1 ? sc->shape : std::vector<std::int64_t>{rows, 1};
  } else {
    return Status(StatusCode::unsupported, where + ": tensor '" + p.hf_name + "' is F8_E4M3 without '" + p.hf_name +
                                               "_scale_inv' (block scales) or '" + p.hf_name +
                                               "_scale' (compressed-tensors) beside it; the download is "
                                               "incomplete, or the checkpoint is of an FP8 layout colibri does not "
                                               "read");
  }
  if (sc->shape != want || (sc->dtype != "F32" && sc->dtype != "BF16" && sc->dtype != "F16")) {
    return Status(StatusCode::invalid_argument, in.st->files()[sc->file_index].string() + ": '" + sc->name + "' is " +
                                                    sc->dtype + " " + shape_text(sc->shape) + "; FP8 blocks of " +
                                                    std::to_string(block_rows) + " x " + std::to_string(block_cols) +
                                                    " over " + shape_text(t->shape) + " need F32, BF16 or F16 " +
                                                    shape_text(want));
  }
  SourceRef r;
  r.st = t;
  r.name = p.hf_name;
  r.type = DType::f32;
  r.rows = rows;
  r.cols = cols;
  r.size = static_cast<std::uint64_t>(rows * cols) * sizeof(float);
  r.also_read = {sc->name};
  r.gather = [&in, t, sc, cols, block_rows, block_cols](std::int64_t row0, std::int64_t n, void* dst) -> Status {
    const auto blocks = static_cast<std::size_t>((cols + block_cols - 1) / block_cols);
    std::vector<std::uint8_t> raw(static_cast<std::size_t>(cols));
    std::vector<float> scale(blocks);
    const std::size_t scale_bytes = sc->dtype == "F32" ? 4 : 2;  // BF16 and F16 widen to f32 exactly
    std::vector<std::uint16_t> narrow(scale_bytes == 2 ? blocks : 0);
    std::int64_t scale_row = -1;
    auto* out = static_cast<float*>(dst);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = row0 + i;
      if (row / block_rows != scale_row) {
        scale_row = row / block_rows;
        const std::uint64_t at = static_cast<std::uint64_t>(scale_row) * blocks * scale_bytes;
        if (narrow.empty()) {
          if (auto s = in.st->read(*sc, at, scale.data(), blocks * sizeof(float)); !s) return s;
        } else {
          if (auto s = in.st->read(*sc, at, narrow.data(), blocks * 2); !s) return s;
          for (std::size_t b = 0; b < blocks; ++b) {
            scale[b] = sc->dtype == "F16" ? quant::fp16_to_fp32(narrow[b]) : quant::bf16_to_fp32(narrow[b]);
          }
        }
      }
      if (auto s = in.st->read(*t, static_cast<std::uint64_t>(row * cols), raw.data(), raw.size()); !s) return s;
      for (std::int64_t c = 0; c < cols; ++c) {
        out[i * cols + c] =
            e4m3_to_float(raw[static_cast<std::size_t>(c)]) * scale[static_cast<std::size_t>(c / block_cols)];
      }
    }
    return {};
  };
  return r;
}

sdk::Expected<SourceRef> locate_hf_whole(const Input& in, const PlannedTensor& p);
sdk::Expected<SourceRef> locate_gguf_whole(const Input& in, const PlannedTensor& p);

// A RowPick's rows of the whole source tensor. A plain cut reads the source's rows as they are (a GGUF's quantized
// blocks stay as they were, FP8 is decoded as for any tensor); a transposed one decodes the source to f32 once.
sdk::Expected<SourceRef> locate_cut(const Input& in, const PlannedTensor& p, const RowPick& pick, bool gguf) {
  PlannedTensor whole = p;
  whole.hf_pick = whole.gguf_pick = RowPick{};
  const std::int64_t rows = p.shape[0], cols = p.shape[1];
  const std::int64_t src_cols = pick.transpose ? rows / pick.blocks : cols;
  whole.shape = {pick.blocks * pick.block, src_cols};
  auto base = gguf ? locate_gguf_whole(in, whole) : locate_hf_whole(in, whole);
  if (!base) return base.error();
  SourceRef r = *base;
  if (!pick.transpose) {
    r.rows = rows;
    r.size = sdk::row_bytes(r.type, cols) * static_cast<std::uint64_t>(rows);
    r.row_map = [pick](std::int64_t row) { return row / pick.count * pick.block + pick.first + row % pick.count; };
    return r;
  }
  // [blocks * src_cols, count]: row b * src_cols + c holds column c of block b's cut rows.
  r.type = DType::f32;
  r.rows = rows;
  r.cols = cols;
  r.size = static_cast<std::uint64_t>(rows * cols) * sizeof(float);
  r.permute_heads = 0;
  auto whole_f32 = std::make_shared<std::vector<float>>();
  r.gather = [&in, src = *base, pick, src_cols, rows, cols, whole_f32](std::int64_t row0, std::int64_t n,
                                                                       void* dst) -> Status {
    if (whole_f32->empty()) {
      const std::size_t row_bytes = sdk::row_bytes(src.type, src.cols);
      std::vector<char> raw(row_bytes);
      whole_f32->resize(static_cast<std::size_t>(src.rows * src.cols));
      for (std::int64_t i = 0; i < src.rows; ++i) {
        if (auto s = in.read(src, static_cast<std::uint64_t>(i) * row_bytes, raw.data(), row_bytes); !s) return s;
        if (auto s = quant::dequantize_row(src.type, raw.data(), whole_f32->data() + i * src.cols, src.cols); !s)
          return s;
      }
    }
    auto* out = static_cast<float*>(dst);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t b = (row0 + i) / src_cols, c = (row0 + i) % src_cols;
      for (std::int64_t j = 0; j < cols; ++j) {
        out[i * cols + j] = (*whole_f32)[static_cast<std::size_t>((b * pick.block + pick.first + j) * src_cols + c)];
      }
    }
    if (row0 + n >= rows) std::vector<float>().swap(*whole_f32);  // the last rows: free it
    return {};
  };
  return r;
}

sdk::Expected<SourceRef> locate_hf(const Input& in, const PlannedTensor& p) {
  auto r = p.hf_pick.blocks > 0 ? locate_cut(in, p, p.hf_pick, false) : locate_hf_whole(in, p);
  if (!r) return r;
  r->transform = p.hf_transform;
  if (const HeadTiling tiling = p.hf_tiling; tiling.groups > 0) {
    if (tiling.columns) {
      r->col_map = [tiling](std::int64_t c) { return tiling.source(c); };
    } else {
      r->row_map = [tiling, rows = r->row_map](std::int64_t row) {
        return rows ? rows(tiling.source(row)) : tiling.source(row);
      };
    }
  }
  return r;
}

sdk::Expected<SourceRef> locate_gguf(const Input& in, const PlannedTensor& p) {
  if (p.gguf_pick.blocks > 0) return locate_cut(in, p, p.gguf_pick, true);
  return locate_gguf_whole(in, p);
}

sdk::Expected<SourceRef> locate_hf_whole(const Input& in, const PlannedTensor& p) {
  if (p.hf_expert >= 0) return locate_hf_fused(in, p);
  const auto* t = in.st->find(p.hf_name);
  if (t == nullptr) {
    return Status(StatusCode::not_found, "tensor '" + p.hf_name + "' (needed by " + (in.path / "config.json").string() +
                                             ") is missing from the checkpoint " + in.path.string());
  }
  if (t->dtype == "F8_E4M3") return locate_hf_fp8(in, p, t);
  SourceRef r;
  r.st = t;
  r.name = p.hf_name;
  if (t->dtype == "F32") {
    r.type = DType::f32;
  } else if (t->dtype == "F16") {
    r.type = DType::f16;
  } else if (t->dtype == "BF16") {
    r.type = DType::bf16;
  } else {
    return Status(StatusCode::unsupported,
                  in.st->files()[t->file_index].string() + ": tensor '" + p.hf_name + "' has dtype " + t->dtype +
                      "; colibri converts F32, F16, BF16 and F8_E4M3 (with its scales) weights");
  }
  // ERNIE stores its selection bias as [1, E], Qwen3-Next its convolution as [C, 1, K]: the same values as the [E]
  // and [C, K] planned.
  const auto without_units = [](const std::vector<std::int64_t>& shape) {
    std::vector<std::int64_t> kept;
    std::copy_if(shape.begin(), shape.end(), std::back_inserter(kept), [](std::int64_t d) { return d != 1; });
    return kept;
  };
  const bool squeezed = t->shape.size() > p.shape.size() && without_units(t->shape) == without_units(p.shape) &&
                        t->shape.back() == p.shape.back();
  if (t->shape != p.shape && !squeezed) return bad_source_shape(in, *t, p.shape);
  r.size = t->size;
  r.cols = p.shape.back();
  r.rows = static_cast<std::int64_t>(elements(p.shape) / static_cast<std::uint64_t>(r.cols));
  return r;
}

sdk::Expected<SourceRef> locate_gguf_whole(const Input& in, const PlannedTensor& p) {
  const GgufFile& g = *in.gguf;
  const GgufTensorInfo* t = g.find_tensor(p.gguf_name);
  std::int64_t slice = p.gguf_expert;
  if (t == nullptr && !p.gguf_alt_name.empty()) {
    t = g.find_tensor(p.gguf_alt_name);
    slice = -1;
  }
  if (t == nullptr) {
    return Status(StatusCode::not_found,
                  g.path().string() + ": tensor '" + p.gguf_name + "' (needed by its metadata) is missing");
  }
  SourceRef r;
  r.gg = t;
  r.type = t->type;
  r.name = t->name;
  r.permute_heads = p.gguf_permute_heads;
  std::vector<std::int64_t> shape(t->ne.rbegin(), t->ne.rend());
  if (slice >= 0) {
    if (shape.size() != p.shape.size() + 1 || shape[0] <= slice) {
      return Status(StatusCode::invalid_argument, g.path().string() + ": tensor '" + t->name + "' has shape " +
                                                      shape_text(shape) + ", which holds no expert " +
                                                      std::to_string(slice));
    }
    shape.erase(shape.begin());
    r.size = t->size / static_cast<std::uint64_t>(t->ne.back());
    r.base = r.size * static_cast<std::uint64_t>(slice);
  } else {
    r.size = t->size;
  }
  // GGUF may drop or add unit dimensions (the shared-expert gate); the row length and element count must agree.
  if (shape.back() != p.shape.back() || elements(shape) != elements(p.shape)) {
    return Status(StatusCode::invalid_argument, g.path().string() + ": tensor '" + t->name + "' has shape " +
                                                    shape_text(shape) + " but the metadata implies " +
                                                    shape_text(p.shape));
  }
  r.cols = p.shape.back();
  r.rows = static_cast<std::int64_t>(elements(p.shape) / static_cast<std::uint64_t>(r.cols));
  if (r.permute_heads > 0 && r.rows % (2 * r.permute_heads) != 0) {
    return Status(StatusCode::invalid_argument, g.path().string() + ": tensor '" + t->name + "' has " +
                                                    std::to_string(r.rows) + " rows, not divisible into " +
                                                    std::to_string(r.permute_heads) + " rope heads");
  }
  return r;
}

// ------------------------------------------------------------------------------------------------------------
// Target type per tensor: the preset's choice, with llama.cpp-style fallbacks for rows that do not fill blocks.

struct TypeChoice {
  DType type;
  std::optional<ConvertFallback> fallback;
};

// The preset's view of a planned tensor (quant/preset.hpp holds llama.cpp's mixing rules).
quant::TensorRole preset_role(const PlannedTensor& p) {
  using R = quant::TensorRole;
  const auto has = [&](const char* part) { return p.name.find(part) != std::string::npos; };
  switch (p.kind) {
    case TensorKind::embedding: return R::token_embd;
    case TensorKind::output: return R::output;
    case TensorKind::norm: return has("attn_q_norm") ? R::attn_q_norm : has("attn_k_norm") ? R::attn_k_norm : R::norm;
    case TensorKind::attn_q: return R::attn_q;
    case TensorKind::attn_k: return R::attn_k;
    case TensorKind::attn_v: return R::attn_v;
    case TensorKind::attn_o: return R::attn_output;
    case TensorKind::bias: return R::bias;
    case TensorKind::router: return R::ffn_gate_inp;
    case TensorKind::shared_expert_gate: return R::ffn_gate_inp_shexp;
    case TensorKind::shared_expert:
      return has("down") ? R::ffn_down_shexp : has("up") ? R::ffn_up_shexp : R::ffn_gate_shexp;
    case TensorKind::expert_gate: return R::ffn_gate;
    case TensorKind::expert_up: return R::ffn_up;
    case TensorKind::expert_down: return R::ffn_down;
  }
  return R::norm;
}

sdk::Expected<TypeChoice> choose_target(const std::string& preset_name, const PlannedTensor& p, const SourceRef& src,
                                        const HyperParams& hp) {
  const auto preset = quant::parse_preset(preset_name);
  if (!preset) {
    return Status(StatusCode::invalid_argument,
                  "unknown preset '" + preset_name + "'; choose one of " + quant::preset_names());
  }
  const auto* st = sdk::dtype_traits(src.type);
  // Refused while planning, before any output is written (GGUF also has i8..i64 and f64 tensors).
  if (st != nullptr && !st->quantized && src.type != DType::f32 && src.type != DType::f16 && src.type != DType::bf16) {
    return Status(StatusCode::unsupported, "tensor '" + src.name + "' is stored as " + std::string(st->name) +
                                               ", which colibri cannot convert; weights must be f32, f16, bf16 or "
                                               "a supported block type (q8_0, q4_0, q2_k..q6_k)");
  }
  if (p.shape.size() == 1) return TypeChoice{DType::f32, std::nullopt};  // vectors stay f32, as llama.cpp keeps them
  const bool quantized = st != nullptr && st->quantized;
  if (quantized && !quant::can_dequantize(src.type)) {
    return Status(StatusCode::unsupported, "tensor '" + src.name + "' is stored as " + std::string(st->name) +
                                               ", which colibri cannot run or convert; use a GGUF with f16, bf16, "
                                               "q8_0, q4_0, q2_k..q6_k (or q4_1, q5_0, q5_1, iq4_nl) tensors");
  }
  // llama.cpp's fallbacks for rows k-quants do not fit (q5_0, q5_1, iq4_nl) and q4_1: read, and re-quantized to
  // the preset's type for the row, since colibri's backends do not run them.
  const bool read_only = quantized && !quant::is_supported(src.type);
  quant::ModelShape shape;
  shape.n_layers = static_cast<int>(hp.num_layers);
  shape.n_experts = hp.dense ? 0 : static_cast<int>(hp.n_experts);
  shape.n_head = static_cast<int>(hp.num_heads);
  shape.n_head_kv = static_cast<int>(hp.num_kv_heads);
  shape.tied_embeddings = hp.tie_word_embeddings;
  quant::TensorDesc desc;
  desc.role = preset_role(p);
  desc.layer = static_cast<int>(p.layer);
  desc.row_elems = src.cols;
  auto c = quant::choose_type(*preset, shape, desc);
  if (!c) return c.error().with_context("choosing the type of '" + p.name + "'");
  if (read_only) {
    return TypeChoice{
        c->type, ConvertFallback{p.name, std::string(sdk::to_string(src.type)), std::string(sdk::to_string(c->type)),
                                 "stored as " + std::string(st->name) +
                                     " in the input, which colibri does not run: dequantized and re-quantized" +
                                     (c->fallback ? " (" + c->reason + ")" : "")}};
  }
  if (quantized) {
    // Already quantized: copied, never re-quantized (that would only lose more); listed when the preset wanted
    // another type, so the summary and the manifest say what the model really holds.
    if (c->type == src.type) return TypeChoice{src.type, std::nullopt};
    return TypeChoice{
        src.type, ConvertFallback{p.name, std::string(sdk::to_string(c->type)), std::string(sdk::to_string(src.type)),
                                  "already quantized in the input: copied, not re-quantized"}};
  }
  if (!c->fallback) return TypeChoice{c->type, std::nullopt};
  return TypeChoice{c->type, ConvertFallback{p.name, std::string(sdk::to_string(c->preset_type)),
                                             std::string(sdk::to_string(c->type)), c->reason}};
}

// ------------------------------------------------------------------------------------------------------------
// Output files.

class OutFile {
 public:
  static sdk::Expected<std::unique_ptr<OutFile>> create(const fs::path& path) {
    auto f = io::File::create(path);
    if (!f) return f.error();
    auto o = std::make_unique<OutFile>();
    o->file_ = std::move(*f);
    o->state_ = XXH64_createState();
    XXH64_reset(o->state_, 0);
    return o;
  }
  ~OutFile() {
    if (state_) XXH64_freeState(state_);
  }
  Status write(const void* p, std::size_t n) {
    XXH64_update(state_, p, n);
    pos_ += n;
    return file_.write_all(p, n);
  }
  Status pad_to(std::uint64_t align) {
    static const std::vector<char> zeros(kBlobAlignment, 0);
    std::uint64_t pad = (align - pos_ % align) % align;
    while (pad > 0) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(pad, zeros.size()));
      if (auto s = write(zeros.data(), n); !s) return s;
      pad -= n;
    }
    return {};
  }
  [[nodiscard]] std::uint64_t pos() const { return pos_; }
  // fsync + close; returns the file's xxHash64.
  sdk::Expected<std::uint64_t> finish() {
    if (auto s = file_.sync(); !s) return s;
    if (auto s = file_.close(); !s) return s;
    return static_cast<std::uint64_t>(XXH64_digest(state_));
  }

 private:
  io::File file_;
  XXH64_state_t* state_ = nullptr;
  std::uint64_t pos_ = 0;
};

struct Progress {
  std::uint64_t done = 0, total = 0;
  const std::function<void(std::uint64_t, std::uint64_t)>* cb = nullptr;
  const std::function<bool()>* stop = nullptr;
  // Counts n bytes written; an error once the caller asked to stop.
  Status add(std::uint64_t n) {
    done += n;
    if (cb != nullptr && *cb) (*cb)(done, total);
    if (stop != nullptr && *stop && (*stop)()) {
      return Status(StatusCode::cancelled, "conversion interrupted; nothing was written to the output");
    }
    return {};
  }
};

// Runs fn(begin, end) over [0, n) split across up to `threads` threads.
void parallel_rows(std::int64_t n, int threads, const std::function<void(std::int64_t, std::int64_t)>& fn) {
  int t = static_cast<int>(std::min<std::int64_t>(threads, n));
  if (t <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  std::int64_t per = (n + t - 1) / t;
  for (int i = 0; i < t; ++i) {
    std::int64_t b = i * per, e = std::min(n, b + per);
    if (b >= e) break;
    pool.emplace_back(fn, b, e);
  }
  for (auto& th : pool) th.join();
}

// Source row index holding destination row `r` (undoes llama.cpp's rope permutation of Q/K rows).
std::int64_t source_row(std::int64_t r, std::int64_t rows, std::int64_t heads) {
  if (heads <= 0) return r;
  const std::int64_t hd = rows / heads, half = hd / 2;
  const std::int64_t h = r / hd, within = r % hd, i = within / half, j = within % half;
  return h * hd + 2 * j + i;
}

// Streams one tensor from the input into `out` in `target` type; fills the entry's offset, size, checksum.
Status write_tensor(const Input& in, const SourceRef& src, DType target, OutFile& out, int threads, Progress& progress,
                    TensorEntry& entry) {
  const std::size_t src_row = sdk::row_bytes(src.type, src.cols);
  const std::size_t dst_row = sdk::row_bytes(target, src.cols);
  if (src_row == 0 || dst_row == 0) {
    return Status(StatusCode::internal, "tensor '" + src.name + "': rows do not fit the block size");
  }
  entry.offset = out.pos();
  entry.type = target;
  entry.size = dst_row * static_cast<std::uint64_t>(src.rows);
  XXH64_state_t* state = XXH64_createState();
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> guard(state, &XXH64_freeState);
  XXH64_reset(state, 0);
  // Chunks of ~8 MiB of float rows per thread bound memory whatever the tensor size.
  const std::int64_t per_thread = std::max<std::int64_t>(1, (8 << 20) / (src.cols * 4));
  const std::int64_t chunk_rows = std::min<std::int64_t>(src.rows, per_thread * std::max(1, threads));
  std::vector<char> in_buf(src_row * static_cast<std::size_t>(chunk_rows));
  const bool transform = src.transform != ValueTransform::none || src.col_map;
  std::vector<char> out_buf(src.type == target && !transform ? 0 : dst_row * static_cast<std::size_t>(chunk_rows));
  // Tensors copied as they are (floats, and a GGUF's quantized blocks) are still decoded once for non-finite values:
  // a damaged block scale would otherwise reach the model as NaN logits. The SIMD dequantizers outrun the disk.
  const bool check_copy = src.type == target && !transform;
  // The largest magnitude the target holds: f16's largest value; block types store f16 scales of about amax / 127
  // (q8_0) down to amax / 945 (q4_k), so 2^20 keeps every scale finite. A copy only has to be finite.
  const float limit = target == DType::f16 && !check_copy                           ? 65504.0f
                      : check_copy || target == DType::f32 || target == DType::bf16 ? std::numeric_limits<float>::max()
                                                                                    : 1048576.0f;
  std::vector<float> scratch(
      src.type == target && !check_copy && !transform ? 0 : static_cast<std::size_t>(src.cols * chunk_rows));
  for (std::int64_t r0 = 0; r0 < src.rows; r0 += chunk_rows) {
    const std::int64_t n = std::min(chunk_rows, src.rows - r0);
    if (src.permute_heads > 0 || src.row_map) {
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t sr = src.row_map ? src.row_map(r0 + r) : source_row(r0 + r, src.rows, src.permute_heads);
        if (auto s = in.read(src, static_cast<std::uint64_t>(sr) * src_row, in_buf.data() + r * src_row, src_row); !s)
          return s;
      }
    } else {
      if (auto s = in.read(src, static_cast<std::uint64_t>(r0) * src_row, in_buf.data(), src_row * n); !s) return s;
    }
    const char* result = in_buf.data();
    if (src.type != target || check_copy || transform) {
      std::atomic<bool> failed{false};
      std::string error;
      std::mutex error_mutex;
      parallel_rows(n, threads, [&](std::int64_t b, std::int64_t e) {
        std::vector<float> row;  // col_map's source row, reused for this task's rows
        for (std::int64_t r = b; r < e; ++r) {
          float* f = scratch.data() + r * src.cols;
          Status s = quant::dequantize_row(src.type, in_buf.data() + r * src_row, f, src.cols);
          if (s && src.col_map) {
            row.assign(f, f + src.cols);
            for (std::int64_t i = 0; i < src.cols; ++i) f[i] = row[static_cast<std::size_t>(src.col_map(i))];
          }
          if (s && src.transform == ValueTransform::add_one) {
            for (std::int64_t i = 0; i < src.cols; ++i) f[i] = 1.0f + f[i];
          } else if (s && src.transform == ValueTransform::neg_exp) {
            // In double, rounded once: the f32 value nearest -exp(A_log), as a GGUF converted from it holds it.
            for (std::int64_t i = 0; i < src.cols; ++i) f[i] = static_cast<float>(-std::exp(static_cast<double>(f[i])));
          }
          // A non-finite weight, or one past what the target's f16 values or block scales hold, would quantize into
          // inf (NaN logits at run): refuse it here, by place. Real weights are orders of magnitude smaller.
          if (s) {
            const auto bad = std::find_if_not(f, f + src.cols, [&](float v) { return std::abs(v) <= limit; });
            if (bad != f + src.cols) {
              s = Status(StatusCode::corrupt_data,
                         "row " + std::to_string(r0 + r) + ", column " + std::to_string(bad - f) + " holds " +
                             shortest(*bad) +
                             (std::isfinite(*bad) ? "; " + std::string(sdk::to_string(target)) +
                                                        " cannot hold it (convert to f32 or bf16 if the weight is real)"
                                                  : "; the checkpoint is damaged (weights must be finite)"));
            }
          }
          if (s && !check_copy) s = quant::quantize_row(target, f, out_buf.data() + r * dst_row, src.cols);
          if (!s) {
            std::lock_guard<std::mutex> lock(error_mutex);
            failed = true;
            error = s.to_string();
            return;
          }
        }
      });
      if (failed) return Status(StatusCode::corrupt_data, "converting tensor '" + src.name + "': " + error);
      if (!check_copy) result = out_buf.data();
    }
    const std::size_t bytes = dst_row * static_cast<std::size_t>(n);
    XXH64_update(state, result, bytes);
    if (auto s = out.write(result, bytes); !s) return s;
    if (auto s = progress.add(bytes); !s) return s;
  }
  entry.checksum = XXH64_digest(state);
  return {};
}

// ------------------------------------------------------------------------------------------------------------

std::string layer_dir(std::int64_t l) {
  char b[16];
  std::snprintf(b, sizeof b, "L%03lld", static_cast<long long>(l));
  return b;
}
std::string expert_file(std::int64_t e) {
  char b[16];
  std::snprintf(b, sizeof b, "E%03lld.bin", static_cast<long long>(e));
  return b;
}

Status write_text(const fs::path& p, const std::string& text) {
  auto f = io::File::create(p);
  if (!f) return f.error();
  if (auto s = f->write_all(text.data(), text.size()); !s) return s;
  if (auto s = f->sync(); !s) return s;
  return f->close();
}

// A zombie (killed, its parent gone and init not yet reaping it) answers kill() but will write nothing more.
bool pid_alive(long pid) {
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const auto close = line.rfind(')');          // "PID (COMM) STATE ...": COMM may hold spaces and parentheses
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

// ".<output name>.colibri-<kind>-", the name of a hidden sibling of the output but for the pid: the output's name
// shortened so that it fits in 255 bytes (an output named with 250 would otherwise fail to convert).
std::string hidden_sibling_prefix(const fs::path& output, std::string_view kind) {
  // 230 + ".colibri-partial-" + a pid of at most 7 digits is 255.
  return "." + shortened_name(output.filename().string(), 230) + ".colibri-" + std::string(kind) + "-";
}

void remove_old_model(const fs::path& old_dir, const fs::path& model_path);

// Whether the model at `dir` is striped now: it has stripe records (or ones that cannot be read), or an expert file
// that is a link.
bool striped_now(const fs::path& dir) {
  auto records = stripe_record_dirs(dir);
  if (!records || !records->empty()) return true;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir / "experts", ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code link_ec;
    if (it->is_symlink(link_ec)) return true;
  }
  return false;
}

// Hidden sibling directories of earlier conversions of this output that died (their process is gone). One killed
// after its swap holds the replaced model, whose files `model stripe` put on other disks are removed with it, as the
// swap would have: unless the model there now is striped (then into the same directories, maybe), when only the
// hidden directory goes and a warning names it.
void remove_stale_partials(const fs::path& output) {
  std::error_code ec;
  const std::string prefix = hidden_sibling_prefix(output, "partial");
  for (const auto& e :
       fs::directory_iterator(output.parent_path().empty() ? fs::path(".") : output.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid_alive(pid)) continue;
    if (!striped_now(e.path())) {
      fs::remove_all(e.path(), ec);
    } else if (!striped_now(output)) {
      remove_old_model(e.path(), output);
    } else {
      spdlog::warn(
          "removed {}, a model replaced by a conversion that was killed; the expert files `model stripe` put on other "
          "disks for it may remain there (the model at {} is striped now too, so they are left alone)",
          e.path().string(), output.string());
      fs::remove_all(e.path(), ec);
    }
  }
}

// An earlier model may hold files the user put there (notes, a fine-tune's extra weights); replacing the directory
// would delete them. Only the manifest's files and what colibri itself writes beside them may go.
Status check_only_model_files(const fs::path& output) {
  auto text = io::read_text(output / "manifest.json");
  if (!text) return text.error().with_context("--force over " + output.string());
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  auto m = j.is_discarded() ? sdk::Expected<Manifest>(Status(StatusCode::invalid_argument, "not valid JSON"))
                            : parse_manifest(j, (output / "manifest.json").string());
  if (!m) {
    return Status(StatusCode::invalid_argument,
                  "output " + output.string() + " has a manifest.json colibri cannot read (" + m.error().message() +
                      "), so convert cannot tell its own files from yours and will not replace it. Move " +
                      output.string() + " away yourself, or choose another output path");
  }
  std::set<std::string> own = {"manifest.json", "stripe.yaml", std::string(kStripePending)};
  for (const auto& f : m->files) own.insert(fs::path(f.path).lexically_normal().generic_string());
  for (const auto& f : m->tokenizer_files) own.insert(fs::path(f).lexically_normal().generic_string());
  std::vector<std::string> foreign;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(output, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code st_ec;
    if (it->is_directory(st_ec) && !it->is_symlink(st_ec)) continue;  // their files are checked one by one
    const std::string rel = it->path().lexically_relative(output).generic_string();
    if (!own.count(rel)) foreign.push_back(rel);
  }
  if (ec) {
    return Status(StatusCode::io_error,
                  "cannot list " + output.string() + " to check it before --force replaces it: " + ec.message());
  }
  if (foreign.empty()) return {};
  std::sort(foreign.begin(), foreign.end());
  std::string names;
  for (size_t i = 0; i < foreign.size() && i < 5; ++i) names += (i ? ", " : "") + foreign[i];
  if (foreign.size() > 5) names += " and " + std::to_string(foreign.size() - 5) + " more";
  return Status(StatusCode::invalid_argument, "output " + output.string() +
                                                  " is a colibri model that also holds files convert did not write (" +
                                                  names + "); --force would delete them. Move them out of " +
                                                  output.string() + " first, or choose another output path");
}

// --force replaces only what convert itself made (or an empty directory): anything else may be user data.
// A `--copy` stripe leaves no symlinks: its mirrors are found through the old model's stripe.yaml. In each directory
// it lists whose .colibri-stripe marker names the model (`model`, canonical), only the expert files the old manifest
// lists go; anything else there is the user's. Adds the directories visited to `members`.
void remove_old_mirrors(const fs::path& old_dir, const fs::path& model, std::set<fs::path>& members) {
  // Named by the model's path: old_dir, a hidden name, is gone by the time the user reads this.
  auto stays = [&](const std::string& file, const std::string& why) {
    spdlog::warn(
        "cannot read {} of the replaced model ({}); the mirrors and copies its stripe records (stripe.yaml, "
        "stripe.pending) list stay on their disks: remove them yourself",
        (model / file).string(), why);
  };
  auto dirs = stripe_record_dirs(old_dir);
  if (!dirs) return stays("stripe.yaml", dirs.error().message());  // the why names stripe.pending when it is that
  if (dirs->empty()) return;
  // Read before the swap too (check_only_model_files); without it no file there can be told ours.
  auto text = io::read_text(old_dir / "manifest.json");
  if (!text) return stays("manifest.json", text.error().message());
  const json j = json::parse(*text, nullptr, false);
  if (j.is_discarded()) return stays("manifest.json", "not valid JSON");
  auto m = parse_manifest(j, "manifest.json");
  if (!m) return stays("manifest.json", m.error().message());
  std::set<fs::path> names;
  for (const auto& e : m->experts) names.insert(fs::path(e.file).lexically_normal());
  std::error_code ec;
  const fs::path old_real = fs::weakly_canonical(old_dir, ec);
  for (const auto& listed : *dirs) {
    const fs::path d = fs::weakly_canonical(listed, ec);
    if (ec || path_within(d, model) || path_within(model, d) || path_within(d, old_real)) continue;
    if (fs::path(stripe_owner(d)) != model) continue;  // another model's, or the user's
    for (const auto& rel : names) {
      const fs::path f = d / rel;
      if (!path_within(f, d / "experts") || f == d / "experts") continue;  // a name from outside experts/
      // The file, and what a stripe that crashed mid-copy left of it (model stripe copies through NAME.partial).
      for (const fs::path& one : {f, fs::path(f.string() + ".partial")}) {
        std::error_code rm_ec;
        if (fs::is_directory(fs::symlink_status(one, rm_ec))) continue;
        if (!fs::remove(one, rm_ec) && rm_ec) {
          spdlog::warn("cannot remove {}, a mirror of the replaced model: {}; delete it yourself", one.string(),
                       rm_ec.message());
        }
      }
    }
    members.insert(d);
  }
}

// Deletes a replaced model, with the expert files `model stripe` moved or mirrored to other disks for it: the
// symlinks in it point into directories whose .colibri-stripe marker names the model's path (`model_path`), and its
// stripe.yaml lists them. Files of any other directory a link may point to are the user's and stay.
void remove_old_model(const fs::path& old_dir, const fs::path& model_path) {
  std::error_code ec;
  const fs::path model = fs::weakly_canonical(model_path, ec);
  std::set<fs::path> members;
  for (auto it = fs::recursive_directory_iterator(old_dir / "experts", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code link_ec;
    if (!it->is_symlink(link_ec)) continue;
    const fs::path target = fs::weakly_canonical(it->path(), link_ec);
    if (link_ec) continue;
    // <member>/experts/L007/E003.bin: the member directory is three levels up.
    const fs::path member = target.parent_path().parent_path().parent_path();
    if (fs::path(stripe_owner(member)) != model) continue;
    fs::remove(target, link_ec);
    members.insert(member);
  }
  remove_old_mirrors(old_dir, model, members);
  std::error_code rm_ec;
  fs::remove_all(old_dir, rm_ec);
  if (rm_ec) {
    // The new model is in place; what is left of the old one (an immutable or read-only file) only takes room.
    spdlog::warn("cannot remove all of the replaced model, left in {}: {}; delete it yourself", old_dir.string(),
                 rm_ec.message());
  }
  for (const auto& m : members) remove_emptied_stripe_dir(m, model);
}

Status check_replaceable(const fs::path& output) {
  std::error_code ec;
  const auto st = fs::symlink_status(output, ec);
  if (ec || !fs::exists(st)) return {};
  if (fs::is_symlink(st) && !fs::exists(output, ec)) {
    return Status(StatusCode::invalid_argument,
                  "output " + output.string() + " is a link to " + fs::read_symlink(output, ec).string() +
                      ", which does not exist; create that directory (an unmounted disk?), or remove the link");
  }
  if (fs::is_regular_file(output, ec)) {
    return Status(StatusCode::invalid_argument,
                  "output " + output.string() + " is a file; a model is a directory: choose another output path");
  }
  if (fs::is_directory(output, ec)) {
    if (fs::is_regular_file(output / "manifest.json", ec)) return check_only_model_files(output);
    std::error_code list_ec;
    const bool empty = fs::directory_iterator(output, list_ec) == fs::directory_iterator();
    if (empty && !list_ec) return {};
  }
  return Status(StatusCode::invalid_argument,
                "output " + output.string() +
                    " exists and is not a colibri model (it has no manifest.json); --force only replaces an earlier "
                    "colibri model. Choose another output path, or move " +
                    output.string() + " away yourself");
}

// Symlinks resolved so that two spellings of one directory compare equal.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) r = fs::absolute(p, ec);
  r = r.lexically_normal();
  if (r.filename().empty()) r = r.parent_path();
  return r;
}

Status check_not_overlapping(const fs::path& input, const fs::path& output) {
  const fs::path in = resolved(input), out = resolved(output);
  const char* how = nullptr;
  if (in == out) {
    how = "is the input itself";
  } else if (path_within(out, in)) {
    how = "lies inside the input";
  } else if (path_within(in, out)) {
    how = "contains the input";
  }
  if (how == nullptr) return {};
  return Status(StatusCode::invalid_argument, "output " + output.string() + " " + how + " (" + input.string() +
                                                  "); convert never writes over or into its input. Choose an "
                                                  "output path outside " +
                                                  in.string());
}

// `swapped` is called once the new model is at `output` (tmp holds the old one, if any, from then on).
Status publish(const fs::path& tmp, const fs::path& output, bool force, const std::function<void()>& swapped) {
  std::error_code ec;
  // The new model is locked before it takes the output's name, so that a `model stripe` of the output waits until
  // the old model (whose stripe directories it would reuse) is gone; the caller's lock holds the old one.
  auto new_lock = ModelLock::acquire(tmp);
  if (!new_lock) return new_lock.error();
  const fs::path parent = output.parent_path().empty() ? fs::path(".") : output.parent_path();
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, output.c_str(), RENAME_NOREPLACE) == 0) {
    swapped();
    return io::fsync_directory(parent);
  }
  int err = errno;
  if (err == EEXIST || err == ENOTEMPTY) {
    if (!force) {
      return Status(StatusCode::invalid_argument, "output " + output.string() +
                                                      " appeared during the conversion; "
                                                      "pass --force to replace it");
    }
    // Checked again: the output may have appeared while we converted.
    if (auto s = check_replaceable(output); !s) return s;
    // Atomic swap: the old model stays whole until the new one is in place.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, output.c_str(), RENAME_EXCHANGE) == 0) {
      swapped();
      if (auto s = io::fsync_directory(parent); !s) return s;
      remove_old_model(tmp, output);  // tmp now holds the old model
      return {};
    }
    err = errno;
  }
  if (err == EINVAL || err == ENOSYS) {  // file systems without renameat2 flags
    std::error_code ec2;
    if (fs::exists(output, ec2)) {
      if (!force) return Status(StatusCode::invalid_argument, "output " + output.string() + " exists; pass --force");
      if (auto s = check_replaceable(output); !s) return s;
      fs::path old = parent / (hidden_sibling_prefix(output, "old") + std::to_string(::getpid()));
      if (::rename(output.c_str(), old.c_str()) != 0) {
        return Status(StatusCode::io_error,
                      "cannot move the old " + output.string() + " aside: " + sdk::os_error_text(errno));
      }
      if (::rename(tmp.c_str(), output.c_str()) != 0) {
        int e2 = errno;
        ::rename(old.c_str(), output.c_str());
        return Status(StatusCode::io_error, "cannot rename into " + output.string() + ": " + sdk::os_error_text(e2));
      }
      swapped();
      if (auto s = io::fsync_directory(parent); !s) return s;
      remove_old_model(old, output);
      return {};
    }
    if (::rename(tmp.c_str(), output.c_str()) != 0) {
      return Status(StatusCode::io_error, "cannot rename into " + output.string() + ": " + sdk::os_error_text(errno));
    }
    swapped();
    return io::fsync_directory(parent);
  }
  return Status(StatusCode::io_error,
                "cannot rename " + tmp.string() + " to " + output.string() + ": " + sdk::os_error_text(err));
}

struct Job {
  const PlannedTensor* plan;
  SourceRef src;
  TypeChoice choice;
};

// A tokenizer whose vocabulary has ids past the model's (another model's) would fail every prompt that uses them, or
// worse: refused here, as llama.cpp's converter refuses it. Added tokens past it (a <pad> added without resizing the
// embedding, which llama.cpp drops with a warning) fail only a prompt that holds one: warned about, naming one.
Status check_tokenizer_fits(const tokenizer::Tokenizer& tok, std::int64_t vocab_size, const std::string& tokenizer,
                            const std::string& vocab_source, const std::string& fix,
                            std::vector<std::string>& warnings) {
  if (vocab_size <= 0) return {};
  const auto rows = static_cast<std::size_t>(vocab_size);
  if (tok.model_vocab_size() > rows) {
    return Status(
        StatusCode::invalid_argument,
        tokenizer + ": the tokenizer's vocabulary has token ids up to " + std::to_string(tok.model_vocab_size() - 1) +
            ", but the model's has " + std::to_string(vocab_size) + " (" + vocab_source +
            "): ids past it have no embedding row, so this tokenizer does not belong to these weights; " + fix);
  }
  std::size_t past = 0;
  std::string first;
  for (std::size_t id = rows; id < tok.vocab_size(); ++id) {
    const auto piece = tok.token_to_piece(static_cast<tokenizer::TokenId>(id));
    if (!piece) continue;
    if (past++ == 0) first = "'" + *piece + "' (id " + std::to_string(id) + ")";
  }
  if (past > 0) {
    warnings.push_back(tokenizer + ": " + std::to_string(past) + " added token(s) have ids past the model's " +
                       std::to_string(vocab_size) + " (" + vocab_source + "), e.g. " + first +
                       "; the model has no embedding row for them, so a prompt that holds one fails");
  }
  return {};
}

}  // namespace

sdk::Expected<ConvertSummary> convert_model(const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  ConvertSummary summary;
  std::error_code ec;
  const int threads = opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency());

  // 1. Open and understand the input; nothing is written before every tensor is found and checked.
  Input in;
  in.path = opt.input;
  if (!fs::exists(opt.input, ec))
    return Status(StatusCode::not_found, "input " + opt.input.string() + " does not exist");
  if (auto s = check_not_overlapping(opt.input, opt.output); !s) return s;
  HyperParams hp;
  std::string gguf_arch;
  if (fs::is_directory(opt.input, ec)) {
    const fs::path cfg_path = opt.input / "config.json";
    if (!fs::exists(cfg_path, ec)) {
      // A directory holding a GGUF (a download of one): the file is the input, not the directory. Sorted, so that
      // a split GGUF's first part is the one named.
      std::vector<std::string> ggufs;
      for (const auto& e : fs::directory_iterator(opt.input, ec)) {
        if (e.path().extension() == ".gguf") ggufs.push_back(e.path().filename().string());
      }
      if (!ggufs.empty()) {
        std::sort(ggufs.begin(), ggufs.end());
        return Status(StatusCode::invalid_argument, opt.input.string() + " has no config.json but holds " +
                                                        ggufs.front() + "; give the .gguf file itself as --input");
      }
    }
    auto text = io::read_text(cfg_path);
    if (!text)
      return text.error().with_context("reading the checkpoint config (is " + opt.input.string() +
                                       " a HuggingFace checkpoint directory?)");
    try {
      in.config = json::parse(*text);
    } catch (const std::exception& e) {
      return Status(StatusCode::invalid_argument, cfg_path.string() + ": not valid JSON (" + e.what() + ")");
    }
    auto h = hparams_from_hf_config(in.config, cfg_path.string());
    if (!h) return h.error();
    hp = std::move(*h);
    // generation_config.json may list more end tokens than config.json (gpt-oss: <|call|> and <|endoftext|> besides
    // <|return|>); without them an answer would run on past a tool call.
    // There at all, it is read: one that is no regular file (a FIFO) is refused by io::read_text, not skipped unsaid.
    if (fs::exists(fs::symlink_status(opt.input / "generation_config.json", ec))) {
      const fs::path gen_path = opt.input / "generation_config.json";
      auto gen_text = io::read_text(gen_path);
      if (!gen_text) return gen_text.error();
      const json gen = json::parse(*gen_text, nullptr, false);
      if (gen.is_discarded()) {
        return Status(StatusCode::invalid_argument, gen_path.string() + ": not valid JSON; fix or remove it");
      }
      // Its sampling values are the server's defaults: one a request could not give would stop the server at start.
      if (auto sampling = server::read_sampling_defaults(gen_path, "; fix it there, or remove the field"); !sampling) {
        return sampling.error();
      }
      const json ids = gen.is_object() && gen.contains("eos_token_id") ? gen["eos_token_id"] : json();
      for (const auto& id : ids.is_array() ? ids : json::array({ids})) {
        if (id.is_null()) continue;
        if (!id.is_number_integer() || id.get<std::int64_t>() < 0) {
          return Status(StatusCode::invalid_argument, gen_path.string() + ": eos_token_id is " +
                                                          ids.dump().substr(0, 80) +
                                                          "; it must be a token id or a list of token ids");
        }
        if (id.get<std::int64_t>() >= hp.vocab_size) {
          return Status(StatusCode::invalid_argument,
                        gen_path.string() + ": eos_token_id " + id.dump() + " is outside the vocabulary (vocab_size " +
                            std::to_string(hp.vocab_size) + " in config.json); fix or remove it");
        }
        if (std::find(hp.eos_token_ids.begin(), hp.eos_token_ids.end(), id.get<std::int64_t>()) ==
            hp.eos_token_ids.end()) {
          hp.eos_token_ids.push_back(id.get<std::int64_t>());
        }
      }
    }
    auto st = SafetensorsCheckpoint::open(opt.input);
    if (!st) return st.error();
    in.st = std::move(*st);
    fs::path tokenizer_file = opt.input / "tokenizer.json";
    if (!fs::is_regular_file(tokenizer_file, ec)) {
      if (fs::exists(fs::symlink_status(tokenizer_file, ec))) {
        return Status(StatusCode::invalid_argument, tokenizer_file.string() + " is " +
                                                        sdk::path_kind_text(tokenizer_file.string()) +
                                                        ", not a file; put the file there");
      }
      const auto vocab = tokenizer::find_tiktoken_vocab(opt.input);
      if (!vocab) {
        return Status(StatusCode::not_found,
                      "no tokenizer.json (nor tiktoken.model, hy.tiktoken) in " + opt.input.string() +
                          "; colibri needs the HuggingFace fast tokenizer file next to the weights");
      }
      // Kimi K2, Moonlight, Hunyuan-A13B: the tokenizer.json that tokenizes as their tiktoken code is written into the
      // model.
      auto imported = tokenizer::import_tiktoken(opt.input);
      if (!imported) return imported.error().with_context("the checkpoint's tokenizer");
      in.tiktoken = std::move(*imported);
      tokenizer_file = opt.input / in.tiktoken->file;  // the family's, which the import read
    }
    // Loaded now, so that a tokenizer colibri cannot read fails the conversion before any weight is written,
    // not the first run afterwards.
    auto tok = in.tiktoken ? tokenizer::Tokenizer::from_json_in(in.tiktoken->tokenizer_json, opt.input,
                                                                tokenizer_file.string() + " (as a tokenizer.json)")
                           : tokenizer::Tokenizer::from_file(tokenizer_file);
    if (!tok) return tok.error().with_context("the checkpoint's tokenizer");
    if (auto s = check_tokenizer_fits(*tok, hp.vocab_size, tokenizer_file.string(), "vocab_size in config.json",
                                      "put the checkpoint's own " + tokenizer_file.filename().string() + " there",
                                      summary.warnings);
        !s) {
      return s;
    }
    // Likewise tokenizer_config.json, which chat and the server read (a damaged one is refused); a chat template
    // colibri cannot parse is said now: completions still work, chat needs --chat-template.
    std::optional<std::pair<std::string, std::string>> chat_template;  // source, where it came from
    if (const fs::path jinja = opt.input / "chat_template.jinja"; fs::exists(fs::symlink_status(jinja, ec))) {
      auto text = io::read_text(jinja);
      if (!text) return text.error();
      chat_template.emplace(std::move(*text), "chat_template.jinja");
    }
    if (const fs::path cfg = opt.input / "tokenizer_config.json"; fs::exists(fs::symlink_status(cfg, ec))) {
      auto text = io::read_text(cfg);
      if (!text) return text.error();
      if (const json j = json::parse(*text, nullptr, false); j.is_discarded() || !j.is_object()) {
        return Status(StatusCode::invalid_argument,
                      cfg.string() +
                          " is not a JSON object; fix it, or remove it (chat then uses a built-in "
                          "template and the tokenizer's own special tokens)");
      }
      auto chat_cfg = chat::load_chat_config(cfg);
      // No template at all is fine here: chat picks a built-in one by the architecture. One that is there but
      // cannot be read (a number, a list without "default") is said now.
      if (!chat_cfg && chat_cfg.error().code() != sdk::StatusCode::not_found) {
        summary.warnings.push_back(chat_cfg.error().message() +
                                   "; chat and /v1/chat/completions need --chat-template FILE for this model");
      } else if (chat_cfg && !chat_template && !chat_cfg->template_origin.starts_with("built-in")) {
        chat_template.emplace(chat_cfg->template_source, chat_cfg->template_origin);
      }
    }
    if (chat_template) {
      if (auto t = chat::Template::parse(chat_template->first, chat_template->second); !t) {
        summary.warnings.push_back("the chat template (" + chat_template->second +
                                   ") does not parse: " + t.error().message() +
                                   "; chat and /v1/chat/completions need --chat-template FILE for this model");
      }
    }
  } else {
    const std::string ext = opt.input.extension().string();
    if (ext == ".safetensors") {
      return Status(StatusCode::invalid_argument,
                    opt.input.string() +
                        " is one safetensors file; give the directory that holds it with its config.json and "
                        "tokenizer.json");
    }
    if (ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".ckpt") {
      return Status(StatusCode::unsupported,
                    opt.input.string() +
                        " looks like a PyTorch pickle, which colibri does not read (it can run code); "
                        "give a HuggingFace directory with .safetensors weights, or a .gguf file");
    }
    in.is_gguf = true;
    auto g = GgufFile::open(opt.input);
    if (!g) return g.error();
    in.gguf = std::move(*g);
    auto h = hparams_from_gguf(*in.gguf);
    if (!h) return h.error();
    hp = std::move(*h);
    gguf_arch = in.gguf->get_string("general.architecture").value_or("");
  }
  summary.architecture = hp.architecture;
  const ModelPlan plan = build_plan(hp, gguf_arch);

  std::vector<Job> shared_jobs;
  std::vector<std::vector<std::vector<Job>>> expert_jobs;
  std::uint64_t total_bytes = 0;
  std::set<std::string> fp8_tensors;  // by source name: a tensor cut in two (MLA) counts once
  auto make_job = [&](const PlannedTensor& p) -> sdk::Expected<Job> {
    auto src = in.is_gguf ? locate_gguf(in, p) : locate_hf(in, p);
    if (!src) return src.error();
    auto choice = choose_target(opt.preset, p, *src, hp);
    if (!choice && choice.error().code() == StatusCode::unsupported)
      return choice.error().with_context(in.path.string());
    if (!choice) return choice.error();
    total_bytes += sdk::row_bytes(choice->type, src->cols) * static_cast<std::uint64_t>(src->rows);
    if (src->st != nullptr && src->st->dtype == "F8_E4M3") fp8_tensors.insert(src->st->name);
    return Job{&p, *src, *choice};
  };
  for (const auto& p : plan.shared) {
    auto j = make_job(p);
    if (!j) return j.error();
    shared_jobs.push_back(*j);
  }
  for (const auto& layer : plan.experts) {
    expert_jobs.emplace_back();
    for (const auto& parts : layer) {
      std::vector<Job> jobs;
      for (const auto& part : parts) {
        auto j = make_job(part);
        if (!j) return j.error();
        jobs.push_back(*j);
      }
      expert_jobs.back().push_back(std::move(jobs));
    }
  }
  {  // Tensors the architecture does not use are not silently dropped: the summary names them.
    std::set<std::string> used;
    auto use = [&used](const Job& j) {
      used.insert(j.src.name);
      used.insert(j.src.also_read.begin(), j.src.also_read.end());
    };
    std::for_each(shared_jobs.begin(), shared_jobs.end(), use);
    for (const auto& layer : expert_jobs) {
      for (const auto& parts : layer) std::for_each(parts.begin(), parts.end(), use);
    }
    std::vector<std::string> unused;
    used.insert("rope_freqs.weight");  // read into the hyper-parameters (rope_scaling freq_factors)
    if (in.is_gguf) {
      for (const auto& t : in.gguf->tensors()) {
        if (!used.count(t.name)) unused.push_back(t.name);
      }
    } else {
      for (const auto& [name, t] : in.st->tensors()) {
        if (!used.count(name) && name.find("rotary_emb.inv_freq") == std::string::npos) unused.push_back(name);
      }
    }
    // The layer a tensor name belongs to, or -1.
    auto layer_of = [&](const std::string& name) -> std::int64_t {
      std::string_view prefix = in.is_gguf ? "blk." : "model.layers.";
      if (!in.is_gguf && std::string_view(name).starts_with("language_model.")) prefix = "language_model.model.layers.";
      if (!in.is_gguf && std::string_view(name).starts_with("model.language_model.")) {
        prefix = "model.language_model.layers.";
      }
      if (!std::string_view(name).starts_with(prefix)) return -1;
      std::int64_t layer = 0;
      const char* first = name.data() + prefix.size();
      const auto [end, ec] = std::from_chars(first, name.data() + name.size(), layer);
      return ec != std::errc() || end == first || *end != '.' ? -1 : layer;
    };
    // GLM's multi-token-prediction layers come right after the last one; colibri does not draft with them.
    // Qwen3-Next's sits apart, under mtp.
    const bool mtp_apart = !in.is_gguf && (hp.architecture == "qwen3_next" || is_qwen3_5(hp.architecture));
    const auto nextn_end = std::stable_partition(unused.begin(), unused.end(), [&](const std::string& name) {
      const std::int64_t layer = layer_of(name);
      return (layer >= hp.num_layers && layer < hp.num_layers + hp.nextn_layers) ||
             (mtp_apart && name.starts_with("mtp."));
    });
    const auto nextn_tensors = static_cast<std::size_t>(nextn_end - unused.begin());
    unused.erase(unused.begin(), nextn_end);
    // Llama 4's and Qwen3-VL's image-text checkpoints: the vision tower (and projector); colibri runs the language
    // model.
    const std::vector<std::string> vision_prefixes =
        in.is_gguf                    ? std::vector<std::string>{}
        : hp.architecture == "llama4" ? std::vector<std::string>{"vision_model.", "multi_modal_projector."}
        : hp.architecture == "qwen3_vl_moe" || is_qwen3_5(hp.architecture) ? std::vector<std::string>{"model.visual."}
                                                                           : std::vector<std::string>{};
    const auto vision_end = std::stable_partition(unused.begin(), unused.end(), [&](const std::string& name) {
      return std::any_of(vision_prefixes.begin(), vision_prefixes.end(),
                         [&](const std::string& p) { return name.starts_with(p); });
    });
    const auto vision_tensors = static_cast<std::size_t>(vision_end - unused.begin());
    unused.erase(unused.begin(), vision_end);
    // A GGUF holds what llama.cpp loads for its metadata, and llama.cpp refuses any other tensor ("wrong number of
    // tensors"): one in a decoder layer that colibri would skip means the metadata and the tensors disagree (a
    // shared expert's count of 0, biases found missing in layer 0), and the model would run without it.
    for (const auto& name : unused) {
      const std::int64_t layer = layer_of(name);
      if (!in.is_gguf || layer < 0 || layer >= hp.num_layers) continue;
      return Status(StatusCode::invalid_argument,
                    opt.input.string() + ": tensor '" + name + "' is in layer " + std::to_string(layer) +
                        ", but the metadata gives " + hp.architecture +
                        " no such tensor there; the metadata and the tensors disagree (llama.cpp refuses such a "
                        "file too): re-export the GGUF");
    }
    // Whole layers past num_hidden_layers: the config and the weights disagree, and the model would run short.
    for (const auto& name : unused) {
      const std::int64_t layer = layer_of(name);
      if (layer < hp.num_layers) continue;
      return Status(StatusCode::invalid_argument,
                    opt.input.string() + ": the weights hold layer " + std::to_string(layer) + " ('" + name +
                        "'), but " +
                        (in.is_gguf ? "its metadata says block_count " : "config.json says num_hidden_layers ") +
                        std::to_string(hp.num_layers + hp.nextn_layers) +
                        "; fix the layer count (the model would run without them)");
    }
    if (!fp8_tensors.empty()) {
      summary.warnings.push_back(std::to_string(fp8_tensors.size()) +
                                 " tensor(s) were FP8 (F8_E4M3 with block scales) in the input: dequantized, then "
                                 "stored as the preset says (" +
                                 opt.preset + ")");
    }
    if (nextn_tensors > 0) {
      const std::string what = mtp_apart ? std::string(" of the multi-token-prediction module (mtp.)")
                                         : " of the multi-token-prediction layer" +
                                               std::string(hp.nextn_layers > 1 ? "s" : "") + " after layer " +
                                               std::to_string(hp.num_layers - 1);
      summary.warnings.push_back(std::to_string(nextn_tensors) + " tensor(s)" + what +
                                 " were skipped: colibri does not draft tokens with them");
    }
    if (vision_tensors > 0) {
      std::string prefixes;
      for (const auto& p : vision_prefixes) prefixes += (prefixes.empty() ? "" : ", ") + p;
      summary.warnings.push_back(std::to_string(vision_tensors) + " tensor(s) of the vision tower (" + prefixes +
                                 ") were skipped: colibri runs the language model, text in and text out");
    }
    if (!unused.empty()) {
      summary.warnings.push_back(std::to_string(unused.size()) + " tensor(s) of the input are not used by " +
                                 hp.architecture + " and were skipped, e.g. '" + unused.front() + "'");
    }
  }
  std::optional<RebuiltTokenizer> rebuilt;
  if (in.is_gguf) {
    auto tok = rebuild_tokenizer_from_gguf(*in.gguf);
    if (!tok) return tok.error();
    rebuilt = std::move(*tok);
    auto check = tokenizer::Tokenizer::from_json(rebuilt->tokenizer_json, "tokenizer.json rebuilt from the GGUF");
    if (!check) {
      return check.error().with_context(opt.input.string() + ": its vocabulary does not make a usable tokenizer");
    }
    if (auto s = check_tokenizer_fits(*check, hp.vocab_size, opt.input.string() + " (tokenizer.ggml.tokens)",
                                      "its vocab_size, or its token_embd rows", "re-export the GGUF", summary.warnings);
        !s) {
      return s;
    }
  }

  // The engine's own check of rope_scaling (each type's keys): a model it would refuse at load is not written.
  if (auto rope =
          engine::RopeFrequencies::create(hp, in.is_gguf ? opt.input.string() : (opt.input / "config.json").string());
      !rope) {
    return rope.error();
  }

  // 2. The output: refused if present (unless --force); written into a hidden sibling first.
  const fs::path output = fs::absolute(opt.output, ec).lexically_normal();
  fs::path out_clean = output;
  if (out_clean.filename().empty()) out_clean = out_clean.parent_path();
  if (fs::is_symlink(fs::symlink_status(out_clean, ec))) {
    // The link names where the model lives: that directory is written (next to it, on its disk) and the link stays.
    const fs::path real = fs::weakly_canonical(out_clean, ec);
    if (ec) return Status(StatusCode::io_error, "cannot resolve the link " + out_clean.string() + ": " + ec.message());
    out_clean = real;
  }
  // What --force could not replace is said first: "pass --force" would be wrong advice for a file.
  if (auto s = check_replaceable(out_clean); !s) return s;
  if (fs::exists(out_clean, ec) && !opt.force) {
    return Status(StatusCode::invalid_argument, "output " + out_clean.string() +
                                                    " already exists; pass --force to replace it (the old model is "
                                                    "kept until the new one is complete)");
  }
  // The model --force replaces is locked until it is gone: a `model stripe` of it meanwhile would report success on
  // files about to be removed (and one running now would be cut short).
  std::optional<ModelLock> replacing;
  if (fs::is_directory(out_clean, ec)) {
    auto lock = ModelLock::acquire(out_clean);
    if (!lock) return lock.error();
    replacing.emplace(std::move(*lock));
  }
  // A missing parent is made, as `mkdir -p` (the models directory of a fresh install does not exist yet).
  const fs::path parent = out_clean.parent_path();
  if (!fs::exists(parent, ec) && !fs::create_directories(parent, ec) && ec) {
    return Status(StatusCode::io_error,
                  "cannot create the output's parent directory " + parent.string() + ": " + ec.message());
  }
  if (!fs::is_directory(parent, ec)) {
    return Status(StatusCode::invalid_argument,
                  "the output's parent " + parent.string() + " is not a directory; give an output inside a directory");
  }
  remove_stale_partials(out_clean);
  const fs::path tmp = parent / (hidden_sibling_prefix(out_clean, "partial") + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec)) {
    return Status(StatusCode::io_error, "cannot create " + tmp.string() + ": " + ec.message());
  }
  // A signal that ends the process at once (SIGTERM, a second Ctrl-C) removes it too; declared before the cleanup
  // below, so that it still serves while that cleanup removes the directory (a second Ctrl-C then).
  // Until the swap: from then on tmp holds the replaced model, whose files on other disks a signal's removal would
  // miss; left hidden instead, the next convert removes it with them (remove_stale_partials).
  std::optional<util::RemovedOnSignal> removed_on_signal;
  removed_on_signal.emplace(tmp, util::RemovedOnSignal::Removal::tree);
  struct Cleanup {
    fs::path dir;
    bool armed = true;
    ~Cleanup() {
      std::error_code e;
      if (armed) fs::remove_all(dir, e);
    }
  } cleanup{tmp};

  Manifest m;
  m.hparams = hp;
  Progress progress;
  progress.total = total_bytes;
  progress.cb = &opt.progress;
  progress.stop = &opt.stop;
  std::map<std::string, int> type_counts;
  auto note = [&](const Job& j) {
    type_counts[std::string(sdk::to_string(j.choice.type))]++;
    if (j.choice.fallback) summary.fallbacks.push_back(*j.choice.fallback);
  };

  // 3. shared.bin: every tensor 4 KiB aligned.
  {
    auto out = OutFile::create(tmp / "shared.bin");
    if (!out) return out.error();
    for (const auto& j : shared_jobs) {
      if (auto s = (*out)->pad_to(kBlobAlignment); !s) return s;
      TensorEntry e;
      e.name = j.plan->name;
      e.file = "shared.bin";
      e.shape = j.plan->shape;
      if (auto s = write_tensor(in, j.src, j.choice.type, **out, threads, progress, e); !s) return s;
      m.tensors.push_back(std::move(e));
      note(j);
    }
    if (auto s = (*out)->pad_to(kBlobAlignment); !s) return s;
    FileEntry fe{"shared.bin", (*out)->pos(), 0};
    auto sum = (*out)->finish();
    if (!sum) return sum.error();
    fe.checksum = *sum;
    m.files.push_back(fe);
  }

  // 4. Experts: gate, up, down back to back, each part and the blob 4 KiB aligned so one read fetches it.
  if (auto s = io::fsync_directory(tmp); !s) return s;
  if (!fs::create_directory(tmp / "experts", ec))
    return Status(StatusCode::io_error, "cannot create experts/: " + ec.message());
  for (std::size_t l = 0; l < expert_jobs.size(); ++l) {
    const std::string ldir = "experts/" + layer_dir(static_cast<std::int64_t>(l));
    std::unique_ptr<OutFile> layer_out;
    std::string layer_rel;
    if (opt.split_experts) {
      if (!fs::create_directory(tmp / ldir, ec))
        return Status(StatusCode::io_error, "cannot create " + ldir + ": " + ec.message());
    } else {
      layer_rel = ldir + ".bin";
      auto o = OutFile::create(tmp / layer_rel);
      if (!o) return o.error();
      layer_out = std::move(*o);
    }
    for (std::size_t e = 0; e < expert_jobs[l].size(); ++e) {
      std::unique_ptr<OutFile> own;
      std::string rel = layer_rel;
      if (opt.split_experts) {
        rel = ldir + "/" + expert_file(static_cast<std::int64_t>(e));
        auto o = OutFile::create(tmp / rel);
        if (!o) return o.error();
        own = std::move(*o);
      }
      OutFile& out = opt.split_experts ? *own : *layer_out;
      ExpertEntry ex;
      ex.layer = static_cast<std::int64_t>(l);
      ex.expert = static_cast<std::int64_t>(e);
      ex.file = rel;
      ex.offset = out.pos();
      TensorEntry* parts[6] = {&ex.gate, &ex.up, &ex.down, &ex.gate_bias, &ex.up_bias, &ex.down_bias};
      for (std::size_t i = 0; i < expert_jobs[l][e].size(); ++i) {
        const Job& j = expert_jobs[l][e][i];
        // Weights start on a page (direct I/O, device copies); biases (gpt-oss) follow at 256, every backend's
        // buffer offset alignment.
        if (auto s = out.pad_to(i < 3 ? kBlobAlignment : 256); !s) return s;
        parts[i]->name = j.plan->name;
        parts[i]->file = rel;
        parts[i]->shape = j.plan->shape;
        if (auto s = write_tensor(in, j.src, j.choice.type, out, threads, progress, *parts[i]); !s) return s;
        note(j);
      }
      if (auto s = out.pad_to(kBlobAlignment); !s) return s;
      ex.size = out.pos() - ex.offset;
      summary.bytes_per_expert = std::max(summary.bytes_per_expert, ex.size);
      m.experts.push_back(std::move(ex));
      if (own) {
        FileEntry fe{rel, own->pos(), 0};
        auto sum = own->finish();
        if (!sum) return sum.error();
        fe.checksum = *sum;
        m.files.push_back(fe);
      }
    }
    if (layer_out) {
      FileEntry fe{layer_rel, layer_out->pos(), 0};
      auto sum = layer_out->finish();
      if (!sum) return sum.error();
      fe.checksum = *sum;
      m.files.push_back(fe);
    } else if (auto s = io::fsync_directory(tmp / ldir); !s) {
      return s;
    }
  }
  if (auto s = io::fsync_directory(tmp / "experts"); !s) return s;

  // 5. Tokenizer files, each with its xxh64: a changed vocabulary or chat template changes every answer.
  json tokenizer_sums = json::object();
  auto write_tokenizer_file = [&](const std::string& name, const std::string& text) -> Status {
    if (auto s = write_text(tmp / name, text); !s) return s;
    m.tokenizer_files.push_back(name);
    tokenizer_sums[name] = io::hex64(XXH64(text.data(), text.size(), 0));
    return {};
  };
  if (rebuilt) {
    if (auto s = write_tokenizer_file("tokenizer.json", rebuilt->tokenizer_json); !s) return s;
    if (auto s = write_tokenizer_file("tokenizer_config.json", rebuilt->tokenizer_config_json); !s) return s;
    m.tokenizer = {{"source", "gguf"}, {"model", rebuilt->model}, {"notes", rebuilt->notes}};
    for (const auto& n : rebuilt->notes) summary.warnings.push_back("tokenizer: " + n);
  } else {
    m.tokenizer = {{"source", "copied"}};
    if (in.tiktoken) {
      if (auto s = write_tokenizer_file("tokenizer.json", in.tiktoken->tokenizer_json); !s) return s;
      m.tokenizer = {{"source", "tiktoken"},
                     {"family", in.tiktoken->family},
                     {"code", in.tiktoken->code},
                     {"file", in.tiktoken->file}};
    }
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                             "special_tokens_map.json"}) {
      if (!fs::exists(fs::symlink_status(opt.input / name, ec))) continue;
      auto text = io::read_text(opt.input / name);  // one there but no regular file is refused, not left out
      if (!text) return text.error();
      if (auto s = write_tokenizer_file(name, *text); !s) return s;
    }
  }
  m.tokenizer["xxh64"] = std::move(tokenizer_sums);

  // 6. The manifest last, then publish by rename.
  json types = json::object();
  for (const auto& [t, n] : type_counts) types[t] = n;
  json fallbacks = json::array();
  for (const auto& f : summary.fallbacks) {
    fallbacks.push_back({{"tensor", f.tensor}, {"wanted", f.wanted}, {"used", f.used}, {"reason", f.reason}});
  }
  // The preset's own spelling ("-q Q4_K_M" is q4_k_m), as every other model records it.
  const auto preset = quant::parse_preset(opt.preset);
  m.quantization = {{"preset", preset ? std::string(quant::to_string(*preset)) : opt.preset},
                    {"types", types},
                    {"fallbacks", fallbacks}};
  m.source = {{"kind", in.is_gguf ? "gguf" : "safetensors"}, {"path", opt.input.string()}};
  if (in.is_gguf) {
    m.source["gguf_architecture"] = gguf_arch;
    if (in.gguf->parts().size() > 1) {  // the first part, whichever was given
      m.source["path"] = in.gguf->path().string();
      m.source["parts"] = in.gguf->parts().size();
    }
  }
  std::string manifest_text;
  try {
    manifest_text = m.to_json().dump(1);
  } catch (const json::exception&) {  // JSON holds only UTF-8: a non-UTF-8 input path or metadata string
    return Status(StatusCode::invalid_argument,
                  "cannot write manifest.json: the input path " + opt.input.string() +
                      " or a metadata string it records is not valid UTF-8; rename the input or fix its metadata");
  }
  // Self-check: what we wrote must parse as what a run will read.
  if (auto back = parse_manifest(json::parse(manifest_text), "new manifest"); !back) {
    return Status(StatusCode::internal, "the new manifest does not validate: " + back.error().message());
  }
  if (auto s = write_text(tmp / "manifest.json", manifest_text); !s) return s;
  if (auto s = io::fsync_directory(tmp); !s) return s;
  if (auto s = publish(tmp, out_clean, opt.force, [&] { removed_on_signal.reset(); }); !s) return s;
  cleanup.armed = false;

  summary.files = m.files.size() + m.tokenizer_files.size() + 1;
  summary.resident_bytes = m.resident_bytes();
  summary.expert_bytes = m.expert_bytes();
  summary.experts = m.experts.size();
  summary.bytes_written = progress.done;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace colibri::model
