#include "colibri/ab/trace.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "colibri/sdk/os_error.hpp"
#include "colibri/util/output_file.hpp"

namespace colibri::ab {

using sdk::Status;
using sdk::StatusCode;

namespace {

Status bad(const std::string& where, const std::string& what) {
  return Status(StatusCode::invalid_argument, where + ": " + what);
}

// Reads an integer field; `required` false leaves `out` alone when the key is absent.
Status get_int(const nlohmann::json& j, const char* key, bool required, std::int64_t min, std::int64_t& out,
               const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) {
    return required ? bad(where, std::string("missing field \"") + key + "\"") : Status{};
  }
  if (!it->is_number_integer() || it->get<std::int64_t>() < min) {
    return bad(where, std::string("field \"") + key + "\" must be an integer >= " + std::to_string(min) + ", got " +
                          it->dump());
  }
  out = it->get<std::int64_t>();
  return {};
}

Status record_from_json(const nlohmann::json& j, TraceRecord& r, const std::string& where) {
  if (!j.is_object()) return bad(where, "expected a JSON object, got " + std::string(j.type_name()));
  if (auto s = get_int(j, "request", false, 0, r.request, where); !s) return s;
  if (auto s = get_int(j, "position", false, 0, r.position, where); !s) return s;
  if (auto s = get_int(j, "token", false, -1, r.token, where); !s) return s;
  if (auto s = get_int(j, "layer", true, 0, r.layer, where); !s) return s;
  if (r.layer > 0xffffffffLL) return bad(where, "field \"layer\" is out of range");
  if (auto s = get_int(j, "step", false, 0, r.step, where); !s) return s;
  auto e = j.find("experts");
  if (e == j.end()) return bad(where, "missing field \"experts\" (a list of expert ids)");
  if (!e->is_array() || e->empty()) return bad(where, "field \"experts\" must be a non-empty list of expert ids");
  r.experts.clear();
  for (const auto& x : *e) {
    if (!x.is_number_integer() || x.get<std::int64_t>() < 0 || x.get<std::int64_t>() > INT32_MAX) {
      return bad(where, "field \"experts\" holds " + x.dump() + ", not an expert id (integer >= 0)");
    }
    // A router picks distinct experts; a repeated id would count one load as two uses.
    if (std::find(r.experts.begin(), r.experts.end(), x.get<std::int32_t>()) != r.experts.end()) {
      return bad(where, "field \"experts\" lists expert " + x.dump() + " twice; a token's experts are distinct");
    }
    r.experts.push_back(x.get<std::int32_t>());
  }
  r.weights.clear();
  if (auto w = j.find("weights"); w != j.end() && !w->is_null()) {
    if (!w->is_array() || w->size() != e->size()) {
      return bad(where, "field \"weights\" must be a list as long as \"experts\" (" + std::to_string(e->size()) + ")");
    }
    for (const auto& x : *w) {
      if (!x.is_number()) return bad(where, "field \"weights\" holds " + x.dump() + ", not a number");
      r.weights.push_back(x.get<float>());
    }
  }
  return {};
}

// One CSV line's cells, spaces around them dropped; a cell may be quoted as spreadsheets write them ("layer",
// "a,b", "say ""hi""").
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (true) {
    while (i < line.size() && line[i] == ' ') ++i;
    std::string cell;
    if (i < line.size() && line[i] == '"') {
      for (++i; i < line.size(); ++i) {
        if (line[i] != '"') {
          cell += line[i];
        } else if (i + 1 < line.size() && line[i + 1] == '"') {
          cell += '"';
          ++i;
        } else {
          ++i;
          break;
        }
      }
      while (i < line.size() && line[i] != ',') ++i;  // spaces (or a stray \r) after the closing quote
    } else {
      const std::size_t comma = line.find(',', i);
      cell = line.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
      while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\r')) cell.pop_back();
      i = comma == std::string::npos ? line.size() : comma;
    }
    out.push_back(std::move(cell));
    if (i >= line.size()) break;
    ++i;  // the comma
  }
  return out;
}

}  // namespace

std::string to_jsonl(const TraceRecord& r) {
  nlohmann::ordered_json j = {{"request", r.request}, {"position", r.position}};
  if (r.token >= 0) j["token"] = r.token;
  j["layer"] = r.layer;
  if (r.step >= 0) j["step"] = r.step;
  j["experts"] = r.experts;
  if (!r.weights.empty()) {
    // Each float as its shortest decimal (0.61, not the double 0.6100000143051147): the same float reads back,
    // and a trace is shorter and what a user wrote in an imported file.
    auto& w = j["weights"] = nlohmann::ordered_json::array();
    for (const float f : r.weights) {
      char buf[32];
      const auto end = std::to_chars(buf, buf + sizeof buf, f).ptr;
      w.push_back(std::strtod(std::string(buf, end).c_str(), nullptr));
    }
  }
  return j.dump();
}

sdk::Expected<std::vector<TraceRecord>> read_trace(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status(StatusCode::invalid_argument,
                  "trace " + path.string() + " is a directory; give a trace file (JSONL)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(StatusCode::not_found, "cannot read trace " + path.string() + ": " + sdk::os_error_text(errno));
  }
  std::vector<TraceRecord> out;
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path.string() + ":" + std::to_string(n);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      // A last line without its newline is a record a recorder was writing when it stopped (a crash, a full disk):
      // the records before it are whole.
      if (in.eof() && !out.empty()) {
        spdlog::warn(
            "{}: the last line is cut short (the recording was interrupted?); the {} records before it are "
            "used",
            where, out.size());
        break;
      }
      return bad(where,
                 "not valid JSON (each line must be one routing record; `colibri-cli ab import` converts "
                 "CSV and JSON arrays)");
    }
    TraceRecord r;
    if (auto s = record_from_json(j, r, where); !s) return s;
    out.push_back(std::move(r));
  }
  if (out.empty()) return bad(path.string(), "the trace holds no routing records");
  return out;
}

Status write_trace(const std::filesystem::path& path, const std::vector<TraceRecord>& records) {
  return util::write_file_atomically(path, [&](std::ostream& f) {
    for (const auto& r : records) f << to_jsonl(r) << '\n';
    return static_cast<bool>(f);
  });
}

sdk::Expected<ImportFormat> parse_import_format(const std::string& name) {
  if (name == "csv") return ImportFormat::csv;
  if (name == "json") return ImportFormat::json;
  return Status(StatusCode::invalid_argument, "--format '" + name + "' is not known; use csv or json");
}

namespace {

sdk::Expected<std::vector<TraceRecord>> import_csv(const std::filesystem::path& path, std::ifstream& in) {
  std::string line;
  std::size_t n = 0;
  std::vector<std::string> header;
  while (header.empty() && std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") != std::string::npos) header = split_csv(line);
  }
  int col_layer = -1, col_expert = -1, col_request = -1, col_position = -1, col_weight = -1, col_token = -1,
      col_step = -1;
  for (std::size_t i = 0; i < header.size(); ++i) {
    const auto& h = header[i];
    int* slot = h == "layer"      ? &col_layer
                : h == "expert"   ? &col_expert
                : h == "request"  ? &col_request
                : h == "position" ? &col_position
                : h == "weight"   ? &col_weight
                : h == "token"    ? &col_token
                : h == "step"     ? &col_step
                                  : nullptr;
    if (slot == nullptr) {
      return bad(path.string() + ":" + std::to_string(n),
                 "unknown column \"" + h + "\" (known: layer, expert, request, position, weight, token, step)");
    }
    if (*slot >= 0) return bad(path.string() + ":" + std::to_string(n), "the column \"" + h + "\" appears twice");
    *slot = static_cast<int>(i);
  }
  if (header.empty()) {
    return bad(path.string(), "the CSV is empty: it needs a header line naming the columns layer and expert");
  }
  if (col_layer < 0 || col_expert < 0) {
    return bad(path.string() + ":" + std::to_string(n), "the header must name the columns layer and expert");
  }
  std::vector<TraceRecord> out;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path.string() + ":" + std::to_string(n);
    const auto cells = split_csv(line);
    if (cells.size() != header.size()) {
      return bad(where, std::to_string(cells.size()) + " columns, the header has " + std::to_string(header.size()));
    }
    auto integer = [&](int col, std::int64_t& v) -> Status {
      try {
        std::size_t used = 0;
        v = std::stoll(cells[static_cast<std::size_t>(col)], &used);
        if (used != cells[static_cast<std::size_t>(col)].size() || v < 0) throw std::invalid_argument("");
      } catch (const std::exception&) {
        return bad(where, "column " + header[static_cast<std::size_t>(col)] + ": '" +
                              cells[static_cast<std::size_t>(col)] + "' is not an integer >= 0");
      }
      return {};
    };
    std::int64_t layer = 0, expert = 0, request = 0, position = -1, token = -1, step = -1;
    if (auto s = integer(col_layer, layer); !s) return s;
    if (auto s = integer(col_expert, expert); !s) return s;
    if (expert > INT32_MAX) return bad(where, "column expert: out of range");
    if (col_request >= 0) {
      if (auto s = integer(col_request, request); !s) return s;
    }
    if (col_position >= 0) {
      if (auto s = integer(col_position, position); !s) return s;
    }
    if (col_token >= 0) {
      if (auto s = integer(col_token, token); !s) return s;
    }
    if (col_step >= 0) {
      if (auto s = integer(col_step, step); !s) return s;
    }
    float weight = 0;
    if (col_weight >= 0) {
      try {
        std::size_t used = 0;
        weight = std::stof(cells[static_cast<std::size_t>(col_weight)], &used);
        // nan and inf are no routing weight, and JSON cannot hold them: the trace written would not read back.
        if (used != cells[static_cast<std::size_t>(col_weight)].size() || !std::isfinite(weight)) {
          throw std::invalid_argument("");
        }
      } catch (const std::exception&) {
        return bad(where,
                   "column weight: '" + cells[static_cast<std::size_t>(col_weight)] + "' is not a finite number");
      }
    }
    const bool joins = position >= 0 && !out.empty() && out.back().request == request &&
                       out.back().position == position && out.back().layer == layer && out.back().step == step;
    if (!joins) {
      TraceRecord r;
      r.request = request;
      r.position = position >= 0 ? position : static_cast<std::int64_t>(out.size());
      r.layer = layer;
      r.token = token;
      r.step = step;
      out.push_back(std::move(r));
    }
    auto& experts = out.back().experts;
    if (std::find(experts.begin(), experts.end(), static_cast<std::int32_t>(expert)) != experts.end()) {
      return bad(where, "expert " + std::to_string(expert) + " is listed twice for layer " + std::to_string(layer) +
                            " of one token; a token's experts are distinct");
    }
    experts.push_back(static_cast<std::int32_t>(expert));
    if (col_weight >= 0) out.back().weights.push_back(weight);
  }
  if (out.empty()) return bad(path.string(), "the CSV holds no rows after its header");
  return out;
}

sdk::Expected<std::vector<TraceRecord>> import_json(const std::filesystem::path& path, std::ifstream& in) {
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded()) return bad(path.string(), "not valid JSON (expected an array of {\"layer\", \"experts\"})");
  if (!doc.is_array()) return bad(path.string(), "expected a JSON array of {\"layer\", \"experts\"} records");
  std::vector<TraceRecord> out;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    TraceRecord r;
    r.position = -1;
    if (auto s = record_from_json(doc[i], r, path.string() + ": record [" + std::to_string(i) + "]"); !s) return s;
    if (r.position < 0) {
      // Without positions, a record per layer per token: a new position starts when the layer does not increase.
      const bool same_request = !out.empty() && out.back().request == r.request;
      r.position = !same_request ? 0 : (r.layer > out.back().layer ? out.back().position : out.back().position + 1);
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) return bad(path.string(), "the array holds no records");
  return out;
}

}  // namespace

sdk::Expected<std::vector<TraceRecord>> import_trace(const std::filesystem::path& path, ImportFormat format) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::not_found, "cannot read " + path.string() + ": " + sdk::os_error_text(errno));
  return format == ImportFormat::csv ? import_csv(path, in) : import_json(path, in);
}

}  // namespace colibri::ab
