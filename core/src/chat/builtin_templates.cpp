// Built-in chat templates for families whose tokenizer_config.json ships none. The same text is kept in
// tests/data/chat/builtin/<family>.jinja so the reference renderer can produce golden outputs; a unit test checks
// that both copies are identical.
#include <array>
#include <string_view>
#include <utility>

#include "colibri/chat/template.hpp"

namespace colibri::chat {

namespace {
// clang-format off
constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kBuiltins = {{
    {"llama2", R"JINJA({#- colibri built-in: Llama 2 chat format ([INST] with a <<SYS>> block in the first user turn). -#}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- bos_token + '[INST] <<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] | trim + ' [/INST]' }}
        {%- else %}
            {{- bos_token + '[INST] ' + message['content'] | trim + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] | trim + ' ' + eos_token }}
    {%- else %}
        {{- raise_exception('Only system, user and assistant roles are supported by the Llama 2 chat format') }}
    {%- endif %}
{%- endfor %}
{%- if loop_messages | length == 0 and system_message is defined %}
    {{- raise_exception('A system message alone gives the model nothing to answer in the Llama 2 chat format: add a user message after it') }}
{%- endif %}
)JINJA"},
    {"mistral", R"JINJA({#- colibri built-in: Mistral / Mixtral instruct v0.1 format; the system messages (joined) are prepended to the first user turn. -#}
{{- bos_token }}
{%- set ns = namespace(system='', turns=[]) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' or message['role'] == 'developer' %}
        {%- set ns.system = ns.system + ('\n\n' if ns.system else '') + (message['content'] or '') %}
    {%- else %}
        {%- set ns.turns = ns.turns + [message] %}
    {%- endif %}
{%- endfor %}
{%- for message in ns.turns %}
    {%- if message['role'] == 'tool' or message['tool_calls'] %}
        {{- raise_exception('The Mistral instruct format has no tool calls or tool results: give the model a chat template that has them (--chat-template FILE), or leave them out of the history') }}
    {%- endif %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('The Mistral instruct format needs user and assistant turns to alternate, starting with the user (system messages may come anywhere): message ' ~ (loop.index0 + 1) ~ ' of the conversation without them is ' ~ message['role']) }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and ns.system %}
            {{- '[INST] ' + ns.system + '\n\n' + (message['content'] or '') + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + (message['content'] or '') + ' [/INST]' }}
        {%- endif %}
    {%- else %}
        {{- (message['content'] or '') + eos_token }}
    {%- endif %}
{%- endfor %}
{%- if ns.turns | length == 0 and ns.system %}
    {{- raise_exception('A system message alone gives the model nothing to answer in the Mistral instruct format: add a user message after it') }}
{%- endif %}
)JINJA"},
    {"gpt-oss", R"JINJA({#- colibri built-in: a plain harmony format for gpt-oss (final channel only; no tool schemas, no reasoning). -#}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {{- '<|start|>system<|message|>' + message['content'] + '<|end|>' }}
    {%- elif message['role'] == 'developer' %}
        {{- '<|start|>developer<|message|># Instructions\n\n' + message['content'] + '<|end|>' }}
    {%- elif message['role'] == 'user' %}
        {{- '<|start|>user<|message|>' + message['content'] + '<|end|>' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if loop.last and not add_generation_prompt %}
            {{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|return|>' }}
        {%- else %}
            {{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}
        {%- endif %}
    {%- elif message['role'] == 'tool' %}
        {{- '<|start|>functions.' + (message['name'] if message['name'] is defined else 'tool') + ' to=assistant<|channel|>commentary<|message|>' + message['content'] + '<|end|>' }}
    {%- else %}
        {{- raise_exception('Unsupported role for the harmony format: ' + message['role']) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start|>assistant' }}
{%- endif %}
)JINJA"},
    {"chatml", R"JINJA({#- colibri built-in: ChatML (<|im_start|>role ... <|im_end|>). -#}
{%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)JINJA"},
}};
// clang-format on
}  // namespace

std::optional<std::string_view> builtin_template(std::string_view family) {
  if (family == "mixtral") family = "mistral";
  if (family == "gptoss") family = "gpt-oss";
  for (const auto& [name, source] : kBuiltins) {
    if (name == family) return source;
  }
  return std::nullopt;
}

}  // namespace colibri::chat
