// JsonSchema::compile: a JSON Schema (the subset JsonSchema names) to the node table JsonConstraint walks.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "colibri/engine/json_constraint.hpp"

namespace colibri::engine {

using json = nlohmann::ordered_json;  // properties keep the order the schema writes them in

namespace {

using Kind = JsonSchema::Kind;

// Keywords that only describe: accepted, not enforced.
const std::set<std::string, std::less<>> kAnnotations = {
    "title",    "description", "default",  "examples",  "format",   "$schema", "$id",
    "$comment", "deprecated",  "readOnly", "writeOnly", "nullable", "strict"};
// Keywords enforced (by the node they build).
const std::set<std::string, std::less<>> kEnforced = {"type",  "properties", "required", "additionalProperties",
                                                      "items", "minItems",   "maxItems", "enum",
                                                      "const", "anyOf",      "oneOf",    "$ref",
                                                      "$defs", "definitions"};

class Compiler {
 public:
  // `skipped`: lenient (compile_lenient) when given; what could not be enforced is listed there instead of refused.
  Compiler(const json& root, std::vector<std::string>* skipped) : root_(root), skipped_(skipped) {}

  // `ref`: the $ref whose target `s` is; an object node claims it before its properties (see object()).
  sdk::Expected<std::uint16_t> node(const json& s, const std::string& path, int depth, const std::string& ref = "") {
    if (depth > 64) return error(path, "nests deeper than 64 levels");
    if (s.is_boolean()) {
      if (s.get<bool>()) return JsonSchema::kAny;
      return error(path, "is false (no value is allowed)");
    }
    if (!s.is_object()) return error(path, "must be an object or a boolean");
    // allOf of one schema beside annotations only is that schema (pydantic wraps a described $ref so).
    if (auto all = s.find("allOf"); all != s.end() && all->is_array() && all->size() == 1 &&
                                    std::all_of(s.items().begin(), s.items().end(), [](const auto& kv) {
                                      return kv.key() == "allOf" || kAnnotations.contains(kv.key());
                                    })) {
      return node((*all)[0], path + ".allOf[0]", depth + 1, ref);
    }
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.contains(key) || kEnforced.contains(key)) continue;
      const std::string at = path + "." + key;
      if (skipped_ != nullptr) {
        skipped_->push_back(place(at));
        continue;
      }
      return error(at,
                   "is not supported (colibri enforces type, properties, required, additionalProperties, items, "
                   "minItems, maxItems, enum, const, anyOf, oneOf and $ref; remove it or use json_object)");
    }
    if (auto ref = s.find("$ref"); ref != s.end()) return reference(*ref, path, depth);
    const auto type = s.find("type");
    const json* literal_type = type == s.end() ? nullptr : &*type;  // enum and const must be of it too
    if (auto e = s.find("enum"); e != s.end()) return literals(*e, literal_type, path + ".enum");
    if (auto c = s.find("const"); c != s.end()) return literals(json::array({*c}), literal_type, path + ".const");
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto alt = s.find(key); alt != s.end()) return any_of(*alt, path + "." + key, depth);
    }
    if (type == s.end()) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        return object(s, path, depth, ref);
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems"))
        return typed(s, "array", path, depth);
      return JsonSchema::kAny;
    }
    if (*type == "object") return object(s, path, depth, ref);
    if (type->is_string()) return typed(s, type->get<std::string>(), path, depth);
    if (!type->is_array() || type->empty()) return error(path + ".type", "must be a type name or a list of them");
    json branches = json::array();
    for (const auto& t : *type) {
      json branch = s;
      branch["type"] = t;
      branches.push_back(std::move(branch));
    }
    return any_of(branches, path + ".type", depth);
  }

  std::vector<JsonSchema::Node> nodes;

 private:
  // Paths are built as ".properties.name"; said without the leading dot.
  static std::string place(const std::string& path) { return path.starts_with('.') ? path.substr(1) : path; }

  sdk::Status error(const std::string& path, const std::string& what) const {
    return sdk::Status(sdk::StatusCode::invalid_argument,
                       "schema" + (path.empty() ? "" : " at '" + place(path) + "'") + ": " + what);
  }

  // A part colibri cannot enforce: refused, or, lenient, any value there (listed in skipped_).
  sdk::Expected<std::uint16_t> unenforced(const std::string& path, const std::string& what) {
    if (skipped_ == nullptr) return error(path, what);
    skipped_->push_back(place(path));
    return JsonSchema::kAny;
  }

  sdk::Expected<std::uint16_t> add(JsonSchema::Node n) {
    if (nodes.size() >= JsonSchema::kMaxNodes) {
      return error("", "is too large (more than " + std::to_string(JsonSchema::kMaxNodes) + " nodes)");
    }
    nodes.push_back(std::move(n));
    return static_cast<std::uint16_t>(nodes.size() - 1);
  }

  sdk::Expected<std::uint16_t> typed(const json& s, const std::string& type, const std::string& path, int depth) {
    JsonSchema::Node n;
    if (type == "object") return object(s, path, depth);
    if (type == "array") {
      n.kind = Kind::array;
      if (auto items = s.find("items"); items != s.end()) {
        auto item = node(*items, path + ".items", depth + 1);
        if (!item) return item.error();
        n.item = *item;
      }
      for (const char* key : {"minItems", "maxItems"}) {
        auto it = s.find(key);
        if (it == s.end()) continue;
        if (!it->is_number_unsigned() || it->get<std::uint64_t>() > 0xFFFFFFFEu) {
          return error(path + "." + key, "must be a non-negative integer");
        }
        (key[1] == 'i' ? n.min_items : n.max_items) = static_cast<std::uint32_t>(it->get<std::uint64_t>());
      }
      if (n.min_items > n.max_items) return error(path + ".minItems", "is larger than maxItems");
      return add(std::move(n));
    }
    if (type == "string")
      n.kind = Kind::string;
    else if (type == "number")
      n.kind = Kind::number;
    else if (type == "integer")
      n.kind = Kind::integer;
    else if (type == "boolean")
      n.kind = Kind::boolean;
    else if (type == "null")
      n.kind = Kind::null;
    else
      return error(path + ".type", "'" + type + "' is not a JSON Schema type");
    return add(std::move(n));
  }

  sdk::Expected<std::uint16_t> object(const json& s, const std::string& path, int depth, const std::string& ref = "") {
    auto props = s.find("properties");
    auto additional = s.find("additionalProperties");
    const bool has_props = props != s.end() && props->is_object() && !props->empty();
    if (props != s.end() && !props->is_object()) return error(path + ".properties", "must be an object");
    if (!has_props) {
      // No listed properties: a map whose values follow additionalProperties (any value when absent or true).
      JsonSchema::Node n;
      n.kind = Kind::map;
      if (additional != s.end()) {
        auto item = node(*additional, path + ".additionalProperties", depth + 1);
        if (!item && additional->is_boolean()) {
          n.kind = Kind::object;  // false: only {}
        } else if (!item) {
          return item.error();
        } else {
          n.item = *item;
        }
      }
      if (auto required = s.find("required"); required != s.end() && required->is_array() && !required->empty()) {
        return error(path + ".required", "names properties the schema does not list");
      }
      return add(std::move(n));
    }
    if (additional != s.end() && !(additional->is_boolean() && !additional->get<bool>())) {
      // Lenient: closed all the same; what is written still conforms, only fewer objects can be.
      if (skipped_ != nullptr) {
        skipped_->push_back(place(path + ".additionalProperties"));
      } else {
        return error(path + ".additionalProperties",
                     "is not supported beside 'properties' (objects with properties are closed: set it to false)");
      }
    }
    if (props->size() > JsonSchema::kMaxProperties) {
      return unenforced(path + ".properties",
                        "lists more than " + std::to_string(JsonSchema::kMaxProperties) + " properties");
    }
    // The node is added before its properties are compiled, so that a property may refer back to it.
    auto id = add(JsonSchema::Node{});
    if (!id) return id;
    if (!ref.empty()) refs_[ref] = *id;
    JsonSchema::Node n;
    n.kind = Kind::object;
    for (const auto& [name, sub] : props->items()) {
      std::string key = json(name).dump();
      if (key.size() > JsonSchema::kMaxLiteralBytes) {
        return error(path + ".properties",
                     "has a property name longer than " + std::to_string(JsonSchema::kMaxLiteralBytes - 2) + " bytes");
      }
      auto value = node(sub, path + ".properties." + name, depth + 1);
      if (!value) return value.error();
      n.keys.push_back(std::move(key));
      n.values.push_back(*value);
    }
    if (auto required = s.find("required"); required != s.end()) {
      if (!required->is_array()) return error(path + ".required", "must be an array of property names");
      for (const auto& r : *required) {
        const std::string key = r.is_string() ? json(r).dump() : "";
        auto at = std::find(n.keys.begin(), n.keys.end(), key);
        if (at == n.keys.end()) {
          return error(path + ".required", r.dump() + " is not one of the object's properties");
        }
        n.required |= std::uint64_t{1} << (at - n.keys.begin());
      }
    }
    nodes[*id] = std::move(n);
    return id;
  }

  // Whether `v` is of the JSON Schema type named `type` (an integer is a number; 2.0 is an integer).
  static bool of_type(const json& v, const json& type) {
    if (type.is_array()) {
      return std::any_of(type.begin(), type.end(), [&](const json& t) { return of_type(v, t); });
    }
    if (!type.is_string()) return true;  // checked where the type itself is read
    const auto& t = type.get_ref<const std::string&>();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    return true;
  }

  // enum or const; with a `type` beside it, a value must be of that type too (JSON Schema asks both), so values of
  // another type are dropped, and a list left empty could never be met.
  sdk::Expected<std::uint16_t> literals(const json& values, const json* type, const std::string& path) {
    if (!values.is_array() || values.empty()) return error(path, "must be a non-empty array");
    JsonSchema::Node n;
    n.kind = Kind::literals;
    for (const auto& v : values) {
      if (type != nullptr && !of_type(v, *type)) continue;
      if (v.is_object() || v.is_array()) {
        return unenforced(path, "holds an object or array (only scalar values are supported)");
      }
      std::string text = v.dump(-1, ' ', false, json::error_handler_t::strict);
      if (text.size() > JsonSchema::kMaxLiteralBytes) {
        return unenforced(path, "holds a value longer than " + std::to_string(JsonSchema::kMaxLiteralBytes) + " bytes");
      }
      if (std::find(n.literals.begin(), n.literals.end(), text) == n.literals.end()) n.literals.push_back(text);
    }
    if (n.literals.empty()) {
      return error(path, "has no value of the type " + type->dump() + " beside it, so no value could ever conform");
    }
    return add(std::move(n));
  }

  // The classes of the first bytes a (constrained) node's values start with.
  std::set<std::uint8_t> classes_of(std::uint16_t id) const {
    std::set<std::uint8_t> classes;
    const auto& n = nodes[id];
    switch (n.kind) {
      case Kind::object:
      case Kind::map: classes.insert(JsonSchema::c_object); break;
      case Kind::array: classes.insert(JsonSchema::c_array); break;
      case Kind::string: classes.insert(JsonSchema::c_string); break;
      case Kind::number:
      case Kind::integer: classes.insert(JsonSchema::c_number); break;
      case Kind::boolean: classes.insert(JsonSchema::c_boolean); break;
      case Kind::null: classes.insert(JsonSchema::c_null); break;
      case Kind::literals:
        for (const auto& l : n.literals) classes.insert(JsonSchema::class_of_byte(static_cast<unsigned char>(l[0])));
        break;
      case Kind::any_of:
        for (std::uint8_t c = 0; c < JsonSchema::kClasses; ++c) {
          if (n.branch[c] != JsonSchema::kAny) classes.insert(c);
        }
        break;
      case Kind::any: break;
    }
    return classes;
  }

  sdk::Expected<std::uint16_t> any_of(const json& branches, const std::string& path, int depth) {
    if (!branches.is_array() || branches.empty()) return error(path, "must be a non-empty array");
    JsonSchema::Node n;
    n.kind = Kind::any_of;
    n.branch.fill(JsonSchema::kAny);
    std::array<bool, JsonSchema::kClasses> taken{};
    for (std::size_t i = 0; i < branches.size(); ++i) {
      const std::string bp = path + "[" + std::to_string(i) + "]";
      auto id = node(branches[i], bp, depth + 1);
      if (!id) return id.error();
      if (*id == JsonSchema::kAny) return JsonSchema::kAny;  // one branch takes anything: so does the union
      for (const std::uint8_t c : classes_of(*id)) {
        if (taken[c]) {
          // integer beside number: number covers both.
          const auto kind = nodes[*id].kind, other = nodes[n.branch[c]].kind;
          if ((kind == Kind::integer && other == Kind::number) || (kind == Kind::number && other == Kind::integer)) {
            if (kind == Kind::number) n.branch[c] = *id;
            continue;
          }
          return unenforced(bp,
                            "starts like an earlier branch (colibri picks a branch by the value's first byte: "
                            "branches must differ in type, e.g. a string or null)");
        }
        taken[c] = true;
        // A branch that is itself a union contributes its own branch for this class.
        n.branch[c] = nodes[*id].kind == Kind::any_of ? nodes[*id].branch[c] : *id;
      }
    }
    return add(std::move(n));
  }

  sdk::Expected<std::uint16_t> reference(const json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return error(path + ".$ref", "must be a string");
    const std::string r = ref.get<std::string>();
    if (auto done = refs_.find(r); done != refs_.end()) return done->second;
    const json* target = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (!r.starts_with(prefix)) continue;
      const std::string name = r.substr(std::string_view(prefix).size());
      const char* section = prefix[2] == '$' ? "$defs" : "definitions";
      if (root_.contains(section) && root_[section].is_object() && root_[section].contains(name)) {
        target = &root_[section][name];
      }
    }
    if (r == "#") target = &root_;
    if (target == nullptr) return error(path + ".$ref", "'" + r + "' is not #, #/$defs/NAME or #/definitions/NAME");
    // A recursive reference resolves to an object node added before its properties (see object()); other
    // recursion (a reference that is its own value) has no value to start with.
    // Named where the loop starts: the place first reached through this reference, not the last hop's.
    if (auto loop = in_progress_.find(r); loop != in_progress_.end()) {
      return error(loop->second, "'" + r + "' refers to itself without an object");
    }
    in_progress_.emplace(r, path + ".$ref");
    auto id = node(*target, path + ".$ref", depth + 1, r);
    in_progress_.erase(r);
    if (!id) return id;
    refs_[r] = *id;
    return id;
  }

  const json& root_;
  std::vector<std::string>* skipped_;
  std::map<std::string, std::uint16_t> refs_;
  std::map<std::string, std::string> in_progress_;  // reference -> where it was first met
};

}  // namespace

namespace {

sdk::Expected<std::shared_ptr<const JsonSchema>> compile_schema(const json& schema, std::vector<std::string>* skipped) {
  Compiler c(schema, skipped);
  auto root = c.node(schema, "", 0);
  if (!root) return root.error();
  if (*root != JsonSchema::kAny && c.nodes[*root].kind != Kind::object && c.nodes[*root].kind != Kind::map) {
    return sdk::Status(sdk::StatusCode::invalid_argument,
                       "schema: the root must be an object (\"type\": \"object\"), as an answer is one JSON object");
  }
  auto out = std::make_shared<JsonSchema>();
  out->nodes = std::move(c.nodes);
  out->root = *root;
  return std::shared_ptr<const JsonSchema>(std::move(out));
}

}  // namespace

sdk::Expected<std::shared_ptr<const JsonSchema>> JsonSchema::compile(const json& schema) {
  return compile_schema(schema, nullptr);
}

sdk::Expected<std::shared_ptr<const JsonSchema>> JsonSchema::compile_lenient(const json& schema,
                                                                             std::vector<std::string>& skipped) {
  skipped.clear();
  return compile_schema(schema, &skipped);
}

sdk::Expected<std::shared_ptr<const JsonSchema>> JsonSchema::compile_tool_call(
    const std::vector<std::pair<std::string, json>>& tools, std::vector<std::string>& skipped,
    std::string_view arguments_key) {
  skipped.clear();
  auto out = std::make_shared<JsonSchema>();
  Node names;
  names.kind = Kind::literals;
  std::vector<std::uint16_t> tagged;
  for (const auto& [name, parameters] : tools) {
    const std::string literal = json(name).dump(-1, ' ', false, json::error_handler_t::replace);
    if (literal.size() > kMaxLiteralBytes) {
      return sdk::Status(sdk::StatusCode::invalid_argument,
                         "a tool's name is longer than " + std::to_string(kMaxLiteralBytes) + " bytes");
    }
    names.literals.push_back(literal);
    // Each tool's parameters compiled on their own ($ref is relative to them), then appended to the one node table.
    std::vector<std::string> skipped_here;
    auto compiled = parameters.is_null() ? compile_schema(json{{"type", "object"}}, nullptr)
                                         : compile_schema(parameters, &skipped_here);
    if (!compiled || (*compiled)->root == kAny) {  // a schema colibri cannot compile, or `{}`: any object
      if (!compiled) skipped.push_back(name + ".parameters (" + compiled.error().message() + ")");
      compiled = compile_schema(json{{"type", "object"}}, nullptr);
      if (!compiled) return compiled.error();
    }
    for (const auto& place : skipped_here) skipped.push_back(name + ".parameters." + place);
    const auto& part = **compiled;
    if (out->nodes.size() + part.nodes.size() + 2 > kMaxNodes) {
      return sdk::Status(sdk::StatusCode::invalid_argument, "the tools' parameters are too large together (more than " +
                                                                std::to_string(kMaxNodes) + " schema nodes)");
    }
    const auto offset = static_cast<std::uint16_t>(out->nodes.size());
    const auto moved = [offset](std::uint16_t id) {
      return id == kAny ? kAny : static_cast<std::uint16_t>(id + offset);
    };
    for (Node n : part.nodes) {
      for (auto& v : n.values) v = moved(v);
      for (auto& b : n.branch) b = moved(b);
      for (auto& t : n.tagged) t = moved(t);
      n.item = moved(n.item);
      out->nodes.push_back(std::move(n));
    }
    tagged.push_back(moved(part.root));
  }
  if (tools.empty()) return sdk::Status(sdk::StatusCode::invalid_argument, "no tools to call");
  out->nodes.push_back(std::move(names));
  Node call;
  call.kind = Kind::object;
  call.keys = {"\"name\"", json(std::string(arguments_key)).dump()};
  call.values = {static_cast<std::uint16_t>(out->nodes.size() - 1), kAny};
  call.required = 0b11;
  call.tagged = std::move(tagged);
  out->nodes.push_back(std::move(call));
  out->root = static_cast<std::uint16_t>(out->nodes.size() - 1);
  return std::shared_ptr<const JsonSchema>(std::move(out));
}

}  // namespace colibri::engine
