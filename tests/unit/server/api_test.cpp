// The OpenAI wire format: request validation (status, param, code) and response shapes.
#include "colibri/server/api.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "colibri/server/server.hpp"
#include "unit/tokenizer/test_paths.hpp"

namespace colibri::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::optional<ApiError> parse(const std::string& body, Endpoint ep, CompletionRequest& out) {
  return parse_completion_request(body, ep, out);
}

ApiError expect_error(const std::string& body, Endpoint ep = Endpoint::chat) {
  CompletionRequest r;
  auto e = parse(body, ep, r);
  EXPECT_TRUE(e.has_value()) << body;
  return e.value_or(ApiError{});
}

const char* kChat = R"({"model":"m","messages":[{"role":"user","content":"hi"}]})";

TEST(ServerApi, ValidChatRequestWithEveryOption) {
  CompletionRequest r;
  auto e = parse(R"({"model":"tiny","messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_tokens":7,"temperature":0.5,"top_p":0.9,"seed":42,"presence_penalty":0.5,"frequency_penalty":-1,
      "stop":["x","yz"],"stream":true,"stream_options":{"include_usage":true},"n":1,"user":"u"})",
                 Endpoint::chat, r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.model, "tiny");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1]["content"], "a\nb");  // parts joined by newlines, as vLLM and llama-server
  // An assistant's refusal part (OpenAI's history of a refused answer) is read as its text, as vLLM reads it.
  CompletionRequest refused;
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"},
      {"role":"assistant","content":[{"type":"refusal","refusal":"I can't."}]},{"role":"user","content":"y"}]})",
                     Endpoint::chat, refused));
  EXPECT_EQ(refused.messages[1]["content"], "I can't.");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -1.0f);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.sampling.validate());
}

TEST(ServerApi, OpenAiSamplingDefaults) {
  CompletionRequest r;
  ASSERT_FALSE(parse(kChat, Endpoint::chat, r));
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.0f);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.seed_given);
  // -1 is a random seed (as llama-server and colibri-cli --seed -1); another negative one is a seed.
  for (const auto& [seed, given] :
       std::vector<std::pair<std::string, bool>>{{"-1", false}, {"-2", true}, {"0", true}}) {
    ASSERT_FALSE(
        parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"seed":)" + seed + "}", Endpoint::chat, r));
    EXPECT_EQ(r.seed_given, given) << seed;
  }
}

TEST(ServerApi, TopPZeroMeansGreedy) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"x","top_p":0})", Endpoint::completions, r));
  EXPECT_LE(r.sampling.temperature, 0.0f);
  EXPECT_TRUE(r.sampling.validate());
}

TEST(ServerApi, CompletionPromptForms) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"hello","echo":true})", Endpoint::completions, r));
  EXPECT_EQ(r.prompt, "hello");
  EXPECT_TRUE(r.echo);
  EXPECT_FALSE(r.prompt_is_tokens);
  ASSERT_FALSE(parse(R"({"model":"m","prompt":["only"]})", Endpoint::completions, r));
  EXPECT_EQ(r.prompt, "only");
  ASSERT_FALSE(parse(R"({"model":"m","prompt":[1,2,3]})", Endpoint::completions, r));
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<std::int32_t>{1, 2, 3}));
  ASSERT_FALSE(parse(R"({"model":"m","prompt":[[4,5]]})", Endpoint::completions, r));
  EXPECT_EQ(r.prompt_tokens, (std::vector<std::int32_t>{4, 5}));
  EXPECT_EQ(r.prompt_count(), 1U);
  // A batch: one choice per prompt, all texts or all token ids.
  CompletionRequest b;
  ASSERT_FALSE(parse(R"({"model":"m","prompt":["a","b","c"]})", Endpoint::completions, b));
  EXPECT_EQ(b.prompt, "a");
  EXPECT_EQ(b.more_prompts, (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(b.prompt_count(), 3U);
  CompletionRequest t;
  ASSERT_FALSE(parse(R"({"model":"m","prompt":[[1],[2,3]]})", Endpoint::completions, t));
  EXPECT_TRUE(t.prompt_is_tokens);
  EXPECT_EQ(t.prompt_tokens, (std::vector<std::int32_t>{1}));
  ASSERT_EQ(t.more_prompt_tokens.size(), 1U);
  EXPECT_EQ(t.more_prompt_tokens[0], (std::vector<std::int32_t>{2, 3}));
  std::string many = R"({"model":"m","prompt":[)";
  for (int i = 0; i <= kMaxPrompts; ++i) many += i ? ",\"x\"" : "\"x\"";
  CompletionRequest too_many;
  auto e = parse(many + "]}", Endpoint::completions, too_many);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find(std::to_string(kMaxPrompts + 1) + " prompts"), std::string::npos) << e->message;
}

TEST(ServerApi, MalformedBodies) {
  for (const char* body : {"", "{", "{\"model\": }", "nul", "{\"a\":1}}", "\xff\xfe"}) {
    auto e = expect_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(e.message.find("parse the JSON"), std::string::npos) << body;
  }
  auto e = expect_error("[1,2]");
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("JSON object"), std::string::npos);
  // The parser's own words say where it failed.
  EXPECT_NE(expect_error("{\"model\": }").message.find("parse error at line 1, column 11"), std::string::npos);
}

TEST(ServerApi, HalfASurrogatePairBecomesAReplacementCharacter) {
  // JavaScript's slice() through an emoji sends half of its pair: Python's json (vLLM) reads it; so does this.
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(R"({"prompt": "Summary of \ud83d"})", Endpoint::completions, r));
  EXPECT_EQ(r.prompt, "Summary of \xEF\xBF\xBD");
  ASSERT_FALSE(parse_completion_request(R"({"prompt": "\ude00 and \ud83d\ude00"})", Endpoint::completions, r));
  EXPECT_EQ(r.prompt, "\xEF\xBF\xBD and \xF0\x9F\x98\x80");  // a whole pair stays the character
  EXPECT_EQ(with_lone_surrogates_replaced(R"({"a": "\\ud83d", "b": "\ud83d\"})"),
            R"({"a": "\\ud83d", "b": "\uFFFD\"})");  // an escaped backslash is not an escape
  EXPECT_EQ(with_lone_surrogates_replaced(R"({"\ud83d": 1})"), R"({"\uFFFD": 1})");
  // Fields read from the body again with their key order kept (a schema, template variables, tools) read the
  // same text: they were a 500 ("cannot use value() with discarded").
  ASSERT_FALSE(parse_completion_request(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"v":
      "\ud800"},"response_format":{"type":"json_schema","json_schema":{"name":"\ud800","schema":{"type":"object",
      "properties":{"a":{"const":"\ud800","description":"\udfff"}},"required":["a"]}}}})",
                                        Endpoint::chat, r));
  EXPECT_EQ(r.template_kwargs["v"], "\xEF\xBF\xBD");
  ASSERT_NE(r.json_schema, nullptr);
  EXPECT_TRUE(engine::JsonConstraint(r.json_schema.get()).advance("{\"a\": \"\xEF\xBF\xBD\"}"));
  TokenizeRequest t;
  ASSERT_FALSE(parse_tokenize_request(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"v":
      "\ud800"}})",
                                      t));
  EXPECT_EQ(t.chat_request.template_kwargs["v"], "\xEF\xBF\xBD");
}

TEST(ServerApi, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep(200000, '[');
  auto e = expect_error(deep);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("nests deeper"), std::string::npos);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[{{{{","b":[1,[2]]})"), 3u);
  EXPECT_EQ(json_nesting_depth(R"({"a":"\"[[["})"), 1u);
}

struct FieldCase {
  const char* body;
  const char* param;
  const char* code;
};

TEST(ServerApi, WrongTypesAndValuesNameTheField) {
  const FieldCase cases[] = {
      {R"({"model":5,"messages":[{"role":"user","content":"x"}]})", "model", "invalid_type"},
      {R"({"model":"m"})", "messages", "missing_required_parameter"},
      {R"({"model":"m","messages":"hi"})", "messages", "invalid_type"},
      {R"({"model":"m","messages":[]})", "messages", "invalid_value"},
      {R"({"model":"m","messages":[5]})", "messages[0]", "invalid_type"},
      {R"({"model":"m","messages":[{"content":"x"}]})", "messages[0].role", "missing_required_parameter"},
      {R"({"model":"m","messages":[{"role":"wizard","content":"x"}]})", "messages[0].role", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":7}]})", "messages[0].content", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user"}]})", "messages[0].content", "missing_required_parameter"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       "messages[0].content[0].type", "invalid_value"},
      // A refusal part is an assistant's; in a user message it is unknown, and it needs its "refusal" text.
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"refusal","refusal":"no"}]}]})",
       "messages[0].content[0].type", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"refusal"}]}]})",
       "messages[1].content[0].refusal", "missing_required_parameter"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature",
       "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":2.5})", "temperature", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":1.5})", "top_p", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"presence_penalty":-3})", "presence_penalty",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"frequency_penalty":true})", "frequency_penalty",
       "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":2.5})", "max_tokens", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"9"})", "max_tokens", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"seed":"1"})", "seed", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":17})", "n", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":0})", "n", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":1.5})", "n", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})",
       "stream_options", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":5})", "stop", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a",1]})", "stop[1]", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", "stop",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":3})", "logprobs", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":-1})", "top_logprobs",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":1.5})", "top_logprobs",
       "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":[1]})", "logit_bias", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"abc":1}})", "logit_bias",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"-4":1}})", "logit_bias",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"5":101}})", "logit_bias[\"5\"]",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"5":"1"}})", "logit_bias[\"5\"]",
       "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a"}}})",
       "response_format.json_schema.schema", "missing_required_parameter"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}}})",
       "response_format.json_schema.schema", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})",
       "response_format.type", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":"json"})", "response_format",
       "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools[0].function",
       "missing_required_parameter"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":{"type":"function"}})", "tools",
       "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval","function":{}}]})",
       "tools[0].type", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]})",
       "tools[1].function.name", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]})",
       "tools[0].function.parameters", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})", "tool_choice",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"always"})",
       "tool_choice", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"parallel_tool_calls":"no"})", "parallel_tool_calls",
       "invalid_type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})", "functions",
       "unsupported_parameter"},
      // What vLLM or llama-server act on would be ignored: the answer would not be the one asked for.
      {R"({"messages":[{"role":"user","content":"x"}],"guided_choice":["yes","no"]})", "guided_choice",
       "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"guided_json":{"type":"object"}})", "guided_json",
       "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"grammar":"root ::= \"a\""})", "grammar",
       "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"json_schema":{"type":"object"}})", "json_schema",
       "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"n_predict":5})", "n_predict", "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"include_stop_str_in_output":true})",
       "include_stop_str_in_output", "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"bad_words":["a"]})", "bad_words", "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"use_beam_search":true})", "use_beam_search",
       "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"echo":true})", "echo", "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"echo":"yes"})", "echo", "invalid_type"},
      {R"({"messages":[{"role":"user","content":"x"}],"user":5})", "user", "invalid_type"},
      {R"({"messages":[{"role":"user","content":null}]})", "messages[0].content", "invalid_type"},
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":3})", "reasoning_effort", "invalid_type"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object","schema":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}})",
       "response_format.schema", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"tool","content":"21"}]})", "messages[0].tool_call_id",
       "missing_required_parameter"},
      {R"({"model":"m","messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages[0].tool_calls",
       "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"continue_final_message":true})",
       "continue_final_message", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"assistant","content":"x"}],"continue_final_message":true,"add_generation_prompt":true})",
       "continue_final_message", "invalid_value"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":1})", "add_generation_prompt",
       "invalid_type"},
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":{}}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "invalid_type"},
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]})",
       "messages[0].tool_calls[0].id", "missing_required_parameter"},
  };
  for (const auto& c : cases) {
    auto e = expect_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body << " -> " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
  }
  const FieldCase completion_cases[] = {
      {R"({"model":"m"})", "prompt", "missing_required_parameter"},
      {R"({"model":"m","prompt":5})", "prompt", "invalid_type"},
      {R"({"model":"m","prompt":["a",[1]]})", "prompt[1]", "invalid_type"},
      {R"({"model":"m","prompt":[[1],"a"]})", "prompt[1]", "invalid_type"},
      {R"({"model":"m","prompt":["a",5]})", "prompt[1]", "invalid_type"},
      {R"({"model":"m","prompt":[[1],[2,-1]]})", "prompt[1][1]", "invalid_value"},
      {R"({"model":"m","prompt":[1,-2]})", "prompt[1]", "invalid_value"},
      {R"({"model":"m","prompt":[1,"x"]})", "prompt[1]", "invalid_type"},
      {R"({"model":"m","prompt":"x","echo":1})", "echo", "invalid_type"},
      {R"({"model":"m","prompt":"x","logprobs":true})", "logprobs", "invalid_type"},
      {R"({"model":"m","prompt":"x","logprobs":50})", "logprobs", "invalid_value"},
      {R"({"model":"m","prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]})", "tools",
       "unsupported_parameter"},
      {R"({"model":"m","prompt":"x","suffix":5})", "suffix", "invalid_type"},
      {R"({"model":"m","prompt":"x","continue_final_message":true})", "continue_final_message",
       "unsupported_parameter"},
      {R"({"model":"m","prompt":[1,2],"suffix":"y"})", "suffix", "invalid_value"},
      {R"({"prompt":"x","prompt_logprobs":1})", "prompt_logprobs", "unsupported_parameter"},
      {R"({"prompt":"x","reasoning_effort":"low"})", "reasoning_effort", "unsupported_parameter"},
  };
  for (const auto& c : completion_cases) {
    auto e = expect_error(c.body, Endpoint::completions);
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body << " -> " << e.message;
  }
}

TEST(ServerApi, NeutralValuesOfUnsupportedFieldsPassAndReasoningEffortReachesTheTemplate) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"messages":[{"role":"user","content":"x"}],"echo":false,"bad_words":[],"best_of":1,
      "use_beam_search":false,"include_stop_str_in_output":false,"guided_json":null,"user":"u1","grammar":"",
      "n_predict":-1,
      "reasoning_effort":"high"})",
                     Endpoint::chat, r));
  EXPECT_EQ(r.template_kwargs["reasoning_effort"], "high");
  // chat_template_kwargs says it more precisely, and wins.
  ASSERT_FALSE(parse(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"high",
      "chat_template_kwargs":{"reasoning_effort":"low"}})",
                     Endpoint::chat, r));
  EXPECT_EQ(r.template_kwargs["reasoning_effort"], "low");
  // llama-server's json_object with a schema is that schema.
  ASSERT_FALSE(parse(R"({"messages":[{"role":"user","content":"x"}],
      "response_format":{"type":"json_object","schema":{"type":"object","properties":{"a":{"type":"integer"}},
      "required":["a"]}}})",
                     Endpoint::chat, r));
  EXPECT_TRUE(r.json_object);
  ASSERT_TRUE(r.json_schema);
}

TEST(ServerApi, NoModelMeansTheServedOneAndWholeFloatsAreIntegers) {
  CompletionRequest r;
  ASSERT_FALSE(
      parse(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":5.0,"n":2.0,"seed":7.0})", Endpoint::chat, r));
  EXPECT_EQ(r.model, "");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.sampling.seed, 7u);
  auto e = expect_error(R"({"prompt":"x","max_tokens":5.5})", Endpoint::completions);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.code, "invalid_type");
  // A whole number too large for 64 bits is out of range, not of the wrong type.
  e = expect_error(R"({"prompt":"x","seed":1e30})", Endpoint::completions);
  EXPECT_EQ(e.param, "seed");
  EXPECT_EQ(e.code, "invalid_value");
  EXPECT_NE(e.message.find("expected an integer within 64 bits"), std::string::npos) << e.message;
}

TEST(ServerApi, ToolsAndToolHistoryAreRead) {
  // Tools keep the order their keys were written in (the template shows them to the model as JSON).
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[
      {"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object",
       "properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}}]})",
                     Endpoint::chat, r));
  EXPECT_EQ(r.tool_choice, CompletionRequest::ToolChoice::automatic);
  EXPECT_EQ(r.tools.dump(),
            R"([{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object",)"
            R"("properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}}])");
  EXPECT_TRUE(r.parallel_tool_calls);
  // "none" keeps them (the template may show them; no call is read); "required" with one tool is that tool; a named
  // one is kept.
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}}])";
  ASSERT_FALSE(
      parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],)" + tools + R"(,"tool_choice":"none"})",
            Endpoint::chat, r));
  EXPECT_EQ(r.tool_choice, CompletionRequest::ToolChoice::none);
  EXPECT_EQ(r.tools.dump(), R"([{"type":"function","function":{"name":"f"}}])");
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],)" + tools +
                         R"(,"tool_choice":"required","parallel_tool_calls":false})",
                     Endpoint::chat, r));
  EXPECT_EQ(r.tool_choice, CompletionRequest::ToolChoice::function);
  EXPECT_EQ(r.tool_choice_name, "f");
  EXPECT_FALSE(r.parallel_tool_calls);
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],)" + tools +
                         R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})",
                     Endpoint::chat, r));
  EXPECT_EQ(r.tool_choice, CompletionRequest::ToolChoice::function);
  // "required" with several tools: any of them.
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
      "function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],"tool_choice":"required"})",
                     Endpoint::chat, r));
  EXPECT_EQ(r.tool_choice, CompletionRequest::ToolChoice::required);
  EXPECT_EQ(r.tool_names, (std::vector<std::string>{"f", "g"}));
  // History: the calls as given (render_chat decides how the template sees the arguments); a call-only assistant
  // turn keeps null content; a tool result keeps its call id.
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"},
      {"role":"assistant","content":null,"tool_calls":[
        {"id":"c1","type":"function","function":{"name":"f","arguments":"{\"b\": 1, \"a\": [2]}"}},
        {"id":"c2","function":{"name":"g","arguments":"not json"}}]},
      {"role":"tool","tool_call_id":"c1","content":"ok"}]})",
                     Endpoint::chat, r));
  EXPECT_EQ(
      r.messages[1].dump(),
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f",)"
      R"("arguments":"{\"b\": 1, \"a\": [2]}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"not json"}}]})");
  EXPECT_EQ(r.messages[2].dump(), R"({"role":"tool","content":"ok","tool_call_id":"c1"})");
}

TEST(ServerApi, RenderChatFindsTheVariantTheTemplateTakes) {
  const ojson messages = ojson::parse(R"([{"role":"assistant","content":null,"tool_calls":[
      {"id":"c","type":"function","function":{"name":"f","arguments":"{\"z\": 1, \"a\": 2}"}}]}])");
  auto render = [&](const char* source) -> std::string {
    auto t = chat::Template::parse(source);
    EXPECT_TRUE(t.has_value());
    auto text = render_chat(*t, messages, {});
    return text ? *text : "error: " + text.error().message();
  };
  // tojson of the arguments (Mistral's way) gets the object, keys in the order written, not a quoted string.
  EXPECT_EQ(render("{{ messages[0].tool_calls[0].function.arguments | tojson }}"), R"({"z": 1, "a": 2})");
  // Adding them to a string (DeepSeek V3's way) fails for an object, so the given text is used.
  EXPECT_EQ(render("{{ 'args: ' + messages[0].tool_calls[0].function.arguments }}"), R"(args: {"z": 1, "a": 2})");
  // Null content: kept for a template that tests for it, "" for one that fails on it.
  EXPECT_EQ(render("{% if messages[0].content is none %}calls{% else %}text{% endif %}"), "calls");
  EXPECT_EQ(render("{{ messages[0].content + '!' }}"), "!");
  EXPECT_EQ(render("{{ 'a: ' + messages[0].tool_calls[0].function.arguments + messages[0].content }}"),
            R"(a: {"z": 1, "a": 2})");
  // An error no variant avoids comes back as the template's own.
  const std::string failed = render("{{ raise_exception('no assistant first') }}");
  EXPECT_NE(failed.find("no assistant first"), std::string::npos) << failed;
}

TEST(ServerApi, ToolCallResponseShapes) {
  const ResponseIds ids{"chatcmpl-1", 1700000000, "tiny"};
  const ToolCall call{"call_abc", "get_weather", R"({"city":"Oslo"})"};
  const auto body = completion_response(Endpoint::chat, ids, {{"", "tool_calls", nullptr, {call}}}, Usage{3, 4, 0});
  const auto& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["tool_calls"], json::array({call.to_json()}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  // Content beside calls is kept; without calls there is no tool_calls key.
  const auto both = completion_response(Endpoint::chat, ids, {{"Let me see.", "tool_calls", nullptr, {call}}}, {});
  EXPECT_EQ(both["choices"][0]["message"]["content"], "Let me see.");
  EXPECT_FALSE(
      completion_response(Endpoint::chat, ids, {{"hi", "stop", nullptr, {}}}, {})["choices"][0]["message"].contains(
          "tool_calls"));
  // Streamed: the first piece carries id, type and name; later ones only add arguments.
  const auto first = tool_call_chunk(ids, 2, 1, &call, "{\"ci");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["index"], 2);
  EXPECT_EQ(
      first["choices"][0]["delta"]["tool_calls"],
      json::parse(
          R"([{"index":1,"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":"{\"ci"}}])"));
  const auto later = tool_call_chunk(ids, 2, 1, nullptr, "ty\"}");
  EXPECT_EQ(later["choices"][0]["delta"]["tool_calls"],
            json::parse(R"([{"index":1,"function":{"arguments":"ty\"}"}}])"));
}

TEST(ServerApi, JsonSchemaResponseFormatIsCompiled) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
      "json_schema":{"name":"p","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}},
      "required":["a"],"additionalProperties":false}}}})",
                     Endpoint::chat, r));
  EXPECT_TRUE(r.json_object);
  ASSERT_NE(r.json_schema, nullptr);
  engine::JsonConstraint c(r.json_schema.get());
  EXPECT_TRUE(c.advance(R"({"a": 1})"));
  EXPECT_FALSE(engine::JsonConstraint(r.json_schema.get()).accepts(R"({"b")"));
  // The error names the place in the schema.
  auto e =
      expect_error(R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
      "json_schema":{"schema":{"type":"object","properties":{"a":{"type":"string","minLength":2}}}}}})");
  EXPECT_NE(e.message.find("properties.a.minLength"), std::string::npos) << e.message;
}

TEST(ServerApi, ChatTemplateKwargsAndReasoning) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],
                         "chat_template_kwargs":{"enable_thinking":false,"b":1,"a":2}})",
                     Endpoint::chat, r));
  EXPECT_EQ(r.template_kwargs.dump(), R"({"enable_thinking":false,"b":1,"a":2})");
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]})",
            "chat_template_kwargs"},
           {R"({"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":[]}})",
            "chat_template_kwargs.messages"},
           {R"({"model":"m","prompt":"x","chat_template_kwargs":{}})", "chat_template_kwargs"}}) {
    const auto ep = body.find("prompt") != std::string::npos ? Endpoint::completions : Endpoint::chat;
    auto e = expect_error(body, ep);
    EXPECT_EQ(e.param, param) << body;
  }
  const ResponseIds ids{"chatcmpl-1", 1700000000, "tiny"};
  const auto body = completion_response(Endpoint::chat, ids, {{"21", "stop", nullptr, {}, "3 times 7"}}, {});
  EXPECT_EQ(body["choices"][0]["message"]["reasoning_content"], "3 times 7");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "21");
  EXPECT_FALSE(
      completion_response(Endpoint::chat, ids, {{"21", "stop", nullptr, {}}}, {})["choices"][0]["message"].contains(
          "reasoning_content"));
  const auto piece = reasoning_chunk(ids, 1, "hmm");
  EXPECT_EQ(piece["choices"][0]["delta"], json({{"reasoning_content", "hmm"}}));
  EXPECT_EQ(piece["choices"][0]["index"], 1);
}

TEST(ServerApi, TokenizeRequests) {
  TokenizeRequest t;
  ASSERT_FALSE(parse_tokenize_request(R"({"prompt": "hi", "add_special_tokens": false})", t));
  EXPECT_EQ(std::tie(t.chat, t.text, t.add_special), (std::tuple{false, std::string("hi"), false}));
  ASSERT_FALSE(parse_tokenize_request(R"({"content": "yo", "add_special": true})", t));
  EXPECT_EQ(std::tie(t.text, t.add_special), (std::tuple{std::string("yo"), true}));
  // Each spelling's own default: vLLM adds the special tokens, llama.cpp does not.
  ASSERT_FALSE(parse_tokenize_request(R"({"prompt": "hi"})", t));
  EXPECT_TRUE(t.add_special);
  ASSERT_FALSE(parse_tokenize_request(R"({"content": "hi"})", t));
  EXPECT_FALSE(t.add_special);
  ASSERT_FALSE(parse_tokenize_request(
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})", t));
  EXPECT_TRUE(t.chat);
  EXPECT_FALSE(t.add_generation_prompt);
  EXPECT_EQ(t.chat_request.messages.size(), 1u);
  EXPECT_EQ(t.model, "m");
  // Two texts to count is one too many (which one was counted would be a guess).
  for (const char* both :
       {R"({"prompt": "a", "messages": [{"role": "user", "content": "x"}]})", R"({"prompt": "a", "content": "b"})"}) {
    auto twice = parse_tokenize_request(both, t);
    ASSERT_TRUE(twice.has_value()) << both;
    EXPECT_EQ(twice->code, "invalid_value");
  }
  // null is absent, as everywhere in the API: one text.
  ASSERT_FALSE(parse_tokenize_request(R"({"prompt": null, "messages": [{"role": "user", "content": "x"}]})", t));
  EXPECT_TRUE(t.chat);
  // A chat is checked as a chat completion is.
  auto e = parse_tokenize_request(R"({"messages": [{"role": "robot", "content": "x"}]})", t);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "messages[0].role");
  e = parse_tokenize_request(R"({"text": "x"})", t);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "missing_required_parameter");
  std::string model;
  std::vector<std::int32_t> tokens;
  ASSERT_FALSE(parse_detokenize_request(R"({"tokens": [1, 2, 3]})", model, tokens));
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{1, 2, 3}));
  for (const char* bad : {R"({"tokens": [-1]})", R"({"tokens": [1.5]})", R"({"tokens": [4294967296]})", "{}"}) {
    tokens.clear();
    auto err = parse_detokenize_request(bad, model, tokens);
    ASSERT_TRUE(err.has_value()) << bad;
    EXPECT_EQ(err->param.substr(0, 6), "tokens") << bad;
  }
}

TEST(ServerApi, SeveralChoices) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"x","n":3})", Endpoint::completions, r));
  EXPECT_EQ(r.n, 3);
  ASSERT_FALSE(parse(kChat, Endpoint::chat, r));
  EXPECT_EQ(r.n, 1);
  const ResponseIds ids{"chatcmpl-1", 1700000000, "tiny"};
  const auto body = completion_response(Endpoint::chat, ids,
                                        {{"a", "stop", nullptr, {}}, {"bc", "length", nullptr, {}}}, Usage{3, 4, 2});
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["message"]["content"], "bc");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(stream_chunk(Endpoint::completions, ids, "z", "", false, nullptr, 2)["choices"][0]["index"], 2);
}

TEST(ServerApi, VllmSamplingExtensionsAreRead) {
  CompletionRequest r;
  ASSERT_FALSE(
      parse(R"({"model":"m","prompt":"x","top_k":40,"min_p":0.1,"repetition_penalty":1.2})", Endpoint::completions, r));
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.2f);
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"x","top_k":-1})", Endpoint::completions, r));
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FALSE(r.ignore_eos);
  EXPECT_EQ(r.min_tokens, 0);
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"x","ignore_eos":true,"min_tokens":7})", Endpoint::completions, r));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.min_tokens, 7);
  EXPECT_EQ(expect_error(R"({"model":"m","prompt":"x","min_tokens":-1})", Endpoint::completions).param, "min_tokens");
  // More than max_tokens could never end on an end token: refused, as vLLM does; as many is fine.
  const auto over = expect_error(R"({"model":"m","prompt":"x","min_tokens":9,"max_tokens":8})", Endpoint::completions);
  EXPECT_EQ(over.param, "min_tokens");
  EXPECT_EQ(over.code, "invalid_value");
  EXPECT_NE(over.message.find("'min_tokens' (9) is more than 'max_tokens' (8)"), std::string::npos) << over.message;
  ASSERT_FALSE(
      parse(R"({"model":"m","prompt":"x","min_tokens":8,"max_completion_tokens":8})", Endpoint::completions, r));
  // Past 2^63 a max_tokens is still a large one (the context bounds it), not "below 1".
  ASSERT_FALSE(parse(R"({"prompt":"x","max_completion_tokens":9223372036854775808})", Endpoint::completions, r));
  EXPECT_EQ(r.max_tokens, std::numeric_limits<std::int64_t>::max());
  // Both past 2^63: compared and shown as given, not as the int64 cap they are held at.
  const auto huge =
      expect_error(R"({"model":"m","prompt":"x","min_tokens":18446744073709551615,"max_tokens":9223372036854775809})",
                   Endpoint::completions);
  EXPECT_NE(huge.message.find("'min_tokens' (18446744073709551615) is more than 'max_tokens' (9223372036854775809)"),
            std::string::npos)
      << huge.message;
  ASSERT_FALSE(parse(R"({"prompt":"x","min_tokens":9223372036854775809,"max_tokens":9223372036854775809})",
                     Endpoint::completions, r));
  EXPECT_EQ(expect_error(R"({"model":"m","prompt":"x","ignore_eos":1})", Endpoint::completions).code, "invalid_type");
  for (const char* body : {R"({"model":"m","prompt":"x","top_k":-2})", R"({"model":"m","prompt":"x","min_p":1.5})",
                           R"({"model":"m","prompt":"x","repetition_penalty":0})"}) {
    const auto e = expect_error(body, Endpoint::completions);
    EXPECT_EQ(e.code, "invalid_value") << body;
  }
  EXPECT_EQ(expect_error(R"({"model":"m","prompt":"x","top_k":2.5})", Endpoint::completions).param, "top_k");
}

TEST(ServerApi, LogprobsAndLogitBiasAreRead) {
  CompletionRequest r;
  ASSERT_FALSE(parse(kChat, Endpoint::chat, r));
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_TRUE(r.sampling.logit_bias.empty());
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true})", Endpoint::chat, r));
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":20,
                        "logit_bias":{"17":-100,"3":2.5},"response_format":{"type":"text"}})",
                     Endpoint::chat, r));
  EXPECT_EQ(r.logprobs, 20);
  EXPECT_FALSE(r.json_object);
  const std::vector<std::pair<std::int32_t, float>> bias = {{17, -100.0f}, {3, 2.5f}};
  auto got = r.sampling.logit_bias;
  std::sort(got.begin(), got.end());
  auto want = bias;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  ASSERT_FALSE(parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],
                        "response_format":{"type":"json_object"}})",
                     Endpoint::chat, r));
  EXPECT_TRUE(r.json_object);
  ASSERT_FALSE(
      parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false})", Endpoint::chat, r));
  EXPECT_EQ(r.logprobs, -1);
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"x","logprobs":5})", Endpoint::completions, r));
  EXPECT_EQ(r.logprobs, 5);
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"x","logprobs":0})", Endpoint::completions, r));
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_FALSE(parse(R"({"model":"m","prompt":"x","logprobs":null})", Endpoint::completions, r));
  EXPECT_EQ(r.logprobs, -1);
}

TEST(ServerApi, FormAndTextBodiesAreRefusedAndJsonOrNoTypePasses) {
  for (const char* ok : {"", "application/json", "application/json; charset=utf-8", "Application/JSON",
                         "application/vnd.api+json", "application/octet-stream"}) {
    EXPECT_FALSE(check_post_media_type(ok).has_value()) << ok;
  }
  for (const char* refused : {"text/plain", "text/plain;charset=UTF-8", " Text/Plain ",
                              "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"}) {
    const auto e = check_post_media_type(refused);
    ASSERT_TRUE(e.has_value()) << refused;
    EXPECT_EQ(e->status, 415);
    EXPECT_EQ(e->code, "unsupported_media_type");
    EXPECT_NE(e->message.find("-H 'Content-Type: application/json'"), std::string::npos) << e->message;
  }
  EXPECT_FALSE(check_post_encoding("").has_value());
  EXPECT_FALSE(check_post_encoding("Identity").has_value());
  const auto gz = check_post_encoding("gzip");
  ASSERT_TRUE(gz.has_value());
  EXPECT_EQ(gz->status, 415);
  EXPECT_NE(gz->message.find("'gzip'"), std::string::npos);
  EXPECT_NE(gz->message.find("uncompressed"), std::string::npos);
}

TEST(ServerApi, LogprobsObjectsHaveOpenAisShapes) {
  // Token 1 is "é" cut in two: its own bytes are not UTF-8, so "token" shows U+FFFD and "bytes" the byte.
  const std::map<std::int32_t, std::string> text = {{0, " the"}, {1, "\xc3"}, {2, "\xa9"}, {3, "x"}};
  const TokenBytes bytes_of = [&](std::int32_t id) { return text.at(id); };
  const std::vector<engine::TokenLogprob> tokens = {{0, -0.25f, {{0, -0.25f}, {3, -2.0f}}},
                                                    {1, -1.5f, {{1, -1.5f}, {0, -3.0f}}}};
  std::int64_t offset = 0;
  const json chat = logprobs_object(Endpoint::chat, tokens, bytes_of, offset);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_TRUE(chat["refusal"].is_null());
  EXPECT_EQ(chat["content"][0]["token"], " the");
  EXPECT_FLOAT_EQ(chat["content"][0]["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(chat["content"][0]["bytes"], json::array({32, 116, 104, 101}));
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["token"], "x");
  EXPECT_FLOAT_EQ(chat["content"][0]["top_logprobs"][1]["logprob"].get<float>(), -2.0f);
  EXPECT_EQ(chat["content"][1]["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(chat["content"][1]["bytes"], json::array({0xc3}));
  EXPECT_EQ(offset, 0);  // chat has no offsets

  offset = 5;  // an echoed prompt of 5 characters comes first
  const json legacy = logprobs_object(Endpoint::completions, tokens, bytes_of, offset);
  EXPECT_EQ(legacy["tokens"], json::array({" the", "\xEF\xBF\xBD"}));
  EXPECT_EQ(legacy["text_offset"], json::array({5, 9}));
  EXPECT_EQ(offset, 10);
  EXPECT_FLOAT_EQ(legacy["token_logprobs"][1].get<float>(), -1.5f);
  EXPECT_FLOAT_EQ(legacy["top_logprobs"][0]["x"].get<float>(), -2.0f);
  EXPECT_EQ(legacy["top_logprobs"][1].size(), 2u);
  // Tokens 1 and 2 both read U+FFFD: the completions dict keeps the higher, not the last.
  const std::vector<engine::TokenLogprob> clash = {{1, -0.5f, {{1, -0.5f}, {2, -4.0f}}}};
  offset = 0;
  const json keyed = logprobs_object(Endpoint::completions, clash, bytes_of, offset);
  ASSERT_EQ(keyed["top_logprobs"][0].size(), 1u);
  EXPECT_FLOAT_EQ(keyed["top_logprobs"][0]["\xEF\xBF\xBD"].get<float>(), -0.5f);
  // The chosen token joins its alternatives when it is not among them (logprobs + 1 entries), and alone at
  // `logprobs: 0`.
  const std::vector<engine::TokenLogprob> sampled = {{3, -3.5f, {{0, -0.25f}}}, {0, -0.25f, {}}};
  offset = 0;
  const json plus_one = logprobs_object(Endpoint::completions, sampled, bytes_of, offset);
  ASSERT_EQ(plus_one["top_logprobs"][0].size(), 2u);
  EXPECT_FLOAT_EQ(plus_one["top_logprobs"][0]["x"].get<float>(), -3.5f);
  EXPECT_FLOAT_EQ(plus_one["top_logprobs"][0][" the"].get<float>(), -0.25f);
  ASSERT_EQ(plus_one["top_logprobs"][1].size(), 1u);
  EXPECT_FLOAT_EQ(plus_one["top_logprobs"][1][" the"].get<float>(), -0.25f);

  const ResponseIds ids{"chatcmpl-1", 1700000000, "tiny"};
  EXPECT_TRUE(completion_response(Endpoint::chat, ids, "a", "stop", Usage{1, 1})["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(completion_response(Endpoint::chat, ids, "a", "stop", Usage{1, 1}, chat)["choices"][0]["logprobs"], chat);
  EXPECT_EQ(stream_chunk(Endpoint::chat, ids, "", "", false, chat)["choices"][0]["logprobs"], chat);
}

// An echoed prompt's offsets index the echoed text: SentencePiece's BOS and the space it puts before the first word
// are not in that text, so "<s>" and "▁Hello" both start at 0 and "▁world" at 5 (the space before "world"); the
// generated tokens count on from the text's end. Known offsets come first, the running offset after them.
TEST(ServerApi, EchoedPromptOffsetsIndexTheEchoedText) {
  const tokenizer::Tokenizer* tok = test::shipped_tokenizer("mixtral");
  if (!tok) GTEST_SKIP() << test::missing_tokenizer_message("mixtral");
  const std::string text = "Hello world, café";
  const auto ids = tok->encode(text, /*add_special=*/true);
  ASSERT_GE(ids.size(), 4u);
  std::vector<engine::TokenLogprob> prompt;
  for (const auto id : ids) prompt.push_back({id, -1.0f, {}});
  const auto chars = static_cast<std::int64_t>(text.size()) - 1;  // "é" is two bytes, one character
  const auto offsets = echo_text_offsets(*tok, prompt, text);
  ASSERT_EQ(offsets.size(), ids.size());
  EXPECT_EQ(offsets[0], 0);  // <s>
  EXPECT_EQ(offsets[1], 0);  // ▁Hello
  EXPECT_EQ(offsets[2], 5);  // ▁world
  for (std::size_t i = 1; i < ids.size(); ++i) {
    EXPECT_LE(offsets[i - 1], offsets[i]);
    // Each token's own text (less a SentencePiece space at the very start) begins the text at its offset.
    std::string piece = tok->token_bytes(ids[i]).value_or("");
    if (offsets[i] == 0 && piece.starts_with(' ')) piece.erase(0, 1);
    if (piece.find("\xEF\xBF\xBD") != std::string::npos) continue;  // a piece of a character
    const std::u32string all = [&] {
      std::u32string u;
      for (std::size_t b = 0; b < text.size();) {
        const auto c = static_cast<unsigned char>(text[b]);
        const std::size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        u.push_back(static_cast<char32_t>(b));  // the byte index of each character
        b += n;
      }
      return u;
    }();
    const auto byte_at = static_cast<std::size_t>(all.at(static_cast<std::size_t>(offsets[i])));
    EXPECT_EQ(text.compare(byte_at, piece.size(), piece), 0) << "token " << i << " '" << piece << "' at " << offsets[i];
  }
  // In the logprobs object: the known offsets, then the generated token at the text's end.
  prompt.push_back({ids[2], -0.5f, {}});
  std::int64_t offset = chars;
  const json legacy = logprobs_object(
      Endpoint::completions, prompt, [&](std::int32_t id) { return tok->token_bytes(id).value_or(""); }, offset,
      offsets);
  EXPECT_EQ(legacy["text_offset"][1], 0);
  EXPECT_EQ(legacy["text_offset"][ids.size()], chars);
  EXPECT_EQ(offset, chars + 6);  // " world"
}

// A special token written in the prompt ("Hi<|im_end|>there", a ChatML prompt sent to /v1/completions) is in the
// echoed text, so it takes its width there, and the tokens after it start where their text does.
TEST(ServerApi, EchoedSpecialTokensWrittenInThePromptHaveTheirWidth) {
  const tokenizer::Tokenizer* tok = test::shipped_tokenizer("qwen3");
  if (!tok) GTEST_SKIP() << test::missing_tokenizer_message("qwen3");
  const std::string text = "Hi<|im_end|>there";
  const auto ids = tok->encode(text);
  ASSERT_EQ(ids.size(), 3u);
  ASSERT_TRUE(tok->is_special(ids[1]));
  std::vector<engine::TokenLogprob> prompt;
  for (const auto id : ids) prompt.push_back({id, -1.0f, {}});
  EXPECT_EQ(echo_text_offsets(*tok, prompt, text), (std::vector<std::int64_t>{0, 2, 12}));
  // Not in the text (a prompt given as token ids and echoed without its special tokens): no width.
  EXPECT_EQ(echo_text_offsets(*tok, prompt, "Hithere"), (std::vector<std::int64_t>{0, 2, 2}));
}

TEST(ServerApi, UnknownModelIs404) {
  EXPECT_FALSE(check_model("tiny", "tiny"));
  auto e = check_model("gpt-4", "tiny");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 404);
  EXPECT_EQ(e->code, "model_not_found");
  EXPECT_NE(e->message.find("gpt-4"), std::string::npos);
}

TEST(ServerApi, ErrorBodyIsOpenAiShaped) {
  auto body = json::parse(bad_request("bad", "temperature", "invalid_type").body());
  EXPECT_EQ(body["error"]["message"], "bad");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "temperature");
  EXPECT_EQ(body["error"]["code"], "invalid_type");
  auto plain = json::parse(internal_error("boom").body());
  EXPECT_TRUE(plain["error"]["param"].is_null());
  EXPECT_TRUE(plain["error"]["code"].is_null());
  EXPECT_EQ(plain["error"]["type"], "server_error");
  EXPECT_EQ(unauthorized().status, 401);
  EXPECT_EQ(too_large(10).status, 413);
  EXPECT_EQ(busy(3).status, 429);
  EXPECT_EQ(not_found_route("GET", "/nope").status, 404);
  // Invalid UTF-8 inside a message must still give valid JSON.
  EXPECT_NO_THROW(json::parse(bad_request("bad \xff byte").body()));
}

TEST(ServerApi, ResponseShapes) {
  const ResponseIds ids{"chatcmpl-1", 1700000000, "tiny"};
  auto full = completion_response(Endpoint::chat, ids, "hello", "stop", Usage{3, 2});
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(full["usage"]["total_tokens"], 5);
  auto text = completion_response(Endpoint::completions, ids, "hi", "length", Usage{1, 1});
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"], "hi");

  auto opener = stream_chunk(Endpoint::chat, ids, "", "", true);
  EXPECT_EQ(opener["object"], "chat.completion.chunk");
  EXPECT_EQ(opener["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(opener["choices"][0]["finish_reason"].is_null());
  auto piece = stream_chunk(Endpoint::chat, ids, "abc", "");
  EXPECT_EQ(piece["choices"][0]["delta"]["content"], "abc");
  auto last = stream_chunk(Endpoint::chat, ids, "", "length");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  auto usage = usage_chunk(Endpoint::chat, ids, Usage{4, 5, 3});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 3);

  const auto event = sse_event(json{{"a", 1}});
  EXPECT_EQ(event, "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_EQ(openai_finish_reason("eos"), "stop");
  EXPECT_EQ(openai_finish_reason("stop"), "stop");
  EXPECT_EQ(openai_finish_reason("length"), "length");
  EXPECT_EQ(openai_finish_reason("context"), "length");
}

TEST(ServerMetrics, PrometheusText) {
  SchedulerStats s;
  s.queue_depth = 3;
  s.generated_tokens = 42;
  s.experts.hits = 7;
  s.experts.misses = 2;
  s.experts.bytes_read = 4096;
  s.experts.vram_hits = 5;
  s.experts.vram_misses = 4;
  s.experts.bytes_uploaded = 8192;
  s.experts.cpu_runs = 9;
  s.experts.prefetch_issued = 8;
  s.experts.prefetch_used = 6;
  s.experts.predicted = 8;
  s.experts.predicted_correct = 6;
  s.experts.actual = 12;
  std::map<std::pair<std::string, int>, std::uint64_t> http{{{"/v1/completions", 200}, 5}, {{"other", 404}, 1}};
  const auto text = render_metrics(s, http, "ti\"ny", 1.5);
  for (const char* line :
       {"colibri_queue_depth 3\n", "colibri_generated_tokens_total 42\n", "colibri_expert_hits_total{tier=\"ram\"} 7\n",
        "colibri_expert_hits_total{tier=\"vram\"} 5\n", "colibri_expert_misses_total{tier=\"ram\"} 2\n",
        "colibri_expert_misses_total{tier=\"vram\"} 4\n", "colibri_expert_bytes_uploaded_total 8192\n",
        "colibri_expert_bytes_read_total 4096\n", "colibri_expert_cpu_fallback_runs_total 9\n",
        "colibri_http_requests_total{route=\"/v1/completions\",status=\"200\"} 5\n",
        "colibri_info{model=\"ti\\\"ny\"} 1\n", "colibri_prefetch_accuracy 0.75\n", "colibri_prefetch_recall 0.5\n",
        "colibri_prefetch_issued_total 8\n", "colibri_prefetch_used_total 6\n",
        "# TYPE colibri_io_stall_seconds_total counter\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

TEST(ServerApi, ClientMessagesLeaveOutTheModelDirectoryInEveryForm) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("colibri api test " + std::to_string(::getpid()));
  fs::create_directories(root / "models" / "tiny");
  fs::create_symlink(root / "models" / "tiny", root / "link");
  const std::string real = (root / "models" / "tiny").string();
  const std::string message = "reading " + real + "/experts/L000/E000.bin and " + (root / "link").string() +
                              "/shared.bin; " + real + "-other/x stays";
  const std::string want = "reading experts/L000/E000.bin and shared.bin; " + real + "-other/x stays";
  EXPECT_EQ(without_model_dir(message, root / "link"), want);
  EXPECT_EQ(without_model_dir(real + "/shared.bin", root / "models" / "tiny" / ""), "shared.bin");
  EXPECT_EQ(without_model_dir("nothing to remove", root / "link"), "nothing to remove");
  EXPECT_EQ(without_model_dir("/a/b", "/"), "/a/b");  // a model at the root keeps every path whole
  fs::remove_all(root);
}

TEST(ServerApi, SamplingDefaultsFillOnlyWhatTheRequestLeavesOut) {
  SamplingDefaults d;
  d.temperature = 0.6f;
  d.top_p = 0.95f;
  d.top_k = 20;
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(R"({"prompt": "x"})", Endpoint::completions, r, d));
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.95f);
  EXPECT_EQ(r.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.0f);  // not in the defaults: OpenAI's
  ASSERT_FALSE(
      parse_completion_request(R"({"prompt": "x", "temperature": 1.0, "top_k": -1})", Endpoint::completions, r, d));
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);  // the request's own value wins
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.95f);
  EXPECT_EQ(r.sampling.top_k, 0);  // -1: off
  ASSERT_FALSE(parse_completion_request(R"({"prompt": "x"})", Endpoint::completions, r));
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);  // without defaults: OpenAI's
  EXPECT_EQ(d.describe(), "temperature 0.6, top_p 0.95, top_k 20");
}

TEST(ServerApi, SamplingDefaultsAreReadFromGenerationConfigAndCheckedAsARequestWouldBe) {
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / ("colibri-genconfig-" + std::to_string(::getpid()) + ".json");
  EXPECT_TRUE(read_sampling_defaults(file)->empty());  // absent: nothing
  std::ofstream(file) << R"({"bos_token_id": 1, "eos_token_id": [2, 3], "temperature": 0.7, "top_k": 20,
                            "do_sample": true, "repetition_penalty": 1.05})";
  auto d = read_sampling_defaults(file);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->describe(), "temperature 0.7, top_k 20, repetition_penalty 1.05");
  std::ofstream(file) << R"({"top_p": 1.5})";
  auto bad = read_sampling_defaults(file);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message(),
            file.string() +
                ": \"top_p\" is 1.5; a request may give 0 to 1"
                ": fix the file (or remove the field), or start with --sampling-defaults openai");
  std::ofstream(file) << R"({"top_k": 2000000})";
  auto far = read_sampling_defaults(file);
  ASSERT_FALSE(far);
  EXPECT_EQ(far.error().message(),
            file.string() +
                ": \"top_k\" is 2000000; a request may give -1 to 1000000"
                ": fix the file (or remove the field), or start with --sampling-defaults openai");
  std::ofstream(file) << R"({"temperature": "0.7"})";  // a string is no number: said so
  auto text = read_sampling_defaults(file);
  ASSERT_FALSE(text);
  EXPECT_EQ(text.error().message(),
            file.string() +
                ": \"temperature\" is \"0.7\", not a number; a request may give 0 "
                "to 2"
                ": fix the file (or remove the field), or start with --sampling-defaults openai");
  std::ofstream(file) << "{";
  EXPECT_FALSE(read_sampling_defaults(file));
  fs::remove(file);
}

TEST(ServerApi, PercentEscapesInAPathSegmentAreDecodedAndMalformedOnesRefused) {
  EXPECT_EQ(percent_decoded("mistralai%2FMixtral-tiny"), "mistralai/Mixtral-tiny");
  EXPECT_EQ(percent_decoded("qwen3%3a30b"), "qwen3:30b");
  EXPECT_EQ(percent_decoded("plain"), "plain");
  EXPECT_EQ(percent_decoded("%6D"), "m");
  EXPECT_EQ(percent_decoded("a%2"), std::nullopt);
  EXPECT_EQ(percent_decoded("a%"), std::nullopt);
  EXPECT_EQ(percent_decoded("a%zz"), std::nullopt);
  EXPECT_EQ(percent_decoded("a%+1"), std::nullopt);
}

}  // namespace
}  // namespace colibri::server
