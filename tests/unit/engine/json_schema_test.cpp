// JSON Schema mode: the compiled schema keeps the text a prefix of an object the schema accepts, refusing the first
// byte that would leave it; keywords it cannot enforce are refused by name (compile_lenient: listed, the rest kept).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "colibri/engine/json_constraint.hpp"
#include "unit/engine/json_feed.hpp"

namespace colibri::engine {
namespace {

using nlohmann::json;
using Kind = JsonSchema::Kind;

std::shared_ptr<const JsonSchema> compiled(const std::string& schema) {
  auto s = JsonSchema::compile(nlohmann::ordered_json::parse(schema));
  EXPECT_TRUE(s.has_value()) << (s ? "" : s.error().message());
  return s ? *s : nullptr;
}

using testing::accepted_prefix;

const char* const kPerson = R"({
  "type": "object", "title": "Person",
  "properties": {
    "name": {"type": "string", "description": "full name"},
    "age": {"type": "integer"},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"enum": ["a", "ab", 1, 12, true, null]}, "maxItems": 2},
    "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "home": {"$ref": "#/$defs/Address"},
    "extra": {"type": "object", "additionalProperties": {"type": "boolean"}},
    "kind": {"const": "person"}
  },
  "required": ["name", "age"],
  "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
})";

TEST(JsonSchema, AcceptsObjectsTheSchemaAccepts) {
  auto schema = compiled(kPerson);
  ASSERT_TRUE(schema);
  const std::vector<std::string> valid = {
      R"({"name": "Ada", "age": 36})",
      R"({"name":"","age":-3,"kind":"person"})",  // optional properties may be skipped
      R"({"name": "A", "age": 1, "score": -1.5e3, "tags": ["ab", 12], "nick": null, "home": {"city": "Oslo"}})",
      R"({"name": "A", "age": 1, "tags": [1, "a"], "nick": "x", "extra": {"k": true, "j": false}, "kind": "person"})",
      R"({"name": "A", "age": 1, "tags": [], "extra": {}})",
      R"({"name": "A", "age": 1, "tags": [true, null]})",
  };
  for (const auto& text : valid) {
    JsonConstraint c(schema.get());
    EXPECT_EQ(accepted_prefix(text, c), text.size()) << text;
    EXPECT_TRUE(c.complete()) << text;
  }
}

TEST(JsonSchema, RefusesTheFirstByteThatLeavesTheSchema) {
  auto schema = compiled(kPerson);
  ASSERT_TRUE(schema);
  // text, how many bytes are valid
  const std::vector<std::pair<std::string, std::size_t>> invalid = {
      {R"({"nam3": "A"})", 5},                                     // not a property
      {R"({"name": "A", "name": "B"})", 15},                       // written twice, and "age" (required) comes next
      {R"({"name": "A"})", 12},                                    // '}' before the required "age"
      {R"({"name": 5})", 9},                                       // a string expected
      {R"({"name": "A", "age": 1.5})", 22},                        // an integer has no fraction
      {R"({"name": "A", "age": 1e3})", 22},                        // nor an exponent
      {R"({"name": "A", "age": 1, "tags": ["b"]})", 34},           // not in the enum
      {R"({"name": "A", "age": 1, "tags": [123]})", 35},           // 12 is, 123 is not
      {R"({"name": "A", "age": 1, "tags": ["a", 1, true]})", 39},  // maxItems 2: no third item
      {R"({"name": "A", "age": 1, "nick": 3})", 32},               // string or null only
      {R"({"name": "A", "age": 1, "home": {}})", 33},              // the address needs its city
      {R"({"name": "A", "age": 1, "extra": {"k": 1}})", 39},       // map values are booleans
      {R"({"name": "A", "age": 1, "kind": "people"})", 35},        // the const: "peo" is not "per"
      // The schema's order, as OpenAI's structured outputs write it: no key before an earlier required one, none
      // after a later one.
      {R"({"age": 1, "name": "A"})", 2},
      {R"({"name": "A", "age": 1, "kind": "person", "tags": []})", 40},
      {R"({"name": "A", "age": 1, "score": 1, "tags": [], "nick": null, "home": {"city": ""}, "extra": {}, "kind": "person", )",
       113},  // nothing is left to add
  };
  for (const auto& [text, good] : invalid) {
    JsonConstraint c(schema.get());
    EXPECT_EQ(accepted_prefix(text, c), good) << text;
  }
}

TEST(JsonSchema, UnsupportedKeywordsAndBadSchemasAreRefusedByPlace) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"type": "object", "properties": {"name": {"type": "string", "pattern": "^a"}}})", "properties.name.pattern"},
      {R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})", "properties.n.minimum"},
      {R"({"allOf": [{"type": "object"}, {"required": []}]})", "allOf"},
      {R"({"type": "object", "allOf": [{"type": "object"}]})", "allOf"},  // beside an enforced keyword
      {R"({"type": "array", "items": {"type": "string"}})", "root must be an object"},
      {R"({"type": "object", "properties": {"v": {"anyOf": [{"type": "string"}, {"enum": ["x"]}]}}})",
       "properties.v.anyOf[1]"},
      {R"({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]})", "required"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}})", "properties.a.$ref"},
      // A reference loop without an object is named where it starts, not at its last hop ($ref.$ref).
      {R"({"$ref": "#"})", "at '$ref': '#' refers to itself"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"$ref": "#/$defs/B"},
          "B": {"$ref": "#/$defs/A"}}})",
       "at 'properties.a.$ref': '#/$defs/A' refers to itself"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}})",
       "properties.a.minItems"},
      {R"({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true})",
       "additionalProperties"},
      {R"({"type": "object", "properties": {"a": {"type": "date"}}})", "properties.a.type"},
      {R"({"type": "object", "properties": {"a": false}})", "properties.a"},
      // enum and const beside a type they contradict could never be met.
      {R"({"type": "object", "properties": {"a": {"type": "integer", "enum": ["x"]}}})",
       "properties.a.enum': has no value of the type \"integer\""},
      {R"({"type": "object", "properties": {"a": {"type": ["string", "null"], "const": 3}}})", "properties.a.const"},
  };
  for (const auto& [schema, place] : bad) {
    auto s = JsonSchema::compile(json::parse(schema));
    ASSERT_FALSE(s.has_value()) << schema;
    EXPECT_NE(s.error().message().find(place), std::string::npos) << schema << " -> " << s.error().message();
  }
  // integer beside number is number; a type list is a union; annotations are fine.
  auto ok = JsonSchema::compile(json::parse(R"({"type": "object", "properties": {
      "n": {"anyOf": [{"type": "integer"}, {"type": "number"}]}, "t": {"type": ["string", "null"], "format": "date"}}})"));
  ASSERT_TRUE(ok.has_value()) << ok.error().message();
  JsonConstraint c(ok->get());
  EXPECT_TRUE(c.advance(R"({"n": 2.5, "t": null})"));
  EXPECT_TRUE(c.complete());
  // An enum's values of another type than the one beside it are not allowed (an instance must meet both).
  auto mixed = JsonSchema::compile(
      json::parse(R"({"type": "object", "properties": {"a": {"type": "integer", "enum": ["1", 1, 2.0, 2.5]}}})"));
  ASSERT_TRUE(mixed.has_value()) << mixed.error().message();
  for (const auto& [text, fits] : std::vector<std::pair<std::string, bool>>{
           {R"({"a": 1})", true}, {R"({"a": 2.0})", true}, {R"({"a": "1"})", false}, {R"({"a": 2.5})", false}}) {
    JsonConstraint m(mixed->get());
    EXPECT_EQ(m.advance(text) && m.complete(), fits) << text;
  }
}

TEST(JsonSchema, AllOfOneSchemaBesideAnnotationsIsThatSchema) {
  // pydantic writes a described reference as {"allOf": [{"$ref": ...}], "description": ...}.
  auto schema = compiled(R"({"type": "object", "properties": {"p": {"allOf": [{"$ref": "#/$defs/P"}],
      "description": "a point"}}, "required": ["p"], "$defs": {"P": {"type": "object",
      "properties": {"x": {"type": "integer"}}, "required": ["x"]}}})");
  ASSERT_TRUE(schema);
  for (const auto& [text, fits] : std::vector<std::pair<std::string, bool>>{
           {R"({"p": {"x": 1}})", true}, {R"({"p": {"x": "1"}})", false}, {R"({"p": {}})", false}}) {
    JsonConstraint c(schema.get());
    EXPECT_EQ(c.advance(text) && c.complete(), fits) << text;
  }
}

TEST(JsonSchema, LenientCompileKeepsWhatItCanEnforceAndNamesTheRest) {
  // A forced tool call's parameters: the keywords colibri cannot enforce are listed, the rest still holds.
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "pattern": "^[A-Z]", "minLength": 2},
      "days": {"type": "integer", "minimum": 1},
      "when": {"anyOf": [{"type": "string"}, {"type": "string", "format": "date"}]},
      "tags": {"type": "array", "items": {"enum": [{"a": 1}]}}},
    "required": ["city", "days"], "additionalProperties": true})");
  EXPECT_FALSE(JsonSchema::compile(schema).has_value());
  std::vector<std::string> skipped{"left from before"};
  auto lenient = JsonSchema::compile_lenient(schema, skipped);
  ASSERT_TRUE(lenient.has_value()) << lenient.error().message();
  EXPECT_EQ(skipped, (std::vector<std::string>{"additionalProperties", "properties.city.pattern",
                                               "properties.city.minLength", "properties.days.minimum",
                                               "properties.when.anyOf[1]", "properties.tags.items.enum"}));
  for (const auto& [text, fits] : std::vector<std::pair<std::string, bool>>{
           {R"({"city": "oslo", "days": 3})", true},                                 // the pattern is not enforced
           {R"({"city": "Oslo", "days": 3, "when": 7, "tags": [{"b": 2}]})", true},  // any value where not enforced
           {R"({"city": "Oslo"})", false},                                           // required still holds
           {R"({"city": "Oslo", "days": "3"})", false},                              // and the types
           {R"({"city": "Oslo", "days": 3, "extra": 1})", false}}) {                 // the object stays closed
    JsonConstraint c(lenient->get());
    EXPECT_EQ(c.advance(text) && c.complete(), fits) << text;
  }
  // A schema that is wrong stays an error: there is no shape to keep.
  for (const char* wrong : {R"({"type": "object", "properties": {"a": {"type": "date"}}})",
                            R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})"}) {
    EXPECT_FALSE(JsonSchema::compile_lenient(nlohmann::ordered_json::parse(wrong), skipped).has_value()) << wrong;
  }
}

TEST(JsonSchema, RecursiveReferences) {
  auto schema = compiled(R"({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
      "required": ["v"]}}})");
  ASSERT_TRUE(schema);
  JsonConstraint c(schema.get());
  const std::string tree = R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})";
  EXPECT_EQ(accepted_prefix(tree, c), tree.size());
  EXPECT_TRUE(c.complete());
  JsonConstraint d(schema.get());
  EXPECT_FALSE(d.advance(R"({"v": 1, "kids": [{"w")"));
}

// Whether `v` conforms to node `id` of `s`: the schema's meaning, checked on parsed JSON.
bool conforms(const JsonSchema& s, const json& v, std::uint16_t id) {
  if (id == JsonSchema::kAny) return true;
  const auto& n = s.nodes[id];
  switch (n.kind) {
    case Kind::any: return true;
    case Kind::string: return v.is_string();
    case Kind::number: return v.is_number();
    case Kind::integer:  // beyond 64 bits nlohmann reads a double
      return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    case Kind::boolean: return v.is_boolean();
    case Kind::null: return v.is_null();
    case Kind::literals: return std::find(n.literals.begin(), n.literals.end(), v.dump()) != n.literals.end();
    case Kind::array:
      if (!v.is_array() || v.size() < n.min_items || v.size() > n.max_items) return false;
      return std::all_of(v.begin(), v.end(), [&](const json& x) { return conforms(s, x, n.item); });
    case Kind::map:
      if (!v.is_object()) return false;
      return std::all_of(v.begin(), v.end(), [&](const json& x) { return conforms(s, x, n.item); });
    case Kind::object: {
      if (!v.is_object()) return false;
      for (std::size_t i = 0; i < n.keys.size(); ++i) {
        const std::string key = json::parse(n.keys[i]).get<std::string>();
        if (!v.contains(key)) {
          if (n.required >> i & 1) return false;
        } else if (!conforms(s, v[key], n.values[i])) {
          return false;
        }
      }
      for (const auto& [key, x] : v.items()) {
        if (std::find(n.keys.begin(), n.keys.end(), json(key).dump()) == n.keys.end()) return false;
      }
      return true;
    }
    case Kind::any_of:
      return std::any_of(n.branch.begin(), n.branch.end(),
                         [&](std::uint16_t b) { return b != JsonSchema::kAny && conforms(s, v, b); });
  }
  return false;
}

// A random walk over bytes the constraint accepts, steered to finish: every object it completes conforms (and no
// prefix is a dead end), so a model in schema mode can only write what the schema accepts.
TEST(JsonSchema, EveryCompletedRandomWalkConforms) {
  auto schema = compiled(kPerson);
  ASSERT_TRUE(schema);
  const std::string alphabet = "{}[]\",: 0123456789-.eabcdefghijklmnopqrstuvwxyz";
  std::mt19937 rng(99);
  int completed = 0;
  for (int walk = 0; walk < 1000; ++walk) {
    JsonConstraint c(schema.get());
    std::string text;
    for (int step = 0; step < 600 && !c.complete(); ++step) {
      std::vector<char> options;
      for (const char ch : alphabet) {
        if (c.accepts(std::string(1, ch))) options.push_back(ch);
      }
      ASSERT_FALSE(options.empty()) << "a dead end after " << text;
      char pick = options[rng() % options.size()];
      if (step > 150) {
        for (const char ch : {'"', '}', ']', '0', ',', ':'}) {
          if (c.accepts(std::string(1, ch)) && rng() % 2 == 0) pick = ch;
        }
      }
      ASSERT_TRUE(c.advance(std::string(1, pick)));
      text += pick;
    }
    if (!c.complete()) continue;
    ++completed;
    json j;
    ASSERT_NO_THROW(j = json::parse(text)) << text;
    EXPECT_TRUE(conforms(*schema, j, schema->root)) << text;
  }
  EXPECT_GT(completed, 250);
}

}  // namespace
}  // namespace colibri::engine
