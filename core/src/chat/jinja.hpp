// Internal: the Jinja-subset interpreter behind colibri::chat::Template (see colibri/chat/template.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace colibri::chat::jinja {

// A parse or render error; `line` is 1-based in the template source (0 when unknown).
struct Error {
  int line = 0;
  std::string message;
};

struct Value;
class Env;
using Array = std::vector<Value>;

struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, like a JavaScript Map
  [[nodiscard]] const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

using Function = std::function<Value(std::vector<Value>& args, Env& env)>;

struct Value {
  enum class Kind : std::uint8_t {
    undefined,
    null,
    boolean,
    integer,
    floating,
    string,
    array,
    object,
    ns,
    kwargs,
    function
  };
  Kind kind = Kind::undefined;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> arr;
  std::shared_ptr<Object> obj;  // object, namespace and keyword arguments
  std::shared_ptr<Function> fn;

  static Value undefined() { return {}; }
  static Value null() { return make(Kind::null); }
  static Value boolean(bool v) {
    Value r = make(Kind::boolean);
    r.b = v;
    return r;
  }
  static Value integer(std::int64_t v) {
    Value r = make(Kind::integer);
    r.i = v;
    return r;
  }
  static Value floating(double v) {
    Value r = make(Kind::floating);
    r.f = v;
    return r;
  }
  static Value string(std::string v) {
    Value r = make(Kind::string);
    r.s = std::move(v);
    return r;
  }
  static Value array(Array v = {}) {
    Value r = make(Kind::array);
    r.arr = std::make_shared<Array>(std::move(v));
    return r;
  }
  static Value object(Kind kind = Kind::object) {
    Value r = make(kind);
    r.obj = std::make_shared<Object>();
    return r;
  }
  static Value function(Function f) {
    Value r = make(Kind::function);
    r.fn = std::make_shared<Function>(std::move(f));
    return r;
  }
  [[nodiscard]] bool is(Kind k) const { return kind == k; }
  [[nodiscard]] bool is_number() const { return kind == Kind::integer || kind == Kind::floating; }
  [[nodiscard]] double number() const {
    return kind == Kind::integer ? static_cast<double>(i) : kind == Kind::floating ? f : b ? 1 : 0;
  }

 private:
  static Value make(Kind k) {
    Value r;
    r.kind = k;
    return r;
  }
};

class Env {
 public:
  explicit Env(Env* parent = nullptr) : parent_(parent) {}
  void set(const std::string& name, Value v) { vars_[name] = std::move(v); }
  [[nodiscard]] Value lookup(const std::string& name) const {
    for (const Env* e = this; e != nullptr; e = e->parent_) {
      if (auto it = e->vars_.find(name); it != e->vars_.end()) return it->second;
    }
    return Value::undefined();
  }

 private:
  Env* parent_;
  std::map<std::string, Value, std::less<>> vars_;
};

struct Node;
using NodePtr = std::shared_ptr<Node>;

// The parsed template.
struct Program {
  std::vector<NodePtr> body;
};

// Throws Error.
Program parse(std::string_view source);
// Throws Error. `globals` holds messages, bos_token, ... already converted.
std::string render(const Program& program, Env& globals);

std::string to_json(const Value& v, int indent = -1, bool convert_undefined = true);

}  // namespace colibri::chat::jinja
