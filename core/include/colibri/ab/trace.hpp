// Routing traces: which experts the router picked, per request, position and sparse layer. One JSON object per line:
//   {"request": 0, "position": 5, "token": 1234, "layer": 3, "step": 17, "experts": [7, 2], "weights": [0.61, 0.39]}
// "request", "token", "step" and "weights" are optional when reading ("request" defaults to 0). Lines are in access
// order. "step" numbers the engine's forward passes: the records of one step and layer were one access per expert.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::ab {

struct TraceRecord {
  std::int64_t request = 0;
  std::int64_t position = 0;
  std::int64_t token = -1;  // -1: unknown
  std::int64_t layer = 0;
  std::vector<std::int32_t> experts;
  std::vector<float> weights;  // empty: unknown
  std::int64_t step = -1;      // the forward pass; -1: unknown (each record then stands for a pass of its own)
};

// One JSONL line (no newline).
std::string to_jsonl(const TraceRecord& r);

// Reads a JSONL trace; errors name the file, line and field. An empty trace is an error.
sdk::Expected<std::vector<TraceRecord>> read_trace(const std::filesystem::path& path);

// Writes through FILE.partial and a rename, so a failure never leaves a half-written trace.
sdk::Status write_trace(const std::filesystem::path& path, const std::vector<TraceRecord>& records);

// Formats `ab import` understands (see README "Routing traces").
//   csv:  header "layer,expert" plus optional columns request, position, weight, token, step; one routed expert per
//         row; consecutive rows with the same (request, position, layer, step) form one record (rows without
//         position: every row is its own record).
//   json: a JSON array of {"layer": L, "experts": [..]} objects (optional "request", "position", "token", "step",
//         "weights"); positions default to the record's index within its request when absent.
enum class ImportFormat { csv, json };
sdk::Expected<ImportFormat> parse_import_format(const std::string& name);
sdk::Expected<std::vector<TraceRecord>> import_trace(const std::filesystem::path& path, ImportFormat format);

}  // namespace colibri::ab
