// Shared by the tool-call tests: what a ToolCallStream sent when the text was pushed in pieces, checked as a client
// reads it (a call's first piece names it, calls come in order, every piece is valid UTF-8), and a parse's calls.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "colibri/server/chat_output.hpp"

namespace colibri::server::tool_test {

using nlohmann::json;

inline std::vector<std::pair<std::string, json>> names_and_args(const ToolParse& p) {
  std::vector<std::pair<std::string, json>> out;
  for (const auto& c : p.calls) out.emplace_back(c.name, json::parse(c.arguments));
  return out;
}

// What a stream sent, pushed in pieces of `step` bytes: the content, each call's pieces, and what finish() gave.
struct Streamed {
  std::string content;                        // sent by push()
  std::vector<std::string> names;             // by call index, from each call's first piece
  std::vector<std::string> arguments;         // by call index: its pieces added up
  std::vector<std::size_t> pushed_pieces;     // by call index: the argument pieces push() sent
  std::vector<std::string> pushed_arguments;  // by call index: the arguments push() sent
  ToolStreamEnd end;
};

inline Streamed stream_in_steps(ToolCallStream stream, std::string_view text, std::size_t step) {
  Streamed s;
  auto take = [&](const std::vector<ToolCallDelta>& deltas, bool pushed) {
    for (const auto& d : deltas) {
      if (d.index >= s.names.size()) {
        // A call's first piece names it, and calls come in order.
        EXPECT_EQ(d.index, s.names.size()) << text;
        EXPECT_FALSE(d.name.empty()) << text;
        s.names.push_back(d.name);
        s.arguments.emplace_back();
        s.pushed_pieces.push_back(0);
        s.pushed_arguments.emplace_back();
      } else {
        EXPECT_EQ(d.name, "") << "a later piece names the call again: " << text;
      }
      // Each piece goes out as a JSON string: never a part of a UTF-8 character.
      EXPECT_NO_THROW((void)json(d.arguments).dump()) << text;
      s.arguments[d.index] += d.arguments;
      if (pushed && !d.arguments.empty()) {
        ++s.pushed_pieces[d.index];
        s.pushed_arguments[d.index] += d.arguments;
      }
    }
  };
  for (std::size_t i = 0; i < text.size(); i += step) {
    ToolStreamOutput out = stream.push(text.substr(i, step));
    s.content += out.content;
    take(out.calls, true);
  }
  s.end = stream.finish();
  take(s.end.calls, false);
  return s;
}

// Wherever the answer stops (max_tokens, an end token), what the stream sent is right: the calls the whole parse
// finds, exactly, or, when it finds none, only call pieces that are no complete JSON and all the text as content.
inline void expect_every_cut_streams_safely(ToolFormat format, const std::string& answer, const ToolSchemas& tools) {
  for (std::size_t n = 0; n <= answer.size(); ++n) {
    const std::string_view text = std::string_view(answer).substr(0, n);
    const ToolParse whole = parse_tool_calls(format, text, tools);
    for (const std::size_t step : {std::size_t{1}, std::size_t{4}}) {
      const Streamed s = stream_in_steps(ToolCallStream(format, tools), text, step);
      if (whole.calls.empty()) {
        EXPECT_EQ(s.content + s.end.parse.content, text) << step;
        for (const auto& arguments : s.arguments) EXPECT_FALSE(json::accept(arguments)) << text;
        continue;
      }
      ASSERT_EQ(s.names.size(), whole.calls.size()) << text;
      for (std::size_t k = 0; k < whole.calls.size(); ++k) {
        EXPECT_EQ(s.names[k], whole.calls[k].name) << text;
        EXPECT_EQ(s.arguments[k], whole.calls[k].arguments) << text;
      }
    }
  }
}

}  // namespace colibri::server::tool_test
