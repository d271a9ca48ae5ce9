// Chat templates render exactly as Python Jinja2 does under transformers: golden files from
// tests/reference/template_reference.py.
#include "colibri/chat/template.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "chat/jinja.hpp"
#include "unit/tokenizer/test_paths.hpp"

namespace colibri::chat {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

fs::path chat_data() {
  return test::source_dir() / "tests/data/chat";
}

ojson case_by_name(const std::string& name) {
  const ojson all = ojson::parse(test::read_text(chat_data() / "conversations.json"));
  for (const auto& c : all["cases"]) {
    if (c["name"] == name) return c;
  }
  return nullptr;
}

std::vector<std::string> golden_templates() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(chat_data() / "golden")) {
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class GoldenTemplate : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTemplate, RendersLikeTheReference) {
  const ojson meta = ojson::parse(test::read_text(chat_data() / "golden" / (GetParam() + ".json")));
  auto tmpl = Template::parse(meta["source"].get<std::string>(), GetParam());
  ASSERT_TRUE(tmpl.has_value()) << tmpl.error().to_string();
  std::istringstream golden(test::read_text(chat_data() / "golden" / (GetParam() + ".jsonl")));
  int checked = 0;
  std::uint64_t max_steps = 0;
  for (std::string line; std::getline(golden, line);) {
    if (line.empty()) continue;
    const ojson expected = ojson::parse(line);
    const ojson c = case_by_name(expected["case"].get<std::string>());
    ASSERT_FALSE(c.is_null()) << "unknown case " << expected["case"];
    RenderOptions options;
    options.add_generation_prompt = c.value("add_generation_prompt", false);
    options.bos_token = meta["bos"].get<std::string>();
    options.eos_token = meta["eos"].get<std::string>();
    if (c.contains("tools")) options.tools = c["tools"];
    if (c.contains("extra")) options.extra = c["extra"];
    auto out = tmpl->render(c["messages"], options);
    max_steps = std::max(max_steps, jinja::last_render_steps());
    if (expected.contains("error")) {
      EXPECT_FALSE(out.has_value()) << "case " << expected["case"] << " should fail like the reference ("
                                    << expected["error"] << ") but rendered:\n"
                                    << (out ? *out : "");
    } else {
      ASSERT_TRUE(out.has_value()) << "case " << expected["case"] << ": " << out.error().to_string();
      EXPECT_EQ(*out, expected["output"].get<std::string>()) << "case " << expected["case"];
    }
    ++checked;
  }
  EXPECT_GT(checked, 10);
  // Real templates stay far below the step budget that stops runaway loops.
  EXPECT_LT(max_steps, jinja::kMaxSteps / 1000) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(All, GoldenTemplate, ::testing::ValuesIn(golden_templates()), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

// The semantics one at a time (printing, equality, undefined, tests, filters, methods, loops, whitespace), each
// against what Python Jinja2 rendered: tests/data/chat/jinja_cases.json and its .golden.jsonl.
TEST(JinjaCases, RenderAsPythonJinja2) {
  const ojson cases = ojson::parse(test::read_text(chat_data() / "jinja_cases.json"))["cases"];
  std::istringstream golden(test::read_text(chat_data() / "jinja_cases.golden.jsonl"));
  std::size_t checked = 0;
  for (std::string line; std::getline(golden, line);) {
    if (line.empty()) continue;
    const ojson expected = ojson::parse(line);
    ASSERT_LT(checked, cases.size());
    const ojson& c = cases[checked++];
    ASSERT_EQ(c["name"], expected["case"]) << "jinja_cases.golden.jsonl is stale: run template_reference.py golden";
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["template"].get<std::string>());
    ojson context = c.value("context", ojson::object());
    const ojson messages = context.contains("messages") ? context["messages"] : ojson::array();
    context.erase("messages");
    RenderOptions options;
    options.extra = context;
    auto tmpl = Template::parse(c["template"].get<std::string>(), c["name"].get<std::string>());
    auto out = tmpl ? tmpl->render(messages, options) : sdk::Expected<std::string>(tmpl.error());
    if (expected.contains("error")) {
      EXPECT_FALSE(out.has_value()) << "Python Jinja2 raised " << expected["error"] << "; colibri rendered "
                                    << (out ? *out : "");
      if (!out && c.contains("colibri_error")) {  // the failure it should be, not another one
        EXPECT_NE(out.error().message().find(c["colibri_error"].get<std::string>()), std::string::npos)
            << out.error().message();
      }
    } else {
      EXPECT_EQ(out ? *out : out.error().to_string(), expected["output"].get<std::string>());
    }
  }
  EXPECT_EQ(checked, cases.size());
}

TEST(BuiltinTemplates, MatchTheirTestDataCopies) {
  for (const std::string family : {"llama2", "mistral", "gpt-oss", "chatml"}) {
    auto builtin = builtin_template(family);
    ASSERT_TRUE(builtin.has_value()) << family;
    EXPECT_EQ(std::string(*builtin), test::read_text(chat_data() / "builtin" / (family + ".jinja"))) << family;
  }
  EXPECT_FALSE(builtin_template("no-such-family").has_value());
}

// Llama 2's and Mistral's formats put the system message inside the first user turn: alone it would render nothing of
// it (the model then answers a bare BOS), so the built-ins refuse it; with a user turn it is there.
TEST(BuiltinTemplates, ASystemMessageAloneIsRefusedNotDropped) {
  for (const std::string family : {"llama2", "mistral"}) {
    auto t = Template::parse(std::string(*builtin_template(family)), "built-in " + family);
    ASSERT_TRUE(t.has_value()) << family;
    RenderOptions o;
    o.bos_token = "<s>";
    o.eos_token = "</s>";
    o.add_generation_prompt = true;
    auto alone = t->render(ojson::parse(R"([{"role": "system", "content": "be brief"}])"), o);
    ASSERT_FALSE(alone.has_value()) << family << ": " << *alone;
    EXPECT_NE(alone.error().message().find("add a user message after it"), std::string::npos) << family;
    auto with_user =
        t->render(ojson::parse(R"([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])"), o);
    ASSERT_TRUE(with_user.has_value()) << family;
    EXPECT_NE(with_user->find("be brief"), std::string::npos) << family;
  }
}

// The built-in Mistral format joins every system (and developer) message into the first user turn, and says what
// it cannot show (tool calls and results) or what order it needs, instead of "cannot apply '+' to none".
TEST(BuiltinTemplates, MistralJoinsSystemMessagesAndNamesWhatItCannotShow) {
  auto t = Template::parse(std::string(*builtin_template("mistral")), "built-in mistral");
  ASSERT_TRUE(t.has_value());
  RenderOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  auto two = t->render(ojson::parse(R"([{"role": "system", "content": "a"}, {"role": "developer", "content": "b"},
      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "system", "content": "c"},
      {"role": "user", "content": "q"}])"),
                       o);
  ASSERT_TRUE(two.has_value()) << two.error().message();
  EXPECT_EQ(*two, "<s>[INST] a\n\nb\n\nc\n\nhi [/INST]yo</s>[INST] q [/INST]");
  auto tools = t->render(ojson::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": null,
      "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "a", "content": "1"}])"),
                         o);
  ASSERT_FALSE(tools.has_value());
  EXPECT_NE(tools.error().message().find("no tool calls or tool results"), std::string::npos)
      << tools.error().message();
  auto order = t->render(ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"), o);
  ASSERT_FALSE(order.has_value());
  EXPECT_NE(order.error().message().find("message 2 of the conversation without them is user"), std::string::npos)
      << order.error().message();
  // An assistant turn with null content and no calls is an empty answer, not an error.
  auto empty = t->render(ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": null},
      {"role": "user", "content": "b"}])"),
                         o);
  ASSERT_TRUE(empty.has_value()) << empty.error().message();
  EXPECT_EQ(*empty, "<s>[INST] a [/INST]</s>[INST] b [/INST]");
}

TEST(TemplateErrors, UnsupportedStatementNamesConstructAndLine) {
  auto t = Template::parse("Hello\n{% if x %}\n{% include 'other.j2' %}\n{% endif %}");
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message().find("line 3"), std::string::npos) << t.error().message();
  EXPECT_NE(t.error().message().find("include"), std::string::npos) << t.error().message();
}

TEST(TemplateErrors, UnclosedBlocksAndBadSyntax) {
  for (const char* src : {"{% for m in messages %}x", "{{ 'abc }}", "{% if %}{% endif %}", "{{ a | }}", "{# never",
                          "{{ messages[ }}", "{% set %}", "{{ 1 +* 2 }}"}) {
    auto t = Template::parse(src);
    EXPECT_FALSE(t.has_value()) << src;
  }
}

TEST(TemplateErrors, UnsupportedFilterAtRenderTime) {
  auto t = Template::parse("{{ messages | urlize }}");
  ASSERT_TRUE(t.has_value());
  auto out = t->render(ojson::array(), {});
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.error().message().find("urlize"), std::string::npos) << out.error().message();
}

TEST(TemplateErrors, RaiseExceptionCarriesTheMessage) {
  auto t = Template::parse("{{ raise_exception('roles must alternate') }}");
  ASSERT_TRUE(t.has_value());
  auto out = t->render(ojson::array(), {});
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.error().message().find("roles must alternate"), std::string::npos);
}

TEST(TemplateErrors, MessagesMustBeAnArray) {
  auto t = Template::parse("x");
  ASSERT_TRUE(t.has_value());
  EXPECT_FALSE(t->render(ojson::object(), {}).has_value());
}

TEST(TemplateBasics, LoopControlScopingAndFilters) {
  auto t = Template::parse(
      "{%- set ns = namespace(n=0) -%}{%- for m in messages if m.role != 'skip' -%}{%- if loop.index > 3 %}{% break "
      "%}{% endif -%}{%- set ns.n = ns.n + 1 -%}[{{ loop.index0 }}:{{ m.content | upper }}]{%- else -%}none{%- endfor "
      "-%} n={{ ns.n }} {{ [3, 1, 2] | sort | join(',') }} {{ 'a,b' .split(',') | length }} {{ {'k': 1} | tojson }}");
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  ojson msgs = ojson::parse(R"([{"role":"a","content":"x"},{"role":"skip","content":"y"},{"role":"b","content":"z"}])");
  auto out = t->render(msgs, {});
  ASSERT_TRUE(out.has_value()) << out.error().to_string();
  EXPECT_EQ(*out, "[0:X][1:Z]n=2 1,2,3 2 {\"k\": 1}");  // -%} ate the space
}

// ---- hostile templates (model files are untrusted): each fails with a message naming the problem and the line ----

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

const ojson& two_messages() {
  static const ojson m = ojson::parse(R"([{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"}])");
  return m;
}

// The parse or render error, or "rendered: <output>".
std::string outcome(const std::string& src, const ojson& messages = two_messages()) {
  auto t = Template::parse(src, "t");
  if (!t) return t.error().message();
  auto out = t->render(messages, {});
  if (!out) return out.error().message();
  return "rendered: " + *out;
}

#define EXPECT_FAILS_WITH(src, line, what)                                                  \
  do {                                                                                      \
    const std::string got_ = outcome(src);                                                  \
    EXPECT_NE(got_.find(std::string("t line ") + #line + ": "), std::string::npos) << got_; \
    EXPECT_NE(got_.find(what), std::string::npos) << got_;                                  \
  } while (0)

// String literals read their escapes as Python does (chat/python_escape.hpp); one Python refuses names its line.
TEST(TemplateErrors, StringEscapesReadAsPythonAndBadOnesNameTheLine) {
  EXPECT_EQ(outcome(R"({{ 'a\nb\t\x41\u00e9\U0001F600\101\d\'\"\\' }})"),
            "rendered: a\nb\tA\xc3\xa9\xf0\x9f\x98\x80"
            "A\\d'\"\\");
  EXPECT_EQ(outcome("{{ 'one \\\ntwo' }}"), "rendered: one two") << "a backslash before a newline joins the lines";
  EXPECT_FAILS_WITH("x\n{{ '\\xZZ' }}", 2, "invalid hexadecimal escape \\xZZ");
  EXPECT_FAILS_WITH("x\ny\n{{ '\\u12G4' }}", 3, "invalid hexadecimal escape \\u12G4");
  EXPECT_FAILS_WITH("{{ '\\U00110000' }}", 1, "escape \\U00110000 is past U+10FFFF");
  EXPECT_FAILS_WITH("{{ 'a\\u12", 1, "invalid escape sequence");  // the template ends inside the digits
  EXPECT_FAILS_WITH("{{ 'a\\", 1, "unexpected end of template in a string literal");
  EXPECT_FAILS_WITH("x\n{{ 'abc }}", 2, "string literal is never closed");
}

TEST(TemplateLimits, DeepNestingIsAParseError) {
  EXPECT_FAILS_WITH("{{ " + repeat("(", 100000) + "1" + repeat(")", 100000) + " }}", 1,
                    "nested too deeply (limit 256)");
  EXPECT_FAILS_WITH("x\n" + repeat("{% if true %}", 20000) + repeat("{% endif %}", 20000), 2, "nested too deeply");
  EXPECT_FAILS_WITH("{% if a %}" + repeat("{% elif a %}", 20000) + "{% endif %}", 1, "nested too deeply");
  // Loops build these trees without recursing: the tree depth itself is bounded.
  EXPECT_FAILS_WITH("{{ 1" + repeat(" + 1", 100000) + " }}", 1, "nested too deeply");
  EXPECT_FAILS_WITH("{{ 'a'" + repeat(" | upper", 100000) + " }}", 1, "nested too deeply");
  EXPECT_FAILS_WITH("{{ x" + repeat(".a", 100000) + " }}", 1, "nested too deeply");
  EXPECT_FAILS_WITH("{{ " + repeat("(1 + ", 200) + "1" + repeat(" + 1)", 200) + " }}", 1, "nested too deeply");
  EXPECT_FAILS_WITH("{{ " + repeat("not ", 100000) + "x }}", 1, "nested too deeply");
  EXPECT_FAILS_WITH("{{ " + repeat("- ", 100000) + "1 }}", 1, "nested too deeply");
  EXPECT_FAILS_WITH("{{ f" + repeat("()", 100000) + " }}", 1, "nested too deeply");
  // Reasonable nesting still works.
  EXPECT_EQ(outcome("{{ " + repeat("(", 100) + "1" + repeat(")", 100) + " }}"), "rendered: 1");
  EXPECT_EQ(outcome(repeat("{% if true %}", 60) + "y" + repeat("{% endif %}", 60)), "rendered: y");
  EXPECT_EQ(outcome("{{ 0" + repeat(" + 1", 200) + " }}"), "rendered: 200");
}

TEST(TemplateLimits, RunawayRecursionIsARenderError) {
  EXPECT_FAILS_WITH("{% macro f(n) %}{{ f(n) }}{% endmacro %}\n{{ f(1) }}", 1, "nested too deeply");
  EXPECT_FAILS_WITH("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}", 1,
                    "nested too deeply");
  // Bounded recursion works.
  EXPECT_EQ(outcome("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) | length }}"),
            "rendered: 71");
}

TEST(TemplateStatements, GenerationAndCallBlocks) {
  // TRL's assistant-only-loss templates mark the answer with {% generation %}: rendered as it is (transformers).
  EXPECT_EQ(outcome("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"),
            "rendered: [Hi][Hello]");
  // {% call %}: the macro's caller() renders the block, in the scope of the call.
  EXPECT_EQ(outcome("{% macro w(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% set x = 'in' %}"
                    "{% call w('b') %}{{ x }}{% endcall %}"),
            "rendered: <b>in</b>");
  EXPECT_EQ(outcome("{% macro twice() %}{{ caller() }}{{ caller() }}{% endmacro %}{% call twice() %}ab{% endcall %}"),
            "rendered: abab");
  EXPECT_FAILS_WITH("{% call 5 %}x{% endcall %}", 1, "'call' needs a macro call");
  EXPECT_FAILS_WITH("{% generation %}x", 1, "generation");
}

// Functions that read a block's scope, kept in a namespace past the block, are an error when called (the scope is
// gone: reading it would be a use after free, which the ASan run would catch).
TEST(TemplateLimits, FunctionsKeptPastTheirBlockAreAnErrorNotAUseAfterFree) {
  EXPECT_FAILS_WITH(
      "{% set ns = namespace(c=none) %}{% macro m() %}{% set ns.c = caller %}{% endmacro %}"
      "{% for i in [1] %}{% set v = 'L' %}{% call m() %}[{{ v }}]{% endcall %}{% endfor %}{{ ns.c() }}",
      1, "caller() was kept past its {% call %} block");
  EXPECT_FAILS_WITH(
      "{% set ns = namespace(l=none) %}{% for o in [1] %}{% for x in [[1]] recursive %}"
      "{% set ns.l = loop %}{% endfor %}{% endfor %}{{ ns.l([[2]]) }}",
      1, "loop() was kept past its recursive loop");
  // Within its block each works.
  EXPECT_EQ(outcome("{% macro m() %}<{{ caller() }}>{% endmacro %}{% call m() %}x{% endcall %}"), "rendered: <x>");
}

// What a hostile template could make big or slow is bounded, or as fast as it should be.
TEST(TemplateLimits, RepetitionSearchesAndFormatsStayBounded) {
  EXPECT_FAILS_WITH("{{ 'abcd' * 4611686018427387904 }}", 1, "too large");
  EXPECT_EQ(outcome("{{ '' * 9223372036854775807 }}|{{ [] * 9223372036854775807 }}"), "rendered: |[]");
  EXPECT_FAILS_WITH("{% set s = 'a' * 16000000 %}{% set l = [s] * 1000000 %}", 1, "too large");
  EXPECT_FAILS_WITH("{{ '%.999999999f'|format(1.5) }}", 1, "a width or precision above 400");
  EXPECT_FAILS_WITH("{{ '{99999999999999999999}'.format(1) }}", 1, "out of range");
  EXPECT_EQ(outcome("{{ 40|truncate(9223372036854775805) }}|{{ 'abc'|truncate(9223372036854775805) }}"),
            "rendered: 40|abc");
  // map('map', 'map', ...) nests filter calls without end: bounded (each is a large frame on the stack).
  std::string maps = "{{ ['a']|map('map'";
  for (int k = 0; k < 2000; ++k) maps += ", 'map'";
  EXPECT_FAILS_WITH(maps + ")|list }}", 1, "map() nests filters too deeply (limit 32)");
  // A list method holds its list: a chain of them is as deep as the lists it holds.
  EXPECT_FAILS_WITH(
      "{% set ns = namespace(l=[1]) %}{% for i in range(200000) %}{% set ns.l = [ns.l.count] %}"
      "{% endfor %}",
      1, "nested too deeply");
  // Text past a million characters trims, reverses and splits from the right (no list of its characters is made).
  EXPECT_EQ(outcome("{{ (' ' ~ 'a' * 1100000 ~ ' ')|trim|length }} {{ ('a' * 1100000)|reverse|length }} "
                    "{{ ('x ' * 600000).rsplit(' ', 1)|length }} {{ ('-' * 1100000 ~ 'b').strip('-') }}"),
            "rendered: 1100000 1100000 2 b");
  // A search that is quadratic with a naive find: linear here (ctest's timeout would catch a regression).
  EXPECT_EQ(outcome("{{ ('a' * 2000000 ~ 'b') in ('a' * 4000000) }} {{ ('a' * 4000000).count('a' * 1000000 ~ 'b') }}"),
            "rendered: False 0");
}

TEST(TemplateLimits, CyclesAndDeepValues) {
  EXPECT_FAILS_WITH("{% set x = namespace(a=1) %}{% set x.a = x %}\n{{ x }}", 2, "nested too deeply to print");
  EXPECT_FAILS_WITH("{% set x = namespace(a=1) %}{% set x.a = [x] %}{{ x | tojson }}", 1, "nested too deeply to print");
  // A cycle that is never printed renders (and does not leak: the ASan run checks).
  EXPECT_EQ(outcome("{% set x = namespace(a=1) %}{% set x.a = {'k': x} %}{% set f = x.a.items %}{% set x.f = f %}ok"),
            "rendered: ok");
  EXPECT_FAILS_WITH("{% set ns = namespace(x=0) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}", 1,
                    "nested too deeply (limit 256)");
  // A long chain of namespaces is fine to build and to destroy (no recursion through it).
  EXPECT_EQ(outcome("{% set head = namespace(next=none) %}{% set ns = namespace(tail=head) %}"
                    "{% for i in range(100000) %}{% set t = namespace(next=none) %}{% set ns.tail.next = t %}"
                    "{% set ns.tail = t %}{% endfor %}done"),
            "rendered: done");
  ojson deep = "x";
  for (int k = 0; k < 100000; ++k) deep = ojson::array({std::move(deep)});
  const std::string got = outcome("{{ messages }}", deep);
  EXPECT_NE(got.find("messages is nested too deeply"), std::string::npos) << got;
  // Floats that do not fit an integer stay floats (the cast would be undefined behaviour).
  EXPECT_EQ(outcome("{{ messages[0] > 1 }} {{ messages[1] }}", ojson::parse("[1e300, 18446744073709551615]")),
            "rendered: True 1.8446744073709552e+19");
}

TEST(TemplateLimits, IntegerOverflowAndDivisionByZero) {
  EXPECT_FAILS_WITH("{{ 9223372036854775807 + 1 }}", 1, "integer overflow in '+'");
  EXPECT_FAILS_WITH("\n{{ (-9223372036854775807 - 1) - 1 }}", 2, "integer overflow in '-'");
  EXPECT_FAILS_WITH("{{ 4294967296 * 4294967296 }}", 1, "integer overflow in '*'");
  EXPECT_FAILS_WITH("{{ 2 ** 100 }}", 1, "integer overflow in '**'");
  EXPECT_FAILS_WITH("{% set m = -9223372036854775807 - 1 %}{{ -m }}", 1, "integer overflow in unary '-'");
  EXPECT_FAILS_WITH("{{ (-9223372036854775807 - 1) | abs }}", 1, "integer overflow in filter 'abs'");
  EXPECT_FAILS_WITH("{{ (-9223372036854775807 - 1) // -1 }}", 1, "integer overflow in '//'");
  EXPECT_FAILS_WITH("{{ '1e300' | int }}", 1, "integer overflow");
  EXPECT_FAILS_WITH("{{ (10.0 ** 300) | int }}", 1, "integer overflow");
  EXPECT_FAILS_WITH("{{ 99999999999999999999999 }}", 1, "integer literal 99999999999999999999999 is out of range");
  EXPECT_FAILS_WITH("{{ x.99999999999999999999999 }}", 1, "out of range");
  for (const char* src : {"{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 1.5 / 0 }}", "{{ 1 / 0.0 }}"}) {
    EXPECT_FAILS_WITH(src, 1, "division by zero");
  }
  EXPECT_FAILS_WITH("{{ 1 % 0 }}", 1, "modulo by zero");
  // Python's rules, which HuggingFace's templates are written for: % takes the divisor's sign, ** overflows loudly.
  EXPECT_EQ(outcome("{{ -7 % 3 }} {{ 7 % -3 }} {{ 7 % 3 }} {{ -7.5 % 2 }} {{ 7.5 % -2 }} {{ -6 % 3 }} {{ 2 ** -1 }}"),
            "rendered: 2 -2 1 0.5 -0.5 0 0.5");
  EXPECT_FAILS_WITH("{{ 10.0 ** 400 }}", 1, "'**' result is too large");
  EXPECT_FAILS_WITH("{{ (-8) ** 0.5 }}", 1, "has no real value");
  EXPECT_EQ(outcome("{{ (-9223372036854775807 - 1) % -1 }} {{ 2 ** 62 }} {{ 3 ** 0 }} {{ -7 // 2 }} {{ 7 // -2 }} "
                    "{{ -9223372036854775807 - 1 }} {{ 9007199254740993 + 0 }}"),
            "rendered: 0 4611686018427387904 1 -4 -4 -9223372036854775808 9007199254740993");
  EXPECT_EQ(outcome("{{ range(0, 9223372036854775807, 4611686018427387904) | list }}"),
            "rendered: [0, 4611686018427387904]");
  EXPECT_EQ(outcome("{{ [1, 2, 3][::9223372036854775807] }} {{ [1, 2, 3][::-9223372036854775807] }}"),
            "rendered: [1] [3]");
  EXPECT_FAILS_WITH("{{ range(2000000) | length }}", 1, "range() is too large");
}

TEST(TemplateLimits, SizesAndBudget) {
  EXPECT_FAILS_WITH("{{ 'x' | indent(100000000000) }}", 1, "indent width must be between 0 and 1024");
  EXPECT_FAILS_WITH("{{ 'x' | indent(-1) }}", 1, "indent width must be between 0 and 1024, got -1");
  EXPECT_FAILS_WITH("{{ messages | tojson(indent=100000000) }}", 1, "indent width must be between 0 and 1024");
  EXPECT_EQ(outcome("{{ 'a\nb' | indent(2) }}|{{ [1] | tojson(indent=1) }}"), "rendered: a\n  b|[\n 1\n]");
  // Output, strings and lists are capped.
  EXPECT_FAILS_WITH("{% for i in range(1000000) %}{{ '" + std::string(4096, 'x') + "' }}{% endfor %}", 1,
                    "template output or string is too large (limit 16 MiB)");
  EXPECT_FAILS_WITH("{% set ns = namespace(s='x') %}\n{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                    2, "too large");
  EXPECT_FAILS_WITH(
      "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}"
      "{% set ns.s = ns.s.replace('', ns.s) %}{% endfor %}",
      1, "too large");
  EXPECT_FAILS_WITH("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
                    1, "list is too long");
  EXPECT_FAILS_WITH("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", 1,
                    "template exceeded its step budget");
  EXPECT_FAILS_WITH(
      "{% set l = range(1000000) | list %}{% for i in range(1000000) %}{% for j in l %}{% break %}"
      "{% endfor %}{% endfor %}",
      1, "step budget");
}

// The deepest templates the limits allow must fit a thread stack far smaller than the usual 8 MiB.
void run_on_small_stack(const std::function<void()>& fn) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr std::size_t kStack = 8u << 20;  // sanitizer frames are several times larger
#else
  constexpr std::size_t kStack = 1u << 20;
#endif
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, kStack), 0);
  pthread_t thread;
  auto* arg = const_cast<std::function<void()>*>(&fn);
  ASSERT_EQ(pthread_create(
                &thread, &attr,
                [](void* p) -> void* {
                  (*static_cast<std::function<void()>*>(p))();
                  return nullptr;
                },
                arg),
            0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(TemplateLimits, DeepestAllowedTemplatesFitASmallStack) {
  std::vector<std::string> got;
  run_on_small_stack([&] {
    got.push_back(outcome("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"));
    got.push_back(outcome("{% macro f(n) %}{{ (n | string) ~ f(n + 1) }}{% endmacro %}{{ f(1) }}"));
    got.push_back(
        outcome("{% macro f(n) %}{{ [n] | map(attribute='x') | list ~ ((f(n + 1))) }}{% endmacro %}{{ f(1) }}"));
    got.push_back(outcome("{{ " + repeat("(", 250) + "1" + repeat(")", 250) + " }}"));
    got.push_back(outcome("{{ " + repeat("f(", 250) + repeat(")", 250) + " }}"));
    got.push_back(outcome("{{ " + repeat("[", 250) + repeat("]", 250) + " }}"));
    got.push_back(outcome(repeat("{% if true %}", 250) + repeat("{% endif %}", 250)));
    got.push_back(outcome(repeat("{% for i in [1] %}", 250) + repeat("{% endfor %}", 250)));
    got.push_back(outcome("{% set ns = namespace(x=0) %}{% for i in range(300) %}{% set ns.x = [ns.x] %}{% endfor %}"));
    got.push_back(
        outcome("{% set ns = namespace(x=0) %}{% for i in range(254) %}{% set ns.x = [ns.x] %}{% endfor %}"
                "{{ ns.x | tojson | length }}"));
    got.push_back(outcome("{% set x = namespace(a=1) %}{% set x.a = x %}{{ x }}"));
    got.push_back(outcome("{{ [[[[['a']]]]]" + repeat("|map('map'", 1) + repeat(", 'map'", 40) + ")|list }}"));
  });
  ASSERT_EQ(got.size(), 12u);
  EXPECT_NE(got[11].find("map() nests filters too deeply"), std::string::npos) << got[11];
  for (const auto& g : got) EXPECT_FALSE(g.empty());
  EXPECT_NE(got[0].find("nested too deeply"), std::string::npos) << got[0];
  EXPECT_EQ(got[9], "rendered: 509");
}

TEST(ChatConfig, ShippedConfigsAndBuiltinFallback) {
  for (const std::string name : {"qwen3", "llama3", "mistral_nemo", "deepseek_v3", "gptoss", "mixtral", "llama2"}) {
    const auto dir = test::tokenizer_dir(name);
    if (!dir || !fs::exists(*dir / "tokenizer_config.json")) continue;
    auto config = load_chat_config(*dir / "tokenizer_config.json");
    ASSERT_TRUE(config.has_value()) << name << ": " << config.error().to_string();
    EXPECT_FALSE(config->template_source.empty()) << name;
    auto tmpl = Template::parse(config->template_source, name);
    ASSERT_TRUE(tmpl.has_value()) << name << ": " << tmpl.error().to_string();
    RenderOptions o;
    o.add_generation_prompt = true;
    o.bos_token = config->bos_token;
    o.eos_token = config->eos_token;
    auto out = tmpl->render(ojson::parse(R"([{"role":"user","content":"ping"}])"), o);
    ASSERT_TRUE(out.has_value()) << name << ": " << out.error().to_string();
    EXPECT_NE(out->find("ping"), std::string::npos) << name;
    EXPECT_LT(jinja::last_render_steps(), jinja::kMaxSteps / 1000) << name;

    if (name == "gptoss") {
      EXPECT_EQ(config->template_origin, "built-in gpt-oss");
    }
    if (name == "mixtral" || name == "llama2") {
      EXPECT_EQ(config->template_origin, "built-in llama2");
    }
  }
}

TEST(ChatConfig, BadFiles) {
  // Per process: another ctest run on the same machine (the asan and release builds) uses /tmp too.
  const auto tmp = fs::temp_directory_path() / ("colibri_chat_config_test_" + std::to_string(::getpid()) + ".json");
  { std::ofstream(tmp) << "{ not json"; }
  auto bad = load_chat_config(tmp);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find(tmp.string()), std::string::npos);
  { std::ofstream(tmp) << R"({"bos_token": "<x>"})"; }
  auto unknown = load_chat_config(tmp);
  ASSERT_FALSE(unknown.has_value());
  EXPECT_NE(unknown.error().message().find("no chat_template"), std::string::npos);
  auto named = load_chat_config(tmp, "mistral");
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->template_origin, "built-in mistral");
  fs::remove(tmp);
  EXPECT_FALSE(load_chat_config(tmp).has_value());
}

TEST(ChatConfig, ANamedListGivesDefaultAndKeepsToolUse) {
  const auto tmp = fs::temp_directory_path() / ("colibri_chat_named_" + std::to_string(::getpid()) + ".json");
  std::ofstream(tmp) << R"({"chat_template": [{"name": "tool_use", "template": "T{{ tools|length }}"},
                                              {"name": "rag", "template": "R"}, {"name": "default", "template": "D"}]})";
  auto c = load_chat_config(tmp);
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->template_source, "D");
  EXPECT_EQ(c->tool_use_source, "T{{ tools|length }}");
  std::ofstream(tmp) << R"({"chat_template": [{"name": "default", "template": "D"}]})";
  c = load_chat_config(tmp);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->tool_use_source, "");
  std::ofstream(tmp) << R"({"chat_template": [{"name": "tool_use", "template": "T"}]})";
  c = load_chat_config(tmp);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message().find("no entry named \"default\""), std::string::npos);
  fs::remove(tmp);
}

TEST(ChatConfig, AChatTemplateJinjaFileWinsAndTheArchitectureNamesTheFallback) {
  // transformers now saves the template as chat_template.jinja (gpt-oss ships it only there).
  const auto dir = fs::temp_directory_path() / ("colibri_chat_jinja_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>", "chat_template": "from the config"})";
  std::ofstream(dir / "chat_template.jinja") << "{{ messages[0]['content'] }}";
  auto c = load_chat_config(dir / "tokenizer_config.json");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->template_origin, "chat_template.jinja");
  EXPECT_EQ(c->template_source, "{{ messages[0]['content'] }}");
  EXPECT_EQ(c->bos_token, "<s>");
  fs::remove(dir / "chat_template.jinja");
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  // A Mixtral without a template gets Mistral's format in chat and in the server alike, not llama2's (<s> guess).
  auto mixtral = load_chat_config(dir / "tokenizer_config.json", family_for_architecture("mixtral"));
  ASSERT_TRUE(mixtral.has_value());
  EXPECT_EQ(mixtral->template_origin, "built-in mistral");
  EXPECT_EQ(family_for_architecture("qwen3_moe"), "chatml");
  EXPECT_EQ(family_for_architecture("gpt_oss"), "gpt-oss");
  EXPECT_EQ(family_for_architecture("llama"), "");
  fs::remove_all(dir);
}

// Where a later prompt may part from a chat's: the generation prompt's start, the last user message's and the first
// one's, as token counts the prompt starts with (one token per byte here).
TEST(PartingPositions, AreWhereTheGenerationPromptAndTheUserMessagesStart) {
  auto t = Template::parse(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}");
  ASSERT_TRUE(t) << t.error().message();
  const ojson messages = ojson::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
      {"role": "user", "content": "Why?"}])");
  auto bytes = [](const std::string& text) { return std::vector<std::int32_t>(text.begin(), text.end()); };
  RenderOptions with;
  with.add_generation_prompt = true;
  const auto full = t->render(messages, with);
  ASSERT_TRUE(full);
  const auto prompt = bytes(*full);
  std::vector<std::size_t> asked;
  auto head = [&](std::size_t n) -> std::optional<std::vector<std::int32_t>> {
    asked.push_back(n);
    auto text = t->render(ojson(messages.begin(), messages.begin() + static_cast<long>(n)), RenderOptions{});
    return text ? std::optional(bytes(*text)) : std::nullopt;
  };
  const auto at = parting_positions(messages, prompt, head);
  const std::int64_t system = std::string("<|im_start|>system\nBe brief.<|im_end|>\n").size();
  const std::int64_t last =
      system + std::string("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n").size();
  const std::int64_t generation = last + std::string("<|im_start|>user\nWhy?<|im_end|>\n").size();
  EXPECT_EQ(at, (std::vector<std::int64_t>{system, last, generation}));
  EXPECT_EQ(prompt.size() - static_cast<std::size_t>(generation),
            std::string("<|im_start|>assistant\n<think>\n").size());
  std::sort(asked.begin(), asked.end());
  EXPECT_EQ(asked, (std::vector<std::size_t>{1, 3, 4}));
  // No system message: the first user message starts at 0, no position. A prefix the template will not render, or
  // renders otherwise: skipped, or as much of it as the prompt starts with.
  const ojson plain(messages.begin() + 1, messages.end());
  const auto plain_prompt = bytes(*t->render(plain, with));
  auto failing = [&](std::size_t n) -> std::optional<std::vector<std::int32_t>> {
    if (n == plain.size()) return std::nullopt;
    auto text = t->render(ojson(plain.begin(), plain.begin() + static_cast<long>(n)), RenderOptions{});
    auto tokens = bytes(*text);
    tokens.push_back('!');  // rendered otherwise after these
    return tokens;
  };
  const std::int64_t edited =
      std::string("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n").size();
  EXPECT_EQ(parting_positions(plain, plain_prompt, failing), (std::vector<std::int64_t>{edited}));
  EXPECT_TRUE(parting_positions(ojson::object(), plain_prompt, failing).empty()) << "not a list of messages";
}

}  // namespace
}  // namespace colibri::chat
