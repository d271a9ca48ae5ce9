// The OpenAI-compatible wire format: request validation (JSON -> CompletionRequest) and the response, stream-chunk
// and error bodies. No networking here, so it is unit-tested without sockets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/chat/template.hpp"
#include "colibri/engine/json_constraint.hpp"
#include "colibri/engine/sampler.hpp"
#include "colibri/sdk/cache_policy.hpp"
#include "colibri/sdk/status.hpp"
#include "colibri/server/chat_output.hpp"

namespace colibri::server {

// An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null

  [[nodiscard]] std::string body() const;
};

ApiError bad_request(std::string message, std::string param = "", std::string code = "");
ApiError not_found_route(std::string_view method, std::string_view target);
ApiError unauthorized();
ApiError too_large(std::uint64_t limit_bytes);
// 415 for a POST whose Content-Type is one a web page may send to any site without asking first (CORS's "simple"
// types: form data and text/plain), so that a page cannot make a visitor's browser post to this server; JSON, no
// Content-Type at all, or any other type passes (the body is read as JSON either way).
std::optional<ApiError> check_post_media_type(std::string_view content_type);
// 415 for a body sent compressed (Content-Encoding other than identity): it is not decompressed.
std::optional<ApiError> check_post_encoding(std::string_view content_encoding);
// 429: the queue (queue_limit waiting jobs) has no room for a request of `choices` jobs (its n).
ApiError busy(std::size_t queue_limit, int choices = 1);
ApiError internal_error(std::string message);
// `message` with the model directory's path taken out of file names (experts/L000/E000.bin stays): the server log
// keeps where the model lives on the server's disk; a client is told which file, not the server's layout.
std::string without_model_dir(std::string message, const std::filesystem::path& model_dir);
ApiError unavailable(std::string message);
// A URL path segment with its %XX escapes decoded (openai-node sends /v1/models/org%2Fname); nullopt when an escape
// is malformed.
std::optional<std::string> percent_decoded(std::string_view segment);
// 503 with Retry-After: a transient shortage (descriptors, a storage timeout) failed this request; it may pass later.
ApiError unavailable_for_now(std::string message);

enum class Endpoint { chat, completions };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::chat;
  std::string model;
  // chat: [{role, content, ...}]: content parts joined into a string (null only for an assistant turn of tool calls
  // alone), tool_calls (arguments as the given text), tool_call_id.
  nlohmann::ordered_json messages;
  std::string prompt;  // completions: text prompt
  std::vector<std::int32_t> prompt_tokens;
  bool prompt_is_tokens = false;
  // completions: a batch ("prompt": [p0, p1, ...]) is one choice per prompt (n each); the above hold p0, these the
  // rest, all texts or all token ids like p0.
  bool prompt_is_list = false;  // "prompt" was a list of prompts (errors name prompt[i], even of a list of one)
  std::vector<std::string> more_prompts;
  std::vector<std::vector<std::int32_t>> more_prompt_tokens;
  [[nodiscard]] std::size_t prompt_count() const { return 1 + more_prompts.size() + more_prompt_tokens.size(); }
  bool echo = false;
  std::optional<std::string> suffix;  // completions: fill in the middle between prompt and suffix
  std::optional<std::int64_t> max_tokens;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  engine::SamplingOptions sampling;  // OpenAI defaults: temperature 1, top_p 1, no top-k/min-p
  bool seed_given = false;
  int logprobs = -1;         // >= 0: logprobs asked for, with this many alternatives per token (top_logprobs)
  bool json_object = false;  // response_format {"type": "json_object"} (or "json_schema")
  std::shared_ptr<const engine::JsonSchema> json_schema;  // response_format {"type": "json_schema"}
  int n = 1;                    // choices, each generated as its own sequence (seeds seed, seed + 1, ...)
  std::int64_t min_tokens = 0;  // vLLM's: no end token before this many
  bool ignore_eos = false;      // vLLM's: never end at an end token
  // llama-server's speculative.n_max / n_min / p_min: this request's drafts per step (unset: the server's --draft),
  // fewer than draft_min not run, and a draft model's probability floor (unset: --draft-p-min).
  std::optional<std::int64_t> draft_max;
  std::int64_t draft_min = 0;
  std::optional<double> draft_p_min;
  std::vector<std::int32_t> stop_token_ids;  // vLLM's: these tokens end the answer too (finish_reason "stop")
  // Tool calling (chat): the definitions in the order given (they show in the prompt), and what tool_choice asks.
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  // vLLM's: the answer continues the last (assistant) message instead of starting a new turn.
  bool continue_final_message = false;
  bool add_generation_prompt = true;
  enum class ToolChoice { none, automatic, function, required };
  ToolChoice tool_choice = ToolChoice::none;  // "required" with one tool is that function
  std::string tool_choice_name;               // function: the one the answer calls
  std::vector<std::string> tool_names;        // required: the functions, one of which the answer calls
  bool parallel_tool_calls = true;            // false: only the first call is returned
};

inline constexpr std::size_t kMaxTools = 128;

inline constexpr int kMaxChoices = 16;
inline constexpr int kMaxPrompts = 256;  // completions: prompts in one batch request (the queue bounds it too)

// Deepest bracket nesting of a JSON text (strings skipped); bounded before parsing so a hostile body cannot
// exhaust the stack of the recursive parser.
std::size_t json_nesting_depth(std::string_view text);
// `text` (JSON) with each escaped surrogate (U+D800..U+DFFF) that is not half of a pair written as U+FFFD; the rest
// as it is.
std::string with_lone_surrogates_replaced(std::string_view text);
inline constexpr std::size_t kMaxJsonDepth = 64;

// Parses and validates a request body. Wrong types, out-of-range values and unsupported options come back as a 400
// naming the field in `param`; the model name is not checked here (see check_model).
// What a request that leaves a sampling field out gets instead of OpenAI's default (temperature 1, the rest off): the
// model's own recommendation, as vLLM takes it from generation_config.json.
struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  [[nodiscard]] bool empty() const { return !temperature && !top_p && !min_p && !repetition_penalty && !top_k; }
  [[nodiscard]] std::string describe() const;  // "temperature 0.6, top_p 0.95, top_k 20"
};
// A model's generation_config.json sampling fields (temperature, top_p, top_k, min_p, repetition_penalty): empty
// when the file is absent or names none; an error names the file and the field.
// `fix` ends the message for a value a request could not give, its separator included (the server's: how to start
// without them).
sdk::Expected<SamplingDefaults> read_sampling_defaults(
    const std::filesystem::path& generation_config,
    std::string_view fix = ": fix the file (or remove the field), or start with --sampling-defaults openai");

std::optional<ApiError> parse_completion_request(std::string_view body, Endpoint endpoint, CompletionRequest& out,
                                                 const SamplingDefaults& defaults = {});

// Renders the chat for the model. Templates disagree on an assistant turn of tool calls: Mistral's writes the
// arguments with tojson (a string would be quoted twice) while DeepSeek V3's adds them to a string (an object fails);
// DeepSeek V3's writes the calls only when content is null while Qwen3's fails on null. So null content goes in as
// given, else as ""; each with the arguments as objects, else as the given text: the first variant the template
// renders wins (the first error is returned when none does).
sdk::Expected<std::string> render_chat(const chat::Template& chat_template, const nlohmann::ordered_json& messages,
                                       const chat::RenderOptions& options);

// continue_final_message: the chat rendered with this marker after the final message's content is cut where the
// marker is, so the answer continues that content exactly (also when it is empty or the template trims it).
inline constexpr std::string_view kContinueMarker = "\x1f<colibri-continue>\x1f";

// 404 model_not_found unless `requested` is the served model's name.
std::optional<ApiError> check_model(const std::string& requested, const std::string& served);

// 400 context_length_exceeded when the prompt leaves no room to generate or prompt + max_tokens exceeds the
// context, naming the numbers (OpenAI's wording); `param` is "messages" or "prompt".
std::optional<ApiError> check_context(Endpoint endpoint, std::int64_t prompt_tokens,
                                      std::optional<std::int64_t> max_tokens, std::int64_t context);

// --- /admin/cache ---
// "layer:expert" (e.g. "3:1"), the cache.pinned_experts spelling.
std::optional<sdk::ExpertKey> parse_expert_key(std::string_view text);
// POST /admin/cache/clear: an empty body or {} (unknown fields are a 400 naming them).
std::optional<ApiError> parse_cache_clear_request(std::string_view body);
// POST /admin/cache/warm: empty or {} (the usage history's most used experts until the cache is full),
// {"experts": ["3:1", ...]} or {"top": N} (the N most used). Whether the experts exist is checked by the caller.
struct CacheWarmRequest {
  std::vector<sdk::ExpertKey> experts;
  std::optional<std::int64_t> top;
};
std::optional<ApiError> parse_cache_warm_request(std::string_view body, CacheWarmRequest& out);

// --- /tokenize and /detokenize (vLLM's and llama.cpp's spellings) ---
// {"prompt" or "content": text, "add_special_tokens" or "add_special": bool (default true with "prompt", as vLLM;
// false with "content", as llama.cpp)} or
// {"messages": [...], "add_generation_prompt": bool (default true), "tools", "chat_template_kwargs"}; "model", when
// given, must be the served one.
struct TokenizeRequest {
  std::string model;
  bool chat = false;
  std::string text;
  bool add_special = true;
  CompletionRequest chat_request;  // chat: messages, tools, template kwargs
  bool add_generation_prompt = true;
};
std::optional<ApiError> parse_tokenize_request(std::string_view body, TokenizeRequest& out);
// {"tokens": [ids]} (and an optional "model").
std::optional<ApiError> parse_detokenize_request(std::string_view body, std::string& model,
                                                 std::vector<std::int32_t>& tokens);

struct Usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_tokens = 0;  // prompt_tokens_details.cached_tokens: reused from an earlier request's KV cache
  [[nodiscard]] nlohmann::json to_json() const;
};

// Maps the generation loop's reasons onto OpenAI's: eos/stop -> "stop", length/context -> "length".
std::string openai_finish_reason(std::string_view reason);

struct ResponseIds {
  std::string id;  // chatcmpl-... / cmpl-...
  std::int64_t created = 0;
  std::string model;
};

// The most alternatives a request may ask for per token (chat top_logprobs, completions logprobs).
inline constexpr int kMaxTopLogprobs = 20;

// The bytes of a token (the tokenizer's token_bytes), for the logprobs objects.
using TokenBytes = std::function<std::string(std::int32_t)>;

// A choice's "logprobs" object for `tokens`: chat {"content": [{token, logprob, bytes, top_logprobs}], "refusal"};
// completions {tokens, token_logprobs, top_logprobs, text_offset}, where `text_offset` (code points into the choice's
// text) is where the first token starts and is advanced past the last. `known_offsets`: the offsets of the first
// tokens, worked out by the caller (an echoed prompt's, whose special tokens and SentencePiece prefix space are not in
// the text); text_offset then counts from after them.
nlohmann::json logprobs_object(Endpoint endpoint, const std::vector<engine::TokenLogprob>& tokens,
                               const TokenBytes& bytes_of, std::int64_t& text_offset,
                               std::span<const std::int64_t> known_offsets = {});

// Where each echoed prompt token starts in the echoed text: the length of the prompt decoded up to it, as the text
// is (no BOS, no SentencePiece prefix space; a special token counts where the text spells it out there), so that
// text[offset:] starts with that token's text; a piece of a character shares the character's offset.
std::vector<std::int64_t> echo_text_offsets(const tokenizer::Tokenizer& tokenizer,
                                            const std::vector<engine::TokenLogprob>& prompt, std::string_view text);

struct Choice {
  std::string text;
  std::string finish_reason;
  nlohmann::json logprobs;           // the choice's logprobs object (null when not asked for)
  std::vector<ToolCall> tool_calls;  // chat: the message's tool_calls (its content is null when `text` is empty)
  std::string reasoning = {};        // chat: the message's reasoning_content (left out when empty)
};
// Non-streaming body with choices 0, 1, ...
nlohmann::json completion_response(Endpoint endpoint, const ResponseIds& ids, const std::vector<Choice>& choices,
                                   const Usage& usage);
// The same with one choice.
nlohmann::json completion_response(Endpoint endpoint, const ResponseIds& ids, const std::string& text,
                                   const std::string& finish_reason, const Usage& usage,
                                   const nlohmann::json& logprobs = nullptr);
// One SSE data object. `role_chunk` gives the chat opener ({"role":"assistant","content":""}); a non-empty
// `finish_reason` closes the choice.
nlohmann::json stream_chunk(Endpoint endpoint, const ResponseIds& ids, const std::string& text,
                            const std::string& finish_reason, bool role_chunk = false,
                            const nlohmann::json& logprobs = nullptr, int index = 0);
// A chat chunk carrying reasoning text of choice `index` (delta.reasoning_content).
nlohmann::json reasoning_chunk(const ResponseIds& ids, int index, const std::string& reasoning);
// A chat chunk carrying one tool call of choice `index`: the first piece of a call has its id, type and name (`call`
// non-null); later pieces add to its arguments.
nlohmann::json tool_call_chunk(const ResponseIds& ids, int index, int call_index, const ToolCall* call,
                               const std::string& arguments);
// The stream_options.include_usage chunk: empty choices, usage set.
nlohmann::json usage_chunk(Endpoint endpoint, const ResponseIds& ids, const Usage& usage);
// "data: <json>\n\n"
std::string sse_event(const nlohmann::json& data);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace colibri::server
