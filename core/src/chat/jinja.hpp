// Internal: the Jinja-subset interpreter behind colibri::chat::Template (see colibri/chat/template.hpp).
#pragma once

#include <cstddef>
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

// Limits that keep a hostile template (they come with model files and run on every server request) from crashing
// or hanging the process. Real chat templates stay far below each of them.
inline constexpr int kMaxNesting = 256;            // parser recursion and syntax-tree depth
inline constexpr int kMaxEvalDepth = 512;          // nested evaluations at render time (macro recursion included)
inline constexpr int kMaxValueDepth = 256;         // nesting of lists/dicts (input JSON, literals, tojson)
inline constexpr std::size_t kMaxItems = 1000000;  // items in one list
inline constexpr std::size_t kMaxOutputBytes = 16u << 20;  // any string, the rendered prompt included
inline constexpr std::uint64_t kMaxSteps = 10000000;       // evaluations, loop iterations and copied items
inline constexpr int kMaxIndent = 1024;                    // |indent and |tojson(indent=...) widths

struct Value;
class Env;
using Array = std::vector<Value>;

struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, like a JavaScript Map
  int depth = 1;                                     // max nesting() of items + 1 (only grows)
  [[nodiscard]] const Value* find(std::string_view key) const;
  // Throws Error when the dict would be too deeply nested.
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
  bool b = false;           // booleans; a string: Markup (|safe, |e); a tuple: a groupby (grouper, list) pair
  bool tuple = false;       // a list made as a tuple (x, y) or by items(): prints as Python prints a tuple
  std::uint16_t depth = 0;  // lists and functions: nesting of the (immutable) contents; see nesting()
  std::int64_t i = 0;
  double f = 0;
  std::string s;  // strings; for undefined, why it is undefined (Jinja raises that when it is used)
  std::shared_ptr<Array> arr;
  std::shared_ptr<Object> obj;  // object, namespace and keyword arguments
  std::shared_ptr<Function> fn;

  static Value undefined() { return {}; }
  static Value undefined(std::string why) {
    Value r;
    r.s = std::move(why);
    return r;
  }
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
  // Throws Error when the list is too long or too deeply nested.
  static Value array(Array v = {});
  static Value make_tuple(Array v) {
    Value r = array(std::move(v));
    r.tuple = true;
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
  // Depth of nested immutable containers below and including this value. A namespace counts as a leaf: it is the
  // only mutable container, so it is kept alive until the end of the render (see render()) and never destroyed
  // through a chain, and printing guards its own depth.
  [[nodiscard]] int nesting() const;
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
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
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
// Throws Error. `globals` holds messages, bos_token, ... already converted. Enforces the limits above.
std::string render(const Program& program, Env& globals);

// Steps the last render on this thread used (for tests that check real templates stay far below kMaxSteps).
std::uint64_t last_render_steps();
// For builtins: counts `steps` against the budget of the render running on this thread (throws Error when spent).
void charge(std::uint64_t steps);
// A new namespace object, kept alive until the end of the render running on this thread, then emptied (this
// breaks the cycles `{% set ns.self = ns %}` can make).
Value make_namespace();

// Python's json.dumps (indent -1: on one line).
std::string to_json(const Value& v, int indent = -1);
// Python's str() and repr() of a value (True, None, [1, 'a'], {'k': 2.0}), as Jinja prints it.
std::string py_str(const Value& v);
std::string py_repr(const Value& v);

}  // namespace colibri::chat::jinja
