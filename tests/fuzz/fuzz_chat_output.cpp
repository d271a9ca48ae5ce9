// What a model writes, split into content, reasoning and tool calls as it streams (the server's chat output). The
// model's text is arbitrary, and the property is that how it is cut into pushes never changes the result: the
// pieces add up to what one push of the whole text gives, and to what parse_tool_calls finds in the whole text.
// Input: a byte picking the splitter, a byte seeding the cuts, then the text.
#include <map>
#include <string>
#include <vector>

#include "colibri/server/chat_output.hpp"
#include "fuzz_common.hpp"

namespace {
using namespace colibri::server;

// Cuts `text` into pieces of 1..8 bytes (a small LCG from `seed`); seed 0 gives one piece.
std::vector<std::string_view> cut(std::string_view text, std::uint8_t seed) {
  if (seed == 0) return {text};
  std::vector<std::string_view> pieces;
  std::uint32_t state = seed;
  while (!text.empty()) {
    state = state * 1103515245U + 12345U;
    const std::size_t n = std::min<std::size_t>(text.size(), 1 + (state >> 16) % 8);
    pieces.push_back(text.substr(0, n));
    text.remove_prefix(n);
  }
  return pieces;
}

struct Calls {
  std::map<std::size_t, std::string> names, arguments;
  void add(const std::vector<ToolCallDelta>& deltas) {
    for (const auto& d : deltas) {
      if (!d.name.empty()) names[d.index] += d.name;
      arguments[d.index] += d.arguments;
    }
  }
};

std::string calls_text(const std::vector<ToolCall>& calls) {
  std::string s;
  for (const auto& c : calls) s += c.name + "(" + c.arguments + ")\n";
  return s;
}

struct ToolResult {
  std::string content;
  std::string calls;  // the parsed calls at the end
  Calls deltas;
};

ToolResult run_tool_stream(ToolCallStream stream, const std::vector<std::string_view>& pieces) {
  ToolResult r;
  for (const auto piece : pieces) {
    auto out = stream.push(piece);
    r.content += out.content;
    r.deltas.add(out.calls);
  }
  auto end = stream.finish();
  r.content += end.parse.content;
  r.calls = calls_text(end.parse.calls);
  r.deltas.add(end.calls);
  // The deltas of every call found add up to it (named once, by its name).
  for (std::size_t i = 0; i < end.parse.calls.size(); ++i) {
    FUZZ_CHECK(r.deltas.arguments[i] == end.parse.calls[i].arguments, "call " + std::to_string(i) + " arguments");
    FUZZ_CHECK(r.deltas.names[i] == end.parse.calls[i].name, "call " + std::to_string(i) + " name");
  }
  return r;
}

void check_tools(ToolFormat format, std::string_view text, std::uint8_t seed) {
  const auto whole = run_tool_stream(ToolCallStream(format), {text});
  const auto cut_up = run_tool_stream(ToolCallStream(format), cut(text, seed));
  FUZZ_CHECK(whole.content == cut_up.content,
             "content depends on the cuts: " + colibri::fuzz::versus(whole.content, cut_up.content));
  FUZZ_CHECK(whole.calls == cut_up.calls,
             "calls depend on the cuts: " + colibri::fuzz::versus(whole.calls, cut_up.calls));
  const auto parsed = parse_tool_calls(format, text);
  FUZZ_CHECK(parsed.content == whole.content, "the stream's content differs from parse_tool_calls': " +
                                                  colibri::fuzz::versus(whole.content, parsed.content));
  FUZZ_CHECK(calls_text(parsed.calls) == whole.calls, "the stream's calls differ from parse_tool_calls': " +
                                                          colibri::fuzz::versus(whole.calls, calls_text(parsed.calls)));
}

void check_stream_of(ToolCallStream (*make)(), std::string_view text, std::uint8_t seed) {
  const auto whole = run_tool_stream(make(), {text});
  const auto cut_up = run_tool_stream(make(), cut(text, seed));
  FUZZ_CHECK(whole.content == cut_up.content,
             "content depends on the cuts: " + colibri::fuzz::versus(whole.content, cut_up.content));
  FUZZ_CHECK(whole.calls == cut_up.calls,
             "calls depend on the cuts: " + colibri::fuzz::versus(whole.calls, cut_up.calls));
}

// Reasoning and content, pushed whole and cut up.
template <class Split>
void check_same_text(const Split& whole, const Split& cut_up) {
  FUZZ_CHECK(whole.reasoning == cut_up.reasoning,
             "reasoning depends on the cuts: " + colibri::fuzz::versus(whole.reasoning, cut_up.reasoning));
  FUZZ_CHECK(whole.content == cut_up.content,
             "content depends on the cuts: " + colibri::fuzz::versus(whole.content, cut_up.content));
}

void check_reasoning(bool starts_inside, std::string_view text, std::uint8_t seed) {
  auto run = [&](const std::vector<std::string_view>& pieces) {
    ReasoningStream stream(starts_inside);
    ReasoningSplit all;
    for (const auto piece : pieces) {
      auto out = stream.push(piece);
      all.reasoning += out.reasoning;
      all.content += out.content;
    }
    auto out = stream.finish();
    all.reasoning += out.reasoning;
    all.content += out.content;
    return all;
  };
  const auto whole = run({text});
  const auto cut_up = run(cut(text, seed));
  check_same_text(whole, cut_up);
}

void check_harmony(std::string_view prompt, bool tools, std::string_view text, std::uint8_t seed) {
  struct All {
    std::string reasoning, content, calls;
    Calls deltas;
  };
  auto run = [&](const std::vector<std::string_view>& pieces) {
    HarmonyStream stream(prompt, tools);
    All all;
    auto take = [&](const HarmonyOutput& out) {
      all.reasoning += out.reasoning;
      all.content += out.content;
      all.calls += calls_text(out.calls);
      all.deltas.add(out.deltas);
    };
    for (const auto piece : pieces) take(stream.push(piece));
    take(stream.finish());
    return all;
  };
  const auto whole = run({text});
  const auto cut_up = run(cut(text, seed));
  check_same_text(whole, cut_up);
  FUZZ_CHECK(whole.calls == cut_up.calls,
             "calls depend on the cuts: " + colibri::fuzz::versus(whole.calls, cut_up.calls));
  FUZZ_CHECK(whole.deltas.arguments == cut_up.deltas.arguments, "streamed arguments depend on the cuts");
}

ToolCallStream make_required() {
  return ToolCallStream::required_call();
}
ToolCallStream make_arguments_of() {
  return ToolCallStream::arguments_of("get_weather");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  colibri::fuzz::Input in(data, size);
  const std::uint8_t mode = in.byte();
  const std::uint8_t seed = in.byte();
  const std::string_view text = in.rest();
  switch (mode % 9) {
    case 0:
      check_tools((mode & 0x40) != 0   ? ToolFormat::llama3_json
                  : (mode & 0x20) != 0 ? ToolFormat::pythonic
                                       : ToolFormat::hermes,
                  text, seed);
      break;
    case 1: check_tools(ToolFormat::mistral, text, seed); break;
    case 2: check_tools(ToolFormat::deepseek_v3, text, seed); break;
    case 3: check_stream_of(make_required, text, seed); break;
    case 4: check_stream_of(make_arguments_of, text, seed); break;
    case 5: check_reasoning(false, text, seed); break;
    case 6: check_reasoning(true, text, seed); break;
    case 7: check_harmony("<|start|>assistant", (mode & 0x10) != 0, text, seed); break;
    case 8: check_harmony("<|start|>assistant<|channel|>final<|message|>", (mode & 0x10) != 0, text, seed); break;
  }
  return 0;
}
