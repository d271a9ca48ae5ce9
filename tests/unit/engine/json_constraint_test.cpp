#include "colibri/engine/json_constraint.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "unit/engine/json_feed.hpp"

namespace colibri::engine {
namespace {

using testing::accepted_prefix;

TEST(JsonConstraint, AcceptsValidObjectsWhole) {
  const std::vector<std::string> valid = {
      "{}",
      "{\n}",
      R"({"a":1})",
      R"({"a": -0.5e+10, "b": [true, false, null, 0, -12, 3.25E-2, "x"], "c": {"d": []}})",
      R"({"esc": "q\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00", "utf8": "é模😀"})",
      R"({"nested": [[[[{}]]]], "e": [ ] , "f" : { } })",
  };
  for (const auto& text : valid) {
    JsonConstraint c;
    EXPECT_EQ(accepted_prefix(text, c), text.size()) << text;
    EXPECT_TRUE(c.complete()) << text;
    EXPECT_FALSE(c.accepts(" ")) << "nothing after the object: " << text;
    EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
  }
  // Split anywhere, the pieces are accepted the same way (tokens are multi-byte).
  const std::string text = valid[3];
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    JsonConstraint c;
    ASSERT_TRUE(c.advance(text.substr(0, cut))) << cut;
    ASSERT_TRUE(c.advance(text.substr(cut))) << cut;
    EXPECT_TRUE(c.complete());
  }
}

TEST(JsonConstraint, RefusesTheFirstInvalidByte) {
  // text, how many bytes are valid
  const std::vector<std::pair<std::string, std::size_t>> invalid = {
      {"[1]", 0},                       // the top level must be an object
      {"x", 0},                         //
      {R"({a:1})", 1},                  // keys are strings
      {R"({"a" 1})", 5},                // the colon is missing
      {R"({"a":01})", 6},               // no leading zeros
      {R"({"a":1.})", 7},               // a fraction needs digits
      {R"({"a":1e})", 7},               // so does an exponent
      {R"({"a":-})", 6},                //
      {R"({"a":tru})", 8},              //
      {R"({"a":nul,})", 8},             //
      {R"({"a":[1,]})", 8},             // no trailing commas
      {R"({"a":1,})", 7},               //
      {R"({"a":[1}})", 7},              // brackets must match
      {"{\"a\":\"\x01\"}", 6},          // control characters must be escaped
      {R"({"a":"\x"})", 7},             // unknown escape
      {R"({"a":"\u12G4"})", 10},        // \u takes 4 hex digits
      {"{\"a\":\"\xC0\xAF\"}", 6},      // overlong UTF-8
      {"{\"a\":\"\xED\xA0\x80\"}", 7},  // a surrogate in UTF-8
      {"{\"a\":\"\xE6\x41\"}", 7},      // a lead byte without its continuation
      {"{} {}", 2},                     // one object only
      {"{\"a\":1}}", 7},                //
      {R"({"a":1e123})", 9},            // exponents of 2 digits at most: every number fits a double
      {"{\"a\":" + std::string(70, '7'), 5 + JsonConstraint::kMaxNumberLength},
  };
  for (const auto& [text, ok] : invalid) {
    JsonConstraint c;
    EXPECT_EQ(accepted_prefix(text, c), ok) << text;
    EXPECT_FALSE(c.accepts(text.substr(ok, 1))) << text;
    EXPECT_FALSE(JsonConstraint().accepts(text)) << text;
  }
}

TEST(JsonConstraint, DepthAndWhitespaceAreBounded) {
  JsonConstraint c;
  ASSERT_TRUE(c.advance("{\"a\":"));
  for (std::size_t i = 1; i < JsonConstraint::kMaxDepth; ++i) ASSERT_TRUE(c.advance("[")) << i;
  EXPECT_FALSE(c.accepts("["));
  EXPECT_TRUE(c.accepts("]"));
  JsonConstraint w;
  EXPECT_FALSE(w.accepts(" "));  // the answer starts with its '{'
  EXPECT_TRUE(w.advance("{"));
  EXPECT_TRUE(w.advance(std::string(JsonConstraint::kMaxWhitespaceRun, '\n')));
  EXPECT_FALSE(w.accepts(" "));
  EXPECT_TRUE(w.accepts("}"));
  // Spaces inside strings are text, not layout.
  EXPECT_TRUE(w.accepts("\"" + std::string(500, ' ') + "\""));
}

// Found by fuzzing (tests/fuzz/fuzz_json_constraint.cpp): a number that reached the length limit on a '.', 'e' or sign
// left no byte to follow (sampling had no token but to stop mid-object), and a lone \uDC00-\uDFFF escape made a
// "complete" text that strict parsers (nlohmann, serde_json) refuse.
TEST(JsonConstraint, LongNumbersLeaveADigitOrTheEndToFollow) {
  for (const std::string_view tail : {".", "e", "e+", ".5e-", "E-"}) {
    for (std::size_t digits = 1; digits <= JsonConstraint::kMaxNumberLength; ++digits) {
      JsonConstraint c;
      ASSERT_TRUE(c.advance("{\"a\":" + std::string(digits, '1')));
      std::string text = std::string(digits, '1');
      for (const char ch : tail) {
        if (!c.advance(std::string(1, ch))) break;
        text += ch;
      }
      EXPECT_TRUE(c.accepts("1") || c.accepts("}")) << "a dead end after " << text;
      if (c.accepts("1}")) {
        ASSERT_TRUE(c.advance("1}"));
        EXPECT_TRUE(nlohmann::json::parse("{\"a\":" + text + "1}").is_object()) << text;
      }
    }
  }
  JsonConstraint full;
  ASSERT_TRUE(full.advance("{\"a\":" + std::string(JsonConstraint::kMaxNumberLength, '1')));
  EXPECT_FALSE(full.accepts("1"));
  EXPECT_TRUE(full.accepts("}"));
}

TEST(JsonConstraint, SurrogateEscapesComeInPairs) {
  JsonConstraint c;
  ASSERT_TRUE(c.advance("{\"a\": \""));
  EXPECT_TRUE(c.accepts("\\ud83d\\ude00\""));
  EXPECT_TRUE(c.accepts("\\uDBFF\\uDFFF\""));
  EXPECT_TRUE(c.accepts("\\uD7FF\\uE000\\u00e9\\u0000\""));  // just outside the surrogate range, and others
  EXPECT_FALSE(c.accepts("\\udc00"));                        // a low half first
  EXPECT_FALSE(c.accepts("\\uDFFF"));
  EXPECT_FALSE(c.accepts("\\ud83d\""));  // a high half alone
  EXPECT_FALSE(c.accepts("\\ud83dx"));
  EXPECT_FALSE(c.accepts("\\ud83d\\n"));
  EXPECT_FALSE(c.accepts("\\ud83d\\u0041"));
  EXPECT_FALSE(c.accepts("\\ud83d\\ud83d"));
  ASSERT_TRUE(c.advance("\\ud83d"));
  EXPECT_FALSE(c.in_plain_string());  // JsonTokenMask must not pass plain text here
  ASSERT_TRUE(c.advance("\\ude00"));
  EXPECT_TRUE(c.in_plain_string());
  ASSERT_TRUE(c.advance("\"}"));
  EXPECT_TRUE(c.complete());
}

// A random walk that only takes bytes the automaton accepts, steered to close what it opened: every text it
// completes is valid JSON (checked by nlohmann), so the constraint never lets a model write invalid JSON.
TEST(JsonConstraint, EveryCompletedRandomWalkIsValidJson) {
  const std::string alphabet = "{}[]\",:0123456789-+.eE truefalsn\\u/bAF\n\t\xC3\xA9\xE6\xA8\xA1";
  std::mt19937 rng(1234);
  int completed = 0;
  for (int walk = 0; walk < 3000; ++walk) {
    JsonConstraint c;
    std::string text;
    for (int step = 0; step < 400 && !c.complete(); ++step) {
      std::vector<char> options;
      for (const char ch : alphabet) {
        if (c.accepts(std::string(1, ch))) options.push_back(ch);
      }
      ASSERT_FALSE(options.empty()) << "a dead end after " << text;  // some byte always continues valid JSON
      // Late in the walk prefer closing brackets and quotes so that walks finish.
      char pick = options[rng() % options.size()];
      if (step > 200) {
        for (const char ch : {'"', '}', ']', '0'}) {
          if (c.accepts(std::string(1, ch)) && rng() % 2 == 0) pick = ch;
        }
      }
      ASSERT_TRUE(c.advance(std::string(1, pick)));
      text += pick;
    }
    if (!c.complete()) continue;
    ++completed;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
    EXPECT_TRUE(j.is_object()) << text;
  }
  EXPECT_GT(completed, 1000);
}

}  // namespace
}  // namespace colibri::engine
