// The server's tool-call stream: one call whose string argument (a file an agent writes) is `range` bytes, pushed in
// 4-byte pieces as tokens arrive, in each syntax. Linear in the argument's size: each byte is searched and escaped
// once (before e0c2bb9 every push copied the arguments so far, 1 MiB took seconds).
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>
#include <string>

#include "colibri/server/chat_output.hpp"

namespace {

using colibri::server::ToolCallStream;
using colibri::server::ToolFormat;
using colibri::server::ToolSchemas;

std::string body(std::size_t n, bool json_escaped) {
  std::string s;
  for (std::size_t i = 0; s.size() < n; ++i)
    s += json_escaped && i % 8 == 7 ? "\\n" : std::string(1, "abc de f"[i % 8]);
  return s;
}

std::string answer(ToolFormat format, std::size_t n) {
  switch (format) {
    case ToolFormat::hermes:
      return "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"content\": \"" + body(n, true) +
             "\"}}\n</tool_call>";
    case ToolFormat::qwen3_coder:
      return "<tool_call>\n<function=write_file>\n<parameter=content>\n" + body(n, false) +
             "\n</parameter>\n</function>\n</tool_call>";
    case ToolFormat::glm45:
      return "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>" + body(n, false) +
             "</arg_value>\n</tool_call>";
    default:  // kimi_k2
      return "<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0<|tool_call_argument_begin|>"
             "{\"content\": \"" +
             body(n, true) + "\"}<|tool_call_end|><|tool_calls_section_end|>";
  }
}

void BM_ToolCallStream(benchmark::State& state, ToolFormat format) {
  const ToolSchemas tools(nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object",
          "properties": {"content": {"type": "string"}}}}}])"));
  const std::string text = answer(format, static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    ToolCallStream stream(format, tools);
    std::size_t sent = 0;
    for (std::size_t i = 0; i < text.size(); i += 4) {
      for (const auto& d : stream.push(std::string_view(text).substr(i, 4)).calls) sent += d.arguments.size();
    }
    for (const auto& d : stream.finish().calls) sent += d.arguments.size();
    benchmark::DoNotOptimize(sent);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(text.size()));
}

BENCHMARK_CAPTURE(BM_ToolCallStream, hermes, ToolFormat::hermes)->Arg(64 << 10)->Arg(1 << 20);
BENCHMARK_CAPTURE(BM_ToolCallStream, qwen3_coder, ToolFormat::qwen3_coder)->Arg(64 << 10)->Arg(1 << 20);
BENCHMARK_CAPTURE(BM_ToolCallStream, glm45, ToolFormat::glm45)->Arg(64 << 10)->Arg(1 << 20);
BENCHMARK_CAPTURE(BM_ToolCallStream, kimi_k2, ToolFormat::kimi_k2)->Arg(64 << 10)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
