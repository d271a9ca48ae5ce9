// What a chat answer holds besides its content, for /v1/chat/completions: tool calls (how a model family writes them,
// found from its chat template; the prefix that forces a named call; the parser that splits them from content) and
// reasoning (the <think> block of Qwen3 and DeepSeek R1), and gpt-oss's harmony channels, which carry both. No
// networking here, so it is unit-tested without sockets.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/server/json_brackets.hpp"

namespace colibri::server {

// The call syntaxes colibri reads:
//   hermes      (Qwen2.5/Qwen3, Hermes): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, repeated
//   mistral     (Mistral Nemo/Small, Mixtral 8x22B): [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
//   mistral_v11 (Mistral Small 3.2, Devstral, Ministral 3, Mistral Large 3: tokenizers v11 on):
//               [TOOL_CALLS]NAME[ARGS]{...}, repeated (Small 3.2 adds [CALL_ID]ID before [ARGS])
//   deepseek_v3 (DeepSeek V3/R1):
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
//               <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   deepseek_v31 (DeepSeek V3.1): the same markers, <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//   kimi_k2     (Kimi K2): <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
//               {...}<|tool_call_end|>...<|tool_calls_section_end|>
//   harmony     (gpt-oss): <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>, read
//               by HarmonyStream (below) together with the reasoning, not by parse_tool_calls (each call's
//               arguments by a ToolCallStream::arguments_of)
//   qwen3_coder (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, Step 3.5):
//               <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//   glm45       (GLM-4.5, 4.6, 4.7):
//   <tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n...</tool_call>
//   minimax_m2  (MiniMax M2): <minimax:tool_call>\n<invoke name="NAME">\n<parameter name="KEY">VALUE</parameter>\n...
//               </invoke>\n...</minimax:tool_call>
//   deepseek_v32, deepseek_v4 (DeepSeek V3.2, V4: DSML): <｜DSML｜function_calls> (V4: tool_calls) around
//               <｜DSML｜invoke name="NAME"><｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>
//               ...</｜DSML｜invoke>
//   llama3_json (Llama 3.1 to 3.3, Llama 4): the answer itself is {"name": ..., "parameters": {...}} (several
//               apart by ';'), after <|python_tag|> (3.x) or <|python_start|> (4, its <|python_end|> before or
//               after the calls) if any: no marker opens it, so only an answer that begins so is calls
//   pythonic    (Llama 4 and Llama 3.2 with vLLM's pythonic templates): the whole answer is a Python list of calls,
//               [NAME(KEY=VALUE, ...), ...], values Python literals, inside <|python_start|>...<|python_end|> if
//               any; an answer with anything else in it is text (held back while it may still be calls)
// The XML syntaxes write each value as bare text; the tool's JSON schema says which are strings (ToolSchemas;
// DSML says so itself). vLLM names its parsers the same.
enum class ToolFormat {
  none,
  hermes,
  mistral,
  mistral_v11,
  deepseek_v3,
  deepseek_v31,
  kimi_k2,
  harmony,
  qwen3_coder,
  glm45,
  minimax_m2,
  deepseek_v32,
  deepseek_v4,
  llama3_json,
  pythonic,
  hunyuan
};

// The format whose markers the template writes (for earlier calls in the history); none when it writes none.
ToolFormat detect_tool_format(std::string_view template_source);
std::string_view tool_format_name(ToolFormat format);
// "hermes, mistral, ...": every syntax colibri reads, for messages.
std::string supported_tool_formats();
// Whether the template reads the `tools` variable at all (if not, the model would never see the definitions).
bool template_reads_tools(std::string_view template_source);
// The tags a format's calls are written with: where the model's tokenizer makes one a special token, the decoder must
// keep special tokens for the parser to see it.
std::vector<std::string_view> tool_markers(ToolFormat format);

// What the request's tools say: which functions a call may name (a call of any other is no call: its text stays
// content), and each parameter's type, for the XML syntaxes, whose values are bare text: a value of a string
// parameter is that text; any other value is read as JSON when it is JSON (Python's True, False and None, which
// Qwen's templates write for earlier calls, too), and is that text when it is not. A parameter the schema does not
// list is read as JSON when it is JSON. Without tools (the default) any name goes.
class ToolSchemas {
 public:
  enum class Kind { string, string_or_null, other };
  ToolSchemas() = default;
  // `tools`: the request's "tools" ([{"type": "function", "function": {"name", "parameters": {...}}}]); anything
  // else is no tools.
  explicit ToolSchemas(const nlohmann::ordered_json& tools);
  [[nodiscard]] Kind kind(std::string_view tool, std::string_view parameter) const;
  [[nodiscard]] bool may_call(std::string_view tool) const;

 private:
  // tool name -> parameter -> kind; only the parameters that are not `other`
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, Kind>>>> kinds_;
  std::vector<std::string> names_;  // every function of the tools
};

// Appended to the rendered prompt when tool_choice names a function: the model continues with the arguments object.
std::string forced_call_prefix(ToolFormat format, std::string_view function_name);

// tool_choice "required" with several tools: the answer starts with the format's call opener and continues with one
// {"name": <one of names>, "arguments": {...}} object (engine::JsonSchema::compile_tool_call holds it to the named
// tool's parameters). Empty for a format that writes the name outside JSON (deepseek_v3, harmony, ...) or has no
// opener (llama3_json, pythonic): the answer is then that object alone, plain JSON, as vLLM forces "required" on
// every model.
std::string required_call_prefix(ToolFormat format);
// The key of a JSON call's arguments object: "parameters" for llama3_json (what Llama writes), else "arguments".
std::string_view call_arguments_key(ToolFormat format);

struct ToolCall {
  std::string id;  // call_... (mistral: 9 alphanumerics, which its template demands; kimi_k2: the model's own)
  std::string name;
  std::string arguments;                         // a JSON text, as OpenAI sends it
  [[nodiscard]] nlohmann::json to_json() const;  // {"id", "type": "function", "function": {"name", "arguments"}}
};

// {"name": ..., "arguments": {...}} as one call (ids left empty); nullopt when it is not one.
std::optional<ToolCall> call_from_json_text(std::string_view text);

// JSON text with the whitespace outside strings dropped, byte by byte or piece by piece: how a call's arguments
// object is sent (a forced call's too, as the model writes it).
class JsonMinifier {
 public:
  void step(char c);
  // Adds `piece`; returns what it added to text().
  std::string_view push(std::string_view piece);
  [[nodiscard]] const std::string& text() const { return text_; }
  // The value that began with the first byte (an object or array) has closed.
  [[nodiscard]] bool complete() const { return depth_ == 0 && !text_.empty(); }

 private:
  JsonBrackets brackets_;
  int depth_ = 0;
  std::string text_;
};
std::string minified(std::string_view json_text);

// A new call id; `random` is any 64-bit random source's output, one per call.
std::string tool_call_id(ToolFormat format, std::uint64_t random);

struct ToolParse {
  std::string content;          // the text that is not a call
  std::vector<ToolCall> calls;  // ids left empty, but where the model wrote one (Kimi K2)
};

// Splits a finished answer. When a call's text does not parse (broken JSON, no name), nothing is taken as a call:
// the whole text stays content, so nothing the model wrote is lost. A call's arguments are the text of its arguments
// object as the model wrote it, keys in its order, with the whitespace outside strings dropped (what a stream can send
// as it is written); arguments given as a string holding JSON are that string. A call object that repeats "name", or
// has "arguments" twice (or both "arguments" and "parameters"), is ambiguous: no call.
ToolParse parse_tool_calls(ToolFormat format, std::string_view text, const ToolSchemas& types = {});

// A piece of a streamed call. A call's first piece names it; the later ones carry the next part of its arguments.
// The pieces of call `index` add up to its arguments text.
struct ToolCallDelta {
  std::size_t index = 0;  // the call's place among the answer's calls
  std::string name;       // in the first piece only
  std::string arguments = {};
  bool last = false;    // the call's final piece (from finish): its arguments are complete
  std::string id = {};  // in the first piece, where the model wrote one (Kimi K2: "functions.NAME:0")
};

struct ToolStreamOutput {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

struct ToolStreamEnd {
  // What parse_tool_calls finds in the text from the first marker on; its content is the rest of the content, so
  // that everything push() sent plus it is exactly parse_tool_calls' content of the whole text.
  ToolParse parse;
  std::vector<ToolCallDelta> calls;  // what completes each call of `parse` (all of one that was not previewed)
  // tool_choice "required" cut off after its call was named: `parse` holds that call with the arguments written so
  // far (no complete JSON), not a finished call.
  bool cut_off = false;
};

// The same for a stream: push() returns the content that can be sent now, holding back text from the first call
// marker on, any tail that may be the start of one, and trailing whitespace (parse_tool_calls drops it before
// calls), and the calls as they are written: a call is named once its name is complete and its arguments object has
// begun, with the text so far a valid JSON prefix, and its arguments follow while they stay one. The last byte of each
// call's arguments (its closing '}') waits for finish(), which parses the held-back text: so a call whose text then
// turns out broken was sent only with arguments that are no complete JSON, and its text comes back whole as content.
// Pythonic lists have no marker: the answer is held while it may be one, its calls previewed as they are written
// (a call's arguments grow a keyword at a time), and sent as text if it turns out not to be one before a call went
// out.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolFormat format, ToolSchemas types = {});
  // tool_choice "required": the text is one call object (its opener is in the prompt), read as call_from_json_text.
  static ToolCallStream required_call();
  // A call whose name came before its text (harmony's header): the text is its arguments object alone, streamed as
  // deepseek_v3's is. finish() finds the call when the text is one JSON object (no text at all: {}), else no call and
  // the whole text as content.
  static ToolCallStream arguments_of(std::string_view name);
  ToolCallStream(const ToolCallStream& other);
  ToolCallStream& operator=(const ToolCallStream& other);
  ToolCallStream(ToolCallStream&&) noexcept;
  ToolCallStream& operator=(ToolCallStream&&) noexcept;
  ~ToolCallStream();

  ToolStreamOutput push(std::string_view text);
  // `parse.content` is the held-back text that is not a call (all of it when the calls do not parse).
  ToolStreamEnd finish();

 private:
  struct Preview;
  void preview(ToolStreamOutput& out);
  void preview_xml(ToolStreamOutput& out);
  // Pythonic: `calls` read whole so far, `partial` the one being written (PythonicReader).
  void preview_pythonic(ToolStreamOutput& out, const std::vector<ToolCall>& calls,
                        const std::optional<ToolCall>& partial);

  ToolFormat format_;
  ToolSchemas types_;
  bool required_ = false;
  std::optional<std::string> name_;  // arguments_of
  std::string held_;
  std::string space_;       // whitespace before held_, not sent: dropped if calls follow
  bool sent_text_ = false;  // content was sent before the calls (text after them joins it with a newline)
  bool in_calls_ = false;
  std::unique_ptr<Preview> preview_;
};

// Reasoning models write their thinking first, between <think> and </think>; OpenAI-compatible servers (vLLM,
// llama.cpp) return it apart as `reasoning_content`. Whether a template's model does so is read from its source.
bool template_has_reasoning(std::string_view template_source);
// Whether the rendered prompt already opens the thinking block (DeepSeek R1's template ends with "<think>\n"), so the
// answer starts inside it without writing the tag.
bool prompt_opens_reasoning(std::string_view prompt);
// Whether it ends with a closed block (Qwen3's with enable_thinking false): the answer does not think.
bool prompt_closes_reasoning(std::string_view prompt);

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

// Splits an answer as it streams: a leading <think>...</think> (whitespace around it dropped) is reasoning, the rest
// content. An answer that starts with anything else is all content; one that ends inside the block is all reasoning.
// push() returns what is final; text that may still turn out to be a tag is held back until the next push or finish.
// answer_tags (Hunyuan-A13B, which writes "<answer>\n...\n</answer>" after its thinking, or alone): the content is
// what the tags hold, as vLLM's hunyuan_a13b parser returns it; the whitespace inside them dropped, text after the
// closing tag kept, an answer cut off before it kept whole.
class ReasoningStream {
 public:
  explicit ReasoningStream(bool starts_inside, bool answer_tags = false)
      : state_(starts_inside ? State::reasoning : State::start), answer_tags_(answer_tags) {}
  ReasoningSplit push(std::string_view text);
  ReasoningSplit finish();

 private:
  enum class State { start, reasoning, after, answer_start, answer, answer_done, content };
  // start / after: whether the first text after spaces opens the answer (true: entered), may still (nullopt), or not.
  std::optional<bool> opens_answer(std::size_t begin);
  State state_;
  bool answer_tags_;
  std::string held_;
};

// gpt-oss speaks OpenAI's harmony format: the answer is a series of messages, each a header and a text,
//   <|channel|>analysis<|message|>THINKING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
// with a call to a tool written as
//   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGUMENTS<|call|>
// (the markers are special tokens, so the decoder must keep them for these to be seen). Whether a template speaks it
// is read from its source: it writes <|channel|> and <|message|>.
bool template_is_harmony(std::string_view template_source);
// Its end tokens (an answer ends with <|return|>, or <|call|> after a call; <|endoftext|> too), which a model's
// config may not list.
inline constexpr std::string_view kHarmonyEndTokens[] = {"<|return|>", "<|call|>", "<|endoftext|>"};

struct HarmonyOutput {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;        // complete calls (ids left empty), as each message ends
  std::vector<ToolCallDelta> deltas;  // the same calls as they are written, to stream (see HarmonyStream)
};

// Splits harmony text as it streams, as vLLM and llama.cpp do for gpt-oss. The analysis channel is reasoning; the
// final channel, commentary without a recipient (a preamble to the user) and a message with no channel are content;
// a message to functions.NAME is a call of NAME with its text as the arguments when `tools` offer NAME (else
// reasoning). A
// message to another recipient, on another channel or in a role other than the assistant's is reasoning too: text
// the model did not write for the user is never content. No marker is ever part of what comes out. Text outside any
// header (a model that does not speak harmony) is content. push() returns what is final; a tail that may be the
// start of a marker, and a header until its <|message|>, wait for the next push or finish().
// A call's text must be one JSON object (none at all is {}); its arguments are that object's text with the whitespace
// outside strings dropped, as ToolCallStream's. `deltas` stream it as ToolCallStream does: named (by the header) once
// its text has begun as a valid JSON object prefix, its arguments in pieces as they grow but the closing '}', which
// follows when the message ends and its text parses. A call whose text is no JSON object (broken, cut off) is no call:
// its text is reasoning (it was written for the tool, not the user), and what was streamed of it is no complete
// JSON. Its index stays taken in `deltas` once named, so a later call's index there may exceed its place in `calls`.
class HarmonyStream {
 public:
  // `prompt` is the rendered prompt: after "<|start|>assistant" the answer starts with the rest of a header; after
  // a header's <|message|> (continue_final_message, or a template that opens the final channel) inside that message.
  // `schemas`: the request's tools, which a call must name (by default any name).
  HarmonyStream(std::string_view prompt, bool tools, ToolSchemas schemas = {});
  HarmonyOutput push(std::string_view text);
  // The end of the answer: a message cut off in its text ends there (a call, if its text is a whole object); a
  // header cut off before its <|message|> is dropped.
  HarmonyOutput finish();

 private:
  enum class State { header, body };
  enum class Sink { content, reasoning, call };
  void open_message(std::string_view header);
  void end_message(HarmonyOutput& out);
  void emit(HarmonyOutput& out, std::string_view text);
  void add_deltas(HarmonyOutput& out, std::vector<ToolCallDelta> deltas);

  bool tools_;
  ToolSchemas schemas_;
  State state_ = State::header;
  std::string prompt_header_;  // the part of the first header the prompt wrote ("assistant")
  bool role_next_ = false;     // the prompt ended with a bare <|start|>: the answer starts with the role
  std::string held_;
  Sink sink_ = Sink::content;
  std::optional<ToolCallStream> call_;  // the call message being read
  std::size_t call_index_ = 0;          // the index in `deltas` of the next call
  bool call_named_ = false;             // the current call has a delta out
};

}  // namespace colibri::server
