// The XML call syntaxes (qwen3_coder: Qwen3-Coder, Qwen3.5, Nemotron 3 Nano; glm45: GLM-4.5 to 4.7). Their values are
// bare text, so the request's tool schemas decide which are strings; the parser reads back what the templates write
// for earlier calls, a stream sends exactly what the whole-text parse finds (string values as they are written), and
// text that is no well-formed call is never lost.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "colibri/chat/template.hpp"
#include "colibri/server/api.hpp"
#include "colibri/server/chat_output.hpp"
#include "unit/server/tool_stream_test_util.hpp"

namespace colibri::server::xml_calls {  // apart from chat_output_test's helpers in a unity build
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using tool_test::names_and_args;
using tool_test::Streamed;

// The tools of the tests: `city` and `note` are strings, `note` may be null, `days` an integer; `get_time` has no
// schema for its parameters.
ToolSchemas weather_tools() {
  return ToolSchemas(ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "note": {"type": ["string", "null"]},
      "unit": {"enum": ["c", "f"]}, "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
      "flags": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "get_time"}}])"));
}

// Templates that write earlier calls as the families' own do (Qwen3-Coder's and GLM-4.6's loops over the arguments,
// values that are not strings as Qwen writes them with `|string` and GLM with `tojson`).
constexpr std::string_view kQwenTemplate = R"({%- for m in messages %}
{%- if m.tool_calls %}<|im_start|>assistant
{%- for tc in m.tool_calls %}{% set tc = tc.function %}
<tool_call>
<function={{ tc.name }}>
{% for k, v in tc.arguments|items %}<parameter={{ k }}>
{{ v|tojson if v is mapping or (v is sequence and v is not string) else v|string }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}<|im_end|>
{% endif %}{% endfor %})";

constexpr std::string_view kGlmTemplate = R"({%- for m in messages %}
{%- if m.tool_calls %}<|assistant|>
{%- for tc in m.tool_calls %}{% set tc = tc.function %}
<tool_call>{{ tc.name }}
{% for k, v in tc.arguments.items() %}<arg_key>{{ k }}</arg_key>
<arg_value>{{ v|tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}</tool_call>{% endfor %}<|observation|>
{% endif %}{% endfor %})";

// MiniMax M2's and DeepSeek V3.2's (DSML) templates, the way they write earlier calls.
constexpr std::string_view kMinimaxTemplate = R"({%- set toolcall_begin_token = '<minimax:tool_call>' -%}
{%- for m in messages %}{%- if m.tool_calls %}]~b]ai
{{ toolcall_begin_token }}
{% for tc in m.tool_calls %}{% set tc = tc.function %}<invoke name="{{ tc.name }}">
{% for k, v in tc.arguments.items() %}<parameter name="{{ k }}">{{ v|tojson(ensure_ascii=False) if v is not string else v }}</parameter>
{% endfor %}</invoke>
{% endfor %}</minimax:tool_call>[e~[
{% endif %}{% endfor %})";

constexpr std::string_view kDsmlTemplate = R"({%- set dsml_token = '｜DSML｜' -%}
{%- for m in messages %}{%- if m.tool_calls %}<｜Assistant｜>{{ '\n\n<' + dsml_token + 'function_calls>\n' }}
{%- for tc in m.tool_calls %}{% set f = tc.function %}{{ '<' + dsml_token + 'invoke name="' + f.name + '">\n' }}
{%- for k, v in f.arguments.items() %}{% if v is string %}{{ '<' + dsml_token + 'parameter name="' + k + '" string="true">' + v + '</' + dsml_token + 'parameter>\n' }}
{%- else %}{{ '<' + dsml_token + 'parameter name="' + k + '" string="false">' + (v|tojson) + '</' + dsml_token + 'parameter>\n' }}
{%- endif %}{% endfor %}{{ '</' + dsml_token + 'invoke>\n' }}{% endfor %}{{ '</' + dsml_token + 'function_calls>' }}<｜end▁of▁sentence｜>
{% endif %}{% endfor %})";

TEST(XmlToolCalls, FormatComesFromWhatFollowsTheOpeningTag) {
  EXPECT_EQ(detect_tool_format(kQwenTemplate), ToolFormat::qwen3_coder);
  EXPECT_EQ(detect_tool_format(kGlmTemplate), ToolFormat::glm45);
  EXPECT_EQ(detect_tool_format("<tool_call>\n{{ tool_call | tojson }}\n</tool_call>"), ToolFormat::hermes);
  // Seed-OSS writes <function= inside its own <seed:tool_call>: not Qwen's syntax.
  EXPECT_EQ(detect_tool_format("<seed:tool_call>\n<function={{ n }}>\n<parameter=x>"), ToolFormat::none);
  EXPECT_EQ(detect_tool_format(kMinimaxTemplate), ToolFormat::minimax_m2);
  EXPECT_EQ(detect_tool_format(kDsmlTemplate), ToolFormat::deepseek_v32);
  EXPECT_EQ(detect_tool_format("{% set t = '｜DSML｜' %}{{ '<' + t + 'tool_calls>' }}"), ToolFormat::deepseek_v4);
  EXPECT_EQ(tool_format_name(ToolFormat::qwen3_coder), "qwen3_coder");
  EXPECT_EQ(tool_format_name(ToolFormat::glm45), "glm45");
  // GLM's tags are special tokens in its tokenizer; the server asks the tokenizer about each of them.
  EXPECT_EQ(tool_markers(ToolFormat::glm45).size(), 6u);
}

// An OpenAI history with calls, rendered by each template, reads back as the calls it held, values typed as sent.
TEST(XmlToolCalls, ParsesWhatTheTemplatesWriteForEarlierCalls) {
  const std::string body = R"({"model": "m", "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
         "arguments": "{\"city\": \"Paris\", \"days\": 2, \"note\": \"two\\nlines <b>\", \"flags\": [\"a\", \"b\"]}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time",
         "arguments": "{\"zone\": \"CET\", \"utc\": true, \"offset\": -1.5, \"opts\": {\"x\": null}}"}}]}]})";
  CompletionRequest req;
  ASSERT_FALSE(parse_completion_request(body, Endpoint::chat, req).has_value());
  const std::vector<std::pair<std::string, json>> want = {
      {"get_weather", json{{"city", "Paris"}, {"days", 2}, {"note", "two\nlines <b>"}, {"flags", {"a", "b"}}}},
      {"get_time", json{{"zone", "CET"}, {"utc", true}, {"offset", -1.5}, {"opts", {{"x", nullptr}}}}}};
  const std::pair<std::string_view, ToolFormat> cases[] = {{kQwenTemplate, ToolFormat::qwen3_coder},
                                                           {kGlmTemplate, ToolFormat::glm45},
                                                           {kMinimaxTemplate, ToolFormat::minimax_m2},
                                                           {kDsmlTemplate, ToolFormat::deepseek_v32}};
  for (const auto& [source, format] : cases) {
    auto tmpl = chat::Template::parse(std::string(source), "test");
    ASSERT_TRUE(tmpl.has_value()) << tmpl.error().message();
    auto text = render_chat(*tmpl, req.messages, chat::RenderOptions{});
    ASSERT_TRUE(text.has_value()) << text.error().message();
    const auto begin = text->find(format == ToolFormat::minimax_m2     ? "<minimax:tool_call>"
                                  : format == ToolFormat::deepseek_v32 ? "<｜DSML｜"
                                                                       : "<tool_call>");
    const auto end = text->find(format == ToolFormat::glm45          ? "<|observation|>"
                                : format == ToolFormat::minimax_m2   ? "[e~["
                                : format == ToolFormat::deepseek_v32 ? "<｜end▁of▁sentence｜>"
                                                                     : "<|im_end|>");
    ASSERT_NE(begin, std::string::npos) << *text;
    const ToolParse p = parse_tool_calls(format, std::string_view(*text).substr(begin, end - begin), weather_tools());
    EXPECT_EQ(names_and_args(p), want) << *text;
    EXPECT_EQ(p.content, "") << *text;
    // Keys stay in the order written; a string that looks like JSON stays the string the schema says it is.
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_TRUE(p.calls[0].arguments.starts_with(R"({"city":"Paris","days":2,)")) << p.calls[0].arguments;
  }
}

TEST(XmlToolCalls, TheSchemaSaysWhichValuesAreStrings) {
  const ToolSchemas types = weather_tools();
  using Kind = ToolSchemas::Kind;
  EXPECT_EQ(types.kind("get_weather", "city"), Kind::string);
  EXPECT_EQ(types.kind("get_weather", "note"), Kind::string_or_null);
  EXPECT_EQ(types.kind("get_weather", "unit"), Kind::string);
  EXPECT_EQ(types.kind("get_weather", "code"), Kind::string_or_null);
  EXPECT_EQ(types.kind("get_weather", "days"), Kind::other);
  EXPECT_EQ(types.kind("get_weather", "flags"), Kind::other);
  EXPECT_EQ(types.kind("get_weather", "missing"), Kind::other);
  EXPECT_EQ(types.kind("get_time", "zone"), Kind::other);
  EXPECT_EQ(types.kind("nothing", "city"), Kind::other);
  EXPECT_EQ(ToolSchemas(ojson("not tools")).kind("get_weather", "city"), Kind::other);

  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\n 7 \n</parameter>\n"
      "<parameter=note>\nNone\n</parameter>\n<parameter=unit>\ntrue\n</parameter>\n<parameter=flags>\nnot json\n"
      "</parameter>\n<parameter=extra>\n[1, 2]\n</parameter>\n<parameter=code>\n\n  padded \n\n</parameter>\n"
      "</function>\n</tool_call>";
  const ToolParse p = parse_tool_calls(ToolFormat::qwen3_coder, text, types);
  ASSERT_EQ(p.calls.size(), 1u) << p.content;
  EXPECT_EQ(p.calls[0].arguments,
            R"({"city":"123","days":7,"note":null,"unit":"true","flags":"not json","extra":[1,2],)"
            R"("code":"\n  padded \n"})");
  // Without the tools, every value that is JSON is read as JSON, and Python's literals too.
  const ToolParse untyped =
      parse_tool_calls(ToolFormat::glm45,
                       "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>123</arg_value>\n<arg_key>b</arg_key>"
                       "<arg_value>False</arg_value><arg_key>c</arg_key><arg_value> hi </arg_value></tool_call>");
  ASSERT_EQ(untyped.calls.size(), 1u);
  EXPECT_EQ(untyped.calls[0].arguments, R"({"a":123,"b":false,"c":" hi "})");
  // DSML says itself which values are strings, whatever the schema: string="true" is the text, "false" JSON.
  const ToolParse dsml = parse_tool_calls(
      ToolFormat::deepseek_v32,
      "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
      "string=\"false\">[1, 2]</｜DSML｜parameter>\n<｜DSML｜parameter name=\"x\" string=\"true\">123"
      "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\">4</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "</｜DSML｜function_calls>",
      types);
  ASSERT_EQ(dsml.calls.size(), 1u) << dsml.content;
  EXPECT_EQ(dsml.calls[0].arguments, R"({"city":[1,2],"x":"123","days":4})");
}

TEST(XmlToolCalls, ContentAroundTheCallsAndTheirShapes) {
  const ToolParse q = parse_tool_calls(ToolFormat::qwen3_coder,
                                       "Let me check.\n\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n"
                                       "<tool_call><function=get_weather><parameter=city>Oslo</parameter></function>"
                                       "\nDone.",
                                       weather_tools());
  const std::vector<std::pair<std::string, json>> want = {{"get_time", json::object()},
                                                          {"get_weather", json{{"city", "Oslo"}}}};
  EXPECT_EQ(names_and_args(q), want);
  EXPECT_EQ(q.content, "Let me check.\nDone.");
  // GLM-4.7 writes a call on one line; the name may be followed by the closing tag at once.
  const ToolParse g = parse_tool_calls(
      ToolFormat::glm45,
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call><tool_call>get_time"
      "</tool_call>",
      weather_tools());
  const std::vector<std::pair<std::string, json>> want_g = {{"get_weather", json{{"city", "Oslo"}}},
                                                            {"get_time", json::object()}};
  EXPECT_EQ(names_and_args(g), want_g);
  // The end token may cut off Qwen's </tool_call> after </function>, and a block's close after its last call.
  EXPECT_EQ(parse_tool_calls(ToolFormat::qwen3_coder, "<tool_call>\n<function=f>\n</function>").calls.size(), 1u);
  const ToolParse m = parse_tool_calls(
      ToolFormat::minimax_m2,
      "Sure.\n<minimax:tool_call>\n<invoke name=\"get_time\">\n</invoke>\n<invoke name=\"get_weather\">"
      "<parameter name=\"city\">Oslo</parameter></invoke>\n",
      weather_tools());
  EXPECT_EQ(names_and_args(m), want);
  EXPECT_EQ(m.content, "Sure.");
}

TEST(XmlToolCalls, AMalformedCallLeavesTheWholeTextAsContent) {
  const std::pair<ToolFormat, std::string> cases[] = {
      {ToolFormat::qwen3_coder, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"},      // cut off
      {ToolFormat::qwen3_coder, "<tool_call>\n<function=f>\n<parameter=a>\n1\n"},                    // inside a value
      {ToolFormat::qwen3_coder, "<tool_call>\n<function=>\n</function>\n</tool_call>"},              // no name
      {ToolFormat::qwen3_coder, "<tool_call>\n<function=f\n>\n</function>\n</tool_call>"},           // name over lines
      {ToolFormat::qwen3_coder, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"},  // Hermes JSON
      {ToolFormat::qwen3_coder,  // a repeated key: either value could be meant
       "<tool_call><function=f><parameter=a>1</parameter><parameter=a>2</parameter></function></tool_call>"},
      {ToolFormat::qwen3_coder,  // the first call was whole, the second is broken: the parse takes neither
       "<tool_call><function=f></function></tool_call><tool_call><function=g><oops></function></tool_call>"},
      {ToolFormat::glm45, "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n"},         // not closed
      {ToolFormat::glm45, "<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"},  // no name
      {ToolFormat::glm45, "<tool_call>f\n<arg_key>a</arg_key>1</tool_call>"},  // a key without its value
      {ToolFormat::minimax_m2, "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">1</parameter>\n"},
      {ToolFormat::minimax_m2, "<minimax:tool_call>\n<invoke name=f>\n</invoke>\n</minimax:tool_call>"},  // unquoted
      {ToolFormat::minimax_m2, "<minimax:tool_call>\n</minimax:tool_call>"},  // no call in the block
      {ToolFormat::deepseek_v32,
       "<｜DSML｜function_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"a\" string=\"true\">1"},
  };
  for (const auto& [format, text] : cases) {
    const ToolParse p = parse_tool_calls(format, text, weather_tools());
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

// What a stream with the tests' tools sent, pushed in pieces of `step` bytes.
Streamed stream_in_steps(ToolFormat format, std::string_view text, std::size_t step) {
  return tool_test::stream_in_steps(ToolCallStream(format, weather_tools()), text, step);
}

const std::pair<ToolFormat, std::string> kAnswers[] = {
    {ToolFormat::qwen3_coder,
     "I'll write it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo <b> \"q\"\n\n"
     "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=note>\nx\n</parameter>\n</function>\n"
     "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>"},
    {ToolFormat::glm45,
     "<think>no</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich\n\"old town\"</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>[1, 2]</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>"},
    {ToolFormat::minimax_m2,
     "Let me see.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">New York </param "
     "\"NY\"</parameter>\n<parameter name=\"days\">2</parameter>\n</invoke>\n<invoke name=\"get_time\">\n"
     "</invoke>\n</minimax:tool_call>"},
    {ToolFormat::deepseek_v32,
     "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
     "string=\"true\">Kraków, \"old town\"</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">"
     "3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>"},
};

// Whatever the chunking, the stream finds what the whole parse finds; a string value goes out as it is written.
TEST(XmlToolCalls, StreamSendsWhatTheWholeParseFindsAsItIsWritten) {
  for (const auto& [format, text] : kAnswers) {
    const ToolParse whole = parse_tool_calls(format, text, weather_tools());
    ASSERT_EQ(whole.calls.size(), 2u) << text;
    for (const std::size_t step : {1, 2, 3, 5, 7, 64}) {
      const Streamed s = stream_in_steps(format, text, step);
      EXPECT_EQ(names_and_args(s.end.parse), names_and_args(whole)) << step;
      ASSERT_EQ(s.names.size(), 2u) << step;
      for (std::size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(s.names[k], whole.calls[k].name);
        EXPECT_EQ(s.arguments[k], whole.calls[k].arguments) << text << " step " << step;
        EXPECT_EQ(s.pushed_arguments[k] + "}", whole.calls[k].arguments) << "all but the '}' before finish()";
      }
      EXPECT_EQ(s.content + s.end.parse.content, whole.content) << step;
      // The city streams byte by byte: many pieces before its value closed (MiniMax's, trimmed, goes whole).
      if (step == 1 && format != ToolFormat::minimax_m2) {
        EXPECT_GT(s.pushed_pieces[0], 8u);
      }
    }
  }
  const ToolParse qwen = parse_tool_calls(kAnswers[0].first, kAnswers[0].second, weather_tools());
  EXPECT_EQ(json::parse(qwen.calls[0].arguments)["city"], "São Paulo <b> \"q\"\n");
  EXPECT_EQ(qwen.content, "I'll write it.");
}

// Wherever the answer stops, the stream sent either exactly the calls the whole parse finds, or, when it finds none,
// only pieces that are no complete JSON and all the text as content.
TEST(XmlToolCalls, EveryCutOfAnAnswerStreamsSafely) {
  for (const auto& [format, answer] : kAnswers)
    tool_test::expect_every_cut_streams_safely(format, answer, weather_tools());
}

// As vLLM reads them: Qwen's value without its </parameter> ends where the next parameter or the call's close begins;
// MiniMax's values are trimmed, and null, none and nil are null where the value need not be a string.
TEST(XmlToolCalls, WhatVllmReadsOfLooseValues) {
  const ToolParse q = parse_tool_calls(ToolFormat::qwen3_coder,
                                       "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>"
                                       "\n3\n</parameter>\n<parameter=note>\nx\n</function>\n</tool_call>",
                                       weather_tools());
  ASSERT_EQ(q.calls.size(), 1u) << q.content;
  EXPECT_EQ(q.calls[0].arguments, R"({"city":"Paris","days":3,"note":"x"})");
  const ToolParse m = parse_tool_calls(ToolFormat::minimax_m2,
                                       "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">\n"
                                       "a.txt\n</parameter>\n<parameter name=\"days\"> nil </parameter>\n<parameter "
                                       "name=\"note\">none</parameter>\n</invoke>\n</minimax:tool_call>",
                                       weather_tools());
  ASSERT_EQ(m.calls.size(), 1u) << m.content;
  EXPECT_EQ(m.calls[0].arguments, R"({"city":"a.txt","days":null,"note":null})");
  // Streamed alike, whatever the chunking.
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</param\n<parameter=days>\n3\n</function>";
  const ToolParse whole = parse_tool_calls(ToolFormat::qwen3_coder, text, weather_tools());
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].arguments, R"({"city":"Paris</param","days":3})");
  for (const std::size_t step : {1, 2, 3, 7}) {
    const Streamed s = stream_in_steps(ToolFormat::qwen3_coder, text, step);
    ASSERT_EQ(s.arguments.size(), 1u);
    EXPECT_EQ(s.arguments[0], whole.calls[0].arguments) << step;
  }
}

// A call of a function the request does not offer is no call, streamed or not: its text stays content and no piece
// of it goes out (the server refuses such names in `tools`, and a client could not run it).
TEST(XmlToolCalls, OnlyTheRequestsFunctionsAreCalled) {
  const std::pair<ToolFormat, std::string> cases[] = {
      {ToolFormat::qwen3_coder, "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>"},
      {ToolFormat::glm45, "<tool_call>{\"name\": \"get_time\"}</tool_call>"},  // the whole line is the name
      {ToolFormat::hermes, "<tool_call>{\"name\": \"}}\", \"arguments\": {}}</tool_call>"},
      {ToolFormat::mistral_v11, "[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]nope[ARGS]{}"},
      {ToolFormat::kimi_k2,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.x:0<|tool_call_argument_begin|>{}<|tool_call_end|>"},
  };
  for (const auto& [format, text] : cases) {
    const ToolParse whole = parse_tool_calls(format, text, weather_tools());
    EXPECT_TRUE(whole.calls.empty()) << text;
    EXPECT_EQ(whole.content, text);
    for (const std::size_t step : {1, 7}) {
      const Streamed s = stream_in_steps(format, text, step);
      // mistral_v11's first call (get_time) is a tool and goes out; it is never complete JSON.
      for (std::size_t k = 0; k < s.names.size(); ++k) {
        EXPECT_EQ(s.names[k], "get_time") << text;
        EXPECT_FALSE(json::accept(s.arguments[k])) << text;
      }
      EXPECT_EQ(s.content + s.end.parse.content, text);
    }
    // Without tools (no list to check against) the name is taken as written.
    EXPECT_FALSE(parse_tool_calls(format, text).calls.empty()) << text;
  }
}

// Kimi K2's template writes a call's result under its id ("## Return of functions.NAME:0") and its call under the
// header the model wrote: that header is the id, as vLLM returns it, streamed or not.
TEST(XmlToolCalls, KimiCallsKeepTheModelsIds) {
  const std::string text =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:3<|tool_call_argument_begin|>{\"city\": "
      "\"Oslo\"}<|tool_call_end|><|tool_call_begin|>get_time<|tool_call_argument_begin|>{}<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  const ToolParse p = parse_tool_calls(ToolFormat::kimi_k2, text, weather_tools());
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].id, "functions.get_weather:3");
  EXPECT_EQ(p.calls[1].id, "");  // no "functions.NAME:N" header: the server makes one
  for (const std::size_t step : {1, 5, 1000}) {
    ToolCallStream stream(ToolFormat::kimi_k2, weather_tools());
    std::vector<std::string> ids;
    auto take = [&](const std::vector<ToolCallDelta>& deltas) {
      for (const auto& d : deltas) {
        if (!d.name.empty()) ids.push_back(d.id);
      }
    };
    for (std::size_t i = 0; i < text.size(); i += step) take(stream.push(std::string_view(text).substr(i, step)).calls);
    take(stream.finish().calls);
    EXPECT_EQ(ids, (std::vector<std::string>{"functions.get_weather:3", ""})) << step;
  }
  EXPECT_EQ(parse_tool_calls(ToolFormat::deepseek_v31,
                             "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>")
                .calls.at(0)
                .id,
            "");
}

TEST(XmlToolCalls, ForcedAndRequiredCallsOpenAsTheModelWrites) {
  EXPECT_EQ(forced_call_prefix(ToolFormat::qwen3_coder, "get_time"), "<tool_call>\n<function=get_time>\n");
  EXPECT_EQ(forced_call_prefix(ToolFormat::glm45, "get_time"), "<tool_call>get_time\n");
  EXPECT_EQ(forced_call_prefix(ToolFormat::minimax_m2, "get_time"),
            "<minimax:tool_call>\n<invoke name=\"get_time\">\n");
  EXPECT_EQ(forced_call_prefix(ToolFormat::deepseek_v4, "get_time"),
            "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_time\">\n");
  EXPECT_EQ(required_call_prefix(ToolFormat::minimax_m2), "");  // the name is outside JSON: a plain JSON call
  EXPECT_EQ(required_call_prefix(ToolFormat::qwen3_coder), "<tool_call>\n");
  EXPECT_EQ(required_call_prefix(ToolFormat::glm45), "<tool_call>\n");
}

}  // namespace
}  // namespace colibri::server::xml_calls
