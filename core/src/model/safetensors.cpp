#include "colibri/model/safetensors.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "colibri/sdk/os_error.hpp"
#include "model/file_io.hpp"

namespace colibri::model {

namespace fs = std::filesystem;
using nlohmann::json;
using sdk::Status;
using sdk::StatusCode;

namespace {

// A header larger than this is not a real checkpoint (the largest seen are a few MB).
constexpr std::uint64_t kMaxHeaderBytes = 256ull << 20;

Status corrupt(const fs::path& file, const std::string& what) {
  return Status(StatusCode::corrupt_data, io::path_text(file) + ": " + what);
}

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}

}  // namespace

struct SafetensorsCheckpoint::Shard {
  io::File file;
};

std::size_t safetensors_dtype_size(const std::string& dtype) noexcept {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

namespace {

// Parses one file's header into `out` (absolute offsets). `wanted` (may be null) limits which names are kept.
Status parse_shard(const fs::path& path, const io::File& file, std::size_t file_index,
                   std::map<std::string, SafetensorsTensor>& out) {
  auto size = file.size();
  if (!size) return size.error();
  if (*size < 8)
    return corrupt(path, "file is " + std::to_string(*size) + " bytes, too short for a safetensors header");
  unsigned char len_bytes[8];
  if (auto s = file.read_at(len_bytes, 8, 0); !s) return s;
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > *size - 8) {
    return corrupt(path, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                             std::to_string(*size) + " bytes); the file is truncated or not safetensors");
  }
  if (header_len > kMaxHeaderBytes)
    return corrupt(path, "header length " + std::to_string(header_len) + " is implausible");
  std::string text(header_len, '\0');
  if (auto s = file.read_at(text.data(), header_len, 8); !s) return s;
  json header;
  std::string duplicate;  // a tensor named twice: JSON keeps the last, the file's writer meant something else
  std::set<std::string> names;
  try {
    header = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth == 1 && event == json::parse_event_t::key && duplicate.empty() &&
          !names.insert(parsed.get<std::string>()).second) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    });
  } catch (const std::exception& e) {
    return corrupt(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) return corrupt(path, "header names tensor '" + duplicate + "' twice");
  if (!header.is_object()) return corrupt(path, "header is not a JSON object");
  const std::uint64_t data_start = 8 + header_len;
  const std::uint64_t data_len = *size - data_start;
  std::vector<std::pair<std::uint64_t, std::string>> spans;  // begin, name: checked for holes and overlaps below
  std::map<std::string, std::uint64_t> ends;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& e = it.value();
    const std::string where = "tensor '" + it.key() + "'";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") ||
        !e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return corrupt(path, where + " needs dtype (string), shape (array) and data_offsets ([begin, end])");
    }
    SafetensorsTensor t;
    t.name = it.key();
    t.dtype = e["dtype"].get<std::string>();
    t.file_index = file_index;
    std::size_t elem = safetensors_dtype_size(t.dtype);
    if (elem == 0) return corrupt(path, where + " has unknown dtype '" + t.dtype + "'");
    std::uint64_t count = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned())
        return corrupt(path, where + " has a shape entry that is not a non-negative integer");
      auto v = d.get<std::uint64_t>();
      if (v > (1ull << 40) || mul_overflows(count, v, count)) return corrupt(path, where + " has an absurd shape");
      t.shape.push_back(static_cast<std::int64_t>(v));
    }
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return corrupt(path, where + " has data_offsets that are not non-negative integers");
    }
    auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    std::uint64_t expect = 0;
    if (mul_overflows(count, elem, expect)) return corrupt(path, where + " is too large");
    if (end < begin || end > data_len) {
      return corrupt(path, where + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                               "] outside the data section (" + std::to_string(data_len) +
                               " bytes); the file is truncated or corrupt");
    }
    if (end - begin != expect) {
      return corrupt(path, where + " holds " + std::to_string(end - begin) + " bytes but dtype " + t.dtype +
                               " and its shape need " + std::to_string(expect));
    }
    t.offset = data_start + begin;
    t.size = expect;
    spans.emplace_back(begin, t.name);
    ends[t.name] = end;
    out[t.name] = std::move(t);
  }
  // The format's rule: the tensors tile the data section exactly, no overlap (two tensors reading one's bytes), no
  // hole, nothing after (the safetensors library refuses these too).
  std::sort(spans.begin(), spans.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : ends[a.second] < ends[b.second];
  });
  std::uint64_t covered = 0;
  std::string previous;
  for (const auto& [begin, name] : spans) {
    if (begin < covered) {
      return corrupt(path, "tensor '" + name + "' (data_offsets from " + std::to_string(begin) + ") overlaps '" +
                               previous + "' (to " + std::to_string(covered) + "); the file is corrupt");
    }
    if (begin > covered) {
      return corrupt(path, "bytes " + std::to_string(covered) + " to " + std::to_string(begin) +
                               " of the data section belong to no tensor (before '" + name + "'); the file is corrupt");
    }
    covered = ends[name];
    previous = name;
  }
  if (covered != data_len) {
    return corrupt(path, std::to_string(data_len - covered) + " bytes follow the last tensor's data (" +
                             std::to_string(covered) + " of " + std::to_string(data_len) +
                             " bytes are tensors); the file is corrupt or not safetensors");
  }
  return {};
}

}  // namespace

sdk::Expected<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const fs::path& dir_or_file) {
  SafetensorsCheckpoint ckpt;
  std::error_code ec;
  std::vector<fs::path> shard_paths;
  std::map<std::string, std::string> weight_map;
  fs::path index_path;
  const fs::path single_file = dir_or_file / "model.safetensors";
  const fs::path index_file = dir_or_file / "model.safetensors.index.json";
  if (fs::is_regular_file(dir_or_file, ec)) {
    shard_paths.push_back(dir_or_file);
  } else if (fs::is_regular_file(single_file, ec)) {
    // transformers reads model.safetensors first, whatever else is there: so does colibri, saying so.
    if (fs::is_regular_file(index_file, ec)) {
      spdlog::warn(
          "{} holds both model.safetensors and model.safetensors.index.json; reading model.safetensors, as "
          "transformers does (remove the one that is not this model's)",
          io::path_text(dir_or_file));
    }
    shard_paths.push_back(single_file);
  } else if (fs::is_regular_file(index_file, ec)) {
    index_path = index_file;
    auto text = io::read_text(index_path);
    if (!text) return text.error();
    json index;
    try {
      index = json::parse(*text);
    } catch (const std::exception& e) {
      return corrupt(index_path, std::string("not valid JSON: ") + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return corrupt(index_path, "has no \"weight_map\" object");
    }
    std::map<std::string, std::size_t> seen;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return corrupt(index_path, "weight_map[\"" + it.key() + "\"] is not a file name");
      std::string fname = it.value().get<std::string>();
      fs::path rel(fname);
      if (fname.empty() || rel.is_absolute() || rel.has_parent_path() || fname == ".." || fname == ".") {
        return corrupt(index_path, "weight_map[\"" + it.key() + "\"] names '" + fname +
                                       "', which is not a file name in the checkpoint directory");
      }
      weight_map[it.key()] = fname;
      if (!seen.count(fname)) {
        seen[fname] = shard_paths.size();
        shard_paths.push_back(dir_or_file / rel);
      }
    }
    if (shard_paths.empty()) return corrupt(index_path, "weight_map is empty");
  } else {
    for (const auto& p : {single_file, index_file}) {  // there, but no file: named as what it is, not as missing
      if (!fs::exists(fs::symlink_status(p, ec))) continue;
      std::error_code follow;
      (void)fs::status(p, follow);
      return Status(StatusCode::invalid_argument,
                    io::path_text(p) +
                        (follow ? " cannot be followed: " + follow.message()
                                : " is " + sdk::path_kind_text(p.string()) + ", not a file") +
                        "; put the checkpoint's file there");
    }
    return Status(StatusCode::not_found,
                  "no model.safetensors or model.safetensors.index.json in " + io::path_text(dir_or_file));
  }
  for (const auto& p : shard_paths) {
    auto f = io::File::open_read(p);
    if (!f) {
      if (!index_path.empty()) return f.error().with_context("shard listed in " + io::path_text(index_path));
      return f.error();
    }
    auto shard = std::make_shared<Shard>();
    shard->file = std::move(*f);
    std::map<std::string, SafetensorsTensor> found;
    if (auto s = parse_shard(p, shard->file, ckpt.files_.size(), found); !s) return s;
    for (auto& [name, t] : found) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        if (it == weight_map.end() || dir_or_file / it->second != p) continue;  // the index is authoritative
      }
      if (ckpt.tensors_.count(name)) return corrupt(p, "tensor '" + name + "' also appears in another shard");
      ckpt.tensors_[name] = t;
    }
    ckpt.files_.push_back(p);
    ckpt.shards_.push_back(std::move(shard));
  }
  for (const auto& [name, fname] : weight_map) {
    if (!ckpt.tensors_.count(name)) {
      return corrupt(dir_or_file / fname, "tensor '" + name + "' is listed in " + io::path_text(index_path) +
                                              " but missing from this shard");
    }
  }
  return ckpt;
}

const SafetensorsTensor* SafetensorsCheckpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsCheckpoint::read(const SafetensorsTensor& t, std::uint64_t offset, void* dst, std::size_t n) const {
  if (t.file_index >= shards_.size() || offset > t.size || n > t.size - offset) {
    return Status(StatusCode::invalid_argument, "read past the end of tensor '" + t.name + "'");
  }
  return shards_[t.file_index]->file.read_at(dst, n, t.offset + offset);
}

}  // namespace colibri::model
