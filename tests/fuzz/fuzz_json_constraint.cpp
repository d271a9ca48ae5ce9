// JSON mode's byte automaton (the API's response_format) with an optional JSON Schema from the request. Input: a
// byte (bit 0: with a schema), the schema's text up to a 0 byte, then bytes offered one at a time, the way sampling
// offers tokens. Properties: accepts() and advance() agree; the automaton never reaches a state where no byte is
// accepted before the object is complete (sampling would have no token left); a complete text is a JSON object that
// the schema accepts; plain text is accepted inside a string, as JsonTokenMask assumes.
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "colibri/engine/json_constraint.hpp"
#include "fuzz_common.hpp"

namespace {
using nlohmann::json;

const json* resolve(const json& root, const json& schema) {
  if (!schema.is_object() || !schema.contains("$ref")) return &schema;
  const std::string ref = schema["$ref"].get<std::string>();
  for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
    const std::string p = prefix;
    if (ref.rfind(p, 0) == 0) {
      const std::string section = p.substr(2, p.size() - 3);
      return &root.at(section).at(ref.substr(p.size()));
    }
  }
  return nullptr;
}

bool type_matches(const std::string& type, const json& v) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  // JSON Schema's integer is any number without a fraction: 20 digits still are one, though they parse as a double.
  if (type == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return false;
}

// The keywords JsonSchema enforces, checked on a parsed value (depth-bounded as the schema's $ref may recurse).
bool validates(const json& root, const json& schema_in, const json& v, int depth = 0) {
  if (depth > 200) return true;
  const json* s = resolve(root, schema_in);
  if (s == nullptr) return false;
  if (s->is_boolean()) return s->get<bool>();
  if (!s->is_object()) return true;
  if (s->contains("type")) {
    const json& t = (*s)["type"];
    bool any = false;
    if (t.is_string()) any = type_matches(t.get<std::string>(), v);
    if (t.is_array()) {
      for (const auto& one : t) any = any || (one.is_string() && type_matches(one.get<std::string>(), v));
    }
    if (!any) return false;
  }
  if (s->contains("enum")) {
    bool found = false;
    for (const auto& e : (*s)["enum"]) found = found || e == v;
    if (!found) return false;
  }
  if (s->contains("const") && (*s)["const"] != v) return false;
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s->contains(key)) continue;
    bool found = false;
    for (const auto& branch : (*s)[key]) found = found || validates(root, branch, v, depth + 1);
    if (!found) return false;
  }
  if (v.is_object()) {
    const json* props = s->contains("properties") ? &(*s)["properties"] : nullptr;
    if (props != nullptr && props->is_object() && !props->empty()) {
      for (const auto& [k, value] : v.items()) {
        if (!props->contains(k)) return false;
        if (!validates(root, (*props)[k], value, depth + 1)) return false;
      }
    } else if (s->contains("additionalProperties") && (*s)["additionalProperties"].is_object()) {
      for (const auto& [k, value] : v.items()) {
        if (!validates(root, (*s)["additionalProperties"], value, depth + 1)) return false;
      }
    }
    if (s->contains("required")) {
      for (const auto& r : (*s)["required"]) {
        if (r.is_string() && !v.contains(r.get<std::string>())) return false;
      }
    }
  }
  if (v.is_array()) {
    if (s->contains("items")) {
      for (const auto& item : v) {
        if (!validates(root, (*s)["items"], item, depth + 1)) return false;
      }
    }
    if (s->contains("minItems") && v.size() < (*s)["minItems"].get<std::size_t>()) return false;
    if (s->contains("maxItems") && v.size() > (*s)["maxItems"].get<std::size_t>()) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using colibri::engine::JsonConstraint;
  using colibri::engine::JsonSchema;
  colibri::fuzz::Input in(data, size);
  const std::uint8_t mode = in.byte();
  const bool with_schema = (mode & 1) != 0, lenient = (mode & 2) != 0;
  json schema_json;
  std::shared_ptr<const JsonSchema> schema;
  std::vector<std::string> skipped;  // lenient: what is not enforced, so not checked at the end
  if (with_schema) {
    schema_json = json::parse(in.until(std::string_view("\0", 1)), nullptr, /*allow_exceptions=*/false);
    if (schema_json.is_discarded()) return 0;
    auto compiled = lenient ? JsonSchema::compile_lenient(schema_json, skipped) : JsonSchema::compile(schema_json);
    if (!compiled) return 0;
    schema = *compiled;
  }
  JsonConstraint constraint(schema.get());
  std::string text;
  for (const char c : in.rest()) {
    const std::string_view byte(&c, 1);
    const bool accepted = constraint.accepts(byte);
    FUZZ_CHECK(accepted == constraint.advance(byte), "accepts() and advance() disagree after: " + text);
    if (!accepted) continue;
    text += c;
    if (constraint.complete()) break;
    if (constraint.in_plain_string()) {
      for (const char* plain : {"a", " ", "\xc3\xa9", "\xe6\x97\xa5\xf0\x9f\x98\x80"}) {
        FUZZ_CHECK(constraint.accepts(plain), "plain text refused in a string after: " + text);
      }
    }
    bool any = false;
    for (int b = 0; b < 256 && !any; ++b) any = constraint.accepts_byte(static_cast<unsigned char>(b));
    FUZZ_CHECK(any, "no byte can follow: " + text);
  }
  if (!constraint.complete()) return 0;
  const json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(!value.is_discarded() && value.is_object(), "a complete text is no JSON object: " + text);
  if (!schema || !skipped.empty()) return 0;
  bool valid = true;
  try {
    valid = validates(schema_json, schema_json, value);
  } catch (const json::exception&) {  // this checker's own limits (a schema it reads differently), not a finding
  }
  FUZZ_CHECK(valid, "the schema refuses a complete text: " + text);
  return 0;
}
