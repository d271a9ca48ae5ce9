// node openai_client.mjs BASE_URL API_KEY MODEL [TOOLS_BASE_URL]
// The official OpenAI SDK against colibri-server: models, chat and completions (plain and streamed), error types;
// with TOOLS_BASE_URL (a server whose template shows tools), tool calls and JSON Schema through the SDK's helpers.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, apiKey, model, toolsURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
assert.deepEqual(ids, [model]);

const messages = [{ role: "user", content: "Say something" }];
const full = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, seed: 1 });
assert.equal(full.object, "chat.completion");
assert.equal(full.choices[0].message.role, "assistant");
assert.ok(["stop", "length"].includes(full.choices[0].finish_reason));
assert.equal(full.usage.total_tokens, full.usage.prompt_tokens + full.usage.completion_tokens);

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = "";
let finish = null;
let usage = null;
for await (const chunk of stream) {
  for (const c of chunk.choices) {
    text += c.delta?.content ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(text, full.choices[0].message.content);
assert.equal(finish, full.choices[0].finish_reason);
// The second request found the first one's prompt in the server's KV cache: only the cached count differs.
assert.equal(usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens - 1);
delete usage.prompt_tokens_details;
delete full.usage.prompt_tokens_details;
assert.deepEqual(usage, full.usage);

const comp = await client.completions.create({ model, prompt: "Once", max_tokens: 8, temperature: 0 });
const compStream = await client.completions.create({ model, prompt: "Once", max_tokens: 8, temperature: 0, stream: true });
let compText = "";
for await (const chunk of compStream) compText += chunk.choices[0]?.text ?? "";
assert.equal(compText, comp.choices[0].text);

// Errors surface as the SDK's typed errors with the server's status and code.
await assert.rejects(client.chat.completions.create({ model: "no-such-model", messages }), (e) => {
  assert.ok(e instanceof OpenAI.NotFoundError, String(e));
  assert.equal(e.code, "model_not_found");
  return true;
});
await assert.rejects(client.chat.completions.create({ model, messages, temperature: 5 }), (e) => {
  assert.ok(e instanceof OpenAI.BadRequestError, String(e));
  assert.equal(e.param, "temperature");
  return true;
});
const wrongKey = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError);

let toolSummary = "";
if (toolsURL) {
  const tc = new OpenAI({ baseURL: toolsURL, apiKey, maxRetries: 0, timeout: 60000 });
  const tools = [{
    type: "function",
    function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  }];
  const ask = [{ role: "user", content: "Weather in Oslo?" }];
  const req = { model, messages: ask, tools, tool_choice: { type: "function", function: { name: "get_weather" } }, max_tokens: 60, temperature: 0 };
  const called = await tc.chat.completions.create(req);
  const call = called.choices[0].message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "get_weather");
  assert.equal(called.choices[0].message.content, null);
  // The SDK's stream helper puts the tool call pieces back together (and checks their identity).
  const final = await tc.chat.completions.stream(req).finalChatCompletion();
  assert.deepEqual(final.choices[0].message.tool_calls[0].function, call.function);
  assert.equal(final.choices[0].message.tool_calls[0].id.slice(0, 5), "call_");
  // The SDK's own assistant message goes back as history, with the tool's result.
  const next = await tc.chat.completions.create({
    model, tools, max_tokens: 6, temperature: 0,
    messages: [...ask, called.choices[0].message, { role: "tool", tool_call_id: call.id, content: '{"temp_c": 3}' }],
  });
  assert.ok(next.usage.prompt_tokens > called.usage.prompt_tokens);
  // JSON Schema through response_format.
  const schema = { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"], additionalProperties: false };
  // Qwen3's template, not thinking (a random model that opened its <think> block would not close it).
  const structured = await tc.chat.completions.create({
    model, messages: ask, max_tokens: 400, temperature: 0, chat_template_kwargs: { enable_thinking: false },
    response_format: { type: "json_schema", json_schema: { name: "answer", schema, strict: true } },
  });
  assert.deepEqual(Object.keys(JSON.parse(structured.choices[0].message.content)), ["ok"]);
  toolSummary = `, tool call ${JSON.stringify(call.function)}, schema ${structured.choices[0].message.content}`;
}

console.log(`openai SDK ok: chat ${JSON.stringify(text)}, completion ${JSON.stringify(compText)}${toolSummary}`);
