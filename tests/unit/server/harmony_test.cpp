// gpt-oss's harmony format: HarmonyStream splits the answer's channels into reasoning, content and tool calls the
// same way whatever the chunking (every marker split at every byte), never lets a marker into what it returns, keeps
// what a model cut off mid-message wrote, and streams pieces of each call that add up to it (and to no complete JSON
// for a call that is none).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "colibri/server/chat_output.hpp"
#include "unit/tokenizer/test_paths.hpp"

namespace colibri::server {
namespace {

using nlohmann::json;

// What the official template's generation prompt ends with (and colibri's built-in gpt-oss template's).
constexpr std::string_view kPrompt = "<|start|>user<|message|>What is the weather in Paris?<|end|><|start|>assistant";

constexpr std::string_view kMarkers[] = {"<|start|>",  "<|end|>",  "<|message|>",   "<|channel|>",    "<|constrain|>",
                                         "<|return|>", "<|call|>", "<|endoftext|>", "<|startoftext|>"};

struct Result {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool operator==(const Result&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "{reasoning " << json(r.reasoning) << ", content " << json(r.content) << ", calls [";
  for (const auto& [name, args] : r.calls) os << name << "(" << args << ") ";
  return os << "]}";
}

// A stream's call pieces, by index: the name, the arguments so far, and whether the last piece came.
struct Pieces {
  std::string name, arguments;
  bool last = false;
};

void add(Result& r, HarmonyOutput out, std::vector<Pieces>& pieces) {
  for (const auto& d : out.deltas) {
    if (d.index == pieces.size()) {
      EXPECT_FALSE(d.name.empty()) << "a call's first piece names it";
      pieces.emplace_back();
      pieces.back().name = d.name;
    } else {
      ASSERT_LT(d.index, pieces.size()) << "calls come in order";
      EXPECT_EQ(d.name, "");
      EXPECT_FALSE(pieces[d.index].last) << "a piece after the last";
    }
    pieces[d.index].arguments += d.arguments;
    pieces[d.index].last = d.last;
  }
  for (const auto marker : kMarkers) {
    EXPECT_EQ(out.content.find(marker), std::string::npos) << out.content;
    EXPECT_EQ(out.reasoning.find(marker), std::string::npos) << out.reasoning;
  }
  r.reasoning += out.reasoning;
  r.content += out.content;
  for (auto& c : out.calls) {
    EXPECT_TRUE(c.id.empty());
    r.calls.emplace_back(c.name, c.arguments);
  }
}

// The text pushed in the pieces that `cuts` (ascending offsets) make, then finished. The calls' streamed pieces add
// up to the calls, and a call that never got its last piece has no complete JSON.
Result run(std::string_view prompt, bool tools, std::string_view text, const std::vector<std::size_t>& cuts) {
  HarmonyStream stream(prompt, tools);
  Result r;
  std::vector<Pieces> pieces;
  std::size_t from = 0;
  for (const std::size_t cut : cuts) {
    add(r, stream.push(text.substr(from, cut - from)), pieces);
    from = cut;
  }
  add(r, stream.push(text.substr(from)), pieces);
  add(r, stream.finish(), pieces);
  std::vector<std::pair<std::string, std::string>> streamed;
  for (const auto& p : pieces) {
    if (p.last) {
      streamed.emplace_back(p.name, p.arguments);
    } else {
      EXPECT_FALSE(json::accept(p.arguments)) << text << ": " << p.arguments;
    }
  }
  EXPECT_EQ(streamed, r.calls) << text;
  return r;
}

// Whole, one byte at a time, and split in two and in three at every pair of byte boundaries: always `want`.
void expect_split(std::string_view prompt, bool tools, std::string_view text, const Result& want) {
  EXPECT_EQ(run(prompt, tools, text, {}), want) << text;
  std::vector<std::size_t> bytes;
  for (std::size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  EXPECT_EQ(run(prompt, tools, text, bytes), want) << text << " (byte by byte)";
  for (std::size_t i = 0; i <= text.size(); ++i) {
    for (std::size_t j = i; j <= text.size(); ++j) {
      const Result got = run(prompt, tools, text, {i, j});
      if (got != want) {
        ADD_FAILURE() << text << " cut at " << i << " and " << j << ": " << got << ", want " << want;
        return;
      }
    }
  }
}

TEST(Harmony, AnalysisThenFinal) {
  const std::string text =
      "<|channel|>analysis<|message|>The user asks about weather; answer briefly.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.";
  const Result want{"The user asks about weather; answer briefly.", "It is sunny in Paris.", {}};
  expect_split(kPrompt, false, text, want);
  // <|return|> is an end token and usually not in the text; where it is, it changes nothing.
  expect_split(kPrompt, false, text + "<|return|>", want);
  // Several analysis messages (thinking between calls) add up.
  expect_split(kPrompt, false,
               "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis<|message|>Second."
               "<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
               Result{"First.Second.", "Done.", {}});
}

TEST(Harmony, FinalOnly) {
  expect_split(kPrompt, false, "<|channel|>final<|message|>Bonjour!", Result{"", "Bonjour!", {}});
  // A message with no channel is content too.
  expect_split(kPrompt, false, "<|message|>No channel.", Result{"", "No channel.", {}});
  // Text that merely looks like markup stays text.
  expect_split(kPrompt, false, "<|channel|>final<|message|>Use a < b and <|x|> or |> in code.",
               Result{"", "Use a < b and <|x|> or |> in code.", {}});
}

TEST(Harmony, ToolCall) {
  const std::string text =
      "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
      "{\"location\":\"Paris\"}<|call|>";
  expect_split(kPrompt, true, text, Result{"Need the weather tool.", "", {{"get_weather", R"({"location":"Paris"})"}}});
  // <|call|> is an end token, so the text usually stops before it: the call is complete at the end.
  expect_split(kPrompt, true, text.substr(0, text.size() - 8),
               Result{"Need the weather tool.", "", {{"get_weather", R"({"location":"Paris"})"}}});
  // The recipient may come before the channel, and "json" without <|constrain|> (what the template writes for
  // earlier calls); the arguments are the object without the spaces outside its strings, as other formats' are.
  expect_split(kPrompt, true,
               " to=functions.lookup<|channel|>commentary json<|message|> {\"q\": 1, \"s\": \"a b\"}\n<|call|>",
               Result{"", "", {{"lookup", R"({"q":1,"s":"a b"})"}}});
  // A preamble (commentary with no recipient) is for the user: content.
  expect_split(kPrompt, true,
               "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary "
               "to=functions.get_weather <|constrain|>json<|message|>{}<|call|>",
               Result{"", "Let me check.", {{"get_weather", "{}"}}});
  // No arguments at all: an empty object.
  expect_split(kPrompt, true, "<|channel|>commentary to=functions.now <|constrain|>json<|message|><|call|>",
               Result{"", "", {{"now", "{}"}}});
  // Without tools in the request the model's call is not one: its text is kept as reasoning, never content.
  expect_split(kPrompt, false, text, Result{"Need the weather tool.{\"location\":\"Paris\"}", "", {}});
}

// A call whose text is no JSON object is none: its text is reasoning (written for the tool, not the user).
TEST(Harmony, ACallThatIsNoJsonObjectIsReasoning) {
  const std::string header = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>";
  for (const std::string body : {"{\"x\": tru}", "{\"x\": 1} more", "[1]", "plain words", "{\"x\": 1"}) {
    expect_split(kPrompt, true, header + body + "<|call|>", Result{body, "", {}});
  }
  // Calls around it are kept.
  expect_split(kPrompt, true,
               header + "{}<|call|><|start|>assistant" + header + "{\"x\"<|call|><|start|>assistant" + header +
                   "{\"y\": 2}<|call|>",
               Result{"{\"x\"", "", {{"f", "{}"}, {"f", R"({"y":2})"}}});
}

// A message to a function the request does not offer is no call: its text is reasoning, as for any other recipient.
TEST(Harmony, OnlyTheRequestsFunctionsAreCalled) {
  const ToolSchemas tools(
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])"));
  const std::string text =
      "<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{\"path\": \"/\"}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|>";
  for (const std::size_t step : {std::size_t{1}, std::size_t{5}, text.size()}) {
    HarmonyStream stream(kPrompt, true, tools);
    std::string reasoning;
    std::vector<std::string> named, called;
    auto take = [&](const HarmonyOutput& out) {
      reasoning += out.reasoning;
      for (const auto& d : out.deltas) {
        if (!d.name.empty()) named.push_back(d.name);
      }
      for (const auto& c : out.calls) called.push_back(c.name);
    };
    for (std::size_t i = 0; i < text.size(); i += step) take(stream.push(std::string_view(text).substr(i, step)));
    take(stream.finish());
    EXPECT_EQ(reasoning, "{\"path\": \"/\"}") << step;
    EXPECT_EQ(named, std::vector<std::string>{"get_weather"}) << step;
    EXPECT_EQ(called, std::vector<std::string>{"get_weather"}) << step;
  }
}

TEST(Harmony, CallsAreReturnedAsSoonAsTheyEnd) {
  HarmonyStream stream(kPrompt, true);
  EXPECT_TRUE(stream.push("<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"x\":").calls.empty());
  const HarmonyOutput first =
      stream.push("1}<|call|><|start|>assistant<|channel|>commentary to=functions.b<|message|>");
  ASSERT_EQ(first.calls.size(), 1u);
  EXPECT_EQ(first.calls[0].name, "a");
  EXPECT_EQ(first.calls[0].arguments, R"({"x":1})");
  const HarmonyOutput second = stream.finish();
  ASSERT_EQ(second.calls.size(), 1u);
  EXPECT_EQ(second.calls[0].name, "b");
  EXPECT_EQ(second.calls[0].arguments, "{}");
}

TEST(Harmony, TextStreamsAsItComes) {
  HarmonyStream stream(kPrompt, false);
  EXPECT_EQ(stream.push("<|channel|>analysis<|message|>Thinking").reasoning, "Thinking");
  EXPECT_EQ(stream.push(" more<|e").reasoning, " more");  // the start of a marker waits
  HarmonyOutput out = stream.push("nd|><|start|>assistant<|channel|>final<|message|>Hi");
  EXPECT_EQ(out.reasoning, "");
  EXPECT_EQ(out.content, "Hi");
  EXPECT_EQ(stream.push(" there").content, " there");
  out = stream.finish();
  EXPECT_EQ(out.content, "");
  EXPECT_EQ(out.reasoning, "");
}

TEST(Harmony, UnknownChannelsAndRolesAreNotContent) {
  expect_split(kPrompt, true,
               "<|channel|>scratchpad<|message|>hidden<|end|><|start|>assistant<|channel|>final<|message|>shown",
               Result{"hidden", "shown", {}});
  // A recipient that is no function (a built-in tool) is not a call of the client's tools.
  expect_split(kPrompt, true, "<|channel|>analysis to=browser.search<|message|>{\"query\":\"x\"}<|call|>",
               Result{"{\"query\":\"x\"}", "", {}});
  // The model imagining the tool's answer after its call.
  expect_split(kPrompt, true,
               "<|channel|>commentary to=functions.f<|message|>{}<|call|><|start|>functions.f to=assistant"
               "<|channel|>commentary<|message|>{\"temp\": 20}<|end|>",
               Result{"{\"temp\": 20}", "", {{"f", "{}"}}});
}

TEST(Harmony, CutOffMidMessage) {
  // By max_tokens: what the message had so far is kept where it belongs.
  expect_split(kPrompt, false, "<|channel|>analysis<|message|>Thinking ab", Result{"Thinking ab", "", {}});
  expect_split(kPrompt, false,
               "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>final<|message|>Half an ans",
               Result{"Done.", "Half an ans", {}});
  // A call cut off before its object closed is no call: its text is reasoning, as any message not for the user.
  expect_split(kPrompt, true, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": [1,",
               Result{"{\"a\": [1,", "", {}});
  // Its object whole, it is (the server's finish_reason says "length").
  expect_split(kPrompt, true, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": [1]} ",
               Result{"", "", {{"f", R"({"a":[1]})"}}});
  // Cut off in a header: nothing of it is returned.
  expect_split(kPrompt, false, "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin",
               Result{"x", "", {}});
  expect_split(kPrompt, true, "<|channel|>commentary to=functions.get_wea", Result{});
  expect_split(kPrompt, false, "", Result{});
}

TEST(Harmony, WherePromptLeavesTheAnswer) {
  // A prompt that opens a message (continue_final_message, or a template that starts the final channel).
  expect_split("<|start|>assistant<|channel|>final<|message|>The answer is", false, " 42.<|return|>",
               Result{"", " 42.", {}});
  expect_split("<|start|>assistant<|channel|>analysis<|message|>", false,
               "Hmm.<|end|><|start|>assistant<|channel|>final<|message|>Yes.", Result{"Hmm.", "Yes.", {}});
  expect_split("<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>", true,
               R"({"k": "v"})", Result{"", "", {{"f", R"({"k":"v"})"}}});
  // A prompt that closes its last message: the answer writes its own <|start|>.
  expect_split("<|start|>user<|message|>Hi<|end|>", false, "<|start|>assistant<|channel|>final<|message|>Hello",
               Result{"", "Hello", {}});
  // A bare <|start|>: the answer names its role first.
  expect_split("<|start|>user<|message|>Hi<|end|><|start|>", false, "assistant<|channel|>final<|message|>Hello",
               Result{"", "Hello", {}});
}

TEST(Harmony, AModelOutsideTheFormatIsContent) {
  // Text with no header at all (a model that does not speak harmony) streams as content.
  expect_split(kPrompt, false, "Hello there.", Result{"", "Hello there.", {}});
  HarmonyStream stream(kPrompt, false);
  EXPECT_EQ(stream.push("Plain").content, "Plain");
  // Markers in odd places never come out: a header that never reaches <|message|>, stray ends and repeats.
  expect_split(kPrompt, false, "<|channel|><|channel|><|end|><|end|>", Result{});
  expect_split(kPrompt, false, "<|channel|>final<|message|>a<|message|>b<|constrain|>c<|startoftext|>d",
               Result{"", "abcd", {}});
  expect_split(kPrompt, false, "<|channel|>analysis<|message|>a<|channel|>final<|message|>b",
               Result{"a", "b", {}});  // a new header without the <|end|> before it
  // An end before the header's <|message|>: the header restarts.
  expect_split(kPrompt, false, "<|channel|>analysis<|end|><|start|>assistant<|channel|>final<|message|>ok",
               Result{"", "ok", {}});
  const std::string endless = "<|channel|>" + std::string(600, 'x');
  EXPECT_EQ(run(kPrompt, false, endless, {}), (Result{"", std::string(600, 'x'), {}}));
}

// Found by fuzzing (tests/fuzz/fuzz_chat_output.cpp): a whole push took everything before <|message|> as a header
// where pieces had already sent its start as content (it did not start like one), and a "header" of more than 512
// bytes ended where the pieces happened to end. Both are now decided from the front of the text alone.
TEST(Harmony, TheSameTextGivesTheSameMessagesHoweverItIsCut) {
  constexpr std::string_view kFinalOpen = "<|start|>assistant<|channel|>final<|message|>";
  expect_split(kFinalOpen, false, "Hi.<|end|>assistant<|channel|>final<|message|>Bye",
               Result{"", "Hi.assistantBye", {}});  // the model left out <|start|>: its role is text
  expect_split(kPrompt, false, "x<|end|>y<|start|>assistant<|channel|>final<|message|>z", Result{"", "xyz", {}});
  for (const std::size_t length : {400, 497, 500, 501, 510, 520, 600}) {
    const std::string text = "<|channel|>final" + std::string(length, 'x') + "<|message|>hi<|end|>";
    const Result whole = run(kPrompt, false, text, {});
    for (std::size_t cut = 0; cut <= text.size(); ++cut) {
      const Result got = run(kPrompt, false, text, {cut});
      ASSERT_EQ(got, whole) << "header of " << length << " bytes cut at " << cut;
    }
    if (16 + length <= 512) {
      EXPECT_EQ(whole.reasoning + whole.content, "hi") << length;  // a long header, still one (of no known channel)
    } else {
      EXPECT_EQ(whole, (Result{"", "final" + std::string(length, 'x') + "hi", {}})) << length;  // no header
    }
  }
}

TEST(Harmony, TemplatesThatSpeakIt) {
  const auto builtin = json::parse(test::read_text(test::source_dir() / "tests/data/chat/golden/builtin_gpt-oss.json"));
  const std::string source = builtin["source"].get<std::string>();
  EXPECT_TRUE(template_is_harmony(source));
  EXPECT_EQ(detect_tool_format(source), ToolFormat::harmony);
  EXPECT_EQ(tool_format_name(ToolFormat::harmony), "harmony");
  const auto markers = tool_markers(ToolFormat::harmony);
  EXPECT_NE(std::find(markers.begin(), markers.end(), "<|channel|>"), markers.end());
  // The shape of openai/gpt-oss's chat_template.jinja: earlier calls and the generation prompt.
  const std::string official =
      "{%- if tool_calls %}{{- \"<|start|>assistant to=\" + \"functions.\" + tool_call.name + "
      "\"<|channel|>commentary json<|message|>\" }}{%- endif %}{%- if add_generation_prompt -%}"
      "<|start|>assistant{%- endif -%}";
  EXPECT_TRUE(template_is_harmony(official));
  const auto qwen3 = json::parse(test::read_text(test::source_dir() / "tests/data/chat/golden/qwen3.json"));
  EXPECT_FALSE(template_is_harmony(qwen3["source"].get<std::string>()));
  EXPECT_FALSE(template_is_harmony("<|im_start|>assistant\n"));
  // A named call: the prompt opens the call's message and the model writes the arguments.
  EXPECT_EQ(forced_call_prefix(ToolFormat::harmony, "get_weather"),
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
  EXPECT_EQ(required_call_prefix(ToolFormat::harmony), "");
  // Its calls are HarmonyStream's: the generic parser leaves the text alone.
  EXPECT_EQ(parse_tool_calls(ToolFormat::harmony, "x").content, "x");
}

}  // namespace
}  // namespace colibri::server
